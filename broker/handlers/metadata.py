"""Metadata, DescribeCluster, CreateTopics, DeleteTopics, ElectLeaders and
AlterPartitionReassignments.

Metadata and DescribeCluster are read straight off the broker's metadata image (the
controller's ``describe_topics`` / ``describe_cluster``), so a broker answers them from
memory. CreateTopics and DeleteTopics are forwarded to the active controller; on success
the handler then waits (up to the request's ``timeout_ms``) until this broker's own image
shows the change, so a client that created a topic through a broker can use it there at
once. ElectLeaders and AlterPartitionReassignments are forwarded the same way; the
handler then waits (bounded by ``timeout_ms``) until this broker's image shows the new
leaders or replica sets, so a describe through the same broker right after sees them.

Auto-creation (``auto.create.topics.enable``, off by default): a Metadata request that
allows it and names an unknown topic starts a CreateTopics with ``num.partitions`` and
``default.replication.factor`` and answers LEADER_NOT_AVAILABLE for it (retriable).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rillet.broker.config import BROKER_LISTENER, BrokerConfig
from rillet.broker.replica_manager import ReplicaManager
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.runtime.tasks import on_death_log
from rillet.client.wire import errors
from rillet.controller.metadata.describe import cluster_id_of, describe_cluster, describe_topics
from rillet.controller.metadata.image import MetadataImage

logger = logging.getLogger(__name__)

Forward = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
UNKNOWN_TOPIC = errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")
LEADER_NOT_AVAILABLE = errors.code_of("LEADER_NOT_AVAILABLE")
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

    def _brokers(self, include_fenced: bool = False) -> list[Any]:
        # DescribeCluster lists fenced brokers too, flagged: tooling waits on that flag.
        desc = describe_cluster(
            self.image, self.cluster_id, self.controller_id(), BROKER_LISTENER, include_fenced
        )
        return desc.brokers

    async def metadata(self, request: Request) -> Response:
        names = request.fields["topics"]
        topics = describe_topics(self.image, names)
        auto = (
            request.fields["allow_auto_topic_creation"] and self.config["auto.create.topics.enable"]
        )
        out = []
        for t in topics:
            code = t.error_code
            if code == UNKNOWN_TOPIC and auto:
                self._auto_create(t.name)
                code = LEADER_NOT_AVAILABLE
            parts = [
                [
                    p.error_code,
                    p.partition,
                    p.leader,
                    p.leader_epoch,
                    list(p.replicas),
                    list(p.isr),
                    list(p.offline_replicas),
                ]
                for p in t.partitions
            ]
            out.append([code, t.name, False, parts])
        brokers = [[b.broker_id, b.host, b.port, b.rack] for b in self._brokers()]
        return Response(
            {
                "throttle_time_ms": 0,
                "cluster_id": self.cluster_id,
                "controller_id": self.controller_id(),
                "brokers": brokers,
                "topics": out,
            }
        )

    def _auto_create(self, name: str) -> None:
        if name in self._creating:
            return
        self._creating.add(name)
        fields = {
            "topics": [
                [
                    name,
                    self.config["num.partitions"],
                    self.config["default.replication.factor"],
                    [],
                    {},
                ]
            ],
            "timeout_ms": DEFAULT_TIMEOUT_MS,
            "validate_only": False,
        }

        async def create() -> None:
            try:
                await self.forward("CreateTopics", fields)
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
        brokers = [
            [b.broker_id, b.host, b.port, b.rack, b.fenced]
            for b in self._brokers(include_fenced=True)
        ]
        return Response(
            {
                "throttle_time_ms": 0,
                "error_code": 0,
                "error_message": None,
                "cluster_id": self.cluster_id,
                "controller_id": self.controller_id(),
                "brokers": brokers,
            }
        )

    async def create_topics(self, request: Request) -> Response:
        fields = _request_fields(request)
        header = await self.forward("CreateTopics", fields)
        if not fields.get("validate_only"):
            created = [t[0] for t in header.get("topics", ()) if t[1] == errors.NONE]
            await self._wait_image(
                lambda im: all(_has_leaders(im, n) for n in created), fields["timeout_ms"]
            )
        return Response(_response_fields(header))

    async def delete_topics(self, request: Request) -> Response:
        fields = _request_fields(request)
        header = await self.forward("DeleteTopics", fields)
        deleted = [t[0] for t in header.get("responses", ()) if t[1] == errors.NONE]
        await self._wait_image(
            lambda im: all(im.topic(n) is None for n in deleted), fields["timeout_ms"]
        )
        return Response(_response_fields(header))

    async def elect_leaders(self, request: Request) -> Response:
        fields = _request_fields(request)
        # Epochs before the election: an elected partition's leader epoch grows.
        before = _leader_epochs(self.image, fields.get("topics"))
        header = await self.forward("ElectLeaders", fields)
        elected = [(t, p) for t, p, code, *_ in header.get("results", ()) if code == errors.NONE]
        await self._wait_image(
            lambda im: all(_leader_epoch(im, t, p) > before.get((t, p), -1) for t, p in elected),
            min(fields["timeout_ms"], IMAGE_WAIT_MAX_MS),
        )
        return Response(_response_fields(header))

    async def alter_partition_reassignments(self, request: Request) -> Response:
        fields = _request_fields(request)
        header = await self.forward("AlterPartitionReassignments", fields)
        ok = {(t, p) for t, p, code, *_ in header.get("results", ()) if code == errors.NONE}
        targets = [(t, p, r) for t, p, r in fields["partitions"] if (t, p) in ok]
        await self._wait_image(
            lambda im: all(_shows_reassignment(im, t, p, r) for t, p, r in targets),
            min(fields["timeout_ms"], IMAGE_WAIT_MAX_MS),
        )
        return Response(_response_fields(header))

    async def _wait_image(self, done: Callable[[MetadataImage], bool], timeout_ms: int) -> None:
        """Until this broker's image satisfies ``done`` or the timeout (then answer
        anyway: the controller has committed the change, this broker is just behind)."""
        deadline = asyncio.get_running_loop().time() + max(timeout_ms, 0) / 1000
        while not done(self.image):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or not await self.replicas.wait_metadata(remaining):
                return


def _has_leaders(image: MetadataImage, name: str) -> bool:
    t = image.topic(name)
    return t is not None and all(p.leader >= 0 for p in t.partitions.values())


def _leader_epochs(image: MetadataImage, names: list[str] | None) -> dict[tuple[str, int], int]:
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


def _shows_reassignment(
    image: MetadataImage, topic: str, partition: int, target: list[int] | None
) -> bool:
    """The image holds the target replicas (started or done), or no reassignment (cancel)."""
    p = image.partition(topic, partition)
    if p is None:
        return True  # deleted meanwhile: nothing to wait for
    if target is None:
        return not p.is_reassigning
    # KIP-455 layout: replicas = target + the ones being removed (just target once done).
    return tuple(p.replicas[: len(target)]) == tuple(target)


def _request_fields(request: Request) -> dict[str, Any]:
    """The request's own fields, without the framing header keys."""
    skip = ("api", "version", "correlation_id", "client_id")
    return {k: v for k, v in request.fields.items() if k not in skip}


def _response_fields(header: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in header.items() if k != "correlation_id"}
