"""A BrokerServer in this process against hand-made metadata (a fake controller link):
the request handlers through a real socket, without controller processes.

The fake link replays metadata records into a MetadataDelta exactly as the metadata
follower would, and answers CreateTopics/DeleteTopics by writing the records the
controller would. Process-level tests (kill -9, SIGTERM, combined mode) are in
test_broker_process.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until_async

from rillet.broker.config import BrokerConfig, broker_config_table
from rillet.broker.link.alter_partition_manager import Proposal
from rillet.broker.replication.types import AlterPartitionResponse
from rillet.broker.server import BrokerServer, MetadataListener
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection
from rillet.controller.metadata.image import (
    Config,
    Endpoint,
    MetadataDelta,
    MetadataImage,
    MetadataRecord,
    Partition,
    RegisterBroker,
    RemoveTopic,
    Topic,
    UnfenceBroker,
)

RESOURCE_TOPIC = 2


class FakeLink:
    """Plays the controller: registers the broker, 'commits' records, answers forwards."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.image = MetadataImage()
        self.on_metadata: MetadataListener | None = None
        self.offset = 0
        self.shutdown_requested = False

    async def start(self, endpoints: list[tuple[str, str, int]], on_metadata: MetadataListener):
        self.on_metadata = on_metadata
        eps = tuple(Endpoint(*e) for e in endpoints)
        await self.commit(
            [
                RegisterBroker(self.node_id, uuid.uuid4().hex, 1, eps, None),
                UnfenceBroker(self.node_id, 1),
            ]
        )

    async def commit(self, recs: list[MetadataRecord]) -> None:
        delta = MetadataDelta(self.image)
        for rec in recs:
            self.offset += 1
            delta.replay(rec, self.offset, 1)
        self.image = delta.apply()
        assert self.on_metadata is not None
        await self.on_metadata(delta, self.image)

    async def create_topic(self, name: str, partitions: int = 1, **configs: str) -> None:
        topic_id = uuid.uuid4().hex
        recs: list[MetadataRecord] = [Topic(name, topic_id)]
        recs += [Config(RESOURCE_TOPIC, name, k.replace("_", "."), v) for k, v in configs.items()]
        recs += [
            Partition(topic_id, p, (self.node_id,), (self.node_id,), self.node_id, 0, 0)
            for p in range(partitions)
        ]
        await self.commit(recs)

    def controller_id(self) -> int:
        return 100

    async def forward(self, message: Any) -> Any:
        if isinstance(message, m.CreateTopicsRequest):
            created = []
            for t in message.topics:
                n = t.num_partitions
                if self.image.topic(t.name) is not None:
                    exists = errors.code_of("TOPIC_ALREADY_EXISTS")
                    created.append(m.CreatableTopicResult(t.name, exists, "exists", n, 1))
                    continue
                await self.create_topic(
                    t.name, max(n, 1), **{k.replace(".", "_"): v for k, v in t.configs.items()}
                )
                created.append(m.CreatableTopicResult(t.name, 0, None, n, 1))
            return m.CreateTopicsResponse(topics=created)
        if isinstance(message, m.DeleteTopicsRequest):
            deleted = []
            for name in message.topic_names:
                t = self.image.topic(name)
                if t is None:
                    unknown = errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")
                    deleted.append(m.DeletableTopicResult(name, unknown, None))
                    continue
                await self.commit([RemoveTopic(t.topic_id)])
                deleted.append(m.DeletableTopicResult(name, 0, None))
            return m.DeleteTopicsResponse(responses=deleted)
        raise AssertionError(message)

    async def alter_partitions(self, batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        return [AlterPartitionResponse(errors.code_of("OPERATION_NOT_ATTEMPTED"))] * len(batch)

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        self.shutdown_requested = True
        return True

    async def stop(self) -> None:
        pass


def broker_config(log_dir: Path, *overrides: str) -> BrokerConfig:
    table = broker_config_table()
    values = table.load(
        None,
        [
            "node.id=1",
            "listeners=BROKER://127.0.0.1:0",
            f"log.dirs={log_dir}",
            "replica.tick.interval.ms=20",
            *overrides,
        ],
    )
    return BrokerConfig.from_config(values)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[tuple[BrokerServer, FakeLink]]:
    link = FakeLink(1)
    server = BrokerServer(broker_config(tmp_path / "logs", "message.max.bytes=2000"), link=link)
    await server.start()
    try:
        yield server, link
    finally:
        await server.stop()


@pytest.fixture
async def conn(broker: tuple[BrokerServer, FakeLink]) -> AsyncIterator[Connection]:
    server, _ = broker
    c = await Connection.open("127.0.0.1", server.port)
    try:
        yield c
    finally:
        await c.aclose()


def batch(*values: bytes, ts: int = 1000) -> bytes:
    return records.encode_batch(list(values), timestamp_ms=ts)


async def produce(
    conn: Connection, topic: str, partition: int, data: bytes, acks: int = 1, timeout_ms: int = 5000
) -> list[Any]:
    header, _ = await conn.request(
        "Produce",
        {"acks": acks, "timeout_ms": timeout_ms, "topics": [[topic, [[partition, len(data)]]]]},
        data,
    )
    return header["topics"][0][1][0]


async def fetch(
    conn: Connection,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    max_bytes: int = 1 << 20,
    partition_max_bytes: int = 1 << 20,
) -> tuple[list[Any], bytes]:
    header, payload = await conn.request(
        "Fetch",
        {
            "replica_id": -1,
            "max_wait_ms": max_wait_ms,
            "min_bytes": min_bytes,
            "max_bytes": max_bytes,
            "topics": [[topic, [[partition, offset, -1, -1, 0, partition_max_bytes]]]],
        },
    )
    return header["topics"][0][1][0], bytes(payload)


def values_of(payload: bytes, from_offset: int = 0) -> list[bytes]:
    return [r.value for r in records.decode_all(payload) if r.offset >= from_offset]


async def test_produce_then_fetch_round_trip(broker, conn) -> None:
    _, link = broker
    await link.create_topic("t", 2)
    r = await produce(conn, "t", 0, batch(b"a", b"b"))
    assert r[:3] == [0, 0, 0]
    r = await produce(conn, "t", 0, batch(b"c"))
    assert r[:3] == [0, 0, 2]
    row, payload = await fetch(conn, "t", 0, 0)
    assert row[1] == 0 and row[2] == 3  # high watermark
    assert values_of(payload) == [b"a", b"b", b"c"]
    row, payload = await fetch(conn, "t", 0, 2)
    assert values_of(payload, 2) == [b"c"]
    row, payload = await fetch(conn, "t", 1, 0)
    assert row[1] == 0 and payload == b""


async def test_the_log_knows_its_high_watermark(broker, conn) -> None:
    # Retention and compaction read it from the log (storage stops at the HW).
    server, link = broker
    await link.create_topic("t", 1)
    await produce(conn, "t", 0, batch(b"a", b"b"))
    log = server.logs.get("t", 0)
    assert log is not None and log.high_watermark == 2
    await produce(conn, "t", 0, batch(b"c"), acks=-1)
    assert log.high_watermark == 3


async def test_pipelined_produces_land_in_send_order(broker, conn) -> None:
    _, link = broker
    await link.create_topic("order")
    sends = [produce(conn, "order", 0, batch(b"%d" % i)) for i in range(50)]
    results = await asyncio.gather(*sends)
    assert [r[2] for r in results] == list(range(50))
    _, payload = await fetch(conn, "order", 0, 0)
    assert values_of(payload) == [b"%d" % i for i in range(50)]


async def test_long_poll_fetch_wakes_on_append(broker, conn) -> None:
    server, link = broker
    await link.create_topic("lp")
    waiting = asyncio.ensure_future(fetch(conn, "lp", 0, 0, max_wait_ms=30_000, min_bytes=1))
    replica = server.replicas.replicas[("lp", 0)]
    await wait_until_async(lambda: replica.hw_waiters, message="the fetch to park")
    other = await Connection.open("127.0.0.1", server.port)
    try:
        await produce(other, "lp", 0, batch(b"wake"))
    finally:
        await other.aclose()
    row, payload = await asyncio.wait_for(waiting, 10)
    assert values_of(payload) == [b"wake"]


async def test_fetch_with_nothing_new_answers_empty_after_max_wait(broker, conn) -> None:
    _, link = broker
    await link.create_topic("quiet")
    row, payload = await fetch(conn, "quiet", 0, 0, max_wait_ms=50, min_bytes=1)
    assert row[1] == 0 and payload == b""


async def test_acks_zero_sends_no_response_and_acks_all_single_replica(broker, conn) -> None:
    _, link = broker
    await link.create_topic("acks")
    data = batch(b"zero")
    conn.send_oneway(
        "Produce", {"acks": 0, "timeout_ms": 1000, "topics": [["acks", [[0, len(data)]]]]}, data
    )
    r = await produce(conn, "acks", 0, batch(b"all"), acks=-1)
    assert r[:3] == [0, 0, 1]  # the acks=0 batch came first and got no answer
    _, payload = await fetch(conn, "acks", 0, 0)
    assert values_of(payload) == [b"zero", b"all"]


async def test_produce_errors_per_partition(broker, conn) -> None:
    _, link = broker
    await link.create_topic("e")
    await link.create_topic("small", max_message_bytes="100")
    await link.create_topic("isr2", min_insync_replicas="2")
    code = errors.code_of
    assert (await produce(conn, "nope", 0, batch(b"x")))[1] == code("UNKNOWN_TOPIC_OR_PARTITION")
    assert (await produce(conn, "e", 7, batch(b"x")))[1] == code("UNKNOWN_TOPIC_OR_PARTITION")
    big = batch(b"x" * 3000)  # broker message.max.bytes is 2000 here
    assert (await produce(conn, "e", 0, big))[1] == code("MESSAGE_TOO_LARGE")
    assert (await produce(conn, "small", 0, batch(b"y" * 200)))[1] == code("MESSAGE_TOO_LARGE")
    corrupt = bytearray(batch(b"z"))
    corrupt[-1] ^= 0xFF
    assert (await produce(conn, "e", 0, bytes(corrupt)))[1] == code("CORRUPT_MESSAGE")
    assert (await produce(conn, "isr2", 0, batch(b"w"), acks=-1))[1] == code("NOT_ENOUGH_REPLICAS")
    assert (await produce(conn, "isr2", 0, batch(b"w"), acks=1))[1] == 0
    assert (await produce(conn, "e", 0, batch(b"x"), acks=2))[1] == code("INVALID_REQUIRED_ACKS")
    # Nothing bad was written: the only record is the good one.
    assert (await produce(conn, "e", 0, batch(b"ok")))[:3] == [0, 0, 0]


async def test_not_leader_when_another_broker_leads(broker, conn) -> None:
    _, link = broker
    topic_id = uuid.uuid4().hex
    await link.commit(
        [
            RegisterBroker(2, "other", 5, (Endpoint("BROKER", "127.0.0.1", 1),), None),
            Topic("theirs", topic_id),
            Partition(topic_id, 0, (2, 1), (2, 1), 2, 3, 0),
            Partition(topic_id, 1, (2,), (2,), 2, 0, 0),
        ]
    )
    code = errors.code_of("NOT_LEADER_OR_FOLLOWER")
    assert (await produce(conn, "theirs", 0, batch(b"x")))[1] == code  # we follow it
    assert (await produce(conn, "theirs", 1, batch(b"x")))[1] == code  # not a replica
    # A follower serves consumers too (fetch from follower, KIP-392), below its HW;
    # a broker that holds no replica does not.
    row, _ = await fetch(conn, "theirs", 0, 0)
    assert row[1] == errors.NONE
    row, _ = await fetch(conn, "theirs", 1, 0)
    assert row[1] == code


async def test_fetch_offset_out_of_range_and_byte_limits(broker, conn) -> None:
    _, link = broker
    await link.create_topic("r")
    for i in range(5):
        await produce(conn, "r", 0, batch(b"v" * 100, ts=1000 + i))
    row, _ = await fetch(conn, "r", 0, 99)
    assert row[1] == errors.code_of("OFFSET_OUT_OF_RANGE")
    one = len(batch(b"v" * 100))
    row, payload = await fetch(conn, "r", 0, 0, partition_max_bytes=2 * one)
    assert len(payload) == 2 * one and row[7] == 2 * one
    row, payload = await fetch(conn, "r", 0, 0, partition_max_bytes=1)
    assert len(payload) == one  # at least one whole batch, to make progress


async def test_list_offsets(broker, conn) -> None:
    _, link = broker
    await link.create_topic("lo")
    for i in range(3):
        await produce(conn, "lo", 0, batch(b"x", ts=1000 * (i + 1)))

    async def lookup(ts: int) -> list[Any]:
        header, _ = await conn.request("ListOffsets", {"topics": [["lo", [[0, -1, ts]]]]})
        return header["topics"][0][1][0]

    assert (await lookup(-2))[3] == 0
    assert (await lookup(-1))[3] == 3
    assert (await lookup(2000))[2:4] == [2000, 1]
    assert (await lookup(2500))[3] == 2
    assert (await lookup(9999))[3] == -1


async def test_metadata_describe_create_delete(broker, conn) -> None:
    server, link = broker
    header, _ = await conn.request(
        "CreateTopics", {"topics": [["made", 3, 1, [], {}]], "timeout_ms": 5000}
    )
    assert header["topics"][0][1] == 0
    header, _ = await conn.request("Metadata", {"topics": None})
    assert header["brokers"] == [[1, "127.0.0.1", server.port, None]]
    assert header["controller_id"] == 100
    (topic,) = header["topics"]
    assert topic[0] == 0 and topic[1] == "made"
    assert [p[1:6] for p in topic[3]] == [[i, 1, 0, [1], [1]] for i in range(3)]
    header, _ = await conn.request(
        "Metadata", {"topics": ["ghost"], "allow_auto_topic_creation": True}
    )
    assert header["topics"][0][0] == errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")  # off
    # Each topic once, in the order first named: a repeated name is no more work.
    header, _ = await conn.request("Metadata", {"topics": ["made", "ghost"] * 10_000})
    assert [t[1] for t in header["topics"]] == ["made", "ghost"]
    header, _ = await conn.request("DescribeCluster", {})
    assert header["brokers"] == [[1, "127.0.0.1", server.port, None, False]]
    await produce(conn, "made", 0, batch(b"x"))
    log_dir = server.replicas.replicas[("made", 0)].log.directory
    header, _ = await conn.request("DeleteTopics", {"topic_names": ["made"], "timeout_ms": 5000})
    assert header["responses"] == [["made", 0, None]]
    assert ("made", 0) not in server.replicas.replicas
    assert not log_dir.exists()


async def test_metrics_count_bytes_and_latency(broker, conn) -> None:
    server, link = broker
    await link.create_topic("m")
    data = batch(b"a", b"b", b"c")
    await produce(conn, "m", 0, data)
    await fetch(conn, "m", 0, 0)
    snap = server.metrics.snapshot()
    assert snap["bytes_in_total"] == len(data)
    assert snap["messages_in_total"] == 3
    assert snap["bytes_out_total"] == len(data)
    assert snap["request_latency"]["Produce"]["count"] == 1
    assert snap["under_replicated_partitions"] == 0


async def test_a_fetch_past_the_fd_cache_bound_sends_every_partition(broker, conn) -> None:
    """One fetch of more partitions than the fd cache may hold open: the first ranges go
    out from their descriptors, the rest as bytes read at once (storage/fdcache.py), and
    the answer carries every partition's records, in its rows' order."""
    server, link = broker
    assert server.logs is not None
    server.logs.fd_cache.max_open = 1
    await link.create_topic("wide", 6)
    for p in range(6):
        assert (await produce(conn, "wide", p, batch(b"v%d" % p)))[1] == 0
    header, payload = await conn.request(
        "Fetch",
        {
            "replica_id": -1,
            "max_wait_ms": 0,
            "min_bytes": 0,
            "max_bytes": 1 << 20,
            "topics": [["wide", [[p, 0, -1, -1, 0, 1 << 20] for p in range(6)]]],
        },
    )
    rows = header["topics"][0][1]
    assert [row[0] for row in rows] == list(range(6)) and all(row[1] == 0 for row in rows)
    assert values_of(bytes(payload)) == [b"v%d" % p for p in range(6)]


async def test_group_apis_are_served_and_answered(broker, conn) -> None:
    # Every group API is listed by ApiVersions and each sample request gets an answer,
    # never a dropped connection (tests/test_group_broker.py checks what they answer).
    from test_group_messages import SAMPLES, api_and_direction

    requests = [s for s in SAMPLES if api_and_direction(s)[1]]
    assert len(requests) == 8
    served = await conn.api_versions()
    assert {api_and_direction(r)[0].key for r in requests} <= set(served)
    for request in requests:
        response, _ = await conn.call(request, raise_errors=False)
        assert type(response).__name__ == type(request).__name__.replace("Request", "Response")
    _, link = broker  # and the same connection still serves the rest
    await link.create_topic("after-groups")
    assert (await produce(conn, "after-groups", 0, batch(b"x")))[:3] == [0, 0, 0]


async def test_each_listener_answers_with_its_own_endpoints(tmp_path: Path) -> None:
    """Two listeners, EXTERNAL advertised under another host: Metadata, DescribeCluster
    and FindCoordinator name the brokers on the listener asked, and leave out a broker
    without it (docs/broker.md, "Listeners")."""
    link = FakeLink(1)
    config = broker_config(
        tmp_path / "logs",
        "listeners=INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "inter.broker.listener.name=INTERNAL",
        "advertised.listeners=EXTERNAL://localhost:0",
    )
    server = BrokerServer(config, link=link)
    await server.start()
    try:
        ports = server.rpc.ports  # type: ignore[union-attr]
        assert set(server.listeners) == {"INTERNAL", "EXTERNAL"}
        assert server.port == ports["INTERNAL"]
        assert link.image.brokers[1].endpoints == (
            Endpoint("INTERNAL", "127.0.0.1", ports["INTERNAL"]),
            Endpoint("EXTERNAL", "localhost", ports["EXTERNAL"]),
        )
        other = RegisterBroker(2, "b2", 1, (Endpoint("INTERNAL", "10.0.0.2", 9092),), None)
        await link.commit([other, UnfenceBroker(2, 1)])
        await link.create_topic("__consumer_offsets", 1)
        expected = {
            "INTERNAL": {(1, "127.0.0.1", ports["INTERNAL"]), (2, "10.0.0.2", 9092)},
            "EXTERNAL": {(1, "localhost", ports["EXTERNAL"])},  # 2 has no EXTERNAL
        }
        for listener, brokers in expected.items():
            async with await Connection.open("127.0.0.1", ports[listener]) as c:
                meta, _ = await c.call(m.MetadataRequest(topics=None))
                assert {(b.node_id, b.host, b.port) for b in meta.brokers} == brokers
                desc, _ = await c.call(m.DescribeClusterRequest())
                assert {(b.broker_id, b.host, b.port) for b in desc.brokers} == brokers
                found, _ = await c.call(m.FindCoordinatorRequest(["g"]))
                (coordinator,) = found.coordinators
                assert (coordinator.node_id, coordinator.host, coordinator.port) in brokers
                assert coordinator.node_id == 1
    finally:
        await server.stop()
