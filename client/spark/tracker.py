"""The streaming verifier's state: which ``(task, seq)`` it has read, and what was wrong.

Pure Python, no Spark: the streaming verifier (client/spark/streaming.py) feeds it
*runs*, and tests feed it directly. A run is what one micro-batch holds of one task in
one partition between two breaks: records at rising offsets whose sequence numbers
are consecutive (``start .. end``). A healthy load gives one run per task per
micro-batch, so the state stays a handful of integers per task however many records
pass; only anomalies (gaps, copies, reorderings) add runs and intervals.

State per task: the seqs seen so far as sorted disjoint closed intervals (one interval,
``[0, highest]``, while nothing is wrong). Per (partition, task): the highest seq read
there. For each run, in offset order:

- seqs already seen are **duplicates** (each extra copy counts once);
- new seqs below the highest already read in that partition are **reordered** (a
  first copy at a higher offset than a record of the same task with a higher seq, the
  batch verifier's definition);
- new seqs above everything seen leave a **gap** below them until they are filled
  (filled later means reordered; never filled and acknowledged means lost).

Once the load's shape is known (its manifest), ``verdict`` turns the state into the
batch verifier's counts: lost (an acknowledged seq never read), missing but never
acknowledged, phantom (a seq the load never sends).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

MAX_EXAMPLES = 5


def task_records(records: int, tasks: int, task: int) -> int:
    """How many records producer task ``task`` of a load of ``records`` writes."""
    return records // tasks + (1 if task < records % tasks else 0)


class IntervalSet:
    """Sorted, disjoint, closed integer intervals; merges neighbours as they touch."""

    def __init__(self) -> None:
        self.los: list[int] = []
        self.his: list[int] = []

    def __len__(self) -> int:
        return len(self.los)

    def count(self) -> int:
        return sum(h - lo + 1 for lo, h in zip(self.los, self.his, strict=True))

    def highest(self) -> int:
        return self.his[-1] if self.his else -1

    def add(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Add ``[lo, hi]``; return the parts that were not there before."""
        if not self.los or lo > self.his[-1] + 1:  # the common case: past the end
            self.los.append(lo)
            self.his.append(hi)
            return [(lo, hi)]
        if lo == self.his[-1] + 1:  # extends the last interval
            self.his[-1] = hi
            return [(lo, hi)]
        new: list[tuple[int, int]] = []
        i = bisect_left(self.his, lo)  # first interval that ends at or after lo
        cursor = lo
        j = i
        while j < len(self.los) and self.los[j] <= hi:
            if self.los[j] > cursor:
                new.append((cursor, self.los[j] - 1))
            cursor = max(cursor, self.his[j] + 1)
            j += 1
        if cursor <= hi:
            new.append((cursor, hi))
        # Merge [lo, hi] with every interval it overlaps or touches.
        start = i - 1 if i > 0 and self.his[i - 1] + 1 >= lo else i
        end = j
        if end < len(self.los) and self.los[end] == hi + 1:
            end += 1
        merged_lo = min(lo, self.los[start]) if start < end else lo
        merged_hi = max(hi, self.his[end - 1]) if start < end else hi
        self.los[start:end] = [merged_lo]
        self.his[start:end] = [merged_hi]
        return new

    def missing(self, lo: int, hi: int, limit: int = 0) -> tuple[int, list[int]]:
        """How many of ``[lo, hi)`` are absent, and the first ``limit`` of them."""
        if hi <= lo:
            return 0, []
        absent = 0
        examples: list[int] = []
        cursor = lo
        for a, b in zip(self.los, self.his, strict=True):
            if b < cursor:
                continue
            if a >= hi:
                break
            if a > cursor:
                absent += a - cursor
                examples.extend(range(cursor, min(a, cursor + limit - len(examples))))
            cursor = max(cursor, b + 1)
            if cursor >= hi:
                break
        if cursor < hi:
            absent += hi - cursor
            examples.extend(range(cursor, min(hi, cursor + limit - len(examples))))
        return absent, examples[:limit]

    def first_from(self, lo: int) -> int | None:
        """The lowest seen value ``>= lo``, None when there is none."""
        i = bisect_left(self.his, lo)
        return max(lo, self.los[i]) if i < len(self.los) else None

    def present(self, lo: int, hi: int | None = None) -> int:
        """How many seen values are ``>= lo`` (and ``< hi`` when given)."""
        n = 0
        for a, b in zip(self.los, self.his, strict=True):
            top = b if hi is None else min(b, hi - 1)
            if top >= max(a, lo):
                n += top - max(a, lo) + 1
        return n


@dataclass
class Verdict:
    """The batch verifier's counts (``VerifyReport``'s fields) for a streamed read."""

    expected: int
    acknowledged: int
    read: int
    lost: int
    unacknowledged_missing: int
    duplicates: int
    reordered: int
    corrupt: int
    phantom: int
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


class SeqTracker:
    """See the module docstring; ``add_run`` in offset order within each partition."""

    def __init__(self) -> None:
        self.seen: dict[int, IntervalSet] = {}
        self.top: dict[tuple[int, int], int] = {}  # (partition, task) -> highest seq read
        self.read = 0  # records of the load read, corrupt ones included
        self.duplicates = 0
        self.reordered = 0
        self.corrupt = 0
        self.examples: dict[str, list[dict[str, Any]]] = {}

    def _example(self, kind: str, ex: dict[str, Any]) -> None:
        kept = self.examples.setdefault(kind, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append(ex)

    def add_corrupt(self, count: int, examples: list[tuple[int, int]]) -> None:
        """``count`` corrupt records, a few of them as (partition, offset)."""
        self.read += count
        self.corrupt += count
        for partition, offset in examples:
            self._example("corrupt", {"partition": partition, "offset": offset})

    def add_run(self, partition: int, task: int, start: int, end: int, offset: int) -> None:
        """Records of ``task`` with seqs ``start..end`` (consecutive), the first at
        ``offset`` of ``partition``."""
        if end < start:
            raise ValueError(f"a run ends ({end}) before it starts ({start})")
        self.read += end - start + 1
        seen = self.seen.setdefault(task, IntervalSet())
        top = self.top.get((partition, task), -1)
        new = seen.add(start, end)
        fresh = sum(b - a + 1 for a, b in new)
        copies = end - start + 1 - fresh
        if copies:
            self.duplicates += copies
            first_copy = start if not new or new[0][0] > start else new[0][1] + 1
            ex = {"task": task, "seq": first_copy, "partition": partition, "offset": offset}
            self._example("duplicate", ex)
        behind = sum(max(0, min(b, top - 1) - a + 1) for a, b in new)
        if behind:
            self.reordered += behind
            ex = {"task": task, "seq": new[0][0], "partition": partition, "offset": offset}
            self._example("reordered", {**ex, "after_seq": top})
        self.top[(partition, task)] = max(top, end)

    # --- live figures ---------------------------------------------------------------

    def gaps(self) -> int:
        """Seqs missing below each task's highest seen: lost, or not arrived yet."""
        return sum(s.highest() + 1 - s.count() for s in self.seen.values())

    def contiguous(self) -> int:
        """Records read without a gap from seq 0, summed over tasks."""
        return sum(s.his[0] + 1 for s in self.seen.values() if s.los and s.los[0] == 0)

    def live(self) -> dict[str, int]:
        return {
            "read": self.read,
            "tasks": len(self.seen),
            "contiguous": self.contiguous(),
            "gaps": self.gaps(),
            "duplicates": self.duplicates,
            "reordered": self.reordered,
            "corrupt": self.corrupt,
        }

    # --- the verdict ----------------------------------------------------------------

    def verdict(self, records: int, tasks: int, acked: dict[int, int] | None) -> Verdict:
        """Counts against a load of ``records`` in ``tasks`` tasks; ``acked`` maps a task
        to how many of its records (from seq 0) were acknowledged, None meaning all."""
        v = Verdict(
            expected=records,
            acknowledged=0,
            read=self.read,
            lost=0,
            unacknowledged_missing=0,
            duplicates=self.duplicates,
            reordered=self.reordered,
            corrupt=self.corrupt,
            phantom=0,
            examples={k: list(e) for k, e in self.examples.items()},
        )
        lost_examples: list[dict[str, Any]] = []
        for t in range(tasks):
            n = task_records(records, tasks, t)
            a = n if acked is None else min(acked.get(t, 0), n)
            v.acknowledged += a
            seen = self.seen.get(t, IntervalSet())
            lost, ex = seen.missing(0, a, MAX_EXAMPLES - len(lost_examples))
            v.lost += lost
            lost_examples.extend({"task": t, "seq": s} for s in ex)
            v.unacknowledged_missing += seen.missing(a, n)[0]
            v.phantom += seen.present(n)
        for t, seen in self.seen.items():
            if t >= tasks:
                v.phantom += seen.count()
        if lost_examples:
            v.examples["lost"] = lost_examples
        phantoms = []
        for t, seen in sorted(self.seen.items()):
            first = seen.first_from(task_records(records, tasks, t) if t < tasks else 0)
            if first is not None:
                phantoms.append({"task": t, "seq": first})
        if phantoms:
            v.examples["phantom"] = phantoms[:MAX_EXAMPLES]
        return v
