"""The leader-epoch cache: which leader epoch started at which offset (KIP-101/279).

Followers use it to find where their log diverged from the leader's: the leader answers
``end_offset_for(epoch)`` with the largest epoch <= the asked one and the offset where the
next epoch starts (or the log end for its latest epoch). Persisted to
``leader-epoch-checkpoint``; the log writes it at flush time, and recovery re-derives the
entries past the recovery point from the batches themselves.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from pathlib import Path

from rillet.storage import checkpoints, fs
from rillet.storage.invariants import invariant

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


def _epoch_at(entries: Sequence[tuple[int, int]], offset: int) -> int | None:
    starts = [start for _, start in entries]
    i = bisect.bisect_right(starts, offset) - 1
    return entries[i][0] if i >= 0 else None


def agreed_end(
    local: Sequence[tuple[int, int]],
    local_start: int,
    log_end_offset: int,
    other: Sequence[tuple[int, int]],
    other_start: int,
    other_end: int,
) -> int:
    """The highest offset up to which this log agrees with another log (in practice the
    remote log) that holds ``other_start``..``other_end`` (inclusive) with the epoch
    entries ``other``: ``other_end`` unless the two disagree, or this log stops short.

    ``other_end`` must end the other log's contiguous run from ``other_start``: offsets
    it does not hold are not in it, whatever epoch entry comes before them. For the
    remote log that is ``RemoteLogView.contiguous_end``: past a hole (a segment whose
    DELETE_STARTED committed while later ones stay) ``other``'s entry before the hole
    would make its offsets look held in that epoch, and agreement would rise over
    records that exist nowhere remote.

    Two logs hold the same record at an offset when both wrote it in the same leader
    epoch (an epoch has one leader, which writes each offset once). So the first offset
    both hold whose epochs differ is where they diverged (an unclean election); offsets
    only one of them holds, or that an entry list does not cover, count as agreeing,
    so a log whose epochs were rebuilt from its own batches never looks diverged.
    Agreement ends before this log's end when that is below ``other_end``."""
    lo, hi = max(local_start, other_start), min(log_end_offset - 1, other_end)
    points = sorted({lo, *(s for _, s in (*local, *other) if lo < s <= hi)})
    for offset in points if lo <= hi else ():
        mine, theirs = _epoch_at(local, offset), _epoch_at(other, offset)
        if mine is not None and theirs is not None and mine != theirs:
            return offset - 1
    return min(other_end, log_end_offset - 1)


class LeaderEpochCache:
    """Sorted (epoch, start_offset) entries; both columns strictly increase."""

    def __init__(self, path: Path, entries: list[tuple[int, int]] | None = None) -> None:
        self.path = path
        self._epochs: list[int] = []
        self._starts: list[int] = []
        # A plain attribute, not a property: the append path reads it once per batch.
        # Every method that changes _epochs refreshes it.
        self.latest_epoch = UNDEFINED_EPOCH
        self.dirty = False
        for epoch, start in entries or []:
            self.assign(epoch, start)
        self.dirty = False

    @classmethod
    def load(cls, path: Path) -> tuple[LeaderEpochCache, bool]:
        """The cache from its checkpoint, and whether the file was there and sound."""
        entries = checkpoints.read_entries(path, 2)
        cache = cls(path, [(e[0], e[1]) for e in entries or []])
        return cache, entries is not None or not fs.exists(path)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    def _changed(self) -> None:
        self.latest_epoch = self._epochs[-1] if self._epochs else UNDEFINED_EPOCH
        self.dirty = True

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``, as Kafka's assign() does.

        Entries it contradicts (same or later epoch, same or later start) are dropped: a
        new leader's epoch supersedes whatever a diverged tail had recorded.
        """
        if epoch < 0:
            return
        if self._epochs and self._epochs[-1] == epoch and self._starts[-1] <= start_offset:
            return  # already known: the epoch started earlier
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self._changed()
        self._check()

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, start of the next epoch or the log end)."""
        if epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self._epochs[-1]:
            return epoch, log_end_offset
        higher = bisect.bisect_right(self._epochs, epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET  # newer than anything we know
        if higher == 0:
            return epoch, self._starts[0]  # older than anything we know
        return self._epochs[higher - 1], self._starts[higher]

    def ends_at_or_past(self, end_offset: int) -> bool:
        """Whether some epoch starts at or after ``end_offset`` (truncate_from_end would cut)."""
        return bool(self._starts) and self._starts[-1] >= end_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was cut there)."""
        keep = bisect.bisect_left(self._starts, end_offset)
        if keep < len(self._starts):
            del self._epochs[keep:], self._starts[keep:]
            self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop epochs wholly below ``start_offset``; the one spanning it now starts there."""
        floor = bisect.bisect_right(self._starts, start_offset) - 1
        if floor < 0:
            return
        if floor > 0 or self._starts[0] != start_offset:
            del self._epochs[:floor], self._starts[:floor]
            self._starts[0] = start_offset
            self._changed()
        self._check()

    def clear(self) -> None:
        if self._epochs:
            self._epochs.clear()
            self._starts.clear()
            self._changed()

    def snapshot(self) -> list[tuple[int, int]]:
        """Entries to persist; taken on the loop thread, written from an executor."""
        self.dirty = False
        return self.entries()

    def write(self, entries: list[tuple[int, int]], *, fsync: bool = True) -> None:
        checkpoints.write_entries(self.path, list(entries), fsync=fsync)

    def _check(self) -> None:
        for i in range(1, len(self._epochs)):
            invariant(
                self._epochs[i - 1] < self._epochs[i] and self._starts[i - 1] < self._starts[i],
                f"leader epoch cache out of order: {self.entries()}",
            )
