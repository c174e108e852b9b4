"""The long fuzz run (marked slow; ``make fuzz-long``): a million hostile frames at a live
broker and a live controller while a well-behaved client keeps producing (acks=all) and
fetching.

Sent, spread over both nodes (tests/fuzz_frames.py makes them from the schemas):
pipelined requests of real APIs with hostile fields, frames that break the framing
(sizes over the limit or under the prefix, header sizes past the frame, headers that are
not maps, truncation), frames sent one byte at a time, and frames that announce 100 MiB,
send a little and stall. What must hold, and is asserted: both processes live and still
answer; their resident memory never grows past a stated bound (``RSS_GROWTH_BOUND``,
from the node's ``queued.max.request.bytes``); the good client's every produce succeeds
and it reads back all it wrote; no node logs a traceback (a handler failing on bad
input). Latency is reported, never asserted: the run prints the good client's p50/p99
before and during the fuzzing, the frames sent, and each node's RSS before, at its peak
and after.

``RILLET_FUZZ_FRAMES`` (default 1,000,000) sets the number of frames; ``RILLET_FUZZ_SEED``
the seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvloop
from fuzz_frames import hostile_request, malformed_frame
from helpers import rss_bytes

from rillet.client.wire import records, schemas
from rillet.client.wire.connection import Connection, parse_address
from rillet.client.wire.errors import RilletError, is_retriable
from rillet.client.wire.framing import encode_frame_bytes
from rillet.tools.local_cluster import LocalCluster, pid_alive

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

FRAMES = int(os.environ.get("RILLET_FUZZ_FRAMES", "1000000"))
SEED = int(os.environ.get("RILLET_FUZZ_SEED", "1"))
MAX_REQUEST_BYTES = 100 * 1024 * 1024
PARTIAL_BUDGET = 64 * 1024 * 1024  # queued.max.request.bytes of both nodes
# What a node may grow by: the partial-request budget, plus room for what is legitimately
# in flight (handlers' requests and answers, connection state, allocator slack).
RSS_GROWTH_BOUND = PARTIAL_BUDGET + 128 * 1024 * 1024
HOSTILE_WORKERS = 16  # per node
BATCH = 100  # hostile requests pipelined on one connection
BASELINE_ROUNDS = 300
DELIVERY_TIMEOUT_S = 120.0  # Kafka's delivery.timeout.ms
TOPIC = "good"
STALL_WARN_MS = 50
STALL = re.compile(r"event loop stalled for (\d+) ms")


class RssSampler:
    """Samples each node's VmRSS on a thread until stopped; keeps the peak."""

    def __init__(self, pids: dict[str, int], progress: Callable[[], float]) -> None:
        self.pids = pids
        self.progress = progress  # 0..1: RSS is also noted at every tenth of the run
        self.by_progress: dict[str, dict[str, float]] = {}
        self.peak = {name: rss_bytes(pid) for name, pid in pids.items()}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stopped.wait(0.1):
            now = {name: rss_bytes(pid) for name, pid in self.pids.items()}
            for name, value in now.items():
                self.peak[name] = max(self.peak[name], value)
            tenth = f"{min(10, int(self.progress() * 10)) * 10}%"
            if tenth not in self.by_progress:
                self.by_progress[tenth] = {k: round(v / 2**20, 1) for k, v in now.items()}

    def __enter__(self) -> RssSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()


class Fuzzer:
    def __init__(self, target: int, seed: int) -> None:
        self.target = target
        self.sent = 0
        self.kinds: dict[str, int] = {}
        self.rng = random.Random(seed)

    @property
    def done(self) -> bool:
        return self.sent >= self.target

    def count(self, kind: str, n: int = 1) -> None:
        self.sent += n
        self.kinds[kind] = self.kinds.get(kind, 0) + n

    async def hostile(self, port: int, apis: list[schemas.Api]) -> None:
        """Pipelined hostile requests, sometimes ended by a malformed frame; read answers
        until the node closes (it does once it answered a half-closed connection)."""
        rng = random.Random(self.rng.getrandbits(64))
        everything = list(schemas.APIS.values())
        while not self.done:
            frames = [
                hostile_request(rng, apis if rng.random() < 0.8 else everything)
                for _ in range(BATCH)
            ]
            if rng.random() < 0.3:
                frames.append(malformed_frame(rng, MAX_REQUEST_BYTES))
                self.count("malformed")
            self.count("hostile", BATCH)
            await self.exchange(port, b"".join(frames), read_s=2.0)

    async def exchange(self, port: int, data: bytes, read_s: float) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return  # refused (a connection cap) or the backlog is full: try again
        try:
            writer.write(data)
            writer.write_eof()
            async with asyncio.timeout(read_s):
                while await reader.read(1 << 20):
                    pass
        except (OSError, TimeoutError):
            pass
        finally:
            writer.transport.abort()

    async def slow(self, port: int) -> None:
        """Whole frames, valid and hostile, one byte per write."""
        rng = random.Random(self.rng.getrandbits(64))
        versions = encode_frame_bytes({"api": 18, "version": 0, "correlation_id": 1})
        while not self.done:
            frame = hostile_request(rng, long_waits=False)
            if len(frame) > 300 or rng.random() < 0.5:  # a byte a millisecond: keep it short
                frame = versions
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                for i in range(len(frame)):
                    writer.write(frame[i : i + 1])
                    await writer.drain()
                    await asyncio.sleep(0.001)
                self.count("slow")
                writer.write_eof()
                async with asyncio.timeout(5):
                    await reader.read()
                writer.transport.abort()
            except (OSError, TimeoutError):
                pass

    async def stall(self, port: int) -> None:
        """Announce a 100 MiB frame, send a little of it (up to 2 MiB), then stall until
        the node's request-read timeout cuts the connection."""
        rng = random.Random(self.rng.getrandbits(64))
        while not self.done:
            body = bytes(rng.choice([0, 10, 70_000, 1 << 20, 2 << 20]))
            self.count("stall")
            await self.exchange_open(port, struct.pack(">I", MAX_REQUEST_BYTES) + body)

    async def exchange_open(self, port: int, data: bytes) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        try:
            writer.write(data)
            async with asyncio.timeout(60):
                await reader.read()  # until the node cuts it
        except (OSError, TimeoutError):
            pass
        finally:
            writer.transport.abort()


class GoodClient:
    """Produce acks=all then fetch it back, one round after another, timing each. Like
    the real producer it retries retriable errors (a broker the controller fenced for a
    while answers NOT_LEADER_OR_FOLLOWER) for up to ``DELIVERY_TIMEOUT_S``, counting them;
    the latency of a round that retried includes its retries."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.produce_ms: list[float] = []
        self.fetch_ms: list[float] = []
        self.written: list[bytes] = []
        self.errors: list[str] = []
        self.retries: dict[int, int] = {}  # error code -> retries

    async def retrying(self, what: str, send: Callable[[], Awaitable[int]]) -> bool:
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while True:
            code = await send()
            if code == 0:
                return True
            if not is_retriable(code) or time.monotonic() > deadline:
                self.errors.append(f"{what}: error {code}")
                return False
            self.retries[code] = self.retries.get(code, 0) + 1
            await asyncio.sleep(0.05)

    async def round(self, conn: Connection, n: int) -> None:
        value = b"v%d" % n
        batch = records.encode_batch([value])
        fields = {"acks": -1, "timeout_ms": 30_000, "topics": [[TOPIC, [[0, len(batch)]]]]}
        offset = -1

        async def produce() -> int:
            nonlocal offset
            header, _ = await conn.request("Produce", fields, batch)
            result = header["topics"][0][1][0]
            offset = result[2]
            return int(result[1])

        start = time.perf_counter()
        if not await self.retrying(f"produce {n}", produce):
            return
        self.produce_ms.append((time.perf_counter() - start) * 1000)
        self.written.append(value)
        got: list[bytes] = []

        async def fetch() -> int:
            request = {
                "replica_id": -1,
                "max_wait_ms": 0,
                "min_bytes": 0,
                "max_bytes": 1 << 20,
                "topics": [[TOPIC, [[0, offset, -1, -1, 0, 1 << 20]]]],
            }
            header, payload = await conn.request("Fetch", request)
            got[:] = [r.value for r in records.decode_all(bytes(payload)) if r.offset == offset]
            return int(header["topics"][0][1][0][1])

        start = time.perf_counter()
        if not await self.retrying(f"fetch {n}", fetch):
            return
        self.fetch_ms.append((time.perf_counter() - start) * 1000)
        if got != [value]:
            self.errors.append(f"fetch {n} at {offset}: {got}")

    async def run(self, until: Callable[[], bool], rounds: int = 0) -> None:
        conn = await Connection.open(*parse_address(self.address))
        try:
            n = len(self.written)
            while not until() and (not rounds or n < rounds):
                try:
                    await self.round(conn, n)
                except RilletError as e:
                    self.errors.append(f"round {n}: {e!r}")
                    conn.close()
                    conn = await Connection.open(*parse_address(self.address))
                n += 1
        finally:
            await conn.aclose()

    def reset_times(self) -> None:
        self.produce_ms, self.fetch_ms = [], []


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    s = sorted(samples)
    pick = lambda q: round(s[min(len(s) - 1, int(q * len(s)))], 2)  # noqa: E731
    return {"n": len(s), "p50": pick(0.5), "p99": pick(0.99), "max": round(s[-1], 2)}


async def served_apis(port: int) -> list[schemas.Api]:
    conn = await Connection.open("127.0.0.1", port)
    try:
        keys = await conn.api_versions()
    finally:
        await conn.aclose()
    return [schemas.APIS[k] for k in keys if k in schemas.APIS]


def test_a_million_hostile_frames(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "cluster",
        controllers=1,
        brokers=1,
        ephemeral_ports=True,
        overrides={
            "queued.max.request.bytes": PARTIAL_BUDGET,
            "socket.request.read.timeout.ms": 5_000,
            # Every stall over this is logged: the run reports each node's longest.
            "event.loop.stall.warn.ms": STALL_WARN_MS,
        },
    )
    try:
        cluster.start()
        cluster.wait_ready()
        run_fuzz(cluster)
    finally:
        cluster.stop(kill=True, timeout_s=20)


def run_fuzz(cluster: LocalCluster) -> None:
    (broker,) = cluster.brokers()
    (controller,) = cluster.controllers()
    broker_port = parse_address(cluster.broker_address(broker.node_id))[1]
    controller_port = controller.controller_port
    assert broker.pid and controller.pid and controller_port
    pids = {"broker": broker.pid, "controller": controller.pid}
    good = GoodClient(cluster.broker_address(broker.node_id))
    fuzzer = Fuzzer(FRAMES, SEED)

    async def main() -> dict:
        conn = await Connection.open(*parse_address(good.address))
        header, _ = await conn.request(
            "CreateTopics", {"topics": [[TOPIC, 1, 1, [], {}]], "timeout_ms": 30_000}
        )
        assert header["topics"][0][1] == 0, header
        await conn.aclose()
        await good.run(lambda: False, rounds=BASELINE_ROUNDS)
        before = {"produce": percentiles(good.produce_ms), "fetch": percentiles(good.fetch_ms)}
        good.reset_times()
        rss_before = {name: rss_bytes(pid) for name, pid in pids.items()}
        apis = {
            broker_port: await served_apis(broker_port),
            controller_port: await served_apis(controller_port),
        }
        started = time.monotonic()
        with RssSampler(pids, lambda: fuzzer.sent / fuzzer.target) as sampler:
            workers = [good.run(lambda: fuzzer.done)]
            for port in (broker_port, controller_port):
                workers += [fuzzer.hostile(port, apis[port]) for _ in range(HOSTILE_WORKERS)]
                workers += [fuzzer.slow(port), fuzzer.stall(port), fuzzer.stall(port)]
            await asyncio.gather(*workers)
        elapsed = time.monotonic() - started
        during = {"produce": percentiles(good.produce_ms), "fetch": percentiles(good.fetch_ms)}
        rss_after = {name: rss_bytes(pid) for name, pid in pids.items()}
        for port in (broker_port, controller_port):  # both still answer
            assert await served_apis(port)
        return {
            "frames_sent": fuzzer.sent,
            "frames_by_kind": fuzzer.kinds,
            "seconds": round(elapsed, 1),
            "good_client_ms_before": before,
            "good_client_ms_during": during,
            "good_client_errors": good.errors[:10],
            "good_client_retries_by_error_code": good.retries,
            "rss_mib_by_progress": sampler.by_progress,
            "rss_mib": {
                name: {
                    "before": round(rss_before[name] / 2**20, 1),
                    "peak": round(sampler.peak[name] / 2**20, 1),
                    "after": round(rss_after[name] / 2**20, 1),
                }
                for name in pids
            },
            "rss_growth_bound_mib": RSS_GROWTH_BOUND >> 20,
        }

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        figures = runner.run(main())
    figures["longest_loop_stall_ms"] = {
        name: longest_stall_ms((cluster.node_dir(node.node_id) / "node.log").read_text())
        for name, node in (("broker", broker), ("controller", controller))
    }
    print("\nfuzz-long:", json.dumps(figures, indent=2))
    for name, pid in pids.items():
        assert pid_alive(pid), f"{name} died: {cluster.log_tail(broker.node_id)}"
        mib = figures["rss_mib"][name]
        assert (mib["peak"] - mib["before"]) * 2**20 < RSS_GROWTH_BOUND, figures
    assert figures["frames_sent"] >= FRAMES
    assert not good.errors, good.errors[:10]
    assert len(good.written) > BASELINE_ROUNDS
    for node_id in cluster.nodes:
        log = (cluster.node_dir(node_id) / "node.log").read_text(errors="replace")
        assert "Traceback" not in log, cluster.log_tail(node_id, 80)


def longest_stall_ms(log: str) -> float:
    """The longest event-loop stall a node's LoopLagMonitor warned of (0: none over
    ``STALL_WARN_MS``)."""
    return max((float(ms) for ms in STALL.findall(log)), default=0.0)
