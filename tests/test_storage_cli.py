"""`rillet log dump` output, and compaction running while appends continue."""

from __future__ import annotations

import asyncio
import json
import threading

from rillet.client.wire import records
from rillet.storage import Log, LogConfig, cleaner
from rillet.storage.cli import cmd_dump
from rillet.storage.dump import scan_file


def test_dump_json_lists_batches_and_records(tmp_path, capsys):
    log = Log.open(tmp_path / "t-0", LogConfig())
    log.append(records.encode_batch([b"a", b"b"], [b"k1", b"k2"], timestamp_ms=5), 3)
    log.append(records.encode_batch([b"c"], compression=records.COMPRESSION_ZSTD), 3)
    log.close()

    class Args:
        path = tmp_path / "t-0"
        json = True
        records = True

    assert cmd_dump(Args()) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out[0]["batches_detail"]
    assert [(r["base_offset"], r["last_offset"], r["leader_epoch"]) for r in rows] == [
        (0, 1, 3),
        (2, 2, 3),
    ]
    assert rows[1]["compression"] == "zstd" and rows[0]["crc_valid"]
    assert [x["value"] for x in rows[0]["records"]] == ["a", "b"]
    assert rows[1]["position"] == rows[0]["size"]


async def test_compaction_does_not_block_appends(tmp_path):
    cfg = LogConfig(segment_bytes=1024, cleanup_policy="compact", file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", cfg)
    while len(log.segments) < 4:
        log.append(records.encode_batch([b"x" * 40] * 3, [b"same"] * 3, timestamp_ms=1), 0)
    await log.wait_background()
    started, release = threading.Event(), threading.Event()
    real = cleaner.clean_segments

    def gated(segments, horizon):
        started.set()
        release.wait(30)  # held until the loop has appended (a test gate, not a sleep)
        return real(segments, horizon)

    cleaner.clean_segments = gated
    try:
        task = asyncio.create_task(cleaner.compact(log))
        while not started.is_set():
            await asyncio.sleep(0)  # let the task reach the executor
        end_before = log.log_end_offset
        for _ in range(30):  # appends (and rolls) proceed while the cleaner works
            log.append(records.encode_batch([b"new"], [b"other"], timestamp_ms=2), 0)
        assert log.log_end_offset == end_before + 30
        release.set()
        stats = await task
    finally:
        cleaner.clean_segments = real
    assert stats.rewritten > 0
    recs, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        batch_recs = [
            r for r in records.decode_all(log.read_bytes(offset, 1 << 20)) if r.offset >= offset
        ]
        recs.extend(batch_recs)
        offset = batch_recs[-1].offset + 1
    assert [r.key for r in recs].count(b"other") == 30
    assert [r.offset for r in recs] == sorted(r.offset for r in recs)
    for seg in log.segments:
        assert scan_file(seg.log_path, keep_rows=False).problem is None
    await log.close_async()
