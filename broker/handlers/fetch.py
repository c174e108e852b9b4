"""The Fetch and ListOffsets handlers.

Fetch decodes the request, calls ``ReplicaManager.fetch_messages`` (which checks each
partition through its replication core, reads it, and long-polls: see
broker/replica_manager.py and broker/replica_fetch.py), and encodes the answer. Each
partition's records are a byte range of one segment file (``FileSlice``), returned as a
``FileRange`` payload part: the RpcServer dup()s the descriptor when the handler returns
and preads the range straight into the socket write, so batches go from the page cache
to the socket without being decoded or copied into Python objects. Nothing awaits
between ``fetch_messages``'s last read and the handler's ``return``, so the ranges are
pinned before retention or truncation can touch them.

Consumers (``replica_id`` -1) read below the high watermark only; followers
(``replica_id`` = their broker id) read up to the log end, and their fetch position
feeds the leader's replication core (HW, ISR expansion, diverging-epoch answers).

Fetch from follower (KIP-392): a consumer may read from a follower too, below that
follower's own high watermark (which it learns from the leader's fetch answers, so it
trails the leader's). A consumer fetch to the leader that carries ``rack_id`` gets a
``preferred_read_replica`` when an in-sync follower sits in that rack and the leader does
not (Kafka's RackAwareReplicaSelector); that answer carries no records and returns at
once, and the consumer fetches the partition from that follower until it fails.

The remote tier: a consumer offset below the local log start is read from S3
(broker/remote_fetch.py); ListOffsets earliest (-2) answers the log start across both
tiers, EARLIEST_LOCAL_TIMESTAMP (-4) the local one (what a follower asks after
OFFSET_MOVED_TO_TIERED_STORAGE), and a timestamp older than the local records is looked
up in the remote segments' time indexes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from prometheus_client import Counter, Gauge

from rillet.broker import remote_fetch
from rillet.broker.config import FETCH_MAX_BYTES
from rillet.broker.fetch_session import FetchContext, FetchSessionCache
from rillet.broker.metrics import BrokerMetrics
from rillet.broker.replica_fetch import (
    FetchParams,
    FetchPartition,
    FetchPartitionResult,
    FetchResult,
)
from rillet.broker.replica_manager import ReplicaManager
from rillet.client.runtime.rpc_server import FileRange, Request, Response
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.controller.metadata.image import TopicPartition
from rillet.controller.metadata.remote_log import RemoteLogView
from rillet.storage.remote.store import RemoteStorageError

NONE = errors.NONE
NOT_LEADER_OR_FOLLOWER = errors.code_of("NOT_LEADER_OR_FOLLOWER")
OFFSET_NOT_AVAILABLE = errors.code_of("OFFSET_NOT_AVAILABLE")
CONSUMER = -1
EARLIEST = -2
LATEST = -1
EARLIEST_LOCAL = -4  # Kafka's EARLIEST_LOCAL_TIMESTAMP (KIP-405)
# FetchPartitionResult from a tuple of its fields, in C: one per partition per fetch, where
# the class call (a Python-level __new__) costs ~150 ns more.
_result: Callable[[tuple[Any, ...]], m.FetchPartitionResult] = partial(
    tuple.__new__, m.FetchPartitionResult
)


class FetchHandler:
    def __init__(
        self,
        replicas: ReplicaManager,
        metrics: BrokerMetrics,
        sessions: FetchSessionCache | None = None,
        max_bytes: int = FETCH_MAX_BYTES,
    ) -> None:
        """``max_bytes``: the broker's ``fetch.max.bytes``."""
        self.replicas = replicas
        self.metrics = metrics
        self.sessions = sessions if sessions is not None else FetchSessionCache()
        self.max_bytes = max_bytes
        # Bytes this broker served to consumers as a follower (fetch from follower), in
        # the broker's own registry beside bytes_out, which counts them too.
        self.follower_bytes_out = Counter(
            "rillet_broker_follower_consumer_bytes_out",
            "Fetched bytes a follower replica sent to consumers",
            registry=metrics.registry,
        )
        # Kafka: NumIncrementalFetchSessions, IncrementalFetchSessionEvictionsPerSec.
        sessions = self.sessions
        Gauge(
            "rillet_broker_fetch_sessions",
            "Incremental fetch sessions in the cache",
            registry=metrics.registry,
        ).set_function(lambda: float(len(sessions)))
        Gauge(
            "rillet_broker_fetch_session_evictions",
            "Fetch sessions evicted to make room for new ones",
            registry=metrics.registry,
        ).set_function(lambda: float(sessions.evictions))

    async def __call__(self, request: Request) -> Response:
        req: m.FetchRequest = request.message
        replica_id = req.replica_id
        params = FetchParams(
            replica_id,
            req.max_wait_ms,
            req.min_bytes,
            # Kafka's broker-side cap (KIP-541): a client's max_bytes alone would let one
            # fetch hold up to a whole segment per partition in memory.
            min(req.max_bytes, self.max_bytes),
            req.rack_id if replica_id == CONSUMER else "",
        )
        listed = [
            FetchPartition(
                t.topic,
                p.partition,
                p.fetch_offset,
                p.last_fetched_epoch,
                p.current_leader_epoch,
                p.partition_max_bytes,
                p.topic_id,
            )
            for t in req.topics
            for p in t.partitions
        ]
        forgotten = [(t.topic, p) for t in req.forgotten for p in t.partitions]
        now_ms = int(asyncio.get_running_loop().time() * 1000)
        context = self.sessions.new_context(
            replica_id, req.session_id, req.session_epoch, listed, forgotten, now_ms
        )
        closed = self.sessions.take_closed()
        if closed:
            self.replicas.unwatch(closed)
        if isinstance(context, int):
            return Response(m.FetchResponse([], error_code=context))
        result = await self.replicas.fetch_messages(params, context.partitions, context.watched)
        # ---- no await from fetch_messages' last read to the return: ranges pinned ----
        try:
            return self._respond(context, result, replication=replica_id >= 0)
        except BaseException:
            result.release()
            raise

    def _respond(self, context: FetchContext, result: FetchResult, replication: bool) -> Response:
        # Rows go out topic by topic (a session's order may interleave topics), and the
        # payload in the rows' order.
        by_topic: dict[str, list[FetchPartitionResult]] = {}
        for r in context.answer(result.partitions):
            group = by_topic.get(r.topic)
            if group is None:
                group = by_topic[r.topic] = []
            group.append(r)
        payload: list[FileRange | bytes] = []
        out: list[m.FetchTopicResult] = []
        kafka = self.metrics.kafka
        for topic, group in by_topic.items():
            rows = []
            topic_bytes = 0
            for r in group:
                hw = r.high_watermark
                diverging = r.diverging_epoch
                data = r.records
                topic_bytes += r.nbytes
                if data is not None:
                    if data.data is not None:  # read at once (storage/fdcache.py)
                        payload.append(data.data)
                    else:
                        payload.append(FileRange(data.fd, data.position, data.length))
                ends = (
                    m.EpochEndOffset(diverging.epoch, diverging.end_offset) if diverging else None
                )
                rows.append(
                    _result(
                        (
                            r.partition,
                            r.error_code,
                            hw,
                            hw,  # last stable offset: no transactions
                            r.log_start_offset,
                            ends,
                            r.preferred_read_replica,
                            r.nbytes,
                        )
                    )
                )
            out.append(m.FetchTopicResult(topic, rows))
            if topic_bytes:
                kafka.record_out(topic, topic_bytes, replication)
        self.metrics.bytes_out.inc(result.nbytes)
        if result.follower_nbytes:
            self.follower_bytes_out.inc(result.follower_nbytes)
        # Remote answers stay counted against the remote reader's in-flight bound until
        # the RpcServer has written them (docs/tiered.md, "Bounded memory per read").
        written = result.release if result.held else None
        return Response(m.FetchResponse(out, session_id=context.session_id), payload, written)


Lookup = m.ListOffsetsPartitionResult | Coroutine[Any, Any, m.ListOffsetsPartitionResult]


class ListOffsetsHandler:
    """Earliest (-2) is the log start (the remote one when the tier holds older
    records), earliest local (-4) the local log start, latest (-1) the high watermark
    (OFFSET_NOT_AVAILABLE while a new leader's HW is behind its epoch start),
    anything else the first record whose timestamp is at or after it (below the HW), or
    offset -1. Only a timestamp lookup in the remote tier awaits (its partitions at once)."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas

    async def __call__(self, request: Request) -> Response:
        req: m.ListOffsetsRequest = request.message
        rows = [[self.lookup(t.topic, *p) for p in t.partitions] for t in req.topics]
        waits = [r for row in rows for r in row if not isinstance(r, tuple)]
        if waits:
            found = iter(await asyncio.gather(*waits))
            rows = [[r if isinstance(r, tuple) else next(found) for r in row] for row in rows]
        out = [
            m.ListOffsetsTopicResult(t.topic, row)  # type: ignore[arg-type]
            for t, row in zip(req.topics, rows, strict=True)
        ]
        return Response(m.ListOffsetsResponse(out))

    def lookup(self, topic: str, partition: int, leader_epoch: int, ts: int) -> Lookup:
        result = m.ListOffsetsPartitionResult
        replica = self.replicas.replicas.get(TopicPartition(topic, partition))
        if replica is None:
            return result(partition, self.replicas.partition_error(topic, partition), -1, -1, -1)
        state, log = replica.state, replica.log
        code = state.validate_leader_epoch(leader_epoch)
        if code is None and not replica.is_leader:
            code = NOT_LEADER_OR_FOLLOWER
        if code is not None:
            return result(partition, code, -1, -1, -1)
        hw = state.high_watermark
        tier = self.replicas.remote
        view = None
        if tier is not None:
            view = self.replicas.views.get(self.replicas.image, replica.topic_id, partition)
        local_start = log.log_start_offset
        if ts == EARLIEST:
            start = remote_fetch.log_start_offset(view, local_start)
            return result(partition, NONE, -1, start, state.leader_epoch)
        if ts == EARLIEST_LOCAL:
            return result(partition, NONE, -1, local_start, state.leader_epoch)
        if ts == LATEST:
            if state.high_watermark_behind_epoch_start:  # retriable: the HW catches up
                return result(partition, OFFSET_NOT_AVAILABLE, -1, -1, -1)
            return result(partition, NONE, -1, hw, state.leader_epoch)
        if tier is not None and view is not None and view.log_start_offset < local_start:
            return self._remote_lookup(tier, replica.topic_id, topic, partition, view, ts)
        return self._local_lookup(topic, partition, ts)

    def _local_lookup(self, topic: str, partition: int, ts: int) -> m.ListOffsetsPartitionResult:
        result = m.ListOffsetsPartitionResult
        replica = self.replicas.replicas.get(TopicPartition(topic, partition))
        if replica is None:
            return result(partition, self.replicas.partition_error(topic, partition), -1, -1, -1)
        state = replica.state
        found = replica.log.offset_for_timestamp(ts)
        if found is None or found.offset >= state.high_watermark:
            if state.high_watermark_behind_epoch_start:  # "none yet" may be below the old HW
                return result(partition, OFFSET_NOT_AVAILABLE, -1, -1, -1)
            return result(partition, NONE, -1, -1, -1)
        return result(partition, NONE, found.timestamp, found.offset, state.leader_epoch)

    async def _remote_lookup(
        self,
        tier: remote_fetch.RemoteTier,
        topic_id: str,
        topic: str,
        partition: int,
        view: RemoteLogView,
        ts: int,
    ) -> m.ListOffsetsPartitionResult:
        """The remote segments below the local log start first (the older records), then
        the local log. A remote failure answers the partition's error code."""
        replica = self.replicas.replicas.get(TopicPartition(topic, partition))
        local_start = replica.log.log_start_offset if replica is not None else 0
        try:
            found = await remote_fetch.offset_for_timestamp(
                tier.reader, topic, topic_id, partition, view, local_start, ts
            )
        except RemoteStorageError as e:
            code = remote_fetch.STORAGE_ERROR if e.retriable else remote_fetch.CORRUPT_MESSAGE
            return m.ListOffsetsPartitionResult(partition, code, -1, -1, -1)
        # Awaited: the replica may have changed; the local lookup checks it again.
        if found is None:
            return self._local_lookup(topic, partition, ts)
        replica = self.replicas.replicas.get(TopicPartition(topic, partition))
        if replica is None or not replica.is_leader:
            return m.ListOffsetsPartitionResult(partition, NOT_LEADER_OR_FOLLOWER, -1, -1, -1)
        epoch = replica.state.leader_epoch
        return m.ListOffsetsPartitionResult(partition, NONE, found.timestamp, found.offset, epoch)
