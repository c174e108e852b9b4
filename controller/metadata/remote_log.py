"""A partition's remote log as the metadata image records it (read-only views).

The image keeps every tiered segment of a partition by segment id, whatever its state
(COPY_STARTED, COPY_FINISHED, DELETE_STARTED; DELETE_FINISHED removes it). A reader of
the remote log sees only finished copies: a segment exists for the cluster once its
COPY_FINISHED record is committed, and stops existing for readers once its
DELETE_STARTED record is.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    MetadataImage,
    RemoteSegment,
)


@dataclass(frozen=True, slots=True)
class RemoteLogView:
    """The finished remote segments of one partition, by start offset.

    Segments may overlap: replicas roll at different offsets, so a new leader's first
    copy can start below its predecessor's last end (docs/tiered.md, "Overlapping
    segments"). The answers below are precomputed once per view (a view is rebuilt only
    when the partition's segments change), so every lookup is O(log n): the fetch path
    and the remote log manager ask them many times per change."""

    segments: tuple[RemoteSegment, ...] = ()
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # The highest end offset of segments[0..i]: non-decreasing even when a segment lies
    # inside another, so a bisect over it finds the first segment ending at or after an
    # offset.
    _max_ends: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _size_bytes: int = field(init=False, repr=False, compare=False)
    _contiguous_end: int = field(init=False, repr=False, compare=False)
    _epochs: tuple[tuple[int, int], ...] | None = field(
        init=False, default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        starts, max_ends, size, end = [], [], 0, -1
        contiguous = -1  # end before the first hole, once one is met
        for seg in self.segments:  # one pass: views of 100k segments are rebuilt often
            starts.append(seg.start_offset)
            if contiguous < 0 and starts[1:] and seg.start_offset > end + 1:
                contiguous = end
            if seg.end_offset > end:
                end = seg.end_offset
            max_ends.append(end)
            size += seg.size_bytes
        object.__setattr__(self, "_starts", tuple(starts))
        object.__setattr__(self, "_max_ends", tuple(max_ends))
        object.__setattr__(self, "_size_bytes", size)
        object.__setattr__(self, "_contiguous_end", end if contiguous < 0 else contiguous)

    @property
    def log_start_offset(self) -> int:
        """The first offset held remotely, or -1 when nothing is."""
        return self._starts[0] if self._starts else -1

    @property
    def end_offset(self) -> int:
        """The highest offset safely remote (inclusive), or -1 when nothing is."""
        return self._max_ends[-1] if self._max_ends else -1

    @property
    def contiguous_end(self) -> int:
        """The end of the run of finished segments from the remote log start with no
        offset missing between them (inclusive), or -1 when nothing is remote. Only this
        much of the remote log may stand in for local data: past a hole (a segment whose
        DELETE_STARTED committed while later ones stay), offsets exist nowhere remote,
        however high ``end_offset`` is."""
        return self._contiguous_end

    @property
    def size_bytes(self) -> int:
        """The bytes stored remotely: overlapping segments each count whole, as each is
        its own object (the remote log size metric). Retention counts differently
        (broker/remote_plan.py)."""
        return self._size_bytes

    def first_ending_at_or_after(self, offset: int) -> int:
        """The index of the first segment (by start offset) whose end is at or after
        ``offset``; len(segments) when none is."""
        return bisect_left(self._max_ends, offset)

    def segment_for(self, offset: int) -> RemoteSegment | None:
        """A finished segment holding ``offset`` (the one starting lowest), or None."""
        i = self.first_ending_at_or_after(offset)
        if i < len(self.segments) and self._starts[i] <= offset:
            return self.segments[i]
        return None

    def leader_epochs(self) -> list[tuple[int, int]]:
        """(epoch, start offset) entries over every segment, oldest first, one per epoch.
        Computed once per view (a walk over every segment), then copied: there are few
        epochs, but the leader asks at every round and every replica at every change."""
        if self._epochs is None:
            out: list[tuple[int, int]] = []
            for seg in self.segments:
                for epoch, start in seg.leader_epochs:
                    if not out or epoch > out[-1][0]:
                        out.append((epoch, start))
            object.__setattr__(self, "_epochs", tuple(out))
        assert self._epochs is not None
        return list(self._epochs)


EMPTY_REMOTE_LOG = RemoteLogView()


def remote_log_view(image: MetadataImage, topic_id: str, partition: int) -> RemoteLogView:
    segs = image.remote_segments.get((topic_id, partition))
    if not segs:
        return EMPTY_REMOTE_LOG
    finished = sorted(
        (s for s in segs.values() if s.state == SEGMENT_COPY_FINISHED),
        key=lambda s: s.start_offset,
    )
    return RemoteLogView(tuple(finished))
