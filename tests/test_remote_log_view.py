"""A partition's remote log view (controller/metadata/remote_log.py) and the fetch path's
choice of segments (broker/remote_fetch.py ``segments_from``), on remote logs built as
leaders build them: each copy starts at or below the remote end + 1, so after a leader
change (replicas roll at other offsets) a copy may overlap its predecessor's last
segment, or lie around it. The precomputed answers must match plain definitions."""

from __future__ import annotations

import random

from rillet.broker.remote_fetch import SEGMENTS_PER_READ, segments_from
from rillet.controller.metadata.image import SEGMENT_COPY_FINISHED, RemoteSegment
from rillet.controller.metadata.remote_log import RemoteLogView


def _seg(start: int, end: int, size: int, epoch: int = 0) -> RemoteSegment:
    return RemoteSegment(
        "tid", 0, f"s{start}-{end}", start, end, ((epoch, start),), SEGMENT_COPY_FINISHED, size, 0
    )


def _remote_log(rng: random.Random, copies: int) -> list[RemoteSegment]:
    """Copies in the order leaders make them: each ends past the remote end and starts
    at or below the remote end + 1 (below it after a leader change)."""
    out: list[RemoteSegment] = []
    end = -1
    for _ in range(copies):
        overlap = rng.random() < 0.3 and end > 0
        start = rng.randint(max(0, end - 60), end) if overlap else end + 1
        new_end = end + rng.randint(1, 50)
        out.append(_seg(start, new_end, rng.randint(1, 1000), epoch=len(out) // 3))
        end = new_end
    return out


def _view(segments: list[RemoteSegment]) -> RemoteLogView:
    return RemoteLogView(tuple(sorted(segments, key=lambda s: (s.start_offset, s.end_offset))))


def _naive_segments_from(
    view: RemoteLogView, offset: int, local_start: int
) -> tuple[RemoteSegment, ...]:
    out: list[RemoteSegment] = []
    for seg in view.segments:
        if seg.end_offset < offset:
            continue
        if seg.start_offset >= local_start or len(out) == SEGMENTS_PER_READ:
            break
        out.append(seg)
    return tuple(out)


def _naive_leader_epochs(view: RemoteLogView) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for seg in view.segments:
        for epoch, start in seg.leader_epochs:
            if not out or epoch > out[-1][0]:
                out.append((epoch, start))
    return out


def test_the_views_answers_match_their_definitions_with_overlapping_segments() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        segments = _remote_log(rng, rng.randint(1, 40))
        view = _view(segments)
        assert view.log_start_offset == min(s.start_offset for s in segments)
        assert view.end_offset == max(s.end_offset for s in segments)
        assert view.size_bytes == sum(s.size_bytes for s in segments)  # bytes stored
        epochs = view.leader_epochs()
        epochs.append((99, 99))  # a copy: the view's own stays as it was
        assert view.leader_epochs() == _naive_leader_epochs(view)
        for offset in range(view.end_offset + 3):
            holding = [s for s in segments if s.start_offset <= offset <= s.end_offset]
            found = view.segment_for(offset)
            if holding:
                assert found is not None and found in holding, (seed, offset)
            else:
                assert found is None, (seed, offset)
            for local_start in (offset, offset + 1, view.end_offset + 1):
                assert segments_from(view, offset, local_start) == _naive_segments_from(
                    view, offset, local_start
                ), (seed, offset, local_start)


def test_a_copy_around_its_predecessor_still_serves_its_own_tail() -> None:
    # Leader A copied 0..99 and 100..199; leader B, whose segment ran 50..259, copied
    # that whole: sorted by start it comes before A's 100..199.
    view = _view([_seg(0, 99, 1), _seg(100, 199, 1), _seg(50, 259, 1)])
    assert view.segment_for(220) == _seg(50, 259, 1)
    assert view.segment_for(150) in (_seg(50, 259, 1), _seg(100, 199, 1))
    assert segments_from(view, 220, 260) == (_seg(50, 259, 1),)
    assert view.end_offset == 259 and view.segment_for(260) is None
    empty = RemoteLogView()
    assert (empty.log_start_offset, empty.end_offset, empty.size_bytes) == (-1, -1, 0)
    assert empty.segment_for(0) is None and segments_from(empty, 0, 10) == ()


def test_the_contiguous_end_stops_before_the_first_hole_with_overlapping_segments() -> None:
    """Holes cut into remote logs as leaders build them (a segment's DELETE_STARTED
    committed while others stay): the contiguous end is the highest offset up to which
    every offset from the remote log start is held by some finished segment."""
    for seed in range(30):
        rng = random.Random(seed)
        segments = _remote_log(rng, rng.randint(1, 40))
        kept = [s for s in segments if rng.random() > 0.15] or segments[:1]
        view = _view(kept)
        held = set().union(*(range(s.start_offset, s.end_offset + 1) for s in kept))
        naive = view.log_start_offset - 1
        while naive + 1 in held:
            naive += 1
        assert view.contiguous_end == naive, seed
    assert RemoteLogView().contiguous_end == -1
