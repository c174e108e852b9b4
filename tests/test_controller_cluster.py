"""A real three-controller quorum on loopback: elections, kill -9 failover without losing
acknowledged writes, restart and wiped-disk catch-up (snapshot install), broker fencing
through the RPC, and FetchMetadata below the compacted log start.

One quorum serves the module (starting processes costs seconds on this 2-core machine);
every test leaves it whole, restarting what it killed, and uses its own broker ids and
topic names, so the tests do not depend on their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from helpers import ServerProcess, start_server_process, wait_until_async

from rillet.broker.link.controller_client import (
    BrokerLifecycle,
    ControllerChannel,
    MetadataFollower,
)
from rillet.client.wire import messages as m
from rillet.client.wire import schemas
from rillet.client.wire.connection import Connection
from rillet.client.wire.errors import RilletError

pytestmark = pytest.mark.cluster

READY_PATTERN = r'"CONTROLLER": "[^"]+:(\d+)"'
SNAPSHOT_EVERY = 25  # records: small, so the tests cross several compactions
DEADLINE_S = 60.0  # generous: elections and restarts on a busy shared machine


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Quorum:
    """Three controller processes; ``start(i)``, ``kill(i)`` (SIGKILL), ``wipe(i)``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = dict(zip((1, 2, 3), free_ports(3), strict=True))
        self.voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in self.ports.items())
        self.procs: dict[int, ServerProcess] = {}

    def log_dir(self, node: int) -> Path:
        return self.root / f"controller-{node}"

    def start(self, node: int) -> None:
        sets = {
            "node.id": node,
            "controller.quorum.voters": self.voters,
            "metadata.log.dir": self.log_dir(node),
            "metadata.snapshot.max.records": SNAPSHOT_EVERY,
            "broker.session.timeout.ms": 1500,
            "broker.heartbeat.interval.ms": 200,
        }
        command = [sys.executable, "-m", "rillet.client.cli", "controller"]
        for key, value in sets.items():
            command += ["--set", f"{key}={value}"]
        self.procs[node] = start_server_process(command, port_pattern=READY_PATTERN)

    def kill(self, node: int) -> None:
        proc = self.procs.pop(node).proc
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def wipe(self, node: int) -> None:
        shutil.rmtree(self.log_dir(node))

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.proc.kill()
            proc.proc.wait(10)
        self.procs.clear()

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n" + "\n".join(p.output[-30:]) for n, p in self.procs.items())

    def channel(self) -> ControllerChannel:
        return ControllerChannel(self.voters, request_timeout_ms=2000)


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quorum]:
    q = Quorum(tmp_path_factory.mktemp("quorum"))
    try:
        for node in (1, 2, 3):
            q.start(node)
        yield q
    finally:
        q.stop_all()


@pytest.fixture
async def channel(quorum: Quorum) -> AsyncIterator[ControllerChannel]:
    ch = quorum.channel()
    yield ch
    await ch.close()


async def status(quorum: Quorum, node: int) -> dict | None:
    """DescribeQuorum of one node (None while it is down or unreachable)."""
    try:
        conn = await Connection.open("127.0.0.1", quorum.ports[node], connect_timeout_ms=1000)
    except RilletError:
        return None
    try:
        header, _ = await conn.request(schemas.DESCRIBE_QUORUM, {}, timeout_ms=2000)
        return header
    except RilletError:
        return None
    finally:
        conn.close()


async def active_controller(quorum: Quorum) -> int:
    """Wait until exactly one live node is the active controller and the others follow it."""

    async def one_leader() -> int | None:
        views = [await status(quorum, n) for n in quorum.procs]
        if any(v is None for v in views):
            return None
        active = [v for v in views if v["active"]]
        leaders = {v["leader_id"] for v in views}
        if len(active) == 1 and leaders == {active[0]["node_id"]}:
            return active[0]["node_id"]
        return None

    return await wait_until_async(
        one_leader, DEADLINE_S, 0.05, message=lambda: "one active controller\n" + quorum.logs()
    )


async def caught_up(quorum: Quorum, node: int) -> None:
    leader = await active_controller(quorum)

    async def reached() -> bool:
        mine, theirs = await status(quorum, node), await status(quorum, leader)
        return bool(
            mine
            and theirs
            and mine["applied_offset"] >= theirs["applied_offset"]
            and mine["cluster_id"] == theirs["cluster_id"]
        )

    await wait_until_async(
        reached, DEADLINE_S, 0.05, message=lambda: f"node {node} catching up\n" + quorum.logs()
    )


async def register(channel: ControllerChannel, broker_id: int) -> int:
    header, _ = await channel.request(
        schemas.BROKER_REGISTRATION,
        {
            "broker_id": broker_id,
            "cluster_id": "",
            "incarnation_id": f"inc-{broker_id}",
            "listeners": [["BROKER", "127.0.0.1", 20_000 + broker_id]],
        },
        deadline_ms=int(DEADLINE_S * 1000),
    )
    return header["broker_epoch"]


async def registered_brokers(channel: ControllerChannel) -> dict[int, bool]:
    header, _ = await channel.request(schemas.DESCRIBE_CLUSTER, {})
    return {b[0]: b[4] for b in header["brokers"]}  # id -> fenced


async def test_one_leader_then_kill_9_loses_no_acknowledged_write(
    quorum: Quorum, channel: ControllerChannel
) -> None:
    first = await active_controller(quorum)
    acked: list[int] = []
    killed = asyncio.Event()

    async def writer() -> None:
        broker_id = 1000
        while not (killed.is_set() and len(acked) >= 60):
            await register(channel, broker_id)
            acked.append(broker_id)  # acknowledged: the record committed
            broker_id += 1

    task = asyncio.create_task(writer())
    try:
        await wait_until_async(lambda: len(acked) >= 30 or task.done(), DEADLINE_S)
        quorum.kill(first)  # under the stream of writes
        killed.set()
        await asyncio.wait_for(task, DEADLINE_S)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, RilletError):
            await task
    second = await active_controller(quorum)
    assert second != first
    brokers = await registered_brokers(channel)
    assert set(acked) <= set(brokers), sorted(set(acked) - set(brokers))
    quorum.start(first)  # same directory: rejoins as a follower and catches up
    await caught_up(quorum, first)
    await active_controller(quorum)


async def test_controller_with_wiped_disk_rejoins_from_a_snapshot(
    quorum: Quorum, channel: ControllerChannel
) -> None:
    leader = await active_controller(quorum)
    for broker_id in range(2000, 2000 + 2 * SNAPSHOT_EVERY):  # forces a compaction
        await register(channel, broker_id)
    follower = next(n for n in sorted(quorum.procs) if n != leader)
    quorum.kill(follower)
    quorum.wipe(follower)
    quorum.start(follower)
    await caught_up(quorum, follower)
    view = await status(quorum, follower)
    assert view is not None and view["snapshot_index"] > 0  # installed from the leader


async def test_fetch_metadata_below_the_log_start_returns_the_snapshot(
    quorum: Quorum, channel: ControllerChannel
) -> None:
    await active_controller(quorum)
    for broker_id in range(3000, 3000 + 2 * SNAPSHOT_EVERY):
        await register(channel, broker_id)
    header, _ = await channel.request(
        schemas.FETCH_METADATA,
        {
            "broker_id": -1,
            "broker_epoch": -1,
            "fetch_offset": 1,
            "last_fetched_epoch": -1,
            "max_wait_ms": 0,
            "max_bytes": 1 << 20,
        },
    )
    assert header["log_start_offset"] > 1 and header["snapshot_id"] is not None
    follower = MetadataFollower(quorum.channel(), max_wait_ms=100)
    follower.start()
    try:
        await asyncio.wait_for(follower.wait_for_offset(header["high_watermark"]), DEADLINE_S)
    finally:
        await follower.stop()
        await follower.channel.close()
    assert follower.snapshots_loaded >= 1
    assert set(range(3000, 3000 + 2 * SNAPSHOT_EVERY)) <= set(follower.image.brokers)


@contextlib.asynccontextmanager
async def unfenced_brokers(
    quorum: Quorum, ids: tuple[int, ...]
) -> AsyncIterator[dict[int, BrokerLifecycle]]:
    """Registered, unfenced brokers (heartbeats and metadata only; no logs): yields each
    broker's lifecycle, so a test may stop one."""
    await active_controller(quorum)
    followers = {b: MetadataFollower(quorum.channel(), b, max_wait_ms=200) for b in ids}
    lifecycles = {
        b: BrokerLifecycle(
            quorum.channel(),
            b,
            [("BROKER", "127.0.0.1", 30_000 + b)],
            lambda b=b: followers[b].image.offset,
            heartbeat_interval_ms=200,
        )
        for b in ids
    }
    try:
        for b in ids:
            followers[b].start()
            await lifecycles[b].start()
        for b in ids:  # unfenced once their metadata caught up with their registration
            await asyncio.wait_for(lifecycles[b].wait_for(lambda s: not s.fenced), DEADLINE_S)
        yield lifecycles
    finally:
        for b in ids:
            await lifecycles[b].stop()
            await followers[b].stop()
            await lifecycles[b].channel.close()
            await followers[b].channel.close()


async def test_broker_that_stops_heartbeating_is_fenced_and_loses_its_leaderships(
    quorum: Quorum,
) -> None:
    ids = (4001, 4002, 4003)
    admin = quorum.channel()
    try:
        async with unfenced_brokers(quorum, ids) as lifecycles:
            # each leads one partition
            assignments = [m.ReplicaAssignment(p, list(ids[p:] + ids[:p])) for p in range(3)]
            topic = m.CreatableTopic("fencing", -1, -1, assignments, {})
            created, _ = await admin.call(m.CreateTopicsRequest([topic], timeout_ms=5000))
            assert created.topics[0].error_code == 0, created
            victim = ids[0]
            await lifecycles[victim].stop()  # silent from now on: the session expires

            async def moved_off() -> bool:
                brokers = await registered_brokers(admin)
                header, _ = await admin.request(schemas.METADATA, {"topics": ["fencing"]})
                parts = header["topics"][0][3]
                return brokers[victim] and all(p[2] != victim and victim not in p[5] for p in parts)

            await wait_until_async(moved_off, DEADLINE_S, 0.05, message="leadership moved off")
            for b in ids[1:]:
                assert not lifecycles[b].state.fenced
    finally:
        await admin.close()


async def test_sigterm_hands_leadership_over_before_exiting(quorum: Quorum) -> None:
    leader = await active_controller(quorum)
    proc = quorum.procs.pop(leader)
    assert proc.stop() == 0  # SIGTERM: clean exit
    assert any("handing leadership" in line for line in proc.output), "\n".join(proc.output)
    new_leader = await active_controller(quorum)
    assert new_leader != leader
    quorum.start(leader)
    await caught_up(quorum, leader)
