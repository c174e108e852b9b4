"""Logs holding batches of the legacy format (magic 0x52) beside v2 ones: storage reads,
recovers, indexes, compacts and retains them, and ``rillet log convert`` rewrites them
as v2 with every record as it was, crash-safely."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path

import pytest
from helpers import log_records
from legacy_batches import encode_legacy_batch

from rillet.client.wire import codecs, records
from rillet.storage import Log, LogConfig, checkpoints, cleaner, fs, retention
from rillet.storage.cli import cmd_convert, cmd_dump, cmd_verify
from rillet.storage.convert import ConvertError, convert
from rillet.storage.dump import scan_file

DAY = 24 * 3600 * 1000


class Args:
    def __init__(self, path: Path, **kw: object) -> None:
        self.path = path
        self.json = kw.get("json", False)
        self.records = kw.get("records", False)
        self.dry_run = kw.get("dry_run", False)


def legacy(i: int, n: int = 3, codec: int = codecs.NONE, ts: int = 1000) -> bytes:
    """A legacy batch of ``n`` records, keyed ``k<i>-<j>`` (one in three keyless), with
    distinct timestamps and a header on the first record."""
    return encode_legacy_batch(
        [b"v%d-%d" % (i, j) for j in range(n)],
        [None if j == 2 else b"k%d-%d" % (i, j) for j in range(n)],
        headers=[[("h", b"x%d" % i)]] + [None] * (n - 1),
        timestamps=[ts + i * 10 + j for j in range(n)],
        compression=codec,
    )


def old_log(path: Path, config: LogConfig, batches: int = 12, **kw: object) -> Log:
    """An old log: legacy batches in several segments, lz4, zstd and none, epochs 1-2,
    then v2 appends after it (as a broker running the new code does)."""
    log = Log.open(path, config, **kw)
    codecs_ = (codecs.NONE, codecs.LZ4, codecs.ZSTD)
    for i in range(batches):
        log.append(legacy(i, codec=codecs_[i % 3]), 1 if i < batches // 2 else 2)
    for i in range(3):
        ts = 1000 + (batches + i) * 10
        log.append(records.encode_batch([b"new%d" % i], [b"n%d" % i], timestamps=[ts]), 3)
    return log


def expected(batches: int = 12) -> list[tuple]:
    out = []
    for i in range(batches):
        for j in range(3):
            key = None if j == 2 else b"k%d-%d" % (i, j)
            hs = [("h", b"x%d" % i)] if j == 0 else None
            out.append((1000 + i * 10 + j, key, b"v%d-%d" % (i, j), hs))
    for i in range(3):
        out.append((1000 + (batches + i) * 10, b"n%d" % i, b"new%d" % i, None))
    return out


def plain(recs: list) -> list[tuple]:
    return [
        (r.timestamp, r.key, r.value, None if not r.headers else [tuple(h) for h in r.headers])
        for r in recs
    ]


def formats(path: Path) -> list[str]:
    return [
        row["format"]
        for seg in sorted(path.glob("*.log"))
        for row in scan_file(seg).rows  # type: ignore[union-attr]
    ]


SMALL = LogConfig(segment_bytes=400, file_delete_delay_ms=0)


def test_old_log_reads_recovers_and_indexes_by_time(tmp_path):
    log = old_log(tmp_path / "t-0", SMALL)
    assert len(log.segments) > 3
    assert [r.offset for r in log_records(log)] == list(range(39))
    assert plain(log_records(log)) == expected()
    hit = log.offset_for_timestamp(1000 + 5 * 10 + 1)  # inside a legacy batch
    assert hit is not None and (hit.offset, hit.timestamp) == (16, 1051)
    assert log.offset_for_timestamp(1000 + 13 * 10) == (37, 1130)  # a v2 batch
    log.close()
    # Unclean: no marker, every segment scanned again (recovery reads both magics).
    (tmp_path / "t-0" / checkpoints.CLEAN_SHUTDOWN).unlink()
    for index in (tmp_path / "t-0").glob("*.index"):
        index.unlink()
    again = Log.open(tmp_path / "t-0", SMALL)
    assert again.log_end_offset == 39 and plain(log_records(again)) == expected()
    assert again.offset_for_timestamp(1051).offset == 16
    assert again.end_offset_for_epoch(1) == (1, 18)  # epochs re-derived from legacy headers
    again.close()


async def test_cleaner_reencodes_a_partly_surviving_legacy_batch_as_v2(tmp_path):
    cfg = LogConfig(segment_bytes=400, cleanup_policy="compact", file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg)
    log.append(legacy(0), 1)  # k0-0, k0-1, keyless
    log.append(legacy(1), 1)
    # Supersede k0-1 only: batch 0 keeps two of its three records.
    log.append(records.encode_batch([b"newer"], [b"k0-1"], timestamps=[2000]), 1)
    log.roll()
    log.append(records.encode_batch([b"tail"], [b"t"], timestamps=[3000]), 1)
    await log.wait_background()
    log.high_watermark = log.log_end_offset
    stats = await cleaner.compact(log, now_ms=10_000)
    assert stats.records_removed == 1
    got = [(r.offset, r.key, r.value, r.headers) for r in log_records(log)]
    assert got == [
        (0, b"k0-0", b"v0-0", [("h", b"x0")]),
        (2, None, b"v0-2", None),
        (3, b"k1-0", b"v1-0", [("h", b"x1")]),
        (4, b"k1-1", b"v1-1", None),
        (5, None, b"v1-2", None),
        (6, b"k0-1", b"newer", None),
        (7, b"t", b"tail", None),
    ]
    # The cut batch is v2 now (gap kept); the untouched legacy one is copied as it was.
    assert formats(tmp_path / "t-0")[:2] == ["v2", "legacy"]
    await log.close_async()


async def test_retention_deletes_old_segments_of_legacy_batches(tmp_path):
    clock = lambda: 10 * DAY  # noqa: E731
    cfg = LogConfig(segment_bytes=400, retention_ms=DAY, file_delete_delay_ms=0)
    log = old_log(tmp_path / "t-0", cfg, clock=clock)
    log.append(records.encode_batch([b"now"], timestamps=[10 * DAY]), 3)
    log.high_watermark = log.log_end_offset
    old = len(log.segments) - 1
    removed = await retention.apply_retention(log)
    assert removed == old  # every closed segment: all their records are old
    assert log.log_start_offset == log.segments[0].base_offset > 0
    assert [r.value for r in log_records(log)][-1] == b"now"
    await log.close_async()


def test_follower_stores_a_leaders_legacy_batches_as_they_are(tmp_path):
    leader = old_log(tmp_path / "leader", SMALL)
    follower = Log.open(tmp_path / "follower", SMALL)
    offset = 0
    while offset < leader.log_end_offset:
        data = leader.read_bytes(offset, 1 << 20)
        follower.append_as_follower(data)
        offset = follower.log_end_offset
    assert plain(log_records(follower)) == expected()
    assert formats(tmp_path / "follower") == formats(tmp_path / "leader")
    assert formats(tmp_path / "follower").count("legacy") == 12
    leader.close()
    follower.close()


def test_produced_legacy_batch_is_refused_with_invalid_record():
    with pytest.raises(records.InvalidRecordError, match="magic 0x52"):
        records.validate_produced(legacy(0), compacted=False)


def test_dump_and_verify_show_each_batchs_format(tmp_path, capsys):
    old_log(tmp_path / "t-0", SMALL).close()
    assert cmd_dump(Args(tmp_path / "t-0", json=True, records=True)) == 0
    files = json.loads(capsys.readouterr().out)
    rows = [row for f in files for row in f["batches_detail"]]
    assert [r["format"] for r in rows] == ["legacy"] * 12 + ["v2"] * 3
    assert rows[0]["records"][0] == {
        "offset": 0,
        "timestamp": 1000,
        "key": "k0-0",
        "value": "v0-0",
        "headers": [["h", "x0"]],
    }
    assert cmd_dump(Args(tmp_path / "t-0")) == 0
    assert "legacy" in capsys.readouterr().out
    assert cmd_verify(Args(tmp_path / "t-0")) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "12 batch(es) in the legacy format" in out
    assert "rillet log convert" in out
    assert cmd_verify(Args(tmp_path / "t-0", json=True)) == 0
    report = json.loads(capsys.readouterr().out)
    assert sum(f["legacy_batches"] for f in report["files"]) == 12


def test_verify_fails_a_batch_whose_records_do_not_decode(tmp_path, capsys):
    log = Log.open(tmp_path / "t-0", SMALL)
    log.append(records.encode_batch([b"fine"]), 0)
    bad = bytearray(records.encode_batch([b"x" * 20]))
    bad[records.HEADER_SIZE] = 0x7F  # a record length past the section; CRC made to match
    crc = records.crc_of(bad, 0, len(bad))
    bad[records.CRC_POS : records.CRC_POS + 4] = crc.to_bytes(4, "big")
    records.stamp(bad, 0, 1, 0)
    log.append_as_follower(bytes(bad))
    log.close()
    assert cmd_verify(Args(tmp_path / "t-0")) == 1
    assert "CORRUPT" in capsys.readouterr().out


def test_convert_rewrites_legacy_segments_keeping_every_record(tmp_path, capsys):
    path = tmp_path / "data" / "t-0"
    log = old_log(path, SMALL)
    before = log_records(log)
    epochs = [log.end_offset_for_epoch(e) for e in (1, 2, 3)]
    log.close()
    v2_only = [p for p in sorted(path.glob("*.log")) if "legacy" not in formats_of(p)]
    untouched = {p: (p.stat().st_ino, p.read_bytes()) for p in v2_only}
    assert cmd_convert(Args(tmp_path / "data", dry_run=True)) == 0
    assert "would convert 12 batch(es), 36 record(s)" in capsys.readouterr().out
    assert formats(path).count("legacy") == 12  # a dry run writes nothing
    assert cmd_convert(Args(tmp_path / "data")) == 0
    out = capsys.readouterr().out
    assert f"{path}: converted 12 batch(es), 36 record(s)" in out
    assert formats(path) == ["v2"] * 15
    for p, (ino, data) in untouched.items():
        assert (p.stat().st_ino, p.read_bytes()) == (ino, data)
    assert cmd_verify(Args(path)) == 0
    assert "legacy" not in capsys.readouterr().out
    again = Log.open(path, SMALL)
    assert log_records(again) == before  # offsets, timestamps, keys, values, headers
    assert [again.end_offset_for_epoch(e) for e in (1, 2, 3)] == epochs
    assert again.offset_for_timestamp(1051).offset == 16
    again.close()
    for seg in sorted(path.glob("*.log")):
        for row in scan_file(seg).rows:
            assert row["compression"] in ("none", "lz4", "zstd")
    codecs_seen = [
        r["compression"] for seg in sorted(path.glob("*.log")) for r in scan_file(seg).rows
    ]
    assert codecs_seen[:3] == ["none", "lz4", "zstd"]  # each batch keeps its codec
    assert cmd_convert(Args(tmp_path / "data")) == 0  # twice: nothing left to do
    assert "no legacy batches" in capsys.readouterr().out


def formats_of(seg: Path) -> list[str]:
    return [row["format"] for row in scan_file(seg).rows]


def test_convert_keeps_gaps_and_producer_fields(tmp_path):
    path = tmp_path / "t-0"
    log = Log.open(path, SMALL)
    batch = encode_legacy_batch(
        [b"a", b"b"], [b"x", b"y"], offset_deltas=[0, 3], timestamps=[5, 9], base_offset=10
    )
    log.truncate_fully_and_start_at(10)
    log.append_as_follower(batch)
    log.close()
    convert(path)
    again = Log.open(path, SMALL)
    assert [(r.offset, r.timestamp, r.key) for r in log_records(again)] == [
        (10, 5, b"x"),
        (13, 9, b"y"),
    ]
    assert again.log_end_offset == 14
    again.close()
    (h,) = [row for row in scan_file(path / "00000000000000000010.log").rows]
    assert (h["base_offset"], h["last_offset"], h["format"]) == (10, 13, "v2")


def test_convert_refuses_a_dir_a_broker_holds(tmp_path, capsys):
    old_log(tmp_path / "data" / "t-0", SMALL).close()
    held = fs.lock_file(tmp_path / "data" / ".lock")
    try:
        with pytest.raises(ConvertError, match="in use"):
            convert(tmp_path / "data" / "t-0")
        assert cmd_convert(Args(tmp_path / "data")) == 1
        assert "stop its broker" in capsys.readouterr().err
    finally:
        fs.close(held)
    assert formats(tmp_path / "data" / "t-0").count("legacy") == 12


@pytest.mark.parametrize("fail_at", [0, 1, 2, 3])
def test_convert_crash_at_each_rename_leaves_a_whole_log(tmp_path, monkeypatch, fail_at):
    """A crash at any rename of a segment's swap (the process dies there: nothing after
    it runs) leaves a log that opens with every record, in either format."""
    path = tmp_path / "t-0"
    log = old_log(path, SMALL)
    before = log_records(log)
    log.close()
    renames = 0
    real = fs.replace

    def dying(src: os.PathLike, dst: os.PathLike) -> None:
        nonlocal renames
        if str(src).endswith((".cleaned", ".swap")):  # the swap's renames, not checkpoints'
            if renames == fail_at:
                raise SystemExit("killed")  # as a kill -9: nothing after it runs
            renames += 1
        real(src, dst)

    monkeypatch.setattr(fs, "replace", dying)
    with pytest.raises(SystemExit):
        convert(path)
    leftovers = {p.suffix for p in path.iterdir() if p.suffix in (".cleaned", ".swap")}
    # Before the commit point only the copy; after it the swap, with indexes yet to move.
    assert (
        leftovers
        == [{".cleaned"}, {".cleaned", ".swap"}, {".cleaned", ".swap"}, {".swap"}][fail_at]
    )
    monkeypatch.undo()
    again = Log.open(path, SMALL)
    assert log_records(again) == before
    assert not [p for p in path.iterdir() if p.name.endswith((".cleaned", ".swap"))]
    again.close()
    convert(path)  # and a second run finishes the job
    assert formats(path) == ["v2"] * 15
    final = Log.open(path, SMALL)
    assert log_records(final) == before
    final.close()


@pytest.mark.parametrize("entry_with_fsync", [False, True])
def test_convert_crashing_anywhere_keeps_every_record(entry_with_fsync: bool) -> None:
    """On the simulated file system, a crash before each of convert's mutating
    operations in turn (unsynced renames undone, unsynced bytes torn; a file's fsync
    persisting its own entry, as ext4's, or not): the log then opens with every record
    as it was, and a second convert finishes the job."""
    from sim.simfs import SimCrash, SimFileSystem
    from sim.storage_model import NODE

    path = Path(NODE) / "t-0"
    crashes = 0
    for n in itertools.count(1):
        sim = SimFileSystem(fsync_persists_entry=entry_with_fsync)
        sim.makedirs(NODE)
        with fs.install(sim):
            log = old_log(path, SMALL)
            before = log_records(log)
            log.close()
            sim.sync_all()
            sim.crash_after(n, NODE, random.Random(n))
            try:
                convert(path)
            except SimCrash:
                crashes += 1
            else:
                sim.cancel_crash()
                break
            finally:
                sim.restart(NODE)
            again = Log.open(path, SMALL)
            assert log_records(again) == before, f"crash before operation {n}"
            again.close()
            convert(path)
            final = Log.open(path, SMALL)
            assert log_records(final) == before, f"crash before operation {n}, converted"
            final.close()
            assert all(
                h.magic == records.MAGIC
                for name in sim.listdir(path)
                if name.endswith(".log")
                for _, h in records.iter_batches(sim.read_bytes(path / name))
            )
    assert crashes > 20  # every step of several segments' rewrites was crashed into


def test_legacy_header_values_and_keys_of_other_types_read_as_v2_holds_them() -> None:
    """The old writer packed headers as given, so old logs may hold str header values or
    bytes header keys: they read as bytes values and text keys, and re-encode as v2 (the
    cleaner and convert re-encode them) to the same records."""
    from legacy_batches import encode_legacy_batch

    from rillet.client.wire import records

    data = encode_legacy_batch(
        [b"a", b"b"], [b"k", b"k"], headers=[[("ct", "text/plain")], [(b"trace", b"v")]]
    )
    got = records.decode_batch(data)
    assert [r.headers for r in got] == [[("ct", b"text/plain")], [("trace", b"v")]]
    again = records.encode_batch(
        [r.value for r in got], [r.key for r in got], headers=[r.headers for r in got]
    )
    assert [r.headers for r in records.decode_batch(again)] == [r.headers for r in got]
