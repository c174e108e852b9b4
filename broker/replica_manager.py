"""``ReplicaManager``: this broker's partitions (``Replica``: a local log, its replication
core and the ``PartitionDriver`` running it), driven from metadata deltas, the Produce
and Fetch handlers, and a tick.

It owns the whole produce and fetch sequences, as Kafka's ReplicaManager does, so the API
handlers only decode, call and encode:

- ``append_records``: per partition, find the replica, let its driver check the produce
  with the core, append, move the HW; then wait for acks=all produces in the core's
  purgatory. Every append happens before its first ``await`` (Produce pipelining).
- ``fetch_messages``: per partition, check or record the fetcher's position through the
  core, read a byte range of the log (broker/replica_fetch.py), long-poll until
  ``min_bytes`` or ``max_wait_ms``; returns the ranges for zero-copy sending. Consumer
  offsets that left local disk are read from the remote tier, all of one fetch at once
  (broker/remote_fetch.py).

Effects the cores return are carried out by ``PartitionDriver.apply``
(broker/replication/driver.py), the interpreter the simulator runs too; this module
supplies its I/O: the storage.Log, the ``AlterPartitionManager`` that batches every
AlterPartition of this broker into one request at a time
(broker/link/alter_partition_manager.py), the futures of acks=all produces and the parked
fetches (``Replica`` is the driver's network).

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rillet.broker.config import BrokerConfig, topic_log_config
from rillet.broker.fetch_session import FetchSession
from rillet.broker.link.alter_partition_manager import (
    AlterPartitionManager,
    AlterPartitionsSender,
    Proposal,
)
from rillet.broker.remote_fetch import RemoteLogViews, RemoteRead, read_remote
from rillet.broker.replica import FetchWatch, Replica
from rillet.broker.replica_fetch import (
    CONSUMER,
    FetchParams,
    FetchPartition,
    FetchPartitionResult,
    FetchReader,
    FetchResult,
)
from rillet.broker.replication import hw_checkpoint
from rillet.broker.replication.partition_state import PartitionState
from rillet.broker.replication.types import (
    ACKS_ALL,
    AlterPartitionResponse,
    ProposeAlterPartition,
    ReplicationConfig,
)
from rillet.client.runtime.looplag import HeapFreezer
from rillet.client.wire import errors
from rillet.client.wire.errors import RilletError
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    NO_LEADER,
    RESOURCE_TOPIC,
    MetadataDelta,
    MetadataImage,
    Partition,
    TopicPartition,
)
from rillet.storage import Log, LogConfig, LogManager

if TYPE_CHECKING:
    from rillet.broker.metrics import BrokerMetrics
    from rillet.broker.remote_log_manager import RemoteLogManager
    from rillet.storage.remote.reader import Held

logger = logging.getLogger(__name__)


NONE = errors.NONE
REQUEST_TIMED_OUT = errors.code_of("REQUEST_TIMED_OUT")
NOT_ENOUGH_REPLICAS = errors.code_of("NOT_ENOUGH_REPLICAS")
NOT_ENOUGH_REPLICAS_AFTER_APPEND = errors.code_of("NOT_ENOUGH_REPLICAS_AFTER_APPEND")
STORAGE_ERROR = errors.code_of("KAFKA_STORAGE_ERROR")


@dataclass(slots=True)
class AppendResult:
    """One partition's Produce outcome (Kafka: PartitionResponse). ``base_offset`` is -1
    unless the records were appended and, for acks=all, replicated (or written below
    min.insync.replicas: NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""

    topic: str
    partition: int
    error_code: int
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


# Partitions that take their role in one loop turn when a metadata delta is applied.
ROLES_PER_TURN = 200
# Replicas ticked per event-loop turn by run_ticks.
TICK_SLICE = 1000


class ReplicaManager:
    def __init__(
        self,
        config: BrokerConfig,
        logs: LogManager,
        alter_partitions: AlterPartitionsSender | None = None,
    ) -> None:
        self.config = config
        self.broker_id = config.node_id
        self.logs = logs
        # Every ISR proposal of this broker's leaders goes through one queue, so one
        # request carries all of them (broker/link/alter_partition_manager.py).
        self.alter_partitions = AlterPartitionManager(alter_partitions or _no_controller)
        self.image: MetadataImage = EMPTY_IMAGE
        self.replicas: dict[TopicPartition, Replica] = {}
        # Replicas whose core may have something to do on a tick (Replica.activate):
        # walking every replica each tick cost 9-12 ms per 3,333 idle leaders.
        self._ticking: dict[Replica, None] = {}
        self.replication = ReplicationConfig(config["replica.lag.time.max.ms"])
        self._produce_ids = itertools.count(1)
        self.metrics: BrokerMetrics | None = None  # set by the server once built
        # The remote (S3) tier, when the broker has one (set by the server): it copies
        # and deletes, and its ``reader`` serves offsets below a local log start.
        self.remote: RemoteLogManager | None = None
        # Freezes the heap after thousands of partitions were taken on (set by the server).
        self.heap: HeapFreezer | None = None
        self._reader = FetchReader(
            self.broker_id,
            self.replicas,
            lambda: self.image,
            self.partition_error,
            lambda: self.remote,
        )
        self._refusal_logged_ms: dict[str, int] = {}
        self._untiered_warned: set[str] = set()  # tiered topics this broker cannot tier
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
        await self.remove_many(sorted(changes.deletes), delete_log=True)
        for tp, p in sorted({**changes.leaders, **changes.followers}.items()):
            await self._remove_if_recreated(tp, p.topic_id)
        await self._create_logs({**changes.leaders, **changes.followers}, image)
        if delta.changed_brokers:
            changed = delta.changed_brokers.keys()
            for replica in self.replicas.values():
                replica.driver.on_brokers_changed(changed)
        # The roles are taken ROLES_PER_TURN at a time with a loop turn in between (the
        # 10,000 partitions of one CreateTopics held the loop for over a second), and the
        # image is published only once all are: a request that sees the new image (a
        # CreateTopics waiting for it) must find the new partitions' replicas. Meanwhile
        # requests read the old image, and a replica's own state answers for its role.
        roles = [*sorted(changes.leaders.items()), *sorted(changes.followers.items())]
        for n, (tp, p) in enumerate(roles):
            if n and n % ROLES_PER_TURN == 0:
                await asyncio.sleep(0)
            self._become(tp, p, image)
        self.image = image
        if changes.leaders or changes.followers or changes.deletes:
            # One line per delta: with thousands of partitions, a line per partition per
            # leader or ISR change drowned the log (each partition is logged at DEBUG).
            logger.info(
                "metadata offset %d: leader of %s, follower of %s, removed %s",
                image.offset,
                some_partitions(changes.leaders),
                some_partitions(changes.followers),
                some_partitions(changes.deletes),
            )
        self._apply_config_changes(delta, image)
        if self.remote is not None:  # after the roles: the replicas it updates exist
            self.remote.on_metadata(delta, image, [*changes.leaders, *changes.followers])
        # Even with the tier off here: the image may hold a partition's segments.
        self.views.retain(image, self._holds)
        self._roles_changed()
        if self.heap is not None:
            self.heap.grew(len(changes.leaders) + len(changes.followers))
        waiters, self._metadata_waiters = self._metadata_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _create_logs(
        self, assigned: Mapping[TopicPartition, Partition], image: MetadataImage
    ) -> None:
        """Create the logs of newly assigned partitions on a worker thread. Each new log
        costs a mkdir and two fsyncs (its partition.metadata and its directory), plus
        one data-dir fsync for the whole batch: for the thousands of partitions one CreateTopics
        can assign, that held the loop for minutes, its heartbeats stopped and the
        controller fenced the broker. Nothing else opens these logs meanwhile: metadata
        deltas are applied one at a time, and the rest of the broker finds no replica."""
        new = [
            (
                tp,
                p.topic_id,
                topic_log_config(self.logs.default_config, image.topic_config(tp.topic)),
            )
            for tp, p in sorted(assigned.items())
            if self.logs.get(tp.topic, tp.partition) is None
        ]
        if not new:
            return

        heap = self.heap

        def grew(_: Log) -> None:
            if heap is not None:  # the logs are most of what grows: freeze as they do
                heap.grew(1)

        def open_all() -> list[Log]:
            # One batch: the data dir is fsynced once for all of them, not once a log.
            specs = [(tp.topic, tp.partition, cfg, topic_id) for tp, topic_id, cfg in new]
            return self.logs.open_unregistered_many(specs, grew)

        logs = await asyncio.get_running_loop().run_in_executor(None, open_all)
        for (tp, _, _), log in zip(new, logs, strict=True):
            self.logs.register(tp.topic, tp.partition, log)

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

    async def _remove_if_recreated(self, tp: TopicPartition, topic_id: str) -> None:
        """Delete a replica or log of a topic deleted and re-created under the same name
        whose delete this broker never saw (down meanwhile, then restarted from a
        metadata snapshot that already holds the new topic). Through the one async
        delete path: it waits for the old log's background work, which addresses files
        by the path the new log is about to take."""
        replica = self.replicas.get(tp)
        if (replica is None or replica.topic_id == topic_id) and not self.logs.is_stale(
            tp.topic, tp.partition, topic_id
        ):
            return
        logger.warning(
            "%s-%d: the local replica belongs to a deleted topic of the same name "
            "(metadata now names topic id %s): deleting it",
            tp.topic,
            tp.partition,
            topic_id,
        )
        await self.remove(tp, delete_log=True)

    def _become(self, tp: TopicPartition, p: Partition, image: MetadataImage) -> None:
        replica = self.replicas.get(tp)
        if replica is None:
            replica = self._open(tp, p.topic_id, image)
        state = replica.state
        if p.leader == self.broker_id:
            replica.driver.become_leader(p.leader_epoch, p.partition_epoch, p.replicas, p.isr)
            role = "leader"
        else:
            replica.driver.become_follower(
                p.leader, p.leader_epoch, p.partition_epoch, p.replicas, p.isr
            )
            role = f"follower of {p.leader}"
        # Metadata's view and the core's, side by side: they differ when the core kept a
        # newer state (an AlterPartition answer) or ignored this one as stale.
        logger.debug(
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
        replica.wake()  # waiting fetches re-check their role and epoch

    def _open(self, tp: TopicPartition, topic_id: str, image: MetadataImage) -> Replica:
        topic_config = image.topic_config(tp.topic)
        # Records the topic id in a new directory (on_metadata removed a stale one).
        log = self.logs.get_or_create(
            tp.topic,
            tp.partition,
            topic_log_config(self.logs.default_config, topic_config),
            topic_id=topic_id,
        )
        self._warn_if_untiered(tp.topic, log.config)
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
        replica = Replica(
            tp.topic,
            tp.partition,
            topic_id,
            log,
            state,
            self._min_isr(topic_config),
            self.now_ms,
            self._send_alter_partition,
            self._ticking,
        )
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
                self._warn_if_untiered(replica.topic, replica.log.config)

    def _warn_if_untiered(self, topic: str, config: LogConfig) -> None:
        """A tiered topic on a broker without the remote tier (the controller cannot know
        broker configs to refuse it, as Kafka does). Nothing is uploaded, so nothing is
        remote, and local retention (which deletes only what is remote) keeps it all."""
        if self.remote is not None or not config.remote_storage_enable:
            return
        if topic not in self._untiered_warned:
            self._untiered_warned.add(topic)
            logger.warning(
                "topic %s has remote.storage.enable=true but this broker has no remote "
                "tier (remote.log.storage.system.enable=false): its data stays on local "
                "disk, none of it is deleted by retention, and disk use is unbounded",
                topic,
            )

    async def delete_strays(self, image: MetadataImage) -> None:
        """Delete local logs the caught-up image does not assign here (partitions deleted
        or moved away while this broker was down)."""
        strays = []
        for topic, partition in sorted(self.logs.logs):
            p = image.partition(topic, partition)
            if p is None or self.broker_id not in p.replicas:
                logger.info("%s-%d: stray log (not assigned here), deleting", topic, partition)
                strays.append(TopicPartition(topic, partition))
        await self.remove_many(strays, delete_log=True)

    async def remove(self, tp: TopicPartition, *, delete_log: bool) -> None:
        await self.remove_many([tp], delete_log=delete_log)

    async def remove_many(self, tps: Sequence[TopicPartition], *, delete_log: bool) -> None:
        """Stop serving ``tps``; with ``delete_log``, delete their logs too."""
        for tp in tps:
            replica = self.replicas.pop(tp, None)
            if replica is not None:
                replica.driver.shutdown()
                replica.wake()
            self.alter_partitions.drop(tp)
            self._checkpointed_hw.pop(tp, None)
        self._roles_changed()
        if delete_log and tps:
            # The checkpoint drops the partitions' HWs before their logs go: left on disk,
            # a crash would hand one to the next log of that name (a re-created topic),
            # which would then count records as committed that are not. One rewrite for
            # all of them: a deleted topic's partitions go in one metadata delta.
            try:
                await self.checkpoint_high_watermarks()
            except OSError:
                logger.exception(
                    "high-watermark checkpoint failed before deleting %d logs", len(tps)
                )
            for tp in tps:
                await self.logs.delete(tp.topic, tp.partition)
                logger.info("%s-%d: log deleted", tp.topic, tp.partition)

    # -- lookups -------------------------------------------------------------------------

    def partition_error(self, topic: str, partition: int) -> int:
        return partition_error(self.image, topic, partition)

    @property
    def views(self) -> RemoteLogViews:
        """Each partition's remote log, cached per image change (broker/remote_fetch.py)."""
        return self._reader.views

    def _holds(self, topic_id: str, partition: int) -> bool:
        """Whether this broker holds a replica of the partition (of that topic id)."""
        t = self.image.topics_by_id.get(topic_id)
        replica = None if t is None else self.replicas.get(TopicPartition(t.name, partition))
        return replica is not None and replica.topic_id == topic_id

    def leaders(self) -> Iterable[Replica]:
        return (r for r in self.replicas.values() if r.is_leader)

    def under_replicated_count(self) -> int:
        return sum(1 for r in self.leaders() if len(r.state.isr) < len(r.state.replicas))

    # -- AlterPartition (the driver's network sends it here) --------------------------------

    def _send_alter_partition(self, replica: Replica, proposal: ProposeAlterPartition) -> None:
        """Queued with every other pending proposal of this broker: the manager sends
        them together, one request at a time (broker/link/alter_partition_manager.py)."""
        logger.debug(
            "%s: proposing ISR %s (leader epoch %d, partition epoch %d)",
            replica.log.name,
            list(proposal.new_isr),
            proposal.leader_epoch,
            proposal.partition_epoch,
        )
        tp = TopicPartition(replica.topic, replica.partition)
        isr = set(replica.state.isr)
        self.alter_partitions.submit(
            tp, proposal, lambda response: self._on_alter_answer(replica, proposal, response, isr)
        )

    def _on_alter_answer(
        self,
        replica: Replica,
        proposal: ProposeAlterPartition,
        response: AlterPartitionResponse,
        isr_proposed_from: set[int],
    ) -> None:
        if self.replicas.get(TopicPartition(replica.topic, replica.partition)) is not replica:
            return  # removed (or re-created) meanwhile: not for the current core
        state = replica.state
        replica.driver.on_alter_partition_response(proposal.proposal_id, response)
        if (
            self.metrics is not None
            and response.error_code == NONE
            and response.leader_epoch == proposal.leader_epoch
        ):
            # Accepted: counted against the ISR the proposal changed (the metadata
            # carrying the same change may have reached the core first).
            self.metrics.kafka.isr_changed(isr_proposed_from, set(response.isr))
        replica.activate()  # a resend may be due
        logger.debug(
            "%s: after AlterPartition %d: core leader epoch %d, partition epoch %d, isr %s, "
            "pending %s",
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

    # -- produce -----------------------------------------------------------------------------

    async def append_records(
        self,
        entries: Sequence[tuple[TopicPartition, memoryview]],
        acks: int,
        timeout_ms: int,
    ) -> list[AppendResult]:
        """Append each partition's batches as leader, in order, and answer per partition
        (Kafka: appendRecords). Every append is done before the first ``await``, so
        produces pipelined on one connection reach the log in the order they were sent
        when the handler awaits this first. acks=0 and acks=1 return at once; acks=all
        waits until the HW passes each partition's batches (the core's purgatory) or
        ``timeout_ms``."""
        deadline = self.now_ms() + timeout_ms
        results: list[AppendResult] = []
        waits: list[tuple[AppendResult, asyncio.Future[int]]] = []
        for tp, data in entries:
            result, future = self._append_one(tp, data, acks, deadline)
            results.append(result)
            if future is not None:
                waits.append((result, future))
        # ---- every append is done; from here on this may wait ----
        if waits:
            await _wait_acks(waits, timeout_ms)
        return results

    def start_append(
        self, tp: TopicPartition, data: memoryview, timeout_ms: int
    ) -> tuple[AppendResult, asyncio.Future[int] | None]:
        """An acks=all append of one partition's batches, done when this returns (no
        ``await``): for a writer that must keep its appends in the order of its own
        state changes (the group coordinator). ``finish_append`` waits for the outcome."""
        return self._append_one(tp, data, ACKS_ALL, self.now_ms() + timeout_ms)

    async def finish_append(
        self, result: AppendResult, future: asyncio.Future[int] | None, timeout_ms: int
    ) -> AppendResult:
        """``start_append``'s result once replicated (or failed, or timed out)."""
        if future is not None:
            await _wait_acks([(result, future)], timeout_ms)
        return result

    def _append_one(
        self, tp: TopicPartition, data: memoryview, acks: int, deadline_ms: int
    ) -> tuple[AppendResult, asyncio.Future[int] | None]:
        topic, partition = tp
        replica = self.replicas.get(tp)
        if replica is None:
            return AppendResult(topic, partition, self.partition_error(topic, partition)), None
        log = replica.log
        pid = future = None
        if acks == ACKS_ALL:
            pid = next(self._produce_ids)
            future = asyncio.get_running_loop().create_future()
            replica.produce_waiters[pid] = future
        message: str | None = None
        try:
            outcome = replica.driver.append_as_leader(
                data, acks, replica.min_insync_replicas, pid, deadline_ms
            )
            code = outcome.error_code
        except RilletError as e:  # a batch refused (CRC, size): nothing was written
            code, message = e.code, e.message or str(e)
        except OSError as e:  # disk full, I/O error: the log is unusable, the broker is not
            logger.error("%s: append failed: %r", log.name, e)
            code, message = STORAGE_ERROR, repr(e)
        if code != NONE:
            replica.produce_waiters.pop(pid, None)
            if code == NOT_ENOUGH_REPLICAS:
                self._log_not_enough_replicas(replica)
            refused = AppendResult(
                topic, partition, code, log_start_offset=log.log_start_offset, error_message=message
            )
            return refused, None
        if self.metrics is not None:
            messages = outcome.last_offset - outcome.first_offset + 1
            self.metrics.record_append(topic, len(data), messages)
        result = AppendResult(
            topic, partition, NONE, outcome.first_offset, log_start_offset=log.log_start_offset
        )
        return result, future

    def _log_not_enough_replicas(self, replica: Replica) -> None:
        """Say which ISR refused (at most once a second per partition): the core's
        committed ISR, which may differ from what metadata shows."""
        now = self.now_ms()
        last = self._refusal_logged_ms.get(replica.log.name)
        if last is not None and now - last < 1000:
            return
        self._refusal_logged_ms[replica.log.name] = now
        state = replica.state
        p = self.image.partition(replica.topic, replica.partition)
        metadata_isr = (
            "unknown"
            if p is None
            else f"{list(p.isr)} (leader {p.leader}, epochs {p.leader_epoch}/{p.partition_epoch})"
        )
        logger.warning(
            "%s: NOT_ENOUGH_REPLICAS: core isr %s (leader epoch %d, partition "
            "epoch %d) < min.insync.replicas %d; metadata isr %s",
            replica.log.name,
            list(state.isr),
            state.leader_epoch,
            state.partition_epoch,
            replica.min_insync_replicas,
            metadata_isr,
        )

    # -- fetch -------------------------------------------------------------------------------

    async def fetch_messages(
        self,
        params: FetchParams,
        partitions: list[FetchPartition],
        session: FetchSession | None = None,
    ) -> FetchResult:
        """Read every partition and answer per partition (Kafka: fetchMessages). With
        fewer than ``min_bytes`` available it parks one future on each partition it read;
        appends, HW moves and role changes wake it (``Replica.wake``), it reads again, and
        it returns once ``min_bytes`` is there, a partition has an error or a redirect,
        or ``max_wait_ms`` has passed. Nothing polls.

        ``session``: a follower's fetch session (``partitions`` are then the ones it
        listed or that changed): see ``_fetch_watched``.

        The last read and the return happen in one step (no ``await`` between them):
        a caller that encodes the result without awaiting first pins the byte ranges
        before retention or truncation can touch them. A result with remote reads holds
        part of the remote reader's in-flight bound (``result.held``) until the caller
        calls ``result.release()``, once the answer is written."""
        if session is not None:
            return await self._fetch_watched(params, partitions, session)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, params.max_wait_ms) / 1000
        # A consumer reads below the HW: an append that leaves it where it was cannot
        # end its wait (Replica.hw_waiters). A follower without a session reads to the end.
        lists: Callable[[Replica], list[asyncio.Future[None]]] = (
            _hw_waiters if params.replica_id == CONSUMER else _waiters
        )
        first = True
        while True:
            result = self._reader.read_all(params, partitions, first)
            first = False
            if result.remote:
                return await self._read_remote(params, partitions, result)
            remaining = deadline - loop.time()
            done = result.nbytes >= params.min_bytes or result.error or result.redirect
            if done or remaining <= 0:
                return result
            waiter: asyncio.Future[None] = loop.create_future()
            for replica in result.touched:  # none touched (no partitions): wait it out
                lists(replica).append(waiter)
            timer = loop.call_later(remaining, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                waiter.cancel()
                for replica in result.touched:  # a timed-out waiter must not pile up
                    waiting = lists(replica)
                    if waiter in waiting:
                        waiting.remove(waiter)

    async def _read_remote(
        self, params: FetchParams, partitions: list[FetchPartition], result: FetchResult
    ) -> FetchResult:
        """Read the pass's remote partitions, all at once, each within its reservation and
        at most ``remote.fetch.max.wait.ms``; then read the local ones again in the step
        that returns (their file ranges must be pinned then, docs/tiered.md). No long
        poll: a consumer reading history is answered as soon as the tier has."""
        remote = self.remote
        reads = [result.partitions[i].remote for i in result.remote]
        completed: dict[int, FetchPartitionResult] = {}
        held: list[Held] = []
        try:
            if remote is not None:
                image_at = self.image
                outcomes = await read_remote(
                    remote.reader,
                    [r for r in reads if r is not None],
                    self.config["remote.fetch.max.wait.ms"] / 1000,
                    lambda read: self._still_remote(read, image_at),
                    self.metrics,
                    held,
                )
                for i, outcome in zip(result.remote, outcomes, strict=True):
                    done = result.partitions[i]
                    done.remote = None
                    done.error_code = outcome.error_code
                    done.records = outcome.records()
                    completed[i] = done
            out = self._reader.read_all(params, partitions, False, completed=completed)
        except BaseException:
            for h in held:
                h.release()
            raise
        out.held = held  # the caller's, until the response is written
        return out

    def _still_remote(self, read: RemoteRead, image_at: MetadataImage) -> bool:
        """Whether a failed remote read's segments are all still in the remote log: a
        missing object is then damage; else retention deleted it meanwhile."""
        for image in (image_at, self.image):
            segs = image.remote_segments.get((read.topic_id, read.partition), {})
            if any(segs.get(s.segment_id) != s for s in read.segments):
                return False
        return True

    async def _fetch_watched(
        self, params: FetchParams, partitions: list[FetchPartition], session: FetchSession
    ) -> FetchResult:
        """A follower session's fetch, at a cost that follows what changed, not the
        session's size. The first pass reads ``partitions`` (listed or marked changed),
        records the follower's positions with the session's clock, unmarks the partitions
        it found idle (``FetchPartitionResult.idle``) and keeps the rest marked; then the
        clock moves to now, standing for this fetch on every idle partition left unread.
        A long poll parks one future on the session's watch: a change to any of its
        partitions marks it and wakes the fetch, whose next pass reads the first pass's
        partitions and the marked ones (a change during the poll stays marked for the
        next fetch, which records the position)."""
        watch = session.watch
        if not isinstance(watch, FetchWatch):
            watch = session.watch = FetchWatch(session)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, params.max_wait_ms) / 1000
        result = self._reader.read_all(params, partitions, True, session.clock)
        session.note_read(result.partitions)
        session.clock.last_fetch_ms = self.now_ms()
        first_keys = [(p.topic, p.partition) for p in partitions]
        while True:
            if session.closed:  # unwatch took its watch off: not to be put back
                return result
            for replica in result.touched:
                replica.watchers.add(watch)
            remaining = deadline - loop.time()
            done = result.nbytes >= params.min_bytes or result.error or result.redirect
            if done or remaining <= 0:
                return result
            waiter: asyncio.Future[None] = loop.create_future()
            watch.waiter = waiter
            timer = loop.call_later(remaining, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                waiter.cancel()
                if watch.waiter is waiter:
                    watch.waiter = None
            wanted = session.fetches({*first_keys, *session.changed})
            result = self._reader.read_all(params, wanted, False)

    def unwatch(self, sessions: Iterable[FetchSession]) -> None:
        """Take closed sessions' watches off the replicas they read. A session its own
        follower replaced also has its parked fetch ended now: answers on a connection
        go out in order, so the follower's new fetch (sent after abandoning that one:
        broker/replication/fetcher.py) would wait out its long poll. An evicted
        session's fetch is left to its poll: ended at once, its follower would evict the
        evictor at once, and so on, while followers outnumber the cache's slots."""
        for session in sessions:
            watch = session.watch
            if not isinstance(watch, FetchWatch):
                continue
            waiter = watch.waiter
            if session.replaced and waiter is not None and not waiter.done():
                waiter.set_result(None)
            for topic, partition in session.partitions:
                replica = self.replicas.get(TopicPartition(topic, partition))
                if replica is not None:
                    replica.watchers.discard(watch)

    # -- time --------------------------------------------------------------------------------

    def tick(self, isr_check: bool = True) -> None:
        """Expire acks=all waiters, resend AlterPartitions and, with ``isr_check``,
        propose ISR shrinks: on the replicas activated since they were last found idle
        (``needs_tick``), the only ones whose tick can do anything."""
        self.tick_replicas(list(self._ticking), isr_check)

    def tick_replicas(self, replicas: list[Replica], isr_check: bool) -> None:
        ticking = self._ticking
        for replica in replicas:
            if replica not in ticking:
                continue
            tp = TopicPartition(replica.topic, replica.partition)
            if self.replicas.get(tp) is not replica:
                del ticking[replica]  # removed or re-created
                continue
            if not isr_check and not replica.state.needs_prompt_tick():
                continue
            replica.driver.tick()
            if not replica.state.needs_tick():
                del ticking[replica]

    async def run_ticks(self) -> None:
        """Tick forever: acks=all expiry and AlterPartition resends every
        ``replica.tick.interval.ms``; ISR shrink checks every half
        ``replica.lag.time.max.ms`` (Kafka's isr-expiration period), a slice of replicas
        per loop turn. Checking every lagging leader at every tick cost a broker of
        50,000 partitions, all catching up after a create, most of each second.

        No catch here: a tick that raises has left some core waiting on effects that
        were never applied (an AlterPartition never sent, a produce never answered), so
        the server runs this task under the fatal policy."""
        interval_ms = self.config["replica.tick.interval.ms"]
        isr_every = isr_check_every(interval_ms, self.config["replica.lag.time.max.ms"])
        n = 0
        while True:
            await asyncio.sleep(interval_ms / 1000)
            n += 1
            isr_check = n % isr_every == 0
            replicas = list(self._ticking)
            for start in range(0, max(len(replicas), 1), TICK_SLICE):
                if start:
                    await asyncio.sleep(0)
                self.tick_replicas(replicas[start : start + TICK_SLICE], isr_check)

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
            replica.driver.shutdown()
            replica.wake()
        await self.alter_partitions.close()
        try:
            await self.checkpoint_high_watermarks()
        except OSError:
            logger.exception("final high-watermark checkpoint failed")
        self.replicas.clear()


def isr_check_every(tick_interval_ms: int, lag_time_max_ms: int) -> int:
    """Ticks between two ISR shrink checks: half the lag time (at least every tick)."""
    return max(1, (lag_time_max_ms // 2) // max(1, tick_interval_ms))


def some_partitions(tps: Iterable[TopicPartition], shown: int = 5) -> str:
    """``3 (t-0, t-1, u-4)``; past ``shown`` partitions only the first ones are named."""
    names = [f"{tp.topic}-{tp.partition}" for tp in sorted(tps)]
    if not names:
        return "0"
    more = f", +{len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} ({', '.join(names[:shown])}{more})"


async def _no_controller(batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
    raise errors.RequestTimedOutError("no controller channel")


def _pending_str(state: PartitionState) -> str:
    pending = state.pending_isr_change
    if pending is None:
        return "none"
    return f"{pending.kind} to {list(pending.proposal.new_isr)}"


def _waiters(replica: Replica) -> list[asyncio.Future[None]]:
    return replica.waiters


def _hw_waiters(replica: Replica) -> list[asyncio.Future[None]]:
    return replica.hw_waiters


def _wake(waiter: asyncio.Future[None]) -> None:
    """A long poll's timer: ``asyncio.wait([waiter], timeout=...)`` cost an extra future,
    a callback and two coroutine frames on each of the two or three parked fetches of
    every acks=all produce."""
    if not waiter.done():
        waiter.set_result(None)


async def _wait_acks(
    waits: list[tuple[AppendResult, asyncio.Future[int]]], timeout_ms: int
) -> None:
    """Fill in each acks=all result's code once its future resolves. The purgatory times
    them out on the replica tick; the extra second here only guards against a lost wake."""
    await asyncio.wait([f for _, f in waits], timeout=timeout_ms / 1000 + 1.0)
    for result, future in waits:
        if future.done():
            result.error_code = future.result()
        else:
            future.cancel()
            result.error_code = REQUEST_TIMED_OUT
        if result.error_code not in (NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND):
            result.base_offset = -1  # no offset promised: the records may or may not survive


def partition_error(image: MetadataImage, topic: str, partition: int) -> int:
    """Why a broker cannot serve a partition it holds no replica of."""
    p = image.partition(topic, partition)
    if p is None:
        return errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")
    if p.leader == NO_LEADER:
        return errors.code_of("LEADER_NOT_AVAILABLE")
    return errors.code_of("NOT_LEADER_OR_FOLLOWER")
