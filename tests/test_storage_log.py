"""Log appends, reads, index lookups, bad input, flush policy and rolling."""

from __future__ import annotations

import os

import pytest
from helpers import log_records, stamped

from rillet.client.wire import records
from rillet.client.wire.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidConfigError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    StorageError,
)
from rillet.storage import Log, LogConfig, batchwrite, checkpoints, fs
from rillet.storage.index import OffsetIndex, TimeIndex

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=256)


class FakeClock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def batch(n: int = 5, *, start: int = 0, ts: int = 1000, key: bytes | None = None) -> bytes:
    return records.encode_batch(
        [b"value-%06d" % (start + i) for i in range(n)],
        [key if key is not None else b"k%06d" % (start + i) for i in range(n)],
        timestamps=[ts + i for i in range(n)],
    )


def test_append_assigns_offsets_and_reads_back(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    assert log.append(batch(3), 1) == (0, 2)
    assert log.append(batch(4) + batch(2), 1) == (3, 8)  # a produce payload of two batches
    assert log.log_end_offset == 9
    recs = records.decode_all(log.read_bytes(0, 1 << 20))
    assert [r.offset for r in recs] == list(range(9))
    hdr = records.read_header(log.read_bytes(3, 1 << 20))
    assert (hdr.base_offset, hdr.partition_leader_epoch) == (3, 1)
    log.close()


def test_read_returns_whole_batches_and_at_least_one(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    for i in range(10):
        log.append(batch(5, start=i * 5), 0)
    size = len(batch(5))
    s = log.read(7, 1)  # max_bytes smaller than a batch: still one whole batch
    assert (s.first_offset, s.length) == (5, size)
    s = log.read(7, 2 * size + 10)
    assert s.length == 2 * size
    assert records.read_header(os.pread(s.fd, 61, s.position)).base_offset == 5
    log.close()


def test_read_stops_below_max_offset_and_at_log_end(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    for i in range(10):
        log.append(batch(5, start=i * 5), 0)
    data = log.read_bytes(0, 1 << 20, max_offset=20)
    assert [r.offset for r in records.decode_all(data)][-1] == 19
    assert log.read(20, 1 << 20, max_offset=20).length == 0
    assert log.read(50, 1 << 20).length == 0  # exactly at the end: empty
    with pytest.raises(OffsetOutOfRangeError):
        log.read(51, 100)
    log.close()


def test_reads_match_linear_scan_across_many_segments(tmp_path):
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1024, index_interval_bytes=200))
    expected = []
    for i in range(120):
        n = 1 + i % 7
        log.append(batch(n, start=len(expected), ts=10_000 + i * 3), 2)
        expected.extend(range(len(expected), len(expected) + n))
    assert len(log.segments) > 10
    truth = {r.offset: r for r in log_records(log)}
    assert sorted(truth) == expected
    for offset in range(0, len(expected), 3):
        first = records.decode_all(log.read_bytes(offset, 1))
        assert first[0].offset <= offset <= first[-1].offset
        assert truth[offset] in first
    for target in range(9_990, 10_000 + 120 * 3 + 10, 7):
        want = min((r.offset for r in truth.values() if r.timestamp >= target), default=None)
        got = log.offset_for_timestamp(target)
        assert (got.offset if got else None) == want, target
    log.close()


def test_corrupt_crc_writes_nothing(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    log.append(batch(2), 0)
    bad = bytearray(batch(2))
    bad[-1] ^= 0x10
    with pytest.raises(CorruptRecordError):
        log.append(bytes(batch(3)) + bytes(bad), 0)  # the good first batch is not written
    assert log.log_end_offset == 2
    assert log.active_segment.size == len(batch(2))
    assert os.path.getsize(log.active_segment.log_path) == len(batch(2))
    log.close()


def test_wrong_length_is_corrupt(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    bad = bytearray(batch(2))
    records._I.pack_into(bad, records.LENGTH_POS, len(bad))  # claims 12 bytes too many
    with pytest.raises(CorruptRecordError):
        log.append(bytes(bad), 0)
    with pytest.raises(CorruptRecordError):
        log.append(batch(2)[:-3], 0)  # torn payload
    with pytest.raises(CorruptRecordError):
        log.append(b"", 0)
    assert log.log_end_offset == 0 and log.active_segment.size == 0
    log.close()


def test_too_large_batch_is_refused(tmp_path):
    log = Log.open(tmp_path / "t-0", LogConfig(max_message_bytes=200))
    with pytest.raises(MessageTooLargeError):
        log.append(records.encode_batch([b"x" * 500]), 0)
    assert log.log_end_offset == 0
    log.close()


def test_a_follower_appends_batches_above_max_message_bytes(tmp_path):
    # max.message.bytes limits what clients produce, not what a leader already accepted:
    # a follower must copy the leader's log whatever its own (or a lowered) limit is, or
    # it wedges at the first older, larger batch (Kafka skips the check on replication).
    leader = Log.open(tmp_path / "leader-0", LogConfig(max_message_bytes=10_000))
    leader.append(records.encode_batch([b"x" * 500]), 3)
    follower = Log.open(tmp_path / "follower-0", LogConfig(max_message_bytes=200))
    assert follower.append_as_follower(leader.read_bytes(0, 1 << 20)) == (0, 0)
    assert follower.epochs.entries() == [(3, 0)]
    assert [r.value for r in log_records(follower)] == [b"x" * 500]
    with pytest.raises(MessageTooLargeError):  # a client's append is still refused
        follower.append(records.encode_batch([b"x" * 500]), 3)
    leader.close()
    follower.close()


def test_stale_leader_epoch_is_fenced(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    log.append(batch(1), 5)
    with pytest.raises(FencedLeaderEpochError):
        log.append(batch(1), 4)
    log.close()


def test_read_below_log_start_is_out_of_range(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    log.truncate_fully_and_start_at(100)
    log.append(batch(2), 0)
    assert (log.log_start_offset, log.log_end_offset) == (100, 102)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(99, 100)
    log.close()


def test_follower_append_keeps_offsets_and_checks_order(tmp_path):
    leader = Log.open(tmp_path / "l-0", SMALL)
    follower = Log.open(tmp_path / "f-0", SMALL)
    leader.append(batch(3), 1)
    leader.append(batch(2), 2)
    assert follower.append_as_follower(leader.read_bytes(0, 1 << 20)) == (0, 4)
    assert follower.latest_epoch == 2
    assert follower.epochs.entries() == [(1, 0), (2, 3)]
    with pytest.raises(CorruptRecordError):
        follower.append_as_follower(leader.read_bytes(3, 1 << 20))  # offsets go back
    leader.close()
    follower.close()


def test_segments_roll_by_size_and_time(tmp_path):
    clock = FakeClock()
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=4096, segment_ms=60_000), clock=clock)
    while len(log.segments) == 1:
        log.append(batch(10), 0)
    assert all(s.size <= 4096 for s in log.segments)
    n = len(log.segments)
    log.append(batch(1), 0)
    clock.now += 60_000
    log.append(batch(1), 0)
    assert len(log.segments) == n + 1
    log.close()


def test_flush_messages_forces_fsync_and_moves_recovery_point(tmp_path):
    log = Log.open(tmp_path / "t-0", LogConfig(flush_messages=10))
    log.append(batch(5), 0)
    assert log.recovery_point == 0
    log.append(batch(5), 0)  # no running loop here: the flush runs inline
    assert log.recovery_point == 10
    log.close()


async def test_flush_ms_flushes_in_background(tmp_path):
    clock = FakeClock()
    log = Log.open(tmp_path / "t-0", LogConfig(flush_ms=1000), clock=clock)
    log.append(batch(5), 0)
    assert log.recovery_point == 0
    clock.now += 1000
    log.maybe_flush_by_time()
    await log.wait_background()
    assert log.recovery_point == 5
    await log.flush_async()
    await log.close_async()


async def test_roll_persists_old_segment_off_the_loop(tmp_path):
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=2048, index_interval_bytes=256))
    while len(log.segments) < 3:
        log.append(batch(10), 0)
    await log.wait_background()
    first = log.segments[0]
    assert not first.index.mutable and first.index.path.exists()
    assert log.recovery_point >= log.segments[1].base_offset
    await log.close_async()


def test_config_rejects_unknown_and_bad_values():
    with pytest.raises(InvalidConfigError, match="segmnet.bytes"):
        LogConfig.from_dict({"segmnet.bytes": 1})
    with pytest.raises(InvalidConfigError, match="cleanup.policy"):
        LogConfig.from_dict({"cleanup.policy": "shred"})
    with pytest.raises(InvalidConfigError, match="segment.bytes"):
        LogConfig.from_dict({"segment.bytes": "lots"})
    cfg = LogConfig.from_dict({"segment.bytes": "2048", "cleanup.policy": "delete,compact"})
    assert cfg.segment_bytes == 2048 and cfg.compact and cfg.delete
    assert LogConfig().to_dict()["segment.bytes"] == 64 * 1024 * 1024


def test_append_stamps_every_buffer_kind_the_same_on_disk(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    b = batch(3)
    padded = bytearray(b"xx" + b + b"yy")
    inputs = [
        b,  # read-only: written with a stamped copy of its prefix (writev)
        memoryview(b),
        memoryview(bytes(padded))[2:-2],  # a read-only slice, as a request payload is
        bytearray(b),  # writable: stamped in place
        memoryview(padded)[2:-2],
    ]
    expected = b""
    for i, data in enumerate(inputs):
        assert log.append(data, 7) == (3 * i, 3 * i + 2)
        expected += stamped(b, 3 * i, 7)
    assert b == batch(3) and bytes(inputs[1]) == b  # read-only input left as it was
    assert bytes(inputs[3]) == stamped(b, 9, 7)  # writable input stamped in place
    assert padded[:2] == b"xx" and padded[-2:] == b"yy"
    assert log.read_bytes(0, 1 << 20) == expected
    assert [h.base_offset for _, h in records.iter_batches(expected)] == [0, 3, 6, 9, 12]
    log.close()


@pytest.mark.parametrize("short", [5, 16, 100])
def test_short_write_of_a_stamped_batch_is_completed(tmp_path, monkeypatch, short):
    # The pure-Python write_batch, whose os.writev can be made to return short here; the
    # native one returns a real short write's count the same way (test_batchwrite.py).
    monkeypatch.setattr(fs, "write_batch", batchwrite.write_batch_py)
    log = Log.open(tmp_path / "t-0", SMALL)
    real_writev = os.writev
    calls = []

    def writev_short(fd: int, buffers) -> int:  # a regular file may return short
        calls.append(1)
        return os.write(fd, b"".join(bytes(x) for x in buffers)[:short])

    monkeypatch.setattr(os, "writev", writev_short)
    log.append(batch(3), 2)
    monkeypatch.setattr(os, "writev", real_writev)
    log.append(batch(2), 2)
    assert calls == [1]
    assert log.read_bytes(0, 1 << 20) == stamped(batch(3), 0, 2) + stamped(batch(2), 3, 2)
    assert log.active_segment.size == len(batch(3)) + len(batch(2))
    log.close()


def test_failed_write_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    # The pure-Python twin's os.writev fails here; test_batchwrite.py fails real writes
    # of both implementations (RLIMIT_FSIZE).
    monkeypatch.setattr(fs, "write_batch", batchwrite.write_batch_py)
    log = Log.open(tmp_path / "t-0", SMALL)
    log.append(batch(2), 0)

    def no_space(fd: int, buffers) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "writev", no_space)
    with pytest.raises(OSError):
        log.append(batch(3), 0)
    assert (log.log_end_offset, log.active_segment.size) == (2, len(batch(2)))
    log.close()


def test_batch_without_records_is_refused(tmp_path):
    log = Log.open(tmp_path / "t-0", SMALL)
    empty = records.assemble_batch(
        b"\x90",
        attributes=0,
        record_count=0,
        last_offset_delta=0,
        base_timestamp=0,
        max_timestamp=0,
    )
    with pytest.raises(CorruptRecordError, match="no records"):
        log.append(empty, 0)
    assert (log.log_end_offset, log.active_segment.size) == (0, 0)
    log.close()


@pytest.mark.parametrize("kind", [OffsetIndex, TimeIndex])
@pytest.mark.parametrize("n", [0, 1, 4031])
def test_index_bytes_match_the_entry_layout_and_reload(tmp_path, kind, n):
    index = kind(tmp_path / "x.index", mutable=True)
    entries = [(i * 157 + (2**40 if kind is TimeIndex else 0), i * 16235) for i in range(n)]
    for key, value in entries:
        index.append(key, value)
    data = index.to_bytes()
    assert data == b"".join(kind.ENTRY.pack(k, v) for k, v in entries)
    kind.write_file(index.path, data, fsync=False)
    assert kind(index.path, mutable=True).entries() == entries


def test_live_indexes_equal_the_ones_recovery_rebuilds(tmp_path):
    import random

    rng = random.Random(7)
    log = Log.open(tmp_path / "t-0", LogConfig(index_interval_bytes=300))
    for i in range(200):  # timestamps jump around: the time index keeps the max so far
        log.append(batch(rng.randint(1, 4), start=i, ts=rng.randint(0, 10_000)), 0)
    seg = log.active_segment
    live = (seg.index.entries(), seg.time_index.entries(), seg.max_timestamp)
    assert len(live[0]) > 20 and len(live[1]) > 3
    seg.recover(seg.base_offset)
    assert (seg.index.entries(), seg.time_index.entries(), seg.max_timestamp) == live
    log.close()


@pytest.mark.parametrize(
    "cut",
    [
        lambda log: log.truncate_to(2),
        lambda log: log.truncate_fully_and_start_at(9),
        lambda log: log.increment_log_start_offset(2),
    ],
    ids=["truncate_to", "truncate_fully_and_start_at", "increment_log_start_offset"],
)
def test_a_cut_whose_checkpoint_fails_turns_the_log_read_only(tmp_path, monkeypatch, cut):
    """Found by the replication simulator with injected I/O errors: a follower's cut or
    log-start move changed the log in memory, its checkpoint write failed, the fetcher
    backed off and carried on; a later flush wrote epochs matching the new start while
    log-start-offset on disk still held the old one, and after a crash recovery had
    batches below the first epoch entry. Kafka takes the log dir offline on any such
    error; here the log turns read-only and tells its listener (the broker halts)."""
    log = Log.open(tmp_path / "t-0", SMALL)
    log.append(batch(2), 0)
    log.append(batch(2), 1)
    told: list[BaseException] = []
    log.failure_listener = lambda _log, exc: told.append(exc)

    def eio(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoints, "write_offset", eio)
    monkeypatch.setattr(checkpoints, "write_entries", eio)
    with pytest.raises(OSError):
        cut(log)
    assert isinstance(log.failure, OSError) and told == [log.failure]
    with pytest.raises(StorageError):
        log.append(batch(1), 1)
