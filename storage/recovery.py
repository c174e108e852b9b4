"""Loading a log at start-up and closing it cleanly.

After a clean shutdown (the ``clean-shutdown`` marker is present) nothing is scanned:
segments are listed from the directory, closed segments stay unopened until read, and
only the tail of the active segment after its last index entry is read (headers only).
After an unclean shutdown every segment from the one holding the recovery point on is
validated batch by batch; the first torn or corrupt batch and everything after it go.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rillet.storage import checkpoints, fs, loading
from rillet.storage.epoch_cache import LeaderEpochCache
from rillet.storage.invariants import invariant
from rillet.storage.scan import ScanProblem
from rillet.storage.segment import LogSegment

logger = logging.getLogger(__name__)


def load_log(log) -> None:  # log: rillet.storage.log.Log (not imported: no cycle)
    d: Path = log.directory
    rebuild = loading.tidy_directory(d)
    marker = d / checkpoints.CLEAN_SHUTDOWN
    clean = fs.exists(marker)
    log.topic_id = checkpoints.read_topic_id(d)
    ckpt_start = checkpoints.read_offset(d / checkpoints.LOG_START_OFFSET) or 0
    recovery_point = checkpoints.read_offset(d / checkpoints.RECOVERY_POINT) or 0
    log.epochs, epochs_sound = LeaderEpochCache.load(d / checkpoints.LEADER_EPOCH)
    segments = loading.list_segments(d, log.config.index_interval_bytes)
    # A new (or still empty) directory: no segment, no checkpoint file (not even a
    # malformed one), no marker. Loading it writes nothing (see _persist_after_load).
    fresh = (
        not segments
        and not clean
        and not any(
            fs.exists(d / name)
            for name in (
                checkpoints.LOG_START_OFFSET,
                checkpoints.RECOVERY_POINT,
                checkpoints.LEADER_EPOCH,
            )
        )
    )
    segments = _drop_below_start(segments, ckpt_start)
    if not segments:
        segments = [_new_segment(log, ckpt_start)]
    else:
        first_dirty = _first_to_recover(segments, rebuild, clean, recovery_point)
        if first_dirty is None:
            segments[-1].activate(log.clock())
        else:
            unflushed = None if clean else _holding(segments, recovery_point)
            segments = _recover_from(log, segments, first_dirty, unflushed)
    if ckpt_start > segments[-1].next_offset:
        segments = _start_empty_at(log, segments, ckpt_start)
    log_start = max(ckpt_start, segments[0].base_offset)
    end = segments[-1].next_offset
    # Everything up to the end is on disk now: written before a clean shutdown, or
    # scanned and fsynced by recovery. So the recovery point starts at the end.
    log._install(segments, log_start, end)
    if not epochs_sound:
        _rebuild_epochs(log)
    # From the start first: moved up to the start, an entry below it must still go when
    # no record is left at or after the start (an empty log after truncate_fully).
    log.epochs.truncate_from_start(log_start)
    log.epochs.truncate_from_end(end)
    if not fresh:
        _persist_after_load(log, clean)
    log._epochs_on_disk = log.epochs.entries()  # the file now holds exactly these
    log._epochs_durable_end = end


def _first_to_recover(
    segments: list[LogSegment], rebuild: set[int], clean: bool, recovery_point: int
) -> int | None:
    """Index of the first segment to scan, or None when nothing needs scanning."""
    candidates = [
        i
        for i, s in enumerate(segments)
        if s.base_offset in rebuild or loading.needs_index_rebuild(s)
    ]
    if not clean:
        candidates.append(_holding(segments, recovery_point))
    return min(candidates) if candidates else None


def _holding(segments: list[LogSegment], recovery_point: int) -> int:
    """Index of the segment holding the recovery point: it and later ones were never
    flushed, so they may have lost any unsynced part."""
    bases = [s.base_offset for s in segments]
    return max((i for i, b in enumerate(bases) if b <= recovery_point), default=0)


def _recover_from(
    log, segments: list[LogSegment], first: int, unflushed: int | None
) -> list[LogSegment]:
    """Scan segments[first:], cut at the first bad batch, drop later segments.

    From ``unflushed`` on (None: a clean shutdown), a segment whose records end before
    the next segment's base also ends the log: a roll creates the next file at once,
    and its directory entry may reach the disk before the rolled segment's data, so
    a crash can leave a clean but short segment. Kept, the later segments would leave
    offsets the log claims but can never read, and a follower fetching past them would
    never get the leader's records there. (A gap there may also be a compacted or
    truncated one; those records were never flushed either, so dropping them breaks no
    promise: recovery keeps everything below the recovery point.)"""
    log.epochs.truncate_from_end(segments[first].base_offset)
    min_offset = segments[first].base_offset
    keep = len(segments)
    for i in range(first, len(segments)):
        seg = segments[i]
        cut, problem = seg.recover(min_offset, _epoch_tracker(log.epochs))
        min_offset = seg.next_offset
        if (
            problem is None
            and unflushed is not None
            and unflushed <= i < len(segments) - 1
            and seg.next_offset < segments[i + 1].base_offset
        ):
            problem = ScanProblem(
                seg.size, f"records end at {seg.next_offset}, before the next segment"
            )
        if problem is not None:
            keep = i + 1
            dropped = segments[keep:]
            logger.warning(
                "%s: recovery cut %s at byte %d (%s): %d bytes and %d later segment(s) "
                "removed; log now ends at offset %d",
                log.name,
                seg.log_path.name,
                problem.position,
                problem.reason,
                cut,
                len(dropped),
                seg.next_offset,
            )
            for gone in dropped:
                gone.close()
                for path in gone.paths():
                    fs.unlink(path, missing_ok=True)
            break
    segments = segments[:keep]
    for seg in segments[first:]:
        seg.fsync()  # what we scanned may have lived only in the page cache
        if seg is not segments[-1]:
            seg.write_indexes(seg.seal(), fsync=True)
            seg.freeze()
    segments[-1].created_ms = log.clock()
    logger.info(
        "%s: recovered %d segment(s) from %s", log.name, keep - first, segments[first].log_path.name
    )
    return segments


def _epoch_tracker(epochs: LeaderEpochCache):
    def on_batch(h) -> None:
        if h.partition_leader_epoch > epochs.latest_epoch:
            epochs.assign(h.partition_leader_epoch, h.base_offset)

    return on_batch


def _rebuild_epochs(log) -> None:
    """The checkpoint was unreadable: derive it from every batch header (slow, rare)."""
    log.epochs.clear()
    track = _epoch_tracker(log.epochs)
    for seg in log.segments:
        for _, h in seg.headers_from(0):
            track(h)


def _drop_below_start(segments: list[LogSegment], log_start: int) -> list[LogSegment]:
    """Segments wholly below the log start: retention removed them, the unlink was lost."""
    keep = 0
    while keep + 1 < len(segments) and segments[keep + 1].base_offset <= log_start:
        keep += 1
    for seg in segments[:keep]:
        for path in seg.paths():
            fs.unlink(path, missing_ok=True)
    return segments[keep:]


def _start_empty_at(log, segments: list[LogSegment], log_start: int) -> list[LogSegment]:
    """The log start was checkpointed (durably) past records that were never flushed: a
    follower took its leader's log start, then lost its unsynced tail in a crash. No
    record at or after the start survived, so the log starts empty there and its
    replica fetches the rest from the leader (Kafka's loader does the same). Removing
    the old segments first keeps this idempotent: a crash part way repeats it."""
    logger.warning(
        "%s: the log ends at %d, below its log start %d (records past the last flush "
        "were lost); removing %d segment(s) and starting empty at %d",
        log.name,
        segments[-1].next_offset,
        log_start,
        len(segments),
        log_start,
    )
    for seg in segments:
        seg.close()
        for path in seg.paths():
            fs.unlink(path, missing_ok=True)
    fs.fsync_dir(log.directory)
    log.epochs.clear()
    return [_new_segment(log, log_start)]


def _new_segment(log, base_offset: int) -> LogSegment:
    return LogSegment.create(
        log.directory, base_offset, log.config.index_interval_bytes, log.clock()
    )


def _persist_after_load(log, clean: bool) -> None:
    """Make what loading decided durable. Skipped for a fresh directory: its log starts
    and ends at 0 with no epochs, which is exactly what the missing checkpoint files
    mean to the next load, and its one new segment file needs no durable entry (a
    directory without one loads as fresh again). The first flush or log-start move
    writes the checkpoints, and its directory fsync persists the segment's entry too."""
    d: Path = log.directory
    # Epochs before the recovery point: the recovery point on disk must never pass what
    # the epoch file covers (Log._epochs_durable_end).
    if log.epochs.dirty:
        log.epochs.write(log.epochs.snapshot(), fsync=True)
    checkpoints.write_offset(d / checkpoints.RECOVERY_POINT, log.recovery_point, fsync=True)
    checkpoints.write_offset(d / checkpoints.LOG_START_OFFSET, log.log_start_offset, fsync=True)
    marker = d / checkpoints.CLEAN_SHUTDOWN
    if clean:
        # From here on a crash must trigger recovery: the removal has to be durable.
        fs.unlink(marker)
    checkpoints.fsync_dir(d)


def close_log(log) -> None:
    """Persist everything, then leave the marker that lets the next open skip recovery."""
    d: Path = log.directory
    segments = list(log.segments)
    if log.failure is not None:
        # An fsync or write failed: what the page cache held may never reach the disk
        # (a later fsync can succeed without writing it). No checkpoint, no marker: the
        # next open recovers (Kafka takes the log dir offline).
        for seg in segments:
            seg.close()
        log.closed = True
        return
    for seg in segments:
        if seg.index.mutable:  # the active one, and rolled ones whose job has not run
            seg.write_indexes(seg.index_snapshot(), fsync=True)
        if seg.is_open or seg.dirty:  # the fd cache may have closed a dirty one
            seg.fsync()
    log.epochs.write(log.epochs.snapshot(), fsync=True)
    checkpoints.write_offset(d / checkpoints.LOG_START_OFFSET, log.log_start_offset, fsync=True)
    with log._state_lock:
        log._recovery_point = log.log_end_offset
        checkpoints.write_offset(d / checkpoints.RECOVERY_POINT, log.log_end_offset, fsync=True)
    purge(log.due_retired(None))
    for seg in segments:
        seg.close()
    fd = fs.open(d / checkpoints.CLEAN_SHUTDOWN, fs.O_WRONLY | fs.O_CREAT, 0o644)
    fs.fsync(fd)
    fs.close(fd)
    checkpoints.fsync_dir(d)
    log.closed = True
    invariant(log.recovery_point == log.log_end_offset, "recovery point at close")


def purge(retired) -> None:
    """Close retired descriptors and unlink their files. Blocking: run in an executor."""
    for r in retired:
        r.segment.close()
        for path in r.unlink:
            fs.unlink(path, missing_ok=True)
