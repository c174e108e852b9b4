"""The follower fetcher under unexpected errors (broker/replication/fetcher.py, docs/broker.md
"Faults"): two in-process brokers with hand-made metadata, broker 1 leading two
partitions that broker 2 follows through its real fetcher over a real socket.

- An unexpected error applying one partition's data (a storage invariant) marks that
  partition failed: logged at ERROR with the traceback, no longer fetched, counted; the
  other partition keeps replicating.
- An unexpected error in the fetch loop itself restarts the loop; replication resumes.
- A partition that becomes fetchable while the fetcher's long poll is parked at the
  leader (added by new metadata, or released from a back-off) is fetched at once, not
  when the poll ends: a new topic's first acks=all produce waited out
  replica.fetch.wait.max.ms (and a second on the full back-off before that).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until_async
from test_broker_inproc import batch, broker_config, produce

from rillet.broker.link.alter_partition_manager import Proposal
from rillet.broker.replication.fetcher import FetcherConfig, SourceFetcher
from rillet.broker.replication.types import AlterPartitionResponse
from rillet.broker.server import BrokerServer, MetadataListener
from rillet.client.wire import errors
from rillet.client.wire.connection import Connection
from rillet.controller.metadata.image import (
    Endpoint,
    MetadataDelta,
    MetadataImage,
    MetadataRecord,
    Partition,
    RegisterBroker,
    Topic,
    TopicPartition,
    UnfenceBroker,
)
from rillet.storage import InvariantError

TOPIC = "events"


class SharedMetadata:
    """Plays the controller for several in-process brokers: every commit goes to all."""

    def __init__(self) -> None:
        self.image = MetadataImage()
        self.offset = 0
        self.listeners: list[MetadataListener] = []

    async def commit(self, recs: list[MetadataRecord]) -> None:
        delta = MetadataDelta(self.image)
        for rec in recs:
            self.offset += 1
            delta.replay(rec, self.offset, 1)
        self.image = delta.apply()
        for listener in self.listeners:
            await listener(delta, self.image)


@dataclass
class Link:
    shared: SharedMetadata
    node_id: int

    async def start(self, endpoints: list[tuple[str, str, int]], on_metadata: MetadataListener):
        self.shared.listeners.append(on_metadata)
        eps = tuple(Endpoint(*e) for e in endpoints)
        await self.shared.commit(
            [
                RegisterBroker(self.node_id, uuid.uuid4().hex, 1, eps, None),
                UnfenceBroker(self.node_id, 1),
            ]
        )

    def controller_id(self) -> int:
        return 100

    async def forward(self, message: Any) -> Any:
        raise AssertionError(message)

    async def alter_partitions(self, batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        return [AlterPartitionResponse(errors.code_of("OPERATION_NOT_ATTEMPTED"))] * len(batch)

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        return True

    async def stop(self) -> None:
        pass


@dataclass
class Pair:
    leader: BrokerServer
    follower: BrokerServer
    conn: Connection  # to the leader

    def follower_leo(self, partition: int) -> int:
        assert self.follower.replicas is not None
        replica = self.follower.replicas.replicas.get(TopicPartition(TOPIC, partition))
        return replica.log.log_end_offset if replica is not None else -1


@contextlib.asynccontextmanager
async def start_pair(
    tmp_path: Path,
    shared: SharedMetadata,
    *,
    partitions: int,
    backoff_ms: int,
    max_wait_ms: int = 50,
) -> AsyncIterator[Pair]:
    """Broker 1 leads ``partitions`` partitions of TOPIC that broker 2 follows, with
    ``max_wait_ms`` as replica.fetch.wait.max.ms."""
    servers = []
    try:
        for node_id in (1, 2):
            config = broker_config(
                tmp_path / f"logs-{node_id}",
                f"node.id={node_id}",
                f"replica.fetch.backoff.ms={backoff_ms}",
                f"replica.fetch.wait.max.ms={max_wait_ms}",
            )
            server = BrokerServer(config, link=Link(shared, node_id))  # type: ignore[arg-type]
            await server.start()
            servers.append(server)
        topic_id = uuid.uuid4().hex
        await shared.commit(
            [Topic(TOPIC, topic_id)]
            + [Partition(topic_id, p, (1, 2), (1, 2), 1, 0, 0) for p in range(partitions)]
        )
        async with await Connection.open("127.0.0.1", servers[0].port) as conn:
            yield Pair(servers[0], servers[1], conn)
    finally:
        for server in reversed(servers):
            await server.stop(controlled=False)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with start_pair(tmp_path, SharedMetadata(), partitions=2, backoff_ms=50) as p:
        yield p


async def test_unexpected_partition_error_marks_it_failed_and_others_keep_replicating(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert pair.follower.replicas is not None and pair.follower.fetchers is not None
    broken = pair.follower.replicas.replicas[TopicPartition(TOPIC, 0)]

    def append_as_follower(data: Any) -> tuple[int, int]:
        raise InvariantError("segment index out of order")  # not a RilletError/OSError

    monkeypatch.setattr(broken.log, "append_as_follower", append_as_follower)
    for partition in (0, 1):
        assert (await produce(pair.conn, TOPIC, partition, batch(b"a", b"b")))[1] == 0
    fetchers = pair.follower.fetchers
    await wait_until_async(lambda: pair.follower_leo(1) == 2)
    await wait_until_async(lambda: fetchers.failed_partitions == {TopicPartition(TOPIC, 0)})

    # Partition 1 keeps replicating after partition 0 failed; partition 0 is not fetched.
    assert (await produce(pair.conn, TOPIC, 1, batch(b"c")))[1] == 0
    await wait_until_async(lambda: pair.follower_leo(1) == 3)
    assert pair.follower_leo(0) == 0
    assert TopicPartition(TOPIC, 0) not in fetchers.partitions_of(1)
    assert TopicPartition(TOPIC, 1) in fetchers.partitions_of(1)
    assert pair.follower.metrics is not None
    assert pair.follower.metrics.snapshot()["failed_partitions"] == 1

    errors_logged = [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == "rillet.broker.replication.fetcher"
    ]
    assert len(errors_logged) == 1
    assert "marked failed" in errors_logged[0].getMessage()
    assert errors_logged[0].exc_info is not None
    assert isinstance(errors_logged[0].exc_info[1], InvariantError)
    assert all(fetcher.restarts == 0 for fetcher in fetchers.fetchers.values())


async def test_a_new_leader_epoch_fetches_a_failed_partition_again(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert pair.follower.replicas is not None and pair.follower.fetchers is not None
    tp = TopicPartition(TOPIC, 0)
    broken = pair.follower.replicas.replicas[tp]
    real_append = broken.log.append_as_follower
    calls: list[int] = []

    def append_once_broken(data: Any) -> tuple[int, int]:
        calls.append(1)
        if len(calls) == 1:
            raise InvariantError("transient invariant")
        return real_append(data)

    monkeypatch.setattr(broken.log, "append_as_follower", append_once_broken)
    assert (await produce(pair.conn, TOPIC, 0, batch(b"a")))[1] == 0
    fetchers = pair.follower.fetchers
    await wait_until_async(lambda: tp in fetchers.failed_partitions)
    # Kafka re-adds a partition to a fetcher on a leadership change: so do we.
    link = pair.follower.link
    assert isinstance(link, Link)
    topic = link.shared.image.topic(TOPIC)
    assert topic is not None
    await link.shared.commit([Partition(topic.topic_id, 0, (1, 2), (1, 2), 1, 1, 1)])
    await wait_until_async(lambda: pair.follower_leo(0) == 1)
    assert fetchers.failed_partitions == set()


async def test_an_unexpected_loop_error_restarts_the_fetcher(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert pair.follower.fetchers is not None
    fetcher = pair.follower.fetchers.fetchers[1]
    real_handle = fetcher._handle_response
    calls: list[int] = []

    def handle_once_broken(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("malformed response")
        real_handle(*args)

    monkeypatch.setattr(fetcher, "_handle_response", handle_once_broken)
    for partition in (0, 1):
        assert (await produce(pair.conn, TOPIC, partition, batch(b"a")))[1] == 0
    await wait_until_async(lambda: pair.follower_leo(0) == 1 and pair.follower_leo(1) == 1)
    assert fetcher.restarts == 1
    assert pair.follower.fetchers.fetchers[1] is fetcher  # the same fetcher, restarted
    assert pair.follower.fetchers.failed_partitions == set()
    restarts = [r for r in caplog.records if "restarting" in r.getMessage()]
    assert restarts and restarts[0].exc_info is not None


async def test_follower_ahead_of_its_leader_in_metadata_retries_soon(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Brokers follow the metadata log independently: after a leader change the follower
    may fetch with the new epoch before the leader has applied it (UNKNOWN_LEADER_EPOCH).
    That must not cost the full replica.fetch.backoff.ms, which held the HW (and every
    acks=all produce) for a second after each failover. The backoff here is 10 minutes,
    so only the short catch-up retry lets the follower replicate within the wait."""
    caplog.set_level(logging.INFO, logger="rillet.broker.replication.fetcher")
    shared = SharedMetadata()
    async with start_pair(tmp_path, shared, partitions=1, backoff_ms=600_000) as pair:
        conn = pair.conn
        topic = shared.image.topic(TOPIC)
        assert topic is not None
        assert (await produce(conn, TOPIC, 0, batch(b"a")))[1] == 0
        await wait_until_async(lambda: pair.follower_leo(0) == 1)

        # The new epoch reaches the follower first; the leader lags one record behind.
        delta = MetadataDelta(shared.image)
        shared.offset += 1
        delta.replay(Partition(topic.topic_id, 0, (1, 2), (1, 2), 1, 1, 1), shared.offset, 1)
        shared.image = delta.apply()
        to_leader, to_follower = shared.listeners
        await to_follower(delta, shared.image)
        await wait_until_async(
            lambda: any("UNKNOWN_LEADER_EPOCH" in r.getMessage() for r in caplog.records)
        )
        await to_leader(delta, shared.image)

        assert (await produce(conn, TOPIC, 0, batch(b"b")))[1] == 0
        await wait_until_async(lambda: pair.follower_leo(0) == 2)


async def test_partitions_a_response_refuses_are_logged_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader that has not applied new metadata yet refuses every partition it covers:
    with a line per partition, the thousands of one CreateTopics held the follower's
    loop for 300-700 ms per response. One INFO line per error names a few and counts."""
    caplog.set_level(logging.INFO, logger="rillet.broker.replication.fetcher")
    shared = SharedMetadata()
    async with start_pair(tmp_path, shared, partitions=30, backoff_ms=600_000) as pair:
        topic = shared.image.topic(TOPIC)
        assert topic is not None
        delta = MetadataDelta(shared.image)
        shared.offset += 1
        for p in range(30):  # a new leader epoch that only the follower applies
            delta.replay(Partition(topic.topic_id, p, (1, 2), (1, 2), 1, 1, 1), shared.offset, 1)
        shared.image = delta.apply()
        _, to_follower = shared.listeners
        await to_follower(delta, shared.image)
        await wait_until_async(
            lambda: any("UNKNOWN_LEADER_EPOCH" in r.getMessage() for r in caplog.records)
        )
        lines = [r.getMessage() for r in caplog.records if "UNKNOWN_LEADER_EPOCH" in r.getMessage()]
        assert all("UNKNOWN_LEADER_EPOCH for 30 (" in line for line in lines), lines[:3]
        assert pair.follower_leo(0) == 0


MORE = "more"  # a topic created while the follower's long poll is parked


def leo(server: BrokerServer, topic: str, partition: int) -> int:
    assert server.replicas is not None
    replica = server.replicas.replicas.get(TopicPartition(topic, partition))
    return replica.log.log_end_offset if replica is not None else -1


def follower_parked(pair: Pair) -> bool:
    """The follower's fetch session at the leader has a fetch waiting in its long poll."""
    sessions = pair.leader.fetch_sessions
    session = sessions.get(sessions._by_replica.get(2, 0))
    watch = getattr(session, "watch", None)
    waiter = getattr(watch, "waiter", None)
    return waiter is not None and not waiter.done()


def new_topic_delta(shared: SharedMetadata) -> MetadataDelta:
    """MORE, one partition led by broker 1 and followed by broker 2: applied to the
    shared image, not yet handed to either broker."""
    topic_id = uuid.uuid4().hex
    delta = MetadataDelta(shared.image)
    for rec in (Topic(MORE, topic_id), Partition(topic_id, 0, (1, 2), (1, 2), 1, 0, 0)):
        shared.offset += 1
        delta.replay(rec, shared.offset, 1)
    shared.image = delta.apply()
    return delta


@pytest.mark.parametrize("first", ["leader", "follower"])
async def test_a_partition_added_during_a_long_poll_is_fetched_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, first: str
) -> None:
    """The long poll and the back-off are 10 minutes here, so only fetching the new
    partition at once replicates it within the wait. ``first``: which broker applies
    the new topic first. The follower first: its fetch of the new partition is refused
    (UNKNOWN_TOPIC_OR_PARTITION: the leader has not applied it yet) and retried soon,
    as a leader catching up on metadata is; the leader first: nothing tells the
    follower's parked poll, so the follower must stop waiting for it."""
    caplog.set_level(logging.INFO, logger="rillet.broker.replication.fetcher")
    shared = SharedMetadata()
    async with start_pair(
        tmp_path, shared, partitions=1, backoff_ms=600_000, max_wait_ms=600_000
    ) as pair:
        assert (await produce(pair.conn, TOPIC, 0, batch(b"a")))[1] == 0
        await wait_until_async(lambda: pair.follower_leo(0) == 1)
        await wait_until_async(lambda: follower_parked(pair))

        delta = new_topic_delta(shared)
        to_leader, to_follower = shared.listeners
        if first == "leader":
            await to_leader(delta, shared.image)
            await to_follower(delta, shared.image)
        else:
            await to_follower(delta, shared.image)
            await wait_until_async(
                lambda: any(
                    "UNKNOWN_TOPIC_OR_PARTITION" in r.getMessage() and MORE in r.getMessage()
                    for r in caplog.records
                )
            )
            await to_leader(delta, shared.image)

        assert (await produce(pair.conn, MORE, 0, batch(b"b")))[1] == 0
        await wait_until_async(lambda: leo(pair.follower, MORE, 0) == 1)
        # and the partition that was parked replicates on as before
        assert (await produce(pair.conn, TOPIC, 0, batch(b"c")))[1] == 0
        await wait_until_async(lambda: pair.follower_leo(0) == 2)


class FakeConn:
    def __init__(self) -> None:
        self.abandoned = 0

    def abandon(self) -> None:
        self.abandoned += 1


async def test_abandoning_a_long_poll_is_rate_limited_and_only_when_it_saves_time() -> None:
    """Each abandon costs a full fetch (the whole session listed and answered): a
    failover's burst of metadata deltas must not turn into a burst of them."""
    fetcher = SourceFetcher(None, 1)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()

    def send(conn: FakeConn, wait_s: float) -> None:  # as _fetch_loop marks a Fetch out
        fetcher._in_flight = conn  # type: ignore[assignment]
        fetcher._in_flight_generation = fetcher._generation
        fetcher._in_flight_until = loop.time() + wait_s

    first = FakeConn()
    send(first, 600)
    fetcher._interrupt()
    assert first.abandoned == 1 and fetcher._in_flight is None
    short = FakeConn()  # a poll a back-off already cut short ends soon anyway
    send(short, 0.02)
    fetcher._interrupt()
    assert short.abandoned == 0
    second = FakeConn()  # within the interval: one abandon, later
    send(second, 600)
    for _ in range(40):
        fetcher._interrupt()
    assert second.abandoned == 0 and fetcher._abandon_timer is not None
    await wait_until_async(lambda: second.abandoned == 1)
    third, fourth = FakeConn(), FakeConn()
    send(third, 600)
    fetcher._interrupt()  # deferred again; then third is answered and fourth goes out,
    send(fourth, 600)  # built with everything: the deferred check leaves it be
    await wait_until_async(lambda: fetcher._abandon_timer is None)
    assert third.abandoned == fourth.abandoned == 0


def test_a_lasting_catch_up_refusal_backs_off_longer_each_time() -> None:
    """A leader catching up on metadata answers within a few 50 ms tries; one that keeps
    refusing must not cost a fetch and a log line every 50 ms (the back-off now also
    shortens the long poll of the other partitions, so it is no longer hidden by it)."""

    class Manager:
        config = FetcherConfig(broker_id=2, backoff_ms=1000)

    fetcher = SourceFetcher(Manager(), 1)  # type: ignore[arg-type]
    tp = TopicPartition(TOPIC, 0)
    delays = [fetcher._catch_up_delay(tp) for _ in range(7)]
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    fetcher.remove(tp)  # forgotten with the partition (and reset by a good answer)
    assert fetcher._catch_up_delay(tp) == 0.05
