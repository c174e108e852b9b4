"""The controller node: the I/O around the Raft driver and the controller state machine.

``ControllerServer(config)`` with ``await start()`` / ``await stop()`` runs in-process, so
a combined-mode node runs it beside a broker in the same loop. Pieces:

- `raft.driver.RaftDriver` around `RaftNode`, given the real network
  (`raft.transport.RaftTransport`), storage (`raft.store.RaftStore`) and clock, and
  scheduled by `raft.driver.AsyncRaftLoop` (fsyncs in the default executor);
- `state_machine.ControllerStateMachine`, the sans-I/O core the driver applies to:
  images, leadership, cluster id, snapshot policy, pending proposals (the Raft
  simulation runs the same object);
- the RPC handlers (`controller/handlers.py`) that turn requests into `QuorumController`
  operations on the active controller and answer NOT_CONTROLLER elsewhere;
- ``meta.properties`` in ``metadata.log.dir``: it remembers node id and cluster id and
  refuses a directory of another node or cluster.

The cluster id is written once, as the first record of a new quorum's first active
controller: ``Config(RESOURCE_BROKER, "", "cluster.id", id)`` (Kafka keeps cluster-wide
broker settings under the empty broker name). It lives in the image and in snapshots, so
a controller that lost its disk learns it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rillet.client.runtime.looplag import HeapFreezer, LoopLagMonitor
from rillet.client.runtime.rpc_server import Response, RpcServer, rpc_limits
from rillet.client.runtime.shutdown import unless_set
from rillet.client.wire.errors import (
    InvalidConfigError,
    NotControllerError,
    RilletError,
    code_of,
)
from rillet.controller.config import parse_listeners, parse_voters, require_node_id
from rillet.controller.metadata.image import MetadataImage, MetadataRecord, encode_snapshot
from rillet.controller.metadata.quorum import ControllerConfig, PendingImages, QuorumController
from rillet.controller.metadata.topic_config import topic_defaults_of
from rillet.controller.metrics import ControllerMetrics, elects_leaders
from rillet.controller.raft.core import RaftConfig, RaftNode, Role
from rillet.controller.raft.driver import AsyncRaftLoop, RaftDriver, monotonic_ms
from rillet.controller.raft.store import RaftStore
from rillet.controller.raft.transport import RaftTransport
from rillet.controller.state_machine import ControllerStateMachine, SnapshotPolicy

log = logging.getLogger(__name__)
# Records applied between two freezes of the heap (client/runtime/looplag.py).
FREEZE_AFTER_RECORDS = 5000
# An operation of this many records is encoded into entries on a worker thread.
SPLIT_OFF_LOOP_RECORDS = 1000

T = TypeVar("T")
# An operation: (records to propose, its answer) from the pending image it reads.
Plan = Callable[[MetadataImage], tuple[list[MetadataRecord], T]]

META_PROPERTIES = "meta.properties"
NOT_CONTROLLER = code_of("NOT_CONTROLLER")


def controller_config_of(config: Mapping[str, Any]) -> ControllerConfig:
    try:
        topic_defaults = topic_defaults_of(config)
    except ValueError as e:
        raise InvalidConfigError(f"log.* (the brokers' topic defaults): {e}") from None
    return ControllerConfig(
        broker_session_timeout_ms=config["broker.session.timeout.ms"],
        broker_heartbeat_interval_ms=config["broker.heartbeat.interval.ms"],
        default_num_partitions=config["num.partitions"],
        default_replication_factor=config["default.replication.factor"],
        auto_leader_rebalance_enable=config["auto.leader.rebalance.enable"],
        leader_imbalance_per_broker_percentage=config["leader.imbalance.per.broker.percentage"],
        leader_imbalance_check_interval_ms=config["leader.imbalance.check.interval.ms"],
        max_partitions=config["max.partitions"],
        max_broker_partitions=config["max.broker.partitions"],
        topic_defaults=topic_defaults,
    )


def snapshot_policy_of(config: Mapping[str, Any]) -> SnapshotPolicy:
    return SnapshotPolicy(
        max_records=config["metadata.snapshot.max.records"],
        max_bytes=config["metadata.snapshot.max.bytes"],
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
        self.machine = ControllerStateMachine(
            self.node_id,
            self.controller_config,
            snapshot_policy_of(config),
            new_cluster_id=lambda: config["cluster.id"] or uuid.uuid4().hex[:22],
            rng=random.Random(),
            on_applied=self._notify_applied,
            on_cluster_id=self._on_cluster_id,
            snapshot_encoder=self._encode_snapshot_off_loop,
        )
        self.failure: asyncio.Future[BaseException] | None = None
        self._applied: asyncio.Future[None] | None = None  # resolved and replaced per apply
        self._writing = asyncio.Lock()  # one operation plans and proposes at a time (write)
        self._meta_cluster_id: str | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self.loop_lag = LoopLagMonitor(
            f"controller-{self.node_id}", warn_ms=config["event.loop.stall.warn.ms"], watchdog=True
        )
        self.heap = HeapFreezer(f"controller-{self.node_id}", FREEZE_AFTER_RECORDS)
        self._records_seen = 0
        # Milliseconds, monotonic: session deadlines and the Raft timers read it.
        self.clock: Callable[[], int] = monotonic_ms
        # Kafka-named metrics in this node's own registry (controller/metrics.py).
        self.metrics = ControllerMetrics(self)
        self.node: RaftNode
        self.store: RaftStore
        self.transport: RaftTransport
        self.driver: RaftDriver
        self.raft_loop: AsyncRaftLoop
        self.rpc: RpcServer

    # The state machine's view, as the handlers read it.

    @property
    def images(self) -> PendingImages:
        return self.machine.images

    @property
    def ctl(self) -> QuorumController | None:
        return self.machine.ctl

    @property
    def active(self) -> bool:
        return self.machine.active

    @property
    def cluster_id(self) -> str | None:
        return self.machine.cluster_id

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.failure = loop.create_future()
        self._applied = loop.create_future()
        self.loop_lag.start()
        self._check_meta_properties()
        self.store = await loop.run_in_executor(None, RaftStore, self.log_dir)
        state = await loop.run_in_executor(None, self.store.load)
        self.machine.restore(state.snapshot)
        raft_config = RaftConfig(
            node_id=self.node_id,
            voters=tuple(sorted(self.voters)),
            election_timeout_ms=self.config["quorum.election.timeout.ms"],
            heartbeat_interval_ms=self.config["quorum.heartbeat.interval.ms"],
            prevote_on_leader_loss=self.config["quorum.prevote.on.leader.loss.enable"],
        )
        self.node = RaftNode(raft_config, state, rng=random.Random(), now_ms=self.clock())
        self.transport = RaftTransport(
            self.node_id,
            self.voters,
            self._on_raft_message,
            timeout_ms=self.config["quorum.fetch.timeout.ms"],
            on_unreachable=self._on_voter_unreachable,
            clock=self.clock,
        )
        self.transport.cluster_id = self.cluster_id
        self.driver = RaftDriver(self.node, self.store, self.transport, self.machine, self.clock)
        self.machine.bind(self.node, self.driver.propose)
        self.raft_loop = AsyncRaftLoop(
            self.driver,
            tick_interval_ms=self.config["quorum.tick.interval.ms"],
            on_failure=self._fail,
        )
        from rillet.controller.handlers import build_handlers  # handlers import this module

        self.rpc = RpcServer(
            build_handlers(self),
            name=f"controller-{self.node_id}",
            **rpc_limits(self.config),
        )
        await self.rpc.start(*self.bind_address)
        self.transport.start()
        self.raft_loop.start()
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

    async def stop(
        self, transfer_leadership: bool = True, cut_short: asyncio.Event | None = None
    ) -> None:
        """Hand leadership over (TimeoutNow) if leading, then stop everything and flush.
        Setting ``cut_short`` (a second signal) ends the hand-over wait at once."""
        if transfer_leadership and self.raft_loop.failure is None:
            await unless_set(cut_short, self._transfer_leadership())
        if self._tick_task is not None:
            self._tick_task.cancel()
        await self.rpc.stop()
        await self.raft_loop.stop()
        await self.transport.stop()
        self.machine.fail_waiters("controller stopped")
        self.loop_lag.stop()
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
            **self.loop_lag.snapshot(),
        }

    # -- Raft plumbing -------------------------------------------------------------

    def _encode_snapshot_off_loop(
        self, image: MetadataImage, done: Callable[[bytes | None], None]
    ) -> None:
        """Encode on a worker thread (the image is immutable); hand the bytes over on the
        loop and wake the driver, which gives them to the node at its next Ready. Raft
        keeps running meanwhile: a snapshot of 50,000 partitions took about a second."""
        future = asyncio.get_running_loop().run_in_executor(None, encode_snapshot, image)

        def finished(f: asyncio.Future[bytes]) -> None:
            if f.cancelled():
                done(None)
                return
            error = f.exception()
            if error is not None:
                log.error("controller %d: snapshot encoding failed: %r", self.node_id, error)
                done(None)
                return
            done(f.result())
            self.driver.poke()

        future.add_done_callback(finished)

    def _on_raft_message(self, msg: Any) -> None:
        self.driver.step(msg)

    def _on_voter_unreachable(self, node_id: int, since_ms: int) -> None:
        self.driver.peer_unreachable(node_id, since_ms)

    def _on_cluster_id(self, cluster_id: str) -> None:
        if hasattr(self, "transport"):  # not yet when restoring the stored snapshot
            self.transport.cluster_id = cluster_id
        self._write_meta_properties()

    # -- proposals and waiting -----------------------------------------------------

    def propose(self, records: list[MetadataRecord]) -> asyncio.Future[None]:
        """Propose an operation's records (bounded entries, all at once); the future
        resolves when the last commits. Raises NotControllerError when this node cannot
        propose."""
        future, settle = self._commit_future()
        self.machine.propose(records, settle)
        return future

    def _commit_future(self) -> tuple[asyncio.Future[None], Callable[[Exception | None], None]]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(error: Exception | None) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        return future, settle

    async def propose_yielding(self, records: list[MetadataRecord]) -> asyncio.Future[None]:
        """`propose`, giving the loop a turn between entries, so that a large operation
        (thousands of records) never holds it for long: Raft messages, heartbeats and
        other requests run in between. Returns the future of the last entry's commit.
        Operations call it through `write`, which keeps every other operation from
        planning or proposing until the last entry is proposed.

        Every entry is encoded and checked (`ControllerStateMachine.split_checked`)
        before the first is proposed, on a worker thread for a large operation: one
        that cannot be written whole (a record over the entry limit) is refused with
        PolicyViolationError and leaves nothing in the log."""
        future, settle = self._commit_future()
        if len(records) >= SPLIT_OFF_LOOP_RECORDS:
            chunks = await self.off_loop(self.machine.split_checked, records)
        else:
            chunks = self.machine.split_checked(records)
        for chunk in chunks[:-1]:
            self.machine.propose_chunk(chunk)
            await asyncio.sleep(0)
        self.machine.propose_chunk(chunks[-1], settle)
        return future

    async def write(
        self, ctl: QuorumController, plan: Plan[T]
    ) -> tuple[T, asyncio.Future[None] | None, int]:
        """Run ``plan`` on the pending image and propose every entry of its records, with
        no other operation planning or proposing in between: the entries of a large
        operation go out over several loop turns, and the rest of them was planned on an
        image without whatever another operation would propose meanwhile (three
        controlled shutdowns at once: one's later entry named as leader a broker another
        had just taken out of the ISR; that entry reached the Raft log before the pending
        image refused it, and every controller died applying it). Returns the plan's
        answer, the last entry's commit future (None: nothing to propose) and the pending
        offset the plan read. NotControllerError when ``ctl`` is no longer this node's
        controller by the time the operation's turn comes."""
        async with self._writing:
            if not self.active or self.ctl is not ctl:
                raise NotControllerError("leadership changed while waiting to write")
            planned = self.metrics.clock()
            read = self.images.pending.offset
            records, answer = plan(self.images.pending)
            proposed = self.metrics.clock()
            committed = await self.propose_yielding(records) if records else None
        if committed is not None:
            self._time_commit(committed, planned, proposed, elects_leaders(records))
        return answer, committed, read

    def _time_commit(
        self, committed: asyncio.Future[None], planned: float, proposed: float, election: bool
    ) -> None:
        """Commit latency (Raft) and, for an operation that moves leaderships, the
        election time (planning to commit), once it commits."""
        metrics = self.metrics

        def done(future: asyncio.Future[None]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            now = metrics.clock()
            metrics.commits.observe((now - proposed) * 1000)
            if election:
                metrics.elections.observe((now - planned) * 1000)

        committed.add_done_callback(done)

    async def commit_within(
        self, ctl: QuorumController, plan: Plan[T], timeout_ms: int
    ) -> tuple[T, bool]:
        """`write`, then wait at most ``timeout_ms`` (0 or less: as long as it takes) for
        the commit, or with no records for what the plan read: (answer, False) when the
        wait timed out (the proposal goes on)."""
        answer, committed, read = await self.write(ctl, plan)
        try:
            async with asyncio.timeout(timeout_ms / 1000 if timeout_ms > 0 else None):
                if committed is None:
                    await self.wait_applied(read)
                else:
                    await asyncio.shield(committed)
        except TimeoutError:
            if committed is not None:
                committed.add_done_callback(retrieve_outcome)
            return answer, False
        return answer, True

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread (a pure planner on an immutable image)."""
        return await asyncio.to_thread(fn, *args)

    async def commit(self, ctl: QuorumController, plan: Plan[T]) -> T:
        """`write` and wait for the commit; with no records, for what the plan read."""
        answer, committed, read = await self.write(ctl, plan)
        if committed is not None:
            await committed
        else:
            await self.wait_applied(read)
        return answer

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
        applied = self.machine.applied_records
        self.heap.grew(applied - self._records_seen)
        self._records_seen = applied
        self.metrics.applied()
        if not self._applied.done():
            self._applied.set_result(None)
        self._applied = asyncio.get_running_loop().create_future()

    async def _controller_ticker(self) -> None:
        """Session expiry and leader rebalance, on the active controller only."""
        interval_s = self.config["controller.tick.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval_s)
            ctl = self.ctl
            if ctl is None or not self.active:
                continue
            with contextlib.suppress(NotControllerError):
                # Fencing a broker that leads thousands of partitions: a long proposal.
                _, committed, _ = await self.write(
                    ctl, lambda image: (self.machine.tick_records(self.clock()), None)
                )
                if committed is not None:
                    # Nobody waits for the commit; a lost leadership fails it quietly.
                    committed.add_done_callback(retrieve_outcome)

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
        known = self._meta_cluster_id
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


def retrieve_outcome(future: asyncio.Future[None]) -> None:
    """Mark a commit future's error as seen when nobody awaits it any more (asyncio logs
    an error for an exception never retrieved)."""
    if not future.cancelled():
        future.exception()


__all__ = ["ControllerServer", "retrieve_outcome"]
