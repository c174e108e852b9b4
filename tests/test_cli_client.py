"""The client CLI commands as real subprocesses against a real local cluster, with
their --json output parsed; expected errors print one line, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import run_cli

pytestmark = pytest.mark.cluster


def rillet(cluster, *args: str, stdin: str | None = None, ok: bool = True):  # noqa: ANN001, ANN201
    return run_cli(cluster.bootstrap, *args, stdin=stdin, ok=ok)


def json_out(proc) -> dict:  # noqa: ANN001
    return json.loads(proc.stdout)


def test_cli_topic_produce_consume_perf(cluster) -> None:  # noqa: ANN001
    created = json_out(
        rillet(
            cluster,
            "topic",
            "create",
            "cli",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--config",
            "retention.ms=600000",
            "--json",
        )
    )
    assert created["created"] == "cli"
    assert "cli" in json_out(rillet(cluster, "topic", "list", "--json"))["topics"]
    (topic,) = json_out(rillet(cluster, "topic", "describe", "cli", "--json"))["topics"]
    assert len(topic["partitions"]) == 3
    assert all(
        len(p["replicas"]) == 3 and p["leader"] in p["replicas"] for p in topic["partitions"]
    )
    # Each leader's log (DescribeLogDirs): nothing tiered, nothing written yet.
    assert all(
        (p["local_log_start_offset"], p["remote_log_start_offset"], p["copy_lag_segments"])
        == (0, -1, 0)
        and p["remote_storage"] is False
        for p in topic["partitions"]
    )
    human = rillet(cluster, "topic", "describe", "cli").stdout
    assert "partitions: 3  RF: 3" in human and "Isr" in human

    lines = "".join(f"k{i % 5}:v{i}\n" for i in range(50))
    sent = json_out(
        rillet(cluster, "produce", "cli", "--key-separator", ":", "--json", stdin=lines)
    )
    assert sent == {"topic": "cli", "records": 50}
    out = rillet(cluster, "consume", "cli", "--from-beginning", "--max-messages", "50", "--json")
    recs = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(int(r["value"][1:]) for r in recs) == list(range(50))
    assert all(r["key"] == f"k{int(r['value'][1:]) % 5}" for r in recs)

    part, offset = recs[0]["partition"], recs[0]["offset"]
    one = rillet(
        cluster,
        "consume",
        "cli",
        "--partition",
        str(part),
        "--offset",
        str(offset),
        "--max-messages",
        "1",
        "--json",
    )
    assert json.loads(one.stdout)["offset"] == offset

    perf = json_out(
        rillet(
            cluster,
            "perf",
            "produce",
            "--topic",
            "cli",
            "--num-records",
            "20000",
            "--record-size",
            "100",
            "--acks",
            "1",
            "--json",
        )
    )
    assert perf["records"] == 20000 and perf["records_per_s"] > 0
    assert perf["finished_at"] - perf["started_at"] == pytest.approx(perf["seconds"], abs=0.002)
    assert perf["latency_ms"]["p50"] <= perf["latency_ms"]["p99"] <= perf["latency_ms"]["max"]
    got = json_out(
        rillet(cluster, "perf", "consume", "--topic", "cli", "--num-records", "20050", "--json")
    )
    assert got["records"] >= 20050 and got["peak_rss_mb"] > 0

    assert json_out(rillet(cluster, "topic", "delete", "cli", "--json")) == {"deleted": "cli"}


def test_cli_expected_errors_are_one_line(cluster) -> None:  # noqa: ANN001
    for args in (
        ["topic", "describe", "missing"],
        ["consume", "missing", "--max-messages", "1"],
        ["produce", "missing"],
        ["topic", "list", "--bootstrap", "127.0.0.1:1"],
    ):
        proc = rillet(cluster, *args, stdin="x\n", ok=False)
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stderr.startswith("error:") and "Traceback" not in proc.stderr, proc.stderr
    # A missing topic stops `spark load` before Spark starts, saying how to create it.
    load = rillet(cluster, "spark", "load", "--topic", "missing", "--records", "10", ok=False)
    assert load.returncode == 1 and "Traceback" not in load.stderr, load.stderr
    assert "'missing' does not exist: add --partitions N" in load.stderr, load.stderr
    assert "Spark" not in load.stderr, load.stderr  # no session was started
    rillet(cluster, "topic", "create", "dup", "--partitions", "1", "--replication-factor", "1")
    dup = rillet(cluster, "topic", "create", "dup", "--partitions", "1", ok=False)
    assert dup.returncode == 1 and "TOPIC_ALREADY_EXISTS" in dup.stderr
    # --if-not-exists (the compose file's init service runs it on every start).
    again = rillet(cluster, "topic", "create", "dup", "--if-not-exists")
    assert again.returncode == 0 and "exists already" in again.stdout, again.stdout
    other = rillet(
        cluster, "topic", "create", "bad", "--partitions", "0", "--if-not-exists", ok=False
    )
    assert other.returncode == 1 and "INVALID_PARTITIONS" in other.stderr, other.stderr


def test_readme_python_example_runs(cluster, tmp_path) -> None:  # noqa: ANN001
    # The README's client example, as a user pastes it into a file, against this cluster.
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    example = readme.split("### From Python", 1)[1].split("```python\n", 1)[1].split("```")[0]
    script = tmp_path / "example.py"
    script.write_text(example.replace("127.0.0.1:9092", cluster.bootstrap))
    rillet(cluster, "topic", "create", "events", "--partitions", "3", "--replication-factor", "3")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    sent, received = proc.stdout.splitlines()
    assert sent.startswith("RecordMetadata(topic='events'")
    _, offset, value = received.split()
    assert offset == "0" and value in ("b'hello'", "b'a'", "b'b'", "b'c'")  # first of a partition
