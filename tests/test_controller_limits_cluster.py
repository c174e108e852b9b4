"""Requests too large for the metadata log, against a real controller quorum and a real
cluster: refused with a clear, non-retriable error before anything reaches the Raft log,
and the active controller stays active (same leader, same term: no election).

Reported: one CreateTopics planning a few million partitions exceeded the Raft store's
entry limit inside persist, which is fatal; the admin client's retry then took down the
next active controller, and the next.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_cli_client import rillet
from test_controller_cluster import Quorum, active_controller, status, unfenced_brokers

from rillet.broker.link.controller_client import (
    ControllerChannel,
)
from rillet.client.wire import messages as m
from rillet.client.wire import schemas
from rillet.client.wire.errors import InvalidRequestError, PolicyViolationError
from rillet.tools.local_cluster import CONTROLLER_ID_BASE

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quorum]:
    q = Quorum(tmp_path_factory.mktemp("quorum"))
    try:
        for node in (1, 2, 3):
            q.start(node)
        yield q
    finally:
        q.stop_all()


async def leadership(quorum: Quorum) -> tuple[int, int]:
    leader = await active_controller(quorum)
    view = await status(quorum, leader)
    assert view is not None
    return leader, view["term"]


def all_running(quorum: Quorum) -> bool:
    return all(p.proc.poll() is None for p in quorum.procs.values())


async def test_create_topics_of_millions_of_partitions_is_refused_and_the_leader_stays(
    quorum: Quorum,
) -> None:
    channel = quorum.channel()
    try:
        await refuse_millions(quorum, channel)
    finally:
        await channel.close()


async def refuse_millions(quorum: Quorum, channel: ControllerChannel) -> None:
    async with unfenced_brokers(quorum, (7001, 7002, 7003)):
        before = await leadership(quorum)
        thirty = [m.CreatableTopic(f"huge-{i}", 100_000, 3, [], {}) for i in range(30)]
        one = [m.CreatableTopic("huge", 3_000_000, 3, [], {})]
        for topics in (thirty, one):
            request = m.CreateTopicsRequest(topics, timeout_ms=30_000)
            with pytest.raises(PolicyViolationError, match="max.partitions"):
                await channel.call(request, deadline_ms=60_000)
        assert all_running(quorum), quorum.logs()
        assert await leadership(quorum) == before  # no election
        # The quorum goes on serving: a topic within the limits is created.
        small = m.CreateTopicsRequest([m.CreatableTopic("small", 3, 3, [], {})], timeout_ms=10_000)
        created, _ = await channel.call(small, deadline_ms=60_000)
        assert created.topics[0].error_code == 0, created
        assert await leadership(quorum) == before


async def test_a_registration_too_large_for_one_record_is_refused_and_the_leader_stays(
    quorum: Quorum,
) -> None:
    before = await leadership(quorum)
    channel = quorum.channel()
    fields = {
        "broker_id": 7100,
        "cluster_id": "",
        "incarnation_id": "inc-7100",
        "listeners": [["BROKER", "127.0.0.1", 27_100]],
        "rack": "r" * (2 * 1024 * 1024),
    }
    try:
        with pytest.raises(InvalidRequestError, match="rack"):
            await channel.request(schemas.BROKER_REGISTRATION, fields, deadline_ms=60_000)
        assert all_running(quorum), quorum.logs()
        assert await leadership(quorum) == before
        header, _ = await channel.request(schemas.DESCRIBE_CLUSTER, {})
        assert 7100 not in {b[0] for b in header["brokers"]}
    finally:
        await channel.close()


def test_the_cli_names_the_limit_and_does_not_retry(cluster_factory) -> None:  # noqa: ANN001
    controller = CONTROLLER_ID_BASE + 1
    cluster = cluster_factory(
        controllers=1, brokers=1, node_overrides={controller: {"max.partitions": 50}}
    )
    proc = rillet(cluster, "topic", "create", "big", "--partitions", "60", ok=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: POLICY_VIOLATION: creating 60 partitions"), proc.stderr
    assert "max.partitions is 50" in proc.stderr
    rillet(cluster, "topic", "create", "fits", "--partitions", "50")
