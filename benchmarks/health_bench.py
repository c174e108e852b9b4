"""Cluster health at scale: how long `gather_health` and `rillet cluster status` take on
a cluster with many topics and partitions.

Starts a real cluster (1 controller + 3 brokers by default) in a temporary directory,
creates ``--topics`` topics of ``--partitions`` partitions each (RF 1: the point is the
number of partitions described, not replication), and prints one JSON object:

- ``create_s``: the time to create them all (CreateTopics in batches of 100 topics);
- ``gather_health_s``: ``gather_health(admin)`` through one broker, best of three (one
  Metadata for everything, DescribeConfigs in batches, DescribeQuorum);
- ``assess_ms``: the pure verdict over the same descriptions, best of three;
- ``cli_status_s``: ``rillet cluster status --bootstrap ... --json`` as a subprocess
  (interpreter start and imports included) and its exit code.

    python benchmarks/health_bench.py                       # 1,000 topics x 10 partitions
    python benchmarks/health_bench.py --topics 100 --partitions 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rillet.client.admin import Admin, NewTopic
from rillet.client.health import assess, describe_min_isr, gather_health
from rillet.tools.local_cluster import LocalCluster

CREATE_BATCH = 100


async def measure(bootstrap: str, topics: int, partitions: int) -> dict[str, object]:
    async with Admin(bootstrap, timeout_ms=600_000) as admin:
        started = time.perf_counter()
        for first in range(0, topics, CREATE_BATCH):
            names = range(first, min(first + CREATE_BATCH, topics))
            await admin.create_topics([NewTopic(f"h{i:05d}", partitions, 1) for i in names])
        create_s = time.perf_counter() - started
        gathers = []
        for _ in range(3):
            started = time.perf_counter()
            health = await gather_health(admin)
            gathers.append(time.perf_counter() - started)
        cluster, quorum, described = (
            await admin.describe_cluster(),
            await admin.describe_quorum(),
            await admin.describe_topics(),
        )
        min_isr = await describe_min_isr(admin, [t.name for t in described])
    assesses = []
    for _ in range(3):
        started = time.perf_counter()
        assess(cluster, quorum, described, min_isr)
        assesses.append((time.perf_counter() - started) * 1000)
    return {
        "topics": health.topics,
        "partitions": health.partitions,
        "healthy": health.healthy,
        "create_s": round(create_s, 1),
        "gather_health_s": round(min(gathers), 3),
        "assess_ms": round(min(assesses), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--brokers", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rillet-health-bench-") as tmp:
        cluster = LocalCluster(Path(tmp), controllers=1, brokers=args.brokers, ephemeral_ports=True)
        try:
            cluster.start()
            cluster.wait_ready()
            out = asyncio.run(measure(cluster.bootstrap, args.topics, args.partitions))
            started = time.perf_counter()
            cli = subprocess.run(
                [sys.executable, "-m", "rillet.client.cli", "cluster", "status",
                 "--bootstrap", cluster.bootstrap, "--json"],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            out["cli_status_s"] = round(time.perf_counter() - started, 2)
            out["cli_exit"] = cli.returncode
            out["cli_json_kb"] = round(len(cli.stdout) / 1024, 1)
        finally:
            cluster.stop(kill=True, timeout_s=30)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
