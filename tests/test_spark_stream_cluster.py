"""The rillet streaming sink, the streaming load and the streaming verifier against a
real local cluster (three combined nodes shared by the module, topics at RF 3, acks=all).

The module's SparkSession runs ``local[2,3]``: in local mode the master string, not
``spark.task.maxFailures``, sets how often a task may be tried, and a sink task that
dies must be retried here.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_support import NEEDS_JAVA, module_cluster

pytest.importorskip("pyspark", reason="needs the spark extra: pip install 'rillet[spark]'")
pytest.importorskip("pyarrow", reason="needs the spark extra: pip install 'rillet[spark]'")

from helpers import wait_until  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from rillet.client.admin import NewTopic  # noqa: E402
from rillet.client.cli import main as rillet_main  # noqa: E402
from rillet.client.spark import streaming  # noqa: E402
from rillet.client.spark.jobs import (  # noqa: E402
    MANIFEST_HEADER,
    MANIFEST_KEY,
    check_records,
    make_value,
    spark_session,
)
from rillet.client.sync import SyncAdmin, SyncConsumer, SyncProducer  # noqa: E402

pytestmark = [pytest.mark.cluster, NEEDS_JAVA]


@pytest.fixture(scope="module")
def spark() -> Any:
    session = spark_session("local[2,3]", app_name="rillet-stream-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for cluster in module_cluster(tmp_path_factory, "spark-stream"):
        yield cluster.bootstrap


def create_topics(bootstrap: str, **partitions: int) -> None:
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic(t, n, 3) for t, n in partitions.items()])


def start_stream_verify(bootstrap: str, topic: str, into: dict[str, Any]) -> threading.Thread:
    """`rillet spark verify --stream --json` in a thread; its exit code lands in
    ``into["code"]`` (its JSON on the captured stdout)."""

    def verify() -> None:
        into["code"] = rillet_main(
            ["spark", "verify", "--topic", topic, "--stream", "--json", "--interval", "1"]
            + ["--bootstrap", bootstrap, "--timeout", "240"]
        )

    verifier = threading.Thread(target=verify)
    verifier.start()
    return verifier


def read_all(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record up to the high watermark, partition by partition, in offset order."""
    tps = [(topic, p) for p in range(partitions)]
    with SyncAdmin(bootstrap) as admin:
        ends = admin.list_offsets({tp: -1 for tp in tps})  # -1: latest
    want = sum(ends.values())
    got: list[Any] = []
    with SyncConsumer(assignment=tps, bootstrap=bootstrap, from_beginning=True) as c:
        while len(got) < want:
            for recs in c.poll(timeout_ms=2000).values():
                got.extend(recs)
    return sorted(got, key=lambda r: (r.partition, r.offset))


def test_stream_sink_writes_every_micro_batch_where_the_batch_writer_would(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    create_topics(bootstrap, src=2, streamed=3, batched=3)

    def shaped(df: Any) -> Any:
        # A third of the rows name their partition; the rest go by key. Headers pass.
        explicit = F.when(F.col("offset") % 3 == 0, F.col("partition") + 1)
        return df.select("key", "value", "headers", explicit.alias("partition"))

    stream = (
        spark.readStream.format("rillet")
        .option("bootstrap", bootstrap)
        .option("topic", "src")
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        shaped(stream)
        .writeStream.format("rillet")
        .option("bootstrap", bootstrap)
        .option("topic", "streamed")
        .option("reportPath", str(tmp_path / "progress"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    sent = 0
    with SyncProducer(bootstrap=bootstrap, acks="all") as p:
        for _round in range(3):  # three rounds, each its own micro-batch
            for i in range(40):
                n = sent + i
                headers = [["n", str(n).encode()]] if n % 4 == 0 else None
                p.send("src", b"%d" % n, key=b"k%d" % (n % 7), headers=headers, partition=n % 2)
            sent += 40
            p.flush()
            query.processAllAvailable()
    query.stop()
    batches = [json.loads(f.read_text()) for f in sorted((tmp_path / "progress").glob("*"))]
    with_rows = [b for b in batches if sum(t["records"] for t in b["tasks"])]
    assert len(with_rows) >= 3 and all(b["status"] == "committed" for b in batches)
    assert sum(t["records"] for b in batches for t in b["tasks"]) == 120

    src = spark.read.format("rillet").option("bootstrap", bootstrap).option("topic", "src")
    shaped(src.load()).write.format("rillet").mode("append").option("bootstrap", bootstrap).option(
        "topic", "batched"
    ).save()

    def layout(topic: str) -> dict[tuple[int, int], list[tuple]]:
        """Per destination partition and source partition (two Spark tasks write
        concurrently, so only each one's own order is defined): the records in order."""
        out: dict[tuple[int, int], list[tuple]] = {}
        for r in read_all(bootstrap, topic, 3):
            src_partition = int(r.value) % 2
            hs = [tuple(h) for h in r.headers] if r.headers else None
            out.setdefault((r.partition, src_partition), []).append((r.key, r.value, hs))
        return out

    streamed, batched = layout("streamed"), layout("batched")
    assert sum(len(v) for v in streamed.values()) == 120
    assert streamed == batched
    explicit = [r for r in read_all(bootstrap, "streamed", 3) if r.headers]
    assert explicit  # headers made it through the sink


def test_a_sink_task_killed_mid_batch_is_retried_without_losing_rows(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    create_topics(bootstrap, crash=2)
    marker = str(tmp_path / "crashed")

    # Defined here so Spark's pickler ships them by value to the Python workers.
    from rillet.client.spark.source import RilletDataSource, RilletStreamWriter, produce_batches

    class CrashOnceWriter(RilletStreamWriter):
        def write(self, iterator: Any) -> Any:
            import asyncio
            import itertools

            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))  # once per test
                except FileExistsError:
                    return super().write(iterator)
                # Part of the task's rows acknowledged, then the worker dies.
                first = list(itertools.islice(iterator, 2))
                asyncio.run(produce_batches(self.options, iter(first), 0))
                os._exit(1)
            return super().write(iterator)

    class CrashOnceSource(RilletDataSource):
        @classmethod
        def name(cls) -> str:
            return "rillet-crash-once"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:  # noqa: N802
            return CrashOnceWriter(super().streamWriter(schema, overwrite).options)

    spark.dataSource.register(CrashOnceSource)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        frame = streaming.stream_load_frame(spark, 2000, 2, 64, total=6000)
        query = (
            frame.writeStream.format("rillet-crash-once")
            .option("bootstrap", bootstrap)
            .option("topic", "crash")
            .option("reportPath", str(tmp_path / "progress"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        wait_until(
            lambda: streaming.read_commits(tmp_path / "progress").total >= 6000,
            timeout=120,
            message="every row acknowledged",
        )
        query.stop()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert Path(marker).exists()  # the first attempt did die
    df = spark.read.format("rillet").option("bootstrap", bootstrap).option("topic", "crash")
    report = check_records(spark, df.load(), topic="crash", records=6000, tasks=2)
    assert report.lost == 0 and report.corrupt == 0 and report.phantom == 0
    assert report.reordered == 0  # the retry re-sent the same rows in the same order
    # The dead attempt's acknowledged rows were sent again by the retry.
    assert report.duplicates >= 1 and report.read == 6000 + report.duplicates


def test_a_load_stopped_and_restarted_from_its_checkpoint_loses_nothing_while_verified_live(
    spark: Any, bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create_topics(bootstrap, live=2)
    checkpoint = tmp_path / "load-checkpoint"
    verdict: dict[str, Any] = {}
    verifier = start_stream_verify(bootstrap, "live", verdict)
    stop = threading.Event()
    seen: list[dict[str, Any]] = []

    def progress(p: dict[str, Any]) -> None:
        seen.append(p)
        if p["batches"] >= 2:
            stop.set()  # stop the load with batches still to come

    # The same load both times: the second run resumes it from its checkpoint.
    load = functools.partial(
        streaming.run_stream_load,
        spark,
        bootstrap,
        "live",
        rate=3000,
        duration_s=6,
        tasks=2,
        record_size=64,
        checkpoint=str(checkpoint),
        writer_options={"maxInFlightPerPartition": "1"},
    )
    first = load(progress=progress, interval_s=0.5, stop=stop)
    assert first.status == "interrupted" and 0 < first.acknowledged < 18000
    assert seen and seen[-1]["acknowledged"] <= first.acknowledged
    second = load()  # it continues where the first run stopped
    assert second.status == "committed" and second.acknowledged == 18000
    assert second.batches > first.batches  # the commit files carried over
    verifier.join(300)
    assert not verifier.is_alive()
    report = json.loads(capsys.readouterr().out)
    assert verdict["code"] == 0, report
    assert report["lost"] == 0 and report["reordered"] == 0 and report["corrupt"] == 0
    assert report["acknowledged"] == 18000 and report["read"] >= 18000
    assert report["duplicates_allowed"]  # a streamed load is at-least-once

    # The batch verifier agrees, from the two manifests in the topic.
    assert rillet_main(["spark", "verify", "--topic", "live", "--bootstrap", bootstrap]) == 0
    capsys.readouterr()

    # One topic per load: a new load on it is refused, and so is this load's checkpoint
    # for other options; both before any Spark query starts.
    again = ["spark", "load", "--stream", "--topic", "live", "--rate", "3000", "--tasks", "2"]
    again += ["--record-size", "64", "--bootstrap", bootstrap]
    assert rillet_main([*again, "--duration", "6"]) == 1
    assert "already holds records" in capsys.readouterr().err
    assert rillet_main([*again, "--duration", "7", "--checkpoint", str(checkpoint)]) == 1
    assert "the checkpoint belongs to another load" in capsys.readouterr().err


def test_the_stream_verifier_finds_a_gap_a_duplicate_a_reordering_and_corruption(
    spark: Any, bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create_topics(bootstrap, damaged=2)
    result: dict[str, Any] = {}
    # Reading before anything is written, as beside a running load.
    verifier = start_stream_verify(bootstrap, "damaged", result)
    task0 = [s for s in range(50) if s != 10]  # seq 10 lost
    task0.insert(task0.index(20) + 1, 20)  # seq 20 twice
    i = task0.index(30)
    task0[i], task0[i + 1] = task0[i + 1], task0[i]  # 31 before 30
    with SyncProducer(bootstrap=bootstrap, acks="all") as p:
        for s in task0:
            p.send("damaged", make_value(0, s, 64), key=b"0", partition=0)
        p.flush()
        for s in range(50):
            p.send("damaged", make_value(1, s, 64), key=b"1", partition=1)
        bad = bytearray(make_value(1, 50, 64))
        bad[-1] ^= 0xFF
        p.send("damaged", bytes(bad), key=b"1", partition=1)  # corrupt
        p.send("damaged", make_value(7, 0, 64), key=b"7", partition=1)  # phantom task
        manifest = {"records": 100, "tasks": 2, "status": "committed", "per_task": []}
        p.send(
            "damaged",
            json.dumps(manifest).encode(),
            key=MANIFEST_KEY,
            headers=[(MANIFEST_HEADER, b"1")],
        )
        p.flush()
    verifier.join(300)
    assert not verifier.is_alive()
    report = json.loads(capsys.readouterr().out)
    assert result["code"] == 2  # violations: the batch verifier's exit code
    counts = {k: report[k] for k in ("lost", "duplicates", "reordered", "corrupt", "phantom")}
    assert counts == {"lost": 1, "duplicates": 1, "reordered": 1, "corrupt": 1, "phantom": 1}
    assert report["examples"]["lost"] == [{"task": 0, "seq": 10}]
    assert report["examples"]["duplicate"][0]["seq"] == 20
    assert report["examples"]["reordered"][0]["seq"] == 30
    assert not report["duplicates_allowed"]  # a batch-style manifest: copies fail


def test_every_task_stays_in_its_spark_partition_when_the_rate_is_not_a_multiple(
    spark: Any, tmp_path: Path
) -> None:
    # 10 records/s over 3 tasks: batches of 12 rows, so every batch starts at a
    # multiple of 3 and Spark partition p holds exactly task p's rows, in seq order.
    seen: list[tuple[int, int, int, int]] = []

    def collect(df: Any, batch_id: int) -> None:
        pid = F.spark_partition_id().alias("pid")
        key = F.col("key").cast("string").cast("int").alias("task")
        seen.extend(
            (batch_id, r.pid, r.task, r.n)
            for r in df.select(pid, key)
            .groupBy("pid", "task")
            .agg(F.count("*").alias("n"))
            .collect()
        )

    frame = streaming.stream_load_frame(spark, 10, 3, 64, total=40)
    for _ in range(4):  # one micro-batch per run, on the same checkpoint
        q = (
            frame.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(once=True)
            .start()
        )
        q.awaitTermination()
    assert {(pid, task) for _, pid, task, _ in seen} == {(0, 0), (1, 1), (2, 2)}
    assert sum(n for *_, n in seen) == 40  # the first rate x duration rows, no more
    assert len({b for b, *_ in seen}) >= 3


def test_a_stream_verification_stopped_early_gives_no_verdict_on_loss(
    spark: Any, bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create_topics(bootstrap, unfinished=1)
    with SyncProducer(bootstrap=bootstrap, acks="all") as p:
        for s in range(10):  # half of a load that never finishes (no manifest)
            p.send("unfinished", make_value(0, s, 64), key=b"0")
        p.flush()
    code = rillet_main(
        ["spark", "verify", "--topic", "unfinished", "--stream", "--records", "20"]
        + ["--tasks", "1", "--timeout", "5", "--bootstrap", bootstrap]
    )
    out = capsys.readouterr().out
    assert code == 4, out  # inconclusive: records 10-19 may just not be written yet
    assert "INCONCLUSIVE" in out and "no verdict on loss" in out
