"""The controller node: Raft driver + metadata state machine + RPC, in one event loop.

``ControllerServer(config)`` with ``await start()`` / ``await stop()`` runs in-process, so
a combined-mode node runs it beside a broker in the same loop. Pieces:

- `raft_driver.RaftDriver` around `RaftNode` (persist -> send -> apply -> advance);
- `raft_transport.RaftTransport`: one-way RaftMessage frames between voters;
- the state machine (`_apply`): committed entries decode to metadata records, replayed
  into `PendingImages`; the operation waiting on an entry is answered once it commits;
- snapshots: every `metadata.snapshot.max.records` records (or `.max.bytes`) the image
  is encoded (`encode_snapshot`), handed to `RaftNode.compact` and saved by the store;
- the RPC handlers (`controller/handlers.py`) that turn requests into `QuorumController`
  operations on the active controller and answer NOT_CONTROLLER elsewhere.

The cluster id is written once, as the first record of a new quorum's first active
controller: ``Config(RESOURCE_BROKER, "", "cluster.id", id)`` (Kafka keeps cluster-wide
broker settings under the empty broker name). It lives in the image and in snapshots, so
a controller that lost its disk learns it again; ``meta.properties`` in
``metadata.log.dir`` remembers node id and cluster id and refuses a directory of
another node or cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rillet.client.runtime.rpc_server import Request, Response, RpcServer
from rillet.client.wire import schemas
from rillet.client.wire.errors import (
    InvalidConfigError,
    NotControllerError,
    RilletError,
    code_of,
)
from rillet.controller.config import parse_listeners, parse_voters, require_node_id
from rillet.controller.metadata.describe import CLUSTER_ID_KEY, cluster_id_of
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    RESOURCE_BROKER,
    Config,
    MetadataImage,
    MetadataRecord,
    decode_records,
    decode_snapshot,
    encode_records,
    encode_snapshot,
)
from rillet.controller.metadata.quorum import ControllerConfig, PendingImages, QuorumController
from rillet.controller.raft.core import (
    EntryKind,
    NotLeader,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    TooManyUncommitted,
)
from rillet.controller.raft.driver import RaftDriver, monotonic_ms
from rillet.controller.raft.store import RaftStore
from rillet.controller.raft.transport import RaftTransport

log = logging.getLogger(__name__)

META_PROPERTIES = "meta.properties"
NOT_CONTROLLER = code_of("NOT_CONTROLLER")


def controller_config_of(config: Mapping[str, Any]) -> ControllerConfig:
    return ControllerConfig(
        broker_session_timeout_ms=config["broker.session.timeout.ms"],
        broker_heartbeat_interval_ms=config["broker.heartbeat.interval.ms"],
        default_num_partitions=config["num.partitions"],
        default_replication_factor=config["default.replication.factor"],
        auto_leader_rebalance_enable=config["auto.leader.rebalance.enable"],
        leader_imbalance_per_broker_percentage=config["leader.imbalance.per.broker.percentage"],
        leader_imbalance_check_interval_ms=config["leader.imbalance.check.interval.ms"],
    )


class ControllerServer:
    """One controller quorum member. Public API documented in docs/controller.md."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.node_id = require_node_id(config)
        self.voters = parse_voters(config["controller.quorum.voters"])
        if self.node_id not in self.voters:
            raise InvalidConfigError(f"node.id {self.node_id} is not in controller.quorum.voters")
        listeners = parse_listeners(config["listeners"])
        self.bind_address = listeners.get("CONTROLLER", self.voters[self.node_id])
        self.log_dir = Path(config["metadata.log.dir"])
        self.controller_config = controller_config_of(config)
        self.images = PendingImages(EMPTY_IMAGE)
        self.ctl: QuorumController | None = None
        self.active = False  # the Raft leader that has applied its own term's first entry
        self.cluster_id: str | None = None
        self.failure: asyncio.Future[BaseException] | None = None
        self._leader_term: int | None = None
        self._last_leader: int | None = None
        self._waiters: dict[int, tuple[int, asyncio.Future[None]]] = {}
        self._applied: asyncio.Future[None] | None = None  # resolved and replaced per apply
        self._since_snapshot_records = 0
        self._since_snapshot_bytes = 0
        self._tick_task: asyncio.Task[None] | None = None
        self.node: RaftNode
        self.store: RaftStore
        self.driver: RaftDriver
        self.transport: RaftTransport
        self.rpc: RpcServer

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.failure = loop.create_future()
        self._applied = loop.create_future()
        self._check_meta_properties()
        self.store = await loop.run_in_executor(None, RaftStore, self.log_dir)
        state = await loop.run_in_executor(None, self.store.load)
        if state.snapshot is not None:
            self.images = PendingImages(decode_snapshot(state.snapshot.data))
            self._learn_cluster_id()
        raft_config = RaftConfig(
            node_id=self.node_id,
            voters=tuple(sorted(self.voters)),
            election_timeout_ms=self.config["quorum.election.timeout.ms"],
            heartbeat_interval_ms=self.config["quorum.heartbeat.interval.ms"],
        )
        self.node = RaftNode(raft_config, state, rng=random.Random(), now_ms=monotonic_ms())
        self.transport = RaftTransport(
            self.node_id,
            self.voters,
            self._on_raft_message,
            timeout_ms=self.config["quorum.fetch.timeout.ms"],
        )
        self.transport.cluster_id = self.cluster_id
        self.driver = RaftDriver(
            self.node,
            self.store,
            self.transport.send,
            self._apply,
            self._after_advance,
            tick_interval_ms=self.config["quorum.tick.interval.ms"],
            on_failure=self._fail,
        )
        from rillet.controller.handlers import build_handlers  # handlers import this module

        self.rpc = RpcServer(
            build_handlers(self),
            name=f"controller-{self.node_id}",
            max_request_bytes=self.config["socket.request.max.bytes"],
            max_connections=self.config["max.connections"],
        )
        await self.rpc.start(*self.bind_address)
        self.transport.start()
        self.driver.start()
        self._tick_task = loop.create_task(self._controller_ticker(), name="controller-ticker")
        # Policy fatal (for the controller): without it sessions never expire.
        self._tick_task.add_done_callback(self._on_ticker_done)
        log.info(
            "controller %d: serving on %s with voters %s (snapshot at %d, %d entries)",
            self.node_id,
            self.address,
            sorted(self.voters),
            self.node.log.snapshot_index,
            len(state.entries),
        )

    async def stop(self, transfer_leadership: bool = True) -> None:
        """Hand leadership over (TimeoutNow) if leading, then stop everything and flush."""
        if transfer_leadership and self.driver.failure is None:
            await self._transfer_leadership()
        if self._tick_task is not None:
            self._tick_task.cancel()
        await self.rpc.stop()
        await self.driver.stop()
        await self.transport.stop()
        self._fail_waiters("controller stopped")
        await asyncio.get_running_loop().run_in_executor(None, self.store.close)
        log.info("controller %d: stopped", self.node_id)

    async def _transfer_leadership(self) -> None:
        node = self.node
        if node.role is not Role.LEADER or not node.progress:
            return
        target = max(node.progress, key=lambda p: node.progress[p].match_index)
        log.info(
            "controller %d: handing leadership of term %d to %d before stopping",
            self.node_id,
            node.term,
            target,
        )
        try:
            node.transfer_leadership(target)
        except RilletError:
            return
        self.driver.poke()
        deadline_s = self.config["controlled.shutdown.timeout.ms"] / 1000
        try:
            async with asyncio.timeout(deadline_s):
                while node.role is Role.LEADER:
                    await self.wait_applied_change(0.05)
        except TimeoutError:
            log.warning("controller %d: leadership transfer did not finish", self.node_id)

    def _on_ticker_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or (error := task.exception()) is None:
            return
        log.critical("controller %d: ticker stopped: %r", self.node_id, error, exc_info=error)
        self._fail(error)

    def _fail(self, error: BaseException) -> None:
        if self.failure is not None and not self.failure.done():
            self.failure.set_result(error)

    @property
    def port(self) -> int:
        assert self.rpc.port is not None
        return self.rpc.port

    @property
    def address(self) -> str:
        return f"{self.rpc.host}:{self.rpc.port}"

    @property
    def listeners(self) -> dict[str, str]:
        return {"CONTROLLER": self.address}

    @property
    def image(self) -> MetadataImage:
        """The committed metadata image."""
        return self.images.committed

    @property
    def leader_id(self) -> int | None:
        return self.node.leader_id

    def status(self) -> dict[str, Any]:
        return {
            **self.node.status(),
            "active": self.active,
            "cluster_id": self.cluster_id,
            "applied_offset": self.images.committed.offset,
        }

    # -- Raft plumbing -------------------------------------------------------------

    def _on_raft_message(self, msg: Any) -> None:
        self.driver.step(msg)

    def _apply(self, ready: Ready) -> None:
        """Step 3 of the loop: restore a snapshot, replay committed entries, answer waiters."""
        if ready.snapshot is not None:
            self.images = PendingImages(decode_snapshot(ready.snapshot.data))
            self._fail_waiters("a snapshot replaced this controller's state")
            self._since_snapshot_records = self._since_snapshot_bytes = 0
            log.info(
                "controller %d: loaded snapshot at offset %d", self.node_id, ready.snapshot.index
            )
        entries = []
        for e in ready.committed_entries:
            records = decode_records(e.data) if e.kind == EntryKind.NORMAL else []
            entries.append((e.index, e.term, records))
            self._since_snapshot_records += len(records)
            self._since_snapshot_bytes += len(e.data)
        if entries:
            self.images.commit(entries)
            for index, term, _ in entries:
                waiter = self._waiters.pop(index, None)
                if waiter is not None and not waiter[1].done():
                    if waiter[0] == term:
                        waiter[1].set_result(None)
                    else:
                        waiter[1].set_exception(NotControllerError("the proposal was replaced"))
        if entries or ready.snapshot is not None:
            self._learn_cluster_id()
            self._notify_applied()

    async def _after_advance(self) -> None:
        self._track_leadership()
        await self._maybe_snapshot()

    def _track_leadership(self) -> None:
        node = self.node
        if node.leader_id != self._last_leader:
            self._last_leader = node.leader_id
            log.info(
                "controller %d: quorum leader is now %s (term %d)",
                self.node_id,
                node.leader_id,
                node.term,
            )
        if node.role is Role.LEADER and self._leader_term != node.term:
            self._leader_term = node.term
            self.active = False
            self.images.reset()
            self.ctl = QuorumController(self.controller_config, rng=random.Random())
        elif node.role is not Role.LEADER and self._leader_term is not None:
            log.info(
                "controller %d: no longer the active controller (term %d)", self.node_id, node.term
            )
            self._leader_term, self.active, self.ctl = None, False, None
            self._fail_waiters("leadership lost")
            self.images.reset()
            self._notify_applied()
        if (
            node.role is Role.LEADER
            and not self.active
            and node.applied_index >= node.term_start_index
        ):
            self.active = True
            log.info(
                "controller %d: active controller for term %d at offset %d",
                self.node_id,
                node.term,
                self.images.committed.offset,
            )
            if cluster_id_of(self.images.pending) is None:
                self._write_cluster_id()

    def _write_cluster_id(self) -> None:
        new_id = self.config["cluster.id"] or uuid.uuid4().hex[:22]
        record = Config(RESOURCE_BROKER, CLUSTER_ID_KEY[0], CLUSTER_ID_KEY[1], new_id)
        self.propose([record])
        log.info("controller %d: writing cluster id %s", self.node_id, new_id)

    def _learn_cluster_id(self) -> None:
        cid = cluster_id_of(self.images.committed)
        if cid is None or cid == self.cluster_id:
            return
        self.cluster_id = cid
        if hasattr(self, "transport"):
            self.transport.cluster_id = cid
        self._write_meta_properties()

    async def _maybe_snapshot(self) -> None:
        if (
            self._since_snapshot_records < self.config["metadata.snapshot.max.records"]
            and self._since_snapshot_bytes < self.config["metadata.snapshot.max.bytes"]
        ):
            return
        image = self.images.committed
        if image.offset <= self.node.log.snapshot_index or image.offset > self.node.applied_index:
            return
        snapshot = self.node.compact(image.offset, encode_snapshot(image))
        await asyncio.get_running_loop().run_in_executor(None, self.store.save_snapshot, snapshot)
        log.info(
            "controller %d: snapshot at offset %d (%d bytes) after %d records",
            self.node_id,
            snapshot.index,
            len(snapshot.data),
            self._since_snapshot_records,
        )
        self._since_snapshot_records = self._since_snapshot_bytes = 0

    # -- proposals and waiting -----------------------------------------------------

    def propose(self, records: list[MetadataRecord]) -> asyncio.Future[None]:
        """Propose one operation's records as one entry; the future resolves at commit.

        Raises NotControllerError when this node cannot propose.
        """
        if not self.active:
            raise NotControllerError(f"controller {self.node_id} is not active")
        try:
            index = self.driver.propose(encode_records(records))
        except (NotLeader, TooManyUncommitted) as e:
            raise NotControllerError(str(e)) from None
        self.images.propose(records, index, self.node.term)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[index] = (self.node.term, future)
        return future

    async def commit(self, records: list[MetadataRecord]) -> None:
        """Propose and wait for the commit; with no records, wait for what was read."""
        if records:
            await self.propose(records)
        else:
            await self.wait_applied(self.images.pending.offset)

    async def wait_applied(self, offset: int) -> None:
        """Until the committed image reaches ``offset`` (NotControllerError if leadership
        is lost meanwhile)."""
        term = self.node.term
        while self.images.committed.offset < offset:
            if not self.active or self.node.term != term:
                raise NotControllerError("leadership lost while waiting for a commit")
            await self.wait_applied_change()

    async def wait_applied_change(self, timeout_s: float | None = None) -> None:
        """Until the next apply or leadership change (or ``timeout_s``)."""
        assert self._applied is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._applied), timeout_s)

    def _notify_applied(self) -> None:
        assert self._applied is not None
        if not self._applied.done():
            self._applied.set_result(None)
        self._applied = asyncio.get_running_loop().create_future()

    def _fail_waiters(self, reason: str) -> None:
        waiters, self._waiters = self._waiters, {}
        for _, future in waiters.values():
            if not future.done():
                future.set_exception(NotControllerError(reason))

    async def _controller_ticker(self) -> None:
        """Session expiry and leader rebalance, on the active controller only."""
        interval_s = self.config["controller.tick.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval_s)
            if not self.active or self.ctl is None:
                continue
            records, _ = self.ctl.tick(self.images.pending, monotonic_ms())
            if records:
                with contextlib.suppress(NotControllerError):
                    self.propose(records).add_done_callback(_ignore_result)

    def not_controller(self) -> Response:
        """NOT_CONTROLLER with where to go instead (leader id, host, port; -1/"" unknown)."""
        leader = self.node.leader_id
        host, port = self.voters.get(leader, ("", -1)) if leader is not None else ("", -1)
        return Response(
            {
                "error_code": NOT_CONTROLLER,
                "error_message": f"controller {self.node_id} is not active; leader: {leader}",
                "leader_id": -1 if leader is None else leader,
                "leader_host": host,
                "leader_port": port,
            }
        )

    # -- meta.properties ------------------------------------------------------------

    def _read_meta_properties(self) -> dict[str, str]:
        path = self.log_dir / META_PROPERTIES
        if not path.exists():
            return {}
        pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        return {k.strip(): v.strip() for k, v in pairs}

    def _check_meta_properties(self) -> None:
        meta = self._read_meta_properties()
        if meta.get("node.id", str(self.node_id)) != str(self.node_id):
            raise InvalidConfigError(
                f"{self.log_dir} belongs to node {meta['node.id']}, not {self.node_id}"
            )
        self._meta_cluster_id = meta.get("cluster.id")

    def _write_meta_properties(self) -> None:
        known = getattr(self, "_meta_cluster_id", None)
        if known and known != self.cluster_id:
            raise InvalidConfigError(
                f"{self.log_dir} belongs to cluster {known}, but the "
                f"quorum's cluster id is {self.cluster_id}"
            )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.log_dir / (META_PROPERTIES + ".tmp")
        tmp.write_text(f"node.id={self.node_id}\ncluster.id={self.cluster_id}\nversion=1\n")
        tmp.replace(self.log_dir / META_PROPERTIES)
        self._meta_cluster_id = self.cluster_id


def _ignore_result(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a lost leadership is not worth a warning here


def request_handler_guard(server: ControllerServer, request: Request) -> Response | None:
    """NOT_CONTROLLER unless this node is the active controller (used by handlers)."""
    if not server.active or server.ctl is None:
        return server.not_controller()
    return None


__all__ = ["ControllerServer", "schemas"]
