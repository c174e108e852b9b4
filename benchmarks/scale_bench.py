"""Partition scale: how a local cluster copes with thousands of partitions.

Starts a real cluster (3 controllers + 3 brokers by default) in a temporary directory and
prints one JSON object:

- ``baseline``: acks=all ``rillet perf produce`` to a 10-partition RF=3 topic on the
  fresh cluster (records/s, latency);
- ``creates``: for each ``--steps`` size (default 1,000 then 9,000 more, 10,010 in all),
  the time from CreateTopics until every partition of the new topic has a leader and a
  full ISR in the controller's metadata (``to_full_isr_s``), then until every leader
  answers a ListOffsets for its partitions (``to_leaders_serving_s``: the metadata says
  who leads before that broker has opened the log and taken the role), and the
  controller elections that happened meanwhile (the ``election for term`` lines the
  controllers logged: the aim is none), and each node's largest event-loop stall meanwhile
  (``max_loop_stall_ms``, controllers and brokers: the ``event loop stalled`` warnings of
  its node log, logged over ``--stall-warn-ms``; 0 means none over it; aim: under 100 ms);
- ``loaded``: the same produce with every partition existing, and its throughput ratio
  to the baseline (aim: at least 0.8);
- ``peak_rss_mb``: each node's peak resident set (VmHWM), controllers and brokers;
- ``controller_failover``: kill -9 the active controller; the time until another is
  active (DescribeQuorum) and the time until a CreateTopics through a broker succeeds
  (each attempt listed), with every partition existing; and the same CreateTopics
  without a kill just before (``control_create_s``): a broker answers a CreateTopics
  once its own metadata shows the topic, so a broker still busy with an earlier large
  batch slows both alike.

    python benchmarks/scale_bench.py                      # 1,000 then 10,010 partitions
    python benchmarks/scale_bench.py --steps 1000 49000   # the slow 50,000 run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster_bench import create_topic, peak_rss_mb, perf_produce, run_started
from controller_bench import status as quorum_status

from rillet.client.admin import Admin, AdminError
from rillet.client.consumer import Consumer
from rillet.client.wire.errors import RilletError
from rillet.tools.local_cluster import LocalCluster

ELECTION = re.compile(rb"election for term \d+")
STALL = re.compile(rb"event loop stalled for (\d+) ms")


def election_lines(cluster: LocalCluster) -> int:
    """Elections the controllers have started so far (their node logs)."""
    total = 0
    for node in cluster.controllers():
        path = cluster.node_dir(node.node_id) / "node.log"
        if path.exists():
            total += len(ELECTION.findall(path.read_bytes()))
    return total


async def wait_full_isr(admin: Admin, topic: str, timeout_s: float) -> float:
    """Seconds until every partition of ``topic`` has a leader and a full ISR."""
    t0 = time.monotonic()
    pause = 0.5
    while time.monotonic() - t0 < timeout_s:
        try:
            (desc,) = await admin.describe_topics([topic])
            if all(p.leader >= 0 and sorted(p.isr) == sorted(p.replicas) for p in desc.partitions):
                return time.monotonic() - t0
            # A describe of 50,000 partitions is work for the broker too: ask less often.
            pause = max(0.5, len(desc.partitions) / 20_000)
        except (RilletError, AdminError):
            # Not visible yet: the controller answered CreateTopics once it committed
            # the topic, and the broker asked may not have applied that yet; or busy.
            pass
        await asyncio.sleep(pause)
    raise SystemExit(f"benchmark: {topic} did not reach a full ISR within {timeout_s:.0f}s")


async def wait_leaders_serve(boot: str, topic: str, count: int, timeout_s: float) -> None:
    """Until each partition's leader answers ListOffsets (the consumer retries a leader
    that does not serve yet, NOT_LEADER_OR_FOLLOWER and the like, until its deadline)."""
    consumer = Consumer(assignment=[], bootstrap=boot, metadata_wait_ms=int(timeout_s * 1000))
    await consumer.start()
    try:
        await consumer.end_offsets([(topic, p) for p in range(count)])
    finally:
        await consumer.close()


def log_sizes(cluster: LocalCluster) -> dict[int, int]:
    """Each node log's size now: where a step's lines start."""
    sizes = {}
    for node_id in cluster.nodes:
        path = cluster.node_dir(node_id) / "node.log"
        sizes[node_id] = path.stat().st_size if path.exists() else 0
    return sizes


def max_stalls(cluster: LocalCluster, since: dict[int, int]) -> dict[str, dict[int, int]]:
    """Each node's largest logged event-loop stall (ms) after ``since``, by role."""
    out: dict[str, dict[int, int]] = {"controllers": {}, "brokers": {}}
    for node in cluster.nodes.values():
        path = cluster.node_dir(node.node_id) / "node.log"
        with path.open("rb") as f:
            f.seek(since.get(node.node_id, 0))
            stalls = [int(ms) for ms in STALL.findall(f.read())]
        role = "controllers" if node.is_controller else "brokers"
        out[role][node.node_id] = max(stalls, default=0)
    return out


def create_step(cluster: LocalCluster, topic: str, count: int, timeout_s: float) -> dict[str, Any]:
    elections = election_lines(cluster)
    logs = log_sizes(cluster)
    t0 = time.monotonic()
    create_topic(cluster.bootstrap, topic, count, 3)
    created = time.monotonic() - t0

    async def full() -> float:
        async with Admin(cluster.bootstrap, timeout_ms=60_000) as admin:
            return await wait_full_isr(admin, topic, timeout_s)

    isr_s = asyncio.run(full())
    asyncio.run(wait_leaders_serve(cluster.bootstrap, topic, count, timeout_s))
    serving = time.monotonic() - t0
    return {
        "partitions": count,
        "create_call_s": round(created, 2),
        "to_full_isr_s": round(created + isr_s, 2),
        "to_leaders_serving_s": round(serving, 2),
        "controller_elections": election_lines(cluster) - elections,
        "max_loop_stall_ms": max_stalls(cluster, logs),
    }


def peak_rss(cluster: LocalCluster) -> dict[int, float | None]:
    return {n.node_id: peak_rss_mb(n.pid) for n in cluster.nodes.values()}


async def active_controller(cluster: LocalCluster, exclude: int) -> int:
    """The controller other than ``exclude`` that says it is active (DescribeQuorum)."""
    ports = [
        n.controller_port
        for n in cluster.controllers()
        if n.node_id != exclude and n.controller_port is not None
    ]
    while True:
        for port in ports:
            view = await quorum_status(port)
            if view is not None and view.active:
                return view.node_id
        await asyncio.sleep(0.02)


def timed_create(cluster: LocalCluster, topic: str) -> tuple[float, str | None]:
    """One ``rillet topic create`` of a 1-partition RF=3 topic: seconds and its error."""
    t0 = time.monotonic()
    try:
        create_topic(cluster.bootstrap, topic, 1, 3)
        return time.monotonic() - t0, None
    except SystemExit as e:
        return time.monotonic() - t0, str(e).strip().splitlines()[-1][-200:]


def controller_failover(cluster: LocalCluster, timeout_s: float) -> dict[str, Any]:
    """kill -9 the active controller, then two clocks from the kill: until another
    controller is active (DescribeQuorum on the survivors), and until a CreateTopics
    through a broker succeeds (the CLI, tried again on failure). The same CreateTopics
    first runs once without a kill: a broker answers it only once its own metadata shows
    the topic, so a broker still applying an earlier large batch (thousands of new logs)
    makes every CreateTopics slow, failover or not; that figure tells them apart."""
    control_s, control_error = timed_create(cluster, f"before-failover-{int(time.time())}")
    described = cluster.describe()
    if described is None or described.controller_id < 0:
        return {"skipped": "no active controller known"}
    active = described.controller_id
    t0 = time.monotonic()
    cluster.stop_node(active, kill=True)
    elected = asyncio.run(asyncio.wait_for(active_controller(cluster, active), timeout_s))
    to_active = time.monotonic() - t0
    attempts: list[dict[str, Any]] = []
    topic = f"after-failover-{int(time.time())}"
    while time.monotonic() < t0 + timeout_s:
        took, error = timed_create(cluster, topic)
        attempts.append({"s": round(took, 2), "error": error})
        if error is None:
            break
        time.sleep(0.2)  # no controller yet: CreateTopics fails, try again
    else:
        raise SystemExit("benchmark: no CreateTopics succeeded after the controller kill")
    took = time.monotonic() - t0
    cluster.start_node(active)
    return {
        "killed": active,
        "new_active": elected,
        "to_active_controller_s": round(to_active, 2),
        "to_create_topics_success_s": round(took, 2),
        "create_attempts": attempts,
        "control_create_s": round(control_s, 2),
        "control_create_error": control_error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 9000])
    parser.add_argument("--num-records", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64 * 1024)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--controllers", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument(
        "--stall-warn-ms", type=int, default=50, help="event.loop.stall.warn.ms of every node"
    )
    parser.add_argument(
        "--creates-only", action="store_true", help="skip the produce runs and the failover"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rillet-scale-") as tmp:
        cluster = LocalCluster(
            Path(tmp),
            controllers=args.controllers,
            brokers=args.brokers,
            ephemeral_ports=True,
            overrides={"event.loop.stall.warn.ms": args.stall_warn_ms},
        )
        print(json.dumps(run_started(cluster, lambda: run(cluster, args), 60), indent=2))


def run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    boot = cluster.bootstrap
    create_topic(boot, "small", 10, 3, "min.insync.replicas=2")
    baseline = None if args.creates_only else perf_produce(boot, "small", args, "all")
    creates = [
        create_step(cluster, f"scale{i}", count, args.timeout_s)
        for i, count in enumerate(args.steps)
    ]
    described = {
        "cluster": {
            "brokers": args.brokers,
            "controllers": args.controllers,
            "cpus": os.cpu_count(),
            "partitions_total": 10 + sum(args.steps),
        },
    }
    if baseline is None:
        return {**described, "creates": creates, "peak_rss_mb": peak_rss(cluster)}
    loaded = perf_produce(boot, "small", args, "all")
    peak = peak_rss(cluster)
    return {
        **described,
        "baseline": baseline,
        "creates": creates,
        "loaded": loaded,
        "throughput_ratio_loaded_to_baseline": round(
            loaded["records_per_s"] / baseline["records_per_s"], 3
        ),
        "peak_rss_mb": peak,
        "controller_failover": controller_failover(cluster, args.timeout_s),
    }


if __name__ == "__main__":
    main()
