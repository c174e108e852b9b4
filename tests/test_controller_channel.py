"""ControllerChannel (broker/link/controller_client.py) against fake voters on real sockets:
NOT_CONTROLLER redirects respect the request's deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from rillet.broker.link.controller_client import ControllerChannel
from rillet.client.runtime.rpc_server import Request, Response, RpcServer
from rillet.client.wire import schemas
from rillet.client.wire.errors import NotControllerError

GUARD_S = 60  # only against a hang (the bug this file pins); never reached when it works


class Voter:
    """Answers every DescribeCluster NOT_CONTROLLER, naming ``points_to`` as the leader."""

    def __init__(self, points_to: int) -> None:
        self.points_to = points_to
        self.requests = 0
        self.rpc = RpcServer({schemas.DESCRIBE_CLUSTER.key: self.handle}, name="fake-voter")

    async def handle(self, request: Request) -> Response:
        self.requests += 1
        return Response(
            {
                "error_code": NotControllerError.code,
                "error_message": "not active",
                "leader_id": self.points_to,
                "leader_host": "",
                "leader_port": -1,
            }
        )


@pytest.fixture
async def quarrelling_voters() -> AsyncIterator[dict[int, Voter]]:
    """Voters 1 and 2, each saying the other is the active controller (stale views)."""
    voters = {1: Voter(points_to=2), 2: Voter(points_to=1)}
    for voter in voters.values():
        await voter.rpc.start("127.0.0.1", 0)
    try:
        yield voters
    finally:
        for voter in voters.values():
            await voter.rpc.stop()


async def test_redirects_between_voters_stop_at_the_deadline(
    quarrelling_voters: dict[int, Voter],
) -> None:
    addresses = {i: ("127.0.0.1", v.rpc.port) for i, v in quarrelling_voters.items()}
    channel = ControllerChannel(addresses)  # type: ignore[arg-type]
    try:
        with pytest.raises(NotControllerError):
            await asyncio.wait_for(
                channel.request(schemas.DESCRIBE_CLUSTER, {}, deadline_ms=200), GUARD_S
            )
    finally:
        await channel.close()
    assert sum(v.requests for v in quarrelling_voters.values()) >= 2  # it did redirect
