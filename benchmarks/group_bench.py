"""Consumer groups against a fresh local cluster (3 controllers + 3 brokers by default):
what a group costs a consumer, and how long its rebalances take.

Prints one JSON object:

- ``consume``: ``--num-records`` records of ``--record-size`` bytes (produced once,
  acks=1) read from the beginning by a plain Consumer of the whole topic (every
  partition, no group) and by the only member of a group (auto commit on), each in its
  own process, alternately ``--rounds`` times; records/s from the first record to the
  last (``records_per_s``) and from the start (``records_per_s_with_start``: the group
  member joins first); ``ratio_group_to_plain`` compares the median rates (and
  ``ratio_best_group_to_best_plain`` the best);
- ``rebalance``: ``--trials`` times, with a producer writing every partition meanwhile:
  a second member joins a one-member group (from its process being ready to the two
  owning half the partitions each and the newcomer having read from all of its own),
  then that member is killed with -9 (from the kill to the survivor having read from
  every partition it took over). The kill is detected only when the member's session
  times out, so the cluster runs with ``--session-timeout-ms`` (Kafka's default is
  45 s) and the report gives the time beyond it; the member learns of a rebalance at
  its next heartbeat, so the heartbeat interval (``--heartbeat-interval-ms``, default
  the broker's 5 s, as Kafka's) is reported too.

    python benchmarks/group_bench.py --num-records 2000000 --partitions 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cluster_bench import create_topic, defaults, perf_produce, run_started

from rillet.broker.config import broker_config_table
from rillet.client.consumer import Consumer, TopicPartition
from rillet.client.producer import Producer
from rillet.tools.local_cluster import LocalCluster


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# --- child processes ---------------------------------------------------------------------


async def consume_child(boot: str, topic: str, count: int, group: str | None) -> None:
    """Read ``count`` records from the beginning, plainly or as a group's only member."""
    kw: dict[str, Any] = {"from_beginning": True}
    if group is not None:
        kw = {"group_id": group, "auto_offset_reset": "earliest", "enable_auto_commit": True}
    start = time.perf_counter()
    first = None
    got = 0
    async with Consumer(topic, bootstrap=boot, **kw) as consumer:
        while got < count:
            batch = await consumer.getmany(timeout_ms=500)
            n = sum(map(len, batch.values()))
            if n and first is None:
                first = time.perf_counter()
            got += n
        end = time.perf_counter()
    assert first is not None
    emit(
        {
            "records": got,
            "seconds": round(end - start, 3),
            "records_per_s": round(got / (end - first)),
            "records_per_s_with_start": round(got / (end - start)),
            "first_record_after_s": round(first - start, 3),
        }
    )


class _Listener:
    def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
        emit({"t": time.time(), "assigned": sorted(p for _, p in tps)})

    def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
        emit({"t": time.time(), "revoked": sorted(p for _, p in tps)})

    def on_partitions_lost(self, tps: set[TopicPartition]) -> None:
        emit({"t": time.time(), "lost": sorted(p for _, p in tps)})


async def member_child(boot: str, topic: str, group: str, session_ms: int) -> None:
    """A group member printing its assignment changes and, per batch, the partitions it
    read from, each with the wall-clock time (the parent compares them with its own)."""
    consumer = Consumer(
        topic,
        bootstrap=boot,
        group_id=group,
        auto_offset_reset="latest",
        session_timeout_ms=session_ms,
        rebalance_listener=_Listener(),
    )
    emit({"t": time.time(), "ready": True})
    async with consumer:
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            parts = sorted({tp.partition for tp, recs in batch.items() if recs})
            if parts:
                emit({"t": time.time(), "read": parts})


async def producer_child(boot: str, topic: str, partitions: int, rate: float) -> None:
    """About ``rate`` records/s spread over every partition, until killed."""
    async with Producer(bootstrap=boot, acks="1", linger_ms=5) as producer:
        start = time.monotonic()
        sent = 0
        while True:
            due = int((time.monotonic() - start) * rate) + 1
            for i in range(sent, due):
                await producer.produce(topic, b"x" * 100, partition=i % partitions)
            sent = due
            await asyncio.sleep(0.01)


def child(*args: str, stdout: int | None = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args], stdout=stdout, stderr=subprocess.DEVNULL, text=True
    )


# --- parent ------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "consume":
        group = sys.argv[5] if len(sys.argv) > 5 else None
        asyncio.run(consume_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), group))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "member":
        asyncio.run(member_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        asyncio.run(producer_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-records", type=int, default=2_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64 * 1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--session-timeout-ms", type=int, default=6_000)
    parser.add_argument(
        "--heartbeat-interval-ms", type=int, default=None, help="default: the broker's"
    )
    parser.add_argument("--rate", type=float, default=2_000, help="records/s while rebalancing")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--controllers", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[], choices=["consume", "rebalance"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rillet-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp), controllers=args.controllers, brokers=args.brokers, ephemeral_ports=True
        )
        group_settings: dict[str, Any] = {
            "group.consumer.session.timeout.ms": args.session_timeout_ms
        }
        if args.heartbeat_interval_ms is not None:
            group_settings["group.consumer.heartbeat.interval.ms"] = args.heartbeat_interval_ms
        for node in cluster.brokers():
            cluster.node_overrides[node.node_id] = dict(group_settings)
        print(json.dumps(run_started(cluster, lambda: run(cluster, args)), indent=2))


def run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "cluster": {
            "brokers": args.brokers,
            "controllers": args.controllers,
            "partitions": args.partitions,
            "cpus": os.cpu_count(),
        }
    }
    if "consume" not in args.skip:
        result["consume"] = consume(cluster, args)
    if "rebalance" not in args.skip and args.trials > 0:
        result["rebalance"] = rebalance(cluster, args)
    return result


def consume(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    boot = cluster.bootstrap
    create_topic(boot, "bench", args.partitions, 3)
    produced = perf_produce(boot, "bench", args, "1")
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "group": []}
    for r in range(args.rounds):
        # Each goes first in every other round: neither always reads a colder cache.
        for kind in sorted(runs, reverse=r % 2 == 1):
            group = [f"bench-group-{r}"] if kind == "group" else []
            proc = child("consume", boot, "bench", str(args.num_records), *group)
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"the {kind} consumer failed")
            runs[kind].append(json.loads(out.splitlines()[-1]))
    rates = {k: [x["records_per_s"] for x in runs[k]] for k in runs}
    return {
        "records": args.num_records,
        "record_size": args.record_size,
        "produce_records_per_s": produced["records_per_s"],
        "plain": runs["plain"],
        "group": runs["group"],
        # Medians: on a shared machine one run of either may be slowed by anything.
        "ratio_group_to_plain": round(
            statistics.median(rates["group"]) / statistics.median(rates["plain"]), 3
        ),
        "ratio_best_group_to_best_plain": round(max(rates["group"]) / max(rates["plain"]), 3),
    }


class Member:
    """A member_child process; its events, read as they come."""

    def __init__(self, boot: str, topic: str, group: str, session_ms: int) -> None:
        self.proc = child("member", boot, topic, group, str(session_ms))
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def _snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def ready_at(self) -> float | None:
        return next((e["t"] for e in self._snapshot() if "ready" in e), None)

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for e in self._snapshot():
            owned |= set(e.get("assigned", ()))
            owned -= set(e.get("revoked", ())) | set(e.get("lost", ()))
        return owned

    def read_since(self, t: float) -> dict[int, float]:
        """partition -> when it was first read after ``t``."""
        out: dict[int, float] = {}
        for e in self._snapshot():
            if e["t"] > t:
                for p in e.get("read", ()):
                    out.setdefault(p, e["t"])
        return out

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise SystemExit(f"benchmark: timed out waiting for {what}")


def rebalance(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    boot, topic, group, n = cluster.bootstrap, "rebalance", "bench-rebalance", args.partitions
    everything = set(range(n))
    create_topic(boot, topic, n, 3)
    producer = child("producer", boot, topic, str(n), str(args.rate), stdout=subprocess.DEVNULL)
    first = Member(boot, topic, group, args.session_timeout_ms)
    members = [first]
    joins: list[float] = []
    kills: list[float] = []
    try:
        wait(lambda: first.owned() == everything, 120, "the first member owning everything")
        for _ in range(args.trials):
            second = Member(boot, topic, group, args.session_timeout_ms)
            members.append(second)
            ready = wait(second.ready_at, 60, "the second member's process")

            def joined(second: Member = second, ready: float = ready) -> float | None:
                mine = second.owned()
                if len(mine) != n // 2 or first.owned() != everything - mine:
                    return None
                read = second.read_since(ready)
                return max(read[p] for p in mine) if mine <= read.keys() else None

            joins.append(wait(joined, 120, "a balanced group, both reading") - ready)
            lost = second.owned()
            killed = time.time()
            second.kill()

            def taken_over(lost: set[int] = lost, killed: float = killed) -> float | None:
                if first.owned() != everything:
                    return None
                read = first.read_since(killed)
                return max(read[p] for p in lost) if lost <= read.keys() else None

            kills.append(wait(taken_over, 120, "the survivor reading everything") - killed)
    finally:
        for mem in members:
            mem.kill()
        producer.kill()
        producer.wait()
    session_s = args.session_timeout_ms / 1000

    def summary(values: list[float]) -> dict[str, float]:
        return {
            "median_s": round(statistics.median(values), 3),
            "max_s": round(max(values), 3),
            "min_s": round(min(values), 3),
        }

    return {
        "trials": args.trials,
        "group.consumer.session.timeout.ms": args.session_timeout_ms,
        "group.consumer.heartbeat.interval.ms": args.heartbeat_interval_ms
        or defaults(broker_config_table())["group.consumer.heartbeat.interval.ms"],
        "join_to_balanced_and_reading": summary(joins),
        "kill_to_partitions_read_by_survivor": summary(kills),
        "kill_beyond_session_timeout": summary([k - session_s for k in kills]),
        "join_each_s": [round(j, 3) for j in joins],
        "kill_each_s": [round(k, 3) for k in kills],
    }


if __name__ == "__main__":
    main()
