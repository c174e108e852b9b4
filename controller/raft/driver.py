"""The one driver of a `RaftNode`, run by production and by the simulator alike.

All decisions live in the core; the driver only carries out each `Ready` in the order
its field comments fix (`RaftDriver.ready_steps`):

    1. persist (snapshot, entries, hard state) through the storage;
    2. send the messages through the network;
    3. apply the snapshot and the committed entries (the state machine);
    4. `advance`, report the core's events, then let the state machine react
       (`after_advance`: leadership changes, and a snapshot to take, which the driver
       hands to `RaftNode.compact` and then to the storage).

Network, storage, state machine and clock are parameters. Production passes the
transport, `RaftStore` and `time.monotonic`; the simulator passes its seeded network,
an in-memory durable store and its simulated clock, so the simulator checks this very
loop, not a copy of it.

The steps are synchronous except the two blocking writes (the fsync of step 1 and the
snapshot save), which `ready_steps` yields instead of doing. The simulator runs them in
place (`process_ready`); `AsyncRaftLoop` runs them in the default executor so an fsync
never blocks the event loop. Inputs (`step`, `propose`, ticks) may arrive while a write
runs there: the core allows that, and they show up in the next Ready. Proposals that
arrive during one fsync are written by the next, which is the group commit.

After each Ready that applied committed entries `ready_steps` also yields None, a turn
boundary: `AsyncRaftLoop` gives the event loop a turn there, so a backlog of commits
(bounded per Ready by `RaftConfig.max_committed_bytes_per_ready`) is applied a slice
per turn, with heartbeats, votes and requests served in between, instead of in one
long callback. Inputs arriving there are no different from inputs arriving during a
write, which the core already allows.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from rillet.controller.raft.core import Message, RaftEvent, RaftNode, Ready, Snapshot

log = logging.getLogger(__name__)

# A blocking write the caller runs before resuming `ready_steps` (in place or in a thread).
BlockingWrite = Callable[[], None]
# What `ready_steps` yields: a write to run, or None where the caller may give the loop a
# turn before resuming.
ReadyStep = BlockingWrite | None


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class RaftStorage(Protocol):
    """Durable log, hard state and snapshot (`RaftStore`, or the simulator's store)."""

    def persist_ready(self, ready: Ready) -> None: ...

    def save_snapshot(self, snapshot: Snapshot) -> None: ...


class RaftNetwork(Protocol):
    """One-way delivery of a message to `msg.dst` (lossy: the core retries)."""

    def send(self, msg: Message) -> None: ...


class StateMachine(Protocol):
    """What the log is about (the controller's metadata, or a test's list of payloads)."""

    def apply(self, ready: Ready) -> None:
        """Step 3: restore `ready.snapshot` if set, then apply `ready.committed_entries`."""

    def after_advance(self, node: RaftNode) -> tuple[int, bytes] | None:
        """React to the node's new state; return (applied index, state bytes) to snapshot."""


def log_event(event: RaftEvent) -> None:
    log.info("raft %s: %s", event.kind, event.text)


class RaftDriver:
    """Carries out the Ready of one node; shared by production and the simulator."""

    def __init__(
        self,
        node: RaftNode,
        storage: RaftStorage,
        network: RaftNetwork,
        machine: StateMachine,
        clock: Callable[[], int],
        *,
        on_event: Callable[[RaftEvent], None] = log_event,
    ) -> None:
        self.node = node
        self.storage = storage
        self.network = network
        self.machine = machine
        self.clock = clock
        self.on_event = on_event
        self.wake: Callable[[], None] = lambda: None  # set by whoever schedules ready_steps

    # -- inputs --------------------------------------------------------------------

    def tick(self) -> None:
        self.node.tick(self.clock())
        self.wake()

    def step(self, msg: Message) -> None:
        self.node.step(msg, self.clock())
        self.wake()

    def peer_unreachable(self, peer: int, since_ms: int | None = None) -> None:
        """The transport found nothing listening at ``peer`` on a connect started at
        ``since_ms`` (this driver's clock; see RaftNode.peer_unreachable)."""
        self.node.peer_unreachable(peer, self.clock(), since_ms)
        self.wake()

    def propose(self, data: bytes) -> int:
        """Raises NotLeader / TooManyUncommitted from the core."""
        index = self.node.propose(data)
        self.wake()
        return index

    def poke(self) -> None:
        """Something changed the core outside step/propose (e.g. a leadership transfer)."""
        self.wake()

    # -- the Ready loop --------------------------------------------------------------

    def ready_steps(self, stopping: Callable[[], bool] = lambda: False) -> Iterator[ReadyStep]:
        """Every pending Ready, in order; yields each blocking write for the caller to run,
        and None after a Ready that applied committed entries (a turn boundary).

        A Ready once taken is always finished; `stopping` is asked before taking the next.
        """
        node = self.node
        while not stopping() and node.has_ready():
            ready = node.ready()
            if ready.must_sync:
                yield functools.partial(self.storage.persist_ready, ready)
            else:  # a lazily written commit index: no I/O, not worth a thread hop
                self.storage.persist_ready(ready)
            for msg in ready.messages:
                self.network.send(msg)
            self.machine.apply(ready)
            node.advance(ready)
            for event in ready.events:
                self.on_event(event)
            wanted = self.machine.after_advance(node)
            if wanted is not None:
                snapshot = node.compact(*wanted)
                yield functools.partial(self.storage.save_snapshot, snapshot)
            if ready.committed_entries:
                yield None

    def process_ready(self) -> None:
        """Run the loop to quiescence in place (the simulator, tests)."""
        for write in self.ready_steps():
            if write is not None:
                write()


class AsyncRaftLoop:
    """Production scheduling of a `RaftDriver`: a tick timer and a wake-up loop in asyncio."""

    def __init__(
        self,
        driver: RaftDriver,
        *,
        tick_interval_ms: int = 20,
        on_failure: Callable[[BaseException], None] = lambda e: None,
    ) -> None:
        self.driver = driver
        self.tick_interval_ms = tick_interval_ms
        self.on_failure = on_failure
        self.failure: BaseException | None = None
        self._wake = asyncio.Event()
        driver.wake = self._wake.set
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

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
        """Finish the Ready in hand (a write in the executor is never abandoned), then stop."""
        self._stopping = True
        self._wake.set()
        ticker, run = self._tasks or (None, None)
        if ticker is not None:
            ticker.cancel()
        await asyncio.gather(*[t for t in (ticker, run) if t is not None], return_exceptions=True)
        self._tasks = []

    async def _ticker(self) -> None:
        while True:
            self.driver.tick()
            await asyncio.sleep(self.tick_interval_ms / 1000)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping:
                await self._wake.wait()
                self._wake.clear()
                for write in self.driver.ready_steps(lambda: self._stopping):
                    if write is None:
                        await asyncio.sleep(0)  # a slice of commits applied: a turn
                    else:
                        await loop.run_in_executor(None, write)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a storage failure or a broken invariant: stop serving
            self.failure = e
            log.critical("raft driver stopped: %r", e, exc_info=e)
            self.on_failure(e)
