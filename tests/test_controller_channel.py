"""ControllerChannel (broker/link/controller_client.py) against fake voters on real sockets:
NOT_CONTROLLER redirects respect the request's deadline."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from rillet.broker.link.controller_client import ControllerChannel, ControllerTargets, RequestRetry
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


# The redirect policy alone (ControllerChannel and the simulator's brokers both run it).


def test_a_named_leader_is_asked_at_once_until_the_voters_keep_naming_each_other() -> None:
    targets, retry = ControllerTargets([1, 2, 3], random.Random(7)), RequestRetry()
    first = targets.target()
    named = next(v for v in (1, 2, 3) if v != first)
    assert targets.on_not_controller(first, named, retry)  # go there at once
    assert targets.target() == named
    for _ in range(2):  # the two keep naming each other
        asked = targets.target()
        assert targets.on_not_controller(asked, first if asked == named else named, retry)
    assert targets.target() == named
    assert not targets.on_not_controller(named, first, retry)  # a 4th redirect: back off
    assert targets.target() == first  # then ask the voter last named
    assert retry.next_backoff_ms() == 20 and retry.redirects == 0
    assert [retry.next_backoff_ms() for _ in range(6)] == [40, 80, 160, 320, 500, 500]


def test_no_leader_known_or_no_answer_moves_on_to_the_next_voter() -> None:
    targets, retry = ControllerTargets([1, 2, 3], random.Random(7)), RequestRetry()
    order = list(targets.rotation)
    assert not targets.on_not_controller(order[0], -1, retry)  # no leader known
    assert targets.target() == order[1]
    targets.on_unreachable(order[1])
    assert targets.target() == order[2]
    targets.on_answer(order[2])
    assert targets.leader_id == order[2]
    assert not targets.on_not_controller(order[2], order[2], retry)  # leading, not active
    assert targets.target() == order[2]  # wait for it rather than ask another
