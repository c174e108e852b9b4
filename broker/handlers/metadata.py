"""Metadata, DescribeCluster, CreateTopics, DeleteTopics, ElectLeaders,
AlterPartitionReassignments and DescribeLogDirs.

Metadata and DescribeCluster are read straight off the broker's metadata image (the
controller's ``describe_topics`` / ``describe_cluster``), so a broker answers them from
memory. CreateTopics and DeleteTopics are forwarded to the active controller; on success
the handler then waits (up to the request's ``timeout_ms``) until this broker's own image
shows the change, so a client that created a topic through a broker can use it there at
once. ElectLeaders and AlterPartitionReassignments are forwarded the same way; the
handler then waits (bounded by ``timeout_ms``) until this broker's image shows the new
leaders or replica sets, so a describe through the same broker right after sees them.

DescribeLogDirs is answered by each partition's leader from its log and its image's
remote segments: the log start in either tier, the local one, sizes, and the copy lag
(closed, committed local segments above the highest offset safely remote), for
`rillet topic describe`.

Auto-creation (``auto.create.topics.enable``, off by default): a Metadata request that
allows it and names an unknown topic starts a CreateTopics with ``num.partitions`` and
``default.replication.factor`` and answers LEADER_NOT_AVAILABLE for it (retriable).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rillet.broker.config import BrokerConfig
from rillet.broker.remote_plan import copy_lag
from rillet.broker.replica_manager import ReplicaManager
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.runtime.tasks import on_death_log
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.controller.metadata.describe import (
    INTERNAL_TOPICS,
    ClusterDescription,
    cluster_id_of,
    describe_cluster,
    describe_cluster_brokers,
    describe_topics,
    metadata_brokers,
    metadata_topic,
)
from rillet.controller.metadata.image import MetadataImage, TopicPartition
from rillet.controller.metadata.remote_log import EMPTY_REMOTE_LOG

logger = logging.getLogger(__name__)

Forward = Callable[[Any], Awaitable[Any]]  # a typed request -> its typed response
UNKNOWN_TOPIC = errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")
LEADER_NOT_AVAILABLE = errors.code_of("LEADER_NOT_AVAILABLE")
NOT_LEADER_OR_FOLLOWER = errors.code_of("NOT_LEADER_OR_FOLLOWER")
INVALID_REQUEST = errors.code_of("INVALID_REQUEST")
DEFAULT_TIMEOUT_MS = 30_000
# The controller has committed the change when it answers; this only spares a client
# a stale read from this broker, so do not hold the answer long for it.
IMAGE_WAIT_MAX_MS = 5_000


class MetadataHandlers:
    def __init__(
        self,
        config: BrokerConfig,
        replicas: ReplicaManager,
        forward: Forward,
        controller_id: Callable[[], int],
    ) -> None:
        self.config = config
        self.replicas = replicas
        self.forward = forward
        self.controller_id = controller_id
        self._creating: set[str] = set()
        self._auto_create_tasks: set[asyncio.Task[None]] = set()

    @property
    def image(self) -> MetadataImage:
        return self.replicas.image

    @property
    def cluster_id(self) -> str:
        return self.config.cluster_id or cluster_id_of(self.image) or ""

    async def describe_log_dirs(self, request: Request) -> Response:
        req: m.DescribeLogDirsRequest = request.message
        if req.topics is None:
            wanted = sorted((r.topic, r.partition) for r in self.replicas.leaders())
        else:
            wanted = [(t.topic, p) for t in req.topics for p in t.partitions]
        by_topic: dict[str, list[m.DescribeLogDirsPartition]] = {}
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append(self._describe_log(topic, partition))
        topics = [m.DescribeLogDirsTopicResult(t, rows) for t, rows in by_topic.items()]
        return Response(m.DescribeLogDirsResponse(topics))

    def _describe_log(self, topic: str, partition: int) -> m.DescribeLogDirsPartition:
        replica = self.replicas.replicas.get(TopicPartition(topic, partition))
        if replica is None or not replica.is_leader:
            code = (
                NOT_LEADER_OR_FOLLOWER
                if replica
                else self.replicas.partition_error(topic, partition)
            )
            return m.DescribeLogDirsPartition(
                partition, code, -1, -1, -1, 0, -1, -1, 0, 0, 0, 0, False
            )
        log, image = replica.log, self.image
        view = self.replicas.views.get(image, replica.topic_id, partition) or EMPTY_REMOTE_LOG
        tiered = image.topic_config(topic).get("remote.storage.enable", "").lower() == "true"
        local_start = log.log_start_offset
        start = min(local_start, view.log_start_offset) if view.segments else local_start
        # Copy lag (KIP-958's RemoteCopyLagSegments/Bytes, as the remote log manager's
        # gauges count it), only for a topic that tiers.
        lag = copy_lag(log.segments, replica.state.high_watermark, view.end_offset)
        lag_bytes, lag_segments = (lag.bytes, lag.segments) if tiered else (0, 0)
        return m.DescribeLogDirsPartition(
            partition,
            errors.NONE,
            start,
            local_start,
            log.log_end_offset,
            log.size_bytes,
            view.log_start_offset,
            view.end_offset,
            view.size_bytes,
            len(view.segments),
            lag_bytes,
            lag_segments,
            tiered,
        )

    def _cluster(self, request: Request, include_fenced: bool = False) -> ClusterDescription:
        # DescribeCluster lists fenced brokers too, flagged: tooling waits on that flag.
        # Brokers are listed at their endpoints on the listener the request came in on,
        # and those without that listener not at all (docs/broker.md, "Listeners").
        listener = request.listener or self.config.inter_broker_listener
        return describe_cluster(
            self.image, self.cluster_id, self.controller_id(), listener, include_fenced
        )

    async def metadata(self, request: Request) -> Response:
        req: m.MetadataRequest = request.message
        auto = req.allow_auto_topic_creation and self.config["auto.create.topics.enable"]
        out = []
        for t in describe_topics(self.image, req.topics):
            code = None
            # Internal topics are made by their owner with their own configs (the group
            # coordinator creates `__consumer_offsets` compacted), never auto-created.
            if t.error_code == UNKNOWN_TOPIC and auto and t.name not in INTERNAL_TOPICS:
                self._auto_create(t.name)
                code = LEADER_NOT_AVAILABLE
            out.append(metadata_topic(t, code))
        return Response(
            m.MetadataResponse(
                cluster_id=self.cluster_id,
                controller_id=self.controller_id(),
                brokers=metadata_brokers(self._cluster(request)),
                topics=out,
            )
        )

    def _auto_create(self, name: str) -> None:
        if name in self._creating:
            return
        self._creating.add(name)
        topic = m.CreatableTopic(
            name=name,
            num_partitions=self.config["num.partitions"],
            replication_factor=self.config["default.replication.factor"],
            assignments=[],
            configs={},
        )
        request = m.CreateTopicsRequest(topics=[topic], timeout_ms=DEFAULT_TIMEOUT_MS)

        async def create() -> None:
            try:
                await self.forward(request)
            except Exception as e:  # the client retries Metadata; log why it failed
                logger.warning("auto-creating topic %s failed: %r", name, e)
            finally:
                self._creating.discard(name)

        # Policy expected-to-end; keep a reference (the loop holds tasks weakly).
        task = asyncio.get_running_loop().create_task(create(), name=f"auto-create-{name}")
        self._auto_create_tasks.add(task)
        task.add_done_callback(self._auto_create_tasks.discard)
        on_death_log(task, f"auto-creating topic {name}")

    async def describe_cluster(self, request: Request) -> Response:
        return Response(
            m.DescribeClusterResponse(
                cluster_id=self.cluster_id,
                controller_id=self.controller_id(),
                brokers=describe_cluster_brokers(self._cluster(request, include_fenced=True)),
            )
        )

    async def create_topics(self, request: Request) -> Response:
        req: m.CreateTopicsRequest = request.message
        started = asyncio.get_running_loop().time()
        internal = [t for t in req.topics if t.name in INTERNAL_TOPICS]
        if internal:  # brokers create those themselves, with the configs they need
            req = req._replace(topics=[t for t in req.topics if t.name not in INTERNAL_TOPICS])
        response: m.CreateTopicsResponse = (
            await self.forward(req) if req.topics else m.CreateTopicsResponse(topics=[])
        )
        if not req.validate_only:
            created = [t.name for t in response.topics if t.error_code == errors.NONE]
            await self.wait_image(
                lambda im: all(_has_leaders(im, n) for n in created), _left(req, started)
            )
        if internal:
            refused = [
                m.CreatableTopicResult(t.name, INVALID_REQUEST, _internal(t.name), -1, -1)
                for t in internal
            ]
            response = response._replace(topics=[*refused, *response.topics])
        return Response(response)

    async def delete_topics(self, request: Request) -> Response:
        req: m.DeleteTopicsRequest = request.message
        started = asyncio.get_running_loop().time()
        internal = [n for n in req.topic_names if n in INTERNAL_TOPICS]
        if internal:  # deleting one would lose every group's offsets
            req = req._replace(topic_names=[n for n in req.topic_names if n not in INTERNAL_TOPICS])
        response: m.DeleteTopicsResponse = (
            await self.forward(req) if req.topic_names else m.DeleteTopicsResponse(responses=[])
        )
        deleted = [t.name for t in response.responses if t.error_code == errors.NONE]
        await self.wait_image(
            lambda im: all(im.topic(n) is None for n in deleted), _left(req, started)
        )
        if internal:
            refused = [m.DeletableTopicResult(n, INVALID_REQUEST, _internal(n)) for n in internal]
            response = response._replace(responses=[*refused, *response.responses])
        return Response(response)

    async def elect_leaders(self, request: Request) -> Response:
        req: m.ElectLeadersRequest = request.message
        # Epochs before the election: an elected partition's leader epoch grows.
        before = _leader_epochs(self.image, req.topics)
        response: m.ElectLeadersResponse = await self.forward(req)
        elected = [(r.topic, r.partition) for r in response.results if r.error_code == errors.NONE]
        await self.wait_image(
            lambda im: all(_leader_epoch(im, t, p) > before.get((t, p), -1) for t, p in elected),
            min(req.timeout_ms, IMAGE_WAIT_MAX_MS),
        )
        return Response(response)

    async def alter_partition_reassignments(self, request: Request) -> Response:
        req: m.AlterPartitionReassignmentsRequest = request.message
        response: m.AlterPartitionReassignmentsResponse = await self.forward(req)
        ok = {(r.topic, r.partition) for r in response.results if r.error_code == errors.NONE}
        targets = [p for p in req.partitions if (p.topic, p.partition) in ok]
        await self.wait_image(
            lambda im: all(_shows_reassignment(im, p) for p in targets),
            min(req.timeout_ms, IMAGE_WAIT_MAX_MS),
        )
        return Response(response)

    async def wait_image(self, done: Callable[[MetadataImage], bool], timeout_ms: int) -> None:
        """Until this broker's image satisfies ``done`` or the timeout (then answer
        anyway: the controller has committed the change, this broker is just behind)."""
        deadline = asyncio.get_running_loop().time() + max(timeout_ms, 0) / 1000
        while not done(self.image):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or not await self.replicas.wait_metadata(remaining):
                return


def _internal(name: str) -> str:
    return f"{name} is an internal topic: brokers create it on first use and never delete it"


def _left(req: m.CreateTopicsRequest | m.DeleteTopicsRequest, started: float) -> int:
    """What is left of the request's timeout_ms: the controller may have used it all (it
    answers REQUEST_TIMED_OUT then), and a client waits about that long, not twice it."""
    elapsed_ms = (asyncio.get_running_loop().time() - started) * 1000
    return max(int(req.timeout_ms - elapsed_ms), 0)


def _has_leaders(image: MetadataImage, name: str) -> bool:
    t = image.topic(name)
    return t is not None and all(p.leader >= 0 for p in t.partitions.values())


def _leader_epochs(image: MetadataImage, names: Sequence[str] | None) -> dict[tuple[str, int], int]:
    wanted = sorted(image.topics_by_name) if names is None else names
    out: dict[tuple[str, int], int] = {}
    for name in wanted:
        t = image.topic(name)
        for i, p in t.partitions.items() if t is not None else ():
            out[(name, i)] = p.leader_epoch
    return out


def _leader_epoch(image: MetadataImage, topic: str, partition: int) -> int:
    p = image.partition(topic, partition)
    return -1 if p is None else p.leader_epoch


def _shows_reassignment(image: MetadataImage, move: m.ReassignablePartition) -> bool:
    """The image holds the target replicas (started or done), or no reassignment (cancel)."""
    target = move.replicas
    p = image.partition(move.topic, move.partition)
    if p is None:
        return True  # deleted meanwhile: nothing to wait for
    if target is None:
        return not p.is_reassigning
    # KIP-455 layout: replicas = target + the ones being removed (just target once done).
    return tuple(p.replicas[: len(target)]) == tuple(target)
