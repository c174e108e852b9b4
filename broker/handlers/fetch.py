"""The Fetch and ListOffsets handlers.

Fetch reads each partition as a byte range of one segment file (``Log.read`` ->
``FileSlice``) and returns it as a ``FileRange`` payload part: the RpcServer dup()s the
descriptor when the handler returns and preads the range straight into the socket
write, so batches go from the page cache to the socket without being decoded or copied
into Python objects. The read and the ``return`` happen in one step (no ``await``
between them), so the range is pinned before retention or truncation can touch it.

Consumers (``replica_id`` -1) read below the high watermark only; followers
(``replica_id`` = their broker id) read up to the log end, and their fetch position
feeds the leader's replication core (HW, ISR expansion, diverging-epoch answers).

Fetch from follower (KIP-392): a consumer may read from a follower too, below that
follower's own high watermark (which it learns from the leader's fetch answers, so it
trails the leader's). A consumer fetch to the leader that carries ``rack_id`` gets a
``preferred_read_replica`` when an in-sync follower sits in that rack and the leader does
not (Kafka's RackAwareReplicaSelector); that answer carries no records and returns at
once, and the consumer fetches the partition from that follower until it fails.

Long poll: with fewer than ``min_bytes`` available the handler parks one future on each
partition it reads; appends, HW moves and role changes wake it (``Replica.wake``), it
re-reads, and it answers once ``min_bytes`` is there, a partition has an error, or
``max_wait_ms`` has passed. Nothing polls.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from rillet.broker.metrics import BrokerMetrics
from rillet.broker.replica_manager import Replica, ReplicaManager
from rillet.broker.replication.partition_state import Role
from rillet.client.runtime.rpc_server import FileRange, Request, Response
from rillet.client.wire import errors
from rillet.client.wire.errors import RilletError
from rillet.controller.metadata.image import TopicPartition
from rillet.storage import FileSlice

logger = logging.getLogger(__name__)

NONE = errors.NONE
OFFSET_OUT_OF_RANGE = errors.code_of("OFFSET_OUT_OF_RANGE")
NOT_LEADER_OR_FOLLOWER = errors.code_of("NOT_LEADER_OR_FOLLOWER")
CONSUMER = -1
EARLIEST = -2
LATEST = -1
NO_REPLICA = -1
_MAX_NOTED = 10_000  # bound on the remembered "logged once" keys


@dataclass(slots=True)
class _Pass:
    """One read over every requested partition."""

    topics: list[list[Any]] = field(default_factory=list)
    payload: list[FileRange] = field(default_factory=list)
    nbytes: int = 0
    follower_nbytes: int = 0  # of nbytes, what this broker served as a follower
    error: bool = False
    redirect: bool = False  # a partition named a preferred read replica: answer at once
    touched: list[Replica] = field(default_factory=list)


class FetchHandler:
    def __init__(self, replicas: ReplicaManager, metrics: BrokerMetrics) -> None:
        self.replicas = replicas
        self.metrics = metrics
        # Bytes this broker served to consumers as a follower (fetch from follower), in
        # the broker's own registry beside bytes_out, which counts them too.
        self.follower_bytes_out = Counter(
            "rillet_broker_follower_consumer_bytes_out",
            "Fetched bytes a follower replica sent to consumers",
            registry=metrics.registry,
        )
        self._noted: set[tuple[Any, ...]] = set()  # (what, tp, epoch...) logged once

    async def __call__(self, request: Request) -> Response:
        f = request.fields
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, f["max_wait_ms"]) / 1000
        first = True
        while True:
            result = self.read_all(f, first)
            first = False
            remaining = deadline - loop.time()
            done = result.nbytes >= f["min_bytes"] or result.error or result.redirect
            if done or remaining <= 0:
                break
            waiter: asyncio.Future[None] = loop.create_future()
            for replica in result.touched:  # none touched (no partitions): wait it out
                replica.waiters.append(waiter)
            try:
                await asyncio.wait([waiter], timeout=remaining)
            finally:
                waiter.cancel()
                for replica in result.touched:  # a timed-out waiter must not pile up
                    if waiter in replica.waiters:
                        replica.waiters.remove(waiter)
        # ---- no await from the last read to here: the ranges are pinned on return ----
        self.metrics.bytes_out.inc(result.nbytes)
        if result.follower_nbytes:
            self.follower_bytes_out.inc(result.follower_nbytes)
        return Response(
            {"throttle_time_ms": 0, "error_code": 0, "topics": result.topics}, result.payload
        )

    def read_all(self, f: dict[str, Any], first: bool = True) -> _Pass:
        """One read over every partition. A follower's position is recorded on the
        ``first`` pass only: re-reads after a long-poll wake-up must not count as fetches
        (they would refresh its caught-up time without the follower asking again)."""
        out = _Pass()
        budget = f["max_bytes"]
        replica_id = f["replica_id"]
        rack = (f.get("rack_id") or "") if replica_id == CONSUMER else ""
        now = self.replicas.now_ms()
        for topic, partitions in f["topics"]:
            results: list[list[Any]] = []
            for p in partitions:
                row, data = self.read_one(topic, p, replica_id, budget, out, now, first, rack)
                if data is not None and data.length:
                    budget -= data.length
                    out.nbytes += data.length
                    out.payload.append(FileRange(data.fd, data.position, data.length))
                results.append(row)
            out.topics.append([topic, results])
        return out

    def read_one(
        self,
        topic: str,
        p: list[Any],
        replica_id: int,
        budget: int,
        out: _Pass,
        now: int,
        first: bool = True,
        rack: str = "",
    ) -> tuple[list[Any], FileSlice | None]:
        partition, offset, last_fetched_epoch, current_leader_epoch, _, max_bytes = p[:6]
        replica = self.replicas.replicas.get(TopicPartition(topic, partition))
        if replica is None:
            out.error = True
            return _row(partition, self.replicas.partition_error(topic, partition)), None
        out.touched.append(replica)
        state, log = replica.state, replica.log
        diverging = None
        if replica_id == CONSUMER:
            code = self._check_consumer_fetch(replica, offset, current_leader_epoch)
            # Below the HW only: the leader's, or this follower's own (which trails it).
            limit = state.max_readable_offset(for_consumer=True)
            preferred = None if code else self._preferred_read_replica(replica, rack, offset)
            if preferred is not None:
                # Kafka's leader sends no records with a preferred replica, and answers at
                # once: the consumer goes there for the data.
                out.redirect = True
                hw = state.high_watermark
                return [partition, NONE, hw, hw, log.log_start_offset, None, preferred, 0], None
        elif first:
            decision = state.on_follower_fetch(
                replica_id, offset, last_fetched_epoch, now, current_leader_epoch
            )
            self.replicas.apply_effects(replica, decision.effects)
            code = decision.error_code or None
            diverging = decision.diverging_epoch
            limit = None
        else:  # a wake-up: the position was taken; only re-check that we still lead
            code = state.validate_leader_epoch(current_leader_epoch)
            if code is None and not replica.is_leader:
                code = NOT_LEADER_OR_FOLLOWER
            if code is None and not log.log_start_offset <= offset <= log.log_end_offset:
                code = OFFSET_OUT_OF_RANGE
            limit = None
        hw = state.high_watermark
        if code is not None or diverging is not None:
            out.error = True
            row = _row(partition, code or NONE, hw, log.log_start_offset)
            if diverging is not None:
                row[5] = [diverging.epoch, diverging.end_offset]
            return row, None
        data = self._read(log, offset, min(max_bytes, budget), limit, first=out.nbytes == 0)
        nbytes = data.length if data is not None else 0
        if nbytes and replica_id == CONSUMER and not replica.is_leader:
            out.follower_nbytes += nbytes
            self._note(
                ("serve", replica.log.name, state.leader_epoch),
                "%s: serving consumer fetches as a follower of %d (epoch %d), below "
                "this replica's high watermark %d",
                replica.log.name,
                state.leader_id,
                state.leader_epoch,
                hw,
            )
        return [partition, NONE, hw, hw, log.log_start_offset, None, NO_REPLICA, nbytes], data

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
        image = self.replicas.image
        if self._rack_of(self.replicas.broker_id) == rack:
            return None
        candidates = [
            (state.follower_log_end_offset(b), -b)
            for b in state.isr
            if b != self.replicas.broker_id
            and self._rack_of(b) == rack
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

    def _rack_of(self, broker_id: int) -> str | None:
        reg = self.replicas.image.brokers.get(broker_id)
        return reg.rack if reg is not None else None

    def _note(self, key: tuple[Any, ...], msg: str, *args: Any) -> None:
        """Log an INFO line once per key (per partition and leader epoch, not per fetch)."""
        if key in self._noted:
            return
        if len(self._noted) >= _MAX_NOTED:
            self._noted.clear()
        self._noted.add(key)
        logger.info(msg, *args)

    @staticmethod
    def _read(
        log: Any, offset: int, max_bytes: int, limit: int | None, first: bool
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


def _row(partition: int, code: int, hw: int = -1, log_start: int = -1) -> list[Any]:
    return [partition, code, hw, hw, log_start, None, -1, 0]


class ListOffsetsHandler:
    """Earliest (-2) is the log start, latest (-1) the high watermark, anything else the
    first record whose timestamp is at or after it (below the HW), or offset -1."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas

    async def __call__(self, request: Request) -> Response:
        out = []
        for topic, partitions in request.fields["topics"]:
            out.append([topic, [self.lookup(topic, *p[:3]) for p in partitions]])
        return Response({"throttle_time_ms": 0, "topics": out})

    def lookup(self, topic: str, partition: int, leader_epoch: int, ts: int) -> list[Any]:
        replica = self.replicas.replicas.get(TopicPartition(topic, partition))
        if replica is None:
            return [partition, self.replicas.partition_error(topic, partition), -1, -1, -1]
        state, log = replica.state, replica.log
        code = state.validate_leader_epoch(leader_epoch)
        if code is None and not replica.is_leader:
            code = NOT_LEADER_OR_FOLLOWER
        if code is not None:
            return [partition, code, -1, -1, -1]
        hw = state.high_watermark
        if ts == EARLIEST:
            return [partition, NONE, -1, log.log_start_offset, state.leader_epoch]
        if ts == LATEST:
            return [partition, NONE, -1, hw, state.leader_epoch]
        found = log.offset_for_timestamp(ts)
        if found is None or found.offset >= hw:
            return [partition, NONE, -1, -1, -1]
        return [partition, NONE, found.timestamp, found.offset, state.leader_epoch]
