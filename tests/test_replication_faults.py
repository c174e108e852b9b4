"""Replication under faults, with real processes: RF=3, min.insync.replicas=2, acks=all.

A writer produces continuously while the test kills the partition leader (kill -9),
pauses a follower past replica.lag.time.max.ms (SIGSTOP: the ISR shrinks, then refills
after SIGCONT), and stops a broker with SIGTERM and restarts it. Afterwards every
acknowledged record must be exactly where its acknowledgement said, in order, and no
record that was never sent may appear.
"""

from __future__ import annotations

import pytest
from helpers import wait_until
from replication_cluster import (
    BROKERS,
    Client,
    PartitionInfo,
    Writer,
    check_acknowledged,
    replication_cluster,
    run,
)

from rillet.client.wire import errors
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

TOPIC = "orders"
PARTITIONS = 3


def partitions(cluster: LocalCluster, topic: str = TOPIC) -> dict[int, PartitionInfo]:
    """Metadata from the first live broker that knows the topic (a broker that just
    restarted answers "unknown topic" until its metadata arrives: wait for it)."""

    async def body(client: Client) -> dict[int, PartitionInfo] | None:
        try:
            return await client.partitions(topic)
        except errors.UnknownTopicOrPartitionError:
            return None

    return wait_until(lambda: run(cluster, body), message=f"metadata for {topic}")


def all_isrs_full(cluster: LocalCluster, topic: str = TOPIC, count: int = PARTITIONS) -> bool:
    """Every one of the topic's ``count`` partitions has a leader and a full ISR (never
    true of an answer that lists no partitions)."""
    info = partitions(cluster, topic)
    return set(info) == set(range(count)) and all(
        sorted(p.isr) == sorted(p.replicas) and p.leader >= 0 for p in info.values()
    )


def create(cluster: LocalCluster, topic: str = TOPIC, count: int = PARTITIONS) -> None:
    async def body(client: Client) -> None:
        await client.create_topic(topic, count, 3, {"min.insync.replicas": "2"})

    run(cluster, body)
    wait_until(lambda: all_isrs_full(cluster, topic, count), message="a full ISR after creation")


def acks_grow(writer: Writer, by: int = 50) -> None:
    """Wait until the writer has had ``by`` more records acknowledged."""
    target = writer.acked_count() + by
    wait_until(
        lambda: writer.acked_count() >= target,
        timeout=60,
        message=lambda: f"{target} acks; writer errors {writer.errors_seen}",
    )


def test_acks_all_survives_kill_pause_and_restart(cluster_factory) -> None:
    cluster = replication_cluster(cluster_factory)
    create(cluster)
    writer = Writer(cluster, TOPIC, PARTITIONS).start()
    try:
        acks_grow(writer)

        # (a) kill -9 the leader of partition 0; a new leader comes from the ISR.
        victim = partitions(cluster)[0].leader
        cluster.stop_node(victim, kill=True)
        wait_until(
            lambda: partitions(cluster)[0].leader not in (victim, -1),
            message="a new leader for partition 0",
        )
        acks_grow(writer)
        cluster.start_node(victim)
        wait_until(lambda: all_isrs_full(cluster), message="the killed broker back in every ISR")

        # (b) pause a follower of partition 1 past the lag time: it leaves the ISR by lag
        # (its session is longer), then comes back after SIGCONT.
        info = partitions(cluster)[1]
        follower = next(b for b in info.replicas if b != info.leader)
        cluster.pause_node(follower)
        try:
            wait_until(
                lambda: follower not in partitions(cluster)[1].isr,
                message=f"broker {follower} out of partition 1's ISR",
            )
            acks_grow(writer)  # min.insync.replicas=2 still holds with two members
        finally:
            cluster.resume_node(follower)
        wait_until(lambda: all_isrs_full(cluster), message="the paused broker back in the ISR")

        # (c) SIGTERM a broker (controlled shutdown) and restart it.
        stopped = partitions(cluster)[2].leader
        cluster.stop_node(stopped)
        acks_grow(writer)
        cluster.start_node(stopped)
        wait_until(lambda: all_isrs_full(cluster), message="the restarted broker in the ISR")
        acks_grow(writer)
    finally:
        writer.stop()
    counts = check_acknowledged(cluster, writer)
    assert sum(counts.values()) >= writer.acked_count()
    assert set(partitions(cluster)) == set(range(PARTITIONS))
    assert all(b in BROKERS for p in partitions(cluster).values() for b in p.isr)


def test_one_broker_left_refuses_acks_all_and_the_isr_refills(cluster_factory) -> None:
    cluster = replication_cluster(cluster_factory)
    create(cluster, "scarce", 2)
    writer = Writer(cluster, "scarce", 2).start()
    try:
        acks_grow(writer)
        survivor = partitions(cluster, "scarce")[0].leader
        gone = [b for b in BROKERS if b != survivor]
        for b in gone:
            cluster.stop_node(b, kill=True)
        # Fencing leaves the survivor as the only ISR member (and leader) of both.
        wait_until(
            lambda: all(
                p.isr == [survivor] and p.leader == survivor
                for p in partitions(cluster, "scarce").values()
            ),
            message="ISRs down to the survivor",
        )
        acked_before = writer.acked_count()

        async def refused(client: Client) -> list[int]:
            return [
                (await client.produce(survivor, "scarce", p, [b"refused"]))[0] for p in range(2)
            ]

        assert run(cluster, refused) == [errors.code_of("NOT_ENOUGH_REPLICAS")] * 2
        wait_until(
            lambda: writer.errors_seen.get("NOT_ENOUGH_REPLICAS", 0) >= 2,
            message=lambda: f"the writer refused too: {writer.errors_seen}",
        )
        assert writer.acked_count() == acked_before  # nothing acknowledged meanwhile
        for b in gone:
            cluster.start_node(b)
        wait_until(lambda: all_isrs_full(cluster, "scarce", 2), message="ISRs refilled")
        acks_grow(writer)
    finally:
        writer.stop()
    check_acknowledged(cluster, writer)
