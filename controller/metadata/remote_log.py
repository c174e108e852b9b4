"""A partition's remote log as the metadata image records it (read-only views).

The image keeps every tiered segment of a partition by segment id, whatever its state
(COPY_STARTED, COPY_FINISHED, DELETE_STARTED; DELETE_FINISHED removes it). A reader of
the remote log sees only finished copies: a segment exists for the cluster once its
COPY_FINISHED record is committed, and stops existing for readers once its
DELETE_STARTED record is.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    MetadataImage,
    RemoteSegment,
)


@dataclass(frozen=True, slots=True)
class RemoteLogView:
    """The finished remote segments of one partition, by start offset."""

    segments: tuple[RemoteSegment, ...] = ()

    @property
    def log_start_offset(self) -> int:
        """The first offset held remotely, or -1 when nothing is."""
        return self.segments[0].start_offset if self.segments else -1

    @property
    def end_offset(self) -> int:
        """The highest offset safely remote (inclusive), or -1 when nothing is."""
        return max((s.end_offset for s in self.segments), default=-1)

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    def segment_for(self, offset: int) -> RemoteSegment | None:
        """The finished segment holding ``offset``, or None."""
        starts = [s.start_offset for s in self.segments]
        i = bisect_right(starts, offset) - 1
        if i < 0:
            return None
        seg = self.segments[i]
        return seg if seg.start_offset <= offset <= seg.end_offset else None

    def leader_epochs(self) -> list[tuple[int, int]]:
        """(epoch, start offset) entries over every segment, oldest first, one per epoch."""
        out: list[tuple[int, int]] = []
        for seg in self.segments:
            for epoch, start in seg.leader_epochs:
                if not out or epoch > out[-1][0]:
                    out.append((epoch, start))
        return out


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
