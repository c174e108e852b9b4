"""Crash recovery as a property, checked against `rillet log verify` run for real; and a
clean open of thousands of segments that reads almost nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rillet.client.wire import records
from rillet.storage import Log, LogConfig, fs

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=256)
RILLET = [sys.executable, "-m", "rillet.client.cli"]


def verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RILLET, "log", "verify", str(path)], capture_output=True, text=True, timeout=60
    )


def write_log(path: Path, sizes: list[int]) -> list[tuple[Path, int, int, int]]:
    """Append batches of the given record counts; returns (file, position, size, next
    offset) per batch, read back from the files."""
    real_fsync = fs.fsync
    fs.fsync = lambda fd: None  # building fast: durability is not what these tests check
    try:
        log = Log.open(path, CONFIG)
        for i, n in enumerate(sizes):
            log.append(records.encode_batch([b"v%d-%d" % (i, j) for j in range(n)]), 1)
        log.close()
    finally:
        fs.fsync = real_fsync
    layout = []
    for seg in sorted(path.glob("*.log")):
        data = seg.read_bytes()
        for pos, h in records.iter_batches(data):
            layout.append((seg, pos, h.batch_length + records.LOG_OVERHEAD, h.next_offset))
    return layout


def crash(path: Path) -> None:
    """Make the log look unclean: no marker, recovery point at 0."""
    (path / "clean-shutdown").unlink()
    (path / "recovery-point").unlink()


def expected_end(layout, damaged_file: Path, damaged_pos: int) -> int:
    """Log end after recovery: the next offset of the last batch before the damage."""
    kept = [b for b in layout if (b[0], b[1]) < (damaged_file, damaged_pos)]
    return kept[-1][3] if kept else 0


batch_sizes = st.lists(st.integers(1, 30), min_size=3, max_size=25)
PROPERTY = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def check_recovered(path: Path, end: int, damaged: tuple[Path, int] | None) -> None:
    before = verify(path)
    if damaged is None:
        assert before.returncode == 0, before.stdout
    else:
        assert before.returncode == 1
        assert f"{damaged[0]} at byte {damaged[1]}:" in before.stdout, before.stdout
    log = Log.open(path, CONFIG)
    assert log.log_end_offset == end
    offsets: list[int] = []
    while len(offsets) < end:  # every record of the valid prefix, read segment by segment
        offsets.extend(r.offset for r in records.decode_all(log.read_bytes(len(offsets), 1 << 30)))
    assert offsets == list(range(end))
    assert log.append(records.encode_batch([b"after"]), 2) == (end, end)
    log.close()
    after = verify(path)
    assert after.returncode == 0, after.stdout


@PROPERTY
@given(sizes=batch_sizes, data=st.data())
def test_recovery_after_a_torn_tail(tmp_path_factory, sizes, data):
    path = tmp_path_factory.mktemp("torn") / "t-0"
    layout = write_log(path, sizes)
    last = sorted(path.glob("*.log"))[-1]
    cut = data.draw(st.integers(0, last.stat().st_size), label="cut")
    os.truncate(last, cut)
    crash(path)
    torn = [b for b in layout if b[0] == last and b[1] < cut < b[1] + b[2]]
    end = expected_end(layout, last, torn[0][1] if torn else cut)
    check_recovered(path, end, (last, torn[0][1]) if torn else None)
    shutil.rmtree(path.parent)


@PROPERTY
@given(sizes=batch_sizes, data=st.data())
def test_recovery_after_a_flipped_byte(tmp_path_factory, sizes, data):
    path = tmp_path_factory.mktemp("flip") / "t-0"
    layout = write_log(path, sizes)
    seg, pos, size, _ = data.draw(st.sampled_from(layout), label="batch")
    # Every byte but base_offset (0-7) and the leader epoch (12-15): by design (docs/design.md,
    # "Record batches") the CRC leaves those out so a leader can stamp them in place.
    inside = data.draw(st.sampled_from([*range(8, 12), *range(16, size)]), label="byte")
    raw = bytearray(seg.read_bytes())
    raw[pos + inside] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    seg.write_bytes(bytes(raw))
    crash(path)
    check_recovered(path, expected_end(layout, seg, pos), (seg, pos))
    shutil.rmtree(path.parent)


def test_recovery_logs_what_was_cut(tmp_path, caplog):
    path = tmp_path / "t-0"
    write_log(path, [5, 5, 5])
    seg = sorted(path.glob("*.log"))[-1]
    os.truncate(seg, seg.stat().st_size - 3)
    crash(path)
    log = Log.open(path, CONFIG)
    assert log.log_end_offset == 10
    assert any("recovery cut" in r.message and seg.name in r.message for r in caplog.records)
    log.close()


def test_clean_open_of_thousands_of_segments_reads_almost_nothing(tmp_path, monkeypatch):
    path = tmp_path / "t-0"
    monkeypatch.setattr(fs, "fsync", lambda fd: None)  # building fast; durability not tested
    log = Log.open(path, LogConfig(segment_bytes=1024, index_interval_bytes=256))
    payload = records.encode_batch([b"x" * 100] * 3)
    while len(log.segments) < 2000:
        for _ in range(3):
            log.append(payload, 0)
    end = log.log_end_offset
    log.close()
    monkeypatch.undo()
    total = sum(p.stat().st_size for p in path.iterdir())

    reads: list[int] = []
    opened: list[str] = []
    real_pread, real_open, real_read_bytes = fs.pread, fs.open, fs.read_bytes

    def counting_pread(fd: int, n: int, pos: int) -> bytes:
        reads.append(n)
        return real_pread(fd, n, pos)

    def counting_open(p, *args, **kwargs) -> int:
        opened.append(str(p))
        return real_open(p, *args, **kwargs)

    def counting_read_bytes(p) -> bytes:  # index files are read whole
        opened.append(str(p))
        return real_read_bytes(p)

    monkeypatch.setattr(fs, "pread", counting_pread)
    monkeypatch.setattr(fs, "open", counting_open)
    monkeypatch.setattr(fs, "read_bytes", counting_read_bytes)
    reopened = Log.open(path, LogConfig(segment_bytes=1024, index_interval_bytes=256))
    assert reopened.log_end_offset == end and len(reopened.segments) >= 2000
    segment_opens = [p for p in opened if p.endswith(".log")]
    assert len(segment_opens) <= 1, segment_opens  # only the active segment
    index_opens = [p for p in opened if p.endswith(("index", "timeindex"))]
    assert len(index_opens) <= 2, index_opens  # only the active segment's two indexes
    assert sum(reads) < 10_000, f"read {sum(reads)} of {total} bytes"
    # Reads still work: the first segment's index loads on demand.
    assert records.decode_all(reopened.read_bytes(0, 1))[0].offset == 0
    monkeypatch.undo()
    reopened.close()
