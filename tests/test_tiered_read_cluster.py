"""The remote tier's read side on real processes (3 controllers, 3 brokers) against
moto's S3 server as a real process: a consumer reads from offset 0 after the early
segments left every broker's disk, and gets every record in order; a replica added by a
reassignment catches up a partition whose early history is only in S3 (it starts at the
leader's local log start, docs/tiered.md); a flipped byte in a remote object reaches the
consumer as an error, never as data."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import wait_until
from replication_cluster import Client, run
from s3_server import S3Endpoint
from test_tiered_copy_cluster import (
    DEADLINE_S,
    TOPIC_CONFIG,
    Tier,
    create,
    leader_of,
    produce,
    tiered_cluster,
)

from rillet.client.admin import Admin
from rillet.client.consumer import Consumer
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.errors import CorruptRecordError
from rillet.storage.remote.layout import parse_segment_key
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

BATCHES = 150  # 4 records of 100 bytes each: about 40 segments of 1 KiB


def consume_all(cluster: LocalCluster, topic: str, count: int) -> list[tuple[int, bytes]]:
    async def main() -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        async with Consumer(
            assignment=[(topic, 0)],
            bootstrap=cluster.bootstrap,
            from_beginning=True,
            max_partition_fetch_bytes=4096,  # many fetches, each from a few chunks
            retry_backoff_ms=50,
        ) as c:
            while len(out) < count:
                for recs in (await c.getmany(timeout_ms=DEADLINE_S * 1000)).values():
                    out += [(r.offset, r.value) for r in recs]
        return out

    return asyncio.run(main())


def local_start(tier: Tier, broker: int, topic: str) -> int:
    return tier.local_bases(broker, topic)[0]


def wait_offloaded(tier: Tier, topic: str, brokers: tuple[int, ...] = (1, 2, 3)) -> None:
    """Until the first 100 offsets are remote and gone from every broker's disk."""
    wait_until(
        lambda: min(local_start(tier, b, topic) for b in brokers) > 100,
        DEADLINE_S,
        0.2,
        "early segments remote and gone from local disk",
    )


def test_a_consumer_from_offset_0_reads_every_record_through_both_tiers(
    cluster_factory: Any, s3: S3Endpoint
) -> None:
    cluster = tiered_cluster(cluster_factory, s3)
    tier = Tier(cluster, s3)
    create(cluster, "history")
    values = [b"%05d" % i + b"x" * 95 for i in range(BATCHES * 4)]

    async def write(client: Client) -> None:
        leader = (await client.partitions("history"))[0].leader
        for i in range(BATCHES):
            data = records.encode_batch(values[4 * i : 4 * i + 4], timestamp_ms=1000 + i)
            assert (await client.produce_bytes(leader, "history", 0, data)).error_code == 0

    run(cluster, write)
    wait_offloaded(tier, "history")
    got = consume_all(cluster, "history", len(values))
    assert [o for o, _ in got] == list(range(len(values)))
    assert [v for _, v in got] == values

    # ListOffsets: earliest is the remote log start (0), -4 the leader's local start.
    leader = leader_of(cluster, "history")

    async def offsets(client: Client) -> tuple[int, int]:
        conn = await client.conn(leader)
        out = []
        for ts in (-2, -4):
            part = m.ListOffsetsPartition(0, -1, ts)
            request = m.ListOffsetsRequest(topics=[m.ListOffsetsTopic("history", [part])])
            response, _ = await conn.call(request)
            out.append(response.topics[0].partitions[0].offset)
        return out[0], out[1]

    earliest, earliest_local = run(cluster, offsets)
    assert earliest == 0 and earliest_local == local_start(tier, leader, "history") > 0


def test_a_new_replica_catches_up_a_partition_whose_early_history_is_only_remote(
    cluster_factory: Any, s3: S3Endpoint
) -> None:
    cluster = tiered_cluster(cluster_factory, s3)
    tier = Tier(cluster, s3)

    async def create_on_one(client: Client) -> None:
        topic = m.CreatableTopic("moved", -1, -1, [m.ReplicaAssignment(0, [1])], TOPIC_CONFIG)
        response = await client.any_request(m.CreateTopicsRequest([topic], timeout_ms=20_000))
        assert response.topics[0].error_code == 0, response

    run(cluster, create_on_one)
    produce(cluster, "moved", BATCHES)
    wait_offloaded(tier, "moved", (1,))

    async def reassign() -> None:
        async with Admin(cluster.bootstrap) as admin:
            await admin.alter_partition_reassignments({("moved", 0): [1, 2]})

    asyncio.run(reassign())

    async def isr(client: Client) -> tuple[int, ...]:
        (p,) = (await client.any_request(m.MetadataRequest(["moved"]))).topics[0].partitions
        return tuple(sorted(p.isr))

    wait_until(lambda: run(cluster, isr) == (1, 2), DEADLINE_S, 0.2, "broker 2 in the ISR")
    # Broker 2 never copied the remote range: its log starts at (or past) what broker 1
    # kept locally when it joined, not at 0.
    assert local_start(tier, 2, "moved") > 0
    got = consume_all(cluster, "moved", BATCHES * 4)
    assert [o for o, _ in got] == list(range(BATCHES * 4))


def test_a_flipped_byte_in_a_remote_object_is_an_error_for_the_consumer(
    cluster_factory: Any, s3: S3Endpoint
) -> None:
    cluster = tiered_cluster(cluster_factory, s3)
    tier = Tier(cluster, s3)
    create(cluster, "damaged")
    produce(cluster, "damaged", BATCHES)
    wait_offloaded(tier, "damaged")
    first = min(
        (k for k in tier.objects("damaged-") if (parse_segment_key(k) or (1, "", ""))[0] == 0),
        key=lambda k: k.endswith(".manifest"),
    )
    assert first.endswith(".log")
    info = tier.store.head(first)
    assert info is not None
    data = bytearray(tier.store.get(first))
    data[200] ^= 0x01  # inside the first batch's records
    tier.store.put(first, bytes(data), info.metadata)
    leader = leader_of(cluster, "damaged")

    async def fetch_at_0(client: Client) -> tuple[int, int]:
        conn = await client.conn(leader)
        part = m.FetchPartition(0, 0, -1, -1, -1, 1 << 20)
        request = m.FetchRequest(-1, 0, 1, 1 << 20, [m.FetchTopic("damaged", [part])])
        response, payload = await conn.call(request)
        (r,) = response.topics[0].partitions
        return r.error_code, len(payload)

    # The broker says so itself (CORRUPT_MESSAGE) and sends no bytes, and a consumer
    # raises it to the application.
    assert run(cluster, fetch_at_0) == (errors.code_of("CORRUPT_MESSAGE"), 0)
    with pytest.raises(CorruptRecordError):
        consume_all(cluster, "damaged", 1)
