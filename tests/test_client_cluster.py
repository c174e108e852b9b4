"""The client against a real local cluster (3 controllers + 3 brokers, real processes):
keyed records round trip through six partitions, and the producer and consumer follow a
leader change when a broker stops."""

from __future__ import annotations

import pytest

from rillet.client.admin import Admin, NewTopic
from rillet.client.consumer import Consumer, TopicPartition
from rillet.client.partitioner import partition_for_key
from rillet.client.producer import Producer

pytestmark = pytest.mark.cluster

N_RECORDS = 100_000
N_KEYS = 1000


async def consume_exactly(consumer: Consumer, n: int) -> list:
    out: list = []
    while len(out) < n:
        batch = await consumer.getmany(timeout_ms=30_000)
        assert batch, f"no records within 30 s after {len(out)} of {n}"
        for recs in batch.values():
            out += recs
    return out


async def test_keyed_records_round_trip_and_leader_change(cluster) -> None:  # noqa: ANN001
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topics([NewTopic("keyed", 6, 3)])
    async with (
        Producer(cluster.bootstrap, retry_backoff_ms=50) as producer,
        Consumer(
            "keyed",
            bootstrap=cluster.bootstrap,
            from_beginning=True,
            retry_backoff_ms=50,
            fetch_max_wait_ms=100,
        ) as consumer,
    ):
        for i in range(N_RECORDS):
            key = b"key-%d" % (i % N_KEYS)
            await producer.produce("keyed", b"%d" % (i // N_KEYS), key)
        await producer.flush()
        records = await consume_exactly(consumer, N_RECORDS)
        check_keyed_order(records, N_RECORDS // N_KEYS)

        # Stop the broker leading partition 0 (SIGTERM: controlled shutdown moves its
        # leaderships away); both clients must follow the new leader and carry on.
        async with Admin(cluster.bootstrap) as admin:
            (desc,) = await admin.describe_topics(["keyed"])
        old_leader = desc.partitions[0].leader
        end = consumer.position(("keyed", 0))
        cluster.stop_node(old_leader)
        metadata = [await producer.send("keyed", b"after-%d" % i, partition=0) for i in range(20)]
        assert [m.offset for m in metadata] == list(range(end, end + 20))
        after = await consume_exactly(consumer, 20)
        assert [(r.partition, r.offset, r.value) for r in after] == [
            (0, end + i, b"after-%d" % i) for i in range(20)
        ]
        async with Admin(cluster.bootstrap) as admin:
            (desc,) = await admin.describe_topics(["keyed"])
        assert desc.partitions[0].leader not in (old_leader, -1)


def check_keyed_order(records: list, per_key: int, topic: str = "keyed") -> None:
    """Each key's records are all in the murmur2 partition, in the order sent."""
    seqs: dict[bytes, list[int]] = {}
    parts: dict[bytes, set[int]] = {}
    for r in records:
        seqs.setdefault(r.key, []).append(int(r.value))
        parts.setdefault(r.key, set()).add(r.partition)
    assert len(seqs) == N_KEYS
    for key, seq in seqs.items():
        assert seq == list(range(per_key)), key
        assert parts[key] == {partition_for_key(key, 6)}, key
    assert {TopicPartition(r.topic, r.partition) for r in records} == {
        TopicPartition(topic, p) for p in range(6)
    }


async def read_all(bootstrap: str, topic: str, n: int) -> list:
    async with Consumer(
        topic, bootstrap=bootstrap, from_beginning=True, retry_backoff_ms=50, fetch_max_wait_ms=100
    ) as consumer:
        return await consume_exactly(consumer, n)


async def test_everything_readable_after_kill9_and_sigterm_restarts(cluster) -> None:  # noqa: ANN001
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topics([NewTopic("restarts", 6, 3, {"min.insync.replicas": "2"})])
    async with Producer(cluster.bootstrap, acks="all", retry_backoff_ms=50) as producer:
        for i in range(N_RECORDS):
            await producer.produce("restarts", b"%d" % (i // N_KEYS), b"key-%d" % (i % N_KEYS))
        await producer.flush()

    for node_id, kill in ((1, True), (2, False)):  # a crash, then a controlled shutdown
        cluster.stop_node(node_id, kill=kill)
        cluster.start_node(node_id)
        await cluster.wait_ready_async()
        records = await read_all(cluster.bootstrap, "restarts", N_RECORDS)
        check_keyed_order(records, N_RECORDS // N_KEYS, topic="restarts")
