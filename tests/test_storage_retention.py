"""Retention by time and size, compaction, and reads across compacted segments."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os

import pytest
from helpers import log_records

from rillet.client.wire import records
from rillet.client.wire.errors import InvalidConfigError, OffsetOutOfRangeError
from rillet.storage import Log, LogConfig, LogManager, cleaner, fs, retention

DAY = 24 * 3600 * 1000


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def keyed(keys: list[bytes], values: list[bytes | None], ts: int) -> bytes:
    return records.encode_batch(values, keys, timestamps=[ts] * len(keys))


async def test_time_retention_deletes_old_closed_segments(tmp_path):
    clock = FakeClock(10 * DAY)
    cfg = LogConfig(segment_bytes=1024, retention_ms=DAY, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg, clock=clock)
    for i in range(30):  # old records, then new ones
        ts = 10 * DAY - 3 * DAY if i < 20 else 10 * DAY
        log.append(keyed([b"k"] * 5, [b"v" * 20] * 5, ts), 0)
    old_segments = [s for s in log.segments[:-1] if s.max_timestamp < 9 * DAY]
    assert old_segments
    removed = await retention.apply_retention(log)
    assert removed == len(old_segments)
    assert log.log_start_offset == log.segments[0].base_offset > 0
    assert all(not s.log_path.exists() for s in old_segments)  # renamed to .deleted
    assert await retention.purge_retired(log) == removed
    assert not list((tmp_path / "t-0").glob("*.deleted"))
    assert log_records(log)[0].offset == log.log_start_offset
    await log.close_async()
    again = Log.open(tmp_path / "t-0", cfg, clock=clock)
    assert again.log_start_offset == log.log_start_offset  # the checkpoint persisted
    again.close()


async def test_size_retention_keeps_at_most_retention_bytes(tmp_path):
    clock = FakeClock(DAY)
    cfg = LogConfig(segment_bytes=1024, retention_bytes=3000, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg, clock=clock)
    for _ in range(60):
        log.append(keyed([b"k"] * 3, [b"v" * 30] * 3, DAY), 0)
    assert log.size_bytes > 3000
    await retention.apply_retention(log)
    assert log.size_bytes <= 3000 + 1024  # whole segments only, never the active one
    assert log.size_bytes - log.segments[0].size < 3000
    await log.close_async()


async def test_compaction_keeps_latest_per_key_and_offsets(tmp_path):
    clock = FakeClock(100 * DAY)
    cfg = LogConfig(
        segment_bytes=1024,
        cleanup_policy="compact",
        file_delete_delay_ms=0,
        delete_retention_ms=DAY,
    )
    log = Log.open(tmp_path / "t-0", cfg, clock=clock)
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    offset = 0
    for round_ in range(12):
        keys = [b"key-%d" % ((round_ * 3 + j) % 7) for j in range(4)]
        values: list[bytes | None] = [b"val-%d-%d" % (round_, j) for j in range(4)]
        if round_ == 5:
            values[0] = None  # a tombstone, old enough to drop (timestamp 50 days ago)
        log.append(keyed(keys, values, 50 * DAY), 0)
        for k, v in zip(keys, values, strict=True):
            latest[k] = (offset, v)
            offset += 1
    before = {r.offset: r for r in log_records(log)}
    active_base = log.active_segment.base_offset
    stats = await cleaner.compact(log)
    assert stats.rewritten > 0
    after = log_records(log)
    offsets = [r.offset for r in after]
    assert offsets == sorted(offsets) and len(offsets) < len(before)
    for r in after:
        assert before[r.offset] == r  # surviving records keep offset, key, value, time
    cleaned = [r for r in after if r.offset < active_base]
    seen: dict[bytes, int] = {}
    for r in cleaned:
        assert r.key not in seen, "a key appears twice in the cleaned part"
        seen[r.key] = r.offset
        assert r.value is not None or latest[r.key][0] >= active_base
    for off, value in latest.values():  # the newest record of each key survives
        if value is not None or off >= active_base:
            assert off in {r.offset for r in after}
    # epochs and batch epochs are kept; the log reopens cleanly
    assert {h.partition_leader_epoch for h in _headers(log)} == {0}
    await log.close_async()
    again = Log.open(tmp_path / "t-0", cfg, clock=clock)
    assert [r.offset for r in log_records(again)] == offsets
    again.close()


async def test_a_compacted_batch_keeps_its_last_offset(tmp_path):
    """Every batch's last record is superseded (key b"same"), yet each compacted batch
    keeps the offsets it spanned, as Kafka's cleaner keeps lastOffsetDelta: a log must
    never end inside the span of another replica's copy of its last batch."""
    clock = FakeClock(100 * DAY)
    cfg = LogConfig(segment_bytes=1024, cleanup_policy="compact", file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg, clock=clock)
    i = 0
    while len(log.segments) < 4:
        log.append(keyed([b"unique-%d" % i, b"same"], [b"x" * 10, b"y" * 10], DAY), 0)
        i += 1
    spans = [(h.base_offset, h.last_offset) for h in _headers(log)]
    stats = await cleaner.compact(log)
    assert stats.rewritten > 0
    headers = list(_headers(log))
    assert [(h.base_offset, h.last_offset) for h in headers] == spans
    assert any(h.record_count == 1 for h in headers)  # the superseded records are gone
    assert len(log_records(log)) == sum(h.record_count for h in headers)  # CRCs checked
    end = log.log_end_offset
    await log.close_async()
    again = Log.open(tmp_path / "t-0", cfg, clock=clock)  # recovery reads the batches
    assert again.log_end_offset == end
    assert [(h.base_offset, h.last_offset) for h in _headers(again)] == spans
    again.close()


async def test_reading_across_a_compacted_segment(tmp_path):
    clock = FakeClock(100 * DAY)
    cfg = LogConfig(segment_bytes=1024, cleanup_policy="compact", file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg, clock=clock)
    while len(log.segments) < 4:
        log.append(keyed([b"same"] * 10, [b"x" * 10] * 10, DAY), 0)
    await cleaner.compact(log)
    # Every closed segment lost all but (at most) one record: reading from each old
    # offset lands on the next surviving record, never on an error.
    survivors = [r.offset for r in log_records(log)]
    for offset in range(log.log_start_offset, log.log_end_offset, 7):
        data = log.read_bytes(offset, 1)
        first = [r for r in records.decode_all(data) if r.offset >= offset]
        assert first and first[0].offset == min(o for o in survivors if o >= offset)
    await log.close_async()


async def test_compaction_output_left_by_a_crash_is_discarded_or_finished(tmp_path):
    cfg = LogConfig(segment_bytes=1024, cleanup_policy="compact")
    path = tmp_path / "t-0"
    log = Log.open(path, cfg)
    while len(log.segments) < 3:
        log.append(keyed([b"a"] * 5, [b"x" * 20] * 5, 1), 0)
    end = log.log_end_offset
    stats = cleaner.clean_segments(list(log.segments[:-1]), 0)  # output only, no swap
    first = log.segments[0]
    log.close()
    # Crash 1: only .cleaned files exist -> discarded, the old segment stands.
    assert list(path.glob("*.cleaned"))
    reopened = Log.open(path, cfg)
    assert not list(path.glob("*.cleaned"))
    assert reopened.log_end_offset == end and reopened.segments[0].size == first.size
    reopened.close()
    # Crash 2: committed (renamed to .swap) but not yet moved into place -> finished.
    stats = cleaner.clean_segments(list(Log.open(path, cfg).segments[:-1]), 0)
    new = stats.results[0].new
    os.replace(new.log_path, first.log_path.with_name(first.log_path.name + ".swap"))
    reopened = Log.open(path, cfg)
    assert reopened.segments[0].size == new.size < first.size
    assert reopened.log_end_offset == end
    reopened.close()


async def test_manager_maintenance_runs_retention_and_compaction(tmp_path):
    clock = FakeClock(10 * DAY)
    manager = LogManager(tmp_path, {"segment.bytes": 1024, "file.delete.delay.ms": 0}, clock=clock)
    await manager.start(schedule=False)
    old = manager.get_or_create("old", 0, {"retention.ms": DAY})
    comp = manager.get_or_create("comp", 0, {"cleanup.policy": "compact"})
    for _ in range(30):
        old.append(keyed([b"k"] * 5, [b"v" * 20] * 5, DAY), 0)
        comp.append(keyed([b"k"] * 5, [b"v" * 20] * 5, DAY), 0)
    stats = await manager.run_maintenance()
    assert stats["segments_deleted"] > 0 and stats["segments_compacted"] > 0
    assert old.recovery_point == old.log_end_offset  # checkpointed by the round
    await manager.close_async()


async def test_maintenance_walks_the_logs_a_slice_per_loop_turn(tmp_path, monkeypatch):
    """A broker of 50,000 partitions walked every log in one loop turn per round."""
    manager = LogManager(tmp_path)
    await manager.start(schedule=False)
    for p in range(5):
        manager.get_or_create("t", p)
    manager.logs_per_turn = 2
    visited: list[int] = []

    async def retain(log: Log, now_ms: int | None = None) -> int:
        visited.append(int(log.name.rsplit("-", 1)[1]))  # nothing here gives the loop a turn
        return 0

    async def nothing(log: Log, now_ms: int | None = None) -> cleaner.CleanStats:
        return cleaner.CleanStats()

    async def no_purge(log: Log, now_ms: int | None = None) -> int:
        return 0

    monkeypatch.setattr(retention, "apply_retention", retain)
    monkeypatch.setattr(cleaner, "compact", nothing)
    monkeypatch.setattr(retention, "purge_retired", no_purge)
    turns: list[int] = []

    def other_task() -> None:  # what else the loop has to run: heartbeats, fetches
        turns.append(len(visited))
        if len(visited) < 5:
            asyncio.get_running_loop().call_soon(other_task)

    asyncio.get_running_loop().call_soon(other_task)
    await manager.run_maintenance()
    assert sorted(visited) == list(range(5))
    assert turns[:2] == [2, 4]  # a turn after every two logs
    await manager.close_async()


def _headers(log: Log):
    for seg in log.segments:
        yield from (h for _, h in seg.headers_from(0))


async def test_tombstones_dropped_only_after_delete_retention(tmp_path):
    clock = FakeClock(100 * DAY)
    cfg = LogConfig(
        segment_bytes=1024,
        cleanup_policy="compact",
        file_delete_delay_ms=0,
        delete_retention_ms=DAY,
    )
    for age, survives in ((10 * DAY, False), (DAY // 2, True)):
        log = Log.open(tmp_path / f"t-{age}", cfg, clock=clock)
        log.append(keyed([b"gone"], [b"v"], clock.now - age), 0)
        log.append(keyed([b"gone"], [None], clock.now - age), 0)
        while len(log.segments) < 2:
            log.append(keyed([b"other"] * 5, [b"x" * 30] * 5, clock.now - age), 0)
        await cleaner.compact(log)
        kept = [r for r in log_records(log) if r.key == b"gone"]
        assert [r.value for r in kept] == ([None] if survives else [])
        await log.close_async()


async def test_manager_opens_existing_logs_and_deletes(tmp_path):
    manager = LogManager(tmp_path, {"segment.bytes": 1024})
    await manager.start(schedule=False)
    for p in range(3):
        manager.get_or_create("topic", p).append(keyed([b"k"], [b"v"], 1), 0)
    await manager.close_async()
    assert (tmp_path / "topic-1" / "clean-shutdown").exists()
    again = LogManager(tmp_path)
    await again.start()
    assert sorted(again.logs) == [("topic", 0), ("topic", 1), ("topic", 2)]
    assert again.get("topic", 2).log_end_offset == 1
    await again.delete("topic", 1)
    assert again.get("topic", 1) is None
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["topic-0", "topic-2"]
    await again.close_async()


async def test_retention_never_deletes_past_the_high_watermark(tmp_path):
    # A leader whose followers lag must keep what they have not copied: deleting it would
    # move the log start past their fetch offset, they would restart empty from there,
    # and the HW would cover records only the leader ever held (issue 11, finding 7).
    clock = FakeClock(10 * DAY)
    cfg = LogConfig(segment_bytes=1024, retention_ms=DAY, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg, clock=clock)
    for _ in range(30):
        log.append(keyed([b"k"] * 5, [b"v" * 20] * 5, DAY), 0)  # all past retention
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 4
    log.high_watermark = bases[2] + 1  # inside the third segment
    assert await retention.apply_retention(log) == 2  # only segments wholly below it
    assert log.log_start_offset == bases[2]
    log.high_watermark = log.log_end_offset
    assert await retention.apply_retention(log) == len(bases) - 3  # all closed ones now
    await log.close_async()


async def test_size_retention_also_stops_at_the_high_watermark(tmp_path):
    clock = FakeClock(DAY)
    cfg = LogConfig(segment_bytes=1024, retention_bytes=0, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg, clock=clock)
    for _ in range(30):
        log.append(keyed([b"k"] * 3, [b"v" * 30] * 3, DAY), 0)
    log.high_watermark = 0  # nothing committed yet: nothing may go
    assert await retention.apply_retention(log) == 0
    await log.close_async()


def test_log_config_parses_the_remote_tier_keys_as_topic_configs_send_them() -> None:
    cfg = LogConfig.from_dict(
        {"remote.storage.enable": "true", "local.retention.ms": "5", "local.retention.bytes": "7"}
    )
    assert cfg.remote_storage_enable is True
    assert (cfg.effective_local_retention_ms, cfg.effective_local_retention_bytes) == (5, 7)
    assert LogConfig.from_dict({"remote.storage.enable": "FALSE"}).remote_storage_enable is False
    same = LogConfig(retention_ms=9, retention_bytes=11)  # -2: the total settings
    assert (same.effective_local_retention_ms, same.effective_local_retention_bytes) == (9, 11)
    with pytest.raises(InvalidConfigError):
        LogConfig.from_dict({"remote.storage.enable": "yes"})
    with pytest.raises(InvalidConfigError):
        LogConfig.from_dict({"local.retention.bytes": -3})


def _remote_log(tmp_path, clock, **settings) -> Log:
    cfg = LogConfig(segment_bytes=1024, file_delete_delay_ms=0, remote_storage_enable=True)
    log = Log.open(tmp_path / "t-0", dataclasses.replace(cfg, **settings), clock=clock)
    for _ in range(30):
        log.append(keyed([b"k"] * 5, [b"v" * 20] * 5, DAY), 0)  # all a day old
    log.high_watermark = log.log_end_offset
    return log


async def test_a_remote_enabled_log_deletes_nothing_that_is_not_remote(tmp_path):
    """Past every retention limit, yet nothing is remote: every segment stays."""
    clock = FakeClock(10 * DAY)
    log = _remote_log(tmp_path, clock, retention_ms=DAY, retention_bytes=0, local_retention_ms=0)
    assert len(log.segments) > 4
    assert await retention.apply_retention(log) == 0
    await log.close_async()


async def test_a_remote_enabled_log_deletes_up_to_the_remote_end_only(tmp_path):
    clock = FakeClock(10 * DAY)
    log = _remote_log(tmp_path, clock, local_retention_bytes=0)  # retention.ms: 7 days
    bases = [s.base_offset for s in log.segments]
    log.remote_copied_end = bases[3] - 2  # inside the third segment: two are remote
    assert await retention.apply_retention(log) == 2
    assert log.log_start_offset == bases[2]
    log.remote_copied_end = bases[3] - 1  # the third segment's last offset
    assert await retention.apply_retention(log) == 1
    for seg in log.segments[:-1]:
        assert seg.base_offset > log.remote_copied_end  # what is left is not remote
    await log.close_async()


async def test_a_remote_enabled_log_keeps_remote_segments_within_local_retention(tmp_path):
    clock = FakeClock(DAY + 1000)
    log = _remote_log(tmp_path, clock, retention_ms=-1, local_retention_ms=5000)
    log.remote_copied_end = log.active_segment.base_offset - 1  # every closed one is remote
    assert await retention.apply_retention(log) == 0  # 1 s old, local retention 5 s
    clock.now += 5000
    closed = len(log.segments) - 1
    assert await retention.apply_retention(log) == closed
    await log.close_async()


async def test_local_retention_bytes_bounds_the_local_log_of_remote_segments(tmp_path):
    clock = FakeClock(DAY)
    log = _remote_log(tmp_path, clock, retention_ms=-1, local_retention_bytes=3000)
    log.remote_copied_end = log.active_segment.base_offset - 1
    removed = await retention.apply_retention(log)
    assert removed > 0
    assert log.size_bytes - log.segments[0].size < 3000 <= log.size_bytes + 1024
    await log.close_async()


async def test_a_compacted_log_is_never_tiered_so_its_retention_ignores_the_remote_tier(
    tmp_path,
):
    """remote.storage.enable with compaction in the effective config (the broker's own
    log.cleanup.policy, which the controller cannot see): the log is not tiered, so
    retention treats it as any log: total retention, no remote bound."""
    clock = FakeClock(10 * DAY)
    log = _remote_log(
        tmp_path, clock, retention_ms=DAY, cleanup_policy="compact,delete", local_retention_ms=0
    )
    assert log.config.remote_storage_enable and not log.config.tiered
    closed = len(log.segments) - 1
    assert closed > 4 and log.remote_copied_end == -1  # nothing remote
    assert await retention.apply_retention(log) == closed
    await log.close_async()


async def test_compaction_never_cleans_past_the_high_watermark(tmp_path):
    # The cleaner rewrites segments; one holding uncommitted records may still be
    # truncated by a leader change, so it stays as it is until the HW passes it.
    cfg = LogConfig(segment_bytes=1024, cleanup_policy="compact", min_compaction_lag_ms=0)
    log = Log.open(tmp_path / "t-0", cfg, clock=FakeClock(DAY))
    for i in range(40):
        log.append(keyed([b"k%d" % (i % 4)], [b"v%d" % i + b"x" * 60], DAY), 0)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 3
    log.high_watermark = bases[1]  # only the first segment is wholly committed
    await log.wait_background()
    assert [s.base_offset for s in cleaner.plan(log, DAY)] == [bases[0]]
    log.high_watermark = None  # a log no broker replicates: bounded by its end only
    assert len(cleaner.plan(log, DAY)) == len(bases) - 1
    await log.close_async()


def test_a_follower_taken_log_start_survives_a_crash(tmp_path) -> None:
    """increment_log_start_offset (a follower taking its leader's log start) is durable
    at once: the records below it may be ones the partition never committed."""
    log = Log.open(tmp_path / "t-0")
    for i in range(4):
        log.append(records.encode_batch([b"v%d" % i], [b"k"]), 1)
    log.increment_log_start_offset(2)
    assert log.log_start_offset == 2
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 1000)
    reopened = Log.open(tmp_path / "t-0")  # no close: as after kill -9
    assert reopened.log_start_offset == 2
    assert [r.offset for r in log_records(reopened)] == [2, 3]


async def test_retention_removes_segments_wholly_below_a_taken_log_start(tmp_path) -> None:
    """A follower that takes its leader's log start (or a log whose start moved for any
    reason) frees the segments wholly below it at the next retention round, not only at
    the next open; the segment the start falls in stays."""
    cfg = LogConfig(segment_bytes=300, retention_ms=-1, retention_bytes=-1, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg)
    for i in range(20):
        log.append(records.encode_batch([b"v" * 40], [b"k%d" % i]), 1)
    await log.wait_background()
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 3
    start = bases[2] + 1  # inside the third segment
    assert bases[3] > start
    log.high_watermark = log.log_end_offset
    log.increment_log_start_offset(start)
    assert await retention.apply_retention(log) == 2
    assert [s.base_offset for s in log.segments] == bases[2:]
    assert log.log_start_offset == start  # not moved down to the segment's base
    assert [r.offset for r in log_records(log)][0] == start
    await log.close_async()


async def test_a_compaction_that_fails_part_way_leaves_nothing_behind(tmp_path, monkeypatch):
    """An I/O error while writing ``.cleaned`` copies (the old segments still stand, so the
    log stays writable) must remove the partial copies: the next round would otherwise
    fail on the existing file every time until a restart."""
    cfg = LogConfig(segment_bytes=512, cleanup_policy="compact", file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg)
    for i in range(30):
        log.append(keyed([b"k%d" % (i % 3)], [b"v%d" % i], 1000), 0)
    log.high_watermark = log.log_end_offset
    real_fsync, calls = fs.fsync, []

    def failing_fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:  # the second copy's fsync: one copy written, one half done
            raise OSError(errno.EIO, "injected")
        real_fsync(fd)

    await log.wait_background()
    await log.flush_async()
    monkeypatch.setattr(fs, "fsync", failing_fsync)
    with pytest.raises(OSError, match="injected"):
        await cleaner.compact(log)
    monkeypatch.setattr(fs, "fsync", real_fsync)
    assert not list((tmp_path / "t-0").glob("*.cleaned"))
    assert (await cleaner.compact(log)).rewritten > 0  # the next round works
    assert log.append(keyed([b"k0"], [b"after"], 1000), 0)
    await log.close_async()


async def test_compaction_keeps_the_first_batch_of_each_epoch(tmp_path) -> None:
    """A follower and a recovery read where each leader epoch began from the batches.
    If compaction dropped an epoch's first batch, a follower of the compacted leader
    would record a later start, and, elected, tell a replica diverged in the epoch
    before to truncate only there: that replica would keep a deposed leader's records
    below its HW (replication seed 3582)."""
    cfg = LogConfig(segment_bytes=512, cleanup_policy="compact", min_compaction_lag_ms=0)
    leader = Log.open(tmp_path / "l-0", cfg, clock=FakeClock(DAY))
    for i in range(6):
        leader.append(keyed([b"k%d" % i], [b"old" + b"x" * 60], DAY), 0)
    first_of_epoch_1 = leader.log_end_offset
    for i in range(12):  # epoch 1 rewrites k0 over and over: its first batch is superseded
        leader.append(keyed([b"k0"], [b"new%d" % i + b"x" * 60], DAY), 1)
    assert leader.epochs.entries() == [(0, 0), (1, first_of_epoch_1)]
    leader.high_watermark = leader.log_end_offset
    await leader.wait_background()
    stats = await cleaner.compact(leader)
    assert stats.records_removed > 0
    epochs_at = {h.base_offset: h.partition_leader_epoch for h in _headers(leader)}
    assert epochs_at.get(first_of_epoch_1) == 1  # kept, though its record is superseded
    # A new follower fetching the compacted log (a segment per read, as fetches do)
    # learns where epoch 1 began...
    follower = Log.open(tmp_path / "f-0", cfg, clock=FakeClock(DAY))
    while follower.log_end_offset < leader.log_end_offset:
        follower.append_as_follower(leader.read_bytes(follower.log_end_offset, 1 << 20))
    assert follower.epochs.entries()[-1] == (1, first_of_epoch_1)
    # ...so, elected, it answers a replica whose log ends in epoch 0 where epoch 0 ended.
    assert follower.end_offset_for_epoch(0) == (0, first_of_epoch_1)
    follower.close()
    # Recovery re-deriving the epochs from the batches finds them too.
    await leader.close_async()
    (tmp_path / "l-0" / "leader-epoch-checkpoint").write_text("garbage\n")
    again = Log.open(tmp_path / "l-0", cfg, clock=FakeClock(DAY))
    assert again.end_offset_for_epoch(0) == (0, first_of_epoch_1)
    again.close()
