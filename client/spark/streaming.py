"""Streaming Spark jobs: a load at a steady rate, and a verifier that runs beside it.

**Load** (``run_stream_load``). Spark's ``rate-micro-batch`` source emits ``value = 0,
1, 2, ...``, ``rate`` rows per micro-batch with one micro-batch a second (rounded up to a
multiple of ``tasks``, the interval stretched to match: ``rows_per_batch``), split over
``tasks`` Spark partitions, partition ``p`` holding the values ``v`` with
``v % tasks == p``. Each row becomes the batch load's record for
``task = v % tasks, seq = v // tasks`` (``jobs.load_values``), so task ``t`` sends
``0, 1, 2, ...`` from Spark task ``t`` of every micro-batch, and the first
``rate * duration`` values make exactly the records a batch load of that many records
in that many tasks sends: the batch verifier checks a streamed load too. The rows go to
the ``rillet`` streaming sink; the query ends when every one of them was acknowledged.

What was acknowledged: the sink's ``commit`` writes one file per committed micro-batch
with its tasks' record counts (``reportPath``). Micro-batches commit in order and each
holds, for each task, the seqs that follow the previous one's, so the sum of a task's
counts is how many of its records from seq 0 were acknowledged. A re-run micro-batch
(after a restart from the checkpoint) rewrites its own file: nothing counts twice.
The files live in the checkpoint directory, so a load restarted on its checkpoint
keeps counting where it stopped. When the query ends (done, failed or interrupted) the
load writes its manifest into the topic as the batch load does, with ``"mode":
"stream"`` and each task's acknowledged count.

**Verify** (``run_stream_verify``). A streaming query reads the topic from the start.
Each micro-batch is parsed as the batch verifier does, cut into *runs* (per partition
and task, records whose seqs go up by one) by Spark, and only the runs, the corrupt
records and any manifest reach the driver, where ``tracker.SeqTracker`` keeps what was
read. Once the manifest of a finished load appears, the verifier asks for every
partition's latest offset and stops when it has read that far: every record
acknowledged before the manifest was written is below those offsets. (The manifest of
a streamed load that stopped short on a checkpoint of the user's does not end it: that
load can be resumed.) The verdict has the batch verifier's counts and exit codes; after
a streamed load, duplicates are reported but do not fail it; stopped early (timeout,
Ctrl-C), it judges no loss and is INCONCLUSIVE.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rillet.client.spark.jobs import (
    HEADER_BYTES,
    MAX_EXAMPLES,
    MB,
    VerifyReport,
    _manifest,
    acked_counts,
    load_shape,
    load_values,
    parse_frame,
    write_topic_manifest,
)
from rillet.client.spark.source import (
    EARLIEST,
    LATEST,
    list_offsets,
    run_with_client,
    topic_partitions,
)
from rillet.client.spark.tracker import SeqTracker

try:
    from pyspark.sql import DataFrame, SparkSession, Window
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
except ImportError as e:  # pragma: no cover - source.py raised already
    raise ImportError("pip install 'rillet[spark]'") from e

log = logging.getLogger(__name__)
PROGRESS_DIR = "rillet-progress"  # inside the checkpoint: survives with it
TRIGGER_S = 1.0  # the load's micro-batch interval
Progress = Callable[[dict[str, Any]], None]

# --- load ----------------------------------------------------------------------------


def stream_load_frame(
    spark: SparkSession, rate: int, tasks: int, record_size: int, total: int
) -> DataFrame:
    """The rate source's first ``total`` rows as the load's (key, value) records."""
    if rate <= 0 or tasks <= 0 or total < tasks:
        raise ValueError("need --rate >= 1, --tasks >= 1 and rate x duration >= tasks")
    if record_size < HEADER_BYTES:
        raise ValueError(f"record size must be at least {HEADER_BYTES} bytes")
    # "rate-micro-batch" gives every micro-batch the same number of rows, where "rate"
    # sizes a batch by the time since the last one (the first batch would carry all
    # of Spark's start-up); with a trigger every TRIGGER_S, rate rows a second.
    rows = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch(rate, tasks))
        .option("numPartitions", tasks)
        .load()
        .filter(F.col("value") < total)
    )
    task_seq = rows.select(
        (F.col("value") % tasks).alias("task"), F.expr(f"value div {tasks}").alias("seq")
    )
    return load_values(task_seq, record_size)


def rows_per_batch(rate: int, tasks: int) -> int:
    """``rate * TRIGGER_S`` rounded up to a multiple of ``tasks``. The source hands
    Spark partition ``p`` the rows ``start + p + k * tasks`` of a micro-batch starting
    at row ``start``: only when every batch starts at a multiple of ``tasks`` does
    partition ``p`` hold task ``p``'s rows (and the sink's per-partition counts count
    per task). ``trigger_ms`` stretches the interval to match, keeping the rate."""
    wanted = max(1, round(rate * TRIGGER_S))
    return -(-wanted // tasks) * tasks


def trigger_ms(rate: int, tasks: int) -> int:
    """The micro-batch interval that sends ``rate`` records/s in batches of
    ``rows_per_batch``: TRIGGER_S, or a little more when the batch was rounded up."""
    return max(1, round(1000 * rows_per_batch(rate, tasks) / rate))


@dataclass
class StreamLoadResult:
    topic: str
    records: int  # the load's shape: rate x duration records ...
    tasks: int  # ... in this many tasks
    record_size: int
    acks: str
    rate: int  # records/s asked for
    duration_s: float  # asked for
    status: str  # committed (every record acknowledged), failed or interrupted
    acknowledged: int
    batches: int  # micro-batches committed
    aborted_batches: int
    elapsed_s: float  # the query's life in this run
    produce_s: float  # first micro-batch's start to the last one's commit
    mode: str = "stream"
    per_task: list[dict[str, int]] = field(default_factory=list)  # task, records acked
    error: str | None = None
    resumable: bool = False  # ran on a checkpoint of the user's: can be run again

    @property
    def records_per_s(self) -> float:
        return self.acknowledged / self.produce_s if self.produce_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["records_per_s"] = round(self.records_per_s, 1)
        out["mb_per_s"] = round(self.records_per_s * self.record_size / MB, 3)
        return out


@dataclass
class CommitLog:
    """What the sink's per-batch files say (see the module docstring)."""

    acked: dict[int, int]
    batches: int
    aborted: int
    first_start: float | None
    last_commit: float | None

    @property
    def total(self) -> int:
        return sum(self.acked.values())


class CommitReader:
    """Sums the sink's per-batch files, reading each new file once and keeping running
    totals: within one run of the query a committed batch's file never changes (a
    batch is re-run, rewriting its file, only by a later run, whose reader is a new
    one), so a poll costs a directory listing however long the load has run."""

    def __init__(self, progress_dir: Path) -> None:
        self.dir = progress_dir
        self._seen: set[str] = set()
        self._log = CommitLog({}, 0, 0, None, None)

    def read(self) -> CommitLog:
        try:
            names = [e.name for e in os.scandir(self.dir) if e.name.endswith(".json")]
        except FileNotFoundError:  # the sink makes it when the query starts
            names = []
        for name in sorted(n for n in names if n not in self._seen and n != PLAN_FILE):
            try:
                body = json.loads((self.dir / name).read_text())
            except (OSError, ValueError):  # being replaced this instant: the next poll
                continue
            self._seen.add(name)
            self._add(name, body)
        return dataclasses.replace(self._log, acked=dict(self._log.acked))  # a snapshot

    def _add(self, name: str, body: dict[str, Any]) -> None:
        log = self._log
        if name.startswith("abort-"):
            log.aborted += 1
            return
        log.batches += 1
        for t in body["tasks"]:
            if t["records"]:
                log.acked[t["task"]] = log.acked.get(t["task"], 0) + t["records"]
                start = t["started_at"]
                log.first_start = start if log.first_start is None else min(log.first_start, start)
        at = body["at"]
        log.last_commit = at if log.last_commit is None else max(log.last_commit, at)


def read_commits(progress_dir: Path) -> CommitLog:
    return CommitReader(progress_dir).read()


PLAN_FILE = "load.json"  # the load's parameters, beside its commit files


def check_plan(bootstrap: str, progress_dir: Path, plan: dict[str, Any]) -> bool:
    """Whether this run resumes a load (its checkpoint holds the same plan); a fresh
    load needs an empty topic. Refuses (ValueError) a checkpoint of another load, and
    a fresh load on a topic that already holds records: the verifier could not tell
    two loads' records and manifests apart."""
    topic = plan["topic"]
    plan = {**plan, **run_with_client(bootstrap, lambda m: _identity(m, topic))}
    path = progress_dir / PLAN_FILE
    if path.exists():
        before = json.loads(path.read_text())
        if before != plan:
            diff = {k: (before.get(k), v) for k, v in plan.items() if before.get(k) != v}
            raise ValueError(
                f"the checkpoint belongs to another load ({diff}, as (then, now)): resume "
                "it with the same topic (not re-created) on the same cluster with the same "
                "options, or give a new --checkpoint"
            )
        return True
    if any(progress_dir.glob("batch-*.json")):
        raise ValueError(
            f"the checkpoint {progress_dir.parent} holds committed batches but no load plan "
            "(an older rillet wrote it): it cannot be resumed; give a new --checkpoint"
        )
    earliest = run_with_client(bootstrap, lambda m: list_offsets(m, topic, EARLIEST))
    latest = run_with_client(bootstrap, lambda m: list_offsets(m, topic, LATEST))
    if any(latest[p] > earliest[p] for p in latest):
        raise ValueError(
            f"topic {topic!r} already holds records: a streamed load needs a topic of its "
            "own (to resume a stopped one, give its --checkpoint)"
        )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan))
    tmp.replace(path)
    return False


async def _identity(meta: Any, topic: str) -> dict[str, Any]:
    """The cluster's and the topic's ids: a checkpoint resumes only the load it made,
    not a load of a re-created topic of the same name, nor on another cluster."""
    await topic_partitions(meta, topic)
    snap = meta.snapshot
    return {"cluster_id": snap.cluster_id, "topic_id": snap.topic_ids.get(topic)}


def run_stream_load(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    *,
    rate: int,
    duration_s: float,
    tasks: int,
    record_size: int = 100,
    acks: str = "all",
    checkpoint: str | None = None,
    writer_options: dict[str, str] | None = None,
    progress: Progress | None = None,
    interval_s: float = 5.0,
    stop: threading.Event | None = None,
) -> StreamLoadResult:
    """Stream ``rate * duration_s`` records into ``topic`` and wait for every ack.

    Returns when all were acknowledged, or ``stop`` was set or Ctrl-C pressed (status
    "interrupted"); raises the query's error when it failed. Either way the manifest
    goes into the topic first. ``progress`` gets a dict every ``interval_s`` seconds.
    With ``checkpoint`` the load can be resumed by running it again with the same
    arguments; without, it uses a temporary one, removed at the end."""
    total = int(rate * duration_s)
    plan = {
        "topic": topic,
        "records": total,
        "tasks": tasks,
        "record_size": record_size,
        "rows_per_batch": rows_per_batch(rate, tasks),
    }
    df = stream_load_frame(spark, rate, tasks, record_size, total)
    ckpt = Path(checkpoint or tempfile.mkdtemp(prefix="rillet-stream-load-"))
    try:
        progress_dir = ckpt / PROGRESS_DIR
        progress_dir.mkdir(parents=True, exist_ok=True)
        check_plan(bootstrap, progress_dir, plan)
        return _run_load(
            df, bootstrap, plan, rate, duration_s, acks, ckpt, writer_options,
            progress, interval_s, stop, resumable=checkpoint is not None,
        )  # fmt: skip
    finally:
        if checkpoint is None:
            shutil.rmtree(ckpt, ignore_errors=True)


def _run_load(
    df: DataFrame,
    bootstrap: str,
    plan: dict[str, Any],
    rate: int,
    duration_s: float,
    acks: str,
    ckpt: Path,
    writer_options: dict[str, str] | None,
    progress: Progress | None,
    interval_s: float,
    stop: threading.Event | None,
    *,
    resumable: bool,
) -> StreamLoadResult:
    topic, total, tasks = plan["topic"], plan["records"], plan["tasks"]
    progress_dir = ckpt / PROGRESS_DIR
    reader = CommitReader(progress_dir)
    query = (
        df.writeStream.format("rillet")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("acks", acks)
        .option("reportPath", str(progress_dir))
        .options(**(writer_options or {}))
        .option("checkpointLocation", str(ckpt / "spark"))
        .queryName(f"rillet-load-{topic}")
        .trigger(processingTime=f"{trigger_ms(rate, tasks)} milliseconds")
        .start()
    )
    started = time.time()
    status, error = "interrupted", None
    try:
        status = _watch_load(query, reader, total, started, progress, interval_s, stop)
    except KeyboardInterrupt:  # Ctrl-C: stop, then say what was acknowledged
        status = "interrupted"
    except Exception as e:
        status, error = "failed", e
    finally:
        if query.isActive:
            query.stop()
    result = _stream_result(
        topic, total, tasks, plan["record_size"], acks, rate, duration_s, status,
        reader.read(), started,
    )  # fmt: skip
    result.resumable = resumable
    if error is not None:
        result.error = str(error).strip().splitlines()[0] if str(error).strip() else None
    failed = result.status != "committed"
    write_topic_manifest(bootstrap, topic, result.to_json(), failed=failed)
    if error is not None:
        raise error
    return result


def _watch_load(
    query: Any,
    reader: CommitReader,
    total: int,
    started: float,
    progress: Progress | None,
    interval_s: float,
    stop: threading.Event | None,
) -> str:
    """Poll the commit files until every record was acknowledged; the status."""
    last_total, last_at = 0, started
    next_report = started + interval_s
    while True:
        if query.awaitTermination(0.5):  # ended on its own: failed (raises) or stopped
            err = query.exception()
            if err is not None:
                raise err  # Spark's StreamingQueryException, with the task's error in it
            return "interrupted"
        commits = reader.read()
        now = time.time()
        if commits.total >= total:
            return "committed"
        if stop is not None and stop.is_set():
            return "interrupted"
        if progress is not None and now >= next_report:
            rate_now = (commits.total - last_total) / max(now - last_at, 1e-9)
            progress(
                {
                    "elapsed_s": round(now - started, 1),
                    "acknowledged": commits.total,
                    "records": total,
                    "records_per_s": round(rate_now, 1),
                    "batches": commits.batches,
                    "aborted_batches": commits.aborted,
                }
            )
            last_total, last_at, next_report = commits.total, now, now + interval_s


def _stream_result(
    topic: str,
    total: int,
    tasks: int,
    record_size: int,
    acks: str,
    rate: int,
    duration_s: float,
    status: str,
    commits: CommitLog,
    started: float,
) -> StreamLoadResult:
    acked = acked_counts(total, tasks, commits.acked)
    if commits.acked and any(commits.acked[t] > acked.get(t, 0) for t in commits.acked):
        log.warning("commit files count more records than the load sends: %s", commits.acked)
    span = 0.0
    if commits.first_start is not None and commits.last_commit is not None:
        span = commits.last_commit - commits.first_start
    return StreamLoadResult(
        topic=topic,
        records=total,
        tasks=tasks,
        record_size=record_size,
        acks=acks,
        rate=rate,
        duration_s=duration_s,
        status="committed" if sum(acked.values()) >= total else status,
        acknowledged=sum(acked.values()),
        batches=commits.batches,
        aborted_batches=commits.aborted,
        elapsed_s=round(time.time() - started, 3),
        produce_s=round(span, 3),
        per_task=[{"task": t, "records": n} for t, n in sorted(acked.items())],
    )


# --- verify --------------------------------------------------------------------------


def batch_runs(parsed: DataFrame) -> DataFrame:
    """(partition, task, start, end, offset) per run: per partition and task, rows at
    rising offsets whose seqs go up by one; a healthy micro-batch has one per task."""
    good = parsed.filter("valid and not manifest").select("partition", "task", "seq", "offset")
    w = Window.partitionBy("partition", "task").orderBy("offset")
    breaks = F.coalesce(F.col("seq") != F.lag("seq").over(w) + 1, F.lit(True)).cast("int")
    numbered = good.withColumn("run", F.sum(breaks).over(w))
    return numbered.groupBy("partition", "task", "run").agg(
        F.min("offset").alias("offset"), F.min("seq").alias("start"), F.max("seq").alias("end")
    )


def final(manifest: dict[str, Any]) -> bool:
    """Whether a manifest ends the load: a streamed load that stopped short (failed or
    interrupted) on a checkpoint of the user's can be resumed, so the verifier reads on."""
    if manifest.get("mode") != "stream" or manifest.get("status") == "committed":
        return True
    return not manifest.get("resumable", False)


@dataclass
class StreamVerifyState:
    """The driver's side of a streaming verification: tracker, offsets, manifests."""

    tracker: SeqTracker = field(default_factory=SeqTracker)
    consumed: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    manifests: list[dict[str, Any]] = field(default_factory=list)
    target: dict[int, int] | None = None  # latest offsets once a manifest was read
    batches: int = 0

    def add_batch(self, runs: list[Any], ends: list[Any], corrupt_examples: list[Any]) -> None:
        """``runs`` as ``batch_runs`` makes them; ``ends`` per partition the next offset
        and the corrupt records' count; a few corrupt (partition, offset) examples."""
        for r in sorted(runs, key=lambda r: (r.partition, r.offset)):
            self.tracker.add_run(r.partition, r.task, r.start, r.end, r.offset)
        corrupt = sum(e.corrupt for e in ends)
        if corrupt:
            examples = sorted((c.partition, c.offset) for c in corrupt_examples)
            self.tracker.add_corrupt(corrupt, examples)
        for e in ends:
            self.consumed[e.partition] = max(self.consumed.get(e.partition, 0), e.next)
        self.batches += 1

    @property
    def done(self) -> bool:
        if self.target is None:
            return False
        return all(self.consumed.get(p, 0) >= off for p, off in self.target.items())


def run_stream_verify(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    records: int | None = None,
    tasks: int | None = None,
    *,
    progress: Progress | None = None,
    interval_s: float = 5.0,
    timeout_s: float | None = None,
    stop: threading.Event | None = None,
) -> VerifyReport:
    """Read ``topic`` as it is written until the load's manifest (and everything
    acknowledged before it) was read, then the verdict. Without a manifest by
    ``timeout_s`` (or ``stop``), the verdict needs ``records`` and ``tasks``
    (``LoadShapeError`` otherwise)."""
    state = StreamVerifyState()
    earliest = run_with_client(bootstrap, lambda m: list_offsets(m, topic, EARLIEST))
    state.consumed.update(earliest)
    lock = threading.Lock()

    def on_batch(batch_df: DataFrame, batch_id: int) -> None:
        # Only aggregates and a few examples leave Spark: the driver's memory follows
        # the anomalies, not the records (a topic of foreign data is all "corrupt").
        parsed = parse_frame(batch_df).persist()
        try:
            runs = batch_runs(parsed).collect()
            is_corrupt = (~F.col("valid") & ~F.col("manifest")).cast("long")
            ends = (
                parsed.groupBy("partition")
                .agg((F.max("offset") + 1).alias("next"), F.sum(is_corrupt).alias("corrupt"))
                .collect()
            )
            examples = []
            if any(e.corrupt for e in ends):
                bad = parsed.filter("not valid and not manifest").select("partition", "offset")
                examples = bad.orderBy("partition", "offset").limit(MAX_EXAMPLES).collect()
            found = parsed.filter("manifest").select("manifest_value").collect()
        finally:
            parsed.unpersist()
        manifests = [m for m in (_manifest(r.manifest_value) for r in found) if m]
        target = None
        if any(final(m) for m in manifests) and state.target is None:
            target = run_with_client(bootstrap, lambda m: list_offsets(m, topic, LATEST))
        with lock:
            state.add_batch(runs, ends, examples)
            state.manifests.extend(manifests)
            if target is not None:
                state.target = target

    stream = (
        spark.readStream.format("rillet")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    ckpt = tempfile.mkdtemp(prefix="rillet-stream-verify-")  # a rerun reads from the start
    query = None
    try:
        query = (
            stream.writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", ckpt)
            .queryName(f"rillet-verify-{topic}")
            .start()
        )
        _watch_verify(query, state, lock, time.time(), progress, interval_s, timeout_s, stop)
    except KeyboardInterrupt:  # Ctrl-C: the counts so far, without a verdict on loss
        pass
    finally:
        if query is not None and query.isActive:
            query.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    return stream_verdict(topic, state, records, tasks)


def _watch_verify(
    query: Any,
    state: StreamVerifyState,
    lock: threading.Lock,
    started: float,
    progress: Progress | None,
    interval_s: float,
    timeout_s: float | None,
    stop: threading.Event | None,
) -> None:
    next_report = started + interval_s
    while True:
        if query.awaitTermination(0.2):
            err = query.exception()
            if err is not None:
                raise err
            break  # stopped from outside: the verdict on what was read
        with lock:
            if state.done:
                break
            live = {**state.tracker.live(), "batches": state.batches}
        now = time.time()
        if stop is not None and stop.is_set():
            break
        if timeout_s is not None and now - started > timeout_s:
            break
        if progress is not None and now >= next_report:
            progress({"elapsed_s": round(now - started, 1), **live})
            next_report = now + interval_s


def stream_verdict(
    topic: str, state: StreamVerifyState, records: int | None, tasks: int | None
) -> VerifyReport:
    """The batch verifier's report from what the streaming one read."""
    shape = load_shape(topic, state.manifests, records, tasks)
    acked = acked_counts(shape.records, shape.tasks, shape.acked)
    v = state.tracker.verdict(shape.records, shape.tasks, acked)
    # Verdict's fields are VerifyReport's own, by name.
    report = VerifyReport(topic, **asdict(v), duplicates_allowed=shape.at_least_once)
    report.notes.append(f"{shape.records:,} records in {shape.tasks} tasks, from {shape.source}")
    report.notes.append(f"read as a stream in {state.batches} micro-batches")
    if not state.done:
        # Stopped (timeout, Ctrl-C) before everything acknowledged was surely read: an
        # acknowledged record not read yet is not lost. The other counts stand.
        report.complete = False
        if report.lost:
            report.notes.append(
                f"{report.lost:,} acknowledged records not read (yet): no verdict on loss"
            )
            report.lost = 0
            report.examples.pop("lost", None)
        report.notes.append(
            "stopped before a finished load's manifest, and everything before it, was read"
        )
    return report
