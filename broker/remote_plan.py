"""What the remote log manager does next, decided without I/O (docs/tiered.md).

Each function reads a partition's local segments, its remote segments as the metadata
image records them, and the clock it is given, and says what to copy, what to delete
or what to clean up; broker/remote_log_manager.py carries that out (uploads, deletes,
metadata records). Kept pure so every rule is tested on plain values.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from typing import NamedTuple

from rillet.controller.metadata.image import (
    SEGMENT_COPY_STARTED,
    SEGMENT_DELETE_STARTED,
    RemoteSegment,
)
from rillet.storage.remote.layout import parse_segment_key, parse_topic_of_key
from rillet.storage.remote.store import ObjectInfo
from rillet.storage.segment import LogSegment


class ToCopy(NamedTuple):
    segment: LogSegment
    end_offset: int  # its last offset: the next segment's base offset - 1


def segments_to_copy(
    segments: Sequence[LogSegment], high_watermark: int, remote_end: int
) -> list[ToCopy]:
    """Closed segments to upload, oldest first: every segment whose next segment's base
    offset is at or below the high watermark (all its records are committed: no leader
    change can truncate them) and whose last offset is past ``remote_end``, the highest
    offset already remote (-1: none)."""
    out = []
    for seg, after in zip(segments, segments[1:], strict=False):
        if after.base_offset > high_watermark:
            break
        end = after.base_offset - 1
        if end > remote_end and seg.size > 0:
            out.append(ToCopy(seg, end))
    return out


def epochs_in(
    entries: Sequence[tuple[int, int]], start: int, end: int
) -> tuple[tuple[int, int], ...]:
    """The (epoch, start offset) entries of a log's leader-epoch cache that cover the
    offsets ``start``..``end``: the epoch in force at ``start`` (starting there), then
    every epoch that starts inside the range."""
    out: list[tuple[int, int]] = []
    for epoch, first in entries:
        if first <= start:
            out = [(epoch, start)]
        elif first <= end:
            out.append((epoch, first))
        else:
            break
    return tuple(out)


def remote_segments_past_retention(
    remote: Sequence[RemoteSegment],
    local_log_start: int,
    local_size_bytes: int,
    retention_ms: int,
    retention_bytes: int,
    now_ms: int,
) -> list[RemoteSegment]:
    """Finished remote segments that total retention deletes, oldest first: older than
    ``retention_ms`` (by their largest timestamp), or beyond ``retention_bytes`` of the
    whole log (remote-only segments plus the local log).

    Only segments wholly below the local log start: one whose offsets are still on local
    disk goes once local retention has deleted them there (it deletes whatever is past
    total retention too). Deleting it earlier would lower the highest remote offset
    below data that is only local, and that data would be copied again.

    Remote segments may overlap (a new leader's first copy starts below its
    predecessor's last end, docs/tiered.md). "Oldest" is by end offset, the order they
    were copied in: deleting in that order never leaves a hole, since each copy starts
    at or below the end of the one before it. The bytes that ``retention_bytes`` bounds
    are record bytes, so the overlap is counted once, from below: a segment counts only
    when it starts past the end of the one before it, which never deletes early (it may
    keep a segment more)."""
    below = sorted(
        (s for s in remote if s.end_offset < local_log_start),
        key=lambda s: (s.end_offset, s.start_offset),
    )
    # kept[i]: a lower bound of the distinct bytes of below[i:] (what is left once the
    # segments before i are deleted): below[i] itself, and every later segment that
    # starts past the end of the one before it (those are pairwise disjoint).
    n = len(below)
    tail = 0  # sum of the later segments' counted sizes
    kept = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        kept[i] = below[i].size_bytes + tail
        if i and below[i].start_offset > below[i - 1].end_offset:
            tail += below[i].size_bytes
    out: list[RemoteSegment] = []
    horizon = now_ms - retention_ms
    for i, seg in enumerate(below):
        by_time = retention_ms >= 0 and seg.max_timestamp_ms < horizon
        by_size = retention_bytes >= 0 and kept[i + 1] + local_size_bytes >= retention_bytes
        if not (by_time or by_size):
            break
        out.append(seg)
    return out


def stale_copies(
    segments: Mapping[str, RemoteSegment],
    broker_id: int,
    leader_epoch: int,
    claimed: Collection[str] = (),
) -> list[RemoteSegment]:
    """Copies and deletions left unfinished, oldest first, for the leader to delete:
    every other writer's (an earlier leader, or this broker in an earlier leader epoch),
    and its own that it does not ``claim`` (work under way, or finished but not in the
    image yet): a delete that failed, or a record whose answer was lost."""
    out = [
        s
        for s in segments.values()
        if s.state in (SEGMENT_COPY_STARTED, SEGMENT_DELETE_STARTED)
        and (
            (s.broker_id, s.leader_epoch) != (broker_id, leader_epoch)
            or s.segment_id not in claimed
        )
    ]
    return sorted(out, key=lambda s: (s.start_offset, s.segment_id))


def orphans(
    objects: Iterable[ObjectInfo], named: Iterable[str], now_ms: int, min_age_ms: int
) -> list[str]:
    """Keys of segment objects that no remote segment of the image names (by segment
    id) and that are at least ``min_age_ms`` old: a leader that died between an upload
    and its COPY_STARTED record's cleanup, or a deletion cut short, left them. The age
    guards an upload whose COPY_STARTED this broker's image does not show yet. Keys
    that are not segment objects are never touched."""
    ids = set(named)
    out = []
    for obj in objects:
        parsed = parse_segment_key(obj.key)
        if parsed is None or parsed[1] in ids:
            continue
        if now_ms - obj.last_modified_ms >= min_age_ms:
            out.append(obj.key)
    return out


class Divergence(NamedTuple):
    delete: list[RemoteSegment]  # newest first
    blocked: RemoteSegment | None  # kept: it straddles the divergence; copying waits


def divergent_remote_segments(
    remote: Sequence[RemoteSegment], agreed: int, local_log_start: int
) -> Divergence:
    """What a leader whose log agrees with the remote log only up to ``agreed`` (below
    the remote end: an unclean election made it leader with a shorter or different log)
    deletes: every finished remote segment holding an offset past ``agreed``. The
    leader's log is the partition's history now, as in Kafka; the remote records past
    it were never in it and would otherwise be served, or overlapped by its own copies,
    as if they were. A segment that straddles ``agreed`` goes only when the local log
    still holds its start (the leader copies that range again); otherwise deleting it
    would lose records both logs agree on, so it stays and nothing more is copied
    (``blocked``): the partition keeps its new records on local disk instead.

    ``delete`` is newest first (by start offset, then end): each DELETE_STARTED that
    commits takes the remote log's top segment, so every state the deletion stops in
    (a store that fails or hangs, a crash) leaves the remote log contiguous. Oldest
    first would open a hole below segments that stay, and what local retention may
    delete is bounded by the remote log's contiguous run."""
    delete: list[RemoteSegment] = []
    blocked = None
    for seg in remote:
        if seg.end_offset <= agreed:
            continue
        if seg.start_offset > agreed or local_log_start <= seg.start_offset:
            delete.append(seg)
        else:
            blocked = seg
    delete.sort(key=lambda s: (s.start_offset, s.end_offset), reverse=True)
    return Divergence(delete, blocked)


def is_bucket_sweeper(unfenced_broker_ids: Sequence[int], broker_id: int) -> bool:
    """Whether this broker sweeps the bucket for deleted topics' prefixes: the lowest-id
    unfenced broker of its image, so that normally exactly one does. Two that disagree
    for a moment (one image behind) do no harm: deleting a prefix is idempotent."""
    return bool(unfenced_broker_ids) and min(unfenced_broker_ids) == broker_id


class OrphanedTopic(NamedTuple):
    prefix: str  # {topic}-{topic_id}/
    topic_id: str
    keys: list[str]


def orphaned_topic_prefixes(
    objects: Iterable[ObjectInfo], live_topic_ids: Container[str], now_ms: int, min_age_ms: int
) -> list[OrphanedTopic]:
    """Topic prefixes of the bucket whose topic id the image does not hold (the topic
    was deleted while every broker that held it was away), each with its keys, when
    every one of its objects is at least ``min_age_ms`` old. The age keeps a topic
    created a moment ago, which this broker's image may not show yet, from ever being
    touched: its objects are younger than the topic. Keys outside the layout are never
    touched (a bucket or prefix shared with others)."""
    found: dict[str, OrphanedTopic] = {}
    young: set[str] = set()
    for obj in objects:
        parsed = parse_topic_of_key(obj.key)
        if parsed is None or parsed[1] in live_topic_ids:
            continue
        prefix, topic_id = parsed
        found.setdefault(prefix, OrphanedTopic(prefix, topic_id, [])).keys.append(obj.key)
        if now_ms - obj.last_modified_ms < min_age_ms:
            young.add(prefix)
    return sorted((t for t in found.values() if t.prefix not in young), key=lambda t: t.prefix)


class CopyLag(NamedTuple):
    segments: int
    bytes: int


def copy_lag(segments: Sequence[LogSegment], high_watermark: int, remote_end: int) -> CopyLag:
    """What is ready to copy and not remote yet (KIP-958's copy lag)."""
    todo = segments_to_copy(segments, high_watermark, remote_end)
    return CopyLag(len(todo), sum(t.segment.size for t in todo))
