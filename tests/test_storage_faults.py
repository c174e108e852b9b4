"""Storage fault scenarios found by an adversarial review of the issue-11 fixes: retention
before the high watermark is known, flush-by-policy capturing epochs mid-append, kill -9
inside truncate_fully_and_start_at, and a close after a failed background flush."""

from __future__ import annotations

import errno

import pytest
from helpers import stamped

from rillet.client.wire import records
from rillet.storage import Log, LogConfig, LogManager, checkpoints, retention
from rillet.storage.log import wall_clock_ms
from rillet.storage.segment import LogSegment

SMALL = {"segment.bytes": 1024, "retention.bytes": 0, "file.delete.delay.ms": 0}


def batch(n: int, tag: bytes = b"r") -> bytes:
    return records.encode_batch([tag + b"%04d" % i for i in range(n)])


def epochs_from_headers(log: Log) -> list[tuple[int, int]]:
    """The truth: (epoch, first offset) wherever the batch headers' epoch rises."""
    out: list[tuple[int, int]] = []
    for seg in log.segments:
        for _, h in seg.headers_from(0):
            if h.base_offset < log.log_start_offset and h.last_offset < log.log_start_offset:
                continue
            if not out or h.partition_leader_epoch > out[-1][0]:
                out.append((h.partition_leader_epoch, max(h.base_offset, log.log_start_offset)))
    return out


# -- d9b4add: high_watermark None at start-up ---------------------------------------------


async def test_retention_at_startup_waits_for_the_high_watermark(tmp_path):
    """A log opened at start-up by name has high_watermark None until the broker's
    replica opens it (after metadata arrives). The maintenance task starts first
    (LogManager.start), and its first round runs at the first tick (_last_retention_ms
    is 0), so retention removes everything up to the log END, above the HW the broker
    checkpointed: exactly what d9b4add meant to stop. Kafka's UnifiedLog starts its HW
    at the log start offset, so nothing is deleted before the partition sets it."""
    manager = LogManager(tmp_path, SMALL)
    manager.startup()
    log = manager.get_or_create("t", 0, topic_id="id-A")
    for _ in range(30):
        log.append(batch(5), 1)
    log.high_watermark = 5  # a follower lagging: only offsets < 5 are committed
    assert await retention.apply_retention(log) == 0  # the fix holds while the HW is set
    manager.close()

    manager = LogManager(tmp_path, SMALL)
    manager.startup()  # the broker restarts; metadata (and the HW) not applied yet
    await manager.run_maintenance()
    log = manager.get("t", 0)
    assert log.log_start_offset <= 5, f"deleted up to {log.log_start_offset}, above the HW 5"
    manager.close()


async def test_retention_at_startup_does_not_apply_the_broker_default_to_a_topic_override(
    tmp_path,
):
    """Same window, worse: until the replica opens the log, it carries the manager's
    default config, not the topic's. A topic kept forever (retention.ms=-1) loses every
    record older than the broker default (7 days) at the first maintenance round after
    a restart, on the leader too."""
    old_ts = wall_clock_ms() - 10 * 24 * 3600 * 1000
    manager = LogManager(tmp_path, {"segment.bytes": 1024})
    manager.startup()
    log = manager.get_or_create("t", 0, {"retention.ms": -1}, topic_id="id-A")
    for i in range(30):
        log.append(records.encode_batch([b"v%04d" % i], timestamps=[old_ts]), 1)
    log.high_watermark = log.log_end_offset  # all committed
    await manager.run_maintenance()
    assert log.log_start_offset == 0  # kept forever, as configured
    manager.close()

    manager = LogManager(tmp_path, {"segment.bytes": 1024})
    manager.startup()
    await manager.run_maintenance()  # the first tick, before metadata reaches the replica
    assert manager.get("t", 0).log_start_offset == 0
    manager.close()


# -- 244d4af: a stale log discarded while maintenance holds it ------------------------------


# -- 9fffb09: a flush triggered by an append captures the epochs before that append's ------


def test_flush_by_policy_checkpoints_the_epoch_of_the_append_that_triggered_it(tmp_path):
    """flush.messages fires inside the append (fast path: append_one, then
    _maybe_flush_by_policy, then epochs.assign; _append_many and append_as_follower:
    _write flushes, then assign). The job captures the epochs BEFORE this append's new
    epoch but the log end AFTER it, so the epoch file (without epoch 2) is declared valid
    through the end and the recovery point goes there. The next append rolls (the
    in-memory recovery point moves, nothing is written). kill -9: recovery scans only
    the new segment (it holds the recovery point) and rebuilds epoch 2 at the new
    segment's base instead of where it started."""
    cfg = LogConfig(segment_bytes=1024, flush_messages=5)
    d = tmp_path / "t-0"
    log = Log.open(d, cfg)
    five, one = batch(5, b"a"), batch(1, b"z")
    while log.active_segment.size + 2 * len(five) <= 1024:
        log.append(five, 1)  # each append flushes (5 messages)
    base = log.log_end_offset
    log.append(five, 2)  # fits (fast path): the flush job runs inside, then epoch 2 is assigned
    assert len(log.segments) == 1
    assert checkpoints.read_offset(d / checkpoints.RECOVERY_POINT) == base + 5
    log.append(one, 2)  # rolls; one message: no flush
    assert [s.base_offset for s in log.segments] == [0, base + 5]
    truth = epochs_from_headers(log)
    assert truth == [(1, 0), (2, base)] == log.epochs.entries()
    # kill -9 (the appended records are in the page cache; nothing else happens).
    again = Log.open(d, cfg)
    assert again.log_end_offset == log.log_end_offset
    assert again.epochs.entries() == epochs_from_headers(again) == truth


def test_follower_flush_by_policy_checkpoints_the_epoch_it_appended(tmp_path):
    """The same through append_as_follower: _write flushes, then the epochs are assigned."""
    cfg = LogConfig(segment_bytes=1024, flush_messages=5)
    d = tmp_path / "t-0"
    log = Log.open(d, cfg)
    while log.active_segment.size + 2 * len(batch(5)) <= 1024:
        log.append_as_follower(stamped(batch(5), log.log_end_offset, 1))
    base = log.log_end_offset
    log.append_as_follower(stamped(batch(5), base, 2))
    log.append_as_follower(stamped(batch(1), base + 5, 2))  # rolls, no flush
    assert len(log.segments) == 2
    truth = epochs_from_headers(log)
    assert truth == [(1, 0), (2, base)] == log.epochs.entries()
    again = Log.open(d, cfg)  # kill -9
    assert again.epochs.entries() == epochs_from_headers(again) == truth


# -- 9fffb09: a crash in the middle of truncate_fully_and_start_at ----------------------------


def test_kill_during_truncate_fully_leaves_no_stale_epoch(tmp_path, monkeypatch):
    """kill -9 after truncate_fully_and_start_at renamed the segments aside and created
    the new one, before _after_cut checkpoints the epochs: the old epoch file survives,
    and load moves its last entry up to the new log start (truncate_from_start after
    truncate_from_end), so an EMPTY log reopens claiming epoch 2 starts at 1000."""
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1024))
    log.append(batch(100), 1)
    log.append(batch(100), 2)
    log.flush()

    def killed(self):
        raise KeyboardInterrupt("kill -9")

    monkeypatch.setattr(Log, "_after_cut", killed)
    with pytest.raises(KeyboardInterrupt):
        log.truncate_fully_and_start_at(1000)
    monkeypatch.undo()
    again = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1024))  # the old object is gone
    assert (again.log_start_offset, again.log_end_offset) == (1000, 1000)
    assert again.epochs.entries() == epochs_from_headers(again) == []


# -- a close after a failed background flush ------------------------------------------------


async def test_close_after_a_failed_background_flush_forces_recovery(tmp_path, monkeypatch):
    """A background fsync failed (EIO): the log turned read-only, and the kernel may have
    dropped the dirty pages (a later fsync then succeeds without writing them). close()
    ignores log.failure: it fsyncs again, checkpoints the recovery point at the log end
    and leaves the clean-shutdown marker, so the next open trusts the unverified tail and
    never scans it (Kafka takes the dir offline and writes no marker)."""
    log = Log.open(tmp_path / "t-0", LogConfig(flush_messages=1))
    seg = log.active_segment

    real_fsync = LogSegment.fsync

    def eio(self):
        if self is seg:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(self)

    monkeypatch.setattr(LogSegment, "fsync", eio)
    log.append(batch(5), 1)
    await log.wait_background()
    assert log.failure is not None
    monkeypatch.undo()
    await log.close_async()
    assert not (tmp_path / "t-0" / checkpoints.CLEAN_SHUTDOWN).exists()
    # Never written (a new log has none; missing reads as 0): not moved to the end.
    assert (checkpoints.read_offset(tmp_path / "t-0" / checkpoints.RECOVERY_POINT) or 0) == 0
