"""Truncation and the leader-epoch cache (KIP-101/279 end-offset semantics)."""

from __future__ import annotations

import asyncio

import pytest
from helpers import log_records

from rillet.client.wire import records
from rillet.storage import Log, LogConfig, cleaner
from rillet.storage.epoch_cache import LeaderEpochCache

CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=128)


def batch(n: int) -> bytes:
    return records.encode_batch([b"r%04d" % i for i in range(n)])


@pytest.fixture
def log(tmp_path):
    log = Log.open(tmp_path / "t-0", CONFIG)
    # epoch 1: offsets 0-9, epoch 3: 10-24, epoch 4: 25-29 (epoch 2 never led)
    for _ in range(2):
        log.append(batch(5), 1)
    for _ in range(3):
        log.append(batch(5), 3)
    log.append(batch(5), 4)
    yield log
    log.close()


def test_end_offset_for_epoch_cases(log):
    assert log.epochs.entries() == [(1, 0), (3, 10), (4, 25)]
    assert log.end_offset_for_epoch(4) == (4, 30)  # latest: the log end
    assert log.end_offset_for_epoch(3) == (3, 25)  # start of the next epoch
    assert log.end_offset_for_epoch(2) == (1, 10)  # unknown: the largest epoch below it
    assert log.end_offset_for_epoch(1) == (1, 10)
    assert log.end_offset_for_epoch(0) == (0, 0)  # older than all: the first start
    assert log.end_offset_for_epoch(5) == (-1, -1)  # newer than all
    assert log.end_offset_for_epoch(-1) == (-1, -1)


def test_empty_cache_answers_undefined(tmp_path):
    cache = LeaderEpochCache(tmp_path / "x")
    assert cache.end_offset_for(3, 100) == (-1, -1)


def test_truncate_to_cuts_whole_batches_and_epochs(log):
    log.truncate_to(27)  # mid-batch: the batch holding 27 (25-29) goes whole
    assert log.log_end_offset == 25
    assert log.epochs.entries() == [(1, 0), (3, 10)]
    log.truncate_to(12)
    assert log.log_end_offset == 10
    assert log.epochs.entries() == [(1, 0)]
    assert log.end_offset_for_epoch(3) == (-1, -1)
    assert log.append(batch(2), 5) == (10, 11)
    assert log.epochs.entries() == [(1, 0), (5, 10)]
    recs = []
    while len(recs) < 12:
        recs.extend(records.decode_all(log.read_bytes(len(recs), 1 << 20)))
    assert [r.offset for r in recs] == list(range(12))


def test_truncating_a_batch_that_holds_the_log_start_empties_the_log_at_its_start(log):
    """A log start moved inside a batch (a follower taking its leader's start), then a
    cut inside that same batch: the whole batch goes, and the log would end below its
    start (InvariantError, found by the storage simulator). It empties at its start, as
    a cut at or below the start already does, and the start stays where it was."""
    log.increment_log_start_offset(12)  # inside the batch 10-14
    log.truncate_to(13)
    assert (log.log_start_offset, log.log_end_offset) == (12, 12)
    assert log.epochs.entries() == []
    assert log.append(batch(2), 5) == (12, 13)
    assert log.epochs.entries() == [(5, 12)]


def test_a_cut_in_a_compacted_gap_over_the_log_start_empties_the_log_there(tmp_path):
    """The segment holding the log start was compacted empty; a cut at the next
    segment's base left the empty one active, ending the log at its base, below the
    start (found by the storage simulator, seed 18 in ext4 mode)."""
    config = LogConfig(segment_bytes=1024, index_interval_bytes=128, cleanup_policy="compact")
    log = Log.open(tmp_path / "t-0", config)
    for _ in range(2):  # segments 0 and 5: every record keyed "k"
        log.append(records.encode_batch([b"v"] * 5, [b"k"] * 5), 1)
        log.roll()
    log.append(records.encode_batch([b"v"], [b"k"]), 1)  # the active segment, at 10
    log.high_watermark = 11
    asyncio.run(cleaner.compact(log))
    assert [s.size for s in log.segments][0] == 0  # segment 0: all superseded
    log.increment_log_start_offset(3)  # in the gap segment 0 left
    log.truncate_to(5)
    assert (log.log_start_offset, log.log_end_offset) == (3, 3)
    assert log.append(batch(1), 2) == (3, 3)
    log.close()


def test_truncation_spanning_segments_survives_reopen(tmp_path):
    path = tmp_path / "t-0"
    log = Log.open(path, CONFIG)
    for i in range(40):
        log.append(batch(5), 1 + i // 10)
    assert len(log.segments) > 3
    log.truncate_to(52)
    assert log.log_end_offset == 50
    assert log.epochs.entries() == [(1, 0)]  # epoch 2 started at 50: cut away
    assert log.latest_epoch == 1 and log.end_offset_for_epoch(1) == (1, 50)
    log.append(batch(5), 7)
    log.close()
    again = Log.open(path, CONFIG)
    assert again.log_end_offset == 55
    assert again.epochs.entries() == [(1, 0), (7, 50)]
    recs = []
    while len(recs) < 55:
        recs.extend(records.decode_all(again.read_bytes(len(recs), 1 << 20)))
    assert [r.offset for r in recs] == list(range(55))
    again.close()
    assert not list(path.glob("*.deleted"))


def test_truncate_fully_and_start_at(log):
    log.truncate_fully_and_start_at(500)
    assert (log.log_start_offset, log.log_end_offset) == (500, 500)
    assert log.epochs.entries() == []
    assert log.append(batch(3), 6) == (500, 502)
    assert log.end_offset_for_epoch(6) == (6, 503)


def test_follower_truncation_then_catch_up(tmp_path):
    leader = Log.open(tmp_path / "l-0", CONFIG)
    follower = Log.open(tmp_path / "f-0", CONFIG)
    leader.append(batch(5), 1)
    follower.append_as_follower(leader.read_bytes(0, 1 << 20))
    follower.append(batch(5), 1)  # a divergent tail the new leader never had
    leader.append(batch(3), 2)
    epoch, end = leader.end_offset_for_epoch(follower.latest_epoch)
    assert (epoch, end) == (1, 5)
    follower.truncate_to(end)
    follower.append_as_follower(leader.read_bytes(5, 1 << 20))
    assert follower.epochs.entries() == leader.epochs.entries() == [(1, 0), (2, 5)]
    assert follower.read_bytes(0, 1 << 20) == leader.read_bytes(0, 1 << 20)
    leader.close()
    follower.close()


def test_epoch_checkpoint_is_rebuilt_when_unreadable(tmp_path):
    path = tmp_path / "t-0"
    log = Log.open(path, CONFIG)
    log.append(batch(3), 2)
    log.append(batch(3), 5)
    log.close()
    (path / "leader-epoch-checkpoint").write_text("garbage\n")
    again = Log.open(path, CONFIG)
    assert again.epochs.entries() == [(2, 0), (5, 3)]
    again.close()


def test_truncate_at_a_segment_boundary(tmp_path):
    log = Log.open(tmp_path / "t-0", CONFIG)
    while len(log.segments) < 3:
        log.append(batch(5), 1)
    boundary = log.segments[1].base_offset
    log.truncate_to(boundary)
    assert log.log_end_offset == boundary and len(log.segments) == 1
    assert log.append(batch(5), 2) == (boundary, boundary + 4)
    assert records.read_header(log.read_bytes(boundary, 1)).base_offset == boundary
    log.close()
    again = Log.open(tmp_path / "t-0", CONFIG)
    assert again.log_end_offset == boundary + 5
    assert again.epochs.entries() == [(1, 0), (2, boundary)]
    again.close()


def test_truncate_at_or_past_the_end_drops_an_empty_epoch(tmp_path):
    """A broker elected leader (epoch 5 assigned at its log end) that appended nothing,
    then a follower again: truncating to the log end cuts no record but must drop the
    empty epoch, or the follower fetches with last_fetched_epoch 5 forever."""
    path = tmp_path / "t-0"
    log = Log.open(path, CONFIG)
    log.append(batch(5), 3)
    log.epochs.assign(5, log.log_end_offset)
    assert log.epochs.entries() == [(3, 0), (5, 5)]
    log.truncate_to(log.log_end_offset)
    assert log.log_end_offset == 5
    assert log.epochs.entries() == [(3, 0)]
    assert log.latest_epoch == 3 and log.end_offset_for_epoch(3) == (3, 5)
    log.epochs.assign(6, 5)
    log.truncate_to(9)  # past the end: the same rule
    assert log.epochs.entries() == [(3, 0)]
    log.close()
    again = Log.open(path, CONFIG)  # and it stays dropped across a reopen
    assert again.epochs.entries() == [(3, 0)]
    assert again.log_end_offset == 5
    again.close()


def test_truncate_past_the_end_keeps_epochs_with_records(log):
    log.truncate_to(log.log_end_offset + 10)
    assert log.log_end_offset == 30
    assert log.epochs.entries() == [(1, 0), (3, 10), (4, 25)]


def abandon(log: Log) -> None:
    """kill -9: the process dies; what reached the page cache stays, nothing else runs.
    Background fsync jobs already started are allowed to finish (they are threads in a
    process that would be dead; letting them finish is the more hostile case, since a
    late job may overwrite what the log wrote meanwhile)."""
    log._state_lock.acquire()
    log._state_lock.release()


def test_epochs_survive_kill_after_truncation_and_roll(tmp_path):
    # The issue-11 scenario: a flushed log (recovery point and epoch checkpoint on disk),
    # then a follower truncation to 300, a new epoch appended from 300, a segment roll,
    # and kill -9. The checkpoints on disk must not describe the cut tail.
    path = tmp_path / "t-0"
    config = LogConfig(segment_bytes=4096, index_interval_bytes=128)
    log = Log.open(path, config)
    for i in range(60):  # epoch 1: 0-199, epoch 2: 200-599
        log.append(batch(10), 1 if i < 20 else 2)
    log.flush()  # recovery point 600, checkpoint [(1, 0), (2, 200)]
    log.truncate_to(300)
    for _ in range(40):  # epoch 3 from 300
        log.append(batch(10), 3)
    log.roll()
    truth = [(1, 0), (2, 200), (3, 300)]
    assert log.epochs.entries() == truth
    abandon(log)
    again = Log.open(path, config)
    assert again.epochs.entries() == truth
    assert again.log_end_offset == 700
    assert [r.offset for r in log_records(again)] == list(range(700))
    again.close()


def test_a_flush_captured_before_a_truncation_does_not_write_stale_epochs(tmp_path):
    # A flush job captures the epoch entries on the loop thread and writes them later
    # from an executor; a truncation in between must win, even when a roll after the
    # truncation has moved the recovery point past the cut.
    path = tmp_path / "t-0"
    log = Log.open(path, CONFIG)
    for _ in range(6):  # epoch 1: 0-29
        log.append(batch(5), 1)
    log.flush()  # on disk: recovery point 30, [(1, 0)]
    for _ in range(6):  # epoch 2: 30-59
        log.append(batch(5), 2)
    job = log._prepare_flush()  # captures [(1, 0), (2, 30)]
    log.truncate_to(20)
    for _ in range(4):  # epoch 5: 20-39, then a roll: recovery point 40 in memory
        log.append(batch(5), 5)
    log.roll()
    job()  # the executor runs the stale job only now
    abandon(log)
    again = Log.open(path, CONFIG)
    assert again.epochs.entries() == [(1, 0), (5, 20)]
    again.close()
