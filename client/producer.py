"""The producer: per-partition accumulators, batches encoded in one call, pipelined sends.

Per record the hot path does a call, a partition choice and two list appends (docs/design.md,
"Where the time goes"); everything else happens per batch:

- records go into the partition's open ``_Batch`` (columns: values, keys, ...);
- a batch is sealed when it reaches ``batch_size`` bytes or has lingered ``linger_ms``,
  and then encoded with ONE ``encode_batch`` call;
- the sender groups sealed batches by leader: one Produce request carries at most one
  batch per partition, for as many partitions of that leader as fit in
  ``max_request_bytes``, with up to ``max_in_flight`` requests per connection;
- one result per batch answers every record in it: ``RecordHandle`` (from ``send``) is
  a two-slot object that computes its offset as ``base_offset + index`` when awaited;
  ``produce`` and ``send_many`` create nothing per record.

Ordering and retries (no idempotence yet): a partition's batches are sent in order and
the broker appends one connection's requests in arrival order. When a batch fails with
a retriable error, its partition is *muted*: nothing new is sent for it, its other
in-flight batches are awaited, every failed batch goes back to the head of the queue in
its original order, metadata is refreshed, and the partition then sends ONE batch at a
time until one succeeds. A leader change or a dropped connection fails every later
in-flight batch of the partition too, so order holds. Only a failure that hits one
batch and not the next one on the same leader (say an acks=all timeout) can let a later
batch land before the retried one, as with Kafka's non-idempotent producer and
max.in.flight > 1; ``max_in_flight_per_partition=1`` rules that out at some throughput
cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rillet.client.metadata import DEFAULT_BOOTSTRAP, NO_LEADER, MetadataClient
from rillet.client.partitioner import StickyPartitioner, partition_for_key
from rillet.client.wire import records, schemas
from rillet.client.wire.errors import (
    NetworkError,
    RilletError,
    error_for,
    error_name,
)

log = logging.getLogger(__name__)

RECORD_OVERHEAD_BYTES = 3  # msgpack type bytes per value; batch_size counts approximately
KEY_CACHE_MAX = 65_536  # keys -> partition memo (murmur2 in Python costs ~1 us per key)
ACKS = {"all": -1, -1: -1, 1: 1, 0: 0, "1": 1, "0": 0, "-1": -1}


class ProducerClosedError(RuntimeError):
    """The producer was closed (or never started); the caller's mistake."""


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


class _Batch:
    """An open or sealed batch of one partition; columns grow until it is sealed."""

    __slots__ = (
        "topic",
        "partition",
        "values",
        "keys",
        "headers",
        "timestamps",
        "nbytes",
        "timestamp_ms",
        "created",
        "payload",
        "count",
        "seq",
        "attempts",
        "deadline",
        "base_offset",
        "log_append_time",
        "error",
        "future",
        "done",
    )

    def __init__(self, topic: str, partition: int, seq: int, now: float, ts_ms: int) -> None:
        self.topic = topic
        self.partition = partition
        self.values: list[Any] = []
        self.keys: list[Any] | None = None  # created on the first key
        self.headers: list[Any] | None = None
        self.timestamps: list[int] | None = None
        self.nbytes = 0
        self.timestamp_ms = ts_ms
        self.created = now
        self.payload: bytes | None = None
        self.count = 0
        self.seq = seq  # per-partition sequence: the order batches must be appended in
        self.attempts = 0
        self.deadline = 0.0
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self.future: asyncio.Future[None] | None = None  # only when someone waits
        self.done = False

    def wait(self) -> asyncio.Future[None]:
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
            if self.done:
                self.future.set_result(None)
        return self.future


class RecordHandle:
    """The result of ``send``: await it for the record's ``RecordMetadata``."""

    __slots__ = ("_batch", "_index", "_topic_known")

    def __init__(self, batch: _Batch | None, index: int) -> None:
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
            yield from batch.wait().__await__()
        return self._metadata(batch)

    def done(self) -> bool:
        return self._batch is not None and self._batch.done

    def _metadata(self, batch: _Batch) -> RecordMetadata:
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


class _Partition:
    """One partition's queue: the open batch, sealed batches in order, in-flight count."""

    __slots__ = (
        "topic",
        "partition",
        "open",
        "ready",
        "in_flight",
        "muted",
        "retrying",
        "failed",
        "next_seq",
        "sealed_at",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.open: _Batch | None = None
        self.ready: deque[_Batch] = deque()
        self.in_flight = 0
        self.muted = False  # a batch failed: wait for in-flight ones before resending
        self.retrying = False  # send one batch at a time until one succeeds
        self.failed: list[_Batch] = []
        self.next_seq = 0


class _Topic:
    __slots__ = ("name", "parts", "num_partitions", "sticky", "key_cache")

    def __init__(self, name: str, num_partitions: int) -> None:
        self.name = name
        self.parts = [_Partition(name, p) for p in range(num_partitions)]
        self.num_partitions = num_partitions
        self.sticky = -1
        self.key_cache: dict[bytes, int] = {}

    def grow(self, num_partitions: int) -> None:
        for p in range(self.num_partitions, num_partitions):
            self.parts.append(_Partition(self.name, p))
        if num_partitions != self.num_partitions:
            self.key_cache.clear()
        self.num_partitions = max(num_partitions, self.num_partitions)


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
        self.linger_s = linger_ms / 1000
        self.batch_size = batch_size
        self.compression = records.COMPRESSION_BY_NAME[compression]
        self.max_in_flight = max_in_flight
        self.max_in_flight_per_partition = max_in_flight_per_partition or 1 << 30
        self.buffer_memory = buffer_memory
        self.max_request_bytes = max_request_bytes
        self.retries = retries
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.request_timeout_ms = request_timeout_ms
        self.max_block_ms = max_block_ms
        self._meta = metadata or MetadataClient(
            bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        self._own_meta = metadata is None
        self._topics: dict[str, _Topic] = {}
        # records for topics whose metadata is on its way: (resolved future, records)
        self._pending: dict[str, tuple[asyncio.Future[None], list[tuple]]] = {}
        self._refresh_task: asyncio.Task | None = None
        self._sticky = StickyPartitioner()
        self._lingering: dict[_Partition, None] = {}  # partitions with an open batch
        self._linger_timer: asyncio.TimerHandle | None = None
        self._ready: dict[_Partition, None] = {}  # partitions with sealed batches to send
        self._node_in_flight: dict[int, int] = {}
        self._send_scheduled = False
        self._buffered = 0  # bytes of records not yet acknowledged
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._incomplete: set[_Batch] = set()
        self._idle: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._failed_records = 0
        self._first_error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done_future: asyncio.Future[None] | None = None
        self._closed = False
        self.stats = {"requests": 0, "batches": 0, "records": 0, "retries": 0}
        # Called as (records, seconds from batch open to result) per completed batch;
        # `rillet perf produce` uses it for latency percentiles.
        self.on_batch_done: Any = None

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> Producer:
        """Connect to the cluster (any bootstrap broker) and learn its metadata."""
        self._loop = asyncio.get_running_loop()
        self._done_future = self._loop.create_future()
        self._done_future.set_result(None)
        self._idle = asyncio.Event()
        self._idle.set()
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
        for tp in list(self._lingering):
            self._seal(tp)
        while self._pending:  # records for topics whose metadata is on its way
            await asyncio.gather(*(known for known, _ in self._pending.values()))
            for tp in list(self._lingering):
                self._seal(tp)
        waiting = list(self._incomplete)
        if waiting:
            await asyncio.gather(*(b.wait() for b in waiting))
        if raise_errors and self._first_error is not None:
            failed, first = self._failed_records, self._first_error
            self._failed_records, self._first_error = 0, None
            raise DeliveryError(failed, first)

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush (up to ``timeout_s``), then close every connection."""
        if self._closed or self._loop is None:
            self._closed = True
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush(raise_errors=False)
        except TimeoutError:
            log.warning("producer closed with %d batches undelivered", len(self._incomplete))
        finally:
            self._closed = True
            if self._linger_timer is not None:
                self._linger_timer.cancel()
            for task in list(self._tasks):
                task.cancel()
            self._fail_all(ProducerClosedError("producer closed"))
            if self._own_meta:
                await self._meta.close()

    def _check_open(self) -> None:
        if self._closed or self._loop is None:
            raise ProducerClosedError("producer is closed or not started")

    # --- the hot path --------------------------------------------------------------

    def produce(
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
        t = self._topics.get(topic)
        if t is None or headers is not None or timestamp is not None or self._closed:
            self._append_slow(topic, value, key, headers, partition, timestamp, None)
        else:
            if partition is None:
                if key is None:
                    partition = t.sticky
                    if partition < 0:
                        partition = self._stick(t, -1)
                else:
                    partition = t.key_cache.get(key)
                    if partition is None:
                        partition = self._partition_for_key(t, key)
            elif partition >= t.num_partitions or partition < 0:
                raise ValueError(f"{topic} has no partition {partition}")
            tp = t.parts[partition]
            b = tp.open
            if b is None:
                b = self._open_batch(tp)
            b.values.append(value)
            if key is not None or b.keys is not None:
                self._append_key(b, key)
            size = len(value) + RECORD_OVERHEAD_BYTES if value is not None else 1
            b.nbytes += size
            if b.nbytes >= self.batch_size:
                self._seal(tp)
            self._buffered += size
        if self._buffered >= self.buffer_memory:
            return self._wait_for_space()
        return self._done_future  # type: ignore[return-value]

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
        self._append_slow(topic, value, key, headers, partition, timestamp, handle)
        return handle

    async def partitions_for(self, topic: str) -> int:
        """The topic's partition count (waits up to ``max_block_ms`` for its metadata)."""
        self._check_open()
        t = self._topics.get(topic) or await self._await_topic(topic)
        return t.num_partitions

    async def send_and_wait(
        self, topic: str, value: Any, key: Any = None, **kw: Any
    ) -> RecordMetadata:
        return await self.send(topic, value, key, **kw)

    def _append_slow(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: Any,
        partition: int | None,
        timestamp: int | None,
        handle: RecordHandle | None,
    ) -> None:
        """Every case the hot path leaves out: unknown topic, headers, timestamps."""
        self._check_open()
        t = self._topics.get(topic)
        if t is None or topic in self._pending:
            self._defer(topic, (value, key, headers, partition, timestamp, handle))
            return
        if partition is None:
            if key is None:
                partition = t.sticky if t.sticky >= 0 else self._stick(t, -1)
            else:
                partition = t.key_cache.get(key)
                if partition is None:
                    partition = self._partition_for_key(t, key)
        elif not 0 <= partition < t.num_partitions:
            raise ValueError(f"{topic} has no partition {partition}")
        tp = t.parts[partition]
        b = tp.open or self._open_batch(tp)
        index = len(b.values)
        b.values.append(value)
        if key is not None or b.keys is not None:
            self._append_key(b, key)
        if headers is not None or b.headers is not None:
            if b.headers is None:
                b.headers = [None] * index
            b.headers.append(list(headers) if headers is not None else None)
        if timestamp is not None or b.timestamps is not None:
            if b.timestamps is None:
                b.timestamps = [b.timestamp_ms] * index
            b.timestamps.append(b.timestamp_ms if timestamp is None else int(timestamp))
        size = _record_size(value, key, headers)
        b.nbytes += size
        self._buffered += size
        if handle is not None:
            handle._batch, handle._index = b, index
        if b.nbytes >= self.batch_size:
            self._seal(tp)

    @staticmethod
    def _append_key(b: _Batch, key: Any) -> None:
        if b.keys is None:
            b.keys = [None] * (len(b.values) - 1)
        b.keys.append(key)

    def _partition_for_key(self, t: _Topic, key: Any) -> int:
        if not isinstance(key, bytes | bytearray | memoryview):
            raise TypeError(f"key must be bytes, not {type(key).__name__}")
        p = partition_for_key(bytes(key), t.num_partitions)
        if len(t.key_cache) >= KEY_CACHE_MAX:
            t.key_cache.clear()
        t.key_cache[key] = p  # type: ignore[index]
        return p

    def _stick(self, t: _Topic, previous: int) -> int:
        if previous < 0:
            t.sticky = self._sticky.partition(t.name, t.num_partitions)
        else:
            t.sticky = self._sticky.on_new_batch(t.name, t.num_partitions, previous)
        return t.sticky

    def _wait_for_space(self) -> asyncio.Future[None]:
        assert self._loop is not None
        fut = self._loop.create_future()
        self._space_waiters.append(fut)
        return fut

    def _release(self, nbytes: int) -> None:
        self._buffered -= nbytes
        waiters = self._space_waiters
        while waiters and self._buffered < self.buffer_memory:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    # --- bulk ----------------------------------------------------------------------

    async def send_many(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        partition: int | None = None,
    ) -> None:
        """Buffer a list of records as whole batches (column slices, no per-record
        Python work when unkeyed). Waits for buffer space between batches; delivery
        errors are reported by ``flush()``."""
        self._check_open()
        if not values:
            return
        if keys is not None and len(keys) != len(values):
            raise ValueError("values and keys differ in length")
        t = self._topics.get(topic) or await self._await_topic(topic)
        if partition is not None and not 0 <= partition < t.num_partitions:
            raise ValueError(f"{topic} has no partition {partition}")
        if keys is not None and partition is None:
            groups: dict[int, list[int]] = {}
            for i, k in enumerate(keys):
                p = t.key_cache.get(k)
                groups.setdefault(self._partition_for_key(t, k) if p is None else p, []).append(i)
            for p, idx in groups.items():
                await self._bulk(t, p, [values[i] for i in idx], [keys[i] for i in idx])
            return
        await self._bulk(t, partition, values, keys)

    async def _bulk(
        self, t: _Topic, partition: int | None, values: Sequence[Any], keys: Sequence[Any] | None
    ) -> None:
        total = sum(map(len, values)) + RECORD_OVERHEAD_BYTES * len(values)
        if keys is not None:
            total += sum(len(k) for k in keys if k is not None)
        n = len(values)
        per_batch = max(1, n * self.batch_size // max(total, 1))
        for start in range(0, n, per_batch):
            p = partition
            if p is None:
                p = t.sticky if t.sticky >= 0 else self._stick(t, -1)
            tp = t.parts[p]
            if tp.open is not None:
                self._seal(tp)  # keep the partition's order: earlier records go first
            b = self._open_batch(tp)
            b.values = list(values[start : start + per_batch])
            b.keys = list(keys[start : start + per_batch]) if keys is not None else None
            b.nbytes = total * len(b.values) // n
            self._buffered += b.nbytes
            self._seal(tp)
            if self._buffered >= self.buffer_memory:
                await self._wait_for_space()

    # --- batches -------------------------------------------------------------------

    def _open_batch(self, tp: _Partition) -> _Batch:
        assert self._loop is not None
        now = self._loop.time()
        b = _Batch(tp.topic, tp.partition, tp.next_seq, now, int(time.time() * 1000))
        b.deadline = now + self.delivery_timeout_s
        tp.next_seq += 1
        tp.open = b
        self._incomplete.add(b)
        self._lingering[tp] = None
        if self._linger_timer is None:
            self._linger_timer = self._loop.call_at(now + self.linger_s, self._on_linger)
        return b

    def _on_linger(self) -> None:
        """Seal every batch that has waited ``linger_ms``; re-arm for the next one."""
        assert self._loop is not None
        self._linger_timer = None
        now = self._loop.time()
        limit = now - self.linger_s
        oldest = None
        for tp in list(self._lingering):
            b = tp.open
            if b is None:
                del self._lingering[tp]
            elif b.created <= limit:
                self._seal(tp)
            elif oldest is None or b.created < oldest:
                oldest = b.created
        if oldest is not None:
            self._linger_timer = self._loop.call_at(oldest + self.linger_s, self._on_linger)

    def _seal(self, tp: _Partition) -> None:
        """Close the open batch: encode it once and queue it for its leader."""
        b = tp.open
        if b is None:
            return
        tp.open = None
        self._lingering.pop(tp, None)
        t = self._topics.get(tp.topic)
        if t is not None and t.sticky == tp.partition:
            self._stick(t, tp.partition)  # KIP-480: the next unkeyed batch goes elsewhere
        b.count = len(b.values)
        try:
            b.payload = records.encode_batch(
                b.values,
                b.keys,
                headers=b.headers,
                timestamps=b.timestamps,
                timestamp_ms=b.timestamp_ms,
                compression=self.compression,
            )
        except Exception as e:  # an unpackable value: the caller's mistake, one batch fails
            self._complete(b, TypeError(f"cannot encode records for {tp.topic}: {e}"))
            return
        b.values = b.keys = b.headers = None  # type: ignore[assignment]  # free early
        tp.ready.append(b)
        self._ready[tp] = None
        self._schedule_send()

    def _schedule_send(self) -> None:
        if not self._send_scheduled and self._loop is not None:
            self._send_scheduled = True
            self._loop.call_soon(self._send_ready)

    # --- sending -------------------------------------------------------------------

    def _send_ready(self) -> None:
        """Group ready batches by leader into requests, within the in-flight limits."""
        self._send_scheduled = False
        if self._closed:
            return
        snapshot = self._meta.snapshot
        while True:
            by_node: dict[int, list[_Batch]] = {}
            sizes: dict[int, int] = {}
            for tp in list(self._ready):
                if not tp.ready:
                    del self._ready[tp]
                    continue
                limit = 1 if tp.retrying else self.max_in_flight_per_partition
                if tp.muted or tp.in_flight >= limit:
                    continue
                node = snapshot.leader_for(tp.topic, tp.partition)
                if node == NO_LEADER:
                    self._refresh_soon()
                    continue
                if self._node_in_flight.get(node, 0) >= self.max_in_flight:
                    continue
                b = tp.ready[0]
                size = sizes.get(node, 0)
                if size and size + len(b.payload) > self.max_request_bytes:  # type: ignore[arg-type]
                    continue
                tp.ready.popleft()
                tp.in_flight += 1
                sizes[node] = size + len(b.payload)  # type: ignore[arg-type]
                by_node.setdefault(node, []).append(b)
            if not by_node:
                return
            for node, batches in by_node.items():
                self._node_in_flight[node] = self._node_in_flight.get(node, 0) + 1
                self._spawn(self._run_request(node, batches))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_request(self, node: int, batches: list[_Batch]) -> None:
        by_topic: dict[str, list[list[int]]] = {}
        for b in batches:
            b.attempts += 1
            by_topic.setdefault(b.topic, []).append([b.partition, len(b.payload)])  # type: ignore[arg-type]
        fields = {
            "acks": self.acks,
            "timeout_ms": self.request_timeout_ms,
            "topics": [[t, parts] for t, parts in by_topic.items()],
        }
        payload = [b.payload for b in batches]
        self.stats["requests"] += 1
        try:
            conn = await self._meta.connection(node)
            if self.acks == 0:
                conn.send_oneway(schemas.PRODUCE, fields, payload)  # type: ignore[arg-type]
                await conn.drain()
                results: dict[tuple[str, int], list] = {}
            else:
                header, _ = await conn.request(schemas.PRODUCE, fields, payload)  # type: ignore[arg-type]
                results = {(topic, r[0]): r for topic, parts in header["topics"] for r in parts}
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
            self._schedule_send()

    def _on_result(self, b: _Batch, error: BaseException | None, result: list | None) -> None:
        tp = self._topics[b.topic].parts[b.partition]
        tp.in_flight -= 1
        if error is None and result is not None and result[1]:
            msg = result[5] if len(result) > 5 and result[5] else error_name(result[1])
            error = error_for(result[1], f"{b.topic}-{b.partition}: {msg}")
        if error is None:
            b.base_offset = result[2] if result is not None else -1  # type: ignore[index]
            b.log_append_time = result[3] if result is not None else -1  # type: ignore[index]
            tp.retrying = tp.retrying and bool(tp.failed)
            self._complete(b, None)
        elif self._may_retry(b, error):
            self.stats["retries"] += 1
            tp.muted = True
            tp.failed.append(b)
            self._meta.request_update()
        else:
            self._complete(b, error)
        if tp.muted and tp.in_flight == 0:
            self._requeue(tp)

    def _may_retry(self, b: _Batch, error: BaseException) -> bool:
        retriable = isinstance(error, RilletError) and error.retriable
        assert self._loop is not None
        return retriable and b.attempts <= self.retries and self._loop.time() < b.deadline

    def _requeue(self, tp: _Partition) -> None:
        """Every in-flight batch of a muted partition is back: failed ones go first, in
        their original order, after a metadata refresh and a backoff."""
        failed = sorted(tp.failed, key=lambda b: b.seq)
        tp.failed = []
        tp.ready.extendleft(reversed(failed))
        tp.retrying = True
        self._ready[tp] = None
        log.info("retrying %d batch(es) of %s-%d", len(failed), tp.topic, tp.partition)

        async def resume() -> None:
            try:
                await asyncio.sleep(self.retry_backoff_s)
                await self._meta.refresh()
            except RilletError as e:
                log.info("metadata refresh failed (%r); retrying anyway", e)
            finally:
                tp.muted = False
                self._schedule_send()

        self._spawn(resume())

    def _complete(self, b: _Batch, error: BaseException | None) -> None:
        if b.done:
            return
        b.done = True
        b.error = error
        self._incomplete.discard(b)
        self._release(b.nbytes)
        n = b.count or len(b.values or ())
        if error is None:
            self.stats["batches"] += 1
            self.stats["records"] += n
            if self.on_batch_done is not None and self._loop is not None:
                self.on_batch_done(n, self._loop.time() - b.created)
        else:
            self._failed_records += n
            if self._first_error is None:
                self._first_error = error
            log.debug("batch of %d records to %s-%d failed: %r", n, b.topic, b.partition, error)
        if b.future is not None and not b.future.done():
            b.future.set_result(None)
        b.payload = None

    def _fail_all(self, error: BaseException) -> None:
        for b in list(self._incomplete):
            self._complete(b, error)
        for topic in list(self._pending):
            self._fail_pending(topic, error)
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
            self._schedule_send()

        self._refresh_task = asyncio.ensure_future(refresh())
        self._tasks.add(self._refresh_task)
        self._refresh_task.add_done_callback(self._tasks.discard)

    def _expire_leaderless(self) -> None:
        """Fail queued batches past their delivery deadline (a partition stayed without
        a leader); in-flight ones are failed by their own request timeout."""
        assert self._loop is not None
        now = self._loop.time()
        for tp in list(self._ready):
            while tp.ready and tp.ready[0].deadline <= now and not tp.in_flight:
                self._complete(
                    tp.ready.popleft(),
                    error_for(
                        5, f"{tp.topic}-{tp.partition}: no leader within delivery_timeout_ms"
                    ),
                )

    def _on_metadata(self, snapshot: Any) -> None:
        for name, t in self._topics.items():
            parts = snapshot.topics.get(name)
            if parts is not None and len(parts) > t.num_partitions:
                t.grow(len(parts))
        self._schedule_send()

    async def _await_topic(self, topic: str) -> _Topic:
        parts = (await self._meta.wait_for_topics([topic], self.max_block_ms))[topic]
        t = self._topics.get(topic)
        if t is None:
            t = self._topics[topic] = _Topic(topic, len(parts))
        # Records held while the metadata was on its way go first, before anything the
        # caller appends once this returns, so the topic's order is the call order.
        entry = self._pending.pop(topic, None)
        if entry is not None:
            known, held = entry
            for rec in held:
                self._buffered -= _record_size(rec[0], rec[1], rec[2])  # counted again
                self._append_slow(topic, *rec)
            known.set_result(None)
        return t

    def _defer(self, topic: str, rec: tuple) -> None:
        """Hold a record for a topic whose metadata is not known yet, in order."""
        handle: RecordHandle | None = rec[5]
        entry = self._pending.get(topic)
        if entry is None:
            assert self._loop is not None
            entry = self._pending[topic] = (self._loop.create_future(), [])
            self._spawn(self._resolve_topic(topic))
        entry[1].append(rec)
        self._buffered += _record_size(rec[0], rec[1], rec[2])  # bounded like the rest
        if handle is not None:
            handle._topic_known = entry[0]

    async def _resolve_topic(self, topic: str) -> None:
        try:
            await self._await_topic(topic)
        except (RilletError, ValueError) as e:
            self._fail_pending(topic, e)

    def _fail_pending(self, topic: str, error: BaseException) -> None:
        known, held = self._pending.pop(topic, (None, []))
        self._release(sum(_record_size(r[0], r[1], r[2]) for r in held))
        self._failed_records += len(held)
        if self._first_error is None:
            self._first_error = error
        for rec in held:
            if rec[5] is not None:
                rec[5]._batch = _failed_batch(error)
        if known is not None and not known.done():
            known.set_result(None)


_ACKS0 = [0, 0, -1, -1, -1, None]


def _failed_batch(error: BaseException) -> _Batch:
    b = _Batch("", -1, -1, 0.0, -1)
    b.done, b.error = True, error
    return b


def _record_size(value: Any, key: Any, headers: Any) -> int:
    size = RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0)
    if key is not None:
        size += len(key)
    if headers:
        size += sum(len(k) + len(v or b"") for k, v in headers)
    return size


__all__ = [
    "DeliveryError",
    "Producer",
    "ProducerClosedError",
    "RecordHandle",
    "RecordMetadata",
]
