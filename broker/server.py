"""``BrokerServer``: one broker node's servers and tasks, in one event loop.

Start-up order (``start``):

1. open every partition log in ``log.dirs`` (``LogManager``: a log without its clean
   shutdown marker is recovered, batch by batch, from its recovery point);
2. bind every broker listener (all of ``listeners`` but CONTROLLER; port 0 picks one)
   and serve requests: ApiVersions,
   Metadata, DescribeCluster, Produce, Fetch, ListOffsets, CreateTopics, DeleteTopics,
   and the consumer-group APIs (broker/handlers/group.py; the ``GroupManager`` of
   broker/group/manager.py coordinates the groups of the `__consumer_offsets`
   partitions this broker leads);
3. register with the controller quorum with every listener's advertised endpoint (port
   0 advertised as the port actually bound), heartbeat, and
   follow the metadata log; each committed ``(delta, image)`` goes to the
   ``ReplicaManager``, which opens/creates, leads, follows or deletes partition logs
   (with the high watermarks of ``replication-offset-checkpoint``), and the
   ``FetcherManager`` (broker/replication/fetcher.py) starts one fetcher per leader this broker
   follows partitions from.

Until step 3 delivers its first metadata (the follower hands nothing over before its
image has caught up with the quorum's high watermark) the broker holds every request
but ApiVersions, as a Kafka broker does not process requests before it has caught up:
answered from an empty image, a Metadata request would say that existing topics do
not exist, and a client (or an admin tool) would believe it. A broker that cannot reach
the quorum therefore answers nothing, and clients time out and try another broker.

``stop(controlled=True)`` is the SIGTERM path (docs/design.md, "Processes"): ask the controller to
move this broker's leaderships away and wait until it has, or
``controlled.shutdown.timeout.ms`` passes; then stop serving, fail waiting acks=all
produces, stop the fetchers, write the high-watermark checkpoint, flush and close every
log with its clean-shutdown marker (the next start skips recovery).
``stop(controlled=False)`` skips the controller step.

The controller side is behind ``ControllerLink`` (broker/link/controller_link.py wraps the
controller's ControllerChannel, BrokerLifecycle and MetadataFollower), so tests can run a
broker against hand-made metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry

from rillet.broker.config import BrokerConfig
from rillet.broker.fetch_session import FetchSessionCache
from rillet.broker.group.manager import GroupManager
from rillet.broker.handlers.configs import ConfigHandlers
from rillet.broker.handlers.fetch import FetchHandler, ListOffsetsHandler
from rillet.broker.handlers.group import GroupHandlers
from rillet.broker.handlers.metadata import MetadataHandlers
from rillet.broker.handlers.produce import ProduceHandler
from rillet.broker.kafka_metrics import BrokerCollector
from rillet.broker.link.alter_partition_manager import Proposal
from rillet.broker.metrics import BrokerMetrics
from rillet.broker.remote_log_manager import RemoteLogManager
from rillet.broker.replica_manager import ReplicaManager
from rillet.broker.replication.fetcher import FetcherConfig, FetcherManager
from rillet.broker.replication.types import AlterPartitionResponse
from rillet.client.runtime.config import Config
from rillet.client.runtime.looplag import HeapFreezer, LoopLagMonitor
from rillet.client.runtime.rpc_server import Handler, Request, Response, RpcServer, rpc_limits
from rillet.client.runtime.shutdown import unless_set
from rillet.client.runtime.tasks import fatal_fault, on_death_fatal, on_death_log, run_restarting
from rillet.client.wire import schemas
from rillet.client.wire.connection import R, RequestMessage
from rillet.controller.metadata.image import MetadataDelta, MetadataImage
from rillet.storage import Log, LogManager
from rillet.storage.remote.store import store_from_config

logger = logging.getLogger(__name__)

MetadataListener = Callable[[MetadataDelta, MetadataImage], Awaitable[None]]
METRICS_SAMPLE_INTERVAL_S = 1.0
# Partitions taken on between two freezes of the heap (client/runtime/looplag.py): a
# full garbage collection over the structures of thousands took up to 0.9 s.
FREEZE_AFTER_PARTITIONS = 1000


def request_metric_name(api: str) -> Callable[[Request], str]:
    """The ``request`` label of Kafka's RequestMetrics: the API's name, but a Fetch is
    ``FetchConsumer`` or ``FetchFollower`` (by its replica id), as Kafka splits them."""
    if api != schemas.FETCH.name:
        return lambda request: api
    return lambda request: "FetchFollower" if request.message.replica_id >= 0 else "FetchConsumer"


class ControllerLink(Protocol):
    """What the broker needs from the controller quorum."""

    async def start(
        self, endpoints: list[tuple[str, str, int]], on_metadata: MetadataListener
    ) -> None:
        """Register (with the endpoints actually bound), start heartbeats and follow the
        metadata log, calling ``on_metadata`` for each committed delta."""

    def controller_id(self) -> int:
        """The active controller's id, -1 when unknown."""

    async def forward(self, message: RequestMessage[R]) -> R:
        """Send a typed request to the active controller; its typed response (a
        request-level error is raised)."""

    async def alter_partitions(self, batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        """Send one AlterPartition request carrying every ISR proposal of ``batch``; the
        answers in the batch's order (a request-level error is raised)."""

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Ask to have leaderships moved away; True once the controller says done."""

    # Optional (the remote tier needs it; a link without it runs with the tier off):
    # async def alter_remote_segments(self, segments) -> list[m.RemoteSegmentResult]
    # def metadata_age_ms(self) -> float | None  (without it: no bucket sweep)

    async def stop(self) -> None:
        """Stop heartbeats and the metadata follower."""


class BrokerServer:
    def __init__(self, config: BrokerConfig | Config, *, link: ControllerLink | None = None):
        self.config = (
            config if isinstance(config, BrokerConfig) else BrokerConfig.from_config(config)
        )
        self.node_id = self.config.node_id
        self._link = link
        self.logs: LogManager | None = None
        self.replicas: ReplicaManager | None = None
        self.groups: GroupManager | None = None  # consumer groups (broker/group/)
        self.fetchers: FetcherManager | None = None
        # Incremental fetch sessions (broker/fetch_session.py), kept across connections.
        self.fetch_sessions = FetchSessionCache(
            self.config["max.incremental.fetch.session.cache.slots"]
        )
        self.metrics: BrokerMetrics | None = None
        self.rpc: RpcServer | None = None
        self.host, self.port = self.config.broker_address
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self._caught_up = asyncio.Event()  # set by the first metadata: requests flow
        self.loop_lag = LoopLagMonitor(
            f"broker-{self.node_id}",
            warn_ms=self.config["event.loop.stall.warn.ms"],
            watchdog=True,
        )

    @property
    def link(self) -> ControllerLink:
        if self._link is None:
            from rillet.broker.link.controller_link import QuorumLink

            self._link = QuorumLink(self.config)
        return self._link

    @property
    def registry(self) -> CollectorRegistry:
        """Every metric of this broker (``rillet_*`` and Kafka's names), for /metrics."""
        assert self.metrics is not None
        return self.metrics.registry

    @property
    def listeners(self) -> dict[str, str]:
        """Bound listeners, for the readiness line: {"BROKER": "host:port", ...}."""
        ports = self.rpc.ports if self.rpc is not None else {}
        return {
            name: f"{host}:{ports.get(name, port)}"
            for name, (host, port) in self.config.broker_listeners.items()
        }

    async def start(self) -> None:
        cfg = self.config
        self.logs = LogManager(
            cfg.log_dir,
            cfg.log_defaults,
            retention_check_interval_ms=cfg["log.retention.check.interval.ms"],
            flush_check_interval_ms=cfg["log.flush.scheduler.interval.ms"],
            on_log_failure=self._log_dir_failed,
        )
        self.loop_lag.start()
        await self.logs.start()
        link = self.link
        self.replicas = ReplicaManager(cfg, self.logs, alter_partitions=link.alter_partitions)
        self.replicas.heap = HeapFreezer(f"broker-{self.node_id}", FREEZE_AFTER_PARTITIONS)
        self.replicas.load_hw_checkpoint()
        self.fetchers = FetcherManager(self.replicas, FetcherConfig.from_broker(cfg))
        self.replicas.on_roles_changed = self.fetchers.sync
        self.metrics = BrokerMetrics(
            self.replicas.under_replicated_count, self.fetchers.failed_count, self.loop_lag
        )
        self.replicas.metrics = self.metrics  # bytes and messages in, per append
        self.replicas.remote = self._remote_log_manager(link, self.replicas, self.metrics)
        self.groups = GroupManager(cfg, self.replicas)
        self.groups.start()
        self.metrics.registry.register(
            BrokerCollector(
                self.metrics.kafka,
                self.metrics,
                self.replicas,
                groups=lambda: self.groups,
                metadata_age_ms=getattr(link, "metadata_age_ms", lambda: None),
            )
        )
        self.rpc = RpcServer(
            self._handlers(link), name=f"broker-{self.node_id}", **rpc_limits(cfg.values)
        )
        # The inter-broker listener first: its address is this broker's own (metrics).
        own = cfg.inter_broker_listener
        for name, (host, port) in sorted(
            cfg.broker_listeners.items(), key=lambda item: item[0] != own
        ):
            await self.rpc.start(host, port, listener=name)
        self.port = self.rpc.ports[own]
        self._tasks = self._start_background_tasks(self.replicas)
        on_caught_up = getattr(link, "on_caught_up", None)
        if on_caught_up is not None:
            on_caught_up(self.replicas.delete_strays)
        await link.start(cfg.advertise(self.rpc.ports), self._on_metadata)
        logger.info(
            "broker %d serving on %s:%d with %d log(s)",
            self.node_id,
            self.host,
            self.port,
            len(self.logs.logs),
        )

    async def _on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        assert self.replicas is not None
        await self.replicas.on_metadata(delta, image)
        if self.metrics is not None:
            self.metrics.kafka.on_metadata(delta, image)
        if self.groups is not None:  # after the roles: it reads which offsets partitions lead
            self.groups.on_metadata(delta, image)
        if not self._caught_up.is_set():
            logger.info("broker %d: metadata caught up at offset %d", self.node_id, image.offset)
            self._caught_up.set()

    def _remote_log_manager(
        self, link: ControllerLink, replicas: ReplicaManager, metrics: BrokerMetrics
    ) -> RemoteLogManager | None:
        """The remote tier (docs/tiered.md), when ``remote.log.storage.system.enable``."""
        store = store_from_config(self.config.values)
        propose = getattr(link, "alter_remote_segments", None)
        if store is None or propose is None:
            return None
        manager = RemoteLogManager(
            self.config,
            store,
            replicas,
            propose,
            metrics=metrics,
            metadata_age_ms=getattr(link, "metadata_age_ms", None),
        )
        manager.start()
        logger.info("broker %d: remote tier on %r", self.node_id, store)
        return manager

    def _start_background_tasks(self, replicas: ReplicaManager) -> list[asyncio.Task]:
        """Each with its policy (docs/broker.md, "Faults"): ticks are fatal (a failed tick
        leaves effects unapplied); metrics and checkpoints restart with backoff (the next
        round redoes the whole job)."""
        ticks = asyncio.create_task(replicas.run_ticks(), name="replica-ticks")
        metrics = asyncio.create_task(
            run_restarting(self._sample_metrics, "metrics sampling"), name="metrics"
        )
        checkpoints = asyncio.create_task(
            run_restarting(replicas.run_hw_checkpoints, "high-watermark checkpoints"),
            name="hw-checkpoints",
        )
        on_death_fatal(ticks, "replica tick task")
        on_death_log(metrics, "metrics sampling")
        on_death_log(checkpoints, "high-watermark checkpoints")
        return [ticks, metrics, checkpoints]

    def _handlers(self, link: ControllerLink) -> dict[int, Handler]:
        assert self.replicas is not None and self.metrics is not None
        meta = MetadataHandlers(self.config, self.replicas, link.forward, link.controller_id)
        configs = ConfigHandlers(self.config, lambda: meta.image, link.forward, meta.wait_image)
        assert self.groups is not None
        groups = GroupHandlers(self.config, self.groups, link.forward)
        by_api: list[tuple[schemas.Api, Handler]] = [
            (schemas.PRODUCE, ProduceHandler(self.replicas)),
            (
                schemas.FETCH,
                FetchHandler(
                    self.replicas,
                    self.metrics,
                    self.fetch_sessions,
                    self.config["fetch.max.bytes"],
                ),
            ),
            (schemas.LIST_OFFSETS, ListOffsetsHandler(self.replicas)),
            (schemas.METADATA, meta.metadata),
            (schemas.DESCRIBE_CLUSTER, meta.describe_cluster),
            (schemas.CREATE_TOPICS, meta.create_topics),
            (schemas.DELETE_TOPICS, meta.delete_topics),
            (schemas.ELECT_LEADERS, meta.elect_leaders),
            (schemas.ALTER_PARTITION_REASSIGNMENTS, meta.alter_partition_reassignments),
            (schemas.DESCRIBE_LOG_DIRS, meta.describe_log_dirs),
            (schemas.DESCRIBE_CONFIGS, configs.describe_configs),
            (schemas.INCREMENTAL_ALTER_CONFIGS, configs.incremental_alter_configs),
            (schemas.DESCRIBE_QUORUM, configs.describe_quorum),
            (schemas.FIND_COORDINATOR, groups.find_coordinator),
            (schemas.CONSUMER_GROUP_HEARTBEAT, groups.heartbeat),
            (schemas.OFFSET_COMMIT, groups.offset_commit),
            (schemas.OFFSET_FETCH, groups.offset_fetch),
            (schemas.LIST_GROUPS, groups.list_groups),
            (schemas.CONSUMER_GROUP_DESCRIBE, groups.describe),
            (schemas.DELETE_GROUPS, groups.delete_groups),
            (schemas.OFFSET_DELETE, groups.offset_delete),
        ]
        return {api.key: self._timed(api.name, h) for api, h in by_api}

    def _timed(self, name: str, handler: Handler) -> Handler:
        metrics = self.metrics
        assert metrics is not None
        caught_up = self._caught_up
        kafka_name = request_metric_name(name)

        async def timed(request: Request) -> Response | None:
            if not caught_up.is_set():  # held until the first metadata (module docstring)
                await caught_up.wait()  # waiters resume in arrival order
            # The handler runs synchronously up to its first await, exactly as unwrapped,
            # so Produce appends keep arrival order.
            start = time.perf_counter()
            try:
                return await handler(request)
            finally:
                metrics.observe_latency(name, time.perf_counter() - start, kafka_name(request))

        return timed

    async def _sample_metrics(self) -> None:
        assert self.metrics is not None
        while True:
            await asyncio.sleep(METRICS_SAMPLE_INTERVAL_S)
            self.metrics.sample()

    def _log_dir_failed(self, log: Log, error: BaseException) -> None:
        """A log turned read-only (a write or fsync failed). Kafka takes that log directory
        offline and halts the broker once no directory is left; a broker has one here.
        Serving on would keep this partition's leadership while refusing every produce,
        and no controller would ever move it: exit, so the session expires, the
        controller elects new leaders from the ISR, and a restart recovers from disk."""
        fatal_fault(f"log directory {self.config.log_dir} failed ({log.name})", error)

    async def stop(self, controlled: bool = True, cut_short: asyncio.Event | None = None) -> None:
        """Controlled shutdown (see the module docstring); safe to call twice. Setting
        ``cut_short`` (a second signal) ends the wait for the controller at once."""
        if self._stopped:
            return
        self._stopped = True
        if controlled and self._link is not None and self.replicas is not None:
            timeout_s = self.config["controlled.shutdown.timeout.ms"] / 1000
            try:
                done = await unless_set(cut_short, self.link.controlled_shutdown(timeout_s))
            except Exception:  # the controller may be gone: still close the logs cleanly
                logger.exception("controlled shutdown request failed")
                done = False
            outcome = {True: "completed", False: "timed out", None: "cut short"}[done]
            logger.info("controlled shutdown %s", outcome)
        if self._link is not None:
            with contextlib.suppress(Exception):
                await self._link.stop()
        if self.rpc is not None:
            await self.rpc.stop()
        self.loop_lag.stop()
        if self.groups is not None:
            await self.groups.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            # An exception that ended a task was already handled by its policy.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.fetchers is not None:
            await self.fetchers.stop()
        if self.replicas is not None and self.replicas.remote is not None:
            await self.replicas.remote.close()
        if self.replicas is not None:
            await self.replicas.shutdown()  # writes the final HW checkpoint
        if self.logs is not None:
            await self.logs.close_async()
        logger.info("broker %d stopped", self.node_id)
