"""A follower's fetch session at the leader: an incremental fetch reads the partitions
the follower listed and those that changed (FetchWatch, broker/replica.py), not the
whole session, and the session's FetchClock stands for the fetches of idle partitions
left unread, so the ISR, the HW and the answers stay what reading every partition on
every fetch gave. Driven through the Fetch handler on an in-process ReplicaManager with
a hand-moved clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
from test_replica_manager import batch, commit
from test_replication_checkpoint import broker_config

from rillet.broker.fetch_session import FetchSessionCache
from rillet.broker.handlers.fetch import FetchHandler
from rillet.broker.link.alter_partition_manager import Proposal
from rillet.broker.metrics import BrokerMetrics
from rillet.broker.replica import FetchWatch
from rillet.broker.replica_fetch import FetchParams, FetchPartition, FetchResult
from rillet.broker.replica_manager import REQUEST_TIMED_OUT, ReplicaManager, isr_check_every
from rillet.broker.replication.partition_state import PartitionState
from rillet.broker.replication.types import AlterPartitionResponse
from rillet.client.fetch_session import FetchSessionBuilder
from rillet.client.runtime.rpc_server import Request
from rillet.client.wire import errors, schemas
from rillet.client.wire import messages as m
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    Endpoint,
    Partition,
    RegisterBroker,
    Topic,
    TopicPartition,
    UnfenceBroker,
)
from rillet.storage import LogManager

N = 6  # partitions of "t", led by broker 1, followed by broker 2
LAG_MS = 30_000  # replica.lag.time.max.ms (the default)
FOLLOWER = 2


class Leader:
    """Broker 1's ReplicaManager and Fetch handler, on a clock the test moves."""

    def __init__(self, manager: ReplicaManager, clock: list[int]) -> None:
        self.manager = manager
        self.clock = clock
        self.handler = FetchHandler(manager, BrokerMetrics(), FetchSessionCache())
        self.sent: list[Proposal] = []
        self.reads: list[list[int]] = []  # partitions each first read pass read

    def advance(self, ms: int) -> None:
        self.clock[0] += ms

    def tick(self) -> None:
        self.manager.tick()

    def isr(self, p: int) -> tuple[int, ...]:
        return self.manager.replicas[TopicPartition("t", p)].state.isr

    def proposed(self, p: int) -> tuple[int, ...] | None:
        pending = self.manager.replicas[TopicPartition("t", p)].state.pending_isr_change
        return pending.proposal.new_isr if pending is not None else None


class Follower:
    """Broker 2 fetching every partition of "t" through one session, as its fetcher
    does: a row per partition, listed only when it changed."""

    def __init__(self, leader: Leader, replica_id: int = FOLLOWER) -> None:
        """``replica_id`` -1: a consumer fetching the same way."""
        self.leader = leader
        self.replica_id = replica_id
        self.builder = FetchSessionBuilder()
        self.positions = dict.fromkeys(range(N), 0)
        self.topic_id = leader.manager.replicas[TopicPartition("t", 0)].topic_id

    async def fetch(self, max_wait_ms: int = 0) -> dict[int, m.FetchPartitionResult]:
        response = await self.leader.handler(self.request(max_wait_ms))
        assert response is not None
        assert self.builder.on_response(response.message)
        return {r.partition: r for t in response.message.topics for r in t.partitions}

    def request(self, max_wait_ms: int = 0) -> Request:
        """The next Fetch, as the builder makes it (its answer is the caller's)."""
        wanted = {
            ("t", p): m.FetchPartition(p, offset, -1, 0, -1, 1 << 20, self.topic_id)
            for p, offset in self.positions.items()
        }
        s = self.builder.build(wanted)
        req = m.FetchRequest(
            replica_id=self.replica_id,
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_bytes=10 << 20,
            topics=s.topics,
            session_id=s.session_id,
            session_epoch=s.session_epoch,
            forgotten=s.forgotten,
        )
        return Request(schemas.FETCH, 0, 1, "replica-2", {}, memoryview(b""), "", req)


@pytest.fixture
async def leader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Leader]:
    clock = [1_000_000]
    leader: Leader | None = None

    async def alter_partitions(batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        assert leader is not None
        leader.sent.extend(batch)
        return [AlterPartitionResponse(0, p.new_isr, p.leader_epoch, 1) for _, p in batch]

    logs = LogManager(tmp_path)
    logs.startup()
    manager = ReplicaManager(broker_config(tmp_path), logs, alter_partitions=alter_partitions)
    manager.now_ms = lambda: clock[0]  # type: ignore[method-assign]
    leader = Leader(manager, clock)
    real_read_all = manager._reader.read_all

    def read_all(params: FetchParams, partitions: list[FetchPartition], *args) -> FetchResult:
        if not args or args[0]:  # a first pass
            assert leader is not None
            leader.reads.append([p.partition for p in partitions])
        return real_read_all(params, partitions, *args)

    monkeypatch.setattr(manager._reader, "read_all", read_all)
    endpoints = (Endpoint("BROKER", "h", 1),)
    recs: list = [RegisterBroker(b, f"inc-{b}", 1, endpoints, None) for b in (1, 2)]
    recs += [UnfenceBroker(b, 1) for b in (1, 2)]
    recs.append(Topic("t", "tid"))
    recs += [Partition("tid", p, (1, 2), (1, 2), 1, 0, 0) for p in range(N)]
    await commit(manager, EMPTY_IMAGE, recs)
    yield leader
    await manager.shutdown()
    logs.close()


async def settle_alter_partitions(leader: Leader) -> None:
    queue = leader.manager.alter_partitions.queue
    for _ in range(100):
        await asyncio.sleep(0)
        if queue.in_flight is None and not queue.unsent:
            return
    raise AssertionError("AlterPartition did not settle")


async def test_an_idle_caught_up_follower_stays_in_the_isr_without_being_read(
    leader: Leader,
) -> None:
    follower = Follower(leader)
    await follower.fetch()  # the full fetch opens the session and reads every partition
    assert leader.reads == [list(range(N))]
    for _ in range(10):  # five lag times of incremental fetches that list nothing
        leader.advance(LAG_MS // 2)
        assert await follower.fetch() == {}
        leader.tick()
    assert leader.reads[1:] == [[]] * 10  # nothing read: nothing changed
    # An append finds the follower caught up as of the session's last fetch: no shrink,
    # though its last explicit read of the partition was five lag times ago.
    await leader.manager.append_records([(TopicPartition("t", 3), batch(b"a"))], 1, 1000)
    leader.advance(LAG_MS // 2)
    leader.tick()
    assert all(leader.proposed(p) is None and leader.isr(p) == (1, 2) for p in range(N))
    answer = await follower.fetch()
    assert leader.reads[-1] == [3] and list(answer) == [3] and answer[3].nbytes > 0


async def test_a_follower_that_stops_fetching_is_shrunk(leader: Leader) -> None:
    follower = Follower(leader)
    await follower.fetch()
    leader.advance(LAG_MS // 2)
    await follower.fetch()
    await leader.manager.append_records(
        [(TopicPartition("t", p), batch(b"a")) for p in range(N)], 1, 1000
    )
    leader.advance(LAG_MS // 2)
    leader.tick()
    assert leader.proposed(0) is None  # caught up as of the last fetch, LAG_MS/2 ago
    leader.advance(LAG_MS // 2 + 1)  # no fetch since: the session's clock stopped
    leader.tick()
    assert all(leader.proposed(p) == (1,) for p in range(N))


async def test_a_lagging_partition_is_read_every_fetch_and_shrunk_idle_ones_stay(
    leader: Leader,
) -> None:
    """The follower keeps fetching but never takes partition 0's record: partition 0 has
    news every fetch, so every fetch reads it and its caught-up time stays where it was;
    it leaves the ISR after the lag time, the idle ones do not."""
    follower = Follower(leader)
    await follower.fetch()
    await leader.manager.append_records([(TopicPartition("t", 0), batch(b"a"))], 1, 1000)
    for _ in range(4):
        leader.advance(LAG_MS // 3)
        answer = await follower.fetch()
        assert list(answer) == [0] and leader.reads[-1] == [0]
        leader.tick()
    assert leader.proposed(0) == (1,)
    assert all(leader.proposed(p) is None for p in range(1, N))


async def test_the_hw_follows_a_listed_position_and_a_long_poll_wakes_on_any_partition(
    leader: Leader,
) -> None:
    follower = Follower(leader)
    await follower.fetch()
    tp = TopicPartition("t", 4)
    poll = asyncio.ensure_future(follower.fetch(max_wait_ms=60_000))
    await asyncio.sleep(0)
    assert not poll.done()  # parked: nothing changed
    produce = asyncio.ensure_future(leader.manager.append_records([(tp, batch(b"a"))], -1, 5000))
    answer = await poll  # the append woke the parked fetch, which read partition 4
    assert list(answer) == [4] and answer[4].nbytes > 0 and answer[4].high_watermark == 0
    assert not produce.done()
    follower.positions[4] = 1  # the follower appended it: its next fetch lists 4 at 1
    answer = await follower.fetch()
    assert leader.reads[-1] == [4] and answer[4].high_watermark == 1
    (result,) = await produce
    assert result.error_code == errors.NONE  # acks=all: the HW passed it


async def test_a_log_start_move_is_answered_without_a_listed_change(leader: Leader) -> None:
    follower = Follower(leader)
    tp = TopicPartition("t", 2)
    await leader.manager.append_records([(tp, batch(b"a")), (tp, batch(b"b"))], 1, 1000)
    follower.positions[2] = 2
    assert (await follower.fetch())[2].high_watermark == 2  # both replicas at 2
    assert await follower.fetch() == {}
    leader.manager.replicas[tp].log.increment_log_start_offset(1)
    answer = await follower.fetch()
    assert list(answer) == [2] and answer[2].log_start_offset == 1


async def test_a_follower_shrunk_out_of_the_isr_is_read_again_and_rejoins(
    leader: Leader,
) -> None:
    """The follower's session pauses past the lag time after an append (it was idle at
    the end before): the leader shrinks the ISR; the commit marks the partition changed,
    so the follower's next incremental fetch, which lists nothing, reads it and the
    leader proposes the follower back once it is at the end again."""
    follower = Follower(leader)
    await follower.fetch()
    tp = TopicPartition("t", 1)
    await leader.manager.append_records([(tp, batch(b"a"))], 1, 1000)
    leader.advance(LAG_MS + 1)
    leader.tick()
    await settle_alter_partitions(leader)
    assert leader.isr(1) == (1,) and leader.sent[-1][0] == tp
    answer = await follower.fetch()  # gets the record; 1 read (changed since the append)
    assert leader.reads[-1] == [1] and answer[1].nbytes > 0
    follower.positions[1] = 1
    await follower.fetch()
    await settle_alter_partitions(leader)
    assert leader.isr(1) == (1, 2)
    # The commit marked it once more; read in the ISR at the end, it is idle again and
    # left unread until something changes.
    await follower.fetch()
    assert leader.reads[-1] == [1]
    await follower.fetch()
    assert leader.reads[-1] == []


async def test_a_replaced_session_takes_its_watch_off_the_replicas(leader: Leader) -> None:
    follower = Follower(leader)
    await follower.fetch()
    replicas = [leader.manager.replicas[TopicPartition("t", p)] for p in range(N)]
    assert all(len(r.watchers) == 1 for r in replicas)
    follower.builder.reset()  # a restarted follower: a new full fetch, a new session
    await follower.fetch()
    assert all(len(r.watchers) == 1 for r in replicas)


async def parked(leader: Leader, follower: Follower) -> asyncio.Task:
    """The follower's next fetch, long-polling at the leader (nothing new to read)."""
    task = asyncio.ensure_future(leader.handler(follower.request(max_wait_ms=600_000)))
    sessions = leader.handler.sessions
    for _ in range(100):
        await asyncio.sleep(0)
        session = sessions.get(sessions._by_replica.get(follower.replica_id, 0))
        waiter = getattr(getattr(session, "watch", None), "waiter", None)
        if waiter is not None and not waiter.done():
            return task
    raise AssertionError("the fetch did not park")


async def test_a_session_replaced_by_its_follower_ends_its_parked_fetch(leader: Leader) -> None:
    """A follower that abandoned its long poll (broker/replication/fetcher.py) sends a full
    fetch closing that session: the old fetch must end now, or the new one's answer
    waits behind it on the connection. And its watch stays off the replicas: put back by
    the woken fetch, it stayed on every idle replica for good."""
    follower = Follower(leader)
    tp = TopicPartition("t", 3)
    await leader.manager.append_records([(tp, batch(b"a"))], 1, 1000)
    await follower.fetch()
    old = follower.builder.session_id
    follower.positions[3] = 1  # the parked fetch lists partition 3: it reads it on waking
    task = await parked(leader, follower)
    follower.builder.reset()
    await follower.fetch()
    assert follower.builder.session_id != old
    for _ in range(100):
        if task.done():
            break
        await asyncio.sleep(0)
    assert task.done()
    replicas = [leader.manager.replicas[TopicPartition("t", p)] for p in range(N)]
    assert all(w.session.id != old for r in replicas for w in r.watchers)


async def test_an_evicted_sessions_parked_fetch_waits_out_its_poll(leader: Leader) -> None:
    """Ended at once, the evicted follower would evict the evictor at once, and so on:
    two followers ping-ponged full fetches at network speed with one slot."""
    leader.handler = FetchHandler(leader.manager, BrokerMetrics(), FetchSessionCache(max_slots=1))
    follower = Follower(leader)
    await follower.fetch()
    task = await parked(leader, follower)
    await Follower(leader, replica_id=3).fetch()  # takes the only slot
    assert leader.handler.sessions.evictions == 1
    for _ in range(100):
        await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_hw_move_alone_marks_a_parked_follower_fetch_but_wakes_only_consumers(
    leader: Leader,
) -> None:
    """Followers read to the log end: a HW move gives a parked follower fetch nothing to
    answer (woken, it read and parked again, on every acks=all produce). Its session is
    marked, so its next fetch carries the new HW. A consumer reads to the HW: woken by
    the HW move, not by an append that leaves the HW where it was."""
    follower = Follower(leader)
    await follower.fetch()
    tp = TopicPartition("t", 1)
    replica = leader.manager.replicas[tp]
    task = await parked(leader, follower)
    session = leader.handler.sessions.get(follower.builder.session_id)
    assert session is not None
    consumer = Follower(leader, replica_id=-1)
    polling = asyncio.ensure_future(leader.handler(consumer.request(max_wait_ms=600_000)))
    for _ in range(100):
        if replica.hw_waiters:
            break
        await asyncio.sleep(0)
    assert replica.hw_waiters and not polling.done()

    watch = session.watch
    assert isinstance(watch, FetchWatch) and watch.waiter is not None
    consumer_waiter = replica.hw_waiters[0]
    replica.high_watermark_updated(replica.state.high_watermark)
    assert consumer_waiter.done()  # the consumer's fetch reads again
    assert not watch.waiter.done() and ("t", 1) in session.changed  # the follower's: marked
    consumer_waiter = asyncio.get_running_loop().create_future()
    replica.hw_waiters.append(consumer_waiter)  # as the consumer's fetch parks again
    replica.log_appended()  # new records: what a follower fetches, not a consumer yet
    assert watch.waiter.done() and not consumer_waiter.done()
    for t in (task, polling):
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t


def fetch_request(replica_id: int, p: int, offset: int, topic_id: str = "") -> Request:
    """A sessionless Fetch of one partition of "t" that long-polls."""
    row = m.FetchPartition(p, offset, -1, 0, -1, 1 << 20, topic_id)
    req = m.FetchRequest(
        replica_id=replica_id,
        max_wait_ms=600_000,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[m.FetchTopic("t", [row])],
    )
    return Request(schemas.FETCH, 0, 1, "c", {}, memoryview(b""), "", req)


async def loop_turns(done: Callable[[], bool], turns: int = 100) -> bool:
    for _ in range(turns):
        if done():
            return True
        await asyncio.sleep(0)
    return done()


async def test_a_consumer_parked_on_an_acks_all_append_wakes_when_the_hw_moves(
    leader: Leader,
) -> None:
    """The append leaves the HW where it was (the follower has not fetched it): the
    consumer's parked fetch is not woken by it, but by the follower's fetch that moves
    the HW, and answers the record."""
    tp = TopicPartition("t", 0)
    replica = leader.manager.replicas[tp]
    follower = Follower(leader)
    await follower.fetch()
    poll = asyncio.ensure_future(leader.handler(fetch_request(-1, 0, 0)))
    assert await loop_turns(lambda: bool(replica.hw_waiters))
    produce = asyncio.ensure_future(leader.manager.append_records([(tp, batch(b"a"))], -1, 5000))
    assert not await loop_turns(poll.done, 20)
    assert (await follower.fetch())[0].nbytes > 0
    follower.positions[0] = 1
    await follower.fetch()  # its position moves the HW to 1
    assert await loop_turns(poll.done)
    (row,) = poll.result().message.topics[0].partitions
    assert row.high_watermark == 1 and row.nbytes > 0
    (result,) = await produce
    assert result.error_code == errors.NONE


async def test_a_follower_fetch_without_a_session_is_woken_by_an_append(leader: Leader) -> None:
    """A follower fetching with no session (the leader's cache has no slot for it)
    reads to the log end: an append, which moves no HW here, must wake it."""
    tp = TopicPartition("t", 1)
    replica = leader.manager.replicas[tp]
    poll = asyncio.ensure_future(
        leader.handler(fetch_request(FOLLOWER, 1, 0, topic_id=replica.topic_id))
    )
    assert await loop_turns(lambda: bool(replica.waiters)) and not replica.hw_waiters
    await leader.manager.append_records([(tp, batch(b"a"))], 1, 1000)
    assert await loop_turns(poll.done)
    assert poll.result().message.topics[0].partitions[0].nbytes > 0


async def test_a_tick_acts_only_on_replicas_that_may_have_something_to_do(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once every follower is at the end, nothing can come of a tick: it reaches no core
    until an append (or another event) makes one able to act, and a follower that stops
    fetching after that append is still shrunk."""
    ticked: list[int] = []
    real_tick = PartitionState.tick
    names = {id(r.state): tp.partition for tp, r in leader.manager.replicas.items()}

    def tick(self: PartitionState, now_ms: int) -> tuple:
        ticked.append(names[id(self)])
        return real_tick(self, now_ms)

    monkeypatch.setattr(PartitionState, "tick", tick)
    leader.tick()
    assert sorted(ticked) == list(range(N))  # positions unknown: a shrink may come
    follower = Follower(leader)
    await follower.fetch()
    ticked.clear()
    leader.tick()  # the first tick after the fetch finds every core idle
    assert sorted(ticked) == list(range(N))
    ticked.clear()
    for _ in range(3):
        leader.advance(LAG_MS)
        leader.tick()
    assert ticked == []
    await leader.manager.append_records([(TopicPartition("t", 2), batch(b"a"))], 1, 1000)
    leader.advance(LAG_MS + 1)
    leader.tick()
    assert ticked == [2] and leader.proposed(2) == (1,)


async def test_isr_checks_wait_for_their_own_tick_but_acks_all_expiry_does_not(
    leader: Leader,
) -> None:
    """Between ISR checks (every half lag time, as Kafka's isr-expiration task) a tick
    leaves a lagging leader alone: checking every one at every tick kept a broker of
    50,000 catching-up partitions busy most of each second. A partition with acks=all
    waiters is ticked every time: they expire, and its ISR is checked too (a shrink is
    what lets such waiters complete)."""
    follower = Follower(leader)
    await follower.fetch()
    await leader.manager.append_records([(TopicPartition("t", 0), batch(b"a"))], 1, 1000)
    waiting = asyncio.ensure_future(
        leader.manager.append_records([(TopicPartition("t", 1), batch(b"b"))], -1, 1000)
    )
    await asyncio.sleep(0)
    leader.advance(2 * LAG_MS)  # the follower has not fetched since: lagging on 0 and 1
    leader.manager.tick(isr_check=False)
    assert leader.proposed(0) is None  # idle but for the check: left for the ISR check
    assert leader.proposed(1) == (1,)
    result = await waiting  # expired by that tick
    assert [r.error_code for r in result] == [REQUEST_TIMED_OUT]
    leader.manager.tick(isr_check=True)
    assert leader.proposed(0) == (1,)


def test_isr_checks_come_every_half_lag_time() -> None:
    assert isr_check_every(100, 30_000) == 150  # 15 s, Kafka's default period
    assert isr_check_every(100, 150) == 1  # never less often than every tick
    assert isr_check_every(1, 10) == 5
