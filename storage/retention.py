"""Retention: delete whole closed segments older than retention.ms (by their largest
timestamp) or beyond retention.bytes, oldest first, and (whatever the cleanup policy)
those wholly below the log start, never the active segment and never
a segment holding records at or past the high watermark (``Log.removable_end``).

On a tiered log (``LogConfig.tiered``: ``remote.storage.enable`` and no compaction;
docs/tiered.md) the local rule is narrower: a segment goes only once its last offset is at or below
``Log.remote_end_in_lineage()`` (the highest offset safely in remote storage, which the
broker sets from the metadata image, where this log agrees with the remote log: after
an unclean election a leader's new records below the remote end are not remote) and it
is past *local* retention (local.retention.ms /
local.retention.bytes, -2 meaning the total setting), or past total retention. Total
retention of the remote log is the remote log manager's job; nothing that is not yet
remote is ever deleted here, whatever its age.

The decision is pure (``segments_to_delete``); ``apply_retention`` takes the chosen
segments out of the log on the loop thread, then renames and checkpoints in the default
executor. The files' descriptors live on for ``file.delete.delay.ms`` so reads already
handed out (a FileSlice being sent) finish; ``purge_retired`` then closes and unlinks.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

from rillet.storage import checkpoints, fs
from rillet.storage.config import LogConfig
from rillet.storage.recovery import purge
from rillet.storage.segment import LogSegment

logger = logging.getLogger(__name__)


def segments_to_delete(
    segments: Sequence[LogSegment],
    config: LogConfig,
    now_ms: int,
    removable_end: int,
    log_start: int = 0,
    remote_end: int = -1,
) -> tuple[int, str]:
    """How many leading closed segments retention removes, and why (for the log line).

    Never the active segment, nor one holding an offset at or past ``removable_end``
    (the high watermark): a segment's records end where the next segment begins.
    Segments wholly below ``log_start`` go whatever the policy: nothing can read them
    (a follower that took its leader's log start, Kafka's log-start breach rule).
    With ``config.tiered`` (remote storage on, no compaction), only segments whose last
    offset is at or below ``remote_end`` may go, by local retention or total
    retention."""
    closed = 0
    while closed < len(segments) - 1 and segments[closed + 1].base_offset <= removable_end:
        closed += 1
    count, reason = 0, ""
    while count < closed and segments[count + 1].base_offset <= log_start:
        count += 1
    reason = "log start" if count else ""
    if not config.delete:
        return count, reason
    limits = [("retention", config.retention_ms, config.retention_bytes)]
    if config.tiered:
        # Segment i's last offset is the next segment's base - 1.
        while closed > count and segments[closed].base_offset > remote_end + 1:
            closed -= 1
        limits.append(
            (
                "local.retention",
                config.effective_local_retention_ms,
                config.effective_local_retention_bytes,
            )
        )
    for name, retention_ms, retention_bytes in limits:
        count, reason = _by_limits(
            segments, closed, now_ms, count, reason, name, retention_ms, retention_bytes
        )
    return count, reason


def _by_limits(
    segments: Sequence[LogSegment],
    closed: int,
    now_ms: int,
    count: int,
    reason: str,
    name: str,  # "retention" or "local.retention", for the reason
    retention_ms: int,
    retention_bytes: int,
) -> tuple[int, str]:
    """``count`` raised to what one pair of time and size limits removes (at most
    ``closed`` segments)."""
    if retention_ms >= 0 and count < closed:
        horizon = now_ms - retention_ms
        by_time = count
        while by_time < closed and segments[by_time].max_timestamp < horizon:
            by_time += 1
        if by_time > count:
            count, reason = by_time, f"{name}.ms"
    if retention_bytes >= 0:
        excess = sum(s.size for s in segments) - retention_bytes
        by_size = 0
        while by_size < closed and excess - segments[by_size].size >= 0:
            excess -= segments[by_size].size
            by_size += 1
        if by_size > count:
            count, reason = by_size, f"{name}.bytes"
    return count, reason


async def apply_retention(log, now_ms: int | None = None) -> int:
    """Delete what retention allows; returns the number of segments removed."""
    now = log.clock() if now_ms is None else now_ms
    async with log.maintenance_lock:
        if log.closed:  # deleted while this round waited for the lock
            return 0
        count, reason = segments_to_delete(
            log.segments,
            log.config,
            now,
            log.removable_end,
            log.log_start_offset,
            log.remote_end_in_lineage(),
        )
        if count == 0:
            return 0
        gone = log.remove_prefix(count)
        start = log.log_start_offset
        logger.info(
            "%s: %s deleted %d segment(s); log start now %d", log.name, reason, count, start
        )
        await log.run_tracked(_rename_and_checkpoint, log, gone, start)
        log.retire(gone, files="renamed")
        return count


def _rename_and_checkpoint(log, gone: list[LogSegment], start: int) -> None:
    """Rename to ``.deleted`` first: a reopen then never sees them, whatever the crash."""
    for seg in gone:
        for path in seg.paths():
            with contextlib.suppress(FileNotFoundError):
                fs.replace(path, path.with_name(path.name + ".deleted"))
    checkpoints.write_offset(log.directory / checkpoints.LOG_START_OFFSET, start, fsync=True)


async def purge_retired(log, now_ms: int | None = None) -> int:
    """Close and unlink retired segments whose delay has passed (in the executor)."""
    due = log.due_retired(log.clock() if now_ms is None else now_ms)
    if due:
        await log.run_tracked(purge, due)
    return len(due)
