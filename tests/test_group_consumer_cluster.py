"""The group consumer (client/consumer.py with group_id) on real processes: joining and
splitting partitions, commits and resuming from them, the rebalance listener, close and
leave, client-side errors; consumers in separate processes killed with -9, a member
added, and the coordinator's broker killed while consuming and committing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import wait_until_async

from rillet.client.admin import Admin, NewTopic
from rillet.client.consumer import Consumer, TopicPartition
from rillet.client.group_consumer import CommitFailedError, NoOffsetForPartitionError
from rillet.client.producer import Producer

pytestmark = pytest.mark.cluster

SESSION_MS = 4_000
GROUP_SETTINGS = {
    "offsets.topic.num.partitions": 3,
    "group.consumer.session.timeout.ms": SESSION_MS,
    "group.consumer.heartbeat.interval.ms": 300,
}


def group_cluster(cluster_factory: Any, controllers: int = 1, brokers: int = 1) -> Any:
    broker = {"broker.heartbeat.interval.ms": 250, **GROUP_SETTINGS}
    return cluster_factory(
        controllers=controllers,
        brokers=brokers,
        node_overrides={b: dict(broker) for b in range(1, brokers + 1)},
    )


def consumer(bootstrap: str, topic: str, group: str, **kw: Any) -> Consumer:
    kw.setdefault("auto_offset_reset", "earliest")
    kw.setdefault("session_timeout_ms", SESSION_MS)
    return Consumer(topic, bootstrap=bootstrap, group_id=group, retry_backoff_ms=50, **kw)


async def produce(bootstrap: str, topic: str, n: int, start: int = 0) -> None:
    async with Producer(bootstrap, retry_backoff_ms=50) as producer:
        for i in range(start, start + n):
            await producer.send(topic, str(i).encode(), key=str(i).encode())
        await producer.flush()


async def drain(c: Consumer, seen: list[Any], until: int, timeout: float = 60) -> None:
    async def enough() -> bool:
        for recs in (await c.getmany(timeout_ms=100)).values():
            seen.extend(recs)
        return len(seen) >= until

    await wait_until_async(enough, timeout=timeout, message=lambda: f"{len(seen)}/{until}")


def test_two_members_split_commit_and_a_restarted_group_resumes(cluster_factory: Any) -> None:
    cluster = group_cluster(cluster_factory)

    class Listener:
        def __init__(self) -> None:
            self.events: list[tuple[str, set[TopicPartition]]] = []

        def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
            self.events.append(("assigned", tps))

        async def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
            self.events.append(("revoked", tps))

    async def main() -> None:
        bs = cluster.bootstrap
        async with Admin(bs) as admin:
            await admin.create_topics([NewTopic("t", 4, 1)])
        await produce(bs, "t", 100)
        l1 = Listener()
        async with consumer(bs, "t", "g", rebalance_listener=l1) as c1:
            await wait_until_async(lambda: len(c1.assignment()) == 4, timeout=30)
            assert l1.events == [("assigned", {TopicPartition("t", p) for p in range(4)})]
            seen: list[Any] = []
            async with consumer(bs, "t", "g") as c2:
                # c1 gives up two partitions before c2 gets them; c1 keeps the others.
                async def split() -> bool:
                    for c in (c1, c2):
                        for recs in (await c.getmany(timeout_ms=10)).values():
                            seen.extend(recs)
                    return len(c1.assignment()) == 2 and len(c2.assignment()) == 2

                await wait_until_async(split, timeout=30)
                assert l1.events[1][0] == "revoked" and l1.events[1][1] == (
                    {TopicPartition("t", p) for p in range(4)} - c1.assignment()
                )
                assert c1.assignment().isdisjoint(c2.assignment())

                async def all_read() -> bool:
                    for c in (c1, c2):
                        for recs in (await c.getmany(timeout_ms=50)).values():
                            seen.extend(recs)
                    return len({r.value for r in seen}) >= 100

                await wait_until_async(all_read, timeout=30)
                await c1.commit()
                await c2.commit()
                committed = await c1.committed([("t", p) for p in range(4)])
                assert sum(o or 0 for o in committed.values()) == 100
                foreign = next(iter(c2.assignment()))
                with pytest.raises(CommitFailedError, match="not assigned"):
                    await c1.commit({foreign: 1})
        # Everyone left; the restarted group continues after what was committed.
        await produce(bs, "t", 10, start=100)
        async with consumer(bs, "t", "g") as c3:
            seen = []
            await drain(c3, seen, 10)
            assert sorted(int(r.value) for r in seen) == list(range(100, 110))

    asyncio.run(main())


def test_no_committed_offset_with_reset_none_is_a_clear_error(cluster_factory: Any) -> None:
    cluster = group_cluster(cluster_factory)

    async def main() -> None:
        bs = cluster.bootstrap
        async with Admin(bs) as admin:
            await admin.create_topics([NewTopic("n", 1, 1)])
        async with consumer(bs, "n", "none-group", auto_offset_reset="none") as c:

            async def raised() -> bool:
                try:
                    await c.getmany(timeout_ms=100)
                except NoOffsetForPartitionError as e:
                    assert "no committed offset" in str(e)
                    return True
                return False

            await wait_until_async(raised, timeout=30)

    asyncio.run(main())
