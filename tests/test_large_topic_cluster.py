"""A CreateTopics of thousands of partitions on a real 3+3 cluster costs no election.

Before the controller split large operations into bounded entries (docs/controller.md,
"Large operations"), creating a topic of this size held the controllers' event loops for
seconds at a time and the quorum re-elected while it ran. The Raft term is read from every
controller (DescribeQuorum) before and after: an election, anywhere, raises it.
"""

from __future__ import annotations

import asyncio

import pytest
from cluster import ClusterFactory

from rillet.client.admin import Admin, NewTopic
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection
from rillet.tools.local_cluster import LocalCluster

# 20-75 s on this shared 2-core machine, most of it the brokers creating 3,000 replicas
# each: slow, so `make test` skips it.
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PARTITIONS = 3000


async def terms(cluster: LocalCluster) -> dict[int, int]:
    out = {}
    for node in cluster.controllers():
        host, port = node.listeners["CONTROLLER"].rsplit(":", 1)
        async with await Connection.open(host, int(port)) as conn:
            response, _ = await conn.call(m.DescribeQuorumRequest(), timeout_ms=10_000)
            out[node.node_id] = response.term
    return out


def test_creating_thousands_of_partitions_causes_no_controller_election(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory()

    async def scenario() -> None:
        before = await terms(cluster)
        assert len(set(before.values())) == 1, before
        # One attempt, however long it takes: a client retry after its own timeout would
        # find the topic created by the first and fail with TOPIC_ALREADY_EXISTS.
        async with Admin(
            cluster.bootstrap, timeout_ms=180_000, request_timeout_ms=180_000
        ) as admin:
            await admin.create_topics([NewTopic("wide", PARTITIONS, 3)])
            (desc,) = await admin.describe_topics(["wide"])
            assert len(desc.partitions) == PARTITIONS
        assert await terms(cluster) == before

    asyncio.run(scenario())
