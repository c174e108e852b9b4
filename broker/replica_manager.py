"""``ReplicaManager``: this broker's partitions, each a local log plus its replication core
(``PartitionState``), driven from metadata deltas, produce/fetch handlers and a tick.

This is the thin asyncio driver around broker/replication/partition_state.py
(docs/design.md, "Cores and drivers"): it feeds the core events (metadata, appends,
follower fetches, AlterPartition answers, time) and applies the effects each call returns,
in order:

| effect | what the driver does |
|---|---|
| AssignEpochStartOffset | record the epoch in the log's leader-epoch cache |
| UpdateHighWatermark | set `log.high_watermark` (retention, compaction stop there); wake fetches |
| ProposeAlterPartition | send AlterPartition to the controller, feed the answer back |
| CompleteProduce / FailProduce | resolve the acks=all produce's future with the code |
| Truncate / TruncateFullyAndStartAt | cut the follower's log |
| AppendFetched | append the fetched bytes as follower (the fetcher passes them in) |

Followers fetch through broker/replication/fetcher.py (one fetcher per source broker); after every
metadata change ``on_roles_changed`` (the FetcherManager's ``sync``) moves partitions
between fetchers. High watermarks are checkpointed to ``replication-offset-checkpoint``
in the log dir (broker/replication/hw_checkpoint.py) every
``replica.high.watermark.checkpoint.interval.ms`` and on shutdown, and read back when a
partition is opened, so a restarted leader does not start at HW 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rillet.broker.config import BrokerConfig, topic_log_config
from rillet.broker.replication import hw_checkpoint
from rillet.broker.replication.partition_state import PartitionState
from rillet.broker.replication.types import (
    AlterPartitionResponse,
    AppendFetched,
    AssignEpochStartOffset,
    CompleteProduce,
    Effect,
    FailProduce,
    ProposeAlterPartition,
    ReplicationConfig,
    Truncate,
    TruncateFullyAndStartAt,
    UpdateHighWatermark,
)
from rillet.client.runtime.tasks import on_death_fatal
from rillet.client.wire import errors
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    NO_LEADER,
    RESOURCE_TOPIC,
    MetadataDelta,
    MetadataImage,
    Partition,
    TopicPartition,
)
from rillet.storage import Log, LogManager

logger = logging.getLogger(__name__)

AlterPartitionSender = Callable[
    [str, int, ProposeAlterPartition], Awaitable[AlterPartitionResponse]
]
REQUEST_TIMED_OUT = errors.code_of("REQUEST_TIMED_OUT")


@dataclass(slots=True, eq=False)
class Replica:
    """One partition on this broker: its log, its replication core, and the fetches
    waiting for it to grow."""

    topic: str
    partition: int
    topic_id: str
    log: Log
    state: PartitionState
    min_insync_replicas: int
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def is_leader(self) -> bool:
        return self.state.is_leader

    def wake(self) -> None:
        """Wake every fetch waiting on this partition (new data, HW move, role change)."""
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)


class ReplicaManager:
    def __init__(
        self,
        config: BrokerConfig,
        logs: LogManager,
        alter_partition: AlterPartitionSender | None = None,
    ) -> None:
        self.config = config
        self.broker_id = config.node_id
        self.logs = logs
        self.alter_partition = alter_partition
        self.image: MetadataImage = EMPTY_IMAGE
        self.replicas: dict[TopicPartition, Replica] = {}
        self.replication = ReplicationConfig(config["replica.lag.time.max.ms"])
        self._produce_waiters: dict[int, asyncio.Future[int]] = {}
        self._produce_ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self._metadata_waiters: list[asyncio.Future[None]] = []
        self.on_roles_changed: Callable[[], None] | None = None  # the fetchers' sync
        self._checkpointed_hw: dict[TopicPartition, int] = {}
        self._checkpoint_lock = asyncio.Lock()

    # -- clock -------------------------------------------------------------------------

    @staticmethod
    def now_ms() -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    # -- metadata ----------------------------------------------------------------------

    async def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Apply a committed metadata delta: delete removed partitions first, then take
        the leader or follower role for every partition that changed here."""
        changes = delta.local_changes(self.broker_id)
        for tp in sorted(changes.deletes):
            await self.remove(tp, delete_log=True)
        self.image = image
        if delta.changed_brokers:
            changed = delta.changed_brokers.keys()
            for replica in self.replicas.values():
                replica.state.on_brokers_changed(changed)
        now = self.now_ms()
        for tp, p in sorted(changes.leaders.items()):
            self._become(tp, p, image, now)
        for tp, p in sorted(changes.followers.items()):
            self._become(tp, p, image, now)
        self._apply_config_changes(delta, image)
        self._roles_changed()
        waiters, self._metadata_waiters = self._metadata_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_metadata(self, timeout_s: float) -> bool:
        """Wait for the next metadata change; False on timeout."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._metadata_waiters.append(waiter)
        done, _ = await asyncio.wait([waiter], timeout=timeout_s)
        if not done:
            waiter.cancel()
            self._metadata_waiters.remove(waiter)
        return bool(done)

    def _roles_changed(self) -> None:
        if self.on_roles_changed is not None:
            self.on_roles_changed()

    def broker_endpoint(self, broker_id: int, listener: str) -> tuple[str, int] | None:
        """Where another broker serves ``listener``, from the metadata image."""
        reg = self.image.brokers.get(broker_id)
        if reg is None:
            return None
        for endpoint in reg.endpoints:
            if endpoint.listener == listener:
                return endpoint.host, endpoint.port
        return None

    def _become(self, tp: TopicPartition, p: Partition, image: MetadataImage, now: int) -> None:
        replica = self.replicas.get(tp)
        if replica is not None and replica.topic_id != p.topic_id:
            # A re-created topic under the same name: its deletes ran first; be safe.
            self.apply_effects(replica, replica.state.shutdown())
            replica = None
        if replica is None:
            replica = self._open(tp, p.topic_id, image)
        state = replica.state
        if p.leader == self.broker_id:
            effects = state.become_leader(p.leader_epoch, p.partition_epoch, p.replicas, p.isr, now)
            role = "leader"
        else:
            effects = state.become_follower(
                p.leader, p.leader_epoch, p.partition_epoch, p.replicas, p.isr
            )
            role = f"follower of {p.leader}"
        # Metadata's view and the core's, side by side: they differ when the core kept a
        # newer state (an AlterPartition answer) or ignored this one as stale.
        logger.info(
            "%s-%d: %s; metadata leader epoch %d, partition epoch %d, isr %s; "
            "core leader epoch %d, partition epoch %d, isr %s, pending %s",
            tp.topic,
            tp.partition,
            role,
            p.leader_epoch,
            p.partition_epoch,
            list(p.isr),
            state.leader_epoch,
            state.partition_epoch,
            list(state.isr),
            _pending_str(state),
        )
        self.apply_effects(replica, effects)
        replica.wake()  # waiting fetches re-check their role and epoch

    def _open(self, tp: TopicPartition, topic_id: str, image: MetadataImage) -> Replica:
        topic_config = image.topic_config(tp.topic)
        # The topic id: a directory left by a deleted topic of the same name is replaced.
        log = self.logs.get_or_create(
            tp.topic,
            tp.partition,
            topic_log_config(self.logs.default_config, topic_config),
            topic_id=topic_id,
        )
        # The checkpointed HW, clamped: recovery after kill -9 may have cut the log.
        hw = self._checkpointed_hw.get(tp, 0)
        hw = max(min(hw, log.log_end_offset), log.log_start_offset)
        log.high_watermark = hw
        state = PartitionState(
            self.broker_id,
            log,
            self.replication,
            high_watermark=hw,
            is_isr_eligible=self.is_isr_eligible,
        )
        replica = Replica(tp.topic, tp.partition, topic_id, log, state, self._min_isr(topic_config))
        self.replicas[tp] = replica
        return replica

    def _min_isr(self, topic_config: Mapping[str, str]) -> int:
        value = topic_config.get("min.insync.replicas")
        return int(value) if value is not None else self.config["min.insync.replicas"]

    def _apply_config_changes(self, delta: MetadataDelta, image: MetadataImage) -> None:
        changed = {name for kind, name in delta.changed_configs if kind == RESOURCE_TOPIC}
        if not changed:
            return
        for replica in self.replicas.values():
            if replica.topic in changed:
                topic_config = image.topic_config(replica.topic)
                replica.log.config = topic_log_config(self.logs.default_config, topic_config)
                replica.min_insync_replicas = self._min_isr(topic_config)

    async def delete_strays(self, image: MetadataImage) -> None:
        """Delete local logs the caught-up image does not assign here (partitions deleted
        or moved away while this broker was down)."""
        for topic, partition in sorted(self.logs.logs):
            p = image.partition(topic, partition)
            if p is None or self.broker_id not in p.replicas:
                logger.info("%s-%d: stray log (not assigned here), deleting", topic, partition)
                await self.remove(TopicPartition(topic, partition), delete_log=True)

    async def remove(self, tp: TopicPartition, *, delete_log: bool) -> None:
        replica = self.replicas.pop(tp, None)
        if replica is not None:
            self.apply_effects(replica, replica.state.shutdown())
            replica.wake()
        self._checkpointed_hw.pop(tp, None)
        self._roles_changed()
        if delete_log:
            await self.logs.delete(tp.topic, tp.partition)
            logger.info("%s-%d: log deleted", tp.topic, tp.partition)

    # -- lookups -------------------------------------------------------------------------

    def partition_error(self, topic: str, partition: int) -> int:
        """Why this broker cannot serve a partition it holds no replica of."""
        p = self.image.partition(topic, partition)
        if p is None:
            return errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")
        if p.leader == NO_LEADER:
            return errors.code_of("LEADER_NOT_AVAILABLE")
        return errors.code_of("NOT_LEADER_OR_FOLLOWER")

    def leaders(self) -> Iterable[Replica]:
        return (r for r in self.replicas.values() if r.is_leader)

    def under_replicated_count(self) -> int:
        return sum(1 for r in self.leaders() if len(r.state.isr) < len(r.state.replicas))

    # -- effects ---------------------------------------------------------------------------

    def apply_effects(
        self, replica: Replica, effects: Sequence[Effect], fetched: memoryview | None = None
    ) -> None:
        """Carry out a core call's effects, in order (docs/replication.md, "Effects")."""
        for effect in effects:
            match effect:
                case AssignEpochStartOffset(epoch, start):
                    replica.log.epochs.assign(epoch, start)
                case UpdateHighWatermark(hw):
                    replica.log.high_watermark = hw  # bounds retention and compaction
                    replica.wake()
                case CompleteProduce(pid, code) | FailProduce(pid, code):
                    future = self._produce_waiters.pop(pid, None)  # type: ignore[arg-type]
                    if future is not None and not future.done():
                        future.set_result(code)
                case ProposeAlterPartition(_, _, leader_epoch, partition_epoch, new_isr):
                    logger.info(
                        "%s: proposing ISR %s (leader epoch %d, partition epoch %d)",
                        replica.log.name,
                        list(new_isr),
                        leader_epoch,
                        partition_epoch,
                    )
                    self._spawn(self._send_alter_partition(replica, effect))
                case Truncate(offset):
                    replica.log.truncate_to(offset)  # also drops empty epochs at the end
                case TruncateFullyAndStartAt(offset):
                    replica.log.truncate_fully_and_start_at(offset)
                case AppendFetched():
                    if fetched is None:
                        raise ValueError("AppendFetched without the fetched bytes")
                    replica.log.append_as_follower(fetched)
                    replica.wake()

    async def _send_alter_partition(
        self, replica: Replica, proposal: ProposeAlterPartition
    ) -> None:
        try:
            if self.alter_partition is None:
                raise errors.RequestTimedOutError("no controller channel")
            response = await self.alter_partition(replica.topic, replica.partition, proposal)
        except errors.RilletError as e:
            response = AlterPartitionResponse(e.code)
        except Exception:  # a bug or a dropped channel: the core resends on its next tick
            logger.exception("%s: AlterPartition failed", replica.log.name)
            response = AlterPartitionResponse(REQUEST_TIMED_OUT)
        logger.info(
            "%s: AlterPartition answered %s, isr %s, partition epoch %d",
            replica.log.name,
            errors.error_name(response.error_code),
            list(response.isr),
            response.partition_epoch,
        )
        if self.replicas.get(TopicPartition(replica.topic, replica.partition)) is replica:
            state = replica.state
            self.apply_effects(
                replica, state.on_alter_partition_response(proposal.proposal_id, response)
            )
            logger.info(
                "%s: after AlterPartition %d: core leader epoch %d, partition epoch "
                "%d, isr %s, pending %s",
                replica.log.name,
                proposal.proposal_id,
                state.leader_epoch,
                state.partition_epoch,
                list(state.isr),
                _pending_str(state),
            )

    def is_isr_eligible(self, broker_id: int) -> bool:
        """Registered and unfenced in this broker's image (the core asks before it
        proposes an ISR expansion; the controller checks again)."""
        return self.image.is_unfenced(broker_id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        # Policy fatal: the task feeds the AlterPartition answer back into the core and
        # applies its effects; if that raises, the core's state and the log disagree.
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        on_death_fatal(task, "applying an AlterPartition answer")

    # -- produce -----------------------------------------------------------------------------

    def after_append(self, replica: Replica, now: int) -> None:
        """The leader appended: the HW may move (single-replica ISR: at once)."""
        self.apply_effects(replica, replica.state.on_leader_append(replica.log.log_end_offset, now))
        replica.wake()  # follower fetches read up to the log end, not the HW

    def await_produce(
        self, replica: Replica, required_offset: int, deadline_ms: int
    ) -> asyncio.Future[int]:
        """A future for an appended acks=all produce: its error code once the HW passes
        ``required_offset`` (or REQUEST_TIMED_OUT / NOT_LEADER_OR_FOLLOWER)."""
        pid = next(self._produce_ids)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._produce_waiters[pid] = future
        effects = replica.state.await_produce(
            pid, required_offset, replica.min_insync_replicas, deadline_ms
        )
        self.apply_effects(replica, effects)
        return future

    # -- time --------------------------------------------------------------------------------

    def tick(self) -> None:
        """Expire acks=all waiters, resend AlterPartitions, propose ISR shrinks."""
        now = self.now_ms()
        for replica in list(self.replicas.values()):
            if replica.is_leader or replica.state.pending_produce_count:
                self.apply_effects(replica, replica.state.tick(now))

    async def run_ticks(self) -> None:
        """Tick forever. No catch here: a tick that raises has left some core waiting on
        effects that were never applied (an AlterPartition never sent, a produce never
        answered), so the server runs this task under the fatal policy."""
        interval = self.config["replica.tick.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            self.tick()

    # -- high-watermark checkpoint -----------------------------------------------------------

    def load_hw_checkpoint(self) -> None:
        """Read ``replication-offset-checkpoint`` (once, before any partition opens)."""
        self._checkpointed_hw = hw_checkpoint.read(self.logs.data_dir)

    def hw_entries(self) -> dict[TopicPartition, int]:
        """Every open partition's HW, plus checkpointed ones not reopened yet (a broker
        that just started has not heard from metadata which logs it still holds)."""
        entries = {
            tp: hw
            for tp, hw in self._checkpointed_hw.items()
            if tp not in self.replicas and (tp.topic, tp.partition) in self.logs.logs
        }
        for tp, replica in self.replicas.items():
            entries[tp] = replica.state.high_watermark
        return entries

    async def checkpoint_high_watermarks(self) -> None:
        entries = self.hw_entries()
        async with self._checkpoint_lock:  # two writers must not race on the temp file
            write = asyncio.get_running_loop().run_in_executor(
                None, hw_checkpoint.write, self.logs.data_dir, entries
            )
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # Cancelling the periodic task (shutdown) does not stop the thread: hold
                # the lock until it is done, or the final checkpoint's writer truncates
                # and renames the same temp file under it (seen as FileNotFoundError).
                with contextlib.suppress(Exception):
                    await write
                raise

    async def run_hw_checkpoints(self) -> None:
        interval = self.config["replica.high.watermark.checkpoint.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.checkpoint_high_watermarks()
            except OSError:
                logger.exception("high-watermark checkpoint failed")

    async def shutdown(self) -> None:
        """Stop every partition (pending acks=all produces fail NOT_LEADER_OR_FOLLOWER)
        and write the final high-watermark checkpoint."""
        for replica in list(self.replicas.values()):
            self.apply_effects(replica, replica.state.shutdown())
            replica.wake()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        try:
            await self.checkpoint_high_watermarks()
        except OSError:
            logger.exception("final high-watermark checkpoint failed")
        self.replicas.clear()


def _pending_str(state: PartitionState) -> str:
    pending = state.pending_isr_change
    if pending is None:
        return "none"
    return f"{pending.kind} to {list(pending.proposal.new_isr)}"
