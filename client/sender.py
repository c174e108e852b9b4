"""The producer's sender: everything between the accumulator and the brokers.

It drains the accumulator (client/accumulator.py) whenever a batch is sealed or a
result comes back, groups batches by leader into Produce requests with up to
``max_in_flight`` pipelined per connection, reads the answers, hands retriable
failures back to the accumulator (which keeps the partition's order), refreshes
metadata when a leader is unknown or has moved, and completes the batches: their
delivery futures, the memory they held, the producer's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from rillet.client.accumulator import PartitionQueue, ProducerBatch, RecordAccumulator
from rillet.client.metadata import MetadataClient
from rillet.client.wire import messages as m
from rillet.client.wire.errors import NetworkError, RilletError, error_for, error_name

log = logging.getLogger(__name__)

# What an acks=0 request "answers" for each batch: no error, no offset, no time.
_ACKS0 = m.ProducePartitionResult(0, 0, -1, -1, -1, None)
# ProducePartition from a tuple of its fields, in C: one per batch, where the class call
# (a Python-level __new__) costs ~150 ns more.
_partition: Callable[[tuple[int, int]], m.ProducePartition] = partial(
    tuple.__new__, m.ProducePartition
)


def delivery_future(b: ProducerBatch) -> asyncio.Future[None]:
    """A future that resolves when ``b`` completes (created on first demand)."""
    if b.future is None:
        b.future = asyncio.get_running_loop().create_future()
        if b.done:
            b.future.set_result(None)
    return b.future


class Sender:
    def __init__(
        self,
        accumulator: RecordAccumulator,
        meta: MetadataClient,
        *,
        acks: int,
        max_in_flight: int,
        max_request_bytes: int,
        retries: int,
        retry_backoff_s: float,
        request_timeout_ms: int,
    ) -> None:
        self._acc = accumulator
        self._meta = meta
        self.acks = acks
        self.max_in_flight = max_in_flight
        self.max_request_bytes = max_request_bytes
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.request_timeout_ms = request_timeout_ms
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._closed = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._linger_at = 0.0
        self._node_in_flight: dict[int, int] = {}
        self._busy: set[int] = set()  # nodes at max_in_flight
        self._refresh_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self.failed_records = 0
        self.first_error: BaseException | None = None
        self.stats = {"requests": 0, "batches": 0, "records": 0, "retries": 0}
        # Called as (records, seconds from batch open to result) per completed batch.
        self.on_batch_done: Callable[[int, float], Any] | None = None
        accumulator.wakeup = self.wakeup

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def close(self) -> None:
        """Stop sending: cancel the linger timer and every background task."""
        self._closed = True
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        for task in list(self._tasks):
            task.cancel()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Run ``coro`` in the background; ``close`` cancels it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- draining ------------------------------------------------------------------

    def wakeup(self) -> None:
        """Schedule one pass (seal lingered batches, drain, send) on the loop."""
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._run_once)

    def _run_once(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        assert self._loop is not None
        acc = self._acc
        self._arm_linger(acc.ready(self._loop.time()))
        while acc.unencodable:
            b = acc.unencodable.pop()
            self.complete(b, b.error)
        leader_for = self._meta.snapshot.leader_for
        while True:
            by_node, leaderless = acc.drain(leader_for, self.max_request_bytes, self._busy)
            if leaderless:
                self._refresh_soon()
            if not by_node:
                return
            for node, batches in by_node.items():
                n = self._node_in_flight[node] = self._node_in_flight.get(node, 0) + 1
                if n >= self.max_in_flight:
                    self._busy.add(node)
                self.spawn(self._run_request(node, batches))

    def _arm_linger(self, at: float | None) -> None:
        if at is None or (self._linger_timer is not None and self._linger_at <= at):
            return
        assert self._loop is not None
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        self._linger_at = at
        self._linger_timer = self._loop.call_at(at, self._on_linger)

    def _on_linger(self) -> None:
        self._linger_timer = None
        self._run_once()

    # --- requests ------------------------------------------------------------------

    async def _run_request(self, node: int, batches: list[ProducerBatch]) -> None:
        by_topic: dict[str, list[m.ProducePartition]] = {}
        for b in batches:
            b.attempts += 1
            nbytes = len(b.payload)  # type: ignore[arg-type]
            by_topic.setdefault(b.topic, []).append(_partition((b.partition, nbytes)))
        request = m.ProduceRequest(
            acks=self.acks,
            timeout_ms=self.request_timeout_ms,
            topics=[m.ProduceTopic(t, parts) for t, parts in by_topic.items()],
        )
        payload = [b.payload for b in batches]
        self.stats["requests"] += 1
        try:
            conn = await self._meta.connection(node)
            if self.acks == 0:
                conn.post(request, payload)  # type: ignore[arg-type]
                await conn.drain()
                results: dict[tuple[str, int], m.ProducePartitionResult] = {}
            else:
                response, _ = await conn.call(request, payload)  # type: ignore[arg-type]
                results = {(t.topic, r.partition): r for t in response.topics for r in t.partitions}
        except RilletError as e:
            if isinstance(e, NetworkError):
                self._meta.request_update()
            for b in batches:
                self._on_result(b, e, None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug or a malformed answer: fail, never hang
            log.exception("produce request to broker %d failed", node)
            for b in batches:
                self._on_result(b, e, None)
        else:
            for b in batches:
                self._on_result(b, None, results.get((b.topic, b.partition), _ACKS0))
        finally:
            self._node_in_flight[node] -= 1
            self._busy.discard(node)
            self.wakeup()

    def _on_result(
        self, b: ProducerBatch, error: BaseException | None, result: m.ProducePartitionResult | None
    ) -> None:
        if error is None and result is not None and result.error_code:
            msg = result.error_message or error_name(result.error_code)
            error = error_for(result.error_code, f"{b.topic}-{b.partition}: {msg}")
        if error is None:
            b.base_offset = result.base_offset if result is not None else -1
            b.log_append_time = result.log_append_time if result is not None else -1
            requeued = self._acc.delivered(b)
            self.complete(b, None)
        elif self._may_retry(b, error):
            self.stats["retries"] += 1
            self._meta.request_update()
            requeued = self._acc.retry(b)
        else:
            requeued = self._acc.failed(b)
            self.complete(b, error)
        if requeued is not None:
            self._resume_after_backoff(requeued)

    def _may_retry(self, b: ProducerBatch, error: BaseException) -> bool:
        retriable = isinstance(error, RilletError) and error.retriable
        assert self._loop is not None
        return retriable and b.attempts <= self.retries and self._loop.time() < b.deadline

    def _resume_after_backoff(self, tp: PartitionQueue) -> None:
        """The partition's failed batches are back at the head of its queue: send
        again after a backoff and a metadata refresh."""
        log.info("retrying batch(es) of %s-%d", tp.topic, tp.partition)

        async def resume() -> None:
            try:
                await asyncio.sleep(self.retry_backoff_s)
                await self._meta.refresh()
            except RilletError as e:
                log.info("metadata refresh failed (%r); retrying anyway", e)
            finally:
                self._acc.unmute(tp)

        self.spawn(resume())

    # --- completion and memory -----------------------------------------------------

    def complete(self, b: ProducerBatch, error: BaseException | None) -> None:
        """``b`` has its result: free its memory, count it, resolve its future."""
        if b.done:
            return
        b.done = True
        b.error = error
        self._acc.deallocate(b)
        self._wake_space_waiters()
        n = b.count or len(b.values or ())
        if b.future is not None and not b.future.done():
            b.future.set_result(None)
        b.payload = None
        if error is not None:
            self.count_failure(n, error)
            log.debug("batch of %d records to %s-%d failed: %r", n, b.topic, b.partition, error)
            return
        self.stats["batches"] += 1
        self.stats["records"] += n
        if self.on_batch_done is not None and self._loop is not None:
            # Last, and contained: a bug in the caller's callback must not leave this
            # batch or the rest of its request unfinished (flush would hang).
            try:
                self.on_batch_done(n, self._loop.time() - b.created)
            except Exception:
                log.exception("on_batch_done raised; ignored")

    def count_failure(self, records: int, error: BaseException) -> None:
        self.failed_records += records
        if self.first_error is None:
            self.first_error = error

    def take_failures(self) -> tuple[int, BaseException | None]:
        """Failures since the last call: (records, first error)."""
        failed, first = self.failed_records, self.first_error
        self.failed_records, self.first_error = 0, None
        return failed, first

    def wait_for_space(self) -> asyncio.Future[None]:
        """A future that resolves once ``buffered`` drops below ``buffer_memory``. A pass
        is scheduled, which seals the open batches (the accumulator is out of memory), so
        the wait is for answers, not for a linger."""
        assert self._loop is not None
        fut = self._loop.create_future()
        self._space_waiters.append(fut)
        self.wakeup()
        return fut

    def release(self, nbytes: int) -> None:
        """Bytes that never became a batch (held records of a failed topic) are free."""
        self._acc.buffered -= nbytes
        self._wake_space_waiters()

    def _wake_space_waiters(self) -> None:
        waiters = self._space_waiters
        while waiters and self._acc.buffered < self._acc.buffer_memory:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    def fail_all(self, error: BaseException) -> None:
        """Close: every incomplete batch and every waiter fails with ``error``."""
        for b in self._acc.abort():
            self.complete(b, error)
        while self._space_waiters:
            fut = self._space_waiters.popleft()
            if not fut.done():
                fut.set_exception(error)
                fut.exception()

    # --- metadata ------------------------------------------------------------------

    def _refresh_soon(self) -> None:
        """Refresh metadata in the background (one at a time), then try sending again."""
        self._meta.request_update()
        if self._refresh_task is not None and not self._refresh_task.done():
            return

        async def refresh() -> None:
            with contextlib.suppress(RilletError):
                await self._meta.refresh()
            self._expire_leaderless()
            self.wakeup()

        self._refresh_task = self.spawn(refresh())

    def _expire_leaderless(self) -> None:
        assert self._loop is not None
        for b in self._acc.expire(self._loop.time()):
            self.complete(
                b,
                error_for(5, f"{b.topic}-{b.partition}: no leader within delivery_timeout_ms"),
            )
