"""The rillet Spark data source and jobs against a real local cluster.

One SparkSession serves the whole module (it costs ~6-13 s to start), and so does one
cluster of three combined nodes (broker and controller each); each test has topics of
its own, replicated three ways, written with acks=all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_support import NEEDS_JAVA, module_cluster

pytest.importorskip("pyspark", reason="needs the spark extra: pip install 'rillet[spark]'")
pytest.importorskip("pyarrow", reason="needs the spark extra: pip install 'rillet[spark]'")

from rillet.client.admin import NewTopic  # noqa: E402
from rillet.client.cli import main as rillet_main  # noqa: E402
from rillet.client.partitioner import partition_for_key  # noqa: E402
from rillet.client.spark.jobs import make_value, spark_session  # noqa: E402
from rillet.client.sync import SyncAdmin, SyncConsumer, SyncProducer  # noqa: E402
from rillet.tools.local_cluster import LocalCluster  # noqa: E402

pytestmark = [pytest.mark.cluster, NEEDS_JAVA]


@pytest.fixture(scope="module")
def spark() -> Any:
    session = spark_session("local[2]", app_name="rillet-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from module_cluster(tmp_path_factory, "spark-batch")


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    return cluster.bootstrap


def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int = 3) -> None:
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, replication_factor)])


def read_df(spark: Any, bootstrap: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("rillet").option("bootstrap", bootstrap).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def consume_all(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    got: list[Any] = []
    tps = [(topic, p) for p in range(partitions)]
    with SyncConsumer(assignment=tps, bootstrap=bootstrap, from_beginning=True) as c:
        while len(got) < count:
            for recs in c.poll(timeout_ms=2000).values():
                got.extend(recs)
    return got


def test_read_returns_exactly_what_the_client_wrote(spark: Any, bootstrap: str) -> None:
    create_topic(bootstrap, "events", 2)
    sent = {}
    with SyncProducer(bootstrap=bootstrap, acks="all") as p:
        for i in range(60):
            headers = [["n", str(i).encode()], ["src", b"test"]] if i % 3 == 0 else None
            md = p.send(
                "events",
                b"value-%d" % i,
                key=b"k%d" % (i % 5),
                headers=headers,
                partition=i % 2,
                timestamp=1_700_000_000_000 + i * 1000,
            )
            sent[(md.partition, md.offset)] = (
                md.timestamp,
                b"k%d" % (i % 5),
                b"value-%d" % i,
                headers,
            )
    rows = read_df(spark, bootstrap, "events").collect()
    got = {
        (r.partition, r.offset): (
            int(r.timestamp.timestamp() * 1000),
            bytes(r.key),
            bytes(r.value),
            [[h.key, bytes(h.value)] for h in r.headers] if r.headers else None,
        )
        for r in rows
    }
    assert len(rows) == 60 and got == sent
    assert {r.topic for r in rows} == {"events"}
    assert sent[(0, 0)][0] == 1_700_000_000_000  # the producer's timestamps came through

    # Offset ranges: partition 0 from 5 to 12, partition 1 from 10 to its end (30).
    part = read_df(
        spark,
        bootstrap,
        "events",
        startingOffsets='{"0": 5, "1": 10}',
        endingOffsets='{"events": {"0": 12}}',
        maxRecordsPerPartition="4",
    )
    assert part.rdd.getNumPartitions() == 2 + 5  # 7 records in 2 pieces, 20 in 5
    assert sorted((r.partition, r.offset) for r in part.collect()) == (
        [(0, o) for o in range(5, 12)] + [(1, o) for o in range(10, 30)]
    )
    # Timestamps: record i has timestamp base + i s, and i = 2 * offset + partition.
    by_time = read_df(
        spark,
        bootstrap,
        "events",
        startingTimestamp=str(1_700_000_010_000),
        endingTimestamp=str(1_700_000_020_000),
    )
    assert sorted(bytes(r.value) for r in by_time.collect()) == sorted(
        b"value-%d" % i for i in range(10, 20)
    )


def test_write_is_acknowledged_and_readable_by_the_client(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    create_topic(bootstrap, "out", 3)
    df = spark.createDataFrame(
        [(f"key-{i}".encode(), f"v{i}", i % 3 if i < 30 else None) for i in range(90)],
        "key binary, value string, partition int",
    ).repartition(3)
    report = tmp_path / "report.json"
    (
        df.write.format("rillet")
        .mode("append")
        .option("bootstrap", bootstrap)
        .option("topic", "out")
        .option("reportPath", str(report))
        .save()
    )
    committed = json.loads(report.read_text())
    assert committed["status"] == "committed"
    assert sum(t["records"] for t in committed["tasks"]) == 90

    records = consume_all(bootstrap, "out", 3, 90)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(90))
    for r in records:  # explicit partitions where given, else the key's partition
        i = int(r.value[1:])
        if i < 30:
            assert r.partition == i % 3
        assert r.key == f"key-{i}".encode()


def test_write_to_a_missing_topic_fails_the_job(spark: Any, bootstrap: str) -> None:
    df = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="topic .nope. does not exist"):
        (
            df.write.format("rillet")
            .mode("append")
            .option("bootstrap", bootstrap)
            .option("topic", "nope")
            .option("deliveryTimeoutMs", "3000")
            .save()
        )


def test_write_that_cannot_be_acknowledged_fails_and_aborts(
    spark: Any, cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(controllers=1, brokers=3)
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("strict", 2, 3, {"min.insync.replicas": "3"})])
    cluster.stop_node(3, kill=True)  # now no acks=all write can complete
    df = spark.createDataFrame([(b"v%d" % i,) for i in range(20)], "value binary")
    report = tmp_path / "report.json"
    with pytest.raises(Exception, match="DeliveryError"):
        (
            df.write.format("rillet")
            .mode("append")
            .option("bootstrap", cluster.bootstrap)
            .option("topic", "strict")
            .option("requestTimeoutMs", "1000")
            .option("deliveryTimeoutMs", "3000")
            .option("reportPath", str(report))
            .save()
        )
    aborted = json.loads(report.read_text())
    assert aborted["status"] == "aborted" and aborted["tasks"] == []


def test_stream_picks_up_new_records_and_resumes_after_restart(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    create_topic(bootstrap, "stream", 2)
    seen: list[tuple[int, int, bytes]] = []

    def collect(batch_df: Any, batch_id: int) -> None:
        seen.extend((r.partition, r.offset, bytes(r.value)) for r in batch_df.collect())

    def start(**trigger: Any) -> Any:
        stream = (
            spark.readStream.format("rillet")
            .option("bootstrap", bootstrap)
            .option("topic", "stream")
            .option("startingOffsets", "earliest")
            .load()
        )
        return (
            stream.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(**trigger)
            .start()
        )

    with SyncProducer(bootstrap=bootstrap, acks="all") as p:
        p.send_many("stream", [b"a%d" % i for i in range(40)])
        p.flush()
        query = start(processingTime="200 milliseconds")
        query.processAllAvailable()
        assert len(seen) == 40
        p.send_many("stream", [b"b%d" % i for i in range(20)])  # while the query runs
        p.flush()
        query.processAllAvailable()
        assert len(seen) == 60
        query.stop()
        p.send_many("stream", [b"c%d" % i for i in range(25)])  # while it is down
        p.flush()
    restarted = start(availableNow=True)  # a new query on the same checkpoint
    restarted.awaitTermination()
    values = sorted(v for _, _, v in seen)
    expected = sorted(
        [b"a%d" % i for i in range(40)]
        + [b"b%d" % i for i in range(20)]
        + [b"c%d" % i for i in range(25)]
    )
    assert values == expected  # nothing skipped, nothing repeated
    for part in (0, 1):
        offsets = [o for p_, o, _ in seen if p_ == part]
        assert offsets == list(range(len(offsets)))  # each partition contiguous, in order


def test_spark_load_then_verify_pass(
    spark: Any, bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "manifest.json"
    assert (
        rillet_main(
            [
                "spark",
                "load",
                "--topic",
                "load",
                "--records",
                "5000",
                "--record-size",
                "64",
                "--tasks",
                "3",
                "--partitions",
                "2",
                "--replication-factor",
                "3",
                "--strict-order",
                "--manifest",
                str(manifest),
                "--bootstrap",
                bootstrap,
                "--json",
            ]
        )
        == 0
    )
    load = json.loads(capsys.readouterr().out)
    assert load["status"] == "committed" and load["records"] == 5000
    assert sorted(t["task"] for t in load["per_task"]) == [0, 1, 2]
    assert sum(t["records"] for t in load["per_task"]) == 5000
    assert load["records_per_s"] > 0 and load["mb_per_s"] > 0

    code = rillet_main(
        [
            "spark",
            "verify",
            "--topic",
            "load",
            "--manifest",
            str(manifest),
            "--bootstrap",
            bootstrap,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "read 5,000 records" in out and out.rstrip().endswith("PASS")


# A load in its own driver process: local[3,2] lets Spark start a failed task again.
RETRYING_LOAD = """
import sys
from rillet.client.spark.jobs import run_load, spark_session
spark = spark_session("local[3,2]", app_name="rillet-retried-load")
run_load(spark, sys.argv[1], "half", 3000, 3, 40, manifest=sys.argv[2],
         writer_options={"deliveryTimeoutMs": "8000", "requestTimeoutMs": "1000"})
"""


def test_a_load_task_started_again_refuses_and_the_manifest_names_the_finished_ones(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A load task's report reaches the driver only once all its records were
    acknowledged, and the reports of the tasks that finished survive the job's failure.
    A task Spark starts again (here a retry of a task whose partition has no leader)
    refuses instead of sending its records twice: the manifest then says exactly which
    tasks' records verify must find."""
    tasks, partitions = 3, 3
    create_topic(cluster.bootstrap, "half", partitions, replication_factor=1)
    with SyncAdmin(cluster.bootstrap) as admin:
        (desc,) = admin.describe_topics(["half"])
        leaders = {p.partition: p.leader for p in desc.partitions}
    # Stop the broker leading task 0's partition: its only replica (RF=1).
    down = leaders[partition_for_key(b"0", partitions)]
    alive = [
        t for t in range(tasks) if leaders[partition_for_key(str(t).encode(), partitions)] != down
    ]
    assert alive, leaders  # some task's partition stays up (task 0's does not)
    manifest = tmp_path / "manifest.json"
    cluster.stop_node(down)
    try:
        run = subprocess.run(
            [sys.executable, "-c", RETRYING_LOAD, cluster.bootstrap, str(manifest)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        cluster.start_node(down)
        cluster.wait_ready()
    assert run.returncode != 0
    assert "was started again (attempt 1)" in run.stderr, run.stderr[-3000:]
    result = json.loads(manifest.read_text())
    assert result["status"] == "aborted"
    assert sorted(t["task"] for t in result["per_task"]) == alive
    assert all(t["records"] == 1000 for t in result["per_task"])


def test_verify_catches_lost_duplicated_reordered_corrupt_and_phantom_records(
    bootstrap: str, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    create_topic(bootstrap, "faulty", 1)
    # Task 0 of a 10-record, 1-task load, as written by a broken log: seq 3 lost, seq 5
    # twice, 6 after 7; then a value with a bad byte and one the load never sends.
    order = [0, 1, 2, 4, 5, 5, 7, 6, 8, 9]
    damaged = bytearray(make_value(0, 9, 40))
    damaged[-1] ^= 0xFF
    with SyncProducer(bootstrap=bootstrap, acks="all") as p:
        for seq in order:
            p.send("faulty", make_value(0, seq, 40), key=b"0")
        p.send("faulty", bytes(damaged), key=b"0")
        p.send("faulty", make_value(0, 10, 40), key=b"0")
    code = rillet_main(
        [
            "spark",
            "verify",
            "--topic",
            "faulty",
            "--records",
            "10",
            "--tasks",
            "1",
            "--bootstrap",
            bootstrap,
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 2 and not report["ok"]
    assert (report["lost"], report["duplicates"], report["reordered"]) == (1, 1, 1)
    assert (report["corrupt"], report["phantom"]) == (1, 1)
    ex = report["examples"]
    assert ex["lost"] == [{"task": 0, "seq": 3}]
    assert ex["duplicate"] == [{"task": 0, "seq": 5, "copies": 2, "at": ["0@4", "0@5"]}]
    assert ex["reordered"] == [{"partition": 0, "task": 0, "seq": 6, "offset": 7, "after_seq": 7}]
    assert ex["corrupt"] == [{"partition": 0, "offset": 10}]
    assert ex["phantom"] == [{"partition": 0, "offset": 11, "task": 0, "seq": 10}]

    rillet_main(
        [
            "spark",
            "verify",
            "--topic",
            "faulty",
            "--records",
            "10",
            "--tasks",
            "1",
            "--bootstrap",
            bootstrap,
        ]
    )
    text = capsys.readouterr().out
    for line in (
        "FAIL lost",
        "FAIL duplicates",
        "FAIL reordered",
        "FAIL corrupt",
        "FAIL phantom",
        "task 0 seq 3",
    ):
        assert line in text


def test_verify_learns_the_load_shape_from_the_topic_and_refuses_to_guess(
    spark: Any, bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Verify used to assume 4 tasks unless told: after a 2-task load it reported half
    the records lost and as many phantom. The load job leaves its manifest in the topic;
    without one, verify refuses (exit 3) rather than guess."""
    load = ["spark", "load", "--topic", "two", "--records", "2000", "--record-size", "40"]
    load += ["--tasks", "2", "--partitions", "2", "--bootstrap", bootstrap, "--json"]
    assert rillet_main(load) == 0
    capsys.readouterr()

    def verify(topic: str, *extra: str) -> tuple[int, str, str]:
        args = ["spark", "verify", "--topic", topic, *extra, "--bootstrap", bootstrap]
        code = rillet_main(args)
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = verify("two", "--records", "2000", "--json")  # as the README says
    report = json.loads(out)
    assert code == 0 and report["ok"], report
    assert (report["lost"], report["phantom"], report["read"]) == (0, 0, 2000)
    assert "2,000 records in 2 tasks, from the load manifest in the topic" in report["notes"]

    code, _, err = verify("two", "--tasks", "4")
    assert code == 3 and "--tasks 4 contradicts the load manifest" in err, err

    create_topic(bootstrap, "two-bare", 1)
    with SyncProducer(bootstrap=bootstrap, acks="all") as p:  # a topic no load job wrote
        p.send("two-bare", make_value(0, 0, 40), key=b"0")
    code, _, err = verify("two-bare", "--records", "1")
    assert code == 3 and "holds no load manifest" in err, err
