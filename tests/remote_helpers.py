"""Logs with real closed segments for the remote tier's tests: mixed batch sizes, codecs
and timestamps, several index entries per segment, written by storage/log.py itself;
and the tier's data invariant (``offsets_held_nowhere``)."""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from pathlib import Path

from rillet.client.wire import records
from rillet.controller.metadata.image import SEGMENT_COPY_FINISHED, RemoteSegment
from rillet.storage import Log, LogConfig
from rillet.storage.segment import LogSegment

CODECS = (
    records.COMPRESSION_NONE,
    records.COMPRESSION_GZIP,
    records.COMPRESSION_SNAPPY,
    records.COMPRESSION_LZ4,
    records.COMPRESSION_ZSTD,
)


def random_batch(rng: random.Random, ts: int) -> bytes:
    n = rng.choice((1, 1, 2, 5, 20, 60))
    size = rng.choice((0, 10, 100, 700))
    values = [
        rng.randbytes(rng.randint(0, size)) if rng.random() > 0.05 else None for _ in range(n)
    ]
    keys = [b"k%d" % rng.randint(0, 50) if rng.random() > 0.3 else None for _ in range(n)]
    # Timestamps mostly rise, with some out-of-order records (max timestamp still rules).
    stamps = [ts + rng.randint(-50, 100) for _ in range(n)]
    return records.encode_batch(values, keys, timestamps=stamps, compression=rng.choice(CODECS))


def build_log(
    directory: Path,
    *,
    seed: int = 1,
    batches: int = 300,
    segment_bytes: int = 48 * 1024,
    index_interval_bytes: int = 1024,
) -> Log:
    """A log of ``batches`` random batches over several segments (opened outside any
    event loop, so rolls finish inline). Epochs change now and then."""
    rng = random.Random(seed)
    log = Log.open(
        directory,
        LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes),
    )
    epoch = 0
    ts = 1_700_000_000_000
    for _ in range(batches):
        if rng.random() < 0.02:
            epoch += 1
        ts += rng.randint(0, 1000)
        log.append(random_batch(rng, ts), epoch)
    return log


def closed_segments(log: Log) -> list[LogSegment]:
    return list(log.segments[:-1])


def epochs_of(log: Log, segment: LogSegment, end: int) -> list[tuple[int, int]]:
    """The (epoch, start offset) entries that cover [segment.base_offset, end)."""
    entries = log.epochs.entries()
    covering = [(e, o) for e, o in entries if o < end]
    before = [(e, o) for e, o in covering if o <= segment.base_offset]
    return ([before[-1]] if before else []) + [
        (e, o) for e, o in covering if o > segment.base_offset
    ]


def offsets_held_nowhere(
    log: Log,
    remote: Sequence[RemoteSegment],
    lineage: Sequence[tuple[int, int]] | None = None,
) -> list[tuple[int, int]]:
    """The invariant of the remote tier's data: every offset from the lowest of the
    remote and local log starts up to the log end is held by the local log or by a
    finished remote segment (``remote``: the view's). Returns the ranges (inclusive)
    held by neither; [] when it holds.

    With ``lineage`` (the log's (epoch, start offset) entries, taken before retention
    could cut them), a remote segment holds an offset only when it wrote it in the
    lineage's epoch: after an unclean election the remote records past the agreement
    are another history, which is no copy of the log's own."""
    finished = [s for s in remote if s.state == SEGMENT_COPY_FINISHED]
    starts = [s.start_offset for s in finished]
    first = min([log.log_start_offset, *starts])

    def epoch_at(entries: Sequence[tuple[int, int]], offset: int) -> int | None:
        i = bisect.bisect_right([s for _, s in entries], offset) - 1
        return entries[i][0] if i >= 0 else None

    def held(offset: int) -> bool:
        if log.log_start_offset <= offset < log.log_end_offset:
            return True
        for seg in finished:
            if seg.start_offset <= offset <= seg.end_offset and (
                lineage is None or epoch_at(seg.leader_epochs, offset) == epoch_at(lineage, offset)
            ):
                return True
        return False

    missing: list[tuple[int, int]] = []
    for offset in range(first, log.log_end_offset):
        if held(offset):
            continue
        if missing and missing[-1][1] == offset - 1:
            missing[-1] = (missing[-1][0], offset)
        else:
            missing.append((offset, offset))
    return missing
