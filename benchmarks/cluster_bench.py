"""Produce and consume throughput, replication cost, failover time and end-to-end
latency against a fresh local cluster.

Starts a real cluster (3 controllers + 3 brokers by default) in a temporary directory and
prints one JSON object:

- ``produce`` / ``consume``: ``rillet perf produce`` (``--acks``, RF ``--replication-factor``)
  and ``rillet perf consume`` as subprocesses: records/s, MB/s, latency, client peak RSS;
  for the produce also the CPU seconds the brokers spent meanwhile (``brokers_cpu_s``);
- ``produce_bulk``: the same produce through ``send_many`` (``perf produce --bulk``), the
  path that creates nothing per record before the codec;
- ``replication``: perf produce with RF=1 acks=1 and RF=3 acks=all
  (min.insync.replicas=2) in the same run, and their throughput ratio;
- ``end_to_end``: a producer subprocess at a fixed rate (``--e2e-rate``, acks=all, RF=3)
  puts its wall-clock send time in each value; the consumer (this process) records
  receive time minus send time: p50/p99/max;
- ``failover``: ``--failover-trials`` times, kill -9 the leader of a partition and time
  until an acks=all send issued right after the kill succeeds on that partition, with
  when the new leader showed in metadata (detection + election) and the client's share
  after that; the configured ``broker.session.timeout.ms`` and heartbeat interval;
- ``broker_peak_rss_mb``: each broker's VmHWM before the failover trials (a restarted
  broker starts a new peak), with the follower fetch bounds configured.

    python benchmarks/cluster_bench.py --num-records 1000000 --partitions 6
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import gc
import itertools
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rillet.broker.config import broker_config_table
from rillet.client.admin import Admin
from rillet.client.cli.perf import weighted_percentiles
from rillet.client.consumer import Consumer
from rillet.client.producer import Producer
from rillet.client.wire.errors import RilletError
from rillet.controller.config import controller_config_table
from rillet.tools.local_cluster import LocalCluster

T = TypeVar("T")
STAMP = struct.Struct(">d")  # the send time (time.time()) at the head of each e2e value


def peak_rss_mb(pid: int | None) -> float | None:
    """A process's peak resident set (VmHWM) in MiB, or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def cpu_seconds(pid: int | None) -> float:
    """A process's CPU time so far (user + system), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_wait_seconds(pids: list[int | None]) -> float:
    """Time the processes' threads spent runnable but waiting for a core, so far (the
    second field of /proc/PID/task/TID/schedstat): CPU contention, as a latency."""
    total = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def brokers_cpu_seconds(cluster: LocalCluster) -> float:
    return sum(cpu_seconds(n.pid) for n in cluster.brokers())


def controllers_cpu_seconds(cluster: LocalCluster) -> float:
    return sum(cpu_seconds(n.pid) for n in cluster.controllers() if not n.is_broker)


def rillet(bootstrap: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "rillet.client.cli", *args, "--bootstrap", bootstrap, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"rillet {' '.join(args)} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "e2e-producer":  # the paced producer child
        boot, topic, mode, batch = sys.argv[2], sys.argv[3], sys.argv[8], int(sys.argv[9])
        rate, seconds, size, linger_ms = map(float, sys.argv[4:8])
        asyncio.run(e2e_producer(boot, topic, rate, seconds, size, linger_ms, mode, batch))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--batch-size", type=int, default=64 * 1024)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--controllers", type=int, default=3)
    parser.add_argument(
        "--e2e-rate",
        type=float,
        nargs="+",
        default=[0.5],
        help="records/s; a value up to 1 is a share of the RF=3 acks=all rate measured in "
        "this run (default 0.5: half the maximum)",
    )
    parser.add_argument(
        "--e2e-linger-ms",
        type=float,
        nargs="+",
        default=[5, 1],
        help="one end-to-end run per producer linger (5: the producer's default)",
    )
    parser.add_argument(
        "--e2e-producer-calls",
        nargs="+",
        choices=["send_many", "produce"],
        default=["send_many"],
        help="how the paced producer hands records over (one end-to-end run per choice)",
    )
    parser.add_argument(
        "--e2e-batch-size",
        type=int,
        default=512 * 1024,
        help="the paced producer's batch_size: room for a linger's worth of records at the "
        "rate (at 450,000 records/s the default 64 KiB fills in 1.4 ms, and each batch "
        "costs the leader a request)",
    )
    parser.add_argument("--e2e-seconds", type=float, default=10)
    parser.add_argument("--failover-trials", type=int, default=10)
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=None,
        help="broker.session.timeout.ms (default: the controller's)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["throughput", "bulk", "replication", "e2e", "failover"],
    )
    args = parser.parse_args()
    node_overrides: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rillet-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp), controllers=args.controllers, brokers=args.brokers, ephemeral_ports=True
        )
        if args.session_timeout_ms is not None:
            for node in cluster.controllers():
                node_overrides[node.node_id] = {
                    "broker.session.timeout.ms": args.session_timeout_ms
                }
            cluster.node_overrides.update(node_overrides)
        print(json.dumps(run_started(cluster, lambda: run(cluster, args)), indent=2))


def run_started(cluster: LocalCluster, body: Callable[[], T], stop_timeout_s: float = 30) -> T:
    """Start ``cluster``, wait until every broker is registered, run ``body``, stop it."""
    cluster.start()
    try:
        cluster.wait_ready()
        return body()
    finally:
        cluster.stop(timeout_s=stop_timeout_s)


def run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "cluster": {
            "brokers": args.brokers,
            "controllers": args.controllers,
            "partitions": args.partitions,
            "replication_factor": args.replication_factor,
            "cpus": os.cpu_count(),
        },
    }
    if "throughput" not in args.skip:
        result.update(throughput(cluster, args))
    if "bulk" not in args.skip:
        create_topic(cluster.bootstrap, "bulk", args.partitions, args.replication_factor)
        result["produce_bulk"] = perf_produce(cluster.bootstrap, "bulk", args, args.acks, "--bulk")
    if "replication" not in args.skip:
        result["replication"] = replication_cost(cluster, args)
    if "e2e" not in args.skip:
        result["end_to_end"] = [
            asyncio.run(end_to_end(cluster, args, rate, linger, mode))
            for rate in e2e_rates(args, result)
            for mode in args.e2e_producer_calls
            for linger in args.e2e_linger_ms
        ]
    broker_defaults = defaults(broker_config_table())
    result["broker_peak_rss_mb"] = {n.node_id: peak_rss_mb(n.pid) for n in cluster.brokers()}
    result["follower_fetch_bounds"] = {
        k: broker_defaults[k]
        for k in ("replica.fetch.max.bytes", "replica.fetch.response.max.bytes")
    }
    if "failover" not in args.skip and args.failover_trials > 0:
        result["failover"] = asyncio.run(failover(cluster, args))
        result["broker_peak_rss_mb_after_failover"] = {
            n.node_id: peak_rss_mb(n.pid) for n in cluster.brokers()
        }
    return result


def defaults(table: Any) -> dict[str, Any]:
    return {k.name: k.default for k in table.keys.values()}


def perf_produce(
    boot: str, topic: str, args: argparse.Namespace, acks: str, *extra: str
) -> dict[str, Any]:
    return rillet(
        boot,
        "perf",
        "produce",
        "--topic",
        topic,
        "--num-records",
        str(args.num_records),
        "--record-size",
        str(args.record_size),
        "--acks",
        acks,
        "--batch-size",
        str(args.batch_size),
        *extra,
    )


def create_topic(boot: str, topic: str, partitions: int, rf: int, *configs: str) -> None:
    extra = [a for c in configs for a in ("--config", c)]
    rillet(
        boot,
        "topic",
        "create",
        topic,
        "--partitions",
        str(partitions),
        "--replication-factor",
        str(rf),
        *extra,
    )


def throughput(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    boot = cluster.bootstrap
    create_topic(boot, "bench", args.partitions, args.replication_factor)
    cpu = brokers_cpu_seconds(cluster)
    produce = perf_produce(boot, "bench", args, args.acks)
    # The brokers' CPU for the whole produce, leaders and followers: steadier than the
    # rate on a shared machine, and what a broker-side change moves.
    produce["brokers_cpu_s"] = round(brokers_cpu_seconds(cluster) - cpu, 2)
    consume = rillet(
        boot, "perf", "consume", "--topic", "bench", "--num-records", str(args.num_records)
    )
    return {"produce": produce, "consume": consume}


def replication_cost(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    """RF=1 acks=1 against RF=3 acks=all (min.insync.replicas=2), same run, same sizes."""
    boot = cluster.bootstrap
    create_topic(boot, "rf1", args.partitions, 1)
    create_topic(boot, "rf3", args.partitions, 3, "min.insync.replicas=2")
    rf1 = perf_produce(boot, "rf1", args, "1")
    rf3 = perf_produce(boot, "rf3", args, "all")
    return {
        "rf1_acks1": rf1,
        "rf3_acks_all": rf3,
        "throughput_ratio_rf3_all_to_rf1_1": round(rf3["records_per_s"] / rf1["records_per_s"], 3),
    }


# --- end-to-end latency -------------------------------------------------------------------


async def e2e_producer(
    boot: str,
    topic: str,
    rate: float,
    seconds: float,
    size: float,
    linger_ms: float,
    mode: str,
    batch_size: int,
) -> None:
    """Child process: ``rate`` records/s for ``seconds``, acks=all: in 1 ms steps, the
    records due in a step go out with one ``produce()`` each (``mode`` "produce") or in
    one ``send_many`` call ("send_many", a third of the producer's CPU). Each value
    starts with the wall-clock time the record was *due* (start + i / rate), so a producer
    that falls behind its schedule shows in the latency, not in a lower rate. Prints one
    JSON line: the batches' open-to-acknowledged latency (the producer's share: linger,
    the request, the followers' fetches before acks=all answers), how far behind schedule
    the loop fell at worst, its collections and its CPU time."""
    pad = b"x" * max(0, int(size) - STAMP.size)
    total = int(rate * seconds)
    acked: list[tuple[float, int]] = []
    gc_pauses = GcPauses()
    async with Producer(
        bootstrap=boot, acks="all", linger_ms=linger_ms, batch_size=batch_size
    ) as producer:
        producer.on_batch_done = lambda n, s: acked.append((s, n))
        await producer.partitions_for(topic)
        produce, send_many, pack = producer.produce, producer.send_many, STAMP.pack
        bulk = mode == "send_many"
        wall0, mono0 = time.time(), time.monotonic()
        sent, behind = 0, 0.0
        while sent < total:
            now = time.monotonic() - mono0
            due = min(total, int(now * rate) + 1)
            behind = max(behind, now - sent / rate)
            if bulk:
                await send_many(topic, [pack(wall0 + i / rate) + pad for i in range(sent, due)])
            else:
                for i in range(sent, due):
                    await produce(topic, pack(wall0 + i / rate) + pad)
            sent = due
            await asyncio.sleep(0.001)
        await producer.flush()
    p50, p99, pmax = weighted_percentiles(acked, [0.5, 0.99, 1.0])
    print(
        json.dumps(
            {
                "batch_open_to_ack_ms": {
                    "p50": round(p50 * 1000, 2),
                    "p99": round(p99 * 1000, 2),
                    "max": round(pmax * 1000, 2),
                },
                "records_per_batch": round(total / max(1, len(acked)), 1),
                "max_behind_schedule_ms": round(behind * 1000, 2),
                "gc": gc_pauses.stop(),
                "cpu_s": round(time.process_time(), 2),
                "runqueue_wait_s": round(runqueue_wait_seconds([os.getpid()]), 2),
            }
        ),
        flush=True,
    )


class GcPauses:
    """Times every cyclic collection in this process (``gc.callbacks``): wall clock, and
    the thread's CPU time, since on a saturated machine a collection's wall time also
    counts the time the process waited for a core."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []  # (wall, cpu, generation)
        self._t0 = (0.0, 0.0)
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = (time.perf_counter(), time.thread_time())
        else:
            wall, cpu = time.perf_counter() - self._t0[0], time.thread_time() - self._t0[1]
            self.pauses.append((wall, cpu, info["generation"]))

    def stop(self) -> dict[str, Any]:
        gc.callbacks.remove(self._on_gc)
        return {
            "collections": [sum(1 for *_, g in self.pauses if g == gen) for gen in range(3)],
            "cpu_total_ms": round(sum(c for _, c, _ in self.pauses) * 1000, 1),
            "cpu_max_ms": round(max((c for _, c, _ in self.pauses), default=0.0) * 1000, 2),
            "wall_max_ms": round(max((w for w, _, _ in self.pauses), default=0.0) * 1000, 2),
        }


def e2e_rates(args: argparse.Namespace, result: dict[str, Any]) -> list[float]:
    """``--e2e-rate`` in records/s: a value up to 1 is a share of the RF=3 acks=all rate
    measured earlier in this run."""
    rf3 = result.get("replication", {}).get("rf3_acks_all")
    rates = []
    for r in args.e2e_rate:
        if r > 1:
            rates.append(r)
        elif rf3 is None:
            raise SystemExit("an --e2e-rate share of the maximum needs the replication run")
        else:
            rates.append(round(rf3["records_per_s"] * r))
    return rates


async def end_to_end(
    cluster: LocalCluster, args: argparse.Namespace, rate: float, linger_ms: float, mode: str
) -> dict[str, Any]:
    """One paced producer child against this process's consumer, on a fresh topic."""
    boot = cluster.bootstrap
    topic = f"e2e-{rate:g}-{mode}-linger-{linger_ms:g}"
    create_topic(boot, topic, args.partitions, 3, "min.insync.replicas=2")
    total = int(rate * args.e2e_seconds)
    # An array, not a list: the cyclic collector walks every item of a list on each full
    # collection, which with millions of latencies was the consumer's longest pause.
    latencies = array.array("d")
    metrics_before = await brokers_metrics(cluster)
    wall0 = time.monotonic()
    brokers_cpu, controllers_cpu = brokers_cpu_seconds(cluster), controllers_cpu_seconds(cluster)
    consumer_cpu = time.process_time()
    groups = {
        "brokers": [n.pid for n in cluster.brokers()],
        "controllers": [n.pid for n in cluster.controllers() if not n.is_broker],
        "consumer": [os.getpid()],
    }
    waits = {g: runqueue_wait_seconds(pids) for g, pids in groups.items()}
    gc_pauses = GcPauses()
    async with Consumer(topic, bootstrap=boot, from_beginning=True) as consumer:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "e2e-producer",
            boot,
            topic,
            str(rate),
            str(args.e2e_seconds),
            str(args.record_size),
            str(linger_ms),
            mode,
            str(args.e2e_batch_size),
            stdout=asyncio.subprocess.PIPE,
        )
        unpack = STAMP.unpack_from
        idle_deadline = time.monotonic() + 30
        # (how many latencies came before, arrival time) per getmany: the tail second by
        # second, for a transient (a start, a stall) hides in a run's one p99.
        arrivals: list[tuple[int, float]] = []
        while len(latencies) < total and time.monotonic() < idle_deadline:
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            arrivals.append((len(latencies), now))
            for recs in batch.values():
                latencies.extend([now - unpack(r.value)[0] for r in recs])
                idle_deadline = time.monotonic() + 30
        out, _ = await child.communicate()
    consumer_gc = gc_pauses.stop()
    waits = {g: round(runqueue_wait_seconds(groups[g]) - w, 2) for g, w in waits.items()}
    cpu = {
        "consumer": round(time.process_time() - consumer_cpu, 2),
        "brokers": round(brokers_cpu_seconds(cluster) - brokers_cpu, 2),
        "controllers": round(controllers_cpu_seconds(cluster) - controllers_cpu, 2),
    }
    metrics_after = await brokers_metrics(cluster)
    wall = time.monotonic() - wall0
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {
        "rate_records_per_sec": rate,
        "seconds": args.e2e_seconds,
        "acks": "all",
        "replication_factor": 3,
        "producer_linger_ms": linger_ms,
        "producer_batch_size": args.e2e_batch_size,
        "producer_calls": mode,
        "records_received": len(latencies),
        "records_sent": total,
        "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "p999": pct(0.999), "max": pct(1.0)},
        "p99_ms_by_second": p99_by_second(latencies, arrivals),
        "producer": json.loads(out.decode().splitlines()[-1]),
        "consumer_gc": consumer_gc,
        # CPU seconds over the run (the producer's are in "producer"); the machine has
        # os.cpu_count() * seconds to give.
        "cpu_s": cpu,
        # Seconds the processes' threads were ready to run but waited for a core.
        "runqueue_wait_s": waits,
        "broker_requests_per_s": requests_per_s(metrics_before, metrics_after, wall),
        # The brokers' largest event-loop stall since they started: a rise during this run
        # is a stall of this run.
        "broker_loop_lag_max_ms": {
            "before": {n: m.get("loop_lag_max_ms") for n, m in metrics_before.items()},
            "after": {n: m.get("loop_lag_max_ms") for n, m in metrics_after.items()},
        },
    }


def p99_by_second(latencies: array.array, arrivals: list[tuple[int, float]]) -> list[float | None]:
    """The p99 of the records consumed in each second of the run (by arrival; None for a
    second in which none arrived)."""
    if not arrivals:
        return []
    t0 = arrivals[0][1]
    cuts: list[int] = []  # where each second's latencies start
    for first, at in arrivals:
        while len(cuts) <= int(at - t0):
            cuts.append(first)
    cuts.append(len(latencies))
    out: list[float | None] = []
    for start, end in itertools.pairwise(cuts):
        window = sorted(latencies[start:end])
        out.append(round(window[int(0.99 * len(window))] * 1000, 1) if window else None)
    return out


async def brokers_metrics(cluster: LocalCluster) -> dict[int, dict[str, float]]:
    """Each broker's largest event-loop lag since start and its request counts per API,
    from its /metrics."""
    out: dict[int, dict[str, float]] = {}
    for node in cluster.brokers():
        if not node.metrics:
            continue
        host, port = node.metrics.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        body = (await reader.read()).decode()
        writer.close()
        mine = out[node.node_id] = {}
        for line in body.splitlines():
            if line.startswith("rillet_broker_event_loop_lag_max_ms "):
                mine["loop_lag_max_ms"] = round(float(line.split()[1]), 1)
            elif line.startswith("rillet_broker_request_latency_seconds_count{"):
                api = line.split('api="', 1)[1].split('"', 1)[0]
                mine[api] = float(line.rsplit(" ", 1)[1])
    return out


def requests_per_s(
    before: dict[int, dict[str, float]], after: dict[int, dict[str, float]], seconds: float
) -> dict[str, int]:
    """Requests a second over all brokers, per API, between two ``brokers_metrics``."""
    rates: dict[str, float] = {}
    for node, now in after.items():
        for api, count in now.items():
            if api != "loop_lag_max_ms":
                rates[api] = rates.get(api, 0.0) + (count - before[node].get(api, 0.0)) / seconds
    return {api: round(r) for api, r in sorted(rates.items()) if r >= 1}


# --- failover ----------------------------------------------------------------------------------


async def leader_of(admin: Admin, topic: str, partition: int) -> tuple[int, list[int], list[int]]:
    (desc,) = await admin.describe_topics([topic])
    p = desc.partitions[partition]
    return p.leader, list(p.replicas), list(p.isr)


async def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = await predicate()
        except RilletError:
            value = None  # a broker restarting or gone: ask again
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise SystemExit(f"benchmark: timed out waiting for {what}")


async def failover_trial(cluster: LocalCluster, admin: Admin, topic: str) -> dict[str, float]:
    """kill -9 the leader of partition 0; time until an acks=all send issued right after
    the kill succeeds, and until metadata (as a broker serves it) shows a new leader."""
    old, _, _ = await leader_of(admin, topic, 0)
    async with Producer(bootstrap=cluster.bootstrap, acks="all", linger_ms=0) as producer:
        await producer.send(topic, b"warm-up", partition=0)  # metadata and connection ready
        t0 = time.monotonic()
        cluster.stop_node(old, kill=True)  # SIGKILL, reaped at once
        moved: dict[str, float] = {}

        async def watch() -> None:
            async def new_leader() -> bool:
                leader, _, _ = await leader_of(admin, topic, 0)
                return leader not in (old, -1)

            await wait_for(new_leader, 120, "a new leader")
            moved["t"] = time.monotonic()

        watcher = asyncio.ensure_future(watch())
        await producer.send(topic, b"after-kill", partition=0)
        t_ok = time.monotonic()
        await watcher
    cluster.start_node(old)

    async def isr_full() -> bool:
        _, replicas, isr = await leader_of(admin, topic, 0)
        return sorted(replicas) == sorted(isr)

    await wait_for(isr_full, 120, "the restarted broker back in the ISR", 0.1)
    return {
        "to_acks_all_success_s": t_ok - t0,
        "to_new_leader_in_metadata_s": moved["t"] - t0,
        "client_after_new_leader_s": t_ok - moved["t"],
    }


async def failover(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    topic = "failover"
    create_topic(cluster.bootstrap, topic, 1, 3, "min.insync.replicas=2")
    controller = {**defaults(controller_config_table()), **_first_override(cluster)}
    trials: list[dict[str, float]] = []
    async with Admin(cluster.bootstrap) as admin:
        await wait_for(lambda: _isr_full(admin, topic), 60, "the failover topic's ISR", 0.1)
        for _ in range(args.failover_trials):
            trials.append(await failover_trial(cluster, admin, topic))

    def summary(key: str) -> dict[str, float]:
        values = [t[key] for t in trials]
        return {
            "median_s": round(statistics.median(values), 3),
            "max_s": round(max(values), 3),
            "min_s": round(min(values), 3),
        }

    return {
        "trials": len(trials),
        "broker.session.timeout.ms": controller["broker.session.timeout.ms"],
        "broker.heartbeat.interval.ms": defaults(broker_config_table())[
            "broker.heartbeat.interval.ms"
        ],
        "kill_to_acks_all_success": summary("to_acks_all_success_s"),
        "kill_to_new_leader_in_metadata": summary("to_new_leader_in_metadata_s"),
        "new_leader_to_client_success": summary("client_after_new_leader_s"),
        "each_s": [round(t["to_acks_all_success_s"], 3) for t in trials],
    }


async def _isr_full(admin: Admin, topic: str) -> bool:
    leader, replicas, isr = await leader_of(admin, topic, 0)
    return leader >= 0 and sorted(replicas) == sorted(isr)


def _first_override(cluster: LocalCluster) -> dict[str, Any]:
    """The controllers' overrides (the benchmark sets the same on each)."""
    for node in cluster.controllers():
        return dict(cluster.node_overrides.get(node.node_id, {}))
    return {}


if __name__ == "__main__":
    main()
