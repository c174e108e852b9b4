"""Spark jobs on the rillet data source: a producer load test and its verifier.

The load job generates N records in K Spark tasks. Producer task ``t`` writes sequence
numbers ``0 .. n_t - 1`` (``n_t`` is N/K, the first N mod K tasks one more), all with
key ``str(t)``, so one task's records land in one partition, in order. Each value is::

    b"RLT1" | task uint32 | seq uint64 | crc32(task, seq, payload) uint32 | payload

(big-endian; zlib's CRC-32 over bytes 4-16 and the payload), where the payload is the
25 ASCII bytes ``f"{task:08X}{seq:016X};"`` repeated and cut to ``record_size - 20``
bytes, so every byte of a value follows from ``(task, seq)`` and no payload byte is
zero (a zeroed page cannot pass for data).

Spark runs the K tasks; each builds its own values in its Python worker
(``make_values``: the C codec's ``make_values``, 66 ns a record, with ``make_value`` as
its Python twin) and sends them in chunks with ``send_many`` to its partition. Building
them with Spark SQL in the JVM and handing them to the data source writer as Arrow
batches, as this job first did, cost 3 to 4 CPU seconds per million records (the
expressions, JIT compiling each new plan, garbage collection), more than the brokers
spent storing and replicating them; the streaming load still does so
(``load_values``), since its rows come from Spark's rate source.

The verifier reads the topic back through the data source and, like Jepsen's Kafka
checker, reports: lost writes (an acknowledged record absent), duplicates (one
``(task, seq)`` at two offsets), reorderings (within a partition, a task's first
occurrences must have increasing ``seq`` by offset), corrupt values (bad magic, length,
checksum or payload) and phantoms (a well-formed record that was never sent).

What counts as acknowledged: a task reports (through a Spark accumulator, which keeps
the reports of the tasks that finished even when the job fails) only after its
producer's ``flush()`` saw every send acknowledged, and the load job writes those
reports to a manifest (``--manifest``). If the job committed, all N records were
acknowledged. If it aborted, only the tasks with a report were; records of the
other tasks may or may not be present, and their absence is reported but is not a
violation. Without a manifest the verifier assumes the load job succeeded. A task Spark
starts a second time (a retry, a lost executor, a speculative copy) refuses to run, so
the load never sends a record twice of its own accord: the job fails and its manifest
names the tasks that finished (the session also sets ``spark.task.maxFailures=1`` and
turns speculation off).

The load's shape (records, tasks) decides which ``(task, seq)`` were sent, so the
verifier must know it, not guess it: a wrong task count turns every record of the
missing or extra tasks into "lost" and "phantom". Once its Spark job ends (committed or
not) the load job therefore writes its manifest into the topic itself, as one record
with the header ``rillet.load.manifest`` (``write_topic_manifest``). The verifier reads
it along with the data, leaves it out of the checks, and takes records, tasks and the
acknowledged tasks from it. Without one (a load that died before writing it, a topic
written by something else) it refuses (``LoadShapeError``) unless told ``--records``
and ``--tasks``; values that contradict the manifest are refused too.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rillet.client.partitioner import partition_for_key
from rillet.client.producer import Producer
from rillet.client.spark.source import (
    SourceOptions,
    WriteReport,
    check_topic,
    register,
    run_with_client,
    task_attempt,
)
from rillet.client.spark.tracker import task_records

try:
    from rillet.client._recordcodec import make_values as _native_make_values
except ImportError:  # built without a C compiler: the Python twin runs
    _native_make_values = None

try:
    from pyspark import AccumulatorParam
    from pyspark.sql import Column, DataFrame, SparkSession, Window
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
except ImportError as e:  # pragma: no cover - spark_source raised already
    raise ImportError("pip install 'rillet[spark]'") from e

log = logging.getLogger(__name__)

MAGIC = b"RLT1"
HEADER_BYTES = 20
# The load job's manifest in the topic: one record with this header (and this key).
MANIFEST_HEADER = "rillet.load.manifest"
MANIFEST_KEY = b"rillet-load-manifest"
MAX_EXAMPLES = 5
MB = 1024 * 1024  # as `rillet perf` and Kafka's perf tools count it

# --- the record format (pure Python: tests and the manual checks use it) -----------


def payload_for(task: int, seq: int, size: int) -> bytes:
    pattern = f"{task:08X}{seq:016X};".encode()
    n = size - HEADER_BYTES
    return (pattern * (n // len(pattern) + 1))[:n]


def make_value(task: int, seq: int, size: int) -> bytes:
    """The value load task ``task`` sends as record ``seq`` (``size`` bytes >= 20)."""
    if size < HEADER_BYTES:
        raise ValueError(f"record size must be at least {HEADER_BYTES} bytes")
    payload = payload_for(task, seq, size)
    ids = task.to_bytes(4, "big") + seq.to_bytes(8, "big")
    return MAGIC + ids + zlib.crc32(ids + payload).to_bytes(4, "big") + payload


def make_values(task: int, first_seq: int, count: int, size: int) -> list[bytes]:
    """``make_value(task, seq, size)`` for ``count`` seqs from ``first_seq``: in C when the
    codec was built (the load task's hot loop), else in Python."""
    if _native_make_values is not None:
        return _native_make_values(task, first_seq, count, size)
    if not 0 <= task < 2**32 or not 0 <= first_seq < 2**64 or first_seq + count > 2**64:
        raise OverflowError("task must fit 32 bits and seqs 64")
    if count < 0 or size < HEADER_BYTES:
        raise ValueError(f"need count >= 0 and size >= {HEADER_BYTES}")
    return [make_value(task, seq, size) for seq in range(first_seq, first_seq + count)]


def parse_value(value: bytes | None) -> tuple[int, int] | None:
    """``(task, seq)`` of a well-formed load value, None for anything corrupt."""
    if value is None or len(value) < HEADER_BYTES or value[:4] != MAGIC:
        return None
    task = int.from_bytes(value[4:8], "big")
    seq = int.from_bytes(value[8:16], "big")
    payload = value[HEADER_BYTES:]
    if int.from_bytes(value[16:20], "big") != zlib.crc32(value[4:16] + payload):
        return None
    if payload != payload_for(task, seq, len(value)):
        return None
    return task, seq


# --- the Spark session ---------------------------------------------------------------


def spark_session(
    master: str = "local[*]", conf: dict[str, str] | None = None, app_name: str = "rillet"
) -> SparkSession:
    """A SparkSession with the rillet source registered and Spark's logs at WARN.

    Workers run this interpreter in local mode, so they import the same rillet; on a
    real cluster rillet must be installed on the executors (docs/spark.md).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",  # the verifier's groupings are small
        "spark.task.maxFailures": "1",  # a retried write task would duplicate records
        "spark.speculation": "false",  # ... and so would a speculative copy
    }
    if not os.environ.get("SPARK_CONF_DIR"):  # the user's own log4j2.properties wins
        defaults["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_log4j2()}"
    for key, value in {**defaults, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""


def _log4j2() -> Path:
    """Spark's JVM logging at WARN from its first line (setLogLevel acts only after the
    JVM has printed its start-up banner), minus the native-library notice."""
    path = Path(tempfile.gettempdir()) / f"rillet-spark-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(LOG4J2)
        tmp.replace(path)  # atomic: a JVM starting beside us never reads half a file
    return path


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` from ``--conf`` into a dict (ValueError names a bad one)."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf takes key=value, not {pair!r}")
        out[key.strip()] = value
    return out


# --- load ----------------------------------------------------------------------------


def _task_count(records: int, tasks: int) -> Column:
    return F.lit(records // tasks) + F.when(F.col("task") < records % tasks, 1).otherwise(0)


LOAD_CHUNK = 10_000  # records per send_many call of a load task, at most
LOAD_CHUNK_BYTES = 8 << 20  # ... and at most this many bytes of values, whatever the size
# A load task writes one partition, so each produce request carries one batch of it; at
# the producer's 64 KiB the brokers' cost per request held a task near 400k records/s,
# at 256 KiB it sends 580k (benchmarks/spark_bench.py). ``writer_options`` may override.
LOAD_BATCH_BYTES = 256 * 1024


async def produce_load(o: SourceOptions, task: int, count: int, size: int) -> WriteReport:
    """Load task ``task``: seqs ``0 .. count - 1`` with key ``str(task)``, to the key's
    partition, in order; flush, and report. Any failed send raises (fails the task).
    Only this task's partition needs a leader: the others' may be down."""
    started = time.time()
    report = WriteReport(task, 0, 0, started, started)
    key = str(task).encode()
    async with Producer(o.bootstrap, acks=o.acks, **o.producer) as producer:
        partition = partition_for_key(key, await producer.partitions_for(o.topic))
        chunk = max(1, min(LOAD_CHUNK, LOAD_CHUNK_BYTES // size))
        for first in range(0, count, chunk):
            n = min(chunk, count - first)
            values = make_values(task, first, n, size)
            await producer.send_many(o.topic, values, [key] * n, partition=partition)
            report.records += n
            report.bytes += n * size
        await producer.flush()  # raises DeliveryError unless every record was acked
    report.partitions[partition] = count
    report.finished_at = time.time()
    return report


class _Reports(AccumulatorParam):
    """The load tasks' reports, as a list: Spark merges a task's update when the task
    succeeds, even if the job then fails, which is what an aborted load's manifest needs."""

    def zero(self, value: list) -> list:
        return []

    def addInPlace(self, a: list, b: list) -> list:  # noqa: N802 - Spark's method name
        a.extend(b)
        return a


def _load_task(
    o: SourceOptions, records: int, tasks: int, size: int, reports: Any, rows: Any
) -> None:
    """One Spark task of the load: its row is its task index. A task Spark runs again
    (a failed attempt retried, a lost executor, speculation) would send its records a
    second time, and verify would report the load's own duplicates as the log's; so a
    second attempt refuses, failing the job, whose manifest then names the tasks that
    finished."""
    (task,) = list(rows)  # parallelize(range(tasks), tasks): partition t holds t
    attempt = task_attempt()
    if attempt > 0:
        raise RuntimeError(
            f"load task {task} was started again (attempt {attempt}); it refuses, since "
            f"sending its records twice would show as duplicates"
        )
    report = asyncio.run(produce_load(o, task, task_records(records, tasks, task), size))
    reports.add([asdict(report)])


def load_values(rows: DataFrame, record_size: int) -> DataFrame:
    """(task, seq) rows -> the (key, value) records the load sends, in the same order.
    Shared by the batch load and the streaming one (client/spark/streaming.py)."""
    ids = F.concat(F.lpad(F.hex(F.col("task")), 8, "0"), F.lpad(F.hex(F.col("seq")), 16, "0"))
    crc_of = F.crc32(F.concat(F.unhex(F.col("ids")), F.col("payload")))
    crc = F.unhex(F.lpad(F.hex(crc_of), 8, "0"))
    # Binary rpad repeats the pattern in one call: half the cost of string repeat/substr.
    return (
        rows.select("task", ids.alias("ids"))
        .withColumn("payload", _payload(F.col("ids"), F.lit(record_size - HEADER_BYTES)))
        .select(
            F.encode(F.col("task").cast("string"), "UTF-8").alias("key"),
            F.concat(F.lit(MAGIC), F.unhex(F.col("ids")), crc, F.col("payload")).alias("value"),
        )
    )


def _payload(ids_hex: Column, size: Column) -> Column:
    """``payload_for`` in Spark SQL, from the 24 hex digits of (task, seq)."""
    return F.rpad(F.lit(b""), size, F.encode(F.concat(ids_hex, F.lit(";")), "UTF-8"))


@dataclass
class LoadResult:
    topic: str
    records: int
    tasks: int
    record_size: int
    acks: str
    status: str
    elapsed_s: float  # the whole Spark job, scheduling included
    produce_s: float  # first task start to last task's final ack
    per_task: list[dict[str, Any]] = field(default_factory=list)

    @property
    def records_per_s(self) -> float:
        return self.records / self.produce_s if self.produce_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.records * self.record_size / MB / self.produce_s if self.produce_s else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["records_per_s"] = round(self.records_per_s, 1)
        out["mb_per_s"] = round(self.mb_per_s, 3)
        out["job_records_per_s"] = round(self.records / self.elapsed_s, 1)
        return out


def run_load(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    records: int,
    tasks: int,
    record_size: int,
    *,
    acks: str = "all",
    manifest: str | None = None,
    writer_options: dict[str, str] | None = None,
) -> LoadResult:
    """Produce the generated records, ``tasks`` Spark tasks each building and sending its
    own; raise if any task failed (after writing the manifest, which then says which
    tasks were acknowledged). ``writer_options`` are the data source writer's producer
    options (e.g. ``maxInFlightPerPartition``)."""
    if tasks <= 0 or records < tasks:
        raise ValueError("need tasks >= 1 and records >= tasks")
    if record_size < HEADER_BYTES:
        raise ValueError(f"record size must be at least {HEADER_BYTES} bytes")
    options = {"batchSize": str(LOAD_BATCH_BYTES), **(writer_options or {})}
    o = SourceOptions.parse({**options, "bootstrap": bootstrap, "topic": topic, "acks": acks})
    run_with_client(o.bootstrap, lambda m: check_topic(m, o.topic))  # fail fast
    sc = spark.sparkContext
    reports = sc.accumulator([], _Reports())
    task = functools.partial(_load_task, o, records, tasks, record_size, reports)
    started = time.time()
    error: Exception | None = None
    try:
        sc.parallelize(range(tasks), tasks).foreachPartition(task)
    except Exception as e:  # Spark wraps the task's error; report it after the manifest
        error = e
    elapsed = time.time() - started
    done = sorted(m["task"] for m in reports.value)
    committed = error is None and done == list(range(tasks))
    report = {"status": "committed" if committed else "aborted", "tasks": reports.value}
    if not committed:
        log.error(
            "rillet spark load to %s aborted: %d of %d tasks had every record acknowledged",
            topic,
            len(done),
            tasks,
        )
    result = _load_result(topic, records, tasks, record_size, acks, elapsed, report)
    if manifest:
        Path(manifest).write_text(json.dumps(result.to_json(), indent=2))
    write_topic_manifest(bootstrap, topic, result.to_json(), failed=not committed)
    if error is not None:
        raise error
    if not committed:
        raise RuntimeError(f"load tasks {sorted(set(range(tasks)) - set(done))} did not report")
    return result


def write_topic_manifest(
    bootstrap: str, topic: str, manifest: dict[str, Any], failed: bool
) -> None:
    """A load's manifest (its result as JSON) as a record of the topic, where verify
    finds it by default. After a failed job this is best effort (the job's own error
    is the one to report); after a committed one a manifest that cannot be written is
    an error, since verify would then refuse the topic."""
    from rillet.client.sync import SyncProducer

    value = json.dumps(manifest, separators=(",", ":")).encode()
    # Best effort after a failure: seconds (10 s for metadata, 10 s for delivery), not
    # the producer's minutes, when the manifest's partition has no leader (the failure
    # may be that very outage).
    limits = {"max_block_ms": 10_000, "delivery_timeout_ms": 10_000} if failed else {}
    try:
        with SyncProducer(bootstrap=bootstrap, acks="all", **limits) as producer:
            producer.send(topic, value, key=MANIFEST_KEY, headers=[(MANIFEST_HEADER, b"1")])
    except Exception as e:
        if failed:
            return
        raise LoadManifestError(
            f"every record was acknowledged, but the load manifest could not be written to "
            f"{topic!r} ({e}); verify it with --records {manifest['records']} "
            f"--tasks {manifest['tasks']}"
        ) from e


class LoadManifestError(RuntimeError):
    """The load committed but its manifest did not reach the topic."""


def _load_result(
    topic: str,
    records: int,
    tasks: int,
    record_size: int,
    acks: str,
    elapsed: float,
    report: dict[str, Any],
) -> LoadResult:
    per_task = []
    for m in sorted(report["tasks"], key=lambda m: m["task"]):
        secs = max(m["finished_at"] - m["started_at"], 1e-9)
        per_task.append(
            {
                "task": m["task"],
                "records": m["records"],
                "bytes": m["bytes"],
                "seconds": round(secs, 3),
                "records_per_s": round(m["records"] / secs, 1),
                "mb_per_s": round(m["bytes"] / MB / secs, 3),
            }
        )
    ms = report["tasks"]
    span = (max(m["finished_at"] for m in ms) - min(m["started_at"] for m in ms)) if ms else 0.0
    return LoadResult(
        topic,
        records,
        tasks,
        record_size,
        acks,
        report["status"],
        elapsed,
        span or elapsed,
        per_task,
    )


# --- verify --------------------------------------------------------------------------


@dataclass
class VerifyReport:
    topic: str
    expected: int  # records the load job sent (acknowledged or not)
    acknowledged: int
    read: int  # records read back from the topic
    lost: int = 0
    unacknowledged_missing: int = 0  # not a violation: never acknowledged
    duplicates: int = 0  # extra copies
    reordered: int = 0
    corrupt: int = 0
    phantom: int = 0
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    duplicates_allowed: bool = False  # the load was at-least-once (a streamed load)
    # False: a streaming verification stopped (timeout, Ctrl-C) before it had surely
    # read every acknowledged record, so loss is not judged (the rest is).
    complete: bool = True

    @property
    def violated(self) -> bool:
        dups = self.duplicates and not self.duplicates_allowed
        return bool(self.lost or dups or self.reordered or self.corrupt or self.phantom)

    @property
    def ok(self) -> bool:
        """A pass: no violation, and (streaming) everything acknowledged was read."""
        return self.complete and not self.violated

    @property
    def verdict(self) -> str:
        return "FAIL" if self.violated else "PASS" if self.complete else "INCONCLUSIVE"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "verdict": self.verdict}


def parse_frame(df: DataFrame) -> DataFrame:
    """(partition, offset, task, seq, valid): ``valid`` when magic, length, checksum and
    payload are all right (task and seq mean nothing otherwise)."""
    v = F.col("value")

    def field_of(pos: int, size: int) -> Column:
        return F.expr(f"try_cast(conv(hex(substring(value, {pos}, {size})), 16, 10) as bigint)")

    parsed = df.select(
        "partition",
        "offset",
        "value",
        "headers",
        field_of(5, 4).alias("task"),
        field_of(9, 8).alias("seq"),
        field_of(17, 4).alias("crc"),
    )
    expected = _payload(F.hex(F.substring(v, 5, 12)), F.length(v) - HEADER_BYTES)
    payload = F.expr(f"substring(value, {HEADER_BYTES + 1})")
    valid = (
        v.isNotNull()
        & (F.length(v) >= HEADER_BYTES)
        & (F.hex(F.substring(v, 1, 4)) == MAGIC.hex().upper())
        & (F.crc32(F.concat(F.substring(v, 5, 12), payload)) == F.col("crc"))
        & (payload == expected)
    )
    manifest = F.coalesce(
        F.exists(F.col("headers"), lambda h: h["key"] == MANIFEST_HEADER), F.lit(False)
    )
    # Only small columns leave here: the verifier caches this frame, and values are
    # most of a topic's bytes (a manifest's value is kept: there are one or a few).
    return parsed.select(
        "partition",
        "offset",
        "task",
        "seq",
        F.coalesce(valid, F.lit(False)).alias("valid"),
        manifest.alias("manifest"),
        F.when(manifest, v).alias("manifest_value"),
    )


class LoadShapeError(ValueError):
    """The verifier cannot tell the load's records and tasks (or was told values its
    manifest contradicts): it refuses rather than guess."""


@dataclass(frozen=True)
class LoadShape:
    records: int
    tasks: int
    # task -> records acknowledged, counted from seq 0 (a batch load's finished task:
    # all of them; a streamed load's: those of its committed micro-batches); None: all.
    acked: dict[int, int] | None
    source: str  # where the shape came from, for the report
    # A streamed load is at-least-once by design (a re-run micro-batch is sent again):
    # its duplicates are reported, not failed.
    at_least_once: bool = False


def load_shape(
    topic: str,
    manifests: list[dict[str, Any]],
    records: int | None,
    tasks: int | None,
    acked: dict[int, int] | None = None,
) -> LoadShape:
    """The load's shape from the manifests found in the topic and what the caller gave.

    Records and tasks both given: they are used (with ``acked``). Otherwise they
    come from the topic's manifest, and a given one must agree with it; a topic with
    no manifest, or with manifests of loads of different shapes, is refused."""
    if records is not None and tasks is not None and not manifests:
        return LoadShape(records, tasks, acked, "given", at_least_once=False)
    shapes = sorted({(m["records"], m["tasks"]) for m in manifests})
    if not shapes:
        raise LoadShapeError(
            f"topic {topic!r} holds no load manifest (the load job writes one when its "
            "Spark job ends), so verify cannot tell how many records and tasks it sent; "
            "pass --records and --tasks as given to the load, or --manifest"
        )
    if len(shapes) > 1:
        found = ", ".join(f"{r:,} records in {t} tasks" for r, t in shapes)
        raise LoadShapeError(
            f"topic {topic!r} holds manifests of loads of different shapes ({found}); "
            "verify one topic per load"
        )
    ((m_records, m_tasks),) = shapes
    for name, given, found_value in (("records", records, m_records), ("tasks", tasks, m_tasks)):
        if given is not None and given != found_value:
            raise LoadShapeError(
                f"--{name} {given} contradicts the load manifest in topic {topic!r} "
                f"({m_records:,} records in {m_tasks} tasks)"
            )
    found: dict[int, int] | None = {}
    for m in manifests:  # a record acknowledged by any load of this shape was sent
        got = acked_from_manifest(m)
        found = None if found is None or got is None else _merge(found, got, max)
    if acked is not None:  # the caller's file manifest is narrower than the topic's
        found = acked if found is None else _merge(found, acked, min)
    where = "the load manifest in the topic"
    if len(manifests) > 1:
        where = f"{len(manifests)} load manifests in the topic (one per load)"
    streamed = any(m.get("mode") == "stream" for m in manifests)
    return LoadShape(m_records, m_tasks, found, where, at_least_once=streamed)


def _merge(a: dict[int, int], b: dict[int, int], pick: Any) -> dict[int, int]:
    if pick is min:
        return {t: min(a[t], b[t]) for t in a.keys() & b.keys()}
    return {t: max(a.get(t, 0), b.get(t, 0)) for t in a.keys() | b.keys()}


def check_records(
    spark: SparkSession,
    df: DataFrame,
    *,
    topic: str,
    records: int | None = None,
    tasks: int | None = None,
    acked: dict[int, int] | None = None,
) -> VerifyReport:
    """The Jepsen-style checks over a read-back frame (partition, offset, value,
    headers); the load's shape as `load_shape` finds it (LoadShapeError if it cannot)."""
    cached = parse_frame(df).persist()
    try:
        found = cached.filter("manifest").select("manifest_value").collect()
        manifests = [_manifest(r.manifest_value) for r in found]
        shape = load_shape(topic, [m for m in manifests if m], records, tasks, acked)
        records, tasks = shape.records, shape.tasks
        acked = acked_counts(records, tasks, shape.acked)
        n_acked = sum(acked.values())
        parsed = cached.filter(~F.col("manifest"))
        report = VerifyReport(topic, records, n_acked, parsed.count())
        report.duplicates_allowed = shape.at_least_once
        report.notes.append(f"{records:,} records in {tasks} tasks, from {shape.source}")
        bad = parsed.filter(~F.col("valid"))
        report.corrupt = _count_into(report, "corrupt", bad.select("partition", "offset"))
        good = parsed.filter("valid")
        in_range = (F.col("task") < tasks) & (F.col("seq") < _task_count(records, tasks))
        phantom = good.filter(~in_range).select("partition", "offset", "task", "seq")
        report.phantom = _count_into(report, "phantom", phantom)
        sent = good.filter(in_range)
        _check_duplicates(report, sent)
        _check_lost(spark, report, sent, records, tasks, acked)
        _check_order(report, sent)
        return report
    finally:
        cached.unpersist()


def _count_into(report: VerifyReport, kind: str, df: DataFrame) -> int:
    rows = df.orderBy(*df.columns[:2]).limit(MAX_EXAMPLES).collect()
    if rows:
        report.examples[kind] = [r.asDict() for r in rows]
        return df.count()
    return 0


def _check_duplicates(report: VerifyReport, sent: DataFrame) -> None:
    copies = (
        sent.groupBy("task", "seq")
        .agg(
            F.count("*").alias("copies"),
            F.sort_array(F.collect_list(F.struct("partition", "offset"))).alias("at"),
        )
        .filter("copies > 1")
    )
    rows = copies.orderBy("task", "seq").limit(MAX_EXAMPLES).collect()
    if rows:
        report.duplicates = int(copies.agg(F.sum(F.col("copies") - 1)).first()[0])
        report.examples["duplicate"] = [
            {
                "task": r.task,
                "seq": r.seq,
                "copies": r.copies,
                "at": [f"{a.partition}@{a.offset}" for a in r.at],
            }
            for r in rows
        ]


def _check_lost(
    spark: SparkSession,
    report: VerifyReport,
    sent: DataFrame,
    records: int,
    tasks: int,
    acked: dict[int, int],
) -> None:
    seeds = spark.range(0, tasks, 1, min(tasks, 64)).withColumnRenamed("id", "task")
    seqs = F.sequence(F.lit(0).cast("bigint"), _task_count(records, tasks).cast("bigint") - 1)
    expected = seeds.select("task", F.explode(seqs).alias("seq"))
    missing = expected.join(sent.select("task", "seq").distinct(), ["task", "seq"], "left_anti")
    acked_df = spark.createDataFrame(sorted(acked.items()), "task long, acked long")
    marked = missing.join(F.broadcast(acked_df), "task", "left")
    is_acked = F.col("seq") < F.coalesce(F.col("acked"), F.lit(0))
    lost = marked.filter(is_acked).select("task", "seq")
    rows = lost.orderBy("task", "seq").limit(MAX_EXAMPLES).collect()
    if rows:
        report.lost = lost.count()
        report.examples["lost"] = [r.asDict() for r in rows]
    if report.acknowledged < records:
        report.unacknowledged_missing = marked.filter(~is_acked).count()


def _check_order(report: VerifyReport, sent: DataFrame) -> None:
    """Within each partition, a task's first copies must have rising seq by offset."""
    first = sent.groupBy("partition", "task", "seq").agg(F.min("offset").alias("offset"))
    w = Window.partitionBy("partition", "task").orderBy("offset")
    with_prev = first.select(
        "partition",
        "task",
        "seq",
        "offset",
        F.max("seq").over(w.rowsBetween(Window.unboundedPreceding, -1)).alias("after_seq"),
    )
    wrong = with_prev.filter(F.col("after_seq") > F.col("seq"))
    rows = wrong.orderBy("partition", "offset").limit(MAX_EXAMPLES).collect()
    if rows:
        report.reordered = wrong.count()
        report.examples["reordered"] = [r.asDict() for r in rows]


def _manifest(value: bytes | None) -> dict[str, Any] | None:
    """A manifest record's JSON, or None when it is not one this version wrote."""
    try:
        m = json.loads(bytes(value or b""))
    except ValueError:
        return None
    if not isinstance(m, dict):
        return None
    records, tasks, per_task = m.get("records"), m.get("tasks"), m.get("per_task", [])
    ok = (
        _is_int(records)
        and _is_int(tasks)
        and 1 <= tasks <= records
        and isinstance(per_task, list)
        and all(
            isinstance(t, dict) and _is_int(t.get("task")) and _is_int(t.get("records"))
            for t in per_task
        )
    )
    return m if ok else None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def run_verify(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    records: int | None = None,
    tasks: int | None = None,
    *,
    acked: dict[int, int] | None = None,
) -> VerifyReport:
    df = spark.read.format("rillet").option("bootstrap", bootstrap).option("topic", topic).load()
    return check_records(spark, df, topic=topic, records=records, tasks=tasks, acked=acked)


def acked_from_manifest(manifest: dict[str, Any]) -> dict[int, int] | None:
    """Task -> records acknowledged from seq 0; None means every record.

    A committed load acknowledged everything. Otherwise each ``per_task`` entry says
    how many records of its task were: a batch load lists only the tasks that
    finished (all their records), a streamed load every task's committed prefix."""
    if manifest.get("status") == "committed":
        return None
    return {int(t["task"]): int(t["records"]) for t in manifest.get("per_task", [])}


def acked_counts(records: int, tasks: int, acked: dict[int, int] | None) -> dict[int, int]:
    """``acked`` made concrete for every task, capped at what the task sends."""
    return {
        t: min(
            task_records(records, tasks, t),
            task_records(records, tasks, t) if acked is None else acked.get(t, 0),
        )
        for t in range(tasks)
    }
