"""A compacted partition replicates to a new replica (issue 11, finding 2).

Real processes: 1 controller, 2 brokers. A compacted topic lives on broker 1 alone and
is compacted there (its log now has offset gaps: whole batches gone, the first records
too). It is then reassigned to both brokers. Broker 2 starts empty and must copy the
leader's log, gaps included: a follower that insists each fetched batch start exactly
at its log end stays at offset 0 forever, and the reassignment never finishes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import fetch_records, log_records, wait_until

from rillet.client.admin import NewTopic
from rillet.client.sync import SyncAdmin, SyncProducer
from rillet.client.wire.connection import Connection
from rillet.storage import Log

pytestmark = pytest.mark.cluster

CONTROLLER = 101
BROKER = {
    "replica.lag.time.max.ms": 1000,
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 100,
    "broker.heartbeat.interval.ms": 250,
    "log.retention.check.interval.ms": 200,  # the cleaner runs every maintenance round
}
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": "2048",
    "min.compaction.lag.ms": "0",
}
KEYS = 8


def leader_records(cluster: Any) -> list[Any]:
    host, port = cluster.nodes[1].listeners["BROKER"].rsplit(":", 1)

    async def read() -> list[Any]:
        conn = await Connection.open(host, int(port))
        try:
            return await fetch_records(conn, "c")
        finally:
            await conn.aclose()

    return asyncio.run(read())


def test_a_new_replica_copies_a_compacted_log(cluster_factory: Any) -> None:
    overrides = {1: dict(BROKER), 2: dict(BROKER)}
    cluster = cluster_factory(controllers=1, brokers=2, node_overrides=overrides)
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("c", assignments={0: [1]}, configs=TOPIC_CONFIG)])
        with SyncProducer(bootstrap=cluster.bootstrap, acks="all", linger_ms=0) as producer:
            for round_ in range(40):  # each key overwritten 40 times, many small batches
                keys = [b"k%d" % k for k in range(KEYS)]
                producer.send_many("c", [b"v%d-%d" % (round_, k) for k in range(KEYS)], keys)
                producer.flush()
        produced = 40 * KEYS
        wait_until(
            lambda: (recs := leader_records(cluster)) and recs[0].offset > 0,
            timeout=60,
            message="the leader compacted the head of its log",
        )
        before = leader_records(cluster)
        assert len(before) < produced

        admin.alter_partition_reassignments({("c", 0): [1, 2]})

        def in_sync() -> bool:
            (desc,) = admin.describe_topics(["c"])
            return set(desc.partitions[0].isr) == {1, 2}

        wait_until(in_sync, timeout=60, message="broker 2 caught up and joined the ISR")
        leader = [(r.offset, r.key, r.value) for r in leader_records(cluster)]
    cluster.stop()
    copy = Log.open(cluster.node_dir(2) / "logs" / "c-0")
    try:
        got = [(r.offset, r.key, r.value) for r in log_records(copy)]
    finally:
        copy.close()
    assert got[: len(leader)] == leader
    latest = {key: value for _, key, value in got}
    assert latest == {b"k%d" % k: b"v39-%d" % k for k in range(KEYS)}
