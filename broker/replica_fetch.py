"""The read side of ``ReplicaManager.fetch_messages``: its typed inputs and results, and
one read pass over the requested partitions (``FetchReader``).

A pass checks each partition (consumer: leader epoch, role, offset, rack-aware
redirect; follower: its position goes to the leader's core through the partition's
driver), then reads whole batches as a ``FileSlice`` — a byte range of one segment file,
never decoded — within the request's byte budget. ``fetch_messages`` repeats passes
while it long-polls; the last pass's slices are what the handler sends.

A consumer partition whose offset left local disk for the remote tier is not read here:
the pass marks it with a ``RemoteRead`` and a byte reservation, taken from the budget as
a local read's bytes are, and ``fetch_messages`` reads it remotely
(broker/remote_fetch.py), then passes once more with those answers (``completed``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rillet.broker.remote_fetch import RemoteLogViews, RemoteRead, RemoteTier, holds, segments_from
from rillet.broker.remote_fetch import log_start_offset as global_log_start
from rillet.broker.replica import Replica
from rillet.broker.replication.partition_state import Role
from rillet.broker.replication.types import (
    UNDEFINED_OFFSET,
    EpochEndOffset,
    FetchClock,
    FetchRequest,
)
from rillet.client.wire import errors
from rillet.client.wire.errors import RilletError
from rillet.controller.metadata.image import MetadataImage, TopicPartition
from rillet.controller.metadata.remote_log import RemoteLogView
from rillet.storage import FileSlice, Log
from rillet.storage.remote.reader import Held

logger = logging.getLogger(__name__)

NONE = errors.NONE
OFFSET_OUT_OF_RANGE = errors.code_of("OFFSET_OUT_OF_RANGE")
NOT_LEADER_OR_FOLLOWER = errors.code_of("NOT_LEADER_OR_FOLLOWER")
INCONSISTENT_TOPIC_ID = errors.code_of("INCONSISTENT_TOPIC_ID")
OFFSET_MOVED_TO_TIERED_STORAGE = errors.code_of("OFFSET_MOVED_TO_TIERED_STORAGE")
CONSUMER = -1
NO_REPLICA = -1
_MAX_NOTED = 10_000  # bound on the remembered "logged once" keys


@dataclass(frozen=True, slots=True)
class FetchParams:
    """The request-wide part of a Fetch (Kafka: FetchParams)."""

    replica_id: int  # CONSUMER (-1), or the fetching follower's broker id
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    rack_id: str = ""  # a consumer's client.rack (KIP-392)

    @property
    def is_consumer(self) -> bool:
        return self.replica_id == CONSUMER


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """One partition a Fetch asks for (Kafka: PartitionData)."""

    topic: str
    partition: int
    fetch_offset: int
    last_fetched_epoch: int
    current_leader_epoch: int | None
    max_bytes: int
    topic_id: str = ""  # a follower's replica's topic id; "" (consumers): not checked


@dataclass(slots=True)
class FetchPartitionResult:
    """One partition's answer (Kafka: FetchPartitionData). ``records`` is a byte range of
    a segment file, or None; ``high_watermark`` is also the last stable offset (no
    transactions); ``log_start_offset`` the partition's, across both tiers. ``remote``:
    a read the remote tier answers (``records`` is None until it has)."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int = -1
    log_start_offset: int = -1
    diverging_epoch: EpochEndOffset | None = None
    preferred_read_replica: int = NO_REPLICA
    records: FileSlice | None = None
    # A follower's read that found it in the ISR at the leader's end with nothing to
    # send: its session may leave the partition unread until something changes.
    idle: bool = False
    remote: RemoteRead | None = None

    @property
    def nbytes(self) -> int:
        return self.records.length if self.records is not None else 0


@dataclass(slots=True)
class FetchResult:
    """One pass over every requested partition, in request order."""

    partitions: list[FetchPartitionResult] = field(default_factory=list)
    nbytes: int = 0
    follower_nbytes: int = 0  # of nbytes, what this broker served as a follower
    error: bool = False  # some partition answered an error: answer at once
    redirect: bool = False  # a partition named a preferred read replica: answer at once
    touched: list[Replica] = field(default_factory=list)  # where a long poll parks
    remote: list[int] = field(default_factory=list)  # partitions (by index) read remotely
    reserved: int = 0  # bytes the remote reads reserved of the budget
    # What the remote answers' bytes hold of the remote reader's in-flight bound: the
    # caller releases it once the response is written (or dropped).
    held: list[Held] = field(default_factory=list)

    def release(self) -> None:
        """Give back what ``held`` counts (idempotent)."""
        held, self.held = self.held, []
        for h in held:
            h.release()

    @property
    def empty(self) -> bool:
        """No partition has data or a remote read yet: the next may exceed the limits by
        one batch."""
        return self.nbytes == 0 and not self.remote


class FetchReader:
    """Reads one pass. ``replicas`` and ``image`` are the ReplicaManager's live views."""

    def __init__(
        self,
        broker_id: int,
        replicas: dict[TopicPartition, Replica],
        image: Callable[[], MetadataImage],
        partition_error: Callable[[str, int], int],
        remote: Callable[[], RemoteTier | None] = lambda: None,
    ) -> None:
        """``remote``: the broker's remote tier, None while it is off."""
        self.broker_id = broker_id
        self.replicas = replicas
        self.image = image
        self.partition_error = partition_error
        self.remote = remote
        self.views = RemoteLogViews()
        self._noted: set[tuple[Any, ...]] = set()  # (what, tp, epoch...) logged once

    def read_all(
        self,
        params: FetchParams,
        partitions: list[FetchPartition],
        first: bool = True,
        clock: FetchClock | None = None,
        completed: dict[int, FetchPartitionResult] | None = None,
    ) -> FetchResult:
        """One read over every partition. A follower's position is recorded on the
        ``first`` pass only: re-reads after a long-poll wake-up must not count as fetches
        (they would refresh its caught-up time without the follower asking again).
        ``clock``: the follower's fetch session's (FetchClock), None without one.

        ``completed``: the remote reads of an earlier pass, answered, by partition index.
        They stand in for those partitions, their bytes counted first (a local partition
        is then never the one allowed past the limits), and no new remote read starts."""
        out = FetchResult()
        budget = params.max_bytes
        rack = params.rack_id if params.is_consumer else ""
        if completed:
            for done in completed.values():
                budget -= done.nbytes
                out.nbytes += done.nbytes
                out.error = out.error or done.error_code != NONE
        for i, p in enumerate(partitions):
            if completed and i in completed:
                out.partitions.append(completed[i])
                continue
            result = self.read_one(
                p, params.replica_id, budget, out, first, rack, clock, completed is None
            )
            nbytes = result.nbytes
            if nbytes:
                budget -= nbytes
                out.nbytes += nbytes
            elif result.remote is not None:
                budget -= result.remote.max_bytes
                out.reserved += result.remote.max_bytes
                out.remote.append(i)
            out.partitions.append(result)
        return out

    def read_one(
        self,
        p: FetchPartition,
        replica_id: int,
        budget: int,
        out: FetchResult,
        first: bool = True,
        rack: str = "",
        clock: FetchClock | None = None,
        remote_ok: bool = True,
    ) -> FetchPartitionResult:
        """``remote_ok``: a consumer offset in the remote tier may start a remote read."""
        topic, partition, offset = p.topic, p.partition, p.fetch_offset
        replica = self.replicas.get(TopicPartition(topic, partition))
        if replica is None:
            out.error = True
            return FetchPartitionResult(topic, partition, self.partition_error(topic, partition))
        if p.topic_id and p.topic_id != replica.topic_id:
            # A follower of another incarnation of the topic (deleted and re-created,
            # with one side not there yet): its leader epochs restart, so the epoch check
            # alone would let it take this log's records as the new topic's.
            out.error = True
            return FetchPartitionResult(topic, partition, INCONSISTENT_TOPIC_ID)
        out.touched.append(replica)
        state, log = replica.state, replica.log
        view = self._remote_view(replica)
        # Consumers get the log start across both tiers (Kafka's logStartOffset); a
        # follower gets the local one, which it takes, bounded by its HW: the leader's
        # epoch history starts there, so below it no epoch check can find records this
        # replica wrote as a deposed leader (docs/replication.md, "The follower's log
        # start"); what lies below is in the remote tier, for any replica to serve.
        local = log.log_start_offset
        start = global_log_start(view, local) if replica_id == CONSUMER else local
        diverging = None
        remote = False  # the offset is read from the remote tier
        if replica_id == CONSUMER:
            code = self._check_consumer_fetch(replica, offset, p.current_leader_epoch)
            if code == OFFSET_OUT_OF_RANGE and holds(view, offset, log.log_start_offset):
                code, remote = None, True
            # Below the HW only: the leader's, or this follower's own (which trails it).
            limit = state.max_readable_offset(for_consumer=True)
            preferred = None if code else self._preferred_read_replica(replica, rack, offset)
            if preferred is not None:
                # Kafka's leader sends no records with a preferred replica, and answers at
                # once: the consumer goes there for the data.
                out.redirect = True
                return FetchPartitionResult(
                    topic,
                    partition,
                    NONE,
                    state.high_watermark,
                    start,
                    preferred_read_replica=preferred,
                )
        elif first:
            request = FetchRequest(
                replica_id,
                offset,
                p.last_fetched_epoch,
                p.current_leader_epoch,  # type: ignore[arg-type]
            )
            remote_start = view.log_start_offset if view is not None else UNDEFINED_OFFSET
            decision = replica.driver.on_follower_fetch(request, clock, remote_start)
            replica.activate()  # its position may have moved off the leader's end
            code = decision.error_code or None
            diverging = decision.diverging_epoch
            limit = None
        else:  # a wake-up: the position was taken; only re-check that we still lead
            code = state.validate_leader_epoch(p.current_leader_epoch)
            if code is None and not replica.is_leader:
                code = NOT_LEADER_OR_FOLLOWER
            if code is None and not log.log_start_offset <= offset <= log.log_end_offset:
                moved = holds(view, offset, log.log_start_offset)
                code = OFFSET_MOVED_TO_TIERED_STORAGE if moved else OFFSET_OUT_OF_RANGE
            limit = None
        hw = state.high_watermark
        if code is not None or diverging is not None:
            out.error = True
            return FetchPartitionResult(topic, partition, code or NONE, hw, start, diverging)
        if remote:
            assert view is not None and limit is not None
            result = self._remote_read(replica, view, p, budget, limit, out.empty, remote_ok, start)
            out.error = out.error or result.error_code != NONE
            return result
        data = _read(log, offset, min(p.max_bytes, budget), limit, first=out.empty)
        nbytes = data.length if data is not None else 0
        if nbytes and replica_id == CONSUMER and not replica.is_leader:
            out.follower_nbytes += nbytes
            self._note(
                ("serve", log.name, state.leader_epoch),
                "%s: serving consumer fetches as a follower of %d (epoch %d), below "
                "this replica's high watermark %d",
                log.name,
                state.leader_id,
                state.leader_epoch,
                hw,
            )
        if nbytes:
            return FetchPartitionResult(topic, partition, NONE, hw, start, records=data)
        idle = replica_id != CONSUMER and first and state.is_idle_follower(replica_id)
        return FetchPartitionResult(topic, partition, NONE, hw, start, idle=idle)

    def _remote_view(self, replica: Replica) -> RemoteLogView | None:
        """The partition's remote log, or None (none, or the tier off on this broker)."""
        if self.remote() is None:
            return None
        return self.views.get(self.image(), replica.topic_id, replica.partition)

    def _remote_read(
        self,
        replica: Replica,
        view: RemoteLogView,
        p: FetchPartition,
        budget: int,
        limit: int,
        first: bool,
        remote_ok: bool,
        start: int,
    ) -> FetchPartitionResult:
        """A consumer partition below the local log start: a RemoteRead reserving
        min(partition max bytes, what is left of the response), or an empty answer when
        nothing is left (or no remote read may start in this pass)."""
        hw = replica.state.high_watermark
        max_bytes = min(p.max_bytes, budget)
        segments = segments_from(view, p.fetch_offset, replica.log.log_start_offset)
        if not segments:  # past the remote end, below the local start: a gap in the log
            return FetchPartitionResult(p.topic, p.partition, OFFSET_OUT_OF_RANGE, hw, start)
        if not remote_ok or (max_bytes <= 0 and not first):
            return FetchPartitionResult(p.topic, p.partition, NONE, hw, start)
        read = RemoteRead(
            p.topic,
            replica.topic_id,
            p.partition,
            p.fetch_offset,
            max(max_bytes, 0),
            limit,
            first,
            segments,
        )
        return FetchPartitionResult(p.topic, p.partition, NONE, hw, start, remote=read)

    @staticmethod
    def _check_consumer_fetch(
        replica: Replica, offset: int, current_leader_epoch: int | None
    ) -> int | None:
        """Why a consumer cannot read here, or None. Leader and followers both serve
        consumers (fetch from follower); a replica with no role does not."""
        state, log = replica.state, replica.log
        code = state.validate_leader_epoch(current_leader_epoch)
        if code is None and state.role is Role.NONE:
            code = NOT_LEADER_OR_FOLLOWER
        if code is None and not log.log_start_offset <= offset <= log.log_end_offset:
            # On a follower an offset between its HW and its log end is not out of range:
            # the read is empty until the follower's HW passes it (as Kafka).
            code = OFFSET_OUT_OF_RANGE
        return code

    def _preferred_read_replica(self, replica: Replica, rack: str, offset: int) -> int | None:
        """Kafka's RackAwareReplicaSelector, on the leader only: an in-sync, unfenced
        follower in the consumer's rack that already holds ``offset`` (the most advanced
        one; lowest id on a tie). None when the leader is in that rack itself, no such
        follower exists, or the consumer sent no rack."""
        state = replica.state
        if not rack or not replica.is_leader:
            return None
        image = self.image()
        if _rack_of(image, self.broker_id) == rack:
            return None
        candidates = [
            (state.follower_log_end_offset(b), -b)
            for b in state.isr
            if b != self.broker_id
            and _rack_of(image, b) == rack
            and image.is_unfenced(b)
            and state.follower_log_end_offset(b) >= offset
        ]
        if not candidates:
            return None
        chosen = -max(candidates)[1]
        self._note(
            ("prefer", replica.log.name, state.leader_epoch, rack, chosen),
            "%s: consumers in rack %s fetch from replica %d (leader epoch %d)",
            replica.log.name,
            rack,
            chosen,
            state.leader_epoch,
        )
        return chosen

    def _note(self, key: tuple[Any, ...], msg: str, *args: Any) -> None:
        """Log an INFO line once per key (per partition and leader epoch, not per fetch)."""
        if key in self._noted:
            return
        if len(self._noted) >= _MAX_NOTED:
            self._noted.clear()
        self._noted.add(key)
        logger.info(msg, *args)


def _rack_of(image: MetadataImage, broker_id: int) -> str | None:
    reg = image.brokers.get(broker_id)
    return reg.rack if reg is not None else None


def _read(
    log: Log, offset: int, max_bytes: int, limit: int | None, first: bool
) -> FileSlice | None:
    """Whole batches; the first partition with data may exceed the byte limits by one
    batch (so an oversized batch still makes progress), later ones may not."""
    if max_bytes <= 0 and not first:
        return None
    try:
        data = log.read(offset, max(max_bytes, 1), limit)
    except RilletError:
        return None  # the log moved under us (retention); the next fetch says why
    if not first and data.length > max_bytes:
        return None
    return data
