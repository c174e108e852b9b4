"""Fetch sessions on real brokers (broker/fetch_session.py, client/fetch_session.py):
two in-process brokers over real sockets, broker 1 leading partitions broker 2 follows
through its real fetcher, and consumers fetching from broker 1.

- A follower's idle fetches list no partition at all, however many it follows; a
  partition whose fetch offset moved is listed alone, and the answer carries only it.
- An evicted session (the leader's cache emptied) makes the follower and the consumer
  start over with a full fetch, and no record is lost or duplicated.
- So does a restarted leader (a new process's empty cache, a new port): both start over
  with a full fetch, then fetch incrementally again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import wait_until_async
from test_broker_inproc import batch, produce
from test_replication_fetcher_faults import TOPIC, Link, Pair, SharedMetadata, start_pair

from rillet.broker.handlers.fetch import FetchHandler
from rillet.broker.server import BrokerServer
from rillet.client.consumer import Consumer
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection
from rillet.controller.metadata.image import Partition, TopicPartition

PARTITIONS = 40
FETCH_SESSION_ID_NOT_FOUND = errors.code_of("FETCH_SESSION_ID_NOT_FOUND")
FOLLOWER = 2
CONSUMER = -1


@dataclass
class Seen:
    """One Fetch the leader answered: who, the session fields, what it listed and sent."""

    replica_id: int
    session_id: int
    session_epoch: int
    listed: list[int]
    answered: list[int]
    error_code: int


@dataclass
class Recorder:
    seen: list[Seen] = field(default_factory=list)

    def of(self, replica_id: int) -> list[Seen]:
        return [s for s in self.seen if s.replica_id == replica_id]

    def incremental(self, replica_id: int) -> Iterator[Seen]:
        return (s for s in self.of(replica_id) if s.session_epoch > 0 and not s.error_code)


@pytest.fixture
async def recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Pair, Recorder]]:
    recorder = Recorder()
    real = FetchHandler.__call__

    async def recording(self: FetchHandler, request: Request) -> Response:
        req: m.FetchRequest = request.message
        response = await real(self, request)
        resp: m.FetchResponse = response.message  # type: ignore[assignment]
        recorder.seen.append(
            Seen(
                req.replica_id,
                req.session_id,
                req.session_epoch,
                [p.partition for t in req.topics for p in t.partitions],
                [p.partition for t in resp.topics for p in t.partitions],
                resp.error_code,
            )
        )
        return response

    monkeypatch.setattr(FetchHandler, "__call__", recording)
    async with start_pair(tmp_path, SharedMetadata(), partitions=PARTITIONS, backoff_ms=50) as p:
        yield p, recorder


def logs(pair: Pair, partition: int) -> tuple[bytes, bytes]:
    """The leader's and the follower's bytes of one partition."""
    out = []
    for server in (pair.leader, pair.follower):
        assert server.replicas is not None
        log = server.replicas.replicas[TopicPartition(TOPIC, partition)].log
        out.append(log.read(0, 1 << 24, None).read())
    return out[0], out[1]


async def steady(recorder: Recorder, replica_id: int, fetches: int = 3) -> int:
    """Wait for ``fetches`` incremental fetches that list nothing in a row; the index
    of the next request."""

    def quiet() -> bool:
        tail = recorder.of(replica_id)[-fetches:]
        return len(tail) == fetches and all(
            s.session_epoch > 0 and not s.listed and not s.answered for s in tail
        )

    await wait_until_async(quiet)
    return len(recorder.of(replica_id))


async def test_idle_follower_fetches_list_no_partitions(
    recorded: tuple[Pair, Recorder],
) -> None:
    pair, recorder = recorded
    await steady(recorder, FOLLOWER)
    first = recorder.of(FOLLOWER)[0]
    assert first.session_epoch == 0 and sorted(first.listed) == list(range(PARTITIONS))
    assert sorted(first.answered) == list(range(PARTITIONS))
    session = pair.leader.fetch_sessions.get(recorder.of(FOLLOWER)[-1].session_id)
    assert session is not None and len(session.partitions) == PARTITIONS

    # One partition gets a record: only it is listed (its fetch offset moved) and only it
    # is answered (its records, then its new high watermark).
    start = await steady(recorder, FOLLOWER)
    assert (await produce(pair.conn, TOPIC, 3, batch(b"a")))[1] == 0
    await wait_until_async(lambda: pair.follower_leo(3) == 1)
    await steady(recorder, FOLLOWER)
    after = recorder.of(FOLLOWER)[start:]
    assert all(s.session_epoch > 0 and not s.error_code for s in after)
    assert {p for s in after for p in s.listed} == {3}
    assert {p for s in after for p in s.answered} == {3}
    assert logs(pair, 3)[0] == logs(pair, 3)[1]


async def test_an_evicted_session_falls_back_to_a_full_fetch_without_loss(
    recorded: tuple[Pair, Recorder],
) -> None:
    pair, recorder = recorded
    start = await steady(recorder, FOLLOWER)
    assert pair.follower.fetchers is not None
    fetcher = pair.follower.fetchers.fetchers[1]
    conn = fetcher._conn
    pair.leader.fetch_sessions.clear()
    for partition in range(5):
        assert (await produce(pair.conn, TOPIC, partition, batch(b"x", b"y")))[1] == 0
    await wait_until_async(lambda: all(pair.follower_leo(p) == 2 for p in range(5)))
    await steady(recorder, FOLLOWER)
    assert pair.leader.metrics is not None
    registry = pair.leader.metrics.registry
    assert registry.get_sample_value("rillet_broker_fetch_session_evictions") == 1
    assert registry.get_sample_value("rillet_broker_fetch_sessions") == 1
    after = recorder.of(FOLLOWER)[start:]
    i = next(i for i, s in enumerate(after) if s.error_code)  # a fetch out may end first
    assert after[i].error_code == FETCH_SESSION_ID_NOT_FOUND
    assert after[i + 1].session_epoch == 0
    assert sorted(after[i + 1].listed) == list(range(PARTITIONS))
    for partition in range(PARTITIONS):
        leader, follower = logs(pair, partition)
        assert leader == follower  # nothing lost, nothing twice
    assert fetcher._conn is conn  # a session error is not a connection error


@dataclass
class Tally:
    """Records produced through ``conn`` and records ``consumer`` returned, per partition."""

    consumer: Consumer
    conn: Connection
    expected: dict[int, list[bytes]] = field(
        default_factory=lambda: {p: [] for p in range(PARTITIONS)}
    )
    got: dict[int, list[bytes]] = field(default_factory=lambda: {p: [] for p in range(PARTITIONS)})

    async def send(self, partitions: range, value: bytes) -> None:
        for p in partitions:
            assert (await produce(self.conn, TOPIC, p, batch(value)))[1] == 0
            self.expected[p].append(value)

    async def consume_all(self) -> bool:
        for tp, recs in (await self.consumer.getmany(timeout_ms=20)).items():
            self.got[tp.partition].extend(r.value for r in recs)
        return self.got == self.expected


def consumer_of(*brokers: BrokerServer) -> Consumer:
    return Consumer(
        assignment=[(TOPIC, p) for p in range(PARTITIONS)],
        bootstrap=",".join(f"127.0.0.1:{b.port}" for b in brokers),
        from_beginning=True,
        fetch_max_wait_ms=50,
        retry_backoff_ms=20,
    )


async def test_a_consumer_fetches_incrementally_and_survives_eviction(
    recorded: tuple[Pair, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rillet.client.consumer")
    pair, recorder = recorded
    consumer = consumer_of(pair.leader)
    tally = Tally(consumer, pair.conn)
    async with consumer:
        await tally.send(range(0, PARTITIONS, 7), b"one")
        await wait_until_async(tally.consume_all)
        start = await steady(recorder, CONSUMER)
        assert all(not s.listed for s in recorder.of(CONSUMER)[start - 3 : start])
        assert pair.leader.fetch_sessions.get(recorder.of(CONSUMER)[-1].session_id)

        pair.leader.fetch_sessions.clear()  # evicted (or the broker restarted)
        await tally.send(range(0, PARTITIONS, 3), b"two")
        await wait_until_async(tally.consume_all)
        await tally.send(range(1, PARTITIONS, 5), b"three")
        await wait_until_async(tally.consume_all)
    after = recorder.of(CONSUMER)[start:]
    i = next(i for i, s in enumerate(after) if s.error_code)
    assert after[i].error_code == FETCH_SESSION_ID_NOT_FOUND
    assert after[i + 1].session_epoch == 0  # a full fetch at once: not a failed fetch
    assert not any("failed" in r.getMessage() for r in caplog.records)
    assert tally.got == tally.expected  # nothing lost, nothing twice, in order


async def test_a_restarted_leader_makes_follower_and_consumer_start_over_without_loss(
    recorded: tuple[Pair, Recorder],
) -> None:
    pair, recorder = recorded
    link = pair.leader.link
    assert isinstance(link, Link)
    consumer = consumer_of(pair.follower, pair.leader)
    tally = Tally(consumer, pair.conn)
    async with consumer:
        await tally.send(range(0, PARTITIONS, 4), b"before")
        await wait_until_async(tally.consume_all)
        await steady(recorder, FOLLOWER)
        await steady(recorder, CONSUMER)
        follower_start = len(recorder.of(FOLLOWER))
        consumer_start = len(recorder.of(CONSUMER))

        # Restart the leader on its log directory (a new port, found through metadata):
        # its session cache starts empty.
        leader = pair.leader
        await leader.stop(controlled=False)
        link.shared.listeners.remove(leader._on_metadata)
        restarted = BrokerServer(leader.config, link=Link(link.shared, 1))  # type: ignore[arg-type]
        await restarted.start()
        # As a controller would on the broker's return: leadership under a new epoch.
        topic = link.shared.image.topic(TOPIC)
        assert topic is not None
        await link.shared.commit(
            [Partition(topic.topic_id, p, (1, 2), (1, 2), 1, 1, 1) for p in range(PARTITIONS)]
        )
        tally.conn = await Connection.open("127.0.0.1", restarted.port)
        try:
            await tally.send(range(0, PARTITIONS, 3), b"after")
            await wait_until_async(tally.consume_all)
            await wait_until_async(
                lambda: all(
                    pair.follower_leo(p) == len(tally.expected[p]) for p in range(PARTITIONS)
                )
            )
            for partition in range(PARTITIONS):
                a, b = logs(Pair(restarted, pair.follower, tally.conn), partition)
                assert a == b  # the follower's copy: nothing lost, nothing twice
            await steady(recorder, FOLLOWER)
        finally:
            tally.conn.close()
            await restarted.stop(controlled=False)
    # Both started over with a full fetch at the restarted broker (naming, to close it,
    # the session they lost), then went incremental.
    for seen in (recorder.of(FOLLOWER)[follower_start:], recorder.of(CONSUMER)[consumer_start:]):
        assert seen[0].session_epoch == 0 and not seen[0].error_code
        assert any(s.session_epoch > 0 for s in seen)
    assert tally.got == tally.expected  # the consumer's: nothing lost, nothing twice, in order
