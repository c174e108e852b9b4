"""The group consumer's driver (client/group_consumer.py) against the in-memory fake
cluster with the real coordinator core behind the group APIs: what a real cluster
cannot do on demand (a commit answered STALE_MEMBER_EPOCH or FENCED_MEMBER_EPOCH,
heartbeats that stop being answered). Real processes: test_group_consumer_cluster.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from helpers import wait_until_async
from test_client_fake_broker import FakeCluster

from rillet.broker.group.assignors import TopicSpec
from rillet.broker.group.coordinator import (
    GroupConfig,
    GroupCoordinator,
    Heartbeat,
    OffsetCommit,
)
from rillet.client.consumer import Consumer, TopicPartition
from rillet.client.group_consumer import CommitFailedError
from rillet.client.producer import Producer
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import errors, schemas
from rillet.client.wire import messages as m

SESSION_MS = 1_500
COORDINATOR = 1


class GroupFake(FakeCluster):
    """The fake cluster with one group's coordinator (the real core) on broker 1."""

    def __init__(self) -> None:
        super().__init__(3)
        self.group = GroupCoordinator(
            "g", GroupConfig(session_timeout_ms=SESSION_MS, heartbeat_interval_ms=100)
        )
        self.commit_inject: list[int] = []  # codes for the next commits' partitions
        self.commits = 0
        self.answer_heartbeats = True

    def _handlers(self, node: int) -> dict[int, Any]:
        handlers = super()._handlers(node)

        def bind(fn: Any) -> Any:
            async def handler(request: Request) -> Response:
                self.group.tick(self._now())
                return Response(fn(request.message))

            return handler

        handlers[schemas.FIND_COORDINATOR.key] = bind(self._find)
        handlers[schemas.CONSUMER_GROUP_HEARTBEAT.key] = bind(self._heartbeat)
        handlers[schemas.OFFSET_COMMIT.key] = bind(self._commit)
        handlers[schemas.OFFSET_FETCH.key] = bind(self._fetch_offsets)
        return handlers

    @staticmethod
    def _now() -> int:
        return int(time.monotonic() * 1000)

    def _metadata(self, node: int, request: Request) -> Response:
        response = super()._metadata(node, request)
        for t in response.message["topics"]:
            t.append(f"ID-{t[1]}")
        return response

    def _find(self, req: m.FindCoordinatorRequest) -> m.FindCoordinatorResponse:
        port = self.servers[COORDINATOR].port
        return m.FindCoordinatorResponse(
            [
                m.Coordinator(k, COORDINATOR, "127.0.0.1", port, 0, None)
                for k in req.coordinator_keys
            ]
        )

    def _heartbeat(self, req: m.ConsumerGroupHeartbeatRequest) -> Any:
        if not self.answer_heartbeats:
            return m.ConsumerGroupHeartbeatResponse(
                error_code=errors.code_of("COORDINATOR_NOT_AVAILABLE")
            )
        self.group.update_topics(
            {n: TopicSpec(f"ID-{n}", len(parts)) for n, parts in self.topics.items()}
        )
        step = self.group.heartbeat(
            Heartbeat(
                req.member_id,
                req.member_epoch,
                req.instance_id,
                req.rack_id,
                None if req.rebalance_timeout_ms < 0 else req.rebalance_timeout_ms,
                None
                if req.subscribed_topic_names is None
                else frozenset(req.subscribed_topic_names),
                req.server_assignor,
                None
                if req.topic_partitions is None
                else {t.topic_id: frozenset(t.partitions) for t in req.topic_partitions},
            ),
            self._now(),
        )
        r = step.response
        return m.ConsumerGroupHeartbeatResponse(
            error_code=r.error_code,
            member_id=r.member_id,
            member_epoch=r.member_epoch,
            heartbeat_interval_ms=r.heartbeat_interval_ms,
            assignment=None
            if r.assignment is None
            else [m.GroupTopicPartitions(t, sorted(ps)) for t, ps in r.assignment.items()],
        )

    def _commit(self, req: m.OffsetCommitRequest) -> m.OffsetCommitResponse:
        self.commits += 1
        out = []
        for t in req.topics:
            results = []
            for p in t.partitions:
                if self.commit_inject:
                    code = self.commit_inject.pop(0)
                else:
                    commit = OffsetCommit(
                        req.member_id,
                        req.generation_id_or_member_epoch,
                        t.name,
                        p.partition,
                        p.committed_offset,
                    )
                    code = self.group.commit_offset(commit, self._now()).response.error_code
                results.append(m.OffsetCommitPartitionResult(p.partition, code))
            out.append(m.OffsetCommitTopicResult(t.name, results))
        return m.OffsetCommitResponse(out)

    def _fetch_offsets(self, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
        groups = []
        for g in req.groups:
            topics = []
            for t in g.topics or ():
                parts = []
                for p in t.partition_indexes:
                    record = self.group.offsets.get((t.name, p))
                    offset = -1 if record is None else record.offset
                    parts.append(m.OffsetFetchPartitionResult(p, offset, -1, None, 0))
                topics.append(m.OffsetFetchTopicResult(t.name, parts))
            groups.append(m.OffsetFetchGroupResult(g.group_id, topics, 0))
        return m.OffsetFetchResponse(groups)


class Listener:
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
        self.events.append(("assigned", tps))

    def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
        self.events.append(("revoked", tps))

    def on_partitions_lost(self, tps: set[TopicPartition]) -> None:
        self.events.append(("lost", tps))


@pytest.fixture
async def fake():
    cluster = await GroupFake().start()
    cluster.create("t", 2)
    async with Producer(cluster.bootstrap) as p:
        for partition in (0, 1):
            await p.send_many("t", [b"%d" % i for i in range(5)], partition=partition)
        await p.flush()
    yield cluster
    await cluster.stop()


async def member(fake: GroupFake, listener: Listener) -> Consumer:
    c = Consumer(
        "t",
        bootstrap=fake.bootstrap,
        group_id="g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
        retry_backoff_ms=20,
        rebalance_listener=listener,
    )
    await c.start()
    seen: list[Any] = []

    async def everything() -> bool:
        for recs in (await c.getmany(timeout_ms=20)).values():
            seen.extend(recs)
        return len(seen) == 10

    await wait_until_async(everything, timeout=20)
    return c


ALL = {TopicPartition("t", 0), TopicPartition("t", 1)}


async def test_a_stale_epoch_commit_is_retried_after_the_next_heartbeat(fake: GroupFake) -> None:
    c = await member(fake, Listener())
    fake.commit_inject = [errors.code_of("STALE_MEMBER_EPOCH")] * 2
    before = fake.commits
    await c.commit()
    assert fake.commits == before + 2
    assert await c.committed(ALL) == {tp: 5 for tp in ALL}
    await c.close()


async def test_a_fenced_commit_loses_the_partitions_and_rejoins(fake: GroupFake) -> None:
    listener = Listener()
    c = await member(fake, listener)
    fake.commit_inject = [errors.code_of("FENCED_MEMBER_EPOCH")] * 2
    with pytest.raises(CommitFailedError, match="fenced"):
        await c.commit()
    assert c.assignment() == set()  # dropped at once; the listener runs next
    await wait_until_async(lambda: ("lost", ALL) in listener.events, timeout=20)
    # It rejoins with epoch 0 and gets the partitions back, at the committed offsets
    # (none: from the beginning again).
    await wait_until_async(lambda: listener.events[-1] == ("assigned", ALL), timeout=20)
    assert c.assignment() == ALL
    await c.close()


async def test_a_commit_for_a_partition_not_owned_sends_nothing(fake: GroupFake) -> None:
    c = await member(fake, Listener())
    before = fake.commits
    with pytest.raises(CommitFailedError, match="not assigned"):
        await c.commit({TopicPartition("t", 7): 1, TopicPartition("t", 0): 1})
    assert fake.commits == before
    await c.close()


async def test_unanswered_heartbeats_lose_the_partitions_after_the_session(
    fake: GroupFake,
) -> None:
    listener = Listener()
    c = await member(fake, listener)
    fake.answer_heartbeats = False
    async with Producer(fake.bootstrap) as p:
        await p.send_many("t", [b"late"], partition=0)
        await p.flush()

    async def lost() -> bool:
        assert await c.getmany(timeout_ms=20) == {} or ("lost", ALL) not in listener.events
        return ("lost", ALL) in listener.events

    await wait_until_async(lost, timeout=20)
    assert c.assignment() == set() and await c.getmany(timeout_ms=50) == {}
    fake.answer_heartbeats = True  # the coordinator is back: it rejoins
    await wait_until_async(lambda: c.assignment() == ALL, timeout=20)
    await c.close()
