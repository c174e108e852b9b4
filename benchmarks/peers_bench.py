"""rillet next to Redis Streams and NATS JetStream on the same work, in one run; prints JSON.

It installs nothing: each peer runs when its server is on the PATH and its client
library imports, and is reported as skipped (with what to install) otherwise::

    apt-get install redis-server nats-server     # Debian's packages
    pip install -e '.[peers]'                    # redis and nats-py

Every system runs on this machine, on loopback, in temporary directories, started and
stopped here. Records are ``--record-size`` bytes. The work:

- ``produce``: one producer, one partition/stream, nothing replicated. rillet: ``rillet
  perf produce`` (one broker, RF 1, acks=1). Redis: ``XADD`` pipelined in batches of
  ``--batch`` (no persistence). JetStream: async publishes, ``--batch`` awaiting acks at
  a time (R1, file storage).
- ``consume``: one consumer reading everything the produce wrote. rillet: ``rillet perf
  consume``. Redis: ``XREAD COUNT --batch``. JetStream: a pull consumer fetching
  ``--batch`` at a time, acknowledging each batch's last message (AckAll).
- ``replicated``: durable writes. rillet: 3 brokers, RF 3, acks=all,
  ``min.insync.replicas=2``. JetStream: a 3-node cluster, R3. Redis has no synchronous
  replication; it runs with ``appendonly yes`` and ``appendfsync everysec`` (the
  closest it comes to not losing acknowledged writes on one machine).

Latency, two ways. In the throughput runs, each record's time from send to
acknowledgement (a saturated producer, so it is queueing as much as service, and the
queues differ: rillet's producer keeps its buffer in flight, the peers' clients
``--batch`` records). And ``at_rate``: the durable writes again at a fixed
``--latency-rate`` records/s for ``--latency-seconds``, one send call per record
without waiting for answers (rillet's producer with ``linger_ms=1``, Redis's asyncio
client, JetStream publishes), each record's latency counted from when it was due:
the like-for-like figure. The ratios divide rillet's records/s by each peer's.

    python benchmarks/peers_bench.py [--records 200000] [--rillet-records 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_bench import create_topic, rillet  # noqa: E402 - the same rillet steps

from rillet.tools.local_cluster import LocalCluster, free_port  # noqa: E402

HOST = "127.0.0.1"


def percentiles(latencies_s: list[float]) -> dict[str, float]:
    qs = statistics.quantiles(latencies_s, n=100, method="inclusive")
    return {"p50": round(qs[49] * 1000, 2), "p99": round(qs[98] * 1000, 2)}


async def paced(send: Callable[[], Awaitable[Any]], rate: int, seconds: float) -> dict[str, float]:
    """Send ``rate`` records a second for ``seconds``, one call each, without waiting
    for answers; each record's latency runs from when it was due (not when it was
    sent), so a sender that falls behind shows it. p50/p99 in ms, and the rate held."""
    latencies: list[float] = []
    pending: set[asyncio.Future[None]] = set()

    async def one(due: float) -> None:
        await send()
        latencies.append(time.perf_counter() - due)

    total = int(rate * seconds)
    start = time.perf_counter()
    sent = 0
    while sent < total:
        now = time.perf_counter()
        while sent < total and start + sent / rate <= now:
            task = asyncio.ensure_future(one(start + sent / rate))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
        await asyncio.sleep(0.0005)
    await asyncio.gather(*pending)
    held = total / (time.perf_counter() - start)
    return {"rate": rate, "held_records_per_s": round(held), **_ms(latencies)}


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout_s} s")


@contextmanager
def processes(cmds: list[list[str]], ports: list[int], cwd: Path):  # noqa: ANN201
    procs = [
        subprocess.Popen(c, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for c in cmds
    ]
    try:
        for port in ports:
            wait_port(port)
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# --- rillet ------------------------------------------------------------------------


def bench_rillet(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    n, size = str(args.rillet_records), str(args.record_size)
    out: dict[str, Any] = {}
    for name, brokers in (("single", 1), ("replicated", 3)):
        cluster = LocalCluster(root / name, controllers=1, brokers=brokers, ephemeral_ports=True)
        try:
            cluster.start()
            cluster.wait_ready()
            boot = cluster.bootstrap
            if brokers == 1:
                create_topic(boot, "bench", 1, 1)
                out["produce"] = _perf_produce(boot, n, size, "1")
                consume = rillet(boot, "perf", "consume", "--topic", "bench", "--num-records", n)
                out["consume"] = {"records_per_s": consume["records_per_s"]}
            else:
                create_topic(boot, "bench", 1, 3, "min.insync.replicas=2")
                out["replicated"] = _perf_produce(boot, n, size, "all")
                create_topic(boot, "paced", 1, 3, "min.insync.replicas=2")
                out["replicated"]["at_rate"] = asyncio.run(_rillet_paced(boot, args))
        finally:
            cluster.stop(kill=True, timeout_s=20)
    return out


async def _rillet_paced(boot: str, args: argparse.Namespace) -> dict[str, float]:
    from rillet.client.producer import Producer

    value = b"x" * args.record_size
    async with Producer(bootstrap=boot, acks="all", linger_ms=1) as producer:
        await producer.send("paced", value)  # metadata and connections first
        return await paced(
            lambda: producer.send("paced", value), args.latency_rate, args.latency_seconds
        )


def _perf_produce(boot: str, records: str, size: str, acks: str) -> dict[str, Any]:
    result = rillet(boot, "perf", "produce", "--topic", "bench", "--num-records", records,
                    "--record-size", size, "--acks", acks)  # fmt: skip
    lat = result["latency_ms"]
    return {"records_per_s": result["records_per_s"], "p50_ms": lat["p50"], "p99_ms": lat["p99"]}


# --- Redis Streams -------------------------------------------------------------------


def bench_redis(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import redis

    value = b"x" * args.record_size
    out: dict[str, Any] = {}
    for name, persistence in (
        ("single", ["--appendonly", "no"]),
        ("replicated", ["--appendonly", "yes", "--appendfsync", "everysec"]),
    ):
        port = free_port()
        work = root / f"redis-{name}"
        work.mkdir()
        cmd = [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            HOST,
            "--save",
            "",
            "--dir",
            str(work),
            *persistence,
        ]
        with processes([cmd], [port], work):
            r = redis.Redis(host=HOST, port=port)
            rate, lat = _redis_produce(r, value, args.records, args.batch)
            result = {"records_per_s": round(rate), **_ms(lat)}
            if name == "single":
                out["produce"] = result
                out["consume"] = {"records_per_s": round(_redis_consume(r, args))}
            else:
                out["replicated"] = {**result, "note": "appendfsync everysec, not replicated"}
                out["replicated"]["at_rate"] = asyncio.run(_redis_paced(port, args))
            r.close()
    return out


def _redis_produce(r: Any, value: bytes, records: int, batch: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    start = time.perf_counter()
    sent = 0
    while sent < records:
        k = min(batch, records - sent)
        pipe = r.pipeline(transaction=False)
        t0 = time.perf_counter()
        for _ in range(k):
            pipe.xadd("bench", {"v": value})
        pipe.execute()
        latencies.extend([time.perf_counter() - t0] * k)  # every record of the batch
        sent += k
    return records / (time.perf_counter() - start), latencies


async def _redis_paced(port: int, args: argparse.Namespace) -> dict[str, float]:
    import redis.asyncio as aredis

    value = {"v": b"x" * args.record_size}
    pool = aredis.BlockingConnectionPool(host=HOST, port=port, max_connections=64)
    r = aredis.Redis(connection_pool=pool)  # waits for a free connection, never refuses
    try:
        await r.xadd("paced", value)
        return await paced(lambda: r.xadd("paced", value), args.latency_rate, args.latency_seconds)
    finally:
        await r.aclose()


def _redis_consume(r: Any, args: argparse.Namespace) -> float:
    last, got = "0", 0
    start = time.perf_counter()
    while got < args.records:
        reply = r.xread({"bench": last}, count=args.batch)
        entries = reply[0][1]
        got += len(entries)
        last = entries[-1][0]
    return got / (time.perf_counter() - start)


def _ms(latencies: list[float]) -> dict[str, float]:
    p = percentiles(latencies)
    return {"p50_ms": p["p50"], "p99_ms": p["p99"]}


# --- NATS JetStream ------------------------------------------------------------------


def bench_nats(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    port = free_port()
    work = root / "nats-single"
    work.mkdir()
    cmd = ["nats-server", "-a", HOST, "-p", str(port), "-js", "-sd", str(work)]
    with processes([cmd], [port], work):
        produce, consume = asyncio.run(_nats_run(args, [port], replicas=1, consume=True))
        out["produce"], out["consume"] = produce, consume
    ports = [free_port() for _ in range(3)]
    routes = [free_port() for _ in range(3)]
    route_urls = ",".join(f"nats://{HOST}:{p}" for p in routes)
    cmds = []
    for i in range(3):
        node = root / f"nats-r3-{i}"
        node.mkdir()
        cmds.append(
            [
                "nats-server",
                "-a",
                HOST,
                "-p",
                str(ports[i]),
                "-js",
                "-sd",
                str(node),
                "-n",
                f"n{i}",
                "--cluster_name",
                "bench",
                "--cluster",
                f"nats://{HOST}:{routes[i]}",
                "--routes",
                route_urls,
            ]
        )
    with processes(cmds, ports, root):
        produce, _ = asyncio.run(_nats_run(args, ports, replicas=3, consume=False))
        out["replicated"] = produce
    return out


async def _nats_run(
    args: argparse.Namespace, ports: list[int], *, replicas: int, consume: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

    nc = await nats.connect([f"nats://{HOST}:{p}" for p in ports])
    try:
        js = nc.jetstream(timeout=30)
        setup = nc.jetstream(timeout=2)  # a request sent before the cluster is ready is lost
        deadline = time.monotonic() + 60
        while True:  # a new cluster elects its meta leader first
            try:
                config = StreamConfig(name="bench", subjects=["bench"], num_replicas=replicas)
                await setup.add_stream(config)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        value = b"x" * args.record_size
        latencies: list[float] = []

        async def one() -> None:
            t0 = time.perf_counter()
            await js.publish("bench", value)
            latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        sent = 0
        while sent < args.records:
            k = min(args.batch, args.records - sent)
            await asyncio.gather(*(one() for _ in range(k)))
            sent += k
        produce = {
            "records_per_s": round(args.records / (time.perf_counter() - start)),
            **_ms(latencies),
        }
        if replicas == 3:
            produce["at_rate"] = await paced(
                lambda: js.publish("bench", value), args.latency_rate, args.latency_seconds
            )
        consumed: dict[str, Any] = {}
        if consume:
            # AckAll: acknowledging a batch's last message acknowledges the batch (with
            # explicit acks the server stops at max_ack_pending unacknowledged).
            config = ConsumerConfig(ack_policy=AckPolicy.ALL)
            sub = await js.pull_subscribe("bench", "reader", config=config)
            got = 0
            start = time.perf_counter()
            while got < args.records:
                msgs = await sub.fetch(args.batch, timeout=10)
                got += len(msgs)
                await msgs[-1].ack()
            consumed = {"records_per_s": round(got / (time.perf_counter() - start))}
        return produce, consumed
    finally:
        await nc.close()


# --- the run ---------------------------------------------------------------------------


PEERS: dict[str, tuple[list[str], str, Callable[[argparse.Namespace, Path], dict[str, Any]]]] = {
    "redis_streams": (["redis-server"], "redis", bench_redis),
    "nats_jetstream": (["nats-server"], "nats", bench_nats),
}


def missing(binaries: list[str], module: str) -> str | None:
    absent = [b for b in binaries if shutil.which(b) is None]
    try:
        __import__(module)
    except ImportError:
        absent.append(f"python module {module}")
    if absent:
        return (
            f"skipped: {', '.join(absent)} missing (apt-get install redis-server "
            "nats-server; pip install -e '.[peers]')"
        )
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="per peer run")
    parser.add_argument("--rillet-records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000, help="peers' pipeline/fetch size")
    parser.add_argument(
        "--latency-rate", type=int, default=5000, help="records/s of the paced durable writes"
    )
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "record_size": args.record_size,
        "cpus": os.cpu_count(),
        "machine": os.uname().machine,
    }
    with tempfile.TemporaryDirectory(prefix="rillet-peers-") as tmp:
        root = Path(tmp)
        result["rillet"] = bench_rillet(args, root)
        for name, (binaries, module, bench) in PEERS.items():
            why = missing(binaries, module)
            result[name] = {"skipped": why} if why else bench(args, root)
    ratios: dict[str, float] = {}
    for name in PEERS:
        peer = result[name]
        for work in ("produce", "consume", "replicated"):
            if work in peer and peer[work].get("records_per_s"):
                ours = result["rillet"][work]["records_per_s"]
                ratios[f"{work}_vs_{name}"] = round(ours / peer[work]["records_per_s"], 2)
    result["rillet_ratio"] = ratios
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
