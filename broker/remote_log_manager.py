"""``RemoteLogManager``: this broker's side of the remote (S3) tier (docs/tiered.md).

It owns the object store, the ``RemoteReader`` that fetches below the local log start
read through (attribute ``reader``), and the tasks that write the remote log. Every
``remote.log.manager.task.interval.ms``, for each partition this broker leads whose
topic has ``remote.storage.enable``, one round (never two at once for a partition):

a. cleanup: copies and deletions left STARTED by another writer (an earlier leader, or
   this broker in an earlier leader epoch), or by this one and not in hand any more (a
   failed delete), are deleted: DELETE_STARTED committed, the objects deleted,
   DELETE_FINISHED committed;
b. copy, oldest first, of closed segments wholly below the high watermark and past the
   highest remote offset: COPY_STARTED committed, the upload on a copier thread (at most
   ``remote.log.manager.copier.thread.pool.size`` at once, broker-wide, under the
   ``remote.log.manager.copy.max.bytes.per.second`` limit, retried with backoff while
   the store fails retriably and this broker still leads), COPY_FINISHED committed. A
   segment whose copy fails for good is tried again after a growing pause. A
   COPY_FINISHED refused for certain (its topic deleted meanwhile) deletes the objects it
   uploaded; one whose outcome is unknown (no answer, or a fenced one) deletes nothing:
   the next leader's cleanup (a) deletes what was not finished. A leader whose log
   agrees with the remote log only up to some offset below its end (an unclean
   election) copies nothing: it deletes the remote segments past that offset, or waits
   while doing so would lose records both logs agree on;
c. remote retention: segments past ``retention.ms`` / ``retention.bytes`` of the whole
   log are deleted as in (a);
d. orphans: objects under the partition's prefix that no segment of the image names,
   older than ``remote.log.orphan.min.age.ms``, are deleted.

Every ``remote.log.orphan.sweep.interval.ms`` one broker, the lowest-id unfenced one of
its image, sweeps the whole bucket for prefixes of topics its image does not hold (a
topic deleted while every broker that held it was away), when its image is known to be
recent; every object under such a prefix must be older than the minimum age too, and
no other cluster may have marked the store's prefix (each broker puts its cluster's
marker there before its first upload, and at its first round as a leader): another
cluster's topics are not in this image.

Each step runs whatever the one before it did. Every metadata record is committed or
known refused before the next step: one without an answer is sent again while this
broker leads (docs/tiered.md, "Unknown outcomes"). Which segments each step takes is
decided by broker/remote_plan.py (pure). On every metadata change each replica of a
changed partition gets ``log.remote_copied_end``, the highest offset safely remote
(the end of the contiguous run of finished segments), which bounds local retention
(storage/retention.py), and segments gone from the image leave the reader's caches.
When a topic is deleted, every broker that held a replica of it deletes the topic's
prefix (idempotent: any of them may finish first).

Nothing here blocks the event loop: uploads, deletes and listings run on threads, and
produce and fetch never wait for any of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from rillet.broker.config import BrokerConfig
from rillet.broker.remote_fetch import RemoteLogViews
from rillet.broker.remote_plan import (
    ToCopy,
    copy_lag,
    divergent_remote_segments,
    epochs_in,
    is_bucket_sweeper,
    orphaned_topic_prefixes,
    orphans,
    remote_segments_past_retention,
    segments_to_copy,
    stale_copies,
)
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.client.wire.errors import RilletError
from rillet.controller.metadata.describe import cluster_id_of
from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    SEGMENT_COPY_STARTED,
    SEGMENT_DELETE_FINISHED,
    SEGMENT_DELETE_STARTED,
    MetadataDelta,
    MetadataImage,
    RemoteSegment,
    TopicPartition,
)
from rillet.controller.metadata.remote_log import EMPTY_REMOTE_LOG, RemoteLogView
from rillet.storage.epoch_cache import agreed_end
from rillet.storage.log import Log
from rillet.storage.remote.copier import RateLimiter, delete_segment, upload_segment
from rillet.storage.remote.layout import (
    CLUSTER_MARKERS,
    RemoteManifest,
    SegmentKeys,
    cluster_marker_key,
    parse_cluster_marker,
    partition_prefix,
    segment_keys,
    topic_prefix,
)
from rillet.storage.remote.reader import RemoteReader
from rillet.storage.remote.store import ObjectStore, RemoteStorageError

if TYPE_CHECKING:
    from rillet.broker.metrics import BrokerMetrics

logger = logging.getLogger(__name__)

T = TypeVar("T")
# (segments) -> one result per segment, once committed: QuorumLink.alter_remote_segments.
Proposer = Callable[[Sequence[RemoteSegment]], Awaitable[list[m.RemoteSegmentResult]]]
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 10.0
# A partition whose copying is stalled (docs/tiered.md, "Unclean leader election") says
# so at most this often.
STALL_WARNING_INTERVAL_MS = 300_000
DELETE_BATCH = 1000  # S3's DeleteObjects takes at most 1000 keys
# Deleting the objects of an upload no record will ever name (its topic was deleted
# meanwhile, or the controller refused it): tried this many times with backoff, then
# left to the bucket sweep. Bounded: nothing else would ever end the loop.
DISCARD_ATTEMPTS = 8
# A segment whose copy keeps failing (a non-retriable store error, a local problem) is
# tried again after interval * 2**failures, at most this long: each try writes three
# metadata records.
COPY_RETRY_MAX_MS = 10 * 60 * 1000
# Answers that fence the writer. A fenced answer does not say the record is absent: the
# controller channel resends a request whose answer it lost, so an earlier send may have
# committed it before the fence (docs/tiered.md, "Unknown outcomes").
FENCED = frozenset(
    errors.code_of(name)
    for name in (
        "STALE_BROKER_EPOCH",
        "NOT_LEADER_OR_FOLLOWER",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
    )
)
# A claim's value while this broker's work on the segment is under way (else the state
# the image will show once it has caught up with the work's last record).
IN_FLIGHT = -1


class ReplicaView(Protocol):
    """What the manager reads of a replica (broker/replica.py's Replica)."""

    topic_id: str
    log: Log


class ReplicasView(Protocol):
    """What the manager reads of the ReplicaManager."""

    broker_id: int
    image: MetadataImage
    replicas: Mapping[TopicPartition, Any]

    @property
    def views(self) -> RemoteLogViews:
        """Each partition's remote log view, cached per change (shared with the fetch
        path, so a change rebuilds a partition's view once)."""
        ...


class _Unrecorded(Exception):
    """The controller answered a state change with an error that resending cannot
    change (an unsupported version, a non-retriable error, a malformed answer). Whether
    it committed is not known for certain, so its caller deletes nothing: the step
    ends, and the next round starts again from the image."""


def _outcome_unknown(e: Exception) -> bool:
    """Whether a failed request may succeed if sent again: a retriable error (network,
    timeout, no active controller), or the socket's own failure."""
    return isinstance(e, OSError) or (isinstance(e, RilletError) and e.retriable)


class _Abandoned(Exception):
    """This broker no longer leads the partition in the epoch the work began in (or the
    controller said so): whatever it left is the next leader's to clean up."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Lead:
    """One round's partition, as led when the round began."""

    tp: TopicPartition
    topic_id: str
    leader_epoch: int
    replica: Any


class RemoteLogManager:
    def __init__(
        self,
        config: BrokerConfig,
        store: ObjectStore,
        replicas: ReplicasView,
        propose: Proposer,
        *,
        metrics: BrokerMetrics | None = None,
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        metadata_age_ms: Callable[[], float | None] | None = None,
    ) -> None:
        """``metadata_age_ms()``: how old this broker's image may be, at most (since the
        controller's high watermark was last known to be reached), None when unknown; no
        bucket sweep without it."""
        self.store = store
        self.replicas = replicas
        self.broker_id = replicas.broker_id
        self.propose = propose
        self.metrics = metrics
        self.clock = wall_clock_ms
        self.interval_s = config["remote.log.manager.task.interval.ms"] / 1000
        self.orphan_min_age_ms = config["remote.log.orphan.min.age.ms"]
        self.sweep_interval_s = config["remote.log.orphan.sweep.interval.ms"] / 1000
        self.metadata_age_ms = metadata_age_ms
        self.chunk_size = config["remote.fetch.chunk.size.bytes"]
        copiers = config["remote.log.manager.copier.thread.pool.size"]
        self.limiter = RateLimiter(config["remote.log.manager.copy.max.bytes.per.second"])
        self._copy_pool = ThreadPoolExecutor(copiers, thread_name_prefix="remote-copy")
        self._copy_slots = asyncio.Semaphore(copiers)
        # Deletes and listings: short calls, kept off the copiers so an upload backlog
        # never delays a cleanup.
        self._io_pool = ThreadPoolExecutor(2, thread_name_prefix="remote-io")
        self.reader = _make_reader(config, store)
        self._rounds: dict[TopicPartition, asyncio.Task[None]] = {}
        self._topic_deletes: set[asyncio.Task[None]] = set()
        # Per partition: (leader epoch, highest offset this broker finished copying in
        # it): the image may not show a COPY_FINISHED yet when the next round starts.
        self._copied_end: dict[TopicPartition, tuple[int, int]] = {}
        self._last_sweep_ms: dict[TopicPartition, int] = {}
        # When each stalled partition (``divergent_remote_segments``' blocked) last warned.
        self._stall_warned_ms: dict[TopicPartition, int] = {}
        # Per partition: (leader epoch, {segment id: claim}) for the segments this broker
        # works on in that epoch: IN_FLIGHT, or the state its last committed record put
        # the segment in, until the image shows it. Its own STARTED segments that are not
        # claimed are left over (a failed delete, a lost answer) and cleaned up.
        self._claims: dict[TopicPartition, tuple[int, dict[str, int]]] = {}
        # Per partition: (leader epoch, base offset, failures, next try ms) of the
        # segment whose copy keeps failing.
        self._copy_failures: dict[TopicPartition, tuple[int, int, int, int]] = {}
        self.views = replicas.views
        self._task: asyncio.Task[None] | None = None
        self._sweep_task: asyncio.Task[None] | None = None
        self._closed = False
        self._marked = False  # this cluster's marker is in the store (``_mark_prefix``)
        self._compacted_warned: set[str] = set()  # tiered topics compacted by our config

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="remote-log")
        self._sweep_task = loop.create_task(self._run_sweeps(), name="remote-bucket-sweep")

    async def close(self) -> None:
        """Stop every task. An upload already on a thread runs to its end (a thread
        cannot be stopped): its objects are orphans the next leader's sweep deletes."""
        self._closed = True
        tasks = [
            t
            for t in (self._task, self._sweep_task, *self._rounds.values(), *self._topic_deletes)
            if t
        ]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._copy_pool.shutdown(wait=False, cancel_futures=True)
        self._io_pool.shutdown(wait=False, cancel_futures=True)
        self.reader.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.schedule()
            except Exception:  # a bug in one pass must not end the tier for good
                logger.exception("remote log manager: scheduling failed")

    async def _run_sweeps(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                await self.sweep_bucket()
            except RemoteStorageError as e:
                logger.warning("remote bucket sweep: %s", e)
            except Exception:  # the next sweep starts afresh
                logger.exception("remote bucket sweep failed")

    async def sweep_bucket(self) -> list[str]:
        """Delete the prefixes of topics the image does not hold, when this broker is the
        sweeper (``is_bucket_sweeper``); returns the prefixes deleted. Each broker that
        held a replica deletes a deleted topic's prefix itself (``on_metadata``); this
        catches the topics none of them was up to delete."""
        if self.metadata_age_ms is None or not is_bucket_sweeper(
            self.replicas.image.unfenced_broker_ids(), self.broker_id
        ):
            return []
        cluster_id = cluster_id_of(self.replicas.image)
        if cluster_id is None:
            logger.info("remote bucket sweep skipped: the cluster id is not known yet")
            return []
        await self._io(self._mark_prefix)
        if await self._shared_with_others(cluster_id):
            return []
        # The listing is decided on as it streams (a bucket may hold millions of keys;
        # only unknown topics' keys are kept), against the topics known before it.
        known = {*self.replicas.image.topics_by_id, *self.replicas.image.building_topics}
        lost = await self._io(
            lambda: orphaned_topic_prefixes(
                self.store.list(""), known, self.clock(), self.orphan_min_age_ms
            )
        )
        # Markers again, after the listing: a cluster marks the prefix before its first
        # upload, so any cluster whose objects the listing saw is marked by now.
        if await self._shared_with_others(cluster_id):
            return []
        # The image and its age are read again after the listing: a topic the image does
        # not hold was then created after the image's moment, so its objects are younger
        # than that age; with the age bounded below the minimum object age, they stay.
        image, age = self.replicas.image, self.metadata_age_ms()
        if age is None or age > self.orphan_min_age_ms / 2:
            logger.info("remote bucket sweep skipped: the metadata image may be stale")
            return []
        live = {*image.topics_by_id, *image.building_topics}
        gone = [t for t in lost if t.topic_id not in live]
        for t in gone:
            logger.info("deleting %d object(s) under %s: its topic is gone", len(t.keys), t.prefix)
            await self._io(_delete_keys, self.store, t.keys)
            self._count("remote_delete_requests")
        return [t.prefix for t in gone]

    def _mark_prefix(self) -> None:
        """Put this cluster's marker under the store's prefix (blocking; once per process)
        before this broker writes anything else there: the copier calls it before each
        upload, the sweeper before its listing. Without a cluster id in the image (not
        caught up) nothing is marked, and no sweep runs."""
        cluster_id = cluster_id_of(self.replicas.image)
        if not self._marked and cluster_id is not None:
            self.store.put(cluster_marker_key(cluster_id), cluster_id.encode())
            self._marked = True

    async def _mark(self, lead: _Lead) -> None:
        """Mark the prefix at a leader's round even with nothing to copy: a cluster whose
        objects predate the markers, or that uploads nothing for a while, is then marked
        within a task interval, before another cluster's sweep could take its topics
        for deleted ones."""
        if self._marked:
            return
        try:
            await self._io(self._mark_prefix)
        except RemoteStorageError as e:
            logger.warning("%s-%d: marking the remote prefix: %s (next round)", *lead.tp, e)

    def _upload(self, *args: Any) -> RemoteManifest:
        """``upload_segment`` (blocking), under a prefix marked as this cluster's."""
        self._mark_prefix()
        return upload_segment(*args)

    async def _shared_with_others(self, cluster_id: str) -> bool:
        """Whether another cluster has marked the store's prefix (said as a warning)."""
        keys = await self._io(_list_keys, self.store, CLUSTER_MARKERS)
        others = sorted(
            c for c in (parse_cluster_marker(k) for k in keys) if c not in (None, cluster_id)
        )
        if others:
            logger.warning(
                "remote bucket sweep disabled: prefix %r of the bucket is shared with "
                "cluster(s) %s (this is cluster %s), whose topics this cluster cannot tell "
                "from deleted ones; give each cluster its own prefix "
                "(remote.log.storage.s3.prefix)",
                getattr(self.store, "prefix", ""),
                ", ".join(others),
                cluster_id,
            )
        return bool(others)

    def schedule(self) -> list[asyncio.Task[None]]:
        """Start a round for each led remote partition that has none running; also
        refreshes the copy-lag and remote-size gauges. Returns the rounds started."""
        started = []
        lag_segments = lag_bytes = size = 0
        leads = list(self._led())
        led = {lead.tp for lead in leads}
        books: tuple[dict[TopicPartition, Any], ...] = (
            self._rounds,
            self._copied_end,
            self._last_sweep_ms,
            self._stall_warned_ms,
            self._claims,
            self._copy_failures,
        )
        # A partition's books go once it is not led, but not while its round still runs:
        # the round keeps using them (dropped claims would make its finished copies look
        # left over to the next round while the image lags).
        running = {tp for tp, task in self._rounds.items() if not task.done()}
        for book in books:
            for tp in [tp for tp in book if tp not in led and tp not in running]:
                del book[tp]
        for lead in leads:
            view = self._view(lead)
            log = lead.replica.log
            hw = log.high_watermark if log.high_watermark is not None else log.log_end_offset
            lag = copy_lag(log.segments, hw, self._remote_end(lead, view.end_offset))
            lag_segments, lag_bytes = lag_segments + lag.segments, lag_bytes + lag.bytes
            size += view.size_bytes
            running = self._rounds.get(lead.tp)
            if running is None or running.done():
                task = asyncio.get_running_loop().create_task(
                    self._round(lead), name=f"remote-{lead.tp.topic}-{lead.tp.partition}"
                )
                self._rounds[lead.tp] = task
                started.append(task)
        if self.metrics is not None:
            self.metrics.set_remote_gauges(lag_segments, lag_bytes, size)
        return started

    async def run_once(self) -> None:
        """One round of every led partition, awaited (tests)."""
        await asyncio.gather(*self.schedule())

    def _led(self) -> Iterable[_Lead]:
        image = self.replicas.image
        for tp, replica in list(self.replicas.replicas.items()):
            config = replica.log.config
            if not config.tiered:
                if config.remote_storage_enable and tp.topic not in self._compacted_warned:
                    self._compacted_warned.add(tp.topic)
                    logger.warning(
                        "topic %s has remote.storage.enable=true, but its cleanup.policy "
                        "on this broker is %r (log.cleanup.policy, unless the topic sets "
                        "it): compacted logs are never tiered, so this broker keeps it on "
                        "local disk under its total retention only",
                        tp.topic,
                        config.cleanup_policy,
                    )
                continue
            p = image.partition(tp.topic, tp.partition)
            if p is not None and p.leader == self.broker_id and p.topic_id == replica.topic_id:
                yield _Lead(tp, replica.topic_id, p.leader_epoch, replica)

    def _still_leads(self, lead: _Lead) -> bool:
        p = self.replicas.image.partition(lead.tp.topic, lead.tp.partition)
        return (
            not self._closed
            and p is not None
            and p.leader == self.broker_id
            and p.leader_epoch == lead.leader_epoch
            and self.replicas.replicas.get(lead.tp) is lead.replica
        )

    def _view(self, lead: _Lead) -> RemoteLogView:
        """The partition's finished remote segments, cached per change of its map."""
        view = self.views.get(self.replicas.image, lead.topic_id, lead.tp.partition)
        return EMPTY_REMOTE_LOG if view is None else view

    def _remote_end(self, lead: _Lead, image_end: int) -> int:
        epoch, end = self._copied_end.get(lead.tp, (-1, -1))
        return max(image_end, end) if epoch == lead.leader_epoch else image_end

    # -- metadata --------------------------------------------------------------------

    def on_metadata(
        self, delta: MetadataDelta, image: MetadataImage, assigned: Iterable[TopicPartition]
    ) -> None:
        """Give each replica whose remote log changed (or that was just assigned here)
        its highest remote offset; start deleting the remote data of deleted topics this
        broker held a replica of."""
        tps = set(assigned)
        for topic_id, partition in delta.changed_remote_partitions:
            t = image.topics_by_id.get(topic_id)
            if t is not None:
                tps.add(TopicPartition(t.name, partition))
        for tp in tps:
            replica = self.replicas.replicas.get(tp)
            if replica is not None:
                view = self.views.get(image, replica.topic_id, tp.partition) or EMPTY_REMOTE_LOG
                replica.log.remote_epochs = (view.leader_epochs(), view.log_start_offset)
                # Past a hole nothing is remote, however high the remote log ends.
                replica.log.remote_copied_end = view.contiguous_end
        self._forget_deleted(delta, image)
        for topic_id, name in delta.deleted_topics.items():
            before = delta.image.topics_by_id.get(topic_id)
            if before is not None and any(
                self.broker_id in p.replicas for p in before.partitions.values()
            ):
                self._start_topic_delete(name, topic_id)

    def _forget_deleted(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Segments gone from the image (deleted, or their topic was) leave the reader's
        caches on every broker; the leader deleting them already forgot them when their
        DELETE_STARTED committed, before their objects went."""
        changed = set(delta.changed_remote_partitions)
        if delta.deleted_topics:  # their segments leave the image with them
            changed.update(k for k in delta.image.remote_segments if k[0] in delta.deleted_topics)
        for key in changed:
            before = delta.image.remote_segments.get(key)
            if not before:
                continue
            topic = delta.image.topics_by_id.get(key[0])
            after = image.remote_segments.get(key, {})
            for segment_id in before.keys() - after.keys():  # C-speed: maps can be large
                seg = before[segment_id]
                if topic is not None:
                    keys = segment_keys(topic.name, key[0], key[1], seg.start_offset, segment_id)
                    self.reader.forget(keys)

    def _start_topic_delete(self, topic: str, topic_id: str) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(
            self._delete_topic(topic, topic_id), name=f"remote-delete-{topic}"
        )
        self._topic_deletes.add(task)
        task.add_done_callback(self._topic_deletes.discard)

    async def _delete_topic(self, topic: str, topic_id: str) -> None:
        prefix = topic_prefix(topic, topic_id)
        backoff = BACKOFF_MIN_S
        while True:
            try:
                keys = await self._io(_list_keys, self.store, prefix)
                if not keys:
                    logger.info("remote data of deleted topic %s (%s) is gone", topic, topic_id)
                    return
                await self._io(_delete_keys, self.store, keys)
                self._count("remote_delete_requests")
            except RemoteStorageError as e:
                self._count("remote_delete_errors")
                logger.warning("deleting the remote data of topic %s: %s", topic, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    # -- one round of one partition --------------------------------------------------

    async def _round(self, lead: _Lead) -> None:
        """Every step, whatever the ones before it did: a copy that keeps failing must
        not stop retention or the sweep. A step stops at its own first failure; the next
        round starts it afresh from the image: nothing is lost but time."""
        for step in (self._cleanup, self._copy_all, self._retention, self._sweep, self._mark):
            if not self._still_leads(lead):
                return
            try:
                await step(lead)
            except _Abandoned:
                logger.info("%s-%d: leadership moved; remote work stops", *lead.tp)
                return
            except Exception:
                logger.exception("%s-%d: remote log %s failed", *lead.tp, step.__name__)

    @staticmethod
    def _keys(lead: _Lead, start_offset: int, segment_id: str) -> SegmentKeys:
        return segment_keys(
            lead.tp.topic, lead.topic_id, lead.tp.partition, start_offset, segment_id
        )

    def _segments(self, lead: _Lead) -> Mapping[str, RemoteSegment]:
        key = (lead.topic_id, lead.tp.partition)
        return self.replicas.image.remote_segments.get(key, {})

    def _claims_of(self, lead: _Lead) -> dict[str, int]:
        epoch, claims = self._claims.get(lead.tp, (-1, {}))
        if epoch != lead.leader_epoch:
            claims = {}
            self._claims[lead.tp] = (lead.leader_epoch, claims)
        return claims

    def _release_settled(self, lead: _Lead) -> None:
        """Drop the claims whose last record the image now shows. Not earlier: an image
        still showing COPY_STARTED for a copy finished meanwhile must not make it look
        left over (deleting it would delete a finished segment)."""
        claims, segments = self._claims_of(lead), self._segments(lead)
        for segment_id, want in list(claims.items()):
            cur = segments.get(segment_id)
            if want == IN_FLIGHT:
                continue
            if want == SEGMENT_DELETE_FINISHED:
                settled = cur is None
            else:  # COPY_FINISHED: shown, or already on its way out
                settled = cur is not None and cur.state != SEGMENT_COPY_STARTED
            if settled:
                del claims[segment_id]

    async def _cleanup(self, lead: _Lead) -> bool:
        self._release_settled(lead)
        claimed = self._claims_of(lead).keys()
        stale = stale_copies(self._segments(lead), self.broker_id, lead.leader_epoch, claimed)
        for seg in stale:
            logger.info(
                "%s-%d: deleting segment %s (%d..%d) left %s by broker %d in epoch %d",
                *lead.tp,
                seg.segment_id,
                seg.start_offset,
                seg.end_offset,
                "copying" if seg.state == SEGMENT_COPY_STARTED else "deleting",
                seg.broker_id,
                seg.leader_epoch,
            )
            if not await self._delete_remote(lead, seg):
                return False
        return True

    async def _may_copy(self, lead: _Lead) -> bool:
        """Whether the leader's log agrees with the remote log up to its end. One that
        does not (an unclean election) copies nothing this round: it deletes the remote
        segments past the agreement, or keeps waiting while it cannot
        (``divergent_remote_segments``); the next round sees the image without them."""
        log = lead.replica.log
        view = self._view(lead)
        if not view.segments:
            return True
        agreed = agreed_end(
            log.epochs.entries(),
            log.log_start_offset,
            log.log_end_offset,
            view.leader_epochs(),
            view.log_start_offset,
            view.contiguous_end,
        )
        if agreed >= view.end_offset:
            return True
        plan = divergent_remote_segments(view.segments, agreed, log.log_start_offset)
        level, now = logging.WARNING, self.clock()
        if plan.blocked is not None:  # stalled: the same news every round, not every round
            last = self._stall_warned_ms.get(lead.tp)
            if not plan.delete and last is not None and now - last < STALL_WARNING_INTERVAL_MS:
                level = logging.DEBUG
            else:
                self._stall_warned_ms[lead.tp] = now
        logger.log(
            level,
            "%s-%d: this leader's log agrees with the remote log only up to offset %d of "
            "%d (an unclean election): deleting %d remote segment(s) past it%s",
            *lead.tp,
            agreed,
            view.end_offset,
            len(plan.delete),
            ""
            if plan.blocked is None
            else f"; segment {plan.blocked.segment_id} ({plan.blocked.start_offset}.."
            f"{plan.blocked.end_offset}) holds agreed records this log no longer has, so "
            "it stays and nothing more is copied",
        )
        if plan.delete:
            # Its own copies past the agreement go too: the copy resumes from the image.
            self._copied_end.pop(lead.tp, None)
        for seg in plan.delete:
            if not await self._delete_remote(lead, seg):
                break
        return False

    async def _copy_all(self, lead: _Lead) -> bool:
        if not await self._may_copy(lead):
            return True  # remote retention and the sweep still run
        log = lead.replica.log
        hw = log.high_watermark if log.high_watermark is not None else log.log_end_offset
        remote_end = self._remote_end(lead, self._view(lead).end_offset)
        for todo in segments_to_copy(log.segments, hw, remote_end):
            base = todo.segment.base_offset
            epoch, failed_base, failures, retry_ms = self._copy_failures.get(
                lead.tp, (-1, -1, 0, 0)
            )
            if (epoch, failed_base) == (lead.leader_epoch, base) and self.clock() < retry_ms:
                return False  # backing off: in order, so nothing after it either
            if not self._still_leads(lead):
                return False
            try:
                copied = await self._copy(lead, todo)
            except _Unrecorded:
                copied = False  # backs off; objects left go with the cleanup or sweep
            if not copied:
                if (epoch, failed_base) != (lead.leader_epoch, base):
                    failures = 0
                delay = min(self.interval_s * 1000 * 2 ** min(failures, 20), COPY_RETRY_MAX_MS)
                self._copy_failures[lead.tp] = (
                    lead.leader_epoch,
                    base,
                    failures + 1,
                    self.clock() + int(delay),
                )
                return False
            self._copy_failures.pop(lead.tp, None)
        return True

    async def _copy(self, lead: _Lead, todo: ToCopy) -> bool:
        seg, log = todo.segment, lead.replica.log
        segment_id = uuid.uuid4().hex
        epochs = epochs_in(log.epochs.entries(), seg.base_offset, todo.end_offset)
        record = RemoteSegment(
            topic_id=lead.topic_id,
            partition=lead.tp.partition,
            segment_id=segment_id,
            start_offset=seg.base_offset,
            end_offset=todo.end_offset,
            leader_epochs=epochs,
            state=SEGMENT_COPY_STARTED,
            size_bytes=seg.size,
            max_timestamp_ms=seg.max_timestamp,
            broker_id=self.broker_id,
            leader_epoch=lead.leader_epoch,
        )
        claims = self._claims_of(lead)
        claims[segment_id] = IN_FLIGHT
        try:
            return await self._copy_claimed(lead, todo, record)
        finally:
            if claims.get(segment_id) == IN_FLIGHT:
                del claims[segment_id]  # not finished: a STARTED record left is stale

    async def _copy_claimed(self, lead: _Lead, todo: ToCopy, record: RemoteSegment) -> bool:
        seg, segment_id, epochs = todo.segment, record.segment_id, record.leader_epochs
        if await self._record(lead, record) != errors.NONE:
            return False
        keys = self._keys(lead, seg.base_offset, segment_id)
        try:
            manifest = await self._with_retries(
                lead,
                self._copy_pool,
                self._copy_slots,
                self._upload,
                self.store,
                keys,
                seg,
                epochs,
                segment_id,
                self.chunk_size,
                self.limiter,
            )
        except Exception as e:
            self._count("remote_copy_errors")
            if not isinstance(e, _Abandoned):
                logger.warning("%s-%d: upload of %s failed: %r", *lead.tp, keys.log, e)
            await self._discard(lead, record, keys)
            return False
        finished = dataclasses.replace(
            record,
            state=SEGMENT_COPY_FINISHED,
            size_bytes=manifest.size_bytes,
            max_timestamp_ms=manifest.max_timestamp_ms,
        )
        code = await self._record(lead, finished)
        if code:
            # Refused for certain (a fenced writer or an unknown outcome raised
            # _Abandoned instead, leaving the objects to the next leader): no record will
            # ever name these objects. With its topic deleted, nobody else would delete
            # them.
            await self._discard_objects(lead, keys)
            return False
        self._claims_of(lead)[segment_id] = SEGMENT_COPY_FINISHED
        self._copied_end[lead.tp] = (lead.leader_epoch, todo.end_offset)
        self._count("remote_copy_requests")
        self._count("remote_copy_bytes", manifest.size_bytes)
        logger.debug(
            "%s-%d: copied %d..%d as %s", *lead.tp, seg.base_offset, todo.end_offset, segment_id
        )
        return True

    async def _discard(self, lead: _Lead, record: RemoteSegment, keys: SegmentKeys) -> None:
        """An upload given up before its COPY_FINISHED: delete its record and objects
        while still leading (else the next leader's cleanup does), or at least the
        objects."""
        with contextlib.suppress(Exception):
            if self._still_leads(lead):
                await self._delete_remote(lead, record)
            else:
                await self._io(delete_segment, self.store, keys)

    async def _discard_objects(self, lead: _Lead, keys: SegmentKeys) -> None:
        """Delete the objects of an upload no record names, with backoff, a bounded
        number of times (the bucket sweep is the backstop)."""
        self.reader.forget(keys)
        backoff = BACKOFF_MIN_S
        for _ in range(DISCARD_ATTEMPTS):
            try:
                await self._io(delete_segment, self.store, keys)
                self._count("remote_delete_requests")
                return
            except Exception as e:  # the pool shut down (closing) ends it too
                self._count("remote_delete_errors")
                logger.warning("%s-%d: deleting unrecorded %s: %r", *lead.tp, keys.log, e)
            if self._closed:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
        logger.warning("%s-%d: gave up deleting %s; the sweep will", *lead.tp, keys.log)

    async def _retention(self, lead: _Lead) -> bool:
        log = lead.replica.log
        if not log.config.delete:
            return True
        view = self._view(lead)
        expired = remote_segments_past_retention(
            view.segments,
            log.log_start_offset,
            log.size_bytes,
            log.config.retention_ms,
            log.config.retention_bytes,
            self.clock(),
        )
        for seg in expired:
            if not await self._delete_remote(lead, seg):
                return False
        if expired:
            logger.info(
                "%s-%d: remote retention deleted %d segment(s) up to offset %d",
                *lead.tp,
                len(expired),
                expired[-1].end_offset,
            )
        return True

    async def _sweep(self, lead: _Lead) -> bool:
        now = self.clock()
        last = self._last_sweep_ms.get(lead.tp)
        if last is not None and now - last < max(self.orphan_min_age_ms // 2, 1):
            return True
        self._last_sweep_ms[lead.tp] = now
        prefix = partition_prefix(lead.tp.topic, lead.topic_id, lead.tp.partition)
        objects = await self._io(lambda: list(self.store.list(prefix)))
        if not self._still_leads(lead):
            raise _Abandoned
        # Read after the listing (the image's names can only grow meanwhile), with this
        # broker's own claims: a COPY_STARTED committed but not in the image yet.
        named = [*self._segments(lead).keys(), *self._claims_of(lead).keys()]
        lost = orphans(objects, named, self.clock(), self.orphan_min_age_ms)
        if lost:
            logger.info("%s-%d: deleting %d orphaned object(s)", *lead.tp, len(lost))
            await self._io(_delete_keys, self.store, lost)
        return True

    # -- steps -----------------------------------------------------------------------

    async def _delete_remote(self, lead: _Lead, seg: RemoteSegment) -> bool:
        """DELETE_STARTED, the objects, DELETE_FINISHED: each step committed or done
        before the next, so a crash anywhere leaves a DELETE_STARTED to finish."""
        claims = self._claims_of(lead)
        claims[seg.segment_id] = IN_FLIGHT
        try:
            done = await self._delete_claimed(lead, seg)
        finally:
            if claims.get(seg.segment_id) == IN_FLIGHT:
                del claims[seg.segment_id]  # not finished: stale for the next round
        if done:
            claims[seg.segment_id] = SEGMENT_DELETE_FINISHED
        return done

    async def _delete_claimed(self, lead: _Lead, seg: RemoteSegment) -> bool:
        start = dataclasses.replace(
            seg,
            state=SEGMENT_DELETE_STARTED,
            broker_id=self.broker_id,
            leader_epoch=lead.leader_epoch,
        )
        if await self._record(lead, start) != errors.NONE:
            return False
        keys = self._keys(lead, seg.start_offset, seg.segment_id)
        # Gone for readers now: its cached chunks go, and reads under way fail retriably
        # (the retry finds it deleted) rather than meet a missing object.
        self.reader.forget(keys)
        try:
            await self._with_retries(lead, self._io_pool, None, delete_segment, self.store, keys)
        except _Abandoned:
            raise
        except Exception as e:
            self._count("remote_delete_errors")
            logger.warning("%s-%d: deleting %s failed: %r", *lead.tp, keys.log, e)
            return False
        self._count("remote_delete_requests")
        finished = dataclasses.replace(start, state=SEGMENT_DELETE_FINISHED)
        return await self._record(lead, finished) == errors.NONE

    async def _record(self, lead: _Lead, segment: RemoteSegment) -> int:
        """Commit one state change through the controller: NONE once committed, or the
        error code of a certain refusal (the record is not in the metadata log).

        A request that fails (the controller's answer lost, its failover or stall past
        the channel's deadline) may still have committed: the outcome is unknown, and
        only the committed state can tell. The identical record is sent again, with
        backoff, while this broker leads (the controller takes a change already made as
        a retry that succeeds). A fenced answer does not tell either, since an earlier
        send may have committed first. Both raise _Abandoned once leadership is gone, so
        the caller deletes nothing: the next leader's cleanup or the orphan sweep owns
        whatever is left. Any other failure raises _Unrecorded: resent, it would fail
        the same way forever, and the round (retention, the sweep) would never end."""
        backoff = BACKOFF_MIN_S
        while True:
            try:
                (result,) = await self.propose([segment])
            except Exception as e:
                if self._committed(lead, segment):
                    return errors.NONE
                if not self._still_leads(lead):
                    raise _Abandoned from e
                if not _outcome_unknown(e):
                    logger.warning(
                        "%s-%d: recording segment %s state %d failed: %r (not resent)",
                        *lead.tp,
                        segment.segment_id,
                        segment.state,
                        e,
                    )
                    raise _Unrecorded(repr(e)) from e
                logger.warning(
                    "%s-%d: recording segment %s state %d: %r (outcome unknown: retrying)",
                    *lead.tp,
                    segment.segment_id,
                    segment.state,
                    e,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            code = result.error_code
            if code:
                logger.info(
                    "%s-%d: the controller refused segment %s state %d: error %d %s",
                    *lead.tp,
                    segment.segment_id,
                    segment.state,
                    code,
                    result.error_message or "",
                )
            if code in FENCED:
                raise _Abandoned
            return code

    def _committed(self, lead: _Lead, segment: RemoteSegment) -> bool:
        """Whether the image shows ``segment`` committed as proposed. (Not for
        DELETE_FINISHED: an image without the segment may not show it yet; resending
        that record is always safe.)"""
        cur = self._segments(lead).get(segment.segment_id)
        return segment.state != SEGMENT_DELETE_FINISHED and cur == segment

    async def _with_retries(
        self,
        lead: _Lead,
        pool: ThreadPoolExecutor,
        slots: asyncio.Semaphore | None,
        fn: Callable[..., T],
        *args: Any,
    ) -> T:
        """``fn(*args)`` on ``pool``, again after a backoff while it fails retriably and
        this broker still leads (raises _Abandoned once it does not)."""
        loop = asyncio.get_running_loop()
        backoff = BACKOFF_MIN_S
        while True:
            if not self._still_leads(lead):
                raise _Abandoned
            try:
                if slots is None:
                    return await loop.run_in_executor(pool, fn, *args)
                async with slots:
                    return await loop.run_in_executor(pool, fn, *args)
            except RemoteStorageError as e:
                if not e.retriable:
                    raise
                self._count(
                    "remote_copy_errors" if pool is self._copy_pool else "remote_delete_errors"
                )
                logger.warning("%s-%d: remote storage: %s (retrying)", *lead.tp, e)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io_pool, fn, *args)

    def _count(self, counter: str, amount: float = 1) -> None:
        if self.metrics is not None:
            self.metrics.count(counter, amount)


def _list_keys(store: ObjectStore, prefix: str) -> list[str]:
    return [o.key for o in store.list(prefix)]


def _delete_keys(store: ObjectStore, keys: Sequence[str]) -> None:
    for i in range(0, len(keys), DELETE_BATCH):
        store.delete(keys[i : i + DELETE_BATCH])


def _make_reader(config: BrokerConfig, store: ObjectStore) -> RemoteReader:
    """The RemoteReader fetches below the local log start go through."""
    return RemoteReader(
        store,
        cache_bytes=config["remote.fetch.chunk.cache.size.bytes"],
        chunk_size=config["remote.fetch.chunk.size.bytes"],
        threads=config["remote.log.reader.threads"],
        prefetch_chunks=config["remote.fetch.prefetch.chunks"],
    )
