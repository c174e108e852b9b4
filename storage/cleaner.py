"""Log compaction (cleanup.policy=compact): keep the newest record of each key.

Only closed segments are cleaned, never the active one, so appends run on untouched.
``compact`` plans on the loop thread, does the heavy part (read, decode, rewrite, fsync)
in the default executor, then swaps on the loop thread after checking that no
truncation or retention changed the log meanwhile (``Log.generation``).

Per cleaned segment, rewritten in place of the old (same base offset):
- a batch whose records all survive is copied byte for byte (its CRC stays valid);
- a batch that loses some is re-encoded as a v2 batch whose offset deltas keep the
  survivors' offsets (gaps between them), keeping its base offset, leader epoch,
  compression and timestamp type (a batch of the legacy format becomes v2 this way);
- a batch that loses all is dropped (offsets leave a gap; readers skip it), unless it
  is the first batch of its leader epoch: that one is kept whole, so the log still shows
  where each epoch began (see ``_clean_one``);
- tombstones (value None) are dropped once their segment's largest timestamp is older
  than delete.retention.ms; keyless records are always kept.

Crash-safe swap: write ``X.log.cleaned`` and its indexes, fsync, rename the log to
``X.log.swap`` (the commit point), rename the indexes into place, rename the swap over
``X.log``. On open, ``.cleaned`` files are deleted and a ``.swap`` is completed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rillet.client.wire import records
from rillet.client.wire.records import BatchHeader
from rillet.storage import fs
from rillet.storage.invariants import invariant
from rillet.storage.scan import BatchScanner
from rillet.storage.segment import LogSegment

logger = logging.getLogger(__name__)

CLEANED = ".cleaned"


@dataclass(slots=True)
class CleanResult:
    old: LogSegment
    new: LogSegment | None  # the cleaned copy (possibly empty); the old one if unchanged
    changed: bool


@dataclass(slots=True)
class CleanStats:
    segments: int = 0
    rewritten: int = 0
    records_removed: int = 0
    results: list[CleanResult] = field(default_factory=list)


def plan(log, now_ms: int) -> list[LogSegment]:
    """The closed segments to clean: the leading run past min.compaction.lag.ms and
    wholly below the high watermark (uncommitted records may still be truncated)."""
    horizon = now_ms - log.config.min_compaction_lag_ms
    segments = log.segments
    chosen = []
    for i, seg in enumerate(segments[:-1]):
        if seg.max_timestamp > horizon or seg.index.mutable:
            break  # too young, or its roll's index write is still pending
        if segments[i + 1].base_offset > log.removable_end:
            break  # holds records above the high watermark
        chosen.append(seg)
    if not chosen or chosen[-1].base_offset <= log.clean_upto:
        return []  # nothing new since the last cleaning
    return chosen


async def compact(log, now_ms: int | None = None) -> CleanStats:
    """Clean the log's closed segments; returns what changed."""
    if not log.config.compact:
        return CleanStats()
    now = log.clock() if now_ms is None else now_ms
    async with log.maintenance_lock:
        if log.closed:  # deleted while this round waited for the lock
            return CleanStats()
        await log.wait_background()  # rolled segments' index writes must land first
        if log.durable_recovery_point < log.active_segment.base_offset:
            # Compaction works below the recovery point on disk (see plan): a roll moves
            # it in memory only, so write it first (a flush, captured on the loop).
            await log.run_tracked(log._prepare_flush())
        # Recovery ends the log where a segment from the one holding the recovery point
        # on stops short of the next base (a lost tail): a compacted segment there would
        # look like one, and everything after it would go. A cut since may lower it.
        durable = log.durable_recovery_point
        segments = [s for s in plan(log, now) if _next_base(log, s) <= durable]
        if not segments:
            return CleanStats()
        generation = log.generation
        horizon = now - log.config.delete_retention_ms
        for seg in segments:  # opened here, on the loop; the fd cache keeps them open
            seg.pin()  # while the worker preads them
        try:
            stats = await log.run_tracked(clean_segments, segments, horizon)
        finally:
            for seg in segments:
                seg.unpin()
        if generation != log.generation:
            logger.info("%s: log changed during compaction; discarding its output", log.name)
            await log.run_tracked(_discard, stats)
            return CleanStats()
        _swap(log, stats)
        log.clean_upto = segments[-1].base_offset
        return stats


def _next_base(log, seg: LogSegment) -> int:
    bases = [s.base_offset for s in log.segments]
    return bases[bases.index(seg.base_offset) + 1]


def clean_segments(segments: list[LogSegment], tombstone_horizon_ms: int) -> CleanStats:
    """The heavy part (executor thread): build the key map, write ``.cleaned`` files."""
    latest = _latest_offsets(segments)
    stats = CleanStats(segments=len(segments))
    epoch = None  # of the batch before; the run starts at the log's first segment
    try:
        for seg in segments:
            drop_tombstones = seg.max_timestamp < tombstone_horizon_ms
            result, removed, epoch = _clean_one(seg, latest, drop_tombstones, epoch)
            stats.results.append(result)
            stats.rewritten += result.changed
            stats.records_removed += removed
    except BaseException:
        # The old segments still stand, so the log stays writable; but a partial
        # ``.cleaned`` copy left here would make every later round fail on the existing
        # file until a restart. Remove what this round wrote, then report the error.
        _discard(stats)
        raise
    return stats


def _latest_offsets(segments: list[LogSegment]) -> dict[object, int]:
    latest: dict[object, int] = {}
    for seg in segments:
        for position, h, view in _batches(seg):
            offsets, _, keys, _, _ = records.decode_columns(view, 0, h)
            for key, offset in zip(keys, offsets, strict=True):
                if key is not None:
                    latest[key] = offset
            invariant(position >= 0, "scan position")
    return latest


def _batches(seg: LogSegment):
    scanner = BatchScanner(seg.fd, end=seg.size, min_offset=seg.base_offset)
    yield from scanner
    invariant(scanner.problem is None, f"corrupt closed segment {seg.log_path}: {scanner.problem}")


def _clean_one(
    seg: LogSegment, latest: dict[object, int], drop_tombstones: bool, epoch: int | None
) -> tuple[CleanResult, int, int | None]:
    """Rewrite one segment to ``X.log.cleaned`` unless nothing in it is removable.
    ``epoch`` is the leader epoch of the batch before the segment (None before the log's
    first batch); returns the one of its last batch.

    The first batch of each leader epoch stays even when every record in it is
    superseded. Where an epoch begins is read from the batches by whoever did not see it
    written: a follower fetching this log, and recovery re-deriving the epochs past its
    recovery point. Without that batch they would take the epoch's next surviving batch
    as its start, and a leader holding that later start answers a follower diverged in
    the epoch before it that the epoch ended there: the follower keeps records of a
    deposed leader below that point, under its HW. A kept batch costs one per epoch.
    The log's first batch marks no epoch's end in this log and is compacted as usual."""
    out: list[tuple[bytes | memoryview, BatchHeader]] = []
    removed = 0
    for _, h, view in _batches(seg):
        starts_epoch = epoch is not None and h.partition_leader_epoch != epoch
        epoch = h.partition_leader_epoch
        kept = _filter_batch(view, h, latest, drop_tombstones)
        if kept == b"" and starts_epoch:
            kept = None  # all superseded, but it marks where its epoch began
        if kept is None:
            out.append((bytes(view), h))
            continue
        removed += h.record_count - (records.read_header(kept).record_count if kept else 0)
        if kept:
            out.append((kept, records.read_header(kept)))
    if removed == 0:
        return CleanResult(seg, seg, changed=False), 0, epoch
    new = write_cleaned(seg, out)
    return CleanResult(seg, new, changed=True), removed, epoch


def write_cleaned(
    seg: LogSegment, batches: list[tuple[bytes | memoryview, BatchHeader]]
) -> LogSegment:
    """Write ``batches`` as ``X.log.cleaned`` beside ``seg`` with its indexes, fsynced and
    closed: the copy ``swap_files`` commits (``rillet log convert`` writes its own so)."""
    new = LogSegment.create(seg.directory, seg.base_offset, seg.index_interval, 0, CLEANED)
    try:
        for data, h in batches:  # offsets and epochs as they were: append never stamps
            new.append(data, [(h.base_offset, h.last_offset, h.max_timestamp, len(data))])
        new.write_indexes(new.seal(), fsync=True)
        new.fsync()
    except BaseException:
        new.close()
        for path in new.paths():
            fs.unlink(path, missing_ok=True)
        raise
    new.close()
    return new


def swap_files(new: LogSegment, old: LogSegment, *, sync_commit: bool = False) -> None:
    """Commit a ``.cleaned`` copy over ``old`` by renames alone (see the module
    docstring); the caller makes them durable with ``fs.fsync_dir``. ``sync_commit``
    makes the commit point durable before the indexes move, so no crash can pair the
    new indexes with the old log (an fsync more per segment: for offline tools)."""
    swap = old.log_path.with_name(old.log_path.name + ".swap")
    fs.replace(new.log_path, swap)  # commit point
    if sync_commit:
        fs.fsync_dir(old.directory)
    fs.replace(new.index.path, old.index.path)
    fs.replace(new.time_index.path, old.time_index.path)
    fs.replace(swap, old.log_path)


def _filter_batch(
    view: memoryview, h: BatchHeader, latest: dict[object, int], drop_tombstones: bool
) -> bytes | None:
    """None when every record stays; else the re-encoded batch (b"" when none stays).

    The batch keeps its last offset (``records.rebuild_batch``): with its superseded last
    record gone and the last offset shortened, a log could end inside the span of its
    leader's copy of that batch, which the leader then sends again from its base offset,
    below the follower's log end, forever."""
    offsets, stamps, keys, values, headers = records.decode_columns(view, 0, h)
    keep = [
        i
        for i, (o, k, v) in enumerate(zip(offsets, keys, values, strict=True))
        if k is None or (latest.get(k) == o and not (v is None and drop_tombstones))
    ]
    if len(keep) == len(offsets):
        return None
    if not keep:
        return b""
    return records.rebuild_batch(
        h,
        [offsets[i] for i in keep],
        [stamps[i] for i in keep],
        [keys[i] for i in keep],
        [values[i] for i in keep],
        [headers[i] for i in keep],
    )


def _swap(log, stats: CleanStats) -> None:
    """Commit each cleaned segment (loop thread; renames only) and retire the old."""
    log.files_replaced()
    for r in stats.results:
        if not r.changed:
            continue
        old = r.old
        invariant(r.new is not None, "a changed segment has a cleaned copy")
        assert r.new is not None  # for the type checker; the invariant above guards it
        if r.new.size == 0 and old is not log.segments[0]:
            # Nothing survived: drop the segment (the first stays, holding the log start).
            for path in r.new.paths():
                fs.unlink(path, missing_ok=True)
            log.replace_segment(old, None)
            log.retire([old], files="rename")
            continue
        swap_files(r.new, old)
        fresh = LogSegment(
            log.directory,
            old.base_offset,
            size=r.new.size,
            active=False,
            index_interval=old.index_interval,
        )
        log.replace_segment(old, fresh)
        log.retire([old], files="keep")  # its fd still reads the old bytes for readers
    # The renames become durable together, before anything else can persist one alone:
    # on ext4/xfs a later fsync of the new X.log may make its own entry durable, and a
    # crash would then pair the cleaned log with the old X.index.
    try:
        fs.fsync_dir(log.directory)
    except OSError as exc:  # which renames reached the disk is unknown: as a failed fsync
        log._fail(exc)
        raise
    logger.info(
        "%s: compacted %d segment(s), rewrote %d, removed %d record(s)",
        log.name,
        stats.segments,
        stats.rewritten,
        stats.records_removed,
    )


def _discard(stats: CleanStats) -> None:
    for r in stats.results:
        if r.changed and r.new is not None and r.new is not r.old:
            for path in r.new.paths():
                fs.unlink(path, missing_ok=True)
