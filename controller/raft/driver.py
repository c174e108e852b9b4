"""The asyncio driver of one `RaftNode` (docs/design.md, "Cores and drivers"): short and boring.

All decisions live in the core; this loop only carries out each `Ready` in the order
its field comments fix:

    1. persist (snapshot, entries, hard state) via `RaftStore`, in the default
       executor so the fsync never blocks the event loop;
    2. send the messages (transport);
    3. apply the snapshot and the committed entries (the state machine callback);
    4. `advance`, log the core's events, then let the owner react (`after_advance`:
       leadership changes, compaction), still inside the loop so store calls never overlap.

Inputs (`step`, `propose`, the tick timer) may arrive while a persist runs in the
executor: the core allows that, and they show up in the next Ready. Proposals that
arrive during one fsync are written by the next, which is the group commit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from rillet.controller.raft.core import Message, RaftNode, Ready
from rillet.controller.raft.store import RaftStore

log = logging.getLogger(__name__)


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class RaftDriver:
    def __init__(
        self,
        node: RaftNode,
        store: RaftStore,
        send: Callable[[Message], None],
        apply: Callable[[Ready], None],
        after_advance: Callable[[], Awaitable[None]],
        *,
        tick_interval_ms: int = 20,
        on_failure: Callable[[BaseException], None] = lambda e: None,
    ) -> None:
        self.node = node
        self.store = store
        self.send = send
        self.apply = apply
        self.after_advance = after_advance
        self.tick_interval_ms = tick_interval_ms
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.failure: BaseException | None = None
        self._stopping = False
        self.on_failure = on_failure

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._ticker()), loop.create_task(self._run())]
        # Policy fatal (for the controller): a dead ticker means no elections and no
        # heartbeats while the node looks alive; _run reports its own failures.
        self._tasks[0].add_done_callback(self._on_ticker_done)

    def _on_ticker_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or (error := task.exception()) is None:
            return
        self.failure = error
        log.critical("raft ticker stopped: %r", error, exc_info=error)
        self.on_failure(error)

    async def stop(self) -> None:
        """Finish the Ready in hand (a persist in the executor is never abandoned), then stop."""
        self._stopping = True
        self._wake.set()
        ticker, run = self._tasks or (None, None)
        if ticker is not None:
            ticker.cancel()
        await asyncio.gather(*[t for t in (ticker, run) if t is not None], return_exceptions=True)
        self._tasks = []

    # -- inputs --------------------------------------------------------------------

    def step(self, msg: Message) -> None:
        self.node.step(msg)
        self._wake.set()

    def propose(self, data: bytes) -> int:
        """Raises NotLeader / TooManyUncommitted from the core."""
        index = self.node.propose(data)
        self._wake.set()
        return index

    def poke(self) -> None:
        """Something changed the core outside step/propose (e.g. a leadership transfer)."""
        self._wake.set()

    # -- the loop ------------------------------------------------------------------

    async def _ticker(self) -> None:
        while True:
            self.node.tick(monotonic_ms())
            self._wake.set()
            await asyncio.sleep(self.tick_interval_ms / 1000)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping:
                await self._wake.wait()
                self._wake.clear()
                while self.node.has_ready() and not self._stopping:
                    ready = self.node.ready()
                    if ready.must_sync:
                        await loop.run_in_executor(None, self.store.persist_ready, ready)
                    else:  # a lazily written commit index: no I/O, not worth a thread hop
                        self.store.persist_ready(ready)
                    for msg in ready.messages:
                        self.send(msg)
                    self.apply(ready)
                    self.node.advance(ready)
                    for event in ready.events:
                        log.info("raft %s: %s", event.kind, event.text)
                    await self.after_advance()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a storage failure or a broken invariant: stop serving
            self.failure = e
            log.critical("raft driver stopped: %r", e, exc_info=e)
            self.on_failure(e)
