"""The streaming verifier's pure state (client/spark/tracker.py) against brute force.

Hypothesis writes logs of load records with gaps, copies and reorderings, cuts them
into micro-batches and runs the way the Spark side does, and checks that the tracker
counts what the batch verifier's definitions count record by record.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rillet.client.spark.tracker import IntervalSet, SeqTracker, task_records


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 10)), min_size=1, max_size=25))
@settings(max_examples=300, deadline=None)
def test_interval_set_matches_a_set(adds: list[tuple[int, int]]) -> None:
    s, ref = IntervalSet(), set()
    for lo, width in adds:
        new = s.add(lo, lo + width)
        added = {x for a, b in new for x in range(a, b + 1)}
        assert added == set(range(lo, lo + width + 1)) - ref
        ref |= set(range(lo, lo + width + 1))
        assert all(s.his[i] + 1 < s.los[i + 1] for i in range(len(s) - 1))  # merged
        assert s.count() == len(ref) and s.highest() == max(ref)
    for lo in range(0, 75, 7):
        for hi in (lo, lo + 5, lo + 30):
            gone = sorted(set(range(lo, hi)) - ref)
            assert s.missing(lo, hi, 3) == (len(gone), gone[:3])
            assert s.present(lo, hi) == len([x for x in ref if lo <= x < hi])
        above = [x for x in ref if x >= lo]
        assert s.first_from(lo) == (min(above) if above else None)


def runs_of(batch: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int, int]]:
    """(partition, task, start, end, offset) runs of one micro-batch, as the Spark side
    cuts them: per partition and task, by offset, a break where seq != previous + 1."""
    runs: list[list[int]] = []
    last: dict[tuple[int, int], list[int]] = {}
    for p, off, task, seq in sorted(batch, key=lambda r: (r[0], r[1])):
        run = last.get((p, task))
        if run is not None and seq == run[3] + 1:
            run[3] = seq
        else:
            run = [p, task, seq, seq, off]
            runs.append(run)
            last[(p, task)] = run
    return [tuple(r) for r in sorted(runs, key=lambda r: (r[0], r[4]))]  # type: ignore[misc]


def oracle(log: list[tuple[int, int, int, int]], records: int, tasks: int, acked: dict) -> dict:
    """The definitions record by record. They are the batch verifier's, except that the
    batch verifier leaves phantoms out of its duplicate and reordering checks (it knows
    the load's shape up front) and counts every copy of one; the counts can differ only
    when phantoms are present, which fails a verification either way."""
    seen: set[tuple[int, int]] = set()
    duplicates = reordered = 0
    top: dict[tuple[int, int], int] = {}
    for p, _, task, seq in sorted(log, key=lambda r: (r[0], r[1])):
        if (task, seq) in seen:
            duplicates += 1
        elif seq < top.get((p, task), -1):
            reordered += 1
        seen.add((task, seq))
        top[(p, task)] = max(top.get((p, task), -1), seq)
    lost = unacked = phantom = 0
    for t in range(tasks):
        n = task_records(records, tasks, t)
        for s in range(n):
            if (t, s) not in seen:
                lost += s < acked.get(t, 0)
                unacked += s >= acked.get(t, 0)
    phantom = sum(1 for t, s in seen if t >= tasks or s >= task_records(records, tasks, t))
    return {
        "duplicates": duplicates,
        "reordered": reordered,
        "lost": lost,
        "unacknowledged_missing": unacked,
        "phantom": phantom,
    }


@st.composite
def load_logs(draw: Any) -> tuple[list[tuple[int, int, int, int]], int, int, dict, list[int]]:
    """A log of a load's records (each task in its own partition, as keys put them),
    damaged at random, cut into micro-batches; plus the shape and what was acked."""
    tasks = draw(st.integers(1, 3))
    records = draw(st.integers(tasks, 40))
    sent: list[tuple[int, int]] = []
    for t in range(tasks):
        seqs = list(range(task_records(records, tasks, t)))
        for _ in range(draw(st.integers(0, 4))):  # damage: drop, copy, swap, stray
            kind = draw(st.sampled_from(["drop", "copy", "swap", "stray"]))
            if not seqs:
                break
            i = draw(st.integers(0, len(seqs) - 1))
            if kind == "drop":
                seqs.pop(i)
            elif kind == "copy":
                seqs.insert(draw(st.integers(i, len(seqs))), seqs[i])
            elif kind == "swap" and i + 1 < len(seqs):
                seqs[i], seqs[i + 1] = seqs[i + 1], seqs[i]
            elif kind == "stray":
                seqs.append(draw(st.integers(0, 60)))
        sent.extend((t, s) for s in seqs)
    if draw(st.booleans()):
        sent.append((tasks + draw(st.integers(0, 2)), 0))  # a task the load never had
    offsets: dict[int, int] = {}
    log = []
    for t, s in sent:
        p = t % 2
        log.append((p, offsets.get(p, 0), t, s))
        offsets[p] = offsets.get(p, 0) + 1
    acked = {t: draw(st.integers(0, task_records(records, tasks, t))) for t in range(tasks)}
    cuts = sorted(draw(st.lists(st.integers(0, len(log)), max_size=4)))
    return log, records, tasks, acked, cuts


@given(load_logs())
@settings(max_examples=400, deadline=None)
def test_tracker_counts_what_the_batch_definitions_count(case: Any) -> None:
    log, records, tasks, acked, cuts = case
    # Micro-batches cut the log of every partition at the same relative places.
    by_partition: dict[int, list] = {}
    for rec in log:
        by_partition.setdefault(rec[0], []).append(rec)
    batches: list[list] = [[] for _ in range(len(cuts) + 1)]
    for recs in by_partition.values():
        for i, rec in enumerate(recs):
            batches[sum(1 for c in cuts if i * len(log) // max(len(recs), 1) >= c)].append(rec)
    tracker = SeqTracker()
    for batch in batches:
        for p, task, start, end, off in runs_of(batch):
            tracker.add_run(p, task, start, end, off)
    v = tracker.verdict(records, tasks, acked)
    want = oracle(log, records, tasks, acked)
    got = {k: getattr(v, k) for k in want}
    assert got == want
    assert v.read == len(log)
    assert v.acknowledged == sum(acked.values())
    assert tracker.gaps() >= 0 and tracker.contiguous() <= len(log)


def test_a_healthy_stream_keeps_one_interval_per_task() -> None:
    t = SeqTracker()
    for batch in range(1000):
        for task in range(4):
            t.add_run(task % 2, task, batch * 10, batch * 10 + 9, batch * 20)
    assert all(len(s) == 1 for s in t.seen.values())
    assert t.live() == {
        "read": 40_000,
        "tasks": 4,
        "contiguous": 40_000,
        "gaps": 0,
        "duplicates": 0,
        "reordered": 0,
        "corrupt": 0,
    }
    assert t.verdict(40_000, 4, None).lost == 0


def test_examples_name_the_first_anomalies() -> None:
    t = SeqTracker()
    t.add_run(0, 0, 0, 4, 0)
    t.add_run(0, 0, 7, 9, 5)  # 5 and 6 missing: a gap
    t.add_run(0, 0, 3, 3, 8)  # a copy of 3
    t.add_run(0, 0, 5, 5, 9)  # 5 arrives late: reordered
    t.add_corrupt(1, [(0, 10)])
    assert t.live()["gaps"] == 1
    v = t.verdict(12, 1, {0: 10})
    assert (v.lost, v.unacknowledged_missing, v.duplicates, v.reordered, v.corrupt) == (
        1,
        2,
        1,
        1,
        1,
    )
    assert v.examples["lost"] == [{"task": 0, "seq": 6}]
    assert v.examples["duplicate"] == [{"task": 0, "seq": 3, "partition": 0, "offset": 8}]
    assert v.examples["reordered"][0]["seq"] == 5 and v.examples["reordered"][0]["after_seq"] == 9
    assert v.examples["corrupt"] == [{"partition": 0, "offset": 10}]
