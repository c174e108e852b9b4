"""Produce and consume throughput against a fresh local cluster.

Starts a real cluster (3 controllers + 3 brokers by default) in a temporary directory,
creates a topic, runs ``rillet perf produce`` (acks=1 by default) and ``rillet perf
consume`` as subprocesses, and prints one JSON object: each run's records/s, MB/s,
latency percentiles and the client's peak RSS, plus each broker's peak RSS (VmHWM).

    python benchmarks/cluster_bench.py --num-records 1000000 --partitions 6
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

from rillet.broker.local_cluster import LocalCluster


def peak_rss_mb(pid: int | None) -> float | None:
    """A process's peak resident set (VmHWM) in MiB, or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def rillet(bootstrap: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "rillet.client.cli", *args, "--bootstrap", bootstrap, "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"rillet {' '.join(args)} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--batch-size", type=int, default=64 * 1024)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--controllers", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rillet-bench-") as tmp:
        cluster = LocalCluster(Path(tmp), controllers=args.controllers, brokers=args.brokers,
                               ephemeral_ports=True)  # fmt: skip
        cluster.start()
        try:
            cluster.wait_ready()
            result = run(cluster, args)
        finally:
            cluster.stop(timeout_s=30)
    print(json.dumps(result, indent=2))


def run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    boot = cluster.bootstrap
    rillet(boot, "topic", "create", "bench", "--partitions", str(args.partitions),
           "--replication-factor", str(args.replication_factor))  # fmt: skip
    produce = rillet(boot, "perf", "produce", "--topic", "bench",
                     "--num-records", str(args.num_records),
                     "--record-size", str(args.record_size), "--acks", args.acks,
                     "--batch-size", str(args.batch_size))  # fmt: skip
    consume = rillet(boot, "perf", "consume", "--topic", "bench",
                     "--num-records", str(args.num_records))  # fmt: skip
    return {
        "cluster": {
            "brokers": args.brokers,
            "controllers": args.controllers,
            "partitions": args.partitions,
            "replication_factor": args.replication_factor,
            "cpus": os.cpu_count(),
        },  # fmt: skip
        "produce": produce,
        "consume": consume,
        "broker_peak_rss_mb": {n.node_id: peak_rss_mb(n.pid) for n in cluster.brokers()},
    }


if __name__ == "__main__":
    main()
