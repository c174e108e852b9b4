"""`rillet spark load` next to `rillet perf produce`, in one run, on one local cluster.

Starts 1 controller + 3 brokers on loopback, creates RF=3 topics and measures:

- ``rillet perf produce --acks all`` as N concurrent processes (the baseline), and
- ``rillet spark load --acks all`` with N Spark tasks (``--master local[4]``),

for N in ``--tasks`` (2 and 4), then prints JSON with each run's records/s, the ratio
of the two at the same parallelism, and the CPU seconds per million records of each
part (perf's clients; Spark's JVM and Python workers; the brokers). The load runs again
with perf produce's 64 KiB batches (``spark_load_64k_batches``) next to its own 256 KiB.
Spark figures are over the produce span (first task start to last acknowledgement);
``job_records_per_s`` also counts Spark's scheduling and Python worker start.

    .venv/bin/python benchmarks/spark_bench.py [--records 1000000] [--record-size 100]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cluster_bench import brokers_cpu_seconds

from rillet.client.admin import NewTopic
from rillet.client.spark.jobs import run_load, spark_session
from rillet.client.sync import SyncAdmin
from rillet.tools.local_cluster import LocalCluster

RILLET = str(Path(sys.executable).with_name("rillet"))


def perf_produce(bootstrap: str, topic: str, records: int, size: int, procs: int) -> dict[str, Any]:
    """``procs`` concurrent ``rillet perf produce`` processes sharing ``records``: the
    same parallelism as ``procs`` Spark tasks. Records/s over their common produce span,
    first send to last acknowledgement (after the processes' start-up, as Spark's span
    is after its tasks')."""
    share = [records // procs + (1 if i < records % procs else 0) for i in range(procs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = [
        subprocess.Popen(perf_argv(bootstrap, topic, n, size), stdout=subprocess.PIPE, text=True)
        for n in share
    ]
    reports = []
    for child in children:
        out, _ = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"rillet perf produce exited {child.returncode}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    seconds = max(r["finished_at"] for r in reports) - min(r["started_at"] for r in reports)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "processes": procs,
        # The producer processes' CPU, start-up included, per million records.
        "clients_cpu_s_per_million_records": round(cpu * 1e6 / records, 2),
        "records_per_s": round(records / seconds),
        "mb_per_s": round(records * size / seconds / 2**20, 2),
    }


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own CPU s, reaped children's CPU s) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return (
        int(fields[1]),
        (int(fields[11]) + int(fields[12])) / tick,
        (int(fields[13]) + int(fields[14])) / tick,
    )


def spark_cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process's descendants: the JVM (driver and, in local
    mode, the executors) and the Python workers (pyspark's daemon, its forked workers
    alive or reaped)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            parents[int(d.name)] = st[0]

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    out = {"jvm": 0.0, "python_workers": 0.0}
    for pid in parents:
        if not descends(pid) or (st := _stat(pid)) is None:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"java" in cmd.split(b"\0", 1)[0]:
            out["jvm"] += st[1]
        elif b"pyspark" in cmd:
            out["python_workers"] += st[1] + st[2]  # + the workers it forked and reaped
    return out


def perf_argv(bootstrap: str, topic: str, records: int, size: int) -> list[str]:
    return [
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
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--master", default="local[4]")
    ap.add_argument(
        "--tasks",
        nargs="+",
        default=["2", "4"],
        help="Spark tasks per run, against as many perf produce processes",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rillet-spark-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp) / "cluster", controllers=1, brokers=3, ephemeral_ports=True
        )
        with cluster:
            cluster.start()
            cluster.wait_ready()
            print(json.dumps(run_all(cluster, args), indent=2))


def run_all(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = cluster.bootstrap

    runs = [int(t) for t in args.tasks]
    topics = [f"{kind}{n}" for n in runs for kind in ("perf", "spark", "spark64k", "warmup")]
    with SyncAdmin(bootstrap) as admin:
        admin.create_topics([NewTopic(t, args.partitions, 3) for t in topics])
    # local[4]: all 4 tasks run at once even on a 2-core machine (local[*] would run
    # only as many tasks at a time as there are cores, and "4 tasks" would mean 2).
    spark = spark_session(args.master, app_name="rillet-spark-bench")
    result: dict[str, Any] = {
        "records": args.records,
        "record_size": args.record_size,
        "partitions": args.partitions,
        "replication_factor": 3,
        "acks": "all",
        "master": args.master,
        "cpus": os.cpu_count(),
    }
    for n in runs:
        # Warm up Spark on a fifth of the load with the same plan (JIT of the generated
        # code, Python workers started), so the runs compare steady states: a first run
        # spent 1.6 times the JVM CPU of the next one.
        run_load(spark, bootstrap, f"warmup{n}", args.records // 5, n, args.record_size)
        brokers_cpu = brokers_cpu_seconds(cluster)
        perf = perf_produce(bootstrap, f"perf{n}", args.records, args.record_size, n)
        perf["brokers_cpu_s_per_million_records"] = round(
            (brokers_cpu_seconds(cluster) - brokers_cpu) * 1e6 / args.records, 2
        )
        spark_cpu, brokers_cpu = spark_cpu_seconds(), brokers_cpu_seconds(cluster)
        load = run_load(spark, bootstrap, f"spark{n}", args.records, n, args.record_size)
        spark_cpu_after = spark_cpu_seconds()
        # Where the load's CPU went, in seconds per million records (the Spark job's whole
        # span, scheduling included; the Python workers include the rillet producer).
        per_m = 1e6 / args.records
        cpu = {k: round((spark_cpu_after[k] - v) * per_m, 2) for k, v in spark_cpu.items()}
        cpu["brokers"] = round((brokers_cpu_seconds(cluster) - brokers_cpu) * per_m, 2)
        result[f"{n}_tasks"] = {
            "perf_produce": perf,
            "spark_load": {
                "records_per_s": round(load.records_per_s),
                "mb_per_s": round(load.mb_per_s, 2),
                "job_records_per_s": round(args.records / load.elapsed_s),
                "cpu_s_per_million_records": cpu,
            },
            "ratio_to_perf_produce": round(load.records_per_s / perf["records_per_s"], 2),
        }
        # The load's producer at perf produce's 64 KiB batches instead of its 256 KiB: each
        # task writes one partition, so a request carries one batch (perf's carry several).
        small = run_load(
            spark,
            bootstrap,
            f"spark64k{n}",
            args.records,
            n,
            args.record_size,
            writer_options={"batchSize": str(64 * 1024)},
        )
        result[f"{n}_tasks"]["spark_load_64k_batches"] = {
            "records_per_s": round(small.records_per_s),
            "ratio_to_perf_produce": round(small.records_per_s / perf["records_per_s"], 2),
        }
    spark.stop()
    return result


if __name__ == "__main__":
    main()
