"""Metadata refresh pacing: an election is waited out at the plain retry backoff, while
an unreachable cluster backs off exponentially."""

from __future__ import annotations

import asyncio

import pytest
from test_client_fake_broker import FakeCluster

from rillet.client.admin import Admin, AdminError, NewTopic
from rillet.client.metadata import MetadataClient
from rillet.client.wire.errors import NetworkError


@pytest.fixture
async def fake():
    cluster = await FakeCluster(3).start()
    cluster.create("t", 1)
    yield cluster
    await cluster.stop()


async def test_election_in_progress_does_not_escalate_the_refresh_backoff(fake) -> None:  # noqa: ANN001
    client = MetadataClient(fake.bootstrap, retry_backoff_ms=20, retry_backoff_max_ms=1000)
    client.add_topics(["t"])
    try:
        fake.topics["t"][0].leader = -1  # the controller is electing a new leader
        for _ in range(6):
            snap = await client.refresh(force=True)
            assert snap.missing_leaders(["t"])
            assert client._backoff_s() == pytest.approx(0.020)  # never grows toward 1 s
        fake.move_leader("t", 0, 2)
        snap = await client.refresh(force=True)
        assert snap.topics["t"][0].leader == 2
        assert client._backoff_s() == 0.0
    finally:
        await client.close()


async def test_unreachable_cluster_backs_off_exponentially(fake) -> None:  # noqa: ANN001
    client = MetadataClient(fake.bootstrap, retry_backoff_ms=20, retry_backoff_max_ms=1000)
    await fake.stop()
    try:
        for _ in range(4):
            with pytest.raises(NetworkError):
                await client.refresh(force=True)
        assert client._backoff_s() >= 0.8 * 20 * 2**3 / 1000
    finally:
        await client.close()


async def test_a_broker_that_never_answers_is_left_for_another(fake) -> None:  # noqa: ANN001
    """A starting broker holds requests until its metadata caught up, and a hung one
    holds them for ever. A metadata request that times out there closes the connection
    and asks the next broker (Kafka's client disconnects on a request timeout too);
    before, the open connection was picked again, and every refresh timed out on it."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads, never answers

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    client = MetadataClient(f"{host}:{port},{fake.bootstrap}", request_timeout_ms=300)
    client.add_topics(["t"])
    try:
        snap = await client.refresh(force=True)
        assert snap.topics["t"][0].leader == 1
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_create_that_timed_out_but_went_on_counts_as_created(fake) -> None:  # noqa: ANN001
    """A controller past a CreateTopics' timeout_ms answers REQUEST_TIMED_OUT and carries
    on (10,000 partitions took longer than 30 s). The admin's retry then heard
    TOPIC_ALREADY_EXISTS for its own topic, and `rillet topic create` failed. A topic it
    may have created itself counts once it shows as asked; one that existed already,
    or in another shape, still fails."""
    fake.create_timeouts = 1
    async with Admin(fake.bootstrap, retry_backoff_ms=10) as admin:
        await admin.create_topics([NewTopic("slow", 4, 1)])
        (desc,) = await admin.describe_topics(["slow"])
        assert len(desc.partitions) == 4
        with pytest.raises(AdminError, match="TOPIC_ALREADY_EXISTS"):
            await admin.create_topics([NewTopic("t", 1, 1)])  # the fixture's, never ours
        fake.create_timeouts = 1
        fake.create("shaped", 2, 1)  # someone else's, with 2 partitions
        with pytest.raises(AdminError, match="TOPIC_ALREADY_EXISTS"):
            await admin.create_topics([NewTopic("shaped", 3, 1)])


def test_a_snapshot_maps_topic_names_to_ids_and_back() -> None:
    from rillet.client.metadata import ClusterMetadata
    from rillet.client.wire import messages as m

    response = m.MetadataResponse(
        cluster_id="c",
        controller_id=1,
        brokers=[m.MetadataBroker(1, "h", 1, None)],
        topics=[
            m.MetadataTopic(0, "t", False, [], "id-t"),
            m.MetadataTopic(0, "__consumer_offsets", True, [], "id-o"),
            m.MetadataTopic(3, "gone", False, []),
        ],
    )
    snap = ClusterMetadata.from_response(response, 0.0)
    assert snap.topic_ids == {"t": "id-t", "__consumer_offsets": "id-o"}
    assert snap.topic_name("id-t") == "t" and snap.topic_name("nope") is None
