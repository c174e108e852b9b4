"""Controller quorum benchmark: three controller processes on loopback; prints JSON.

- ``writes_per_s``: committed metadata writes (BrokerRegistration of new ids, one Raft
  entry each) per second, ``--in-flight`` requests pipelined on one connection.
- ``failover_ms``: kill -9 of the active controller -> first write committed by the new
  one, over ``--trials`` trials (probes every 10 ms to each survivor directly, so client
  backoff does not count). The killed node restarts and catches up between trials.
  ``failover_ms_waiting_out_the_timeout``: the same on a second quorum with
  ``quorum.prevote.on.leader.loss.enable=false`` (followers wait out the election
  timeout, as before it existed), and ``failover_median_ratio`` the two medians' ratio.
- ``rss_mib``: resident memory of each controller with an image of ``--partitions``
  partitions (3 fake brokers, rf 3).
- ``follower_catch_up_ms``: a broker-side MetadataFollower starting empty, loading the
  snapshot and the entries after it, until it reaches the high watermark.

    .venv/bin/python benchmarks/controller_bench.py [--trials 10] [--partitions 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rillet.broker.link.controller_client import (
    BrokerLifecycle,
    ControllerChannel,
    MetadataFollower,
)
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection
from rillet.client.wire.errors import RilletError


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Quorum:
    def __init__(
        self,
        root: Path,
        election_timeout_ms: int,
        snapshot_records: int,
        extra: dict[str, object] | None = None,
    ) -> None:
        self.root = root
        self.ports = dict(zip((1, 2, 3), free_ports(3), strict=True))
        self.voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in self.ports.items())
        self.sets = {
            "quorum.election.timeout.ms": election_timeout_ms,
            "metadata.snapshot.max.records": snapshot_records,
            "log.level": "WARNING",
            **(extra or {}),
        }
        self.procs: dict[int, subprocess.Popen[str]] = {}

    def start(self, node: int) -> None:
        sets = {
            **self.sets,
            "node.id": node,
            "controller.quorum.voters": self.voters,
            "metadata.log.dir": self.root / f"c{node}",
        }
        cmd = [sys.executable, "-m", "rillet.client.cli", "controller"]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the readiness line
        if '"listening"' not in line:
            raise RuntimeError(f"controller {node} did not start: {line!r}")
        self.procs[node] = proc

    def kill(self, node: int) -> None:
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()

    def rss_mib(self, node: int) -> float:
        for line in Path(f"/proc/{self.procs[node].pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
        return -1.0


async def status(port: int) -> m.DescribeQuorumResponse | None:
    try:
        conn = await Connection.open("127.0.0.1", port, connect_timeout_ms=500)
    except RilletError:
        return None
    try:
        response, _ = await conn.call(m.DescribeQuorumRequest(), timeout_ms=1000)
        return response
    except RilletError:
        return None
    finally:
        conn.close()


async def active(q: Quorum) -> int:
    while True:
        views = [await status(q.ports[n]) for n in q.procs]
        leaders = [v.node_id for v in views if v and v.active]
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.02)


async def caught_up(q: Quorum, node: int) -> None:
    while True:
        leader = await active(q)
        mine, theirs = await status(q.ports[node]), await status(q.ports[leader])
        if mine and theirs and mine.applied_offset >= theirs.applied_offset:
            return
        await asyncio.sleep(0.05)


def registration(broker_id: int) -> m.BrokerRegistrationRequest:
    return m.BrokerRegistrationRequest(
        broker_id=broker_id,
        cluster_id="",
        incarnation_id=f"b{broker_id}",
        listeners=[m.Listener("BROKER", "127.0.0.1", 1)],
    )


async def measure_writes(q: Quorum, seconds: float, in_flight: int) -> float:
    channel = ControllerChannel(q.voters)
    next_id = 100_000
    done = 0
    end = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal next_id, done
        while time.monotonic() < end:
            next_id += 1
            await channel.call(registration(next_id))
            done += 1

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.monotonic() - start
    await channel.close()
    return round(done / elapsed, 1)


async def probe_write(port: int, broker_id: int) -> bool:
    try:
        conn = await Connection.open("127.0.0.1", port, connect_timeout_ms=200)
    except RilletError:
        return False
    try:
        response, _ = await conn.call(registration(broker_id), raise_errors=False, timeout_ms=3000)
        return response.error_code == 0
    except RilletError:
        return False
    finally:
        conn.close()


async def one_failover(q: Quorum, trial: int) -> float:
    leader = await active(q)
    survivors = [q.ports[n] for n in q.procs if n != leader]
    t0 = time.monotonic()
    q.kill(leader)
    broker_id = 500_000 + trial * 10_000
    while True:
        broker_id += 1
        results = await asyncio.gather(
            *(probe_write(p, broker_id + i * 1000) for i, p in enumerate(survivors))
        )
        if any(results):
            elapsed_ms = (time.monotonic() - t0) * 1000
            break
        await asyncio.sleep(0.01)
    q.start(leader)
    await caught_up(q, leader)
    return round(elapsed_ms, 1)


async def build_image(q: Quorum, partitions: int) -> list:
    """3 fake brokers kept alive by heartbeats, then topics of 100 partitions, rf 3."""
    keep = []
    for b in (1, 2, 3):
        follower = MetadataFollower(ControllerChannel(q.voters), b, max_wait_ms=500)
        follower.start()
        lifecycle = BrokerLifecycle(
            ControllerChannel(q.voters),
            b,
            [("BROKER", "127.0.0.1", b)],
            lambda f=follower: f.image.offset,
        )
        await lifecycle.start()
        keep += [follower, lifecycle]
    for lifecycle in keep[1::2]:
        await lifecycle.wait_for(lambda s: not s.fenced)
    admin = ControllerChannel(q.voters)
    per_topic = 100
    for t in range(partitions // per_topic):
        topic = m.CreatableTopic(f"topic-{t}", per_topic, 3, [], {})
        created, _ = await admin.call(m.CreateTopicsRequest([topic], timeout_ms=5000))
        assert created.topics[0].error_code == 0, created
    await admin.close()
    return keep


async def follower_catch_up_ms(q: Quorum) -> tuple[float, int]:
    probe = ControllerChannel(q.voters)
    response, _ = await probe.call(
        m.FetchMetadataRequest(
            broker_id=-1,
            broker_epoch=-1,
            fetch_offset=10**12,
            last_fetched_epoch=-1,
            max_wait_ms=0,
            max_bytes=1,
        )
    )
    target = response.high_watermark
    follower = MetadataFollower(probe, max_wait_ms=0)
    start = time.monotonic()
    while follower.image.offset < target:
        await follower.fetch_once()
    elapsed = (time.monotonic() - start) * 1000
    await probe.close()
    assert follower.snapshots_loaded == 1, "the follower should start from a snapshot"
    return round(elapsed, 1), follower.image.partition_count()


async def main(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        q = Quorum(Path(tmp), args.election_timeout_ms, args.snapshot_records)
        try:
            for node in (1, 2, 3):
                q.start(node)
            await active(q)
            writes = await measure_writes(q, args.seconds, args.in_flight)
            trials = [await one_failover(q, t) for t in range(args.trials)]
            keep = await build_image(q, args.partitions)
            leader = await active(q)
            for node in q.procs:
                await caught_up(q, node)
            rss = {str(n): q.rss_mib(n) for n in sorted(q.procs)}
            catch_up_ms, parts = await follower_catch_up_ms(q)
            for item in keep:
                await item.stop()
        finally:
            q.stop_all()
        # The same trials with the followers waiting out the election timeout (the
        # behaviour before quorum.prevote.on.leader.loss.enable), in the same run.
        off = Quorum(
            Path(tmp) / "without",
            args.election_timeout_ms,
            args.snapshot_records,
            {"quorum.prevote.on.leader.loss.enable": "false"},
        )
        try:
            for node in (1, 2, 3):
                off.start(node)
            await active(off)
            trials_off = [await one_failover(off, t) for t in range(args.trials)]
        finally:
            off.stop_all()
    return {
        "writes_per_s": writes,
        "in_flight": args.in_flight,
        "failover_ms": {
            "median": statistics.median(trials),
            "max": max(trials),
            "min": min(trials),
            "trials": trials,
        },
        "failover_ms_waiting_out_the_timeout": {
            "median": statistics.median(trials_off),
            "max": max(trials_off),
            "min": min(trials_off),
            "trials": trials_off,
        },
        "failover_median_ratio": round(
            statistics.median(trials) / statistics.median(trials_off), 3
        ),
        "election_timeout_ms": args.election_timeout_ms,
        "rss_mib": rss,
        "rss_leader_mib": rss[str(leader)],
        "partitions": parts,
        "follower_catch_up_ms": catch_up_ms,
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--election-timeout-ms", type=int, default=1000)
    parser.add_argument("--snapshot-records", type=int, default=5000)
    import uvloop

    print(json.dumps(uvloop.run(main(parser.parse_args())), indent=2))
