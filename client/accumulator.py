"""The producer's record accumulator: per-partition batches, with no I/O at all.

Kafka's producer splits into a ``RecordAccumulator`` (batching, memory) and a
``Sender`` (network); this is the first half. Nothing here awaits, opens a socket or
reads a clock of its own: the clocks are constructor parameters and every time-driven
step takes ``now``, so a test drives it alone, step by step (docs/client.md).

- ``append`` puts a record into its partition's open batch (columns: values, keys, ...)
  and seals the batch once it reaches ``batch_size`` bytes; ``ready(now)`` seals the
  ones that have lingered ``linger_s``; ``seal_all`` seals everything (flush);
- a sealed batch is encoded with ONE ``encode_batch`` call and queued in order;
- ``drain`` takes, for each leader, at most one queued batch per partition, up to a
  request's size, within the per-partition in-flight limit;
- ``delivered`` / ``retry`` / ``failed`` take a batch's result back: retried batches go
  back to the head of their partition's queue in their original order once none of the
  partition's batches is in flight (docs/client.md, "Ordering and retries");
- ``buffered`` counts the bytes of every record not yet completed, against
  ``buffer_memory``; ``deallocate`` gives a completed batch's bytes back.

The sender (client/sender.py) drives all of it and completes the batches.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Container, Sequence
from typing import Any

from rillet.client.partitioner import StickyPartitioner, partition_for_key
from rillet.client.wire import records

# A v2 record's bytes beside its key and value: length, attributes, timestamp and
# offset deltas, key and value lengths, header count (1-2 bytes each at batch sizes).
# batch_size counts approximately, as Kafka's estimate does.
RECORD_OVERHEAD_BYTES = 8
KEY_CACHE_MAX = 65_536  # keys -> partition memo (murmur2 in Python costs ~1 us per key)

# A record held outside any batch: (value, key, headers, partition, timestamp, handle).
HeldRecord = tuple[Any, Any, Any, int | None, int | None, Any]


class ProducerClosedError(RuntimeError):
    """The producer was closed (or never started); the caller's mistake."""


class ProducerBatch:
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
        self.future: Any = None  # the sender's delivery future, only when someone waits
        self.done = False

    @classmethod
    def failed(cls, error: BaseException) -> ProducerBatch:
        """A batch that stands for records that never reached one (their topic failed)."""
        b = cls("", -1, -1, 0.0, -1)
        b.done, b.error = True, error
        return b


class PartitionQueue:
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
        "node",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.open: ProducerBatch | None = None
        self.ready: deque[ProducerBatch] = deque()
        self.in_flight = 0
        self.muted = False  # a batch failed: wait for in-flight ones before resending
        self.retrying = False  # send one batch at a time until one succeeds
        self.failed: list[ProducerBatch] = []
        self.next_seq = 0
        self.node = -1  # the leader its in-flight batches went to


class TopicQueues:
    __slots__ = ("name", "parts", "num_partitions", "sticky", "key_cache")

    def __init__(self, name: str, num_partitions: int) -> None:
        self.name = name
        self.parts = [PartitionQueue(name, p) for p in range(num_partitions)]
        self.num_partitions = num_partitions
        self.sticky = -1
        self.key_cache: dict[bytes, int] = {}

    def grow(self, num_partitions: int) -> None:
        for p in range(self.num_partitions, num_partitions):
            self.parts.append(PartitionQueue(self.name, p))
        if num_partitions != self.num_partitions:
            self.key_cache.clear()
        self.num_partitions = max(num_partitions, self.num_partitions)


def _always_led(topic: str, partition: int) -> int:
    return 0


def _no_wakeup() -> None:
    return None


def _unknown_topic(topic: str, record: HeldRecord) -> None:
    raise KeyError(f"unknown topic {topic!r}: add_topic() it first")


_BYTES_LIKE = (bytes, bytearray, memoryview)
_NEVER = 1 << 62  # a room no records fill: column_cut then checks them all


def check_field(field: Any, what: str) -> None:
    """A record's key or value must be bytes-like or None: Kafka's records hold bytes."""
    if not isinstance(field, _BYTES_LIKE):
        raise TypeError(
            f"a record's {what} must be bytes, bytearray, memoryview or None, "
            f"not {type(field).__name__} (encode text first, e.g. s.encode())"
        )


def _header(pair: Any) -> tuple[str, Any]:
    """One header as Kafka holds it: a (str, bytes or None) pair."""
    k, v = pair  # anything but a pair raises ValueError / TypeError here
    if not isinstance(k, str):
        raise TypeError(f"a header key must be str, not {type(k).__name__}")
    if v is not None and not isinstance(v, _BYTES_LIKE):
        raise TypeError(f"a header value must be bytes or None, not {type(v).__name__}")
    return k, v


def record_size(value: Any, key: Any, headers: Any) -> int:
    """What a record counts against ``batch_size`` and ``buffer_memory``."""
    size = RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0)
    if key is not None:
        size += len(key)
    if headers:
        size += sum(len(k) + len(v or b"") for k, v in headers)
    return size


class RecordAccumulator:
    """Batches records per partition; the sender drains what is ready.

    ``clock`` (monotonic seconds) stamps when a batch opens, for linger and the delivery
    deadline; ``wall_clock_ms`` gives the batch's default record timestamp. Both are
    read once per batch, never per record.

    Hooks the owner sets (an accumulator alone keeps the defaults):

    - ``wakeup()``: a batch was sealed, or the earliest linger deadline moved earlier;
      the sender schedules a pass (``ready``, ``drain``);
    - ``on_unknown_topic(topic, record)``: ``append`` for a topic not added yet; the
      producer holds the record until the topic's metadata arrives;
    - ``not_full`` / ``when_full()``: what ``append`` returns below / at the memory bound
      (the producer's already-done future / a future that resolves when space frees up).
    """

    def __init__(
        self,
        *,
        batch_size: int,
        linger_s: float,
        buffer_memory: int,
        delivery_timeout_s: float,
        clock: Callable[[], float],
        wall_clock_ms: Callable[[], int],
        compression: int = records.COMPRESSION_BY_NAME["none"],
        max_in_flight_per_partition: int = 0,
        partitioner: StickyPartitioner | None = None,
    ) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.buffer_memory = buffer_memory
        self.delivery_timeout_s = delivery_timeout_s
        self.compression = compression
        self.max_in_flight_per_partition = max_in_flight_per_partition or 1 << 30
        self.clock = clock
        self.wall_clock_ms = wall_clock_ms
        self._sticky = partitioner or StickyPartitioner()
        self.topics: dict[str, TopicQueues] = {}
        self.buffered = 0  # bytes of records not yet completed
        self.incomplete: set[ProducerBatch] = set()  # opened and not yet completed
        self.unencodable: list[ProducerBatch] = []  # sealed with an error, to complete
        self.closed = False
        self._lingering: dict[PartitionQueue, None] = {}  # partitions with an open batch
        # Partitions with an open batch by the leader they had when it opened: where
        # _take_open looks, so a request scans its leader's partitions, not all of them.
        # A hint, checked on use (the batch may have sealed, the leader moved).
        self._open_by_node: dict[int, dict[PartitionQueue, None]] = {}
        self._next_linger = math.inf  # no open batch lingers out before this
        self._queued: dict[PartitionQueue, None] = {}  # partitions with sealed batches
        self.wakeup: Callable[[], None] = _no_wakeup
        # A partition's leader, < 0 for none (the producer's metadata): every partition
        # counts as led until it is set.
        self.leader_of: Callable[[str, int], int] = _always_led
        self.on_unknown_topic: Callable[[str, HeldRecord], None] = _unknown_topic
        self.not_full: Any = True
        self.when_full: Callable[[], Any] = bool  # bool() is False

    # --- topics --------------------------------------------------------------------

    def add_topic(self, name: str, num_partitions: int) -> TopicQueues:
        t = self.topics.get(name)
        if t is None:
            t = self.topics[name] = TopicQueues(name, num_partitions)
        return t

    def grow_topic(self, name: str, num_partitions: int) -> None:
        t = self.topics.get(name)
        if t is not None and num_partitions > t.num_partitions:
            t.grow(num_partitions)

    # --- appending: the hot path ---------------------------------------------------

    def append(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        headers: Any = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> Any:
        """Add one record; returns ``not_full``, or ``when_full()`` at the memory bound.

        Per record: this call, a partition choice and a couple of list appends; headers,
        timestamps and unknown topics take ``_append_other``.
        """
        t = self.topics.get(topic)
        if t is None or headers is not None or timestamp is not None or self.closed:
            return self._append_other(topic, value, key, headers, partition, timestamp)
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
        # Checked before the batch is touched, so a refused record is not delivered
        # anyway and cannot fail its batch-mates when the batch is encoded.
        if value.__class__ is not bytes and value is not None:
            check_field(value, "value")
        if key.__class__ is not bytes and key is not None:
            check_field(key, "key")
        size = len(value) + RECORD_OVERHEAD_BYTES if value is not None else RECORD_OVERHEAD_BYTES
        tp = t.parts[partition]
        b = tp.open
        if b is None:
            b = self._open_batch(tp)
        b.values.append(value)
        if key is not None or b.keys is not None:
            _append_key(b, key)
        # A record with headers or a timestamp (append_record) gave the batch those
        # columns: every later record needs its entry, or the batch cannot be encoded.
        if b.headers is not None:
            b.headers.append(None)
        if b.timestamps is not None:
            b.timestamps.append(b.timestamp_ms)
        b.nbytes += size
        if b.nbytes >= self.batch_size:
            self._seal(tp)
        self.buffered += size
        if self.buffered >= self.buffer_memory:
            return self.when_full()
        return self.not_full

    def _append_other(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: Any,
        partition: int | None,
        timestamp: int | None,
    ) -> Any:
        if self.closed:
            raise ProducerClosedError("producer is closed or not started")
        t = self.topics.get(topic)
        if t is None:
            self.on_unknown_topic(topic, (value, key, headers, partition, timestamp, None))
        else:
            self.append_record(t, value, key, headers, partition, timestamp)
        if self.buffered >= self.buffer_memory:
            return self.when_full()
        return self.not_full

    def append_record(
        self,
        t: TopicQueues,
        value: Any,
        key: Any,
        headers: Any,
        partition: int | None,
        timestamp: int | None,
    ) -> tuple[ProducerBatch, int]:
        """Every case the hot path leaves out (headers, timestamps, a handle wanted):
        returns the batch and the record's index in it. No memory check."""
        if partition is None:
            if key is None:
                partition = t.sticky if t.sticky >= 0 else self._stick(t, -1)
            else:
                partition = t.key_cache.get(key)
                if partition is None:
                    partition = self._partition_for_key(t, key)
        elif not 0 <= partition < t.num_partitions:
            raise ValueError(f"{t.name} has no partition {partition}")
        # Everything that may raise comes before the batch is touched: a record the
        # caller is told was refused must not be delivered anyway.
        if value.__class__ is not bytes and value is not None:
            check_field(value, "value")
        if key.__class__ is not bytes and key is not None:
            check_field(key, "key")
        if headers is not None:
            headers = [_header(pair) for pair in headers]
        if timestamp is not None:
            timestamp = int(timestamp)
        size = record_size(value, key, headers)
        tp = t.parts[partition]
        b = tp.open or self._open_batch(tp)
        index = len(b.values)
        b.values.append(value)
        if key is not None or b.keys is not None:
            _append_key(b, key)
        if headers is not None or b.headers is not None:
            if b.headers is None:
                b.headers = [None] * index
            b.headers.append(headers)
        if timestamp is not None or b.timestamps is not None:
            if b.timestamps is None:
                b.timestamps = [b.timestamp_ms] * index
            b.timestamps.append(b.timestamp_ms if timestamp is None else timestamp)
        b.nbytes += size
        self.buffered += size
        if b.nbytes >= self.batch_size:
            self._seal(tp)
        return b, index

    def check_columns(self, values: Sequence[Any], keys: Sequence[Any] | None) -> None:
        """Check every value and key of a ``send_many`` call as ``append`` checks one
        (TypeError naming the record), before any of them joins a batch: a bad record
        then fails its own call, never the records of a batch it would have shared."""
        records.codec.column_cut(values, keys, 0, _NEVER, RECORD_OVERHEAD_BYTES)

    def append_columns(
        self,
        t: TopicQueues,
        partition: int | None,
        values: Sequence[Any],
        keys: Sequence[Any] | None,
        start: int = 0,
    ) -> int:
        """``send_many``'s records from ``start`` on (checked by ``check_columns``), as
        many as fill the partition's open batch, or a new one, to ``batch_size``: the
        record that reaches it included, as ``append`` adds records one by one. A batch
        they fill seals at once, the rest lingers like any open batch, so calls a
        millisecond apart share a batch. Returns the index the next call starts at."""
        if partition is None:
            partition = t.sticky if t.sticky >= 0 else self._stick(t, -1)
        tp = t.parts[partition]
        b = tp.open or self._open_batch(tp)
        end, nbytes = records.codec.column_cut(
            values, keys, start, self.batch_size - b.nbytes, RECORD_OVERHEAD_BYTES
        )
        if b.values:
            index, n = len(b.values), end - start
            b.values.extend(values[start:end])
            if keys is not None or b.keys is not None:
                if b.keys is None:
                    b.keys = [None] * index
                b.keys.extend(keys[start:end] if keys is not None else [None] * n)
            if b.headers is not None:
                b.headers.extend([None] * n)
            if b.timestamps is not None:
                b.timestamps.extend([b.timestamp_ms] * n)
        else:
            b.values = list(values[start:end])
            b.keys = list(keys[start:end]) if keys is not None else None
        b.nbytes += nbytes
        self.buffered += nbytes
        if b.nbytes >= self.batch_size:
            self._seal(tp)
        return end

    def partition_for(self, t: TopicQueues, key: Any) -> int:
        p = t.key_cache.get(key)
        return self._partition_for_key(t, key) if p is None else p

    def _partition_for_key(self, t: TopicQueues, key: Any) -> int:
        if not isinstance(key, bytes | bytearray | memoryview):
            raise TypeError(f"key must be bytes, not {type(key).__name__}")
        p = partition_for_key(bytes(key), t.num_partitions)
        if len(t.key_cache) >= KEY_CACHE_MAX:
            t.key_cache.clear()
        t.key_cache[key] = p  # type: ignore[index]
        return p

    def _stick(self, t: TopicQueues, previous: int) -> int:
        if previous < 0:
            p = self._sticky.partition(t.name, t.num_partitions)
        else:
            p = self._sticky.on_new_batch(t.name, t.num_partitions, previous)
        leader_of = self.leader_of
        if leader_of(t.name, p) < 0:
            # As Kafka's partitioner: unkeyed records go to a partition with a leader
            # while there is one, rather than wait out the delivery timeout on this one.
            live = [q for q in range(t.num_partitions) if leader_of(t.name, q) >= 0]
            if live:
                p = self._sticky.among(t.name, live, previous)
        t.sticky = p
        return p

    # --- sealing -------------------------------------------------------------------

    def _open_batch(self, tp: PartitionQueue) -> ProducerBatch:
        now = self.clock()
        b = ProducerBatch(tp.topic, tp.partition, tp.next_seq, now, self.wall_clock_ms())
        b.deadline = now + self.delivery_timeout_s
        tp.next_seq += 1
        tp.open = b
        self.incomplete.add(b)
        self._lingering[tp] = None
        # -1 (no leader yet) too: _take_open moves those on once a leader is known
        self._open_by_node.setdefault(self.leader_of(tp.topic, tp.partition), {})[tp] = None
        if now + self.linger_s < self._next_linger:
            self._next_linger = now + self.linger_s
            self.wakeup()  # the sender arms its linger timer
        return b

    def ready(self, now: float) -> float | None:
        """Seal every open batch that has lingered ``linger_s`` by ``now``; returns a time
        no open batch lingers out before (None: none is open). It can be early when a
        batch was sealed for its size since: a pass then finds nothing to seal."""
        if self.buffered >= self.buffer_memory and self._lingering:
            # Out of memory, and a caller may be waiting for some: every open batch is
            # ready now (as in Kafka's accumulator), or the caller waits out a linger.
            self.seal_all()
        if now >= self._next_linger:
            limit = now - self.linger_s
            oldest = math.inf
            for tp in list(self._lingering):
                b = tp.open
                if b is None:
                    del self._lingering[tp]
                elif b.created <= limit:
                    self._seal(tp)
                elif b.created < oldest:
                    oldest = b.created
            self._next_linger = oldest + self.linger_s
        return None if self._next_linger == math.inf else self._next_linger

    def seal_all(self) -> None:
        """Seal every open batch now (flush)."""
        for tp in list(self._lingering):
            self._seal(tp)
        self._next_linger = math.inf

    def _seal(self, tp: PartitionQueue, wake: bool = True) -> None:
        """Close the open batch: encode it once and queue it behind the partition's
        earlier batches (``wake``: and schedule a sender pass to send it)."""
        b = tp.open
        if b is None:
            return
        tp.open = None
        self._lingering.pop(tp, None)
        t = self.topics.get(tp.topic)
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
        except (
            Exception
        ) as e:  # an unencodable record (a header key with no UTF-8 form): one batch fails
            b.error = TypeError(f"cannot encode records for {tp.topic}: {e}")
            self.unencodable.append(b)
        else:
            b.values = b.keys = b.headers = None  # type: ignore[assignment]  # free early
            tp.ready.append(b)
            self._queued[tp] = None
        if wake:
            self.wakeup()

    def sealed(self, topic: str, partition: int) -> list[ProducerBatch]:
        """The partition's sealed batches waiting to be sent, in sending order."""
        return list(self.topics[topic].parts[partition].ready)

    # --- draining ------------------------------------------------------------------

    def drain(
        self,
        leader_of: Callable[[str, int], int],
        max_request_bytes: int,
        busy: Container[int] = (),
    ) -> tuple[dict[int, list[ProducerBatch]], bool]:
        """Take one request's worth of sealed batches per leader: at most one batch per
        partition, up to ``max_request_bytes`` (a first batch always fits), skipping
        muted partitions, partitions at their in-flight limit, ``busy`` leaders and
        partitions whose leader moved while batches are in flight to the old one (they
        come back, fail and are resent first: docs/client.md, "Ordering and retries").
        A leader that gets a request also gets its other partitions' open batches,
        sealed before their linger (``_take_open``).

        Returns {leader: batches in order} and whether some partition had no leader
        (``leader_of`` answered < 0). Drained batches count as in flight until
        ``delivered``, ``retry`` or ``failed`` takes them back.
        """
        by_node: dict[int, list[ProducerBatch]] = {}
        sizes: dict[int, int] = {}
        taken: set[PartitionQueue] = set()
        leaderless = False
        for tp in list(self._queued):
            if not tp.ready:
                del self._queued[tp]
                continue
            limit = 1 if tp.retrying else self.max_in_flight_per_partition
            if tp.muted or tp.in_flight >= limit:
                continue
            node = leader_of(tp.topic, tp.partition)
            if node < 0:
                leaderless = True
                continue
            if node in busy or (tp.in_flight and node != tp.node):
                # The leader moved while batches are in flight to the old one: they will
                # fail and go back first; sending now would let this one overtake them.
                continue
            b = tp.ready[0]
            size = sizes.get(node, 0)
            if size and size + len(b.payload) > max_request_bytes:  # type: ignore[arg-type]
                continue
            sizes.setdefault(node, 0)
            _take(tp, node, by_node.setdefault(node, []), sizes, taken)
        if by_node and self._lingering:
            self._take_open(by_node, sizes, taken, leader_of, max_request_bytes)
        return by_node, leaderless

    def _take_open(
        self,
        by_node: dict[int, list[ProducerBatch]],
        sizes: dict[int, int],
        taken: set[PartitionQueue],
        leader_of: Callable[[str, int], int],
        max_request_bytes: int,
    ) -> None:
        """Seal and add to each request the open batches of partitions its leader leads,
        as Kafka's producer drains every partition of a node it sends to. Each would
        otherwise linger out on its own and cost the leader another request (and its
        followers another fetch), while the records only wait longer.

        Only a partition with nothing sealed waiting (its batches stay in order) and
        none ``taken`` into this pass's requests: a request carries one batch per
        partition, since its answer has one result per partition. Within the same
        limits as a sealed batch, only while the request has room, and never a topic's
        sticky partition, whose batch unkeyed records are still filling (sealing it
        would move them on and make every batch smaller)."""
        leaderless = self._open_by_node.get(-1)
        if leaderless:
            for tp in list(leaderless):
                self._rehome(tp, -1, leader_of)
        for node, batches in by_node.items():
            for tp in list(self._open_by_node.get(node, ())):
                if not self._rehome(tp, node, leader_of):
                    continue  # sealed since, or moved to its leader's entries
                b = tp.open
                assert b is not None
                if tp.ready or tp.muted or tp in taken:
                    continue
                t = self.topics.get(tp.topic)
                if t is not None and t.sticky == tp.partition:
                    continue
                limit = 1 if tp.retrying else self.max_in_flight_per_partition
                if tp.in_flight >= limit or (tp.in_flight and node != tp.node):
                    continue
                if sizes[node] + records.HEADER_SIZE + b.nbytes > max_request_bytes:
                    continue  # by its estimate it will not fit: it lingers on
                self._seal(tp, wake=False)
                if not tp.ready:
                    self.wakeup()  # unencodable: set aside, the next pass fails it
                elif sizes[node] + len(tp.ready[0].payload) > max_request_bytes:  # type: ignore[arg-type]
                    self.wakeup()  # sealed but over by its encoding: the next request takes it
                else:
                    _take(tp, node, batches, sizes, taken)

    def _rehome(self, tp: PartitionQueue, node: int, leader_of: Callable[[str, int], int]) -> bool:
        """Check ``tp``'s entry under ``node``: True if it stays. An entry whose batch
        has sealed since goes; one whose leader is another now moves there."""
        if tp.open is None:
            del self._open_by_node[node][tp]
            return False
        leader = leader_of(tp.topic, tp.partition)
        if leader == node:
            return True
        del self._open_by_node[node][tp]
        self._open_by_node.setdefault(leader, {})[tp] = None
        return False

    # --- results -------------------------------------------------------------------

    def delivered(self, b: ProducerBatch) -> PartitionQueue | None:
        """``b`` was appended. Returns its partition if that put retried batches back
        in its queue (the sender then backs off and ``unmute``s it)."""
        tp = self.topics[b.topic].parts[b.partition]
        tp.in_flight -= 1
        tp.retrying = tp.retrying and bool(tp.failed)
        return self._reenqueue_if_idle(tp)

    def retry(self, b: ProducerBatch) -> PartitionQueue | None:
        """``b`` failed and may be sent again: the partition is muted (nothing new is sent)
        until none of its batches is in flight; then every failed one goes back to the
        head of its queue in its original order, ahead of newer batches, and the
        partition is returned."""
        tp = self.topics[b.topic].parts[b.partition]
        tp.in_flight -= 1
        tp.muted = True
        tp.failed.append(b)
        return self._reenqueue_if_idle(tp)

    def failed(self, b: ProducerBatch) -> PartitionQueue | None:
        """``b`` failed for good (the sender completes it)."""
        tp = self.topics[b.topic].parts[b.partition]
        tp.in_flight -= 1
        return self._reenqueue_if_idle(tp)

    def _reenqueue_if_idle(self, tp: PartitionQueue) -> PartitionQueue | None:
        if not tp.muted or tp.in_flight:
            return None
        failed = sorted(tp.failed, key=lambda b: b.seq)
        tp.failed = []
        tp.ready.extendleft(reversed(failed))
        tp.retrying = True  # one batch at a time until one succeeds
        self._queued[tp] = None
        return tp

    def unmute(self, tp: PartitionQueue) -> None:
        """The partition may send again (after the sender's backoff and refresh)."""
        tp.muted = False
        self.wakeup()

    # --- expiry, completion, memory -----------------------------------------------

    def expire(self, now: float) -> list[ProducerBatch]:
        """Take out queued batches past their delivery deadline at the head of a
        partition with nothing in flight (it stayed without a leader); the sender
        fails them. In-flight ones are failed by their own request timeout."""
        expired = []
        for tp in list(self._queued):
            while tp.ready and tp.ready[0].deadline <= now and not tp.in_flight:
                expired.append(tp.ready.popleft())
        return expired

    def deallocate(self, b: ProducerBatch) -> None:
        """``b`` is complete: its bytes no longer count against ``buffer_memory``."""
        self.incomplete.discard(b)
        self.buffered -= b.nbytes

    def abort(self) -> list[ProducerBatch]:
        """Close: refuse new records and hand back every incomplete batch to fail."""
        self.closed = True
        for t in self.topics.values():
            for tp in t.parts:
                tp.open = None
                tp.ready.clear()
                tp.failed = []
        self._lingering.clear()
        self._open_by_node.clear()
        self._queued.clear()
        self._next_linger = math.inf
        return list(self.incomplete)


def _take(
    tp: PartitionQueue,
    node: int,
    batches: list[ProducerBatch],
    sizes: dict[int, int],
    taken: set[PartitionQueue],
) -> None:
    """Move ``tp``'s first sealed batch into ``node``'s request: in flight from now."""
    b = tp.ready.popleft()
    tp.in_flight += 1
    tp.node = node
    taken.add(tp)
    sizes[node] += len(b.payload)  # type: ignore[arg-type]
    batches.append(b)


def _append_key(b: ProducerBatch, key: Any) -> None:
    if b.keys is None:
        b.keys = [None] * (len(b.values) - 1)
    b.keys.append(key)
