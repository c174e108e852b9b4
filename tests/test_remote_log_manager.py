"""The remote log manager's driver (broker/remote_log_manager.py) against an in-memory
object store and the real controller logic (`QuorumController.record_remote_segment`):
what reaches the store and the metadata image after each round."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from remote_helpers import offsets_held_nowhere
from test_quorum_controller import Cluster

from rillet.broker import remote_log_manager as rlm_module
from rillet.broker.config import broker_config_table
from rillet.broker.metrics import BrokerMetrics
from rillet.broker.remote_fetch import RemoteLogViews
from rillet.broker.remote_log_manager import RemoteLogManager
from rillet.client.wire import messages as m
from rillet.client.wire import records
from rillet.client.wire.errors import RequestTimedOutError, UnsupportedVersionError, code_of
from rillet.controller.metadata.describe import CLUSTER_ID_KEY
from rillet.controller.metadata.image import (
    RESOURCE_BROKER,
    SEGMENT_COPY_FINISHED,
    SEGMENT_COPY_STARTED,
    SEGMENT_DELETE_FINISHED,
    SEGMENT_DELETE_STARTED,
    Config,
    MetadataDelta,
    RemoteSegment,
    RemoveTopic,
    TopicPartition,
)
from rillet.controller.metadata.remote_log import remote_log_view
from rillet.storage import Log, LogConfig, retention
from rillet.storage.remote.layout import (
    CLUSTER_MARKERS,
    cluster_marker_key,
    parse_segment_key,
    parse_topic_of_key,
    segment_keys,
)
from rillet.storage.remote.store import MemoryObjectStore, RemoteStorageError

TP = TopicPartition("t", 0)
NOW = 10**12  # wall clock of the manager and the store (ms)


class Harness:
    """One broker leading t-0 (rf 3) with a real log, a MemoryObjectStore and a
    controller whose committed records become the broker's image at once."""

    def __init__(
        self,
        tmp_path: Path,
        store: MemoryObjectStore | None = None,
        cluster_id: str = "cluster-a",
        seed: int | None = None,  # another seed: other topic ids (another cluster)
        **log_settings: Any,
    ) -> None:
        self.c = Cluster(brokers=3)
        if seed is not None:
            self.c.ctl.rng = random.Random(seed)
        # As the first active controller does: the image names its cluster.
        self.c.run(([Config(RESOURCE_BROKER, *CLUSTER_ID_KEY, cluster_id)], None))
        self.c.create("t", rf=3, configs={"remote.storage.enable": "true"})
        p = self.c.p("t")
        self.topic_id, self.leader = p.topic_id, p.leader
        cfg = LogConfig(segment_bytes=1024, remote_storage_enable=True, file_delete_delay_ms=0)
        self.log = Log.open(
            tmp_path / "t-0", dataclasses.replace(cfg, **log_settings), clock=lambda: NOW
        )
        self.log.epochs.assign(p.leader_epoch, 0)
        self.replica = SimpleNamespace(topic_id=self.topic_id, log=self.log)
        self.replicas = SimpleNamespace(
            broker_id=self.leader,
            image=self.c.image,
            replicas={TP: self.replica},
            views=RemoteLogViews(),
        )
        self.now = NOW
        self.store = store or MemoryObjectStore(clock=lambda: self.now)
        self.refuse: dict[int, int] = {}  # state -> the error the controller answers
        # (state, commits): the next proposal of that state raises as a lost answer
        # does, after the controller committed it (True) or before (False).
        self.lost: list[tuple[int, bool]] = []
        self.before_record: Any = None  # called with each proposed record
        self.after_record: Any = None  # awaited with each record once committed
        self.proposed: list[RemoteSegment] = []
        config = broker_config_table().load(
            None, ["node.id=1", "remote.log.orphan.min.age.ms=1000"]
        )
        self.metrics = BrokerMetrics()
        self.rlm = RemoteLogManager(
            config,  # type: ignore[arg-type]
            self.store,
            self.replicas,  # type: ignore[arg-type]
            self.propose,
            metrics=self.metrics,
            wall_clock_ms=lambda: self.now,
        )

    async def propose(self, segments: list[RemoteSegment]) -> list[m.RemoteSegmentResult]:
        out = []
        for seg in segments:
            self.proposed.append(seg)
            if self.before_record is not None:
                self.before_record(seg)
            lost = next((x for x in self.lost if x[0] == seg.state), None)
            if lost is not None:
                self.lost.remove(lost)
                if not lost[1]:
                    raise RequestTimedOutError("the controller did not answer in time")
            epoch = self.c.epochs[self.replicas.broker_id]
            records_, result = self.c.ctl.record_remote_segment(
                self.c.image, self.replicas.broker_id, epoch, seg
            )
            if seg.state in self.refuse:
                records_ = []
                result = dataclasses.replace(result, error_code=self.refuse[seg.state])
            self.commit(records_)
            if self.after_record is not None:
                await self.after_record(seg)
            if lost is not None:
                raise RequestTimedOutError("committed, but the answer was lost")
            out.append(m.RemoteSegmentResult(seg.segment_id, result.error_code, None))
        return out

    def commit(self, records_: list[Any]) -> None:
        before = self.c.image
        self.c.run((records_, None))
        delta = MetadataDelta(before)
        delta.replay_all(records_, self.c.image.offset, 1)
        self.replicas.image = self.c.image
        self.rlm.on_metadata(delta, self.c.image, [])

    def produce(self, batches: int = 40) -> None:
        for _ in range(batches):
            self.log.append(records.encode_batch([b"v" * 40] * 4, timestamps=[NOW] * 4), 1)
        self.log.high_watermark = self.log.log_end_offset

    def segments(self) -> dict[str, RemoteSegment]:
        return dict(self.c.image.remote_segments.get((self.topic_id, 0), {}))

    def view(self) -> Any:
        return remote_log_view(self.c.image, self.topic_id, 0)

    def stored(self) -> list[str]:
        """Every key but the cluster's marker (written before the first upload)."""
        keys = self.store.keys()  # noqa: SIM118 (a store, not a dict)
        return [k for k in keys if not k.startswith(CLUSTER_MARKERS)]

    def named_by_objects(self) -> set[str]:
        return {parse_segment_key(k)[1] for k in self.stored()}  # type: ignore[index]

    def move_leader(self) -> None:
        self.c.heartbeat(self.leader, fence=True)
        self.replicas.image = self.c.image

    def keys(self, seg: RemoteSegment) -> Any:
        return segment_keys("t", self.topic_id, 0, seg.start_offset, seg.segment_id)

    def check_finished_segments_are_stored(self) -> None:
        """The tier's invariant: every segment the image calls finished has both its
        objects in the store (else its reads fail for good once local copies go)."""
        stored = set(self.stored())
        for seg in self.segments().values():
            if seg.state == SEGMENT_COPY_FINISHED:
                keys = self.keys(seg)
                assert {keys.log, keys.manifest} <= stored, f"objects of {seg} are gone"

    async def close(self) -> None:
        self.check_finished_segments_are_stored()
        await self.rlm.close()
        self.log.close()


async def test_closed_committed_segments_are_copied_oldest_first_and_recorded(tmp_path) -> None:
    h = Harness(tmp_path)
    h.produce()
    segs = h.log.segments
    h.log.high_watermark = segs[-2].base_offset  # the last closed segment not committed
    await h.rlm.run_once()
    finished = sorted(h.segments().values(), key=lambda s: s.start_offset)
    assert [s.start_offset for s in finished] == [s.base_offset for s in segs[:-2]]
    assert all(s.state == SEGMENT_COPY_FINISHED for s in finished)
    assert all(
        (s.broker_id, s.leader_epoch) == (h.leader, h.c.p("t").leader_epoch) for s in finished
    )
    assert h.view().end_offset == segs[-2].base_offset - 1
    # Each segment has its log object and manifest, named by its start and segment id.
    for s in finished:
        keys = segment_keys("t", h.topic_id, 0, s.start_offset, s.segment_id)
        assert {keys.log, keys.manifest} <= set(h.stored())
        assert s.size_bytes == next(x.size for x in segs if x.base_offset == s.start_offset)
    assert len(h.stored()) == 2 * len(finished)
    # The replica learned the remote end from the metadata change.
    assert h.log.remote_copied_end == h.view().end_offset
    snap = h.metrics.snapshot()
    assert snap["remote_copy_requests_total"] == len(finished)
    assert snap["remote_copy_bytes_total"] == sum(s.size_bytes for s in finished)
    # A second round copies only what the high watermark now covers.
    h.log.high_watermark = h.log.log_end_offset
    await h.rlm.run_once()
    assert len(h.segments()) == len(segs) - 1
    # The gauges describe the pass as it began: one committed segment not yet remote.
    snap = h.metrics.snapshot()
    assert (snap["remote_copy_lag_segments"], snap["remote_copy_lag_bytes"]) == (1, segs[-2].size)
    assert snap["remote_log_size_bytes"] == sum(s.size_bytes for s in finished)
    await h.rlm.run_once()
    assert len(h.segments()) == len(segs) - 1  # nothing twice
    await h.close()


async def test_local_retention_then_deletes_only_what_is_remote(tmp_path) -> None:
    h = Harness(tmp_path, local_retention_bytes=0)
    h.produce()
    h.log.high_watermark = h.log.segments[3].base_offset
    assert await retention.apply_retention(h.log) == 0  # nothing remote yet
    await h.rlm.run_once()
    assert await retention.apply_retention(h.log) == 3
    assert h.log.log_start_offset == h.view().end_offset + 1
    await h.close()


async def test_a_new_leader_cleans_up_unfinished_work_of_other_writers(tmp_path) -> None:
    h = Harness(tmp_path)
    h.produce()
    # The broker before us started a copy, uploaded part of it, and died.
    other = next(b for b in h.c.p("t").replicas if b != h.leader)
    h.replicas.broker_id = other
    epoch = h.c.p("t").leader_epoch
    h.c.run(h.c.ctl.elect_preferred_leaders(h.c.image))  # make sure of the leader
    stale = RemoteSegment(
        h.topic_id, 0, "stale", 0, 99, ((0, 0),), SEGMENT_COPY_STARTED, 10, 1, h.leader, epoch
    )
    h.replicas.broker_id = h.leader
    h.commit([stale])
    keys = segment_keys("t", h.topic_id, 0, 0, "stale")
    h.store.put(keys.log, b"half an upload")
    h.move_leader()  # the leader changes; the new one is 'us' now
    new = h.c.p("t")
    h.replicas.broker_id = h.rlm.broker_id = new.leader
    await h.rlm.run_once()
    assert "stale" not in h.segments()
    assert keys.log not in h.stored()
    assert all(s.state == SEGMENT_COPY_FINISHED for s in h.segments().values())
    assert all(s.leader_epoch == new.leader_epoch for s in h.segments().values())
    assert h.named_by_objects() == set(h.segments())
    await h.close()


async def test_a_copy_fenced_at_its_finish_leaves_its_objects_to_the_next_leader(
    tmp_path,
) -> None:
    h = Harness(tmp_path)
    h.produce(10)
    # A new leader was elected meanwhile. The fenced answer cannot tell whether an
    # earlier send of the same request committed (the channel resends what it lost the
    # answer to): deleting the objects could delete a finished segment's.
    h.refuse = {SEGMENT_COPY_FINISHED: code_of("FENCED_LEADER_EPOCH")}
    await h.rlm.run_once()
    (started,) = h.segments().values()
    assert started.state == SEGMENT_COPY_STARTED
    assert h.named_by_objects() == {started.segment_id}  # named by its record
    # The next leader's cleanup deletes the record and the objects it names.
    h.refuse = {}
    h.move_leader()
    h.replicas.broker_id = h.rlm.broker_id = h.c.p("t").leader
    await h.rlm.run_once()
    assert started.segment_id not in h.segments()
    assert h.named_by_objects() == set(h.segments())
    await h.close()


async def test_retriable_store_errors_are_retried_until_the_upload_goes_through(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(rlm_module, "BACKOFF_MIN_S", 0.001)
    h = Harness(tmp_path)
    h.produce(10)
    h.store.fail_next(3)
    await h.rlm.run_once()
    assert [s.state for s in h.segments().values()] == [SEGMENT_COPY_FINISHED] * len(h.segments())
    assert h.segments()
    assert h.metrics.snapshot()["remote_copy_errors_total"] == 3
    await h.close()


async def test_a_failed_upload_is_deleted_with_its_record(tmp_path) -> None:
    h = Harness(tmp_path)
    h.produce(10)
    h.store.fail_next(1, retriable=False)
    await h.rlm.run_once()
    assert h.segments() == {} and h.stored() == []  # given up, nothing left behind
    h.now += h.rlm.interval_s * 1000  # the segment's retry is due at the next interval
    await h.rlm.run_once()
    assert h.segments() and h.named_by_objects() == set(h.segments())  # the next round copies
    await h.close()


async def test_remote_retention_deletes_segments_and_objects(tmp_path) -> None:
    h = Harness(tmp_path, local_retention_bytes=0, retention_ms=60_000)
    h.produce()
    await h.rlm.run_once()
    await retention.apply_retention(h.log)
    copied = len(h.segments())
    assert copied > 3
    h.now += 61_000  # everything remote is past retention.ms now
    await h.rlm.run_once()
    assert h.segments() == {}
    assert h.stored() == []
    assert h.metrics.snapshot()["remote_delete_requests_total"] == copied
    await h.close()


async def test_remote_retention_bytes_bounds_the_whole_log(tmp_path) -> None:
    h = Harness(tmp_path, local_retention_bytes=0, retention_ms=-1, retention_bytes=4000)
    h.produce()
    await h.rlm.run_once()  # copies; remote retention waits: every copy is still local
    copied = sorted(h.segments().values(), key=lambda s: s.start_offset)
    assert len(copied) > 6 and h.stored()
    await retention.apply_retention(h.log)  # local retention: the remote ones leave
    await h.rlm.run_once()
    kept = sorted(h.segments().values(), key=lambda s: s.start_offset)
    assert 0 < len(kept) < len(copied)
    assert kept == copied[len(copied) - len(kept) :]  # the oldest went
    total = sum(s.size_bytes for s in kept) + h.log.size_bytes
    assert total - kept[0].size_bytes < 4000 <= total  # whole segments, no more than needed
    assert h.named_by_objects() == {s.segment_id for s in kept}
    await h.close()


async def test_the_sweep_deletes_old_objects_no_segment_names(tmp_path) -> None:
    h = Harness(tmp_path)
    stray = segment_keys("t", h.topic_id, 0, 500, "stray")
    h.store.put(stray.log, b"x")
    h.store.put("t-" + h.topic_id + "/0/notes.txt", b"not ours")
    h.now += 500
    young = segment_keys("t", h.topic_id, 0, 600, "young")
    h.store.put(young.log, b"x")
    h.now += 600  # stray is 1100 ms old, young 600 ms: the minimum age is 1000 ms
    await h.rlm.run_once()
    assert stray.log not in h.stored()
    assert young.log in h.stored() and f"t-{h.topic_id}/0/notes.txt" in h.stored()
    await h.close()


async def test_a_deleted_topics_prefix_is_emptied(tmp_path) -> None:
    h = Harness(tmp_path)
    h.produce(10)
    await h.rlm.run_once()
    assert h.stored()
    h.store.put("other-topic/0/x.log", b"x")
    h.commit([RemoveTopic(h.topic_id)])
    await asyncio.gather(*h.rlm._topic_deletes)
    assert h.stored() == ["other-topic/0/x.log"]
    await h.close()


async def test_the_bucket_sweep_deletes_prefixes_of_topics_deleted_while_away(tmp_path) -> None:
    h = Harness(tmp_path)
    h.produce(10)
    await h.rlm.run_once()
    live = set(h.stored())
    assert live
    # Topic 'gone' had objects; it was deleted while every broker holding it was away,
    # so nobody deleted its prefix (no on_metadata here).
    (gone,) = h.c.run(h.c.ctl.create_topics(h.c.image, [("gone", 2, 1, {})]))
    old = [segment_keys("gone", gone.topic_id, p, 0, f"s{p}") for p in (0, 1)]
    for keys in old:
        h.store.put(keys.log, b"x")
        h.store.put(keys.manifest, b"m")
    h.c.run(h.c.ctl.delete_topics(h.c.image, ["gone"]))
    h.replicas.image = h.c.image
    foreign = ["backups/2026/db.tar", f"notes-{'A' * 22}/readme.txt", f"x-{'A' * 22}/0/y.log"]
    for key in foreign:
        h.store.put(key, b"not ours")
    h.now += 1000  # all of the above are as old as the minimum age now
    # An unknown topic created a moment ago (this image does not show it yet).
    young = segment_keys("fresh", "B" * 22, 0, 0, "new")
    h.store.put(young.log, b"x")
    h.now += 500
    keep = live | set(foreign) | {young.log}
    gone_keys = {k for keys in old for k in keys}
    assert set(h.stored()) == keep | gone_keys
    sweeper = min(h.c.image.unfenced_broker_ids())
    h.replicas.broker_id = h.rlm.broker_id = sweeper + 1  # not the sweeper: nothing
    h.rlm.metadata_age_ms = lambda: 0.0
    assert await h.rlm.sweep_bucket() == [] and set(h.stored()) == keep | gone_keys
    h.replicas.broker_id = h.rlm.broker_id = sweeper
    h.rlm.metadata_age_ms = lambda: 501.0  # an image possibly older than half the age
    assert await h.rlm.sweep_bucket() == [] and set(h.stored()) == keep | gone_keys
    h.rlm.metadata_age_ms = None  # a link that cannot tell: never
    assert await h.rlm.sweep_bucket() == []
    h.rlm.metadata_age_ms = lambda: 100.0
    assert await h.rlm.sweep_bucket() == [f"gone-{gone.topic_id}/"]
    assert set(h.stored()) == keep
    h.now += 1000  # the young one is old enough now, and its topic still unknown
    assert await h.rlm.sweep_bucket() == [f"fresh-{'B' * 22}/"]
    assert set(h.stored()) == live | set(foreign)
    await h.close()


async def test_clusters_sharing_a_bucket_prefix_never_sweep_each_others_topics(
    tmp_path, caplog
) -> None:
    """Each cluster marks the prefix with its id before its first upload; a sweeper
    that finds another cluster's marker sweeps nothing (the other's topic ids are not
    in its image, so its prefixes would all look deleted) and says why."""
    store = MemoryObjectStore(clock=lambda: NOW)
    hosts = []
    for name, cid, seed in (("a", "cluster-a", 11), ("b", "cluster-b", 12)):
        h = Harness(tmp_path / name, store=store, cluster_id=cid, seed=seed)
        (own,) = h.c.run(h.c.ctl.create_topics(h.c.image, [(f"{name}-only", 1, 1, {})]))
        h.replicas.image = h.c.image
        keys = segment_keys(f"{name}-only", own.topic_id, 0, 0, f"seg-{name}")
        store.put(keys.log, b"x")
        store.put(keys.manifest, b"m")
        h.produce(10)
        await h.rlm.run_once()  # its first upload marks the prefix first
        assert cluster_marker_key(cid) in store.keys()  # noqa: SIM118
        h.rlm.metadata_age_ms = lambda: 10.0
        h.replicas.broker_id = h.rlm.broker_id = min(h.c.image.unfenced_broker_ids())
        hosts.append(h)
    a, b = hosts
    before = set(store.keys())  # noqa: SIM118 (a store, not a dict)
    prefixes = {parse_topic_of_key(k) for k in before} - {None}
    assert len(prefixes) == 4  # t and {a,b}-only of each cluster
    a.now = b.now = NOW + 10**6  # everything is old enough to sweep
    with caplog.at_level(logging.WARNING, logger=rlm_module.__name__):
        assert await a.rlm.sweep_bucket() == []
        assert await b.rlm.sweep_bucket() == []
    assert set(store.keys()) == before  # noqa: SIM118
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("cluster" in w and "own prefix" in w for w in warnings)
    assert "cluster-b" in warnings[0] and "cluster-a" in warnings[1]
    # Alone again (the other cluster moved to its own prefix): the sweep runs.
    store.delete([cluster_marker_key("cluster-b")])
    b_prefixes = {f"{t}-{b.c.image.topic(t).topic_id}/" for t in ("t", "b-only")}
    assert set(await a.rlm.sweep_bucket()) == b_prefixes
    await a.close()
    await b.rlm.close()  # its objects went with the sweep: no stored-segments check
    b.log.close()


async def test_a_leader_marks_the_prefix_at_its_first_round_with_nothing_to_copy(
    tmp_path,
) -> None:
    """So a cluster whose objects predate the markers (or that uploads nothing for a
    while) is marked within one task interval, before another cluster's sweep could
    take its topics for deleted ones; a store refusing the marker is tried again."""
    h = Harness(tmp_path)
    h.store.unavailable = True
    await h.rlm.run_once()
    assert h.store.keys() == []  # nothing to copy, and the marker refused
    h.store.unavailable = False
    await h.rlm.run_once()
    assert h.store.keys() == [cluster_marker_key("cluster-a")]
    await h.close()


async def test_the_bucket_sweep_marks_the_prefix_and_needs_the_cluster_id(tmp_path) -> None:
    h = Harness(tmp_path)
    h.rlm.metadata_age_ms = lambda: 10.0
    h.replicas.broker_id = h.rlm.broker_id = min(h.c.image.unfenced_broker_ids())
    assert await h.rlm.sweep_bucket() == []
    marker = cluster_marker_key("cluster-a")
    assert h.store.keys() == [marker]  # before any upload of its own
    assert h.store.get(marker) == b"cluster-a"
    assert parse_segment_key(marker) is None and parse_topic_of_key(marker) is None
    # An image without the cluster id (not caught up yet): no sweep at all.
    nameless = Harness(tmp_path / "nameless")
    nameless.c.run(([Config(RESOURCE_BROKER, *CLUSTER_ID_KEY, None)], None))
    nameless.replicas.image = nameless.c.image
    nameless.rlm.metadata_age_ms = lambda: 10.0
    nameless.replicas.broker_id = nameless.rlm.broker_id = h.rlm.broker_id
    assert await nameless.rlm.sweep_bucket() == [] and nameless.store.keys() == []
    await h.close()
    await nameless.close()


async def test_an_unclean_leader_replaces_the_remote_records_past_its_log(tmp_path) -> None:
    """A leader elected with a log that ends inside the remote log (an unclean
    election) deletes the remote segments past where its log agrees, then copies its
    own history from there: the remote log never holds two histories, and local
    retention never takes its new records for remote ones."""
    h = Harness(tmp_path, local_retention_bytes=0)
    h.produce()
    await h.rlm.run_once()
    before = h.view()
    remote_end = before.end_offset
    assert len(before.segments) > 3
    # Another replica, which had only the records below `cut`, is elected; here the
    # same log object plays its log.
    h.log.truncate_to(before.segments[2].start_offset + 5)  # whole batches: ends lower
    cut = h.log.log_end_offset
    assert before.segments[2].start_offset < cut <= before.segments[2].end_offset
    h.move_leader()
    new = h.c.p("t")
    h.replicas.broker_id = h.rlm.broker_id = new.leader
    epoch = h.log.latest_epoch + 1  # the harness's records carry epoch 1, not the image's
    for _ in range(40):  # its own records from `cut` on, in its epoch
        h.log.append(records.encode_batch([b"n" * 40] * 4, timestamps=[NOW] * 4), epoch)
    h.log.high_watermark = h.log.log_end_offset
    assert h.log.log_end_offset > remote_end
    # Local retention: only what agrees with the remote log counts as remote.
    assert h.log.remote_copied_end == remote_end
    assert h.log.remote_end_in_lineage() == cut - 1
    await retention.apply_retention(h.log)
    assert h.log.log_start_offset <= before.segments[2].start_offset
    # Round one deletes the remote segments past cut - 1 (the leader still holds them
    # from their start), round two copies its own log from the remote end on.
    await h.rlm.run_once()
    assert h.view().end_offset == before.segments[1].end_offset
    assert h.named_by_objects() == set(h.segments())
    await h.rlm.run_once()
    after = h.view()
    assert after.end_offset == h.log.segments[-1].base_offset - 1 > remote_end
    starts = [s.start_offset for s in after.segments]
    assert starts == sorted(starts) and all(
        a.end_offset + 1 == b.start_offset
        for a, b in zip(after.segments, after.segments[1:], strict=False)
    )
    assert [e for e, _ in after.leader_epochs()][-1] == epoch
    assert h.log.remote_end_in_lineage() == after.end_offset
    assert h.named_by_objects() == set(h.segments())
    await h.close()


async def _hole(h: Harness) -> RemoteSegment:
    """A DELETE_STARTED committed for a middle remote segment, by this leader in its
    epoch (its delete under way, or failed): the finished segments have a hole."""
    h.produce()
    await h.rlm.run_once()
    segs = h.view().segments
    assert len(segs) > 4
    gone = dataclasses.replace(
        segs[2], state=SEGMENT_DELETE_STARTED, leader_epoch=h.c.p("t").leader_epoch
    )
    (result,) = await h.propose([gone])
    assert result.error_code == 0
    return gone


async def test_local_retention_never_counts_remote_segments_past_a_hole(tmp_path) -> None:
    h = Harness(tmp_path, local_retention_bytes=0)
    gone = await _hole(h)
    view = h.view()
    assert view.contiguous_end == gone.start_offset - 1 < view.end_offset
    assert h.log.remote_copied_end == view.contiguous_end
    await retention.apply_retention(h.log)
    assert h.log.log_start_offset <= gone.start_offset  # the hole's records stay local
    assert offsets_held_nowhere(h.log, view.segments) == []
    await h.close()


async def test_a_leader_fills_a_hole_in_the_remote_log_from_its_own_log(tmp_path) -> None:
    """Offsets no finished remote segment holds are not remote, so the remote log
    agrees with the leader's only up to the hole: the segments past it go (newest
    first) and are copied again, and local retention can move on."""
    h = Harness(tmp_path, local_retention_bytes=0)
    gone = await _hole(h)
    await h.rlm.run_once()  # deletes past the hole
    assert h.view().end_offset == gone.start_offset - 1
    await h.rlm.run_once()  # copies from there
    view = h.view()
    assert view.contiguous_end == view.end_offset == h.log.segments[-1].base_offset - 1
    await retention.apply_retention(h.log)
    assert h.log.log_start_offset == view.end_offset + 1
    await h.close()


async def test_a_stalled_partition_warns_once_per_interval_not_every_round(
    tmp_path, caplog
) -> None:
    """A leader whose log no longer holds the start of a remote segment straddling the
    divergence keeps that segment and copies nothing more (unreachable with unclean
    election refused on tiered topics): loud, but not at every round."""
    h = Harness(tmp_path, local_retention_bytes=0)
    h.produce()
    await h.rlm.run_once()
    s2 = h.view().segments[2]
    # A lagging replica, elected uncleanly: it has records up to s2's start + 5, and
    # its own retention deleted those below s2's start + 2 (it rolled elsewhere).
    h.log.truncate_to(s2.start_offset + 5)
    h.log.increment_log_start_offset(s2.start_offset + 2)
    h.move_leader()
    h.replicas.broker_id = h.rlm.broker_id = h.c.p("t").leader
    epoch = h.log.latest_epoch + 1
    batch = records.encode_batch([b"n" * 40] * 4, timestamps=[NOW] * 4)

    def stall_warnings() -> int:
        return sum(
            "nothing more is copied" in r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING
        )

    with caplog.at_level(logging.INFO, logger=rlm_module.__name__):
        for _ in range(5):
            for _ in range(10):
                h.log.append(batch, epoch)
            h.log.high_watermark = h.log.log_end_offset
            await h.rlm.run_once()
            h.now += 1000
        assert h.view().end_offset == s2.end_offset  # stalled: nothing more copied
        assert stall_warnings() == 1
        h.now += rlm_module.STALL_WARNING_INTERVAL_MS
        await h.rlm.run_once()
        await h.rlm.run_once()
        assert stall_warnings() == 2
    await h.close()


class FailingAt(MemoryObjectStore):
    """Fails its ``fail_at``-th operation (counted from 1) for good, once."""

    def __init__(self, clock: Any, fail_at: int | None) -> None:
        super().__init__(clock=clock)
        self.fail_at, self.seen = fail_at, 0

    def _enter(self, op: str, key: str) -> None:
        self.seen += 1
        if self.seen == self.fail_at:
            raise RemoteStorageError(f"{op} {key}: failed at op {self.seen}", retriable=False)
        super()._enter(op, key)


async def _diverge_and_clean_up(tmp_path: Path, fail_at: int | None) -> int:
    """An unclean leader's cleanup with local retention run after every committed
    record, checking that no offset is held nowhere; the store's ``fail_at``-th
    operation of the cleanup fails for good (None: none). Returns how many store
    operations the cleanup rounds made."""
    h = Harness(tmp_path, local_retention_bytes=0)
    h.store = h.rlm.store = FailingAt(lambda: h.now, None)
    batch = records.encode_batch([b"v" * 40] * 4, timestamps=[NOW] * 4)
    for _ in range(10):
        h.log.append(batch, 1)
    x = h.log.log_end_offset
    for _ in range(30):  # the old leader's records from x, in epoch 2
        h.log.append(batch, 2)
    h.log.high_watermark = h.log.log_end_offset
    await h.rlm.run_once()
    assert len(h.view().segments) > 5
    # The new leader had x.. in epoch 1 only (it never saw epoch 2) and was elected
    # uncleanly; it writes on in epoch 3.
    h.log.truncate_to(x)
    for _ in range(10):
        h.log.append(batch, 1)
    h.move_leader()
    h.replicas.broker_id = h.rlm.broker_id = h.c.p("t").leader
    for _ in range(10):
        h.log.append(batch, 3)
    h.log.high_watermark = h.log.log_end_offset
    lineage = h.log.epochs.entries()

    lost: list[tuple[RemoteSegment | None, list[tuple[int, int]]]] = []

    holes: list[RemoteSegment | None] = []

    async def check(record: RemoteSegment | None) -> None:
        # Kept, not raised: the round would log an exception and go on.
        if h.view().contiguous_end != h.view().end_offset:
            holes.append(record)
        await retention.apply_retention(h.log)
        missing = offsets_held_nowhere(h.log, h.view().segments, lineage)
        if missing:
            lost.append((record, missing))

    h.after_record = check
    await check(None)
    h.store.seen, h.store.fail_at = 0, fail_at
    for _ in range(4):  # delete past the agreement (a failure ends a round), copy again
        await h.rlm.run_once()
        h.now += 60_000  # past a failed copy's back-off
    ops = h.store.seen
    assert lost == [], f"failing store operation {fail_at}"
    assert holes == [], f"failing store operation {fail_at}"  # contiguous in every state
    assert h.view().contiguous_end == h.view().end_offset  # no hole left
    assert h.view().end_offset == h.log.segments[-1].base_offset - 1  # all copied again
    await h.close()
    return ops


async def test_an_unclean_leaders_cleanup_never_leaves_an_offset_held_nowhere(
    tmp_path, monkeypatch
) -> None:
    """Deleting the remote segments past the agreement, whatever store operation fails
    for good (a DELETE_STARTED committed, its objects never deleted), never lets local
    retention delete a record that no finished remote segment of this history holds:
    the deletes go newest first, and local retention counts as remote only the run of
    finished segments from the remote log start."""
    monkeypatch.setattr(rlm_module, "BACKOFF_MIN_S", 0.001)
    ops = await _diverge_and_clean_up(tmp_path / "clean", None)
    assert ops > 10
    for fail_at in range(1, ops + 1):
        await _diverge_and_clean_up(tmp_path / f"fail-{fail_at}", fail_at)


async def test_a_log_compacted_by_this_brokers_config_is_never_tiered(tmp_path, caplog) -> None:
    """The controller checks a tiered topic's config against the built-in defaults; a
    broker whose own log.cleanup.policy makes the log compacted skips it, and says so
    once per topic."""
    h = Harness(tmp_path, cleanup_policy="compact,delete")
    h.produce()
    with caplog.at_level(logging.WARNING, logger=rlm_module.__name__):
        await h.rlm.run_once()
        h.now += 60_000
        await h.rlm.run_once()
    assert h.segments() == {} and h.stored() == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "topic t has" in warnings[0] and "compact" in warnings[0]
    await h.close()


async def test_a_follower_runs_no_rounds(tmp_path) -> None:
    h = Harness(tmp_path)
    h.produce(10)
    h.replicas.broker_id = h.rlm.broker_id = next(b for b in h.c.p("t").replicas if b != h.leader)
    await h.rlm.run_once()
    assert h.segments() == {} and h.stored() == []
    await h.close()


# -- outcomes the controller never answered ------------------------------------------


async def test_a_finish_committed_but_unanswered_keeps_its_objects(tmp_path) -> None:
    h = Harness(tmp_path, local_retention_bytes=0)
    h.produce(10)
    # The controller commits COPY_FINISHED, then its answer is lost (a failover, a stall
    # past the channel's deadline): the segment is finished for the whole cluster.
    h.lost = [(SEGMENT_COPY_FINISHED, True)]
    await h.rlm.run_once()
    segs = sorted(h.segments().values(), key=lambda s: s.start_offset)
    assert segs and all(s.state == SEGMENT_COPY_FINISHED for s in segs)
    h.check_finished_segments_are_stored()
    # Local retention deletes the local copies; the first segment is read from the store.
    assert await retention.apply_retention(h.log) == len(segs)
    first = segs[0]
    keys = h.keys(first)
    manifest = await h.rlm.reader.manifest(keys)
    data = await h.rlm.reader.read(keys, manifest, first.start_offset, 1 << 20)
    assert records.read_header(data).base_offset == first.start_offset
    await h.close()


async def test_a_record_without_an_answer_is_sent_again_until_it_has_one(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(rlm_module, "BACKOFF_MIN_S", 0.001)
    h = Harness(tmp_path, local_retention_bytes=0, retention_ms=60_000)
    h.produce(10)
    h.lost = [(SEGMENT_COPY_STARTED, False), (SEGMENT_COPY_FINISHED, False)]
    await h.rlm.run_once()
    segs = h.segments()
    assert segs and all(s.state == SEGMENT_COPY_FINISHED for s in segs.values())
    finishes = [s for s in h.proposed if s.state == SEGMENT_COPY_FINISHED]
    assert len(finishes) == len(segs) + 1  # one sent twice, identical
    assert len(set(finishes)) == len(segs)
    # Deletions too: a lost DELETE_STARTED (committed) and DELETE_FINISHED (not).
    await retention.apply_retention(h.log)
    h.now += 61_000
    h.lost = [(SEGMENT_DELETE_STARTED, True), (SEGMENT_DELETE_FINISHED, False)]
    await h.rlm.run_once()
    assert h.segments() == {} and h.stored() == []
    await h.close()


async def test_an_unanswered_finish_once_leadership_moved_deletes_nothing(tmp_path) -> None:
    h = Harness(tmp_path)
    h.produce(10)
    # No answer, and by the time the broker would retry it no longer leads: whether the
    # record committed is unknown, so the objects stay for the next leader to judge.
    h.lost = [(SEGMENT_COPY_FINISHED, False)]
    h.before_record = lambda seg: seg.state == SEGMENT_COPY_FINISHED and h.move_leader()
    await h.rlm.run_once()
    (started,) = h.segments().values()
    assert started.state == SEGMENT_COPY_STARTED
    assert h.named_by_objects() == {started.segment_id}
    h.before_record = None
    h.replicas.broker_id = h.rlm.broker_id = h.c.p("t").leader
    await h.rlm.run_once()  # the next leader: not finished, so deleted, objects and all
    assert started.segment_id not in h.segments()
    assert h.named_by_objects() == set(h.segments())
    await h.close()


async def test_an_error_resending_cannot_change_ends_the_round_and_deletes_nothing(
    tmp_path, monkeypatch
) -> None:
    """A controller that answers every COPY_FINISHED with an error no resend changes
    (here an unsupported version): the copy gives up without deleting its objects
    (whether it committed is not certain), and retention and the sweep still run."""
    monkeypatch.setattr(rlm_module, "BACKOFF_MIN_S", 0.001)
    h = Harness(tmp_path, local_retention_bytes=0, retention_ms=60_000)
    h.produce()
    await h.rlm.run_once()
    await retention.apply_retention(h.log)
    old = set(h.segments())
    h.produce(10)
    stray = segment_keys("t", h.topic_id, 0, 99_999, "stray")
    h.store.put(stray.log, b"x")
    h.now += 61_000  # the remote segments are past retention.ms; the stray is old

    def unsupported(seg: RemoteSegment) -> None:
        if seg.state == SEGMENT_COPY_FINISHED:
            raise UnsupportedVersionError("AlterRemoteSegments")

    h.before_record = unsupported
    # Resent forever, the round never ended (pytest's timeout is the guard).
    await h.rlm.run_once()
    assert not old & set(h.segments())  # retention ran
    assert stray.log not in h.stored()  # the sweep ran
    (started,) = h.segments().values()
    assert started.state == SEGMENT_COPY_STARTED
    assert h.named_by_objects() == {started.segment_id}  # nothing deleted
    # The controller answers again: the next round's cleanup deletes the unfinished copy
    # (record and objects) and the segments are copied.
    h.before_record = None
    h.now += h.rlm.interval_s * 1000
    await h.rlm.run_once()
    assert started.segment_id not in h.segments()
    assert h.segments() and all(s.state == SEGMENT_COPY_FINISHED for s in h.segments().values())
    assert h.named_by_objects() == set(h.segments())
    await h.close()


async def test_a_pass_without_the_partition_keeps_the_claims_of_its_running_round(
    tmp_path,
) -> None:
    """A scheduling pass that finds the partition not led (here its replica briefly
    missing) while its round still runs must keep the round's claims: else the next
    round, on an image that still shows an earlier copy as COPY_STARTED, takes that
    finished copy for left-over work and deletes it."""
    h = Harness(tmp_path)
    h.produce(10)
    started: list[Any] = []  # the image right after each COPY_STARTED committed

    async def after(seg: RemoteSegment) -> None:
        if seg.state != SEGMENT_COPY_STARTED:
            return
        started.append(h.c.image)
        if len(started) == 2:  # the first copy finished; the second under way
            replicas, h.replicas.replicas = h.replicas.replicas, {}
            assert h.rlm.schedule() == []
            h.replicas.replicas = replicas

    h.after_record = after
    await h.rlm.run_once()
    h.after_record = None
    first = min(h.segments().values(), key=lambda s: s.start_offset)
    assert len(started) >= 2 and first.state == SEGMENT_COPY_FINISHED
    # The broker's image lags: it still shows the first copy as COPY_STARTED.
    h.replicas.image = started[0]
    await h.rlm.run_once()
    assert h.segments()[first.segment_id].state == SEGMENT_COPY_FINISHED
    await h.close()


# -- cleanup, failures, deletion ----------------------------------------------------


async def test_its_own_unfinished_deletion_is_finished_by_the_next_round(tmp_path) -> None:
    h = Harness(tmp_path, local_retention_bytes=0, retention_ms=60_000)
    h.produce()
    await h.rlm.run_once()
    await retention.apply_retention(h.log)
    copied = len(h.segments())
    h.now += 61_000
    h.store.fail_next(1, retriable=False)  # the first segment's objects fail to go
    await h.rlm.run_once()
    (left,) = [s for s in h.segments().values() if s.state == SEGMENT_DELETE_STARTED]
    assert (left.broker_id, left.leader_epoch) == (h.leader, h.c.p("t").leader_epoch)
    assert h.named_by_objects() == set(h.segments())  # its objects are still there
    # Same leader, same epoch: its own DELETE_STARTED is not in flight, so it is stale.
    await h.rlm.run_once()
    assert h.segments() == {} and h.stored() == []
    assert h.metrics.snapshot()["remote_delete_requests_total"] == copied
    await h.close()


async def test_an_upload_across_its_topics_deletion_deletes_its_objects(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(rlm_module, "BACKOFF_MIN_S", 0.001)
    gate = threading.Event()
    upload = rlm_module.upload_segment

    def held_upload(*args: Any) -> Any:
        gate.wait(30)
        return upload(*args)

    monkeypatch.setattr(rlm_module, "upload_segment", held_upload)
    h = Harness(tmp_path)
    h.produce(10)
    copying = asyncio.Event()

    def on_record(seg: RemoteSegment) -> None:
        if seg.state == SEGMENT_COPY_STARTED:
            copying.set()
        elif seg.state == SEGMENT_COPY_FINISHED:
            h.store.fail_next(1, retriable=False)  # the first delete of its objects fails

    h.before_record = on_record
    round_ = asyncio.ensure_future(h.rlm.run_once())
    await copying.wait()
    h.commit([RemoveTopic(h.topic_id)])  # while the upload is under way
    await asyncio.gather(*h.rlm._topic_deletes)  # the prefix is empty: nothing yet
    gate.set()  # the upload writes its objects after the topic's prefix was emptied
    await round_
    assert h.stored() == []  # COPY_FINISHED refused (no topic): deleted, once retried
    assert h.metrics.snapshot()["remote_delete_errors_total"] == 1
    await h.close()


async def test_a_failing_copy_lets_retention_and_the_sweep_run_and_backs_off(
    tmp_path,
) -> None:
    h = Harness(tmp_path, local_retention_bytes=0, retention_ms=60_000)
    h.produce()
    await h.rlm.run_once()
    await retention.apply_retention(h.log)
    old = set(h.segments())
    h.produce(10)  # new closed segments to copy
    stray = segment_keys("t", h.topic_id, 0, 99_999, "stray")
    h.store.put(stray.log, b"x")
    h.now += 61_000  # the remote segments are past retention.ms; the stray is old
    h.store.fail_next(1, retriable=False)  # the next upload fails for good
    await h.rlm.run_once()
    assert not old & set(h.segments())  # retention ran
    assert stray.log not in h.stored()  # the sweep ran
    assert h.segments() == {}  # the failed copy left nothing either
    # The same round again: the failed segment waits (no records for it), and so does
    # every later one (copies go in order).
    proposed = len(h.proposed)
    await h.rlm.run_once()
    assert len(h.proposed) == proposed
    # One interval later it is tried again; a second failure waits two.
    interval_ms = h.rlm.interval_s * 1000
    h.now += interval_ms
    h.store.fail_next(1, retriable=False)
    await h.rlm.run_once()
    proposed = len(h.proposed)
    assert h.segments() == {}
    h.now += interval_ms
    await h.rlm.run_once()
    assert len(h.proposed) == proposed
    h.now += interval_ms
    await h.rlm.run_once()
    assert h.segments() and all(s.state == SEGMENT_COPY_FINISHED for s in h.segments().values())
    await h.close()


async def test_deleted_segments_leave_the_readers_cache(tmp_path) -> None:
    h = Harness(tmp_path, local_retention_bytes=0, retention_ms=60_000)
    h.produce()
    await h.rlm.run_once()
    await retention.apply_retention(h.log)
    reader = h.rlm.reader

    async def read_all() -> None:
        for seg in h.segments().values():
            keys = h.keys(seg)
            await reader.read(keys, await reader.manifest(keys), seg.start_offset, 1 << 20)

    await read_all()
    assert len(reader.cache) > 0
    h.now += 61_000
    await h.rlm.run_once()  # retention, on the broker that deletes them
    assert h.segments() == {} and len(reader.cache) == 0
    # On any other broker, the metadata change itself: here the leader's deletion of a
    # segment this broker only read.
    h.now = NOW
    h.produce()
    await h.rlm.run_once()
    await retention.apply_retention(h.log)
    await read_all()
    assert len(reader.cache) > 0
    deleting = [
        dataclasses.replace(s, state=state)
        for s in h.segments().values()
        for state in (SEGMENT_DELETE_STARTED, SEGMENT_DELETE_FINISHED)
    ]
    h.commit(deleting)
    assert len(reader.cache) == 0
    await h.close()
