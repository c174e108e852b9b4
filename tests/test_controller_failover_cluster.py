"""Controller failover as a client sees it, with real processes: a request a broker
forwards to the active controller is answered by the next one when that controller dies
(kill -9), without the client having to send it again.

The broker's `ControllerChannel` holds the forwarded request: the dead controller's
connection fails every request waiting on it at once (the kernel resets the socket), and
the channel asks the other voters, following NOT_CONTROLLER redirects, until the new
active controller answers (docs/controller.md, "Failover").
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import wait_until_async

from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, parse_address
from rillet.client.wire.errors import RilletError
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

LONG_MS = 120_000  # far past any failover: a request that needs it to fail fails the test


async def _quorum_view(port: int) -> m.DescribeQuorumResponse | None:
    try:
        async with await Connection.open("127.0.0.1", port, connect_timeout_ms=2000) as conn:
            response, _ = await conn.call(m.DescribeQuorumRequest(), timeout_ms=2000)
            return response
    except RilletError:
        return None


async def _active_among(cluster: LocalCluster, node_ids: list[int]) -> int | None:
    for node_id in node_ids:
        port = cluster.nodes[node_id].controller_port
        view = await _quorum_view(port) if port is not None else None
        if view is not None and view.active:
            return view.node_id
    return None


def test_a_create_topics_in_flight_to_a_killed_controller_is_answered_by_the_next(
    cluster: LocalCluster,
) -> None:
    """The active controller is paused (SIGSTOP), so a CreateTopics the broker forwards to
    it stays unanswered; once the two others have elected an active controller, the paused
    one is killed (-9). The one request the client sent, with a timeout far past any
    failover, is answered NONE: the broker sent it again to the new controller itself."""
    described = cluster.describe()
    assert described is not None and described.controller_id >= 0
    old = described.controller_id
    survivors = [n.node_id for n in cluster.controllers() if n.node_id != old]
    host, port = parse_address(cluster.broker_address(1))

    async def body() -> tuple[int, int]:
        async with await Connection.open(host, port, request_timeout_ms=LONG_MS) as conn:
            cluster.pause_node(old)
            request = m.CreateTopicsRequest(
                topics=[m.CreatableTopic("after-kill", 1, 3, [], {})], timeout_ms=LONG_MS
            )
            answer = asyncio.ensure_future(conn.call(request))
            new = await wait_until_async(
                lambda: _active_among(cluster, survivors),
                timeout=60,
                message="an active controller among the survivors",
            )
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: cluster.stop_node(old, kill=True))
            response, _ = await answer
            (result,) = response.topics
            return result.error_code, new

    error_code, new = asyncio.run(body())
    assert error_code == 0
    after = cluster.describe()
    assert after is not None and after.controller_id == new
