"""RPC handlers of the controller: wire fields <-> `QuorumController` operations.

Every write follows the seam in docs/metadata.md: the operation reads the pending image
and returns (records, response), as a plan that `ControllerServer.write` runs when no
other operation is planning or proposing; the records are proposed as bounded Raft
entries (a large operation as several, the loop getting a turn between them:
docs/controller.md, "Large operations") and the response goes out only once they
commit. An operation that writes nothing is answered after whatever it read from the
pending image commits. CreateTopics, DeleteTopics, ElectLeaders and
AlterPartitionReassignments wait at most their request's ``timeout_ms`` (when > 0): then
the items that succeeded answer REQUEST_TIMED_OUT, and the operation carries on, as in
Kafka.
Requests that reach a controller that is not active, or whose proposal is lost with
the leadership, get NOT_CONTROLLER carrying ``leader_id``, ``leader_host`` and
``leader_port`` so the caller can redirect.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import messages as m
from rillet.client.wire import schemas
from rillet.client.wire.errors import NotControllerError, PolicyViolationError, code_of
from rillet.controller.metadata.describe import (
    describe_cluster,
    describe_cluster_brokers,
    describe_topics,
    metadata_brokers,
    metadata_topic,
)
from rillet.controller.metadata.image import (
    RESOURCE_TOPIC,
    MetadataImage,
    MetadataRecord,
    RemoteSegment,
    replay_records,
)
from rillet.controller.metadata.quorum import (
    CreatableTopic,
    QuorumController,
)
from rillet.controller.metadata.topic_config import ConfigOpError, incremental_changes
from rillet.controller.raft.core import NEVER_MS, RaftNode
from rillet.controller.server import ControllerServer

Handler = Callable[[Request], Awaitable[Response | None]]
# (server, controller, typed request) -> typed response
ActiveHandler = Callable[["ControllerServer", QuorumController, Any], Awaitable[Any]]

INCONSISTENT_CLUSTER_ID = code_of("INCONSISTENT_CLUSTER_ID")
REQUEST_TIMED_OUT = code_of("REQUEST_TIMED_OUT")
INVALID_REQUEST = code_of("INVALID_REQUEST")
INVALID_CONFIG = code_of("INVALID_CONFIG")
UNKNOWN_TOPIC_OR_PARTITION = code_of("UNKNOWN_TOPIC_OR_PARTITION")
# A CreateTopics of this many partitions or more is planned on a worker thread.
PLAN_OFF_LOOP_PARTITIONS = 1000
# Off-loop plans of one CreateTopics that may go stale before the last is planned on the loop.
CREATE_PLAN_ATTEMPTS = 5
CreatePlan = Callable[[MetadataImage], tuple[list[MetadataRecord], list[Any]]]
TIMED_OUT_MESSAGE = "not committed within the request's timeout; the operation goes on"
FETCH_METADATA_MAX_WAIT_MS = 30_000


def _active(server: ControllerServer, op: ActiveHandler) -> Handler:
    """Run ``op`` on the active controller; NOT_CONTROLLER (with a redirect) otherwise."""

    async def handle(request: Request) -> Response:
        ctl = server.ctl
        if not server.active or ctl is None:
            return server.not_controller()
        try:
            return Response(await op(server, ctl, request.message))
        except NotControllerError:
            return server.not_controller()

    return handle


# -- brokers ---------------------------------------------------------------------------


async def broker_registration(
    server: ControllerServer, ctl: QuorumController, f: m.BrokerRegistrationRequest
) -> m.BrokerRegistrationResponse:
    if f.cluster_id and server.cluster_id and f.cluster_id != server.cluster_id:
        message = f"cluster id is {server.cluster_id}, not {f.cluster_id}"
        return m.BrokerRegistrationResponse(
            error_code=INCONSISTENT_CLUSTER_ID, error_message=message, broker_epoch=-1
        )
    endpoints = [tuple(e) for e in f.listeners]
    resp = await server.commit(
        ctl,
        lambda image: ctl.register_broker(
            image, f.broker_id, f.incarnation_id, endpoints, f.rack, server.clock()
        ),
    )
    return m.BrokerRegistrationResponse(
        error_code=resp.error_code,
        error_message=resp.error_message,
        broker_epoch=resp.broker_epoch,
    )


async def broker_heartbeat(
    server: ControllerServer, ctl: QuorumController, f: m.BrokerHeartbeatRequest
) -> m.BrokerHeartbeatResponse:
    resp = await server.commit(
        ctl,
        lambda image: ctl.broker_heartbeat(
            image,
            f.broker_id,
            f.broker_epoch,
            f.current_metadata_offset,
            f.want_fence,
            f.want_shut_down,
            server.clock(),
        ),
    )
    return m.BrokerHeartbeatResponse(
        error_code=resp.error_code,
        error_message=resp.error_message,
        is_caught_up=resp.is_caught_up,
        is_fenced=resp.is_fenced,
        should_shut_down=resp.should_shut_down,
    )


async def controlled_shutdown(
    server: ControllerServer, ctl: QuorumController, f: m.ControlledShutdownRequest
) -> m.ControlledShutdownResponse:
    """Kafka's old API, as a want_shutdown heartbeat: moves leaderships off the broker and
    lists what it still leads. The broker finishes with heartbeats (BrokerLifecycle)."""
    resp = await server.commit(
        ctl,
        lambda image: ctl.broker_heartbeat(
            image, f.broker_id, f.broker_epoch, -1, False, True, server.clock()
        ),
    )
    led = server.images.committed.partitions_led_by(f.broker_id)
    return m.ControlledShutdownResponse(
        error_code=resp.error_code,
        remaining_partitions=[m.RemainingPartition(t.name, p.partition) for t, p in led],
    )


# -- topics and partitions ---------------------------------------------------------------


async def create_topics(
    server: ControllerServer, ctl: QuorumController, f: m.CreateTopicsRequest
) -> m.CreateTopicsResponse:
    if len(f.topics) > ctl.config.max_partitions:  # each topic has a partition at least
        raise PolicyViolationError(
            f"{len(f.topics):,} topics in one request; max.partitions is "
            f"{ctl.config.max_partitions:,} (nothing was created)"
        )
    topics = [
        CreatableTopic(
            t.name,
            t.num_partitions,
            t.replication_factor,
            t.configs,
            {a.partition: tuple(a.broker_ids) for a in t.assignments} if t.assignments else None,
        )
        for t in f.topics
    ]
    building: set[str] = set()

    def create(plan: CreatePlan) -> Callable[[MetadataImage], tuple[list[MetadataRecord], Any]]:
        def run(image: MetadataImage) -> tuple[list[MetadataRecord], list[Any]]:
            records, results = plan(image)
            if records:
                # The new topics are building until their last entry is proposed: while
                # this operation still proposes them, they are not orphans.
                building.update(r.topic_id for r in results if r.topic_id)
                ctl.building |= building
            return records, results

        return run

    attempt = 1
    while True:
        last = attempt == CREATE_PLAN_ATTEMPTS  # then planned again on the loop if need be
        plan = await _plan_create_topics(server, ctl, topics, f.validate_only, last)
        try:
            results, done = await server.commit_within(ctl, create(plan), f.timeout_ms)
            break
        except _StalePlan:
            attempt += 1
        finally:
            ctl.building -= building
    timed_out = not done
    return m.CreateTopicsResponse(
        topics=[
            m.CreatableTopicResult(
                name=r.name,
                error_code=REQUEST_TIMED_OUT if timed_out and r.error_code == 0 else r.error_code,
                error_message=TIMED_OUT_MESSAGE if timed_out else r.error_message or None,
                num_partitions=r.num_partitions,
                replication_factor=r.replication_factor,
            )
            for r in results
        ]
    )


class _StalePlan(Exception):
    """A plan worked out off the loop no longer holds on the pending image: plan again."""


async def _plan_create_topics(
    server: ControllerServer,
    ctl: QuorumController,
    topics: list[CreatableTopic],
    validate_only: bool,
    on_loop_if_stale: bool = True,
) -> CreatePlan:
    """`create_topics` as a plan for `ControllerServer.write`. A large one (placement
    and records for thousands of partitions: 100 ms or more) is worked out first on a
    worker thread, so the loop keeps its timing (the GIL passes back and forth every few
    ms). The planner reads only the immutable image and a copy of the controller's
    state; if, when the operation's turn to write comes, the pending image has changed
    in a way that matters (a name taken, a broker fenced), the plan raises _StalePlan
    and `create_topics` plans it again off the loop on the newer image (two large
    creates at once: the second always finds the first's topics), on the loop only
    after ``CREATE_PLAN_ATTEMPTS`` such turns, so that it ends.

    A request past the partition limits (max.partitions, max.broker.partitions) is
    refused here, on the loop and before any placement: the check is a sum, so asking
    for millions of partitions costs the controller nothing."""
    image = server.images.pending
    ctl.check_partition_limits(image, topics)
    size = sum(max(t.num_partitions, len(t.assignments or ()), 1) for t in topics)
    # Counting each broker's replicas walks every partition: off the loop as well.
    if size < PLAN_OFF_LOOP_PARTITIONS and not ctl.counts_replicas(image, size):
        return lambda now: ctl.create_topics(now, topics, validate_only)
    planner = ctl.planner()
    planned = await server.off_loop(planner.create_topics, image, topics, validate_only)
    if server.ctl is not ctl:
        raise NotControllerError("leadership lost while planning")

    def plan(now: MetadataImage) -> tuple[list[MetadataRecord], list[Any]]:
        if ctl.plan_still_holds(image, now):
            return planned
        if not on_loop_if_stale:
            raise _StalePlan
        return ctl.create_topics(now, topics, validate_only)

    return plan


def _timed_out(results: list[Any], timed_out: bool) -> list[Any]:
    """Results as they stand, or each success turned into REQUEST_TIMED_OUT."""
    if not timed_out:
        return results
    return [
        dataclasses.replace(r, error_code=REQUEST_TIMED_OUT, error_message=TIMED_OUT_MESSAGE)
        if r.error_code == 0
        else r
        for r in results
    ]


async def delete_topics(
    server: ControllerServer, ctl: QuorumController, f: m.DeleteTopicsRequest
) -> m.DeleteTopicsResponse:
    names = list(f.topic_names)
    results, done = await server.commit_within(
        ctl, lambda image: ctl.delete_topics(image, names), f.timeout_ms
    )
    results = _timed_out(results, not done)
    return m.DeleteTopicsResponse(
        responses=[
            m.DeletableTopicResult(r.name, r.error_code, r.error_message or None) for r in results
        ]
    )


async def alter_partition(
    server: ControllerServer, ctl: QuorumController, f: m.AlterPartitionRequest
) -> m.AlterPartitionResponse:
    """A broker sends every pending ISR change of its partitions in one request. Each
    item's checks read only its own partition and the brokers, so items of distinct
    partitions are all checked against the pending image; only an item whose partition
    an earlier item of this request changed needs an image with that change (rebuilt
    then: a rebuild copies the topic's partition map, so one per item made a request of
    thousands of one topic's partitions quadratic)."""
    topics = await server.commit(ctl, lambda base: _alter(ctl, f, base))
    return m.AlterPartitionResponse(topics=topics)


def _alter(
    ctl: QuorumController, f: m.AlterPartitionRequest, base: MetadataImage
) -> tuple[list[MetadataRecord], list[m.AlterPartitionTopicResult]]:
    image = base
    records: list[MetadataRecord] = []
    changed: set[tuple[str, int]] = set()  # changed by this request, not yet in ``image``
    out = []
    for t in f.topics:
        results = []
        for p in t.partitions:
            if (t.topic, p.partition) in changed:
                image = replay_records(base, records)
                changed.clear()
            recs, r = ctl.alter_partition(
                image,
                f.broker_id,
                f.broker_epoch,
                t.topic,
                p.partition,
                p.leader_epoch,
                p.partition_epoch,
                p.new_isr,
            )
            if recs:
                records += recs
                changed.add((t.topic, p.partition))
            results.append(
                m.IsrResult(
                    partition=p.partition,
                    error_code=r.error_code,
                    leader_id=r.leader,
                    leader_epoch=r.leader_epoch,
                    isr=list(r.isr),
                    partition_epoch=r.partition_epoch,
                )
            )
        out.append(m.AlterPartitionTopicResult(t.topic, results))
    return records, out


async def alter_remote_segments(
    server: ControllerServer, ctl: QuorumController, f: m.AlterRemoteSegmentsRequest
) -> m.AlterRemoteSegmentsResponse:
    """A partition leader's remote segment state changes (docs/tiered.md). Each item is
    judged on the pending image with the request's earlier accepted items applied (a
    request may carry a segment's DELETE_STARTED and then its DELETE_FINISHED); the
    answer goes out once the records commit."""
    results = await server.commit(ctl, lambda base: _remote_segments(ctl, f, base))
    return m.AlterRemoteSegmentsResponse(results=results)


def _remote_segments(
    ctl: QuorumController, f: m.AlterRemoteSegmentsRequest, base: MetadataImage
) -> tuple[list[MetadataRecord], list[m.RemoteSegmentResult]]:
    image = base
    records: list[MetadataRecord] = []
    out = []
    for s in f.segments:
        segment = RemoteSegment(
            topic_id=s.topic_id,
            partition=s.partition,
            segment_id=s.segment_id,
            start_offset=s.start_offset,
            end_offset=s.end_offset,
            leader_epochs=tuple((e.epoch, e.start_offset) for e in s.leader_epochs),
            state=s.state,
            size_bytes=s.size_bytes,
            max_timestamp_ms=s.max_timestamp_ms,
            broker_id=f.broker_id,
            leader_epoch=s.leader_epoch,
        )
        recs, r = ctl.record_remote_segment(image, f.broker_id, f.broker_epoch, segment)
        if recs:
            records += recs
            image = replay_records(image, recs)
        out.append(m.RemoteSegmentResult(r.segment_id, r.error_code, r.error_message or None))
    return records, out


async def elect_leaders(
    server: ControllerServer, ctl: QuorumController, f: m.ElectLeadersRequest
) -> m.ElectLeadersResponse:
    topics = None if f.topics is None else list(f.topics)
    results, done = await server.commit_within(
        ctl, lambda image: ctl.elect_preferred_leaders(image, topics), f.timeout_ms
    )
    results = _timed_out(results, not done)
    return m.ElectLeadersResponse(results=_partition_results(results))


async def alter_partition_reassignments(
    server: ControllerServer, ctl: QuorumController, f: m.AlterPartitionReassignmentsRequest
) -> m.AlterPartitionReassignmentsResponse:
    moves = [
        (p.topic, p.partition, tuple(p.replicas) if p.replicas is not None else None)
        for p in f.partitions
    ]
    results, done = await server.commit_within(
        ctl, lambda image: ctl.reassign_partitions(image, moves), f.timeout_ms
    )
    results = _timed_out(results, not done)
    return m.AlterPartitionReassignmentsResponse(results=_partition_results(results))


def _partition_results(results: list[Any]) -> list[m.PartitionResult]:
    return [
        m.PartitionResult(r.topic, r.partition, r.error_code, r.error_message or None)
        for r in results
    ]


async def incremental_alter_configs(
    server: ControllerServer, ctl: QuorumController, f: m.IncrementalAlterConfigsRequest
) -> m.IncrementalAlterConfigsResponse:
    """Topic config changes, each resource whole or not at all; ``validate_only`` checks
    them all and writes nothing. Broker configs are static (read from each broker's file),
    so a BROKER resource is refused."""
    responses = await server.commit(ctl, lambda image: _alter_configs(ctl, f, image))
    return m.IncrementalAlterConfigsResponse(responses=responses)


def _alter_configs(
    ctl: QuorumController, f: m.IncrementalAlterConfigsRequest, image: MetadataImage
) -> tuple[list[MetadataRecord], list[m.AlterConfigsResourceResponse]]:
    named = Counter((r.resource_type, r.resource_name) for r in f.resources)  # linear
    records: list[MetadataRecord] = []
    out = []
    for r in f.resources:
        if named[r.resource_type, r.resource_name] > 1:
            recs, code, message = [], INVALID_REQUEST, "the resource is named twice"
        else:
            recs, code, message = _alter_resource(ctl, r, image)
        if not f.validate_only:
            records += recs  # distinct topics: each was judged on the same image
        out.append(m.AlterConfigsResourceResponse(code, message, r.resource_type, r.resource_name))
    return records, out


def _alter_resource(
    ctl: QuorumController, r: m.AlterConfigsResource, image: MetadataImage
) -> tuple[list[MetadataRecord], int, str | None]:
    if r.resource_type != RESOURCE_TOPIC:
        return [], INVALID_REQUEST, "only topic configs can be altered: broker configs are static"
    if image.topic(r.resource_name) is None:
        return [], UNKNOWN_TOPIC_OR_PARTITION, f"topic {r.resource_name!r} does not exist"
    ops = [(c.name, c.config_operation, c.value) for c in r.configs]
    try:
        overrides = image.topic_config(r.resource_name)
        changes = incremental_changes(overrides, ops, ctl.config.topic_defaults)
    except ConfigOpError as e:
        return [], INVALID_REQUEST if e.invalid_request else INVALID_CONFIG, str(e)
    recs, result = ctl.alter_topic_configs(image, r.resource_name, changes)
    return recs, result.error_code, result.error_message or None


# -- reads ----------------------------------------------------------------------------------


async def describe_cluster_op(
    server: ControllerServer, ctl: QuorumController, f: m.DescribeClusterRequest
) -> m.DescribeClusterResponse:
    desc = describe_cluster(
        server.images.committed, server.cluster_id or "", server.node_id, include_fenced=True
    )
    return m.DescribeClusterResponse(
        cluster_id=desc.cluster_id,
        controller_id=desc.controller_id,
        brokers=describe_cluster_brokers(desc),
    )


async def metadata(
    server: ControllerServer, ctl: QuorumController, f: m.MetadataRequest
) -> m.MetadataResponse:
    """Admin's view of topics, read off the committed image (brokers serve clients)."""
    image = server.images.committed
    desc = describe_cluster(image, server.cluster_id or "", server.node_id)
    return m.MetadataResponse(
        cluster_id=server.cluster_id,
        controller_id=server.node_id,
        brokers=metadata_brokers(desc),
        topics=[metadata_topic(t) for t in describe_topics(image, f.topics)],
    )


def describe_quorum(server: ControllerServer) -> Handler:
    async def handle(request: Request) -> Response:
        f: m.DescribeQuorumRequest = request.message
        if f.leader_only and not server.active:
            return server.not_controller()  # a broker forwarding it follows the redirect
        s = server.status()
        return Response(
            m.DescribeQuorumResponse(
                node_id=server.node_id,
                role=s["role"],
                term=s["term"],
                leader_id=-1 if s["leader_id"] is None else s["leader_id"],
                active=server.active,
                cluster_id=server.cluster_id,
                commit_index=s["commit_index"],
                applied_offset=s["applied_offset"],
                snapshot_index=s["snapshot_index"],
                last_index=s["last_index"],
                high_watermark=s["commit_index"],
                current_voters=quorum_voters(server.node, server.clock(), time.time()),
            )
        )

    return handle


def quorum_voters(node: RaftNode, now_ms: int, wall_s: float) -> list[m.ReplicaState]:
    """Every voter as this node knows it: the leader's progress of each follower (its
    match index as its log end; when it was last heard from, on the wall clock), or,
    on another node, only itself. A voter never heard from shows -1 times."""
    wall_ms = int(wall_s * 1000)

    def ago(ms: int) -> int:
        return -1 if ms == NEVER_MS else wall_ms - (now_ms - ms)

    own = m.ReplicaState(node.node_id, node.log.last_index(), wall_ms, wall_ms)
    if not node.is_leader:
        return [own]
    rows = [own]
    for peer in node.peers:
        pr = node.progress.get(peer)
        if pr is None:
            rows.append(m.ReplicaState(peer, -1, -1, -1))
            continue
        heard = ago(pr.last_heard_ms)
        caught_up = heard if pr.match_index >= node.commit_index else -1
        rows.append(m.ReplicaState(peer, pr.match_index, heard, caught_up))
    return sorted(rows)


# -- FetchMetadata ------------------------------------------------------------------------


def fetch_metadata(server: ControllerServer) -> Handler:
    """Brokers long-poll committed entries from ``fetch_offset``.

    Payload: msgpack ``[[offset, epoch, data], ...]`` where ``data`` is one operation's
    `encode_records` bytes (empty for a Raft no-op), at least one entry and otherwise at
    most ``max_bytes`` (capped by ``metadata.fetch.max.bytes``). Below the log start (after
    compaction) the answer is the snapshot instead: ``snapshot_id`` set and the payload
    the `encode_snapshot` bytes; the broker loads it and fetches from its end + 1.
    """
    cap = server.config["metadata.fetch.max.bytes"]

    async def handle(request: Request) -> Response:
        f: m.FetchMetadataRequest = request.message
        offset = max(f.fetch_offset, 1)  # Raft indexes start at 1
        deadline = (
            asyncio.get_running_loop().time()
            + min(max(f.max_wait_ms, 0), FETCH_METADATA_MAX_WAIT_MS) / 1000
        )
        while True:
            if not server.active:
                return server.not_controller()
            node, committed = server.node, server.images.committed.offset
            if offset <= node.log.snapshot_index and node.snapshot is not None:
                snap = node.snapshot
                return _fetch_response(server, m.SnapshotId(snap.index, snap.term), [snap.data])
            left = deadline - asyncio.get_running_loop().time()
            if offset <= committed or left <= 0:
                break
            await server.wait_applied_change(left)
        payload = metadata_entries(node, offset, committed, min(max(f.max_bytes, 1), cap))
        return _fetch_response(server, None, [payload] if payload else [])

    return handle


def metadata_entries(node: RaftNode, offset: int, committed: int, max_bytes: int) -> bytes:
    """FetchMetadata's payload: committed entries from ``offset``, at least one and
    otherwise at most ``max_bytes`` (b"" when there are none)."""
    out: list[list[object]] = []
    size = 0
    for e in node.log.entries_between(offset, committed):
        if out and size + len(e.data) > max_bytes:
            break
        out.append([e.index, e.term, e.data if e.kind == 0 else b""])
        size += len(e.data) + 16
    return msgpack.packb(out, use_bin_type=True) if out else b""


def _fetch_response(
    server: ControllerServer, snapshot_id: m.SnapshotId | None, payload: list[bytes]
) -> Response:
    node = server.node
    response = m.FetchMetadataResponse(
        leader_id=server.node_id,
        leader_epoch=node.term,
        high_watermark=server.images.committed.offset,
        log_start_offset=node.log.snapshot_index + 1,
        diverging_epoch=None,
        snapshot_id=snapshot_id,
        nbytes=sum(len(p) for p in payload),
    )
    return Response(response, payload)


def build_handlers(server: ControllerServer) -> dict[int, Handler]:
    ops: dict[schemas.Api, ActiveHandler] = {
        schemas.BROKER_REGISTRATION: broker_registration,
        schemas.BROKER_HEARTBEAT: broker_heartbeat,
        schemas.CONTROLLED_SHUTDOWN: controlled_shutdown,
        schemas.CREATE_TOPICS: create_topics,
        schemas.DELETE_TOPICS: delete_topics,
        schemas.ALTER_PARTITION: alter_partition,
        schemas.ALTER_REMOTE_SEGMENTS: alter_remote_segments,
        schemas.ELECT_LEADERS: elect_leaders,
        schemas.ALTER_PARTITION_REASSIGNMENTS: alter_partition_reassignments,
        schemas.INCREMENTAL_ALTER_CONFIGS: incremental_alter_configs,
        schemas.DESCRIBE_CLUSTER: describe_cluster_op,
        schemas.METADATA: metadata,
    }
    handlers: dict[int, Handler] = {api.key: _active(server, op) for api, op in ops.items()}
    handlers[schemas.FETCH_METADATA.key] = fetch_metadata(server)
    handlers[schemas.DESCRIBE_QUORUM.key] = describe_quorum(server)
    handlers[schemas.RAFT_MESSAGE.key] = server.transport.handle
    return handlers
