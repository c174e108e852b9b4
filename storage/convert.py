"""``rillet log convert DIR``: rewrite the legacy (magic 0x52) batches of old logs as v2.

Every reader dispatches on each batch's magic, so an old log works as it is; converting
it makes every batch one a Kafka client reads and drops the msgpack path for good.

Per partition log (DIR is a broker's data dir or one partition dir):
- it is first opened and closed as a broker's start would, so an unclean shutdown's
  torn tail and any interrupted earlier convert are recovered by the usual rules;
- each segment holding a legacy batch is rewritten whole beside the old one; its other
  batches are copied byte for byte, each legacy batch re-encoded as v2 keeping its base
  offset, offsets (gaps too), leader epoch, timestamps, keys, values, headers, codec and
  producer fields; every re-encoded batch is decoded again and compared before use;
- the rewrite commits by the compaction cleaner's renames (``X.log.cleaned`` and its
  indexes written and fsynced, renamed to ``X.log.swap``, the commit point, made durable
  before the indexes move, then over ``X.log``), so a crash at any point leaves either
  segment whole with indexes of its own, and ``Log.open`` finishes or discards it;
- segments without a legacy batch are not touched.

The data dir's lock (``.lock``, the one a broker holds) is held throughout: convert
refuses to run beside a broker. ``dry_run`` reads only and takes no lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rillet.client.wire import records
from rillet.client.wire.records import BatchHeader
from rillet.storage import fs
from rillet.storage.cleaner import swap_files, write_cleaned
from rillet.storage.config import LogConfig
from rillet.storage.log import Log
from rillet.storage.manager import DELETE_SUFFIX, parse_partition_dir
from rillet.storage.scan import BatchScanner
from rillet.storage.segment import LogSegment


class ConvertError(Exception):
    """Convert cannot run (a broker holds the dir) or a batch did not convert."""


@dataclass(slots=True)
class LogConversion:
    """What convert did (or, dry, would do) to one partition log."""

    path: Path
    segments: int = 0  # segments rewritten
    batches: int = 0  # legacy batches re-encoded
    records: int = 0
    bytes_before: int = 0  # of the rewritten segments
    bytes_after: int = 0


def partition_dirs(path: Path) -> list[Path]:
    """``path`` itself when it holds segments, else its partition dirs (a data dir)."""
    if _holds_segments(path):
        return [path]
    return sorted(
        Path(e.path)
        for e in fs.scandir(path)
        if e.is_dir and not e.name.endswith(DELETE_SUFFIX) and parse_partition_dir(e.name)
    )


def data_dir_of(path: Path) -> Path:
    """The data dir whose lock guards ``path``: itself, or a partition dir's parent."""
    return path.parent if _holds_segments(path) else path


def _holds_segments(path: Path) -> bool:
    return any(_is_segment(n) for n in fs.listdir(path))


def convert(path: Path, *, dry_run: bool = False) -> list[LogConversion]:
    """Convert every log under ``path``; see the module docstring. Raises ConvertError
    when a broker holds the data dir."""
    if dry_run:
        return [_convert_log(d, dry_run=True) for d in partition_dirs(path)]
    lock_path = data_dir_of(path) / ".lock"
    try:
        lock = fs.lock_file(lock_path)
    except BlockingIOError:
        raise ConvertError(f"{lock_path.parent} is in use: stop its broker first") from None
    try:
        return [_convert_log(d, dry_run=False) for d in partition_dirs(path)]
    finally:
        fs.close(lock)


def _is_segment(name: str) -> bool:
    return len(name) == 24 and name.endswith(".log") and name[:20].isdigit()


def _convert_log(directory: Path, *, dry_run: bool) -> LogConversion:
    result = LogConversion(directory)
    config = LogConfig()
    if not dry_run:
        # Recovery first, as a broker's start: a torn tail is cut, an interrupted convert
        # completed or discarded, indexes rebuilt; the close marks a clean shutdown.
        Log.open(directory, config).close()
    names = sorted(n for n in fs.listdir(directory) if _is_segment(n))
    for name in names:
        seg = LogSegment(
            directory,
            int(name[:20]),
            size=fs.stat_size(directory / name),
            active=False,
            index_interval=config.index_interval_bytes,
        )
        try:
            _convert_segment(seg, result, dry_run=dry_run)
        finally:
            seg.close()
    return result


def _convert_segment(seg: LogSegment, result: LogConversion, *, dry_run: bool) -> None:
    scanner = BatchScanner(seg.fd, end=seg.size, min_offset=seg.base_offset)
    out: list[tuple[bytes | memoryview, BatchHeader]] = []
    legacy = records_in = 0
    for _, h, view in scanner:
        if h.magic == records.LEGACY_MAGIC:
            data = to_v2(view, h)
            out.append((data, records.read_header(data)))
            legacy += 1
            records_in += h.record_count
        else:
            out.append((bytes(view), h))
    if scanner.problem is not None:  # recovery cut torn tails: this is corruption
        raise ConvertError(
            f"{seg.log_path}: corrupt batch at byte {scanner.problem.position}: "
            f"{scanner.problem.reason} (see rillet log verify)"
        )
    if not legacy:
        return
    result.segments += 1
    result.batches += legacy
    result.records += records_in
    result.bytes_before += seg.size
    result.bytes_after += sum(len(data) for data, _ in out)
    if dry_run:
        return
    new = write_cleaned(seg, out)
    swap_files(new, seg, sync_commit=True)
    fs.fsync_dir(seg.directory)


def to_v2(view: memoryview | bytes, h: BatchHeader) -> bytes:
    """One legacy batch as v2, its records decoding to the same columns (checked)."""
    columns = records.decode_columns(view, 0, h)
    data = records.rebuild_batch(h, *columns)
    new = records.read_header(data)
    if new.last_offset != h.last_offset or _normal(records.decode_columns(data)) != _normal(
        columns
    ):
        raise ConvertError(f"batch at offset {h.base_offset} does not convert to the same records")
    return data


def _normal(columns: tuple) -> tuple:
    """Columns comparable across formats: headers as lists of tuples."""
    *rest, headers = columns
    return (*rest, [None if not hs else [tuple(p) for p in hs] for hs in headers])
