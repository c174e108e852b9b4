"""CoordinatorClient: lookup, caching, and following a coordinator that moves.

Two RpcServers stand in for two brokers: each answers FindCoordinator with whichever of
them a test calls the coordinator, and OffsetFetch from a script of error codes, so the
retry rules are checked over the real wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from rillet.client.group_coordinator import CoordinatorClient
from rillet.client.metadata import MetadataClient
from rillet.client.runtime.rpc_server import Request, Response, RpcServer
from rillet.client.wire import errors, schemas
from rillet.client.wire import messages as m

GUARD_S = 20
NOT_COORDINATOR = errors.code_of("NOT_COORDINATOR")
LOADING = errors.code_of("COORDINATOR_LOAD_IN_PROGRESS")
NOT_AVAILABLE = errors.code_of("COORDINATOR_NOT_AVAILABLE")


@dataclass
class Broker:
    node_id: int
    cluster: FakeGroupCluster
    script: list[int] = field(default_factory=list)  # codes for the next OffsetFetches
    fetches: int = 0
    lookups: int = 0
    rpc: RpcServer = field(init=False)

    def __post_init__(self) -> None:
        self.rpc = RpcServer(
            {
                schemas.FIND_COORDINATOR.key: self.find,
                schemas.OFFSET_FETCH.key: self.fetch,
            },
            name=f"fake-{self.node_id}",
        )

    async def find(self, request: Request) -> Response:
        self.lookups += 1
        coord = self.cluster.coordinator
        keys = request.message.coordinator_keys
        if coord is None:
            answers = [m.Coordinator(k, -1, "", 0, NOT_AVAILABLE, None) for k in keys]
        else:
            port = self.cluster.brokers[coord].rpc.port
            answers = [m.Coordinator(k, coord, "127.0.0.1", port, 0, None) for k in keys]
        return Response(m.FindCoordinatorResponse(answers))

    async def fetch(self, request: Request) -> Response:
        self.fetches += 1
        code = self.script.pop(0) if self.script else 0
        group = request.message.groups[0].group_id
        return Response(m.OffsetFetchResponse([m.OffsetFetchGroupResult(group, [], code)]))


@dataclass
class FakeGroupCluster:
    brokers: dict[int, Broker] = field(default_factory=dict)
    coordinator: int | None = 1


@pytest.fixture
async def cluster() -> AsyncIterator[FakeGroupCluster]:
    c = FakeGroupCluster()
    c.brokers = {n: Broker(n, c) for n in (1, 2)}
    for b in c.brokers.values():
        await b.rpc.start("127.0.0.1", 0)
    try:
        yield c
    finally:
        for b in c.brokers.values():
            await b.rpc.stop()


def fetch_request(group: str) -> m.OffsetFetchRequest:
    return m.OffsetFetchRequest([m.OffsetFetchGroup(group, None, -1, None)])


def group_code(response: m.OffsetFetchResponse) -> int:
    return response.groups[0].error_code


async def call(client: CoordinatorClient, timeout_ms: int = 5_000) -> m.OffsetFetchResponse:
    return await asyncio.wait_for(
        client.call(fetch_request("g"), group_code, timeout_ms=timeout_ms), GUARD_S
    )


async def test_the_lookup_is_cached_until_the_coordinator_moves(
    cluster: FakeGroupCluster,
) -> None:
    meta = MetadataClient(f"127.0.0.1:{cluster.brokers[1].rpc.port}")
    client = CoordinatorClient(meta, "g", retry_backoff_ms=10)
    try:
        await call(client)
        await call(client)
        assert client.node_id == 1
        assert cluster.brokers[1].fetches == 2
        lookups = sum(b.lookups for b in cluster.brokers.values())
        assert lookups == 1

        # The partition's leadership moves: broker 1 now says NOT_COORDINATOR.
        cluster.coordinator = 2
        cluster.brokers[1].script = [NOT_COORDINATOR]
        response = await call(client)
        assert group_code(response) == 0
        assert client.node_id == 2
        assert cluster.brokers[2].fetches == 1
    finally:
        await meta.close()


async def test_loading_is_retried_at_the_same_coordinator(cluster: FakeGroupCluster) -> None:
    meta = MetadataClient(f"127.0.0.1:{cluster.brokers[1].rpc.port}")
    client = CoordinatorClient(meta, "g", retry_backoff_ms=10)
    cluster.brokers[1].script = [LOADING, LOADING]
    try:
        assert group_code(await call(client)) == 0
        assert cluster.brokers[1].fetches == 3
        assert sum(b.lookups for b in cluster.brokers.values()) == 1
    finally:
        await meta.close()


async def test_no_coordinator_until_the_deadline_raises_the_retriable_error(
    cluster: FakeGroupCluster,
) -> None:
    cluster.coordinator = None
    meta = MetadataClient(f"127.0.0.1:{cluster.brokers[1].rpc.port}")
    client = CoordinatorClient(meta, "g", retry_backoff_ms=10)
    try:
        with pytest.raises(errors.CoordinatorNotAvailableError):
            await call(client, timeout_ms=200)
        assert sum(b.lookups for b in cluster.brokers.values()) >= 2  # it kept asking
    finally:
        await meta.close()


async def test_other_codes_are_returned_to_the_caller(cluster: FakeGroupCluster) -> None:
    meta = MetadataClient(f"127.0.0.1:{cluster.brokers[1].rpc.port}")
    client = CoordinatorClient(meta, "g", retry_backoff_ms=10)
    not_found = errors.code_of("GROUP_ID_NOT_FOUND")
    cluster.brokers[1].script = [not_found]
    try:
        assert group_code(await call(client)) == not_found
        assert cluster.brokers[1].fetches == 1
    finally:
        await meta.close()


async def test_a_coordinator_that_dies_is_looked_up_again(cluster: FakeGroupCluster) -> None:
    meta = MetadataClient(f"127.0.0.1:{cluster.brokers[2].rpc.port}")
    client = CoordinatorClient(meta, "g", retry_backoff_ms=10)
    try:
        await call(client)
        assert client.node_id == 1
        await cluster.brokers[1].rpc.stop()
        cluster.coordinator = 2
        assert group_code(await call(client)) == 0
        assert client.node_id == 2
    finally:
        await meta.close()
