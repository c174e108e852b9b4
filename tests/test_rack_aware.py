"""Rack-aware fetching (KIP-392) with real processes: 1 controller + 3 brokers in racks
a, b, c, one partition replicated on all three and led by the rack-a broker.

- The leader names the rack-b broker as preferred read replica to a rack-b consumer (and
  nobody to a rack-a or rack-less one), with no records in that answer.
- A consumer with ``client_rack="b"`` gets its records from the rack-b follower: the
  follower's log says it served consumer fetches, and the consumer's per-broker byte
  counts show nothing came from the leader.
- It never reads above that follower's high watermark: with the rack-c follower paused
  (its lag and session timeouts are long, so it stays in the ISR) acks=1 writes reach
  the rack-b follower's log but not the HW, and the follower serves only up to its HW.
- What it reads equals what the leader serves, record for record.
- A follower that cannot serve answers OFFSET_OUT_OF_RANGE / FENCED_LEADER_EPOCH /
  NOT_LEADER_OR_FOLLOWER; when the preferred replica dies the consumer goes back to the
  leader and reads everything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from helpers import wait_until, wait_until_async

from rillet.client.admin import Admin, NewTopic
from rillet.client.consumer import Consumer, ConsumerRecord
from rillet.client.producer import Producer
from rillet.client.wire import errors, records, schemas
from rillet.client.wire.connection import Connection, parse_address
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

T = TypeVar("T")
RACKS = ["a", "b", "c"]  # brokers 1, 2, 3
LEADER, RACK_B, RACK_C = 1, 2, 3
CONTROLLER = 101
TOPIC = "racked"
# Long lag and session timeouts: a paused follower stays in the ISR, so the HW stays put
# while it is paused (the test relies on that, not on any timing).
BROKER_SETTINGS = {
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 100,
    "broker.heartbeat.interval.ms": 250,
}
LONG_MS = 120_000


def rack_cluster(
    cluster_factory: Callable[..., LocalCluster], session_ms: int = LONG_MS
) -> LocalCluster:
    """``session_ms`` short: a killed broker is fenced (and leaves the ISR) soon."""
    broker = {**BROKER_SETTINGS, "replica.lag.time.max.ms": min(session_ms, LONG_MS)}
    overrides: dict[int, dict[str, Any]] = {b: dict(broker) for b in (1, 2, 3)}
    overrides[CONTROLLER] = {
        "broker.session.timeout.ms": session_ms,
        "broker.heartbeat.interval.ms": 250,
    }
    return cluster_factory(controllers=1, brokers=3, racks=RACKS, node_overrides=overrides)


def boot(cluster: LocalCluster) -> str:
    """The leader's address only: a paused broker in the bootstrap list would hang a
    client's first metadata request."""
    return cluster.broker_address(LEADER)


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


# --- raw requests ------------------------------------------------------------------------


async def raw_fetch(
    cluster: LocalCluster,
    node: int,
    offset: int,
    *,
    rack: str = "",
    epoch: int = -1,
    topic: str = TOPIC,
) -> tuple[list[Any], memoryview]:
    """One consumer Fetch, no waiting: (the partition's result row, its bytes)."""
    conn = await Connection.open(*parse_address(cluster.broker_address(node)))
    try:
        header, payload = await conn.request(
            schemas.FETCH,
            {
                "replica_id": -1,
                "max_wait_ms": 0,
                "min_bytes": 1,
                "max_bytes": 50 << 20,
                "topics": [[topic, [[0, offset, -1, epoch, -1, 50 << 20]]]],
                "rack_id": rack,
            },
        )
    finally:
        conn.close()
    row = header["topics"][0][1][0]
    return row, payload[: row[7]]


def offsets_in(data: memoryview) -> list[int]:
    out: list[int] = []
    for pos, h in records.iter_batches(data):
        out += records.decode_columns(data, pos, h)[0]
    return out


def log_end_on_disk(cluster: LocalCluster, node: int, partition: int = 0) -> int:
    """The next offset of a broker's log for the partition, read from its segment files
    (complete batches only; the broker keeps writing meanwhile)."""
    end = 0
    for segment in sorted((cluster.node_dir(node) / "logs" / f"{TOPIC}-{partition}").glob("*.log")):
        data = memoryview(segment.read_bytes())
        for _, h in records.iter_batches(data, validate=False):
            end = h.base_offset + h.last_offset_delta + 1
    return end


def node_log(cluster: LocalCluster, node: int) -> str:
    return (cluster.node_dir(node) / "node.log").read_text(errors="replace")


# --- cluster setup -------------------------------------------------------------------------


async def create_topic(
    cluster: LocalCluster, assignments: dict[int, list[int]], topic: str = TOPIC
) -> None:
    async with Admin(boot(cluster)) as admin:
        await admin.create_topics([NewTopic(topic, assignments=assignments)])

        async def isr_full() -> bool:
            (desc,) = await admin.describe_topics([topic])
            return all(
                p.leader == p.replicas[0] and sorted(p.isr) == sorted(p.replicas)
                for p in desc.partitions
            )

        await wait_until_async(isr_full, message="the full ISR, preferred leaders")


async def produce(cluster: LocalCluster, start: int, count: int, acks: int | str) -> None:
    async with Producer(
        bootstrap=boot(cluster), acks=acks, linger_ms=1, batch_size=4096
    ) as producer:
        for i in range(start, start + count):
            await producer.produce(TOPIC, b"value-%d" % i, key=b"key-%d" % i, partition=0)
        await producer.flush()


async def read_until(consumer: Consumer, got: list[ConsumerRecord], count: int) -> None:
    async def more() -> bool:
        for recs in (await consumer.getmany(timeout_ms=200)).values():
            got.extend(recs)
        return len(got) >= count

    await wait_until_async(more, timeout=60, message=lambda: f"{count} records, have {len(got)}")


def rack_consumer(cluster: LocalCluster, rack: str | None) -> Consumer:
    return Consumer(
        assignment=[(TOPIC, 0)],
        bootstrap=boot(cluster),
        from_beginning=True,
        client_rack=rack,
        fetch_max_wait_ms=200,
    )


# --- tests -----------------------------------------------------------------------------------


def test_rack_b_consumer_reads_below_the_rack_b_followers_high_watermark(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = rack_cluster(cluster_factory)
    committed, uncommitted = 2000, 1000
    run(lambda: create_topic(cluster, {0: [LEADER, RACK_B, RACK_C]}))
    run(lambda: produce(cluster, 0, committed, "all"))

    async def preferred_replicas() -> None:
        for rack, expected in (("b", RACK_B), ("c", RACK_C), ("a", -1), ("", -1), ("z", -1)):
            row, data = await raw_fetch(cluster, LEADER, 0, rack=rack)
            assert row[1] == errors.NONE and row[6] == expected, (rack, row)
            # A redirect carries no records; otherwise the leader serves them itself.
            assert (len(data) == 0) == (expected != -1), (rack, len(data))

    run(preferred_replicas)

    # Freeze the HW at `committed`: the rack-c follower (in the ISR) stops fetching.
    cluster.pause_node(RACK_C)
    try:
        run(lambda: produce(cluster, committed, uncommitted, "1"))
        total = committed + uncommitted
        wait_until(
            lambda: log_end_on_disk(cluster, RACK_B) == total,
            message="the rack-b follower's log holding the uncommitted records",
        )

        async def follower_serves_below_its_hw() -> None:
            row, data = await raw_fetch(cluster, RACK_B, 0, rack="b")
            assert row[1] == errors.NONE and row[2] == committed and row[6] == -1, row
            assert offsets_in(data) == list(range(committed))
            # Between its HW and its log end: nothing yet, and no error (as Kafka).
            row, data = await raw_fetch(cluster, RACK_B, committed + 10)
            assert row[1] == errors.NONE and len(data) == 0, row

        run(follower_serves_below_its_hw)

        async def consume_all() -> tuple[list[ConsumerRecord], dict[int, int]]:
            got: list[ConsumerRecord] = []
            async with rack_consumer(cluster, "b") as consumer:
                await read_until(consumer, got, committed)
                assert [r.offset for r in got] == list(range(committed))
                cluster.resume_node(RACK_C)  # the HW moves on; so does the follower's
                await read_until(consumer, got, total)
                return got, dict(consumer.bytes_by_node)

        rack_b_records, by_node = run(consume_all)
    finally:
        cluster.resume_node(RACK_C)

    # Everything came from the rack-b follower; the leader sent this consumer no records.
    assert by_node.get(RACK_B, 0) > 0 and by_node.get(LEADER, 0) == 0, by_node
    assert by_node.get(RACK_C, 0) == 0, by_node
    assert f"{TOPIC}-0: serving consumer fetches as a follower of {LEADER}" in node_log(
        cluster, RACK_B
    )
    assert f"{TOPIC}-0: consumers in rack b fetch from replica {RACK_B}" in node_log(
        cluster, LEADER
    )
    assert "serving consumer fetches as a follower" not in node_log(cluster, LEADER)

    async def from_leader() -> tuple[list[ConsumerRecord], dict[int, int]]:
        got: list[ConsumerRecord] = []
        async with rack_consumer(cluster, None) as consumer:
            await read_until(consumer, got, total)
            return got, dict(consumer.bytes_by_node)

    leader_records, leader_by_node = run(from_leader)
    assert set(leader_by_node) == {LEADER}
    assert rack_b_records == leader_records  # offsets, timestamps, keys, values, headers
    assert [r.value for r in leader_records] == [b"value-%d" % i for i in range(total)]


def test_follower_errors_and_fallback_to_the_leader(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = rack_cluster(cluster_factory, session_ms=2500)
    count = 10_000
    run(lambda: create_topic(cluster, {0: [LEADER, RACK_B, RACK_C]}))
    run(lambda: create_topic(cluster, {0: [LEADER, RACK_B]}, "elsewhere"))  # not on broker 3
    run(lambda: produce(cluster, 0, count, "all"))

    async def follower_errors() -> None:
        async with Admin(boot(cluster)) as admin:
            (desc,) = await admin.describe_topics([TOPIC])
        epoch = desc.partitions[0].leader_epoch
        row, _ = await raw_fetch(cluster, RACK_B, count + 100, rack="b")
        assert row[1] == errors.code_of("OFFSET_OUT_OF_RANGE"), row
        if epoch > 0:
            row, _ = await raw_fetch(cluster, RACK_B, 0, epoch=epoch - 1)
            assert row[1] == errors.code_of("FENCED_LEADER_EPOCH"), row
        row, _ = await raw_fetch(cluster, RACK_B, 0, epoch=epoch + 1)
        assert row[1] == errors.code_of("UNKNOWN_LEADER_EPOCH"), row
        row, _ = await raw_fetch(cluster, RACK_C, 0, topic="elsewhere")
        assert row[1] == errors.code_of("NOT_LEADER_OR_FOLLOWER"), row
        row, data = await raw_fetch(cluster, RACK_B, 0, epoch=epoch)
        assert row[1] == errors.NONE and len(offsets_in(data)) > 0, row

    run(follower_errors)

    async def fallback() -> tuple[list[ConsumerRecord], dict[int, int]]:
        got: list[ConsumerRecord] = []
        consumer = Consumer(
            assignment=[(TOPIC, 0)],
            bootstrap=boot(cluster),
            from_beginning=True,
            client_rack="b",
            fetch_max_wait_ms=200,
            max_partition_fetch_bytes=16 * 1024,
        )
        async with consumer:
            await read_until(consumer, got, 1)
            await wait_until_async(
                lambda: consumer.bytes_by_node.get(RACK_B, 0) > 0,
                message="a fetch answered by the rack-b follower",
            )
            from_leader_before = consumer.bytes_by_node.get(LEADER, 0)
            cluster.stop_node(RACK_B, kill=True)  # the preferred replica dies mid-read
            await read_until(consumer, got, count)
            return got, {**consumer.bytes_by_node, -1: from_leader_before}

    got, by_node = run(fallback)
    assert [r.offset for r in got] == list(range(count))
    assert [r.value for r in got] == [b"value-%d" % i for i in range(count)]
    assert by_node[-1] == 0  # nothing from the leader while the follower served
    assert by_node.get(LEADER, 0) > 0, by_node  # after it died: the leader (rack c: none)
