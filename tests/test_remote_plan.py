"""The remote log manager's decisions (broker/remote_plan.py), on plain values."""

from __future__ import annotations

from pathlib import Path

from rillet.broker.remote_fetch import holds
from rillet.broker.remote_plan import (
    OrphanedTopic,
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
from rillet.client.wire import records
from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    SEGMENT_COPY_STARTED,
    SEGMENT_DELETE_STARTED,
    RemoteSegment,
)
from rillet.controller.metadata.remote_log import RemoteLogView
from rillet.storage import Log, LogConfig
from rillet.storage.epoch_cache import agreed_end
from rillet.storage.remote.layout import segment_keys
from rillet.storage.remote.store import ObjectInfo


def _log(tmp_path: Path, batches: int = 40) -> Log:
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1024), clock=lambda: 0)
    for _ in range(batches):
        log.append(records.encode_batch([b"v" * 40] * 4, timestamps=[5] * 4), 0)
    return log


def test_only_closed_committed_segments_past_the_remote_end_are_copied(tmp_path) -> None:
    log = _log(tmp_path)
    segs = log.segments
    assert len(segs) > 5
    everything = segments_to_copy(segs, log.log_end_offset, -1)
    assert [t.segment for t in everything] == list(segs[:-1])  # never the active one
    assert [t.end_offset for t in everything] == [s.base_offset - 1 for s in segs[1:]]
    # The high watermark inside segment 3: its records are not all committed.
    assert [t.segment for t in segments_to_copy(segs, segs[3].base_offset + 1, -1)] == list(
        segs[:2]
    ) + [segs[2]]
    assert [t.segment for t in segments_to_copy(segs, segs[3].base_offset - 1, -1)] == list(
        segs[:2]
    )
    # Already remote up to the end of segment 1 (or inside segment 2: it goes again whole).
    assert segments_to_copy(segs, log.log_end_offset, segs[2].base_offset - 1)[0].segment is segs[2]
    assert segments_to_copy(segs, log.log_end_offset, segs[2].base_offset)[0].segment is segs[2]
    lag = copy_lag(segs, log.log_end_offset, segs[2].base_offset - 1)
    assert lag.segments == len(segs) - 3 and lag.bytes == sum(s.size for s in segs[2:-1])
    log.close()


def test_the_leader_epochs_a_segment_covers() -> None:
    entries = [(0, 0), (3, 50), (4, 120), (7, 300)]
    assert epochs_in(entries, 0, 49) == ((0, 0),)
    assert epochs_in(entries, 40, 130) == ((0, 40), (3, 50), (4, 120))
    assert epochs_in(entries, 50, 119) == ((3, 50),)
    assert epochs_in(entries, 400, 500) == ((7, 400),)
    assert epochs_in([], 0, 10) == ()


def _remote(start: int, end: int, size: int = 100, ts: int = 0, **over: object) -> RemoteSegment:
    fields: dict[str, object] = dict(state=SEGMENT_COPY_FINISHED, size_bytes=size)
    fields.update(over)
    return RemoteSegment(
        "tid",
        0,
        f"s{start}",
        start,
        end,
        max_timestamp_ms=ts,
        **fields,  # type: ignore[arg-type]
    )


def test_remote_retention_by_time_and_size_only_below_the_local_log_start() -> None:
    segs = [_remote(0, 9, ts=10), _remote(10, 19, ts=20), _remote(20, 29, ts=30)]
    # Time: older than 1000 ms at now=1025 means max timestamp < 25.
    assert remote_segments_past_retention(segs, 30, 0, 1000, -1, 1025) == segs[:2]
    # Segment 20..29 is still local (local log start 25): never deleted remotely yet.
    assert remote_segments_past_retention(segs, 25, 0, 0, -1, 10**6) == segs[:2]
    # Size: 300 remote + 150 local, 250 allowed: the two oldest go.
    assert remote_segments_past_retention(segs, 30, 150, -1, 250, 0) == segs[:2]
    assert remote_segments_past_retention(segs, 30, 150, -1, 350, 0) == segs[:1]
    assert remote_segments_past_retention(segs, 30, 150, -1, -1, 0) == []
    # Oldest first: a young segment stops retention by time before older-looking ones.
    mixed = [_remote(0, 9, ts=50), _remote(10, 19, ts=0)]
    assert remote_segments_past_retention(mixed, 30, 0, 1000, -1, 1025) == []


def test_stale_copies_are_every_other_writers_unfinished_work() -> None:
    mine = _remote(0, 9, state=SEGMENT_COPY_STARTED, broker_id=1, leader_epoch=5)
    old_epoch = _remote(10, 19, state=SEGMENT_COPY_STARTED, broker_id=1, leader_epoch=4)
    other = _remote(20, 29, state=SEGMENT_DELETE_STARTED, broker_id=2, leader_epoch=3)
    done = _remote(30, 39, broker_id=2, leader_epoch=3)
    by_id = {s.segment_id: s for s in (other, done, mine, old_epoch)}
    assert stale_copies(by_id, 1, 5, claimed={mine.segment_id}) == [old_epoch, other]
    # Its own that it does not claim (a delete failed, an answer was lost) are left
    # over too: nothing else would clean them up while it leads.
    assert stale_copies(by_id, 1, 5) == [mine, old_epoch, other]


def test_orphans_are_old_segment_objects_no_segment_names() -> None:
    named = segment_keys("t", "tid", 0, 0, "named")
    stray = segment_keys("t", "tid", 0, 10, "stray")
    young = segment_keys("t", "tid", 0, 20, "young")
    objects = [
        ObjectInfo(named.log, 1, 0, {}),
        ObjectInfo(named.manifest, 1, 0, {}),
        ObjectInfo(stray.log, 1, 0, {}),
        ObjectInfo(stray.manifest, 1, 0, {}),
        ObjectInfo(young.log, 1, 900, {}),
        ObjectInfo("t-tid/0/README", 1, 0, {}),  # not a segment object: never touched
    ]
    assert orphans(objects, ["named"], 1000, 500) == [stray.log, stray.manifest]
    assert orphans(objects, ["named"], 1000, 0) == [stray.log, stray.manifest, young.log]


def test_one_broker_sweeps_the_bucket_the_lowest_unfenced() -> None:
    assert is_bucket_sweeper([2, 3, 5], 2)
    assert not is_bucket_sweeper([2, 3, 5], 3)
    assert not is_bucket_sweeper([], 1)


def test_orphaned_topic_prefixes_are_unknown_topic_ids_all_of_whose_objects_are_old() -> None:
    live, gone, young = "L" * 22, "G-_" + "g" * 19, "Y" * 22  # ids may hold - and _
    objects = [
        ObjectInfo(segment_keys("t", live, 0, 0, "a").log, 1, 0, {}),
        ObjectInfo(segment_keys("my-topic", gone, 0, 0, "b").log, 1, 0, {}),
        ObjectInfo(segment_keys("my-topic", gone, 3, 10, "c").manifest, 1, 100, {}),
        # One young object keeps its whole prefix: the topic may be new to this image.
        ObjectInfo(segment_keys("n", young, 0, 0, "d").log, 1, 0, {}),
        ObjectInfo(segment_keys("n", young, 1, 0, "e").log, 1, 900, {}),
        # Keys outside the layout, even under a prefix of the same shape: never touched.
        ObjectInfo(f"my-topic-{gone}/0/README", 1, 0, {}),
        ObjectInfo(f"my-topic-{gone}/notes.log", 1, 0, {}),
        ObjectInfo("backups/0/" + segment_keys("x", "y", 0, 0, "z").log.split("/")[-1], 1, 0, {}),
        ObjectInfo(f"short-{'s' * 21}/0/" + "0" * 20 + "-f.log", 1, 0, {}),
        ObjectInfo(f"-{'u' * 22}/0/" + "0" * 20 + "-f.log", 1, 0, {}),  # no topic name
        ObjectInfo(f"bad-{'!' * 22}/0/" + "0" * 20 + "-f.log", 1, 0, {}),
    ]
    got = orphaned_topic_prefixes(objects, {live}, 1000, 500)
    assert got == [
        OrphanedTopic(
            f"my-topic-{gone}/",
            gone,
            [
                segment_keys("my-topic", gone, 0, 0, "b").log,
                segment_keys("my-topic", gone, 3, 10, "c").manifest,
            ],
        )
    ]
    later = orphaned_topic_prefixes(objects, {live}, 1400, 500)
    assert [(t.prefix, t.topic_id) for t in later] == [
        (f"my-topic-{gone}/", gone),
        (f"n-{young}/", young),
    ]
    assert orphaned_topic_prefixes(objects, {live, gone, young}, 10**6, 0) == []


# -- an unclean election: a leader whose log disagrees with the remote log -------------
# The remote log: offsets 0..299, epoch 3 from 0 and epoch 5 from 100; segments 0..99,
# 100..199, 200..299.
REMOTE_EPOCHS = [(3, 0), (5, 100)]


def _three_remote_segments() -> list[RemoteSegment]:
    return [
        RemoteSegment("tid", 0, "a", 0, 99, ((3, 0),), SEGMENT_COPY_FINISHED, 1, 1, 1, 5),
        RemoteSegment("tid", 0, "b", 100, 199, ((5, 100),), SEGMENT_COPY_FINISHED, 1, 1, 1, 5),
        RemoteSegment("tid", 0, "c", 200, 299, ((5, 200),), SEGMENT_COPY_FINISHED, 1, 1, 1, 5),
    ]


def test_a_log_agrees_with_the_remote_log_where_both_wrote_in_the_same_epochs() -> None:
    def agreed(local: list[tuple[int, int]], start: int, end: int) -> int:
        return agreed_end(local, start, end, REMOTE_EPOCHS, 0, 299)

    # A clean leader holds every remote offset in the same epochs, and more.
    assert agreed([(3, 0), (5, 100), (7, 400)], 250, 500) == 299
    # Its local log starting past the remote end, with epochs rebuilt from its own
    # batches only: nothing to compare, nothing diverged.
    assert agreed([(7, 300)], 300, 500) == 299
    assert agreed([], 300, 300) == 299
    # An unclean leader that stopped at 150 in epoch 5 (a lagging replica): agreed up
    # to its end, whether or not it wrote in its own epoch since.
    assert agreed([(3, 0), (5, 100)], 120, 150) == 149
    assert agreed([(3, 0), (5, 100), (8, 150)], 120, 400) == 149
    # One that never had epoch 5: it wrote epoch 4 from 90, which the remote log never
    # held; offsets from 90 on are others than the remote ones.
    assert agreed([(3, 0), (4, 90), (8, 130)], 50, 200) == 89
    assert agreed([(4, 90), (8, 130)], 95, 200) == 94  # the first both hold
    # An empty unclean leader agrees on nothing.
    assert agreed([], 0, 0) == -1


def test_a_diverged_leader_deletes_the_remote_segments_past_the_agreement() -> None:
    remote = _three_remote_segments()
    # Agreed up to 149; the leader still holds 100.. locally: b and c go (newest first:
    # whichever delete fails, what stays is contiguous), and it copies 100.. again
    # from its own log.
    assert divergent_remote_segments(remote, 149, 100) == ([remote[2], remote[1]], None)
    # It no longer holds 100..119 (they were remote): b straddles the agreement and
    # stays, so nothing of 100..119 is lost; only c goes, and copying waits.
    assert divergent_remote_segments(remote, 149, 120) == ([remote[2]], remote[1])
    # Agreed exactly at a segment's end: the segments after it go.
    assert divergent_remote_segments(remote, 199, 200) == ([remote[2]], None)
    assert divergent_remote_segments(remote, 299, 300) == ([], None)
    assert divergent_remote_segments(remote, -1, 0) == (remote[::-1], None)


def test_a_diverged_leaders_deletes_go_newest_first_also_among_overlapping_segments() -> None:
    """Each delete takes the top of the remote log, so what stays after any prefix of
    the deletes is contiguous (a failed or hung delete leaves no hole)."""
    a, b, c = _three_remote_segments()
    # A later leader's copy of 150..249 overlaps b and c.
    d = RemoteSegment("tid", 0, "d", 150, 249, ((5, 150),), SEGMENT_COPY_FINISHED, 1, 1, 1, 6)
    remote = sorted([a, b, c, d], key=lambda s: s.start_offset)
    plan = divergent_remote_segments(remote, 120, 100)
    assert plan.delete == [c, d, b]
    for done in range(len(plan.delete) + 1):
        gone = {s.segment_id for s in plan.delete[:done]}
        view = RemoteLogView(tuple(s for s in remote if s.segment_id not in gone))
        assert view.contiguous_end == view.end_offset


def test_past_a_hole_the_remote_log_agrees_with_nothing() -> None:
    """Offsets no finished remote segment holds are not remote: ``contiguous_end`` ends
    before the first hole, and agreement measured against it stops there, where the
    remote epoch entries alone would carry the epoch before the hole across it."""
    a, b, c = _three_remote_segments()
    view = RemoteLogView((a, c))  # b's DELETE_STARTED committed, c stays
    assert (view.end_offset, view.contiguous_end) == (299, 99)
    assert RemoteLogView((a, b, c)).contiguous_end == 299
    assert RemoteLogView().contiguous_end == -1
    # The leader wrote 100..199 in epoch 3 (it never had b's epoch 5); the entries of a
    # and c say epoch 3 until 200, so against the remote end 100..199 would look agreed
    # although no remote segment holds them.
    local = [(3, 0), (6, 200)]
    assert agreed_end(local, 0, 250, view.leader_epochs(), 0, view.end_offset) == 199
    assert agreed_end(local, 0, 250, view.leader_epochs(), 0, view.contiguous_end) == 99


def test_remote_reads_never_serve_offsets_at_or_above_the_local_log_start() -> None:
    """So a leader whose log ends below the remote end (0..299 remote, local 120..150)
    answers a consumer at 150..299 from its own log (out of range, or its own new
    records), never with the remote records as if they were committed in its log."""
    view = RemoteLogView(tuple(_three_remote_segments()))
    assert holds(view, 119, 120)
    assert not any(holds(view, offset, 120) for offset in (120, 150, 200, 299))


def _covers(segments: list[RemoteSegment], up_to: int) -> bool:
    """Whether the segments hold every offset from their lowest start up to ``up_to``."""
    end = min((s.start_offset for s in segments), default=up_to + 1) - 1
    for seg in sorted(segments, key=lambda s: s.start_offset):
        if seg.start_offset > end + 1:
            return False
        end = max(end, seg.end_offset)
    return end >= up_to or not segments


def test_overlapping_remote_segments_count_once_and_go_without_a_hole() -> None:
    # Leader A copied 0..99 and 100..199; leader B, whose segment ran 150..259, copied
    # it whole: 150..199 is stored twice. The records of 0..359 are ~360 bytes, not 400.
    segs = [_remote(0, 99), _remote(100, 199), _remote(150, 259), _remote(260, 359)]
    # 300 bytes kept: deleting 0..99 would leave ~260 bytes of records (100..359).
    assert remote_segments_past_retention(segs, 360, 0, -1, 300, 0) == []
    # 200 bytes kept: 150..259 and 260..359 hold 200 bytes of records on their own.
    assert remote_segments_past_retention(segs, 360, 0, -1, 200, 0) == segs[:2]
    # B's copy around A's last segment (50..259 holds 100..199): by size or by time,
    # whatever goes, what is left holds every offset up to the local log start.
    nested = [_remote(0, 99, ts=1), _remote(50, 259, 200, ts=3), _remote(100, 199, ts=2)]
    for retention_bytes in range(0, 500, 10):
        gone = remote_segments_past_retention(nested, 260, 0, -1, retention_bytes, 0)
        assert _covers([s for s in nested if s not in gone], 259), retention_bytes
    for now in range(1000, 1005):
        gone = remote_segments_past_retention(nested, 260, 0, 1000, -1, now)
        assert _covers([s for s in nested if s not in gone], 259), now
    assert remote_segments_past_retention(nested, 260, 0, 1000, -1, 1003) == [
        nested[0],
        nested[2],
    ]
