"""A topic deleted and re-created while a broker is down (issue 11, finding 3).

Real processes: 1 controller that snapshots every few records, 2 brokers. Broker 2 holds
a replica of "t" and is stopped; "t" is deleted and re-created with the same name, and
the controller compacts its log past the delete. Broker 2 restarts from the snapshot, so
it never sees the delete: without the topic id recorded in its partition directory it
would reuse the dead topic's log, truncate it to the new leader's end for the same
epoch, and keep the old records at the new topic's offsets.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from helpers import log_records, wait_until

from rillet.client.admin import NewTopic
from rillet.client.sync import SyncAdmin, SyncProducer
from rillet.storage import Log, checkpoints
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

CONTROLLER = 101
FAST_BROKER = {
    "replica.lag.time.max.ms": 1000,
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 100,
    "broker.heartbeat.interval.ms": 250,
    "controlled.shutdown.timeout.ms": 10_000,
}
CONTROLLER_SETTINGS = {
    "broker.session.timeout.ms": 2500,
    "broker.heartbeat.interval.ms": 250,
    "metadata.snapshot.max.records": 2,
}


def snapshot_index(cluster: LocalCluster) -> int:
    path = cluster.node_dir(CONTROLLER) / "metadata" / "snapshot"
    if not path.exists():
        return 0
    return struct.unpack_from(">IQ", path.read_bytes())[1]


def partition_ids(admin: SyncAdmin, topic: str) -> tuple[int, ...]:
    (desc,) = admin.describe_topics([topic])
    return desc.partitions[0].isr


def test_recreated_topic_never_serves_the_deleted_topics_records(cluster_factory: Any) -> None:
    overrides = {1: dict(FAST_BROKER), 2: dict(FAST_BROKER), CONTROLLER: CONTROLLER_SETTINGS}
    cluster = cluster_factory(controllers=1, brokers=2, node_overrides=overrides)
    with (
        SyncAdmin(cluster.bootstrap) as admin,
        SyncProducer(bootstrap=cluster.bootstrap, acks="all") as producer,
    ):
        admin.create_topics([NewTopic("t", assignments={0: [2, 1]})])
        for i in range(5):  # one batch each: truncation cuts whole batches
            producer.send_many("t", [b"old-%d" % i])
            producer.flush()
        wait_until(lambda: set(partition_ids(admin, "t")) == {1, 2}, message="t fully in sync")
        cluster.stop_node(2)

        admin.delete_topics(["t"])
        admin.create_topics([NewTopic("t", assignments={0: [1, 2]})])
        producer.send_many("t", [b"new-%d" % i for i in range(3)])
        producer.flush()
        # Compact the controller's log well past the delete: a few more metadata changes.
        before = snapshot_index(cluster)
        for i in range(3):
            admin.create_topics([NewTopic(f"filler-{i}", 1, 1)])
        wait_until(
            lambda: snapshot_index(cluster) > before, message="controller snapshot past the delete"
        )

        cluster.start_node(2)
        wait_until(
            lambda: set(partition_ids(admin, "t")) == {1, 2}, message="broker 2 back in sync"
        )
    cluster.stop_node(2)

    directory = cluster.node_dir(2) / "logs" / "t-0"
    log = Log.open(directory)
    try:
        assert [r.value for r in log_records(log)] == [b"new-%d" % i for i in range(3)]
    finally:
        log.close()
    assert checkpoints.read_topic_id(directory) is not None
