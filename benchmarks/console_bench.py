"""The web console on a large cluster: 10,000 partitions and 1,000 consumer groups.

Starts a local cluster (1 controller + 1 broker by default), creates ``--topics`` topics
of ``--partitions`` partitions each (RF=1: the console's cost is per partition, not per
replica, and RF=1 keeps the set-up short), and ``--groups`` groups by committing an
offset for each from outside (Admin.alter_group_offsets: a group with no members, as
`rillet group reset-offsets` makes one). Then it starts ``rillet console`` the way
`rillet cluster up` does (with the brokers' /metrics) and prints one JSON object:

- ``requests``: p50/p99/max latency in ms of each page (``--requests`` sequential GETs
  each, after the console's first complete snapshot): the overview, the topics list, a
  later page of it sorted by size, a filtered list, one topic's detail (a ListOffsets
  round trip for its partitions) and the groups list;
- ``snapshot``: how long the console's last fast refresh (DescribeCluster, Metadata,
  ListGroups, a connection probe) and its last log pass (DescribeLogDirs to every
  leader) took, as it reports them;
- ``console``: its peak resident set, and the CPU it spends keeping the snapshot fresh
  with nobody looking (``idle_cpu_percent`` of one core, over ``--idle-s`` seconds).

    python benchmarks/console_bench.py                  # 1,000 x 10 partitions, 1,000 groups
    python benchmarks/console_bench.py --brokers 3      # the same over three brokers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cluster_bench import cpu_seconds, peak_rss_mb, run_started

from rillet.client.admin import Admin, NewTopic
from rillet.tools.local_cluster import LocalCluster

CREATE_BATCH = 100  # topics per CreateTopics
GROUP_BATCH = 50  # concurrent offset commits


async def populate(boot: str, topics: int, partitions: int, groups: int) -> dict[str, float]:
    async with Admin(boot, timeout_ms=300_000, request_timeout_ms=120_000) as admin:
        t0 = time.monotonic()
        names = [f"bench-{i:04d}" for i in range(topics)]
        for start in range(0, topics, CREATE_BATCH):
            batch = names[start : start + CREATE_BATCH]
            await admin.create_topics([NewTopic(n, partitions, 1) for n in batch])
        while True:  # every partition led: the console then sees the whole cluster
            described = await admin.describe_topics(names)
            if all(p.leader >= 0 for t in described for p in t.partitions):
                break
            await asyncio.sleep(1.0)
        created = time.monotonic() - t0
        t0 = time.monotonic()
        for start in range(0, groups, GROUP_BATCH):
            await asyncio.gather(
                *(
                    admin.alter_group_offsets(f"group-{i:04d}", {(names[i % topics], 0): 0})
                    for i in range(start, min(start + GROUP_BATCH, groups))
                )
            )
        listed = len(await admin.list_groups())
        return {
            "create_topics_s": round(created, 1),
            "create_groups_s": round(time.monotonic() - t0, 1),
            "groups_listed": listed,
        }


def get(url: str) -> tuple[float, int, int]:
    """(ms, status, bytes) of one GET."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        body, status = e.read(), e.code
    return (time.perf_counter() - t0) * 1000, status, len(body)


def measure(url: str, count: int) -> dict[str, Any]:
    get(url)  # a warm-up (template compilation, connection set-up)
    runs = [get(url) for _ in range(count)]
    ms = sorted(r[0] for r in runs)
    return {
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1),
        "max_ms": round(ms[-1], 1),
        "status": sorted({r[1] for r in runs}),
        "bytes": runs[-1][2],
    }


def wait_for_full_snapshot(base: str, topics: int, timeout_s: float) -> dict[str, Any]:
    """The console's history endpoint once its snapshot has every topic and a log pass."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, status, _ = get(base + "/topics?size=1&internal=1")
        with urllib.request.urlopen(base + "/overview/history.json", timeout=60) as r:
            history = json.loads(r.read())
        with urllib.request.urlopen(
            base + f"/topics?size=1&q=bench-{topics - 1:04d}", timeout=60
        ) as r:
            listed = b'data-total="1"' in r.read()
        if status == 200 and listed and history["logs_took_s"] > 0:
            return history
        time.sleep(1.0)
    raise SystemExit("benchmark: the console never showed the whole cluster")


def run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    setup = asyncio.run(populate(cluster.bootstrap, args.topics, args.partitions, args.groups))
    # As `cluster up` starts it: with each broker's /metrics for bytes out.
    metrics = ",".join(f"{n.node_id}={n.metrics}" for n in cluster.brokers() if n.metrics)
    extra = ["--refresh", str(args.refresh)] + (["--metrics", metrics] if metrics else [])
    base = cluster.start_console(0, extra=extra, timeout_s=120)
    pid = cluster.console.pid if cluster.console is not None else None
    cpu0 = cpu_seconds(pid)
    first = time.monotonic()
    history = wait_for_full_snapshot(base, args.topics, 600)
    first_snapshot_s = time.monotonic() - first
    middle = f"bench-{args.topics // 2:04d}"
    paths = {
        "/": "/",
        "/topics": "/topics",
        "/topics?page=N": "/topics?sort=size&dir=desc&page=10",
        "/topics?q=": "/topics?q=bench-09",
        "/topics/<one>": f"/topics/{middle}",
        "/groups": "/groups",
    }
    requests = {name: measure(base + path, args.requests) for name, path in paths.items()}
    cpu_idle0, t_idle0 = cpu_seconds(pid), time.monotonic()
    time.sleep(args.idle_s)  # nothing asks: only the refresh loops run
    idle_cpu = (cpu_seconds(pid) - cpu_idle0) / (time.monotonic() - t_idle0)
    with urllib.request.urlopen(base + "/overview/history.json", timeout=60) as r:
        history = json.loads(r.read())
    return {
        "cluster": {
            "brokers": args.brokers,
            "controllers": 1,
            "topics": args.topics,
            "partitions_total": args.topics * args.partitions,
            "groups": args.groups,
            "cpus": os.cpu_count(),
        },
        "setup": setup,
        "console_refresh_s": args.refresh,
        "first_full_snapshot_s": round(first_snapshot_s, 1),
        "requests": requests,
        "snapshot": {
            "refresh_took_s": history["refresh_took_s"],
            "logs_took_s": history["logs_took_s"],
        },
        "console": {
            "peak_rss_mb": peak_rss_mb(pid),
            "cpu_s": round(cpu_seconds(pid) - cpu0, 1),
            "idle_cpu_percent": round(100 * idle_cpu, 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10, help="per topic")
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--requests", type=int, default=50, help="GETs per page measured")
    parser.add_argument("--refresh", type=float, default=2.0, help="the console's --refresh")
    parser.add_argument("--idle-s", type=float, default=20.0, help="the idle CPU window")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rillet-console-") as tmp:
        cluster = LocalCluster(Path(tmp), controllers=1, brokers=args.brokers, ephemeral_ports=True)
        print(json.dumps(run_started(cluster, lambda: run(cluster, args), 60), indent=2))


if __name__ == "__main__":
    main()
