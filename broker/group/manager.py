"""``GroupManager``: runs the group cores (broker/group/coordinator.py) on the
`__consumer_offsets` partitions this broker leads. A thin driver: decisions stay in the
cores; this loads them, writes their records and answers only once those are committed.

- **Leadership** (``on_metadata``, after the ReplicaManager applied the delta): a
  partition this broker now leads (or leads in a new epoch) is loaded in the
  background: its log is read from the log start to the log end, records grouped by
  group id, each group rebuilt with ``GroupCoordinator.load``. Meanwhile its groups
  answer COORDINATOR_LOAD_IN_PROGRESS. A partition no longer led is dropped: its groups
  answer NOT_COORDINATOR.
- **Writes** (``run``): the core's step is computed and its records appended to the
  partition as one batch in the same synchronous stretch (no ``await`` between), so the
  log holds records in the order the cores made them; then the answer waits, acks=all,
  until the high watermark passes the batch. A step without records still waits until
  the HW passes everything appended before it: its answer may rest on state those
  records carry. Either fails after ``offsets.commit.timeout.ms``.
- **Undo or reload on failure**: the core applied the step before it was written. An
  append refused with nothing written undoes that step on its group alone (a copy taken
  before the event). When records may have reached the log (replication failed or
  timed out, leadership lost), memory may be ahead of the log: the partition's groups
  are discarded and reloaded from the log (dropped if no longer leader) before anything
  more is served, and every answer in flight on that partition becomes a retriable
  error (its generation changed).
- **Timers**: every ``TICK_INTERVAL_MS`` each loaded group's ``tick`` (session and
  rebalance timeouts); on metadata changes ``update_topics`` with the topics' ids and
  partition counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rillet.broker.config import BrokerConfig
from rillet.broker.group import records_codec as codec
from rillet.broker.group.assignors import TopicSpec
from rillet.broker.group.coordinator import (
    GroupConfig,
    GroupCoordinator,
    GroupRecord,
    GroupState,
    Step,
)
from rillet.broker.group.placement import partition_for
from rillet.broker.replica import Replica
from rillet.broker.replica_manager import AppendResult, ReplicaManager
from rillet.client.runtime.tasks import on_death_log
from rillet.client.wire import errors, records
from rillet.controller.metadata.describe import INTERNAL_TOPICS, OFFSETS_TOPIC
from rillet.controller.metadata.image import MetadataDelta, MetadataImage, TopicPartition

logger = logging.getLogger(__name__)

NONE = errors.NONE
NOT_COORDINATOR = errors.code_of("NOT_COORDINATOR")
COORDINATOR_LOAD_IN_PROGRESS = errors.code_of("COORDINATOR_LOAD_IN_PROGRESS")
COORDINATOR_NOT_AVAILABLE = errors.code_of("COORDINATOR_NOT_AVAILABLE")
REQUEST_TIMED_OUT = errors.code_of("REQUEST_TIMED_OUT")
NOT_LEADER_OR_FOLLOWER = errors.code_of("NOT_LEADER_OR_FOLLOWER")
STORAGE_ERROR = errors.code_of("KAFKA_STORAGE_ERROR")
MESSAGE_TOO_LARGE = errors.code_of("MESSAGE_TOO_LARGE")
RECORD_LIST_TOO_LARGE = errors.code_of("RECORD_LIST_TOO_LARGE")
UNKNOWN_SERVER_ERROR = errors.code_of("UNKNOWN_SERVER_ERROR")
_LOG_MAY_HOLD_IT = (NOT_COORDINATOR, NOT_LEADER_OR_FOLLOWER, STORAGE_ERROR)
"""Append refusals after which the log may hold part of the batch, or this broker no
longer leads: the partition is reloaded (or dropped), not the step undone."""
TICK_INTERVAL_MS = 250
READ_CHUNK_BYTES = 1 << 20
RELOAD_RETRY_S = 1.0


Pending = tuple[AppendResult, "asyncio.Future[int] | None"]
"""An append started (``ReplicaManager.start_append``): its result, and the future of
its replication."""


def wall_clock_ms() -> int:
    # Commit timestamps are wall-clock, as Kafka's; session deadlines use the same clock.
    return int(time.time() * 1000)


@dataclass(slots=True)
class OffsetsPartition:
    """One led `__consumer_offsets` partition and the groups it holds."""

    index: int
    leader_epoch: int
    generation: int
    """Changes on every reload or drop: a write made under an older one is not answered
    as a success (the state it answered from was discarded)."""
    loading: bool = True
    groups: dict[str, GroupCoordinator] = field(default_factory=dict)
    loaded_end: int = 0
    """Log end the partition was loaded to: a group not written since waits for it."""
    group_end: dict[str, int] = field(default_factory=dict)
    """Log end after each group's last append: an answer about a group waits for the HW
    to reach its own writes only, so other groups' traffic cannot starve it."""
    states: dict[str, deque[tuple[int, GroupState | None]]] = field(default_factory=dict)
    """Per group, its state after each append not yet known committed, oldest first:
    (log end after the append, state; None once deleted). The first entry whose end the
    HW has passed is the committed state ListGroups shows (offset 0: as loaded)."""
    failed: dict[str, str] = field(default_factory=dict)
    """Groups whose records could not be loaded (group id -> why): not served, and
    never written over, until a later load of the partition reads them."""
    deleted_topics: set[str] = field(default_factory=set)
    """Topics deleted while loading: their offsets are tombstoned once loaded."""


class GroupError(Exception):
    """A group request this broker cannot serve now; ``code`` says why."""

    def __init__(self, code: int) -> None:
        super().__init__(errors.error_name(code))
        self.code = code


class GroupManager:
    def __init__(
        self,
        config: BrokerConfig,
        replicas: ReplicaManager,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.replicas = replicas
        self.clock = clock
        self.num_partitions = config["offsets.topic.num.partitions"]
        self.commit_timeout_ms = config["offsets.commit.timeout.ms"]
        self.group_config = GroupConfig(
            session_timeout_ms=config["group.consumer.session.timeout.ms"],
            heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
            assignors=tuple(
                a.strip() for a in config["group.consumer.assignors"].split(",") if a.strip()
            ),
        )
        self.partitions: dict[int, OffsetsPartition] = {}
        self._generations = 0
        self._topics: dict[str, TopicSpec] = {}
        self._topics_current = False  # whether _topics follows the image
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    # --- placement --------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self.replicas.image

    def partition_count(self) -> int:
        """The offsets topic's partitions once it exists (it fixes placement), else the
        configured count it will be created with."""
        t = self.image.topic(OFFSETS_TOPIC)
        if t is None:
            return self.num_partitions
        return t.partition_count or len(t.partitions)

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.partition_count())

    def partition_for_group(self, group_id: str) -> OffsetsPartition:
        """The loaded partition holding ``group_id``; GroupError when this broker does not
        coordinate it now."""
        if self.image.topic(OFFSETS_TOPIC) is None:
            raise GroupError(COORDINATOR_NOT_AVAILABLE)
        part = self.partitions.get(self.partition_of(group_id))
        if part is None:
            raise GroupError(NOT_COORDINATOR)
        if part.loading:
            raise GroupError(COORDINATOR_LOAD_IN_PROGRESS)
        self._check_leads(part)
        if group_id in part.failed:
            # Retriable: a broker that can read its records (a newer version) may lead
            # the partition later; writing over what we could not read would corrupt it.
            raise GroupError(COORDINATOR_NOT_AVAILABLE)
        return part

    def _check_leads(self, part: OffsetsPartition) -> None:
        """NOT_COORDINATOR unless this broker still leads the partition in the epoch it
        loaded it at. The ReplicaManager takes a new role before ``on_metadata`` drops
        the partition here; in between, its groups must not answer."""
        replica = self.replicas.replicas.get(TopicPartition(OFFSETS_TOPIC, part.index))
        if (
            self.partitions.get(part.index) is not part
            or replica is None
            or not replica.is_leader
            or replica.state.leader_epoch != part.leader_epoch
        ):
            raise GroupError(NOT_COORDINATOR)

    def group(self, group_id: str, create: bool = False) -> GroupCoordinator | None:
        part = self.partition_for_group(group_id)
        g = part.groups.get(group_id)
        if g is None and create:
            g = part.groups[group_id] = GroupCoordinator(group_id, self.group_config)
            g.topics = dict(self._topics)
        return g

    async def committed(self, group_id: str) -> GroupCoordinator | None:
        """The group for a read (OffsetFetch, describe) as it is now, returned once its
        records so far are committed: an answer never shows a state its records may
        still lose. A copy: writes made while waiting are not in it, so the wait is for
        the group's writes up to now, never a moving target."""
        part = self.partition_for_group(group_id)
        generation = part.generation
        g = part.groups.get(group_id)
        snapshot = None if g is None else g.copy()
        if not await self._wait_committed(part, self._group_end(part, group_id)):
            raise GroupError(REQUEST_TIMED_OUT)
        if part.generation != generation:
            raise GroupError(NOT_COORDINATOR)
        self._check_leads(part)
        return snapshot

    @staticmethod
    def _group_end(part: OffsetsPartition, group_id: str) -> int:
        return part.group_end.get(group_id, part.loaded_end)

    def listed_groups(self) -> list[tuple[str, GroupState]]:
        """Every group of the loaded partitions this broker leads, in its latest
        committed state: a group whose first write is not committed yet (and may never
        be) is not shown, nor a state its records may still lose."""
        out: list[tuple[str, GroupState]] = []
        for part in self.partitions.values():
            replica = self.replicas.replicas.get(TopicPartition(OFFSETS_TOPIC, part.index))
            if part.loading or replica is None:
                continue
            hw = replica.state.high_watermark
            for group_id, history in list(part.states.items()):
                while len(history) > 1 and history[1][0] <= hw:
                    history.popleft()
                end, state = history[0]
                if end > hw:
                    continue  # its first write is still in flight
                if state is None and len(history) == 1:
                    del part.states[group_id]  # deleted, and that is committed
                elif state is not None:
                    out.append((group_id, state))
        return sorted(out)

    # --- writes -------------------------------------------------------------------------

    async def run(self, group_id: str, event: Callable[[GroupCoordinator], Step]) -> Step:
        """Apply ``event`` to the group (created if new), write its records and return the
        step once they are committed. GroupError when the coordinator cannot serve it or
        the write failed (retriable unless the records can never be written)."""
        part = self.partition_for_group(group_id)
        existing = part.groups.get(group_id)
        before = existing.copy() if existing is not None else None
        g = self.group(group_id, create=True)
        assert g is not None
        generation = part.generation
        step = event(g)
        if g.is_deleted and not step.records:
            part.groups.pop(group_id, None)  # a refused first request leaves no group
        pending = self._start_write(part, g, before, step.records)
        await self._settle(part, generation, pending, self._group_end(part, group_id))
        return step

    def _start_write(
        self,
        part: OffsetsPartition,
        g: GroupCoordinator,
        before: GroupCoordinator | None,
        group_records: tuple[GroupRecord, ...],
    ) -> Pending | None:
        """Append the records ``g`` has just applied (before any ``await``). An append
        refused before anything reached the log (too few in-sync replicas, too large)
        undoes this step alone: ``g`` goes back to ``before`` (None: it did not exist)
        and GroupError is raised; every other group and write is untouched, so a
        refusal costs no reload and resets no member's session."""
        if not group_records:
            return None
        if g.is_deleted:
            part.groups.pop(g.group_id, None)
        try:
            pending = self._append(part, group_records)
        except Exception:  # a record that does not encode: a bug, kept to this step
            logger.exception(
                "%s-%d: group %s: records not written", OFFSETS_TOPIC, part.index, g.group_id
            )
            pending = AppendResult(OFFSETS_TOPIC, part.index, UNKNOWN_SERVER_ERROR), None
        result, future = pending
        if future is None and result.error_code not in _LOG_MAY_HOLD_IT:
            if before is None:
                part.groups.pop(g.group_id, None)
            else:
                g.restore(before)
                part.groups[g.group_id] = g
            logger.debug(
                "%s-%d: a write of group %s refused (%s): undone",
                OFFSETS_TOPIC,
                part.index,
                g.group_id,
                errors.error_name(result.error_code),
            )
            raise GroupError(_write_error(result.error_code))
        self._note_state(part, g)
        return pending

    def _append(self, part: OffsetsPartition, group_records: tuple[GroupRecord, ...]) -> Pending:
        """Encode and append the records as one batch, now (no ``await``), so the log
        holds them in the order the cores made them."""
        tp = TopicPartition(OFFSETS_TOPIC, part.index)
        replica = self.replicas.replicas.get(tp)
        if replica is None or not replica.is_leader:
            return AppendResult(OFFSETS_TOPIC, part.index, NOT_COORDINATOR), None
        kvs = [kv for r in group_records for kv in codec.encode(r)]
        batch = records.encode_batch(
            [v for _, v in kvs], [k for k, _ in kvs], timestamp_ms=self.clock()
        )
        # Only this manager appends to the partition (client produces are refused), so
        # the batch ends exactly len(kvs) past the current log end.
        end = replica.log.log_end_offset + len(kvs)
        pending = self.replicas.start_append(tp, memoryview(batch), self.commit_timeout_ms)
        if pending[0].error_code == NONE:
            for r in group_records:
                part.group_end[r.group_id] = end
        return pending

    def _note_state(self, part: OffsetsPartition, g: GroupCoordinator) -> None:
        """Remember the state ``g`` will have once its append just made commits."""
        state = None if g.is_deleted else g.state
        history = part.states.setdefault(g.group_id, deque())
        history.append((self._group_end(part, g.group_id), state))
        replica = self.replicas.replicas.get(TopicPartition(OFFSETS_TOPIC, part.index))
        if replica is not None:  # kept short without ListGroups: drop superseded states
            hw = replica.state.high_watermark
            while len(history) > 1 and history[1][0] <= hw:
                history.popleft()

    async def _settle(
        self,
        part: OffsetsPartition,
        generation: int,
        pending: Pending | None,
        committed_to: int = 0,
    ) -> None:
        """Wait for an append (or, without one, for the HW to reach ``committed_to``:
        the group's earlier writes its answer rests on) to be committed; revert the
        partition when the append failed."""
        if pending is not None:
            result, future = pending
            await self.replicas.finish_append(result, future, self.commit_timeout_ms)
            if result.error_code != NONE:
                self._revert(part, generation, result.error_code)
                raise GroupError(_write_error(result.error_code))
        elif not await self._wait_committed(part, committed_to):
            raise GroupError(REQUEST_TIMED_OUT)
        if part.generation != generation:
            raise GroupError(NOT_COORDINATOR)
        self._check_leads(part)

    async def _wait_committed(self, part: OffsetsPartition, offset: int) -> bool:
        """Until the partition's HW reaches ``offset``; False on timeout or lost role."""
        replica = self.replicas.replicas.get(TopicPartition(OFFSETS_TOPIC, part.index))
        if replica is None:
            return False

        if replica.state.high_watermark >= offset:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.commit_timeout_ms / 1000
        while replica.state.high_watermark < offset:
            remaining = deadline - loop.time()
            if remaining <= 0 or not replica.is_leader:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            replica.hw_waiters.append(waiter)  # woken by HW moves and role changes
            try:
                await asyncio.wait([waiter], timeout=remaining)
            finally:
                waiter.cancel()
                if waiter in replica.hw_waiters:
                    replica.hw_waiters.remove(waiter)
        return True

    def _revert(self, part: OffsetsPartition, generation: int, code: int) -> None:
        """A write failed: memory is ahead of the log. Reload the partition's groups from
        the log (or drop them when no longer leader), once per failure."""
        if self.partitions.get(part.index) is not part or part.generation != generation:
            return  # already reloading or dropped
        logger.warning(
            "%s-%d: a group write failed (%s): reloading its groups from the log",
            OFFSETS_TOPIC,
            part.index,
            errors.error_name(code),
        )
        replica = self.replicas.replicas.get(TopicPartition(OFFSETS_TOPIC, part.index))
        if replica is None or not replica.is_leader:
            self._drop(part.index)
            return
        self._start_load(part.index, replica)

    # --- leadership and loading ----------------------------------------------------------

    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """After the ReplicaManager took its roles: load newly led offsets partitions,
        drop lost ones, and tell the groups about changed topics."""
        led: dict[int, Replica] = {}
        t = image.topic(OFFSETS_TOPIC)
        for index in t.partitions if t is not None else ():
            replica = self.replicas.replicas.get(TopicPartition(OFFSETS_TOPIC, index))
            if replica is not None and replica.is_leader:
                led[index] = replica
        for index in list(self.partitions):
            if index not in led:
                self._drop(index)
        for index, replica in led.items():
            part = self.partitions.get(index)
            if part is None or part.leader_epoch != replica.state.leader_epoch:
                self._start_load(index, replica)
        self._update_topics(delta, image)

    def _drop(self, index: int) -> None:
        part = self.partitions.pop(index, None)
        if part is not None:
            part.generation = -1
            logger.info(
                "%s-%d: no longer leader: %d group(s) dropped",
                OFFSETS_TOPIC,
                index,
                len(part.groups),
            )

    def _start_load(self, index: int, replica: Replica) -> None:
        self._generations += 1
        part = OffsetsPartition(index, replica.state.leader_epoch, self._generations)
        self.partitions[index] = part
        self._spawn(self._load(part, replica), f"load-{OFFSETS_TOPIC}-{index}")

    async def _load(self, part: OffsetsPartition, replica: Replica) -> None:
        started = time.monotonic()
        while True:
            try:
                by_group, end = await self._read_log(part, replica)
                break
            except Exception:  # a bad read: try again while still the current load
                logger.exception("%s-%d: loading failed", OFFSETS_TOPIC, part.index)
                await asyncio.sleep(RELOAD_RETRY_S)
                if self.partitions.get(part.index) is not part:
                    return
        if self.partitions.get(part.index) is not part:
            return  # dropped or reloaded meanwhile
        if not self._topics_current:
            self._topics, self._topics_current = topic_specs(self.image), True
        now = self.clock()
        for group_id, recs in by_group.items():
            if group_id in part.failed:
                continue
            try:
                g = GroupCoordinator.load(group_id, recs, self._topics, now, self.group_config)
            except Exception as e:  # this group alone: the partition's others load
                self._fail_group(part, group_id, f"its records do not replay: {e!r}")
                continue
            if not g.is_deleted:
                part.groups[group_id] = g
                part.states[group_id] = deque([(0, g.state)])
        part.loaded_end = end
        part.loading = False
        logger.info(
            "%s-%d: loaded %d group(s) from offsets [%d, %d) in %.0f ms (leader epoch %d)",
            OFFSETS_TOPIC,
            part.index,
            len(part.groups),
            replica.log.log_start_offset,
            end,
            (time.monotonic() - started) * 1000,
            part.leader_epoch,
        )
        # The topics may have changed since the records were written; offsets of a
        # topic deleted meanwhile (or while loading) go, as they would have had this
        # broker led the partition then.
        gone = part.deleted_topics | {
            t for g in part.groups.values() for t, _ in g.offsets if self.image.topic(t) is None
        }
        for g in list(part.groups.values()):
            self._background(part, g, "topic update", lambda g: g.update_topics(self._topics))
            if gone:
                self._background(
                    part, g, "offsets of deleted topics", lambda g: g.delete_topic_offsets(gone)
                )

    async def _read_log(
        self, part: OffsetsPartition, replica: Replica
    ) -> tuple[dict[str, list[GroupRecord]], int]:
        """Every record of the log (compacted or not), decoded, by group, in log order;
        and the log end read to. Nothing else appends meanwhile (requests are answered
        LOAD_IN_PROGRESS)."""
        log = replica.log
        end = log.log_end_offset
        offset = log.log_start_offset
        by_group: dict[str, list[GroupRecord]] = {}
        while offset < end:
            data = log.read_bytes(offset, READ_CHUNK_BYTES, end)
            if not data:
                break
            last = offset
            for pos, h in records.iter_batches(data):
                for r in records.decode_batch(data, pos, h):
                    if r.offset < offset or r.key is None:
                        continue
                    try:
                        record = codec.decode(r.key, r.value)
                    except codec.GroupRecordError as e:
                        self._bad_record(part, r.key, r.offset, e)
                        continue
                    if record is not None:
                        by_group.setdefault(record.group_id, []).append(record)
                last = h.next_offset
            offset = last
            await asyncio.sleep(0)  # a long log must not hold the loop
            if self.partitions.get(part.index) is not part:
                break
        return by_group, end

    def _bad_record(
        self, part: OffsetsPartition, key: bytes, offset: int, e: codec.GroupRecordError
    ) -> None:
        """A record that does not decode fails the group its key names: replaying the
        rest without it could rebuild a wrong group (a lost removal, a lost commit)."""
        try:
            group_id = codec.group_of(key)
        except codec.GroupRecordError:
            # No group to blame: not one of ours (only this manager writes here).
            logger.error(
                "%s-%d offset %d: a record that names no group, skipped: %s",
                OFFSETS_TOPIC,
                part.index,
                offset,
                e,
            )
            return
        self._fail_group(part, group_id, f"record at offset {offset} does not decode: {e}")

    def _fail_group(self, part: OffsetsPartition, group_id: str, why: str) -> None:
        if group_id not in part.failed:
            part.failed[group_id] = why
            logger.error(
                "%s-%d: group %s cannot be loaded and answers COORDINATOR_NOT_AVAILABLE "
                "until the partition is loaded again: %s",
                OFFSETS_TOPIC,
                part.index,
                group_id,
                why,
            )

    # --- timers and topics ----------------------------------------------------------------

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever(), name="groups")
        on_death_log(self._ticker, "group timers")

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL_MS / 1000)
            try:
                self.tick()
            except Exception:  # the timers of every group depend on this task
                logger.exception("group timers: a tick failed")

    def tick(self) -> None:
        now = self.clock()
        for part in list(self.partitions.values()):
            if part.loading:
                continue
            for g in list(part.groups.values()):
                if g.due(now):  # copied only then: most ticks change nothing
                    self._background(part, g, "tick", lambda g: g.tick(now))

    def _background(
        self,
        part: OffsetsPartition,
        g: GroupCoordinator,
        what: str,
        event: Callable[[GroupCoordinator], Step],
    ) -> None:
        """Apply an event no request waits for (timers, topic changes) to one group and
        write it. An exception in it is that group's alone: logged, the group put back,
        and the loop over the other groups goes on."""
        before = g.copy()
        try:
            group_records = event(g).records
        except Exception:
            g.restore(before)
            logger.exception(
                "%s-%d: group %s: %s failed", OFFSETS_TOPIC, part.index, g.group_id, what
            )
            return
        self._spawn_write(part, g, before, group_records)

    def _spawn_write(
        self,
        part: OffsetsPartition,
        g: GroupCoordinator,
        before: GroupCoordinator,
        group_records: tuple[GroupRecord, ...],
    ) -> None:
        """A write no request waits for (timers, topic changes): appended now, in the
        order the core made it, and settled in the background. A refused one was undone
        and is made again by the next tick or topic change."""
        try:
            pending = self._start_write(part, g, before, group_records)
        except GroupError:
            return
        if pending is not None:
            settle = self._settle_quietly(part, part.generation, pending)
            self._spawn(settle, f"group-write-{part.index}")

    async def _settle_quietly(
        self, part: OffsetsPartition, generation: int, pending: Pending
    ) -> None:
        # A failure was already reverted (reloaded or dropped); nothing waits for this.
        with contextlib.suppress(GroupError):
            await self._settle(part, generation, pending)

    def _update_topics(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Recompute the specs of the topics the delta touched (every topic once, or when
        brokers changed: their racks), and tell the groups if any differ. Deleted
        topics' offsets are tombstoned."""
        deleted = set(delta.deleted_topics.values())
        if deleted:
            for part in list(self.partitions.values()):
                if part.loading:
                    part.deleted_topics |= deleted
                    continue
                for g in list(part.groups.values()):
                    self._background(
                        part,
                        g,
                        "offsets of deleted topics",
                        lambda g: g.delete_topic_offsets(deleted),
                    )
        if not self.partitions:
            self._topics_current = False  # no groups here: recomputed when one loads
            return
        if not self._topics_current or delta.changed_brokers:
            topics = topic_specs(image)
        else:
            topics = dict(self._topics)
            for name in delta.deleted_topics.values():
                topics.pop(name, None)
            touched = {*delta.created_topics.values(), *(n for n, _ in delta.changed_partitions())}
            for name in touched:
                spec = topic_spec(image, name)
                if spec is None:
                    topics.pop(name, None)
                else:
                    topics[name] = spec
        self._topics_current = True
        if topics == self._topics:
            return
        self._topics = topics
        for part in list(self.partitions.values()):
            if part.loading:
                continue  # loads with the new topics when done
            for g in list(part.groups.values()):
                self._background(part, g, "topic update", lambda g: g.update_topics(topics))

    # --- tasks ------------------------------------------------------------------------------

    def _spawn(self, coro: object, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        on_death_log(task, name)

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._ticker] if self._ticker is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            # An exception that ended a task was already logged by its policy.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.partitions.clear()


def _write_error(append_code: int) -> int:
    """What a failed group write answers, as Kafka's coordinator maps append errors: a
    lost leadership is NOT_COORDINATOR, a timeout stays one, records too large to ever
    be written UNKNOWN_SERVER_ERROR (not retriable: retrying cannot help), the rest
    (too few replicas) the retriable COORDINATOR_NOT_AVAILABLE."""
    if append_code in (NOT_COORDINATOR, NOT_LEADER_OR_FOLLOWER, STORAGE_ERROR):
        return NOT_COORDINATOR
    if append_code == REQUEST_TIMED_OUT:
        return REQUEST_TIMED_OUT
    if append_code in (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, UNKNOWN_SERVER_ERROR):
        return UNKNOWN_SERVER_ERROR
    return COORDINATOR_NOT_AVAILABLE


def topic_specs(image: MetadataImage) -> dict[str, TopicSpec]:
    """Every topic as the assignors read it (the offsets topic aside)."""
    out: dict[str, TopicSpec] = {}
    for name in image.topics_by_name:
        spec = topic_spec(image, name)
        if spec is not None:
            out[name] = spec
    return out


def topic_spec(image: MetadataImage, name: str) -> TopicSpec | None:
    """A topic as the assignors read it: id, partition count, its replicas' racks per
    partition (empty when no broker gives a rack)."""
    t = image.topic(name)
    if t is None or name in INTERNAL_TOPICS:
        return None
    rack_of: Mapping[int, str | None] = {b: reg.rack for b, reg in image.brokers.items()}
    racks = tuple(
        frozenset(r for r in (rack_of.get(b) for b in p.replicas) if r)
        for _, p in sorted(t.partitions.items())
    )
    return TopicSpec(t.topic_id, len(t.partitions), racks if any(racks) else ())
