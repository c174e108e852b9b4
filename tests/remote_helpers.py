"""Logs with real closed segments for the remote tier's tests: mixed batch sizes, codecs
and timestamps, several index entries per segment, written by storage/log.py itself."""

from __future__ import annotations

import random
from pathlib import Path

from rillet.client.wire import records
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
