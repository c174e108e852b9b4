"""The producer: the public API over an accumulator and a sender (as Kafka's is).

- ``RecordAccumulator`` (client/accumulator.py) batches records per partition with no
  I/O: open batch per partition, sealing at ``batch_size`` or after ``linger_ms``, ONE
  ``encode_batch`` call per batch, ``buffer_memory``, and the per-partition order
  across retries;
- ``Sender`` (client/sender.py) owns the I/O: it drains ready batches per leader into
  pipelined Produce requests, reads the answers, retries, refreshes metadata and
  completes each batch;
- ``Producer`` (here) is what callers use: ``produce``, ``send``, ``send_many``,
  ``flush``, ``close``, and the records held while a topic's metadata is on its way.

Per record the hot path does a call, a partition choice and two list appends
(docs/client.md): ``produce`` is the accumulator's ``append`` itself. One result per
batch answers every record in it: ``RecordHandle`` (from ``send``) is a two-slot object
that computes its offset as ``base_offset + index`` when awaited; ``produce`` and
``send_many`` create nothing per record. Ordering and retries: docs/client.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rillet.client.accumulator import (
    HeldRecord,
    ProducerBatch,
    ProducerClosedError,
    RecordAccumulator,
    TopicQueues,
    record_size,
)
from rillet.client.metadata import DEFAULT_BOOTSTRAP, MetadataClient
from rillet.client.sender import Sender, delivery_future
from rillet.client.wire import records
from rillet.client.wire.errors import RilletError

log = logging.getLogger(__name__)

ACKS = {"all": -1, -1: -1, 1: 1, 0: 0, "1": 1, "0": 0, "-1": -1}


class DeliveryError(Exception):
    """Some records could not be delivered; ``errors`` counts them by exception name."""

    def __init__(self, failed_records: int, first: BaseException) -> None:
        super().__init__(f"{failed_records} record(s) not delivered; first error: {first!r}")
        self.failed_records = failed_records
        self.first = first


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int  # -1 with acks=0
    timestamp: int


class RecordHandle:
    """The result of ``send``: await it for the record's ``RecordMetadata``."""

    __slots__ = ("_batch", "_index", "_topic_known")

    def __init__(self, batch: ProducerBatch | None, index: int) -> None:
        self._batch = batch
        self._index = index
        self._topic_known: asyncio.Future[None] | None = None  # set while metadata is due

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        if self._batch is None and self._topic_known is not None:
            yield from asyncio.shield(self._topic_known).__await__()
        batch = self._batch
        if batch is None:
            raise RuntimeError("internal: a record handle without a batch")
        if not batch.done:
            yield from delivery_future(batch).__await__()
        return self._metadata(batch)

    def done(self) -> bool:
        return self._batch is not None and self._batch.done

    def _metadata(self, batch: ProducerBatch) -> RecordMetadata:
        if batch.error is not None:
            raise batch.error
        offset = batch.base_offset + self._index if batch.base_offset >= 0 else -1
        if batch.log_append_time >= 0:
            ts = batch.log_append_time
        elif batch.timestamps is not None:
            ts = batch.timestamps[self._index]
        else:
            ts = batch.timestamp_ms
        return RecordMetadata(batch.topic, batch.partition, offset, ts)


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Producer:
    """An asyncio producer. Use ``async with Producer(...) as p`` or ``await p.start()``.

    ``await p.produce(topic, value, key=...)`` buffers a record and returns at once unless
    ``buffer_memory`` is full; ``h = p.send(...)`` returns a handle that, awaited, gives
    the record's ``RecordMetadata``; ``await p.send_many(topic, values)`` buffers a whole
    list; ``await p.flush()`` waits for everything buffered so far.
    """

    def __init__(
        self,
        bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
        *,
        acks: int | str = 1,
        linger_ms: float = 5,
        batch_size: int = 64 * 1024,
        compression: str = "none",
        max_in_flight: int = 16,
        max_in_flight_per_partition: int = 0,
        buffer_memory: int = 32 * 1024 * 1024,
        max_request_bytes: int = 1024 * 1024,
        retries: int = 2**31 - 1,
        retry_backoff_ms: int = 100,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        max_block_ms: int = 60_000,
        client_id: str = "rillet-producer",
        metadata: MetadataClient | None = None,
    ) -> None:
        if acks not in ACKS:
            raise ValueError(f"acks must be 0, 1, -1 or 'all', not {acks!r}")
        if compression not in records.COMPRESSION_BY_NAME:
            raise ValueError(f"compression must be one of {sorted(records.COMPRESSION_BY_NAME)}")
        if batch_size <= 0 or max_in_flight <= 0 or buffer_memory < batch_size:
            raise ValueError(
                "batch_size and max_in_flight must be > 0, buffer_memory >= batch_size"
            )
        self.acks = ACKS[acks]
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self._meta = metadata or MetadataClient(
            bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        self._own_meta = metadata is None
        self._accumulator = acc = RecordAccumulator(
            batch_size=batch_size,
            linger_s=linger_ms / 1000,
            buffer_memory=buffer_memory,
            delivery_timeout_s=delivery_timeout_ms / 1000,
            clock=time.monotonic,  # start() switches to the loop's clock
            wall_clock_ms=_wall_clock_ms,
            compression=records.COMPRESSION_BY_NAME[compression],
            max_in_flight_per_partition=max_in_flight_per_partition,
        )
        acc.closed = True  # until start()
        acc.on_unknown_topic = self._defer
        acc.leader_of = lambda topic, partition: self._meta.snapshot.leader_for(topic, partition)
        self._sender = Sender(
            acc,
            self._meta,
            acks=self.acks,
            max_in_flight=max_in_flight,
            max_request_bytes=max_request_bytes,
            retries=retries,
            retry_backoff_s=retry_backoff_ms / 1000,
            request_timeout_ms=request_timeout_ms,
        )
        # records for topics whose metadata is on its way: (resolved future, records)
        self._pending: dict[str, tuple[asyncio.Future[None], list[HeldRecord]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.stats = self._sender.stats
        # The hot path is one call: the accumulator's append, which returns
        # ``acc.not_full`` (an already-done future) or ``acc.when_full()``. Only when
        # ``produce`` is ours: a subclass's override (or a patched class) must be called.
        if type(self).produce is _PRODUCE:
            self.produce = acc.append  # type: ignore[method-assign]

    # --- settings, read-only (the accumulator and the sender hold them) -------------

    @property
    def linger_s(self) -> float:
        return self._accumulator.linger_s

    @property
    def compression(self) -> int:
        """The compression codec id (records.COMPRESSION_BY_NAME)."""
        return self._accumulator.compression

    @property
    def max_in_flight(self) -> int:
        return self._sender.max_in_flight

    @property
    def max_in_flight_per_partition(self) -> int:
        return self._accumulator.max_in_flight_per_partition

    @property
    def max_request_bytes(self) -> int:
        return self._sender.max_request_bytes

    @property
    def retries(self) -> int:
        return self._sender.retries

    @property
    def retry_backoff_s(self) -> float:
        return self._sender.retry_backoff_s

    @property
    def delivery_timeout_s(self) -> float:
        return self._accumulator.delivery_timeout_s

    @property
    def request_timeout_ms(self) -> int:
        return self._sender.request_timeout_ms

    @property
    def on_batch_done(self) -> Any:
        """Called as (records, seconds from batch open to result) per completed batch;
        `rillet perf produce` uses it for latency percentiles."""
        return self._sender.on_batch_done

    @on_batch_done.setter
    def on_batch_done(self, callback: Any) -> None:
        self._sender.on_batch_done = callback

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> Producer:
        """Connect to the cluster (any bootstrap broker) and learn its metadata."""
        self._loop = loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        done.set_result(None)
        acc = self._accumulator
        acc.clock = loop.time  # the sender's deadlines use it too
        acc.not_full = done
        acc.when_full = self._sender.wait_for_space
        self._sender.start(loop)
        acc.closed = self._closed
        self._meta.listeners.append(self._on_metadata)
        await self._meta.refresh(force=True)
        return self

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self, *, raise_errors: bool = True) -> None:
        """Send everything buffered now and wait for its results.

        Raises DeliveryError when records failed since the last flush (and no handle
        reported the failure to its caller), unless ``raise_errors`` is False.
        """
        self._check_open()
        acc = self._accumulator
        acc.seal_all()
        while self._pending:  # records for topics whose metadata is on its way
            await asyncio.gather(*(known for known, _ in self._pending.values()))
            acc.seal_all()
        waiting = list(acc.incomplete)
        if waiting:
            await asyncio.gather(*(delivery_future(b) for b in waiting))
        if raise_errors and self._sender.first_error is not None:
            failed, first = self._sender.take_failures()
            raise DeliveryError(failed, first)  # type: ignore[arg-type]

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush (up to ``timeout_s``), then close every connection."""
        if self._closed or self._loop is None:
            self._closed = self._accumulator.closed = True
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush(raise_errors=False)
        except TimeoutError:
            log.warning(
                "producer closed with %d batches undelivered", len(self._accumulator.incomplete)
            )
        finally:
            self._closed = True
            self._sender.close()
            error = ProducerClosedError("producer closed")
            self._sender.fail_all(error)
            for topic in list(self._pending):
                self._fail_pending(topic, error)
            if self._own_meta:
                await self._meta.close()

    def _check_open(self) -> None:
        if self._closed or self._loop is None:
            raise ProducerClosedError("producer is closed or not started")

    # --- the hot path --------------------------------------------------------------

    def produce(  # replaced per instance by the accumulator's append (see __init__)
        self,
        topic: str,
        value: Any,
        key: Any = None,
        headers: Any = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> Awaitable[None]:
        """Buffer one record; await the result to respect ``buffer_memory``.

        Returns an already-done future unless the buffer is full (then one that resolves
        when space frees up), so ``await p.produce(...)`` costs no per-record object.
        Delivery errors are reported by ``flush()``.
        """
        return self._accumulator.append(topic, value, key, headers, partition, timestamp)

    def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        headers: Any = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> RecordHandle:
        """Buffer one record; await the returned handle for its ``RecordMetadata``."""
        handle = RecordHandle(None, 0)
        self._append(topic, (value, key, headers, partition, timestamp, handle))
        return handle

    async def partitions_for(self, topic: str) -> int:
        """The topic's partition count (waits up to ``max_block_ms`` for its metadata)."""
        self._check_open()
        t = self._accumulator.topics.get(topic) or await self._await_topic(topic)
        return t.num_partitions

    async def send_and_wait(
        self, topic: str, value: Any, key: Any = None, **kw: Any
    ) -> RecordMetadata:
        return await self.send(topic, value, key, **kw)

    def _append(self, topic: str, rec: HeldRecord) -> None:
        """Append (or hold, while the topic's metadata is on its way) one record."""
        self._check_open()
        t = self._accumulator.topics.get(topic)
        if t is None or topic in self._pending:
            self._defer(topic, rec)
            return
        value, key, headers, partition, timestamp, handle = rec
        b, index = self._accumulator.append_record(t, value, key, headers, partition, timestamp)
        if handle is not None:
            handle._batch, handle._index = b, index

    # --- bulk ----------------------------------------------------------------------

    async def send_many(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        partition: int | None = None,
    ) -> None:
        """Buffer a list of records in column slices (no per-record Python work when
        unkeyed). Every value and key is checked before any is added; they join the
        partition's open batch as records from ``produce`` do, and batches seal at
        ``batch_size`` or after ``linger_ms``: calls a millisecond apart share a batch.
        Waits for buffer space between slices; delivery errors are reported by
        ``flush()``."""
        self._check_open()
        if not values:
            return
        if keys is not None and len(keys) != len(values):
            raise ValueError("values and keys differ in length")
        t = self._accumulator.topics.get(topic) or await self._await_topic(topic)
        if partition is not None and not 0 <= partition < t.num_partitions:
            raise ValueError(f"{topic} has no partition {partition}")
        self._accumulator.check_columns(values, keys)  # all, before any is added
        if keys is not None and partition is None:
            groups: dict[int, list[int]] = {}
            partition_for = self._accumulator.partition_for
            for i, k in enumerate(keys):
                groups.setdefault(partition_for(t, k), []).append(i)
            for p, idx in groups.items():
                await self._bulk(t, p, [values[i] for i in idx], [keys[i] for i in idx])
            return
        await self._bulk(t, partition, values, keys)

    async def _bulk(
        self,
        t: TopicQueues,
        partition: int | None,
        values: Sequence[Any],
        keys: Sequence[Any] | None,
    ) -> None:
        acc = self._accumulator
        start, n = 0, len(values)
        while start < n:
            start = acc.append_columns(t, partition, values, keys, start)
            if acc.buffered >= acc.buffer_memory:
                await self._sender.wait_for_space()

    # --- metadata ------------------------------------------------------------------

    def _on_metadata(self, snapshot: Any) -> None:
        for name in self._accumulator.topics:
            parts = snapshot.topics.get(name)
            if parts is not None:
                self._accumulator.grow_topic(name, len(parts))
        self._sender.wakeup()

    async def _await_topic(self, topic: str) -> TopicQueues:
        # The topic's partitions, not every leader (as Kafka's producer waits): records for
        # a partition with no leader wait in the accumulator for one, within the delivery
        # timeout, and leave the rest of the topic writable.
        waited = await self._meta.wait_for_topics([topic], self.max_block_ms, leaders=False)
        parts = waited[topic]
        t = self._accumulator.add_topic(topic, len(parts))
        # Records held while the metadata was on its way go first, before anything the
        # caller appends once this returns, so the topic's order is the call order.
        entry = self._pending.pop(topic, None)
        if entry is not None:
            known, held = entry
            try:
                for rec in held:
                    self._accumulator.buffered -= _held_size(rec)  # re-added by _append
                    try:
                        self._append(topic, rec)
                    except Exception as e:
                        # This record alone fails, as it would have synchronously had
                        # the topic been known; the ones held after it still go.
                        self._sender.count_failure(1, e)
                        if rec[5] is not None:
                            rec[5]._batch = ProducerBatch.failed(e)
            finally:
                known.set_result(None)  # flush() and the handles wait on it
                self._sender.release(0)  # failed records gave their bytes back
        return t

    def _defer(self, topic: str, rec: HeldRecord) -> None:
        """Hold a record for a topic whose metadata is not known yet, in order."""
        handle: RecordHandle | None = rec[5]
        entry = self._pending.get(topic)
        if entry is None:
            assert self._loop is not None
            entry = self._pending[topic] = (self._loop.create_future(), [])
            self._sender.spawn(self._resolve_topic(topic))
        size = record_size(rec[0], rec[1], rec[2])  # may raise: before it is held
        entry[1].append(rec)
        self._accumulator.buffered += size  # bounded too
        if handle is not None:
            handle._topic_known = entry[0]

    async def _resolve_topic(self, topic: str) -> None:
        try:
            await self._await_topic(topic)
        except (RilletError, ValueError) as e:
            self._fail_pending(topic, e)
        except Exception as e:  # a bug: fail the held records loudly rather than hang
            log.exception("resolving topic %r failed", topic)
            self._fail_pending(topic, e)

    def _fail_pending(self, topic: str, error: BaseException) -> None:
        known, held = self._pending.pop(topic, (None, []))
        self._sender.release(sum(map(_held_size, held)))
        self._sender.count_failure(len(held), error)
        for rec in held:
            if rec[5] is not None:
                rec[5]._batch = ProducerBatch.failed(error)
        if known is not None and not known.done():
            known.set_result(None)


_PRODUCE = Producer.produce  # see Producer.__init__: the fast path replaces only this


def _held_size(rec: HeldRecord) -> int:
    return record_size(rec[0], rec[1], rec[2])


__all__ = [
    "DeliveryError",
    "Producer",
    "ProducerClosedError",
    "RecordHandle",
    "RecordMetadata",
]
