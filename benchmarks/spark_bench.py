"""`rillet spark load` next to `rillet perf produce`, in one run, on one local cluster.

Starts 1 controller + 3 brokers on loopback, creates RF=3 topics and measures:

- ``rillet perf produce --acks all`` (one client process, the baseline), and
- ``rillet spark load --acks all`` with 2 and 4 Spark tasks (local[*]),

then prints JSON with each run's records/s and its ratio to the baseline, which shows
what Spark adds (or costs) over a plain producer. Spark figures are over the produce
span (first task start to last acknowledgement); ``job_records_per_s`` also counts
Spark's scheduling and Python worker start.

    .venv/bin/python benchmarks/spark_bench.py [--records 1000000] [--record-size 100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rillet.client.admin import NewTopic
from rillet.client.spark.jobs import run_load, spark_session
from rillet.client.sync import SyncAdmin
from rillet.tools.local_cluster import LocalCluster

RILLET = str(Path(sys.executable).with_name("rillet"))


def perf_produce(bootstrap: str, topic: str, records: int, size: int) -> dict[str, Any]:
    out = subprocess.run(
        [
            RILLET,
            "perf",
            "produce",
            "--topic",
            topic,
            "--num-records",
            str(records),
            "--record-size",
            str(size),
            "--acks",
            "all",
            "--bootstrap",
            bootstrap,
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--master", default="local[4]")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rillet-spark-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp) / "cluster", controllers=1, brokers=3, ephemeral_ports=True
        )
        with cluster:
            cluster.start()
            cluster.wait_ready()
            print(json.dumps(run_all(cluster.bootstrap, args), indent=2))


def run_all(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    topics = ["perf", "spark2", "spark4"]
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic(t, args.partitions, 3) for t in topics])
    # local[4]: all 4 tasks run at once even on a 2-core machine (local[*] would run
    # only as many tasks at a time as there are cores, and "4 tasks" would mean 2).
    spark = spark_session(args.master, app_name="rillet-spark-bench")
    # Warm up Spark (JVM JIT, Python workers) on a small load, so runs compare steady state.
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic("warmup", args.partitions, 3)])
    run_load(spark, bootstrap, "warmup", 20_000, 4, args.record_size)

    perf = perf_produce(bootstrap, "perf", args.records, args.record_size)
    result: dict[str, Any] = {
        "records": args.records,
        "record_size": args.record_size,
        "partitions": args.partitions,
        "replication_factor": 3,
        "acks": "all",
        "master": args.master,
        "cpus": os.cpu_count(),
        "perf_produce": {"records_per_s": perf["records_per_s"], "mb_per_s": perf["mb_per_s"]},
    }
    for tasks, topic in ((2, "spark2"), (4, "spark4")):
        load = run_load(spark, bootstrap, topic, args.records, tasks, args.record_size)
        result[f"spark_load_{tasks}_tasks"] = {
            "records_per_s": round(load.records_per_s),
            "mb_per_s": round(load.mb_per_s, 2),
            "job_records_per_s": round(args.records / load.elapsed_s),
            "ratio_to_perf_produce": round(load.records_per_s / perf["records_per_s"], 2),
        }
    spark.stop()
    return result


if __name__ == "__main__":
    main()
