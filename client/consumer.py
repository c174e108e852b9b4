"""The consumer: fetch from each partition's leader, decode batches into cheap records.

- Positions: one next-offset per assigned partition, resolved at start from
  ``from_beginning`` (earliest) or the end (latest) with ListOffsets, or set by ``seek``.
- Fetching: one fetch task per broker, so fetches to different brokers run concurrently;
  each covers every assigned partition that broker leads and that has nothing buffered
  yet. As soon as a response is buffered the next fetch goes out (one fetch ahead),
  while buffered bytes stay under ``fetch_max_bytes``.
- Decoding: every batch's CRC is checked (``validate_batch``), then one
  ``records.decode_records`` call per batch builds its ConsumerRecords straight from
  the v2 bytes (in C where the codec was built).
- Errors: NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, a broken connection...
  refresh metadata and carry on from the same position at the new leader;
  OFFSET_OUT_OF_RANGE resets by ``auto_offset_reset`` or raises when it is ``'none'``;
  CORRUPT_MESSAGE (the broker found the stored batches damaged) and other non-retriable
  errors are raised to the application.
- Fetch from follower (KIP-392): ``client_rack`` goes out as ``rack_id``; when the
  leader's answer names a ``preferred_read_replica`` the partition is fetched from that
  replica until it errors (any error, OFFSET_OUT_OF_RANGE included, sends the partition
  back to the leader at the same position, with a metadata refresh) or the choice is
  ``metadata_max_age_ms`` old (then the leader is asked again), as Kafka's consumer does.

Consumer groups (``group_id``): the partitions come from the group's coordinator
(KIP-848), driven by ``GroupDriver`` (client/group_consumer.py); positions of newly
assigned partitions start at the group's committed offsets; ``commit``/``committed``
and auto-commit store them. Without a group the ``_assignor`` takes every partition of
the subscribed topics. A ``pattern`` subscription is matched against the cluster's
topics here, on the client, and matched again on every metadata refresh.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from rillet.client.fetch_session import SESSION_ERRORS, FetchSessionBuilder
from rillet.client.metadata import DEFAULT_BOOTSTRAP, NO_LEADER, ClusterMetadata, MetadataClient
from rillet.client.wire import messages as m
from rillet.client.wire import records
from rillet.client.wire.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
    RilletError,
    error_for,
)

if TYPE_CHECKING:
    from rillet.client.group_consumer import GroupDriver, RebalanceListener

log = logging.getLogger(__name__)

EARLIEST = -2  # ListOffsets timestamps
LATEST = -1


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list | None


Assignor = Callable[[ClusterMetadata, list[str]], list[TopicPartition]]


def assign_all(snapshot: ClusterMetadata, topics: list[str]) -> list[TopicPartition]:
    """The group-less assignor: every partition of every subscribed topic."""
    return [TopicPartition(t, p.partition) for t in topics for p in snapshot.topics.get(t, ())]


def decode_records(tp: TopicPartition, data: memoryview, fetch_offset: int) -> tuple[list, int]:
    """Records at or after ``fetch_offset`` in a fetch's bytes, and the next offset.

    Every complete batch is CRC-checked; a trailing partial batch (a fetch may end in
    one) is left for the next fetch.
    """
    out: list[ConsumerRecord] = []
    next_offset = fetch_offset
    topic, partition = tp
    for pos, _ in records.iter_batches(data, validate=False):
        h = records.validate_batch(data, pos)
        if h.base_offset + h.last_offset_delta < fetch_offset:
            continue  # a batch that starts before the position: already consumed
        out += records.decode_records(data, pos, h, ConsumerRecord, topic, partition, fetch_offset)
        next_offset = h.base_offset + h.last_offset_delta + 1
    return out, next_offset


class _Fetched:
    """Decoded records of one partition, waiting to be handed to the application."""

    __slots__ = ("tp", "records", "pos", "nbytes", "generation")

    def __init__(self, tp: TopicPartition, recs: list, nbytes: int, generation: int) -> None:
        self.tp, self.records, self.pos, self.nbytes = tp, recs, 0, nbytes
        self.generation = generation


class Consumer:
    """An asyncio consumer of explicitly assigned partitions or of whole topics.

    ``async for record in consumer`` yields ``ConsumerRecord`` tuples;
    ``await consumer.getmany(timeout_ms, max_records)`` returns
    ``{TopicPartition: [records]}``.
    """

    def __init__(
        self,
        topics: Iterable[str] | str | re.Pattern[str] | None = None,
        *,
        pattern: str | re.Pattern[str] | None = None,
        assignment: Iterable[tuple[str, int]] | None = None,
        bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
        from_beginning: bool = False,
        auto_offset_reset: str | None = None,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        client_rack: str | None = None,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata_wait_ms: int = 30_000,
        metadata_max_age_ms: int = 300_000,
        client_id: str = "rillet-consumer",
        group_id: str | None = None,
        group_instance_id: str | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        session_timeout_ms: int = 45_000,
        max_poll_interval_ms: int = 300_000,
        group_remote_assignor: str | None = None,
        rebalance_listener: RebalanceListener | None = None,
        metadata: MetadataClient | None = None,
    ) -> None:
        if isinstance(topics, re.Pattern):
            topics, pattern = None, topics
        if isinstance(topics, str):
            topics = [topics]
        self._pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        if self._pattern is not None and topics is not None:
            raise ValueError("give either topics or a pattern")
        if ((topics is None and self._pattern is None) + (assignment is None)) != 1:
            raise ValueError("give either topics (or a pattern) or an assignment")
        if group_id is not None and assignment is not None:
            raise ValueError("a group consumer gets its partitions from the group, not assignment")
        if group_id == "":
            raise ValueError("group_id must not be empty")
        reset = auto_offset_reset or ("earliest" if from_beginning else "latest")
        if reset not in ("earliest", "latest", "none"):
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        self.auto_offset_reset = reset
        # Where a partition without a position starts: from_beginning, else the reset
        # policy, else the end.
        self._start_at = EARLIEST if from_beginning or reset == "earliest" else LATEST
        self.group_id = group_id
        self._subscription = list(topics) if topics is not None else None
        if self._pattern is not None:
            self._subscription = []  # matched against the cluster's topics at start
        self._assigned = [TopicPartition(*tp) for tp in assignment or ()]
        self._assignor: Assignor = assign_all
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.client_rack = client_rack or ""
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.metadata_wait_ms = metadata_wait_ms
        # How long a preferred read replica is used before the leader is asked again
        # (Kafka ties it to metadata.max.age.ms too).
        self.preferred_max_age_s = metadata_max_age_ms / 1000
        self.metadata_max_age_s = metadata_max_age_ms / 1000
        self._meta = metadata or MetadataClient(
            bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms + fetch_max_wait_ms,
            retry_backoff_ms=retry_backoff_ms,
            metadata_max_age_ms=metadata_max_age_ms,
        )
        self._own_meta = metadata is None
        self._positions: dict[TopicPartition, int] = {}  # what the application consumed
        self._fetch_positions: dict[TopicPartition, int] = {}  # where the next fetch starts
        self._generations: dict[TopicPartition, int] = {}  # bumped by seek: drops old data
        # (replica, until when) to fetch from instead of the leader (client_rack, KIP-392)
        self._preferred: dict[TopicPartition, tuple[int, float]] = {}
        self._buffer: deque[_Fetched] = deque()
        self._buffered_bytes = 0
        self._buffered_chunks: dict[TopicPartition, int] = {}  # prefetch: at most 2 each
        self._in_flight: set[TopicPartition] = set()
        self._fetchers: dict[int, asyncio.Task] = {}
        self._sessions: dict[int, FetchSessionBuilder] = {}  # incremental fetch, per broker
        self._wakeup = asyncio.Event()  # the fetch loop: something changed
        self._data = asyncio.Event()  # getmany: records arrived or an error is waiting
        self._error: BaseException | None = None
        self._task: asyncio.Task | None = None
        self._metadata_task: asyncio.Task | None = None
        self._closed = False
        self._group: GroupDriver | None = None
        if group_id is not None:
            from rillet.client.group_consumer import GroupDriver

            self._group = GroupDriver(
                self,
                group_id,
                instance_id=group_instance_id,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=max_poll_interval_ms,
                server_assignor=group_remote_assignor,
                enable_auto_commit=enable_auto_commit,
                auto_commit_interval_ms=auto_commit_interval_ms,
                listener=rebalance_listener,
            )
        self.stats = {"fetches": 0, "records": 0, "bytes": 0}
        self.bytes_by_node: dict[int, int] = {}  # fetched record bytes per broker answering

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> Consumer:
        """Learn metadata, the assignment and the starting positions."""
        if self._pattern is not None:
            self._meta.all_topics = True
            self._subscription = self._matching(await self._meta.refresh(force=True))
        topics = self._subscription or sorted({tp.topic for tp in self._assigned})
        await self._meta.wait_for_topics(topics, self.metadata_wait_ms)
        if self._pattern is not None:
            self._metadata_task = asyncio.ensure_future(self._metadata_loop())
        if self._group is not None:
            assert self._subscription is not None
            self._meta.listeners.append(self._on_metadata)
            self._group.start(self._subscription)
            self._task = asyncio.ensure_future(self._fetch_loop())
            return self
        if self._subscription is not None:
            self._assigned = self._assignor(self._meta.snapshot, self._subscription)
            self._meta.listeners.append(self._on_metadata)
        else:
            self._check_assignment()
        await self._reset_positions(
            [tp for tp in self._assigned if tp not in self._positions], self._start_at
        )
        self._task = asyncio.ensure_future(self._fetch_loop())
        return self

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop; a group consumer first commits (when auto-committing) and leaves the
        group (a static member's partitions wait for it for the session timeout)."""
        if self._closed:
            return
        if self._group is not None and self._task is not None:
            await self._group.close(self.request_timeout_ms / 1000)
        self._closed = True
        tasks = [
            t for t in (self._task, self._metadata_task, *self._fetchers.values()) if t is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._own_meta:
            await self._meta.close()

    def _check_assignment(self) -> None:
        snap = self._meta.snapshot
        for tp in self._assigned:
            parts = snap.topics.get(tp.topic, ())
            if not 0 <= tp.partition < len(parts):
                raise error_for(3, f"{tp.topic} has no partition {tp.partition}")

    async def _metadata_loop(self) -> None:
        """A pattern subscription: look for new (or deleted) matching topics every
        metadata_max_age_ms, as Kafka's consumer does."""
        while True:
            await asyncio.sleep(self.metadata_max_age_s)
            try:
                await self._meta.refresh(force=True)
            except RilletError as e:
                log.info("metadata refresh failed: %r", e)

    def _matching(self, snapshot: ClusterMetadata) -> list[str]:
        """The cluster's topics the pattern matches (internal ones never)."""
        assert self._pattern is not None
        return sorted(
            t for t in snapshot.topics if not t.startswith("__") and self._pattern.fullmatch(t)
        )

    def _on_metadata(self, snapshot: ClusterMetadata) -> None:
        if self._subscription is None or self._closed:
            return
        if self._pattern is not None:
            matching = self._matching(snapshot)
            if matching != self._subscription:
                self._subscription = matching
                self._meta.add_topics(matching)
                if self._group is not None:
                    self._group.subscribe(matching)
        if self._group is not None:
            self._group.on_metadata()
            return
        current = set(self._assigned)
        new = [tp for tp in self._assignor(snapshot, self._subscription) if tp not in current]
        if new:
            self._assigned += new
            # New partitions start at the beginning (nothing there was seen yet).
            for tp in new:
                self._set_position(tp, 0)
        self._wakeup.set()

    # --- the application's side ----------------------------------------------------

    def assignment(self) -> set[TopicPartition]:
        """The partitions being consumed (a group consumer's follow the group)."""
        return set(self._assigned)

    async def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit the positions of records already returned (no argument), or the given
        ``{TopicPartition: offset}`` (the offset of the next record to read). Returns
        once the group's offsets partition holds them."""
        await self._require_group().commit(
            None if offsets is None else {TopicPartition(*tp): o for tp, o in offsets.items()}
        )

    async def committed(
        self, partitions: Iterable[tuple[str, int]]
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where it committed none)."""
        return await self._require_group().committed(TopicPartition(*tp) for tp in partitions)

    def _require_group(self) -> GroupDriver:
        if self._group is None:
            raise ValueError("commits need a group_id")
        if self._task is None:
            raise RuntimeError("consumer not started")
        return self._group

    def _add_partitions(self, tps: Iterable[TopicPartition]) -> None:
        """Group assignment: start fetching (positions are set)."""
        have = set(self._assigned)
        self._assigned += sorted(tp for tp in tps if tp not in have)
        self._wakeup.set()

    def _drop_partitions(self, tps: set[TopicPartition]) -> None:
        """Group revocation or loss: stop fetching and handing out these partitions."""
        if not tps:
            return
        self._assigned = [tp for tp in self._assigned if tp not in tps]
        for tp in tps:
            self._positions.pop(tp, None)
            self._fetch_positions.pop(tp, None)
            self._preferred.pop(tp, None)
            self._generations[tp] = self._generations.get(tp, 0) + 1  # drops buffered data
        self._wakeup.set()

    def position(self, tp: tuple[str, int]) -> int:
        """The offset of the next record ``getmany`` will return for ``tp``."""
        return self._positions[TopicPartition(*tp)]

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        tp = TopicPartition(*tp)
        if tp not in self._assigned:
            raise ValueError(f"{tp} is not assigned to this consumer")
        self._set_position(tp, offset)

    async def seek_to_beginning(self, *tps: tuple[str, int]) -> None:
        await self._reset_positions([TopicPartition(*t) for t in tps] or self._assigned, EARLIEST)

    async def seek_to_end(self, *tps: tuple[str, int]) -> None:
        await self._reset_positions([TopicPartition(*t) for t in tps] or self._assigned, LATEST)

    async def end_offsets(self, tps: Iterable[tuple[str, int]]) -> dict[TopicPartition, int]:
        return await self._list_offsets([TopicPartition(*t) for t in tps], LATEST)

    async def beginning_offsets(self, tps: Iterable[tuple[str, int]]) -> dict[TopicPartition, int]:
        return await self._list_offsets([TopicPartition(*t) for t in tps], EARLIEST)

    async def getmany(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records fetched so far, waiting up to ``timeout_ms`` for the first ones."""
        if self._task is None:
            raise RuntimeError("consumer not started")
        if self._group is not None:
            self._group.check_lease()
        if not self._buffer and self._error is None and timeout_ms > 0:
            self._data.clear()
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    await self._data.wait()
            except TimeoutError:
                pass
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._group is not None:
            self._group.check_lease()  # the wait may have outlasted it
        return self._drain(max_records if max_records is not None else 1 << 62)

    def _drain(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        while self._buffer and limit > 0:
            f = self._buffer[0]
            if f.generation != self._generations.get(f.tp, 0):
                self._pop_fetched()  # a seek made it stale
                continue
            if self._group is not None and f.tp in self._group.revoking:
                self._pop_fetched()  # being revoked: its committed position is final
                continue
            if f.pos == 0 and limit >= len(f.records):
                take = f.records  # the common case: hand over the list, no copy
            else:
                take = f.records[f.pos : f.pos + limit]
            f.pos += len(take)
            limit -= len(take)
            if take:
                out.setdefault(f.tp, []).extend(take)
                self._positions[f.tp] = take[-1][2] + 1
            if f.pos >= len(f.records):
                self._pop_fetched()
        return out

    def _pop_fetched(self) -> None:
        f = self._buffer.popleft()
        self._buffered_bytes -= f.nbytes
        self._buffered_chunks[f.tp] -= 1
        self._wakeup.set()

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConsumerRecord]:
        while not self._closed:
            batch = await self.getmany(timeout_ms=self.fetch_max_wait_ms)
            for recs in batch.values():
                for r in recs:
                    yield r

    # --- positions -----------------------------------------------------------------

    def _set_position(self, tp: TopicPartition, offset: int) -> None:
        self._positions[tp] = offset
        self._fetch_positions[tp] = offset
        self._generations[tp] = self._generations.get(tp, 0) + 1
        self._wakeup.set()

    async def _reset_positions(self, tps: list[TopicPartition], where: int | None = None) -> None:
        if not tps:
            return
        if where is None:
            if self.auto_offset_reset == "none":
                raise OffsetOutOfRangeError(f"no position for {tps} and auto_offset_reset=none")
            where = EARLIEST if self.auto_offset_reset == "earliest" else LATEST
        for tp, offset in (await self._list_offsets(tps, where)).items():
            self._set_position(tp, offset)

    async def _list_offsets(
        self, tps: list[TopicPartition], where: int
    ) -> dict[TopicPartition, int]:
        """ListOffsets to each partition's leader, retrying through leader changes."""
        result: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + self.metadata_wait_ms / 1000
        todo = list(tps)
        # Any partition may be asked for, not only assigned ones (as Kafka's endOffsets):
        # metadata must track its topic, or no leader is ever known for it.
        if self._meta.add_topics({tp.topic for tp in todo}):
            await self._meta.refresh()
        while todo:
            by_node: dict[int, list[TopicPartition]] = {}
            snap = self._meta.snapshot
            for tp in todo:
                by_node.setdefault(snap.leader_for(*tp), []).append(tp)
            retry: list[TopicPartition] = by_node.pop(NO_LEADER, [])
            answers = await asyncio.gather(
                *(self._list_offsets_at(node, group, where) for node, group in by_node.items())
            )
            for got, failed in answers:
                result.update(got)
                retry += failed
            todo = retry
            if todo:
                if time.monotonic() > deadline:
                    raise error_for(5, f"no leader answered ListOffsets for {todo}")
                self._meta.request_update()
                await asyncio.sleep(self.retry_backoff_s)
                await self._meta.refresh()
        return result

    async def _list_offsets_at(
        self, node: int, tps: list[TopicPartition], where: int
    ) -> tuple[dict[TopicPartition, int], list[TopicPartition]]:
        snap = self._meta.snapshot
        by_topic: dict[str, list[m.ListOffsetsPartition]] = {}
        for t, p in tps:
            epoch = snap.topics[t][p].leader_epoch
            by_topic.setdefault(t, []).append(m.ListOffsetsPartition(p, epoch, where))
        request = m.ListOffsetsRequest([m.ListOffsetsTopic(t, ps) for t, ps in by_topic.items()])
        try:
            conn = await self._meta.connection(node)
            response, _ = await conn.call(request)
        except RilletError as e:
            if not e.retriable:
                raise
            return {}, tps
        got: dict[TopicPartition, int] = {}
        failed: list[TopicPartition] = []
        for t in response.topics:
            for r in t.partitions:
                if r.error_code == 0:
                    got[TopicPartition(t.topic, r.partition)] = r.offset
                elif error_for(r.error_code).retriable:
                    failed.append(TopicPartition(t.topic, r.partition))
                else:
                    raise error_for(r.error_code, f"ListOffsets {t.topic}-{r.partition}")
        return got, failed

    # --- fetching ------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        """Start a fetch to every broker that leads a fetchable partition and has no
        fetch running; wait for a change; repeat."""
        while not self._closed:
            self._wakeup.clear()
            by_node = self._fetchable()
            for node, tps in by_node.items():
                if node not in self._fetchers:
                    self._in_flight.update(tps)
                    task = asyncio.ensure_future(self._fetch(node, tps))
                    self._fetchers[node] = task
            await self._wakeup.wait()

    def _fetchable(self) -> dict[int, list[TopicPartition]]:
        if self._buffered_bytes >= self.fetch_max_bytes:
            return {}
        snap = self._meta.snapshot
        by_node: dict[int, list[TopicPartition]] = {}
        missing = False
        revoking = self._group.revoking if self._group is not None else ()
        for tp in self._assigned:
            if tp in self._in_flight or tp not in self._positions or tp in revoking:
                continue
            if self._buffered_chunks.get(tp, 0) > 1:
                continue  # one chunk being consumed and one fetched ahead: enough
            node = self._preferred_replica(tp, snap)
            if node == NO_LEADER:
                node = snap.leader_for(*tp)
            if node == NO_LEADER:
                missing = True
                continue
            by_node.setdefault(node, []).append(tp)
        if missing:
            self._refresh_later()
        return by_node

    def _preferred_replica(self, tp: TopicPartition, snap: ClusterMetadata) -> int:
        """The replica the leader sent this partition to, while still good: not expired
        and still a live broker in metadata; else NO_LEADER (use the leader)."""
        entry = self._preferred.get(tp)
        if entry is None:
            return NO_LEADER
        node, until = entry
        if time.monotonic() >= until or node not in snap.brokers:
            del self._preferred[tp]
            return NO_LEADER
        return node

    def _refresh_later(self) -> None:
        self._meta.request_update()

        async def refresh() -> None:
            try:
                await self._meta.refresh()
            except RilletError as e:
                log.info("metadata refresh failed: %r", e)
                await asyncio.sleep(self.retry_backoff_s)
            self._wakeup.set()

        if "refresh" not in self._fetchers:
            task = asyncio.ensure_future(refresh())
            self._fetchers["refresh"] = task  # type: ignore[index]
            task.add_done_callback(lambda _: self._fetchers.pop("refresh", None))  # type: ignore[call-overload]

    async def _fetch(self, node: int, tps: list[TopicPartition]) -> None:
        try:
            await self._fetch_from(node, tps)
        except asyncio.CancelledError:
            raise
        except RilletError as e:
            if not e.retriable:
                self._fail(e)
            else:
                log.info("fetch from broker %d failed: %r; refreshing metadata", node, e)
                for tp in tps:
                    self._preferred.pop(tp, None)
                self._meta.request_update()
                await asyncio.sleep(self.retry_backoff_s)
                self._refresh_later()
        except Exception as e:  # a bug or a malformed answer: surface it, never hang
            log.exception("fetch from broker %d failed", node)
            self._fail(e)
        finally:
            self._in_flight.difference_update(tps)
            self._fetchers.pop(node, None)
            self._wakeup.set()

    async def _fetch_from(self, node: int, tps: list[TopicPartition]) -> None:
        # A group revocation or loss may have dropped some since this task was made.
        tps = [tp for tp in tps if tp in self._fetch_positions]
        if not tps:
            return
        snap = self._meta.snapshot
        generations = {tp: self._generations.get(tp, 0) for tp in tps}
        wanted: dict[tuple[str, int], m.FetchPartition] = {}
        for tp in tps:
            epoch = snap.topics[tp.topic][tp.partition].leader_epoch
            wanted[tp] = m.FetchPartition(
                partition=tp.partition,
                fetch_offset=self._fetch_positions[tp],
                last_fetched_epoch=-1,
                current_leader_epoch=epoch,
                log_start_offset=-1,
                partition_max_bytes=self.max_partition_fetch_bytes,
            )
        conn = await self._meta.connection(node)
        session = self._sessions.get(node)
        if session is None:
            session = self._sessions[node] = FetchSessionBuilder()
        for _attempt in range(2):
            # Only partitions whose row changed go out (an incremental fetch); the broker
            # answers only partitions with news, and waits on all of them.
            s = session.build(wanted)
            request = m.FetchRequest(
                replica_id=-1,
                max_wait_ms=self.fetch_max_wait_ms,
                min_bytes=self.fetch_min_bytes,
                max_bytes=self.fetch_max_bytes - self._buffered_bytes,
                topics=s.topics,
                rack_id=self.client_rack,
                session_id=s.session_id,
                session_epoch=s.session_epoch,
                forgotten=s.forgotten,
            )
            try:
                response, payload = await conn.call(request, raise_errors=False)
                if response.error_code and response.error_code not in SESSION_ERRORS:
                    raise error_for(response.error_code, f"fetch from broker {node}")
            except BaseException:
                session.reset()  # answered or not: the next fetch is full, a new session
                raise
            if session.on_response(response):
                break
            # The broker lost the session (evicted, restarted): fetch in full at once.
            log.info(
                "broker %d: fetch session answered %s; fetching in full",
                node,
                error_for(response.error_code).name,
            )
        else:
            raise error_for(response.error_code, f"fetch from broker {node}")
        self.stats["fetches"] += 1
        self.bytes_by_node[node] = self.bytes_by_node.get(node, 0) + len(payload)
        pos = 0
        for t in response.topics:
            topic = t.topic
            for r in t.partitions:
                p, code, nbytes = r.partition, r.error_code, r.nbytes
                preferred = r.preferred_read_replica
                tp = TopicPartition(topic, p)
                data = payload[pos : pos + nbytes]
                pos += nbytes
                if generations.get(tp) != self._generations.get(tp, 0):
                    continue  # seeked while this fetch was out: its data is stale
                if code:
                    await self._partition_error(tp, code, node)
                    continue
                if preferred >= 0 and preferred != node:
                    until = time.monotonic() + self.preferred_max_age_s
                    if self._preferred.get(tp, (NO_LEADER, 0.0))[0] != preferred:
                        log.info(
                            "%s-%d: fetching from replica %d (rack %r), not leader %d",
                            topic,
                            p,
                            preferred,
                            self.client_rack,
                            node,
                        )
                    self._preferred[tp] = (preferred, until)
                self._accept(tp, data, generations[tp])

    def _accept(self, tp: TopicPartition, data: memoryview, generation: int) -> None:
        if not data:
            return
        try:
            recs, next_offset = decode_records(tp, data, self._fetch_positions[tp])
        except CorruptRecordError as e:
            raise CorruptRecordError(f"{tp.topic}-{tp.partition}: {e}") from e
        self._fetch_positions[tp] = next_offset
        if not recs:
            return
        self._buffer.append(_Fetched(tp, recs, len(data), generation))
        self._buffered_bytes += len(data)
        self._buffered_chunks[tp] = self._buffered_chunks.get(tp, 0) + 1
        self.stats["records"] += len(recs)
        self.stats["bytes"] += len(data)
        self._data.set()

    async def _partition_error(self, tp: TopicPartition, code: int, node: int) -> None:
        if self._preferred.get(tp, (NO_LEADER, 0.0))[0] == node:
            del self._preferred[tp]
            # Any error from a preferred read replica (behind, not a replica any more, a
            # stale epoch, even out of range: it may just lag the leader) sends the
            # partition back to the leader at the same position; the leader may name a
            # replica again. Kafka's consumer does the same.
            log.info(
                "%s-%d: preferred read replica %d answered %s; back to the leader",
                tp.topic,
                tp.partition,
                node,
                error_for(code).name,
            )
            self._refresh_later()
            return
        if code == OffsetOutOfRangeError.code:
            if self.auto_offset_reset == "none":
                self._fail(
                    OffsetOutOfRangeError(
                        f"{tp.topic}-{tp.partition}: offset {self._fetch_positions[tp]} "
                        "is out of range"
                    )
                )
                return
            log.info(
                "%s-%d: offset %d out of range, resetting to %s",
                tp.topic,
                tp.partition,
                self._fetch_positions[tp],
                self.auto_offset_reset,
            )
            await self._reset_positions([tp])
            return
        error = error_for(code, f"{tp.topic}-{tp.partition}")
        if not error.retriable or code == CorruptRecordError.code:
            # CORRUPT_MESSAGE is retriable for a producer, but a broker that answers a
            # fetch with it found the stored data damaged (its remote tier): raised to
            # the application, as Kafka's consumer does, not retried forever.
            self._fail(error)
            return
        self._refresh_later()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._data.set()


__all__ = ["Consumer", "ConsumerRecord", "TopicPartition", "assign_all", "decode_records"]
