"""Broker processes started from the node config contract (tests/cluster.py's fixture,
real processes on 127.0.0.1, ephemeral ports, always stopped): produce/fetch through the
real socket, errors and garbage frames, kill -9 and SIGTERM restarts, combined mode.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from helpers import fetch_records, wait_until

from rillet.client.wire import errors, records
from rillet.client.wire.connection import Connection, parse_address
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster
T = TypeVar("T")


def run(cluster: LocalCluster, node_id: int, body: Callable[[Connection], Awaitable[T]]) -> T:
    """Open a connection to a broker, run ``body`` on it, close it."""

    async def main() -> T:
        conn = await Connection.open(*parse_address(cluster.broker_address(node_id)))
        try:
            return await body(conn)
        finally:
            await conn.aclose()

    return asyncio.run(main())


async def create_topic(conn: Connection, name: str, partitions: int = 1) -> None:
    header, _ = await conn.request(
        "CreateTopics", {"topics": [[name, partitions, 1, [], {}]], "timeout_ms": 20_000}
    )
    assert header["topics"][0][1] == 0, header


async def produce(
    conn: Connection, topic: str, data: bytes, acks: int = 1, partition: int = 0
) -> list[Any]:
    header, _ = await conn.request(
        "Produce",
        {
            "acks": acks,
            "timeout_ms": 10_000,
            "topics": [[topic, [[partition, len(data)]]]],
        },
        data,
    )
    return header["topics"][0][1][0]


async def fetch_all(conn: Connection, topic: str, partition: int = 0) -> list[bytes]:
    return [r.value for r in await fetch_records(conn, topic, partition)]


def single_broker(cluster_factory: Callable[..., LocalCluster], **kw: Any) -> LocalCluster:
    return cluster_factory(controllers=1, brokers=1, **kw)


def test_round_trip_long_poll_and_acks(cluster_factory) -> None:
    cluster = single_broker(cluster_factory)

    async def body(conn: Connection) -> None:
        await create_topic(conn, "events", 2)
        header, _ = await conn.request("Metadata", {"topics": ["events"]})
        assert [p[2] for p in header["topics"][0][3]] == [1, 1]  # broker 1 leads both
        waiting = asyncio.ensure_future(
            conn.request(
                "Fetch",
                {
                    "replica_id": -1,
                    "max_wait_ms": 20_000,
                    "min_bytes": 1,
                    "max_bytes": 1 << 20,
                    "topics": [["events", [[1, 0, -1, -1, 0, 1 << 20]]]],
                },
            )
        )
        other = await Connection.open(conn.host, conn.port)
        try:
            data = records.encode_batch([b"zero"])
            fields = {"acks": 0, "timeout_ms": 1000, "topics": [["events", [[1, len(data)]]]]}
            other.send_oneway("Produce", fields, data)
            assert (await produce(other, "events", records.encode_batch([b"one"]), 1, 1))[2] == 1
            assert (await produce(other, "events", records.encode_batch([b"all"]), -1, 1))[2] == 2
        finally:
            await other.aclose()
        header, payload = await asyncio.wait_for(waiting, 20)
        assert [r.value for r in records.decode_all(bytes(payload))][0] == b"zero"
        assert await fetch_all(conn, "events", 1) == [b"zero", b"one", b"all"]

    run(cluster, 1, body)


def test_errors_through_the_socket_and_garbage_frames(cluster_factory) -> None:
    cluster = single_broker(cluster_factory, node_overrides={1: {"message.max.bytes": 4096}})
    code = errors.code_of

    async def body(conn: Connection) -> None:
        await create_topic(conn, "t")
        assert (await produce(conn, "nope", records.encode_batch([b"x"])))[1] == code(
            "UNKNOWN_TOPIC_OR_PARTITION"
        )
        big = records.encode_batch([b"x" * 10_000])
        assert (await produce(conn, "t", big))[1] == code("MESSAGE_TOO_LARGE")
        bad = bytearray(records.encode_batch([b"y"]))
        bad[-2] ^= 0x55
        assert (await produce(conn, "t", bytes(bad)))[1] == code("CORRUPT_MESSAGE")
        assert (await produce(conn, "t", records.encode_batch([b"good"])))[1:3] == [0, 0]

    run(cluster, 1, body)
    host, port = parse_address(cluster.broker_address(1))
    for garbage in (
        b"\x00\x00\x00\x02ab",
        struct.pack(">II", 1 << 30, 4),
        b"\xff" * 64,
        struct.pack(">II", 9, 5) + b"\xc1\xc1\xc1\xc1\xc1",
    ):
        send_and_drain(host, port, garbage)

    async def still_serving(conn: Connection) -> list[bytes]:
        return await fetch_all(conn, "t")

    assert run(cluster, 1, still_serving) == [b"good"]


def send_and_drain(host: str, port: int, data: bytes) -> None:
    """Send bytes, half-close, read until the broker closes (a reset is fine too)."""
    with socket.create_connection((host, port), timeout=10) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except OSError:
            pass


def test_wrong_leader_answers_not_leader(cluster_factory) -> None:
    cluster = cluster_factory(controllers=1, brokers=2)

    async def body(conn: Connection) -> tuple[int, int]:
        header, _ = await conn.request(
            "CreateTopics", {"topics": [["placed", -1, -1, [[0, [2]]], {}]], "timeout_ms": 20_000}
        )
        assert header["topics"][0][1] == 0, header
        header, _ = await conn.request("Metadata", {"topics": ["placed"]})
        leader = header["topics"][0][3][0][2]
        return leader, (await produce(conn, "placed", records.encode_batch([b"x"])))[1]

    leader, code = run(cluster, 1, body)
    assert leader == 2 and code == errors.code_of("NOT_LEADER_OR_FOLLOWER")


def _recoveries(cluster: LocalCluster, node_id: int) -> int:
    return cluster.log_tail(node_id, 100_000).count("recovered")


def test_kill9_mid_writes_keeps_acknowledged_data(cluster_factory) -> None:
    cluster = single_broker(cluster_factory)
    acked: list[bytes] = []

    async def write(conn: Connection) -> None:
        await create_topic(conn, "crash")
        for i in range(200):
            value = b"v%04d" % i
            r = await produce(conn, "crash", records.encode_batch([value]))
            assert r[1] == 0
            acked.append(value)

    run(cluster, 1, write)

    async def writer_forever(conn: Connection) -> None:
        i = 0
        while True:  # until the broker dies under us
            value = b"w%06d" % i
            try:
                r = await produce(conn, "crash", records.encode_batch([value]))
            except errors.RilletError:
                return
            if r[1] == 0:
                acked.append(value)
            i += 1
            if i == 50:
                cluster.signal_node(1, signal.SIGKILL)  # SIGKILL in the middle of the stream

    run(cluster, 1, writer_forever)
    cluster.stop_node(1, kill=True)
    cluster.start_node(1)
    cluster.wait_ready()
    values = wait_until(lambda: _read_or_none(cluster, "crash"), message="topic readable")
    assert values[: len(acked)] == acked  # every acknowledged write, in order
    assert _recoveries(cluster, 1) >= 1  # the unclean stop made it scan


def _read_or_none(cluster: LocalCluster, topic: str) -> list[bytes] | None:
    async def body(conn: Connection) -> list[bytes] | None:
        try:
            return await fetch_all(conn, topic)
        except AssertionError:
            return None  # not leader again yet

    return run(cluster, 1, body)


def test_a_restarted_broker_answers_only_once_its_metadata_caught_up(cluster_factory) -> None:
    """A broker binds before it has heard from the controllers (it registers with the
    port it bound). Answering then, from an empty metadata image, it told clients that
    existing topics did not exist (a flaky leadership test saw "topic 'auto' does not
    exist" from a broker just restarted). As a Kafka broker, it holds requests until its
    metadata has caught up with the quorum: here the quorum is down while the request
    is sent, and the answer that comes once it is back names the topic."""
    cluster = single_broker(cluster_factory)
    run(cluster, 1, lambda conn: create_topic(conn, "known"))
    (controller,) = (n.node_id for n in cluster.controllers())
    cluster.stop_node(1)
    cluster.stop_node(controller)
    cluster.start_node(1)  # listening; no quorum to catch up with

    async def body(conn: Connection) -> Any:
        asked = asyncio.ensure_future(
            conn.request("Metadata", {"topics": ["known"]}, timeout_ms=120_000)
        )
        await asyncio.get_running_loop().run_in_executor(None, cluster.start_node, controller)
        header, _ = await asked
        return header["topics"][0]

    error_code, name, _, partitions, _ = run(cluster, 1, body)
    assert (error_code, name, len(partitions)) == (0, "known", 1)


def test_sigterm_restart_needs_no_recovery(cluster_factory) -> None:
    cluster = single_broker(cluster_factory)

    async def write(conn: Connection) -> None:
        await create_topic(conn, "clean")
        for i in range(20):
            assert (await produce(conn, "clean", records.encode_batch([b"%d" % i])))[1] == 0

    run(cluster, 1, write)
    before = _recoveries(cluster, 1)
    cluster.stop_node(1)  # SIGTERM: controlled shutdown, clean-shutdown markers
    assert "controlled shutdown completed" in cluster.log_tail(1, 200)
    cluster.start_node(1)
    cluster.wait_ready()
    values = wait_until(lambda: _read_or_none(cluster, "clean"), message="topic readable")
    assert values == [b"%d" % i for i in range(20)]
    assert _recoveries(cluster, 1) == before


def test_combined_mode_node(cluster_factory) -> None:
    cluster = cluster_factory(controllers=1, brokers=0, combined=True)
    (node,) = cluster.nodes.values()
    assert set(node.listeners) == {"BROKER", "CONTROLLER"}

    async def body(conn: Connection) -> list[bytes]:
        await create_topic(conn, "both")
        assert (await produce(conn, "both", records.encode_batch([b"a", b"b"]), -1))[1] == 0
        header, _ = await conn.request("DescribeCluster", {})
        assert header["controller_id"] == node.node_id
        return await fetch_all(conn, "both")

    assert run(cluster, node.node_id, body) == [b"a", b"b"]
