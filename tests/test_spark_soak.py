"""`make spark-soak`: a streaming Spark load against 3 controllers + 3 brokers while
brokers are killed (-9) and stopped (SIGTERM) and restarted, checked live by a
streaming verifier; then both verdicts. Not part of `make test` (marked slow).

It runs the CLI as a user would, in two processes (two Spark drivers):
``rillet spark verify --stream`` first, then ``rillet spark load --stream``. A seeded
schedule takes one broker down at a time and brings it back, waiting for every
partition's ISR to be whole again before the next fault, so acks=all writes at
``min.insync.replicas=2`` always have somewhere to go: a delivery failure, a lost
acknowledged record or a reordering is a bug. Duplicates pass (the streamed load is
at-least-once) and are reported.

RILLET_SPARK_SOAK_SECONDS (default 180), _RATE (records/s, default 20000), _TASKS
(default 4) and _SEED (default 1) set the run; the figures are printed as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until

from rillet.client.admin import NewTopic
from rillet.client.sync import SyncAdmin

pytest.importorskip("pyspark", reason="needs the spark extra: pip install 'rillet[spark]'")

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SECONDS = float(os.environ.get("RILLET_SPARK_SOAK_SECONDS", "180"))
RATE = int(os.environ.get("RILLET_SPARK_SOAK_RATE", "20000"))
TASKS = int(os.environ.get("RILLET_SPARK_SOAK_TASKS", "4"))
SEED = int(os.environ.get("RILLET_SPARK_SOAK_SEED", "1"))
TOPIC = "soak"
PARTITIONS = 8


def rillet(*args: str, out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as stdout, open(out.with_suffix(".log"), "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "rillet.client.cli", *args], stdout=stdout, stderr=stderr
        )


def isr_whole(bootstrap: str) -> bool:
    with SyncAdmin(bootstrap) as admin:
        (topic,) = admin.describe_topics([TOPIC])
    return all(len(p.isr) == 3 for p in topic.partitions)


def test_streaming_load_soak_with_brokers_killed_and_restarted(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(controllers=3, brokers=3)
    cluster.keep_broker_ports()  # the Spark processes' bootstrap list must stay good
    bootstrap = cluster.bootstrap
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
    brokers = [n.node_id for n in cluster.brokers()]
    common = ["--topic", TOPIC, "--stream", "--json", "--interval", "10", "--bootstrap", bootstrap]
    verifier = rillet(
        "spark", "verify", *common, "--timeout", str(SECONDS * 4 + 600),
        out=tmp_path / "verify.json",
    )  # fmt: skip
    load = rillet(
        "spark", "load", *common, "--rate", str(RATE), "--duration", str(SECONDS),
        "--tasks", str(TASKS), "--record-size", "100", "--strict-order",
        "--checkpoint", str(tmp_path / "checkpoint"), out=tmp_path / "load.json",
    )  # fmt: skip
    rng = random.Random(SEED)
    faults: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        while True:
            try:  # the next fault in 10-20 s, unless the load ends first
                load.wait(timeout=rng.uniform(10, 20))
                break
            except subprocess.TimeoutExpired:
                pass
            victim = rng.choice(brokers)
            kill = rng.random() < 0.6
            at = round(time.monotonic() - started, 1)
            cluster.stop_node(victim, kill=kill)
            with contextlib.suppress(subprocess.TimeoutExpired):  # down for 3-8 s
                load.wait(timeout=rng.uniform(3, 8))
            cluster.start_node(victim)
            wait_until(lambda: isr_whole(bootstrap), timeout=120, message="ISR whole again")
            faults.append(
                {
                    "at_s": at,
                    "broker": victim,
                    "how": "kill -9" if kill else "SIGTERM",
                    "back_after_s": round(time.monotonic() - started - at, 1),
                }
            )
        load_code = load.wait(timeout=SECONDS * 3 + 600)
        verify_code = verifier.wait(timeout=SECONDS + 600)
    finally:
        for proc in (load, verifier):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    elapsed = round(time.monotonic() - started, 1)
    logs = {p: (tmp_path / f"{p}.log").read_text()[-3000:] for p in ("load", "verify")}
    assert load_code == 0, logs["load"]
    loaded = json.loads((tmp_path / "load.json").read_text())
    verified = json.loads((tmp_path / "verify.json").read_text())
    summary = {
        "seconds": SECONDS,
        "rate_asked": RATE,
        "tasks": TASKS,
        "seed": SEED,
        "elapsed_s": elapsed,
        "faults": faults,
        "load": {
            k: loaded[k]
            for k in ("status", "acknowledged", "records_per_s", "produce_s", "batches")
        },
        "aborted_batches": loaded["aborted_batches"],
        "verify": {
            k: verified[k]
            for k in (
                "ok",
                "read",
                "acknowledged",
                "lost",
                "duplicates",
                "reordered",
                "corrupt",
                "phantom",
                "unacknowledged_missing",
            )
        },  # fmt: skip
    }
    print(json.dumps(summary, indent=2))
    assert verify_code == 0, logs["verify"]
    assert loaded["status"] == "committed" and verified["ok"]
    assert verified["lost"] == 0 and verified["reordered"] == 0
    assert verified["acknowledged"] == loaded["records"]
    assert faults  # the soak did take brokers down
