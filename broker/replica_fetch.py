"""The read side of ``ReplicaManager.fetch_messages``: its typed inputs and results, and
one read pass over the requested partitions (``FetchReader``).

A pass checks each partition (consumer: leader epoch, role, offset, rack-aware
redirect; follower: its position goes to the leader's core through the partition's
driver), then reads whole batches as a ``FileSlice`` — a byte range of one segment file,
never decoded — within the request's byte budget. ``fetch_messages`` repeats passes
while it long-polls; the last pass's slices are what the handler sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rillet.broker.replica import Replica
from rillet.broker.replication.partition_state import Role
from rillet.broker.replication.types import EpochEndOffset, FetchClock, FetchRequest
from rillet.client.wire import errors
from rillet.client.wire.errors import RilletError
from rillet.controller.metadata.image import MetadataImage, TopicPartition
from rillet.storage import FileSlice, Log

logger = logging.getLogger(__name__)

NONE = errors.NONE
OFFSET_OUT_OF_RANGE = errors.code_of("OFFSET_OUT_OF_RANGE")
NOT_LEADER_OR_FOLLOWER = errors.code_of("NOT_LEADER_OR_FOLLOWER")
INCONSISTENT_TOPIC_ID = errors.code_of("INCONSISTENT_TOPIC_ID")
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
    transactions)."""

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


class FetchReader:
    """Reads one pass. ``replicas`` and ``image`` are the ReplicaManager's live views."""

    def __init__(
        self,
        broker_id: int,
        replicas: dict[TopicPartition, Replica],
        image: Callable[[], MetadataImage],
        partition_error: Callable[[str, int], int],
    ) -> None:
        self.broker_id = broker_id
        self.replicas = replicas
        self.image = image
        self.partition_error = partition_error
        self._noted: set[tuple[Any, ...]] = set()  # (what, tp, epoch...) logged once

    def read_all(
        self,
        params: FetchParams,
        partitions: list[FetchPartition],
        first: bool = True,
        clock: FetchClock | None = None,
    ) -> FetchResult:
        """One read over every partition. A follower's position is recorded on the
        ``first`` pass only: re-reads after a long-poll wake-up must not count as fetches
        (they would refresh its caught-up time without the follower asking again).
        ``clock``: the follower's fetch session's (FetchClock), None without one."""
        out = FetchResult()
        budget = params.max_bytes
        rack = params.rack_id if params.is_consumer else ""
        for p in partitions:
            result = self.read_one(p, params.replica_id, budget, out, first, rack, clock)
            nbytes = result.nbytes
            if nbytes:
                budget -= nbytes
                out.nbytes += nbytes
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
    ) -> FetchPartitionResult:
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
        diverging = None
        if replica_id == CONSUMER:
            code = self._check_consumer_fetch(replica, offset, p.current_leader_epoch)
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
                    log.log_start_offset,
                    preferred_read_replica=preferred,
                )
        elif first:
            request = FetchRequest(
                replica_id,
                offset,
                p.last_fetched_epoch,
                p.current_leader_epoch,  # type: ignore[arg-type]
            )
            decision = replica.driver.on_follower_fetch(request, clock)
            replica.activate()  # its position may have moved off the leader's end
            code = decision.error_code or None
            diverging = decision.diverging_epoch
            limit = None
        else:  # a wake-up: the position was taken; only re-check that we still lead
            code = state.validate_leader_epoch(p.current_leader_epoch)
            if code is None and not replica.is_leader:
                code = NOT_LEADER_OR_FOLLOWER
            if code is None and not log.log_start_offset <= offset <= log.log_end_offset:
                code = OFFSET_OUT_OF_RANGE
            limit = None
        hw = state.high_watermark
        if code is not None or diverging is not None:
            out.error = True
            return FetchPartitionResult(
                topic, partition, code or NONE, hw, log.log_start_offset, diverging
            )
        data = _read(log, offset, min(p.max_bytes, budget), limit, first=out.nbytes == 0)
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
        start = log.log_start_offset
        if nbytes:
            return FetchPartitionResult(topic, partition, NONE, hw, start, records=data)
        idle = replica_id != CONSUMER and first and state.is_idle_follower(replica_id)
        return FetchPartitionResult(topic, partition, NONE, hw, start, idle=idle)

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
