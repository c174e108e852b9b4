"""What ``rillet log dump`` and ``rillet log verify`` report, as plain data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rillet.client.wire import records
from rillet.client.wire.errors import CorruptRecordError
from rillet.client.wire.records import COMPRESSION_NAMES, HEADER_SIZE, LOG_OVERHEAD
from rillet.storage.scan import BatchScanner


@dataclass(slots=True)
class FileReport:
    path: Path
    batches: int = 0
    records: int = 0
    bytes: int = 0
    legacy: int = 0  # batches in the legacy format (magic 0x52): ``rillet log convert``
    problem: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)


def segment_files(path: Path) -> list[Path]:
    """A segment file itself, or every ``*.log`` segment in a partition dir, in order."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith(".log"))
    return [path]


def scan_file(
    path: Path, *, with_records: bool = False, keep_rows: bool = True, decode: bool = False
) -> FileReport:
    """Every batch of one segment file; stops at the first torn or corrupt one: one
    whose length or CRC fails, or with ``decode`` one whose records do not decode."""
    report = FileReport(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        base = int(path.name[:20]) if path.name[:20].isdigit() else 0
        scanner = BatchScanner(fd, min_offset=base)
        for position, h, view in scanner:
            if decode:
                try:
                    records.decode_columns(view, 0, h)
                except CorruptRecordError as e:
                    report.problem = {"file": str(path), "position": position, "reason": str(e)}
                    report.bytes = position
                    return report
            report.batches += 1
            report.legacy += h.magic == records.LEGACY_MAGIC
            report.records += h.record_count
            if keep_rows:
                report.rows.append(batch_row(position, h, view, with_records))
        report.bytes = scanner.end
        if scanner.problem is not None:
            p = scanner.problem
            report.problem = {"file": str(path), "position": p.position, "reason": p.reason}
            if keep_rows:
                report.rows.append(_bad_row(fd, p.position, p.reason))
    finally:
        os.close(fd)
    return report


def batch_row(
    position: int, h: records.BatchHeader, view: memoryview, with_records: bool
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "position": position,
        "base_offset": h.base_offset,
        "last_offset": h.last_offset,
        "leader_epoch": h.partition_leader_epoch,
        "base_timestamp": h.base_timestamp,
        "max_timestamp": h.max_timestamp,
        "count": h.record_count,
        "size": h.batch_length + LOG_OVERHEAD,
        "format": format_name(h.magic),
        "compression": COMPRESSION_NAMES.get(h.compression, str(h.compression)),
        "crc": f"{h.crc:#010x}",
        "crc_valid": True,
    }
    if with_records:
        row["records"] = list(_records(view, h))
    return row


def format_name(magic: int) -> str:
    """``v2`` (Kafka's RecordBatch v2), ``legacy`` (rillet's first format) or the byte."""
    return {records.MAGIC: "v2", records.LEGACY_MAGIC: "legacy"}.get(magic, f"magic {magic}")


def _records(view: memoryview, h: records.BatchHeader) -> Iterator[dict[str, Any]]:
    try:
        decoded = records.decode_batch(view, 0, h)
    except CorruptRecordError as e:
        yield {"error": str(e)}
        return
    for r in decoded:
        yield {
            "offset": r.offset,
            "timestamp": r.timestamp,
            "key": _show(r.key),
            "value": _show(r.value),
            "headers": None if r.headers is None else [[k, _show(v)] for k, v in r.headers],
        }


def _bad_row(fd: int, position: int, reason: str) -> dict[str, Any]:
    """The batch where the scan stopped: what its header says, if it has one."""
    row: dict[str, Any] = {"position": position, "crc_valid": False, "error": reason}
    raw = os.pread(fd, HEADER_SIZE, position)
    if len(raw) == HEADER_SIZE:
        h = records.read_header(raw)
        row.update(
            base_offset=h.base_offset,
            last_offset=h.last_offset,
            leader_epoch=h.partition_leader_epoch,
            count=h.record_count,
            size=h.batch_length + LOG_OVERHEAD,
            format=format_name(h.magic),
        )
    return row


def _show(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value.hex()
    return value
