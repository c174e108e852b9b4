"""Listeners end to end (docs/broker.md, "Listeners"): three combined nodes, each with
an INTERNAL listener (the inter-broker one) and an EXTERNAL one advertised under
another name (``localhost`` rather than the bound 127.0.0.1). A client sees the
brokers at their addresses on the listener it came in on, produces and consumes with
acks=all through every leader, and followers replicate over INTERNAL only."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import combined_nodes
from helpers import wait_until, wait_until_async

from rillet.client.admin import Admin, NewTopic
from rillet.client.consumer import Consumer
from rillet.client.producer import Producer
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, parse_address
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

NODES = (1, 2, 3)
TOPIC = "spread"
# Each node leads one partition, and every node holds every partition.
ASSIGNMENTS = {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}
ADVERTISED = {"INTERNAL": "127.0.0.1", "EXTERNAL": "localhost"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from combined_nodes(
        tmp_path_factory.mktemp("listeners"),
        3,
        listeners=("INTERNAL", "EXTERNAL"),
        overrides={
            "inter.broker.listener.name": "INTERNAL",
            "advertised.listeners": "EXTERNAL://localhost:0",
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT"
            ),
            # A killed follower leaves the ISR soon (it is fenced sooner still).
            "replica.lag.time.max.ms": 3000,
        },
    )


def bound(cluster: LocalCluster, listener: str) -> dict[int, int]:
    """Each node's bound port on ``listener``."""
    return {n: parse_address(cluster.nodes[n].listeners[listener])[1] for n in NODES}


def bootstrap(cluster: LocalCluster, listener: str) -> str:
    host = ADVERTISED[listener]
    return ",".join(f"{host}:{port}" for port in bound(cluster, listener).values())


async def ask(cluster: LocalCluster, node: int, listener: str, message: Any) -> Any:
    host, port = parse_address(cluster.nodes[node].listeners[listener])
    async with await Connection.open(host, port) as conn:
        response, _ = await conn.call(message)
        return response


@pytest.mark.parametrize("listener", ["INTERNAL", "EXTERNAL"])
def test_a_client_sees_the_brokers_on_its_own_listener(
    cluster: LocalCluster, listener: str
) -> None:
    expected = {(n, ADVERTISED[listener], port) for n, port in bound(cluster, listener).items()}

    async def go() -> None:
        for node in NODES:
            meta = await ask(cluster, node, listener, m.MetadataRequest(topics=None))
            assert {(b.node_id, b.host, b.port) for b in meta.brokers} == expected
            desc = await ask(cluster, node, listener, m.DescribeClusterRequest())
            assert {(b.broker_id, b.host, b.port) for b in desc.brokers} == expected

        async def coordinator() -> m.Coordinator | None:
            found = await ask(cluster, 1, listener, m.FindCoordinatorRequest(["g"]))
            c = found.coordinators[0]
            return c if c.error_code == 0 else None

        c = await wait_until_async(coordinator, timeout=60, message="a group coordinator")
        assert (c.node_id, c.host, c.port) in expected

    asyncio.run(go())


def test_acks_all_through_every_leader_on_the_external_listener(cluster: LocalCluster) -> None:
    external = bootstrap(cluster, "EXTERNAL")

    async def go() -> None:
        async with Admin(external, timeout_ms=30_000) as admin:
            await admin.create_topics([NewTopic(TOPIC, assignments=ASSIGNMENTS)])

            async def leaders() -> bool:
                (topic,) = await admin.describe_topics([TOPIC])
                return {p.leader for p in topic.partitions} == set(NODES)

            await wait_until_async(leaders, timeout=60, message="a leader on every node")
        producer = await Producer(external, acks="all").start()
        try:
            for p in ASSIGNMENTS:
                meta = await producer.send_and_wait(TOPIC, f"v{p}".encode(), partition=p)
                assert meta.offset == 0
        finally:
            await producer.close()
        consumer = Consumer(
            assignment=[(TOPIC, p) for p in ASSIGNMENTS], bootstrap=external, from_beginning=True
        )
        await consumer.start()
        try:
            got: dict[int, bytes] = {}

            async def read_all() -> bool:
                for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                    got[tp.partition] = records[0].value
                return len(got) == len(ASSIGNMENTS)

            await wait_until_async(read_all, timeout=60, message="a record from each partition")
            assert got == {p: f"v{p}".encode() for p in ASSIGNMENTS}
        finally:
            await consumer.close()

    asyncio.run(go())


def remote_ports(pid: int) -> set[int]:
    """Remote ports of the established TCP connections process ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and fields[9] in inodes:  # ESTABLISHED, ours
                ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def test_followers_replicate_over_the_inter_broker_listener(cluster: LocalCluster) -> None:
    """Kill -9 a follower, write on, bring it back: it catches up through INTERNAL and
    rejoins every ISR, and no broker ever connects to another's EXTERNAL listener."""
    external = bootstrap(cluster, "EXTERNAL")
    victim = 3

    async def isrs(admin: Admin) -> dict[int, set[int]]:
        (topic,) = await admin.describe_topics([TOPIC])
        return {p.partition: set(p.isr) for p in topic.partitions}

    async def go() -> None:
        async with Admin(external, timeout_ms=30_000) as admin:
            await admin.create_topics([NewTopic("replicated", assignments=ASSIGNMENTS)])

            async def full() -> bool:
                return all(isr == set(NODES) for isr in (await isrs(admin)).values())

            await wait_until_async(full, timeout=60, message="full ISRs")
            cluster.stop_node(victim, kill=True)

            async def shrunk() -> bool:
                return all(victim not in isr for isr in (await isrs(admin)).values())

            await wait_until_async(shrunk, timeout=60, message=f"ISRs without {victim}")
            # The victim's partition has a new leader: acks=all works on each partition.
            producer = await Producer(external, acks="all").start()
            try:
                for p in ASSIGNMENTS:
                    await producer.send_and_wait("replicated", b"while away", partition=p)
            finally:
                await producer.close()
            cluster.start_node(victim)
            await wait_until_async(full, timeout=90, message=f"{victim} back in every ISR")

    asyncio.run(go())
    internal, external_ports = bound(cluster, "INTERNAL"), bound(cluster, "EXTERNAL")
    for node in NODES:
        pid = cluster.nodes[node].pid
        assert pid is not None
        peers = {n for n in NODES if n != node}
        # The restarted follower fetches from the leaders of 0 and 1 over INTERNAL.
        if node == victim:
            wait_until(
                lambda: {internal[1], internal[2]} <= remote_ports(pid),  # noqa: B023
                timeout=30,
                message="the follower's fetch connections to INTERNAL",
            )
        assert not remote_ports(pid) & {external_ports[n] for n in peers}
