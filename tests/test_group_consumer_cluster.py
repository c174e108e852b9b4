"""The group consumer (client/consumer.py with group_id) on real processes: joining and
splitting partitions, commits and resuming from them, the rebalance listener, close and
leave, client-side errors; consumers in separate processes killed with -9, a member
added, and the coordinator's broker killed while consuming and committing."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until, wait_until_async

from rillet.client.admin import Admin, NewTopic
from rillet.client.consumer import Consumer, TopicPartition
from rillet.client.group_consumer import CommitFailedError, NoOffsetForPartitionError
from rillet.client.group_coordinator import CoordinatorClient, find_coordinators
from rillet.client.producer import Producer
from rillet.client.sync import SyncConsumer
from rillet.client.wire import errors
from rillet.client.wire import messages as m

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
            # The partition stays this member's; a seek gives it a position.
            assert c.assignment() == {TopicPartition("n", 0)}
            await produce(bs, "n", 3)
            c.seek(("n", 0), 1)
            seen: list[Any] = []
            await drain(c, seen, 2)
            assert [r.offset for r in seen] == [1, 2]

    asyncio.run(main())


# --- consumers in separate processes -------------------------------------------------

MEMBER = Path(__file__).parent / "group_member.py"
PROC_SESSION_MS = 6_000


class Member:
    """tests/group_member.py in its own process; its events as they are printed."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(MEMBER), bootstrap, topic, group, str(PROC_SESSION_MS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self.values: list[str] = []
        self.partition_of: dict[str, int] = {}
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def poll(self) -> int:
        """Take what the process printed; the number of values it consumed."""
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return len(self.values)
            event = json.loads(line)
            if "records" in event:
                self.values += [v for _, _, v in event["records"]]
                self.partition_of.update((v, p) for p, _, v in event["records"])
            else:
                self.events.append(event)

    @property
    def owned(self) -> set[int]:
        self.poll()
        owned: set[int] = set()
        for e in self.events:
            owned |= set(e.get("assigned", ()))
            owned -= set(e.get("revoked", ())) | set(e.get("lost", ()))
        return owned

    def revoked_since(self, index: int) -> set[int]:
        self.poll()
        return {p for e in self.events[index:] for p in e.get("revoked", ())}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.poll()


def test_members_in_processes_survive_kills_joins_and_a_coordinator_failover(
    cluster_factory: Any,
) -> None:
    broker = {
        "broker.heartbeat.interval.ms": 250,
        "replica.fetch.wait.max.ms": 200,
        "replica.lag.time.max.ms": 2_000,
        "offsets.topic.replication.factor": 3,
        **GROUP_SETTINGS,
        "group.consumer.session.timeout.ms": PROC_SESSION_MS,
    }
    overrides: dict[int, dict[str, Any]] = {b: dict(broker) for b in (1, 2, 3)}
    overrides[101] = {"broker.session.timeout.ms": 2_500, "broker.heartbeat.interval.ms": 250}
    cluster = cluster_factory(controllers=1, brokers=3, node_overrides=overrides)
    bs = cluster.bootstrap
    members: list[Member] = []
    produced = 0

    def everything_consumed() -> bool:
        seen: set[str] = set()
        for mem in members:
            mem.poll()
            seen.update(mem.values)
        return seen >= {str(i) for i in range(produced)}

    def duplicates() -> dict[str, int]:
        """Values consumed more than once -> their partition."""
        counts: dict[str, int] = {}
        where: dict[str, int] = {}
        for mem in members:
            mem.poll()
            for v in mem.values:
                counts[v] = counts.get(v, 0) + 1
            where.update(mem.partition_of)
        return {v: where[v] for v, n in counts.items() if n > 1}

    async def produce_more(n: int) -> None:
        nonlocal produced
        async with Producer(bs, retry_backoff_ms=50, acks="all") as producer:
            for i in range(produced, produced + n):
                await producer.send("t", str(i).encode(), key=str(i).encode())
            await producer.flush()
        produced += n

    async def committed_total() -> int:
        async with Admin(bs) as admin:
            client = CoordinatorClient(admin._meta, "g")  # type: ignore[attr-defined]
            request = m.OffsetFetchRequest([m.OffsetFetchGroup("g", None, -1, None)])
            response = await client.call(request, lambda r: 0, timeout_ms=30_000)
            return sum(p.committed_offset for t in response.groups[0].topics for p in t.partitions)

    async def main() -> None:
        async with Admin(bs) as admin:
            await admin.create_topics([NewTopic("t", 6, 3, {"min.insync.replicas": "2"})])
        await produce_more(300)
        members.extend(Member(bs, "t", "g") for _ in range(3))

        def shares(ms: list[Member], sizes: list[int]) -> bool:
            owned = [mem.owned for mem in ms]
            union = set().union(*owned)
            return sorted(map(len, owned)) == sizes and union == set(range(6))

        await wait_until_async(lambda: shares(members, [2, 2, 2]), timeout=60)
        await wait_until_async(everything_consumed, timeout=60)

        # kill -9 one member: after the session timeout the others take its partitions
        # and consume everything, including what it had not committed.
        assert duplicates() == {}
        victim = members[2]
        victim_partitions = victim.owned
        killed_at = time.monotonic()
        victim.kill()
        await produce_more(120)
        await wait_until_async(lambda: shares(members[:2], [3, 3]), timeout=60)
        print(f"kill -9 to partitions reassigned: {time.monotonic() - killed_at:.2f} s")
        await wait_until_async(everything_consumed, timeout=60)
        # Read twice only what the victim had read and not committed.
        assert set(duplicates().values()) <= victim_partitions
        after_kill = duplicates()

        # A fourth member joins: the others give up only what moves to it.
        marks = [len(mem.events) for mem in members[:2]]
        before = [mem.owned for mem in members[:2]]
        joined_at = time.monotonic()
        members.append(Member(bs, "t", "g"))
        live = [members[0], members[1], members[3]]
        await wait_until_async(lambda: shares(live, [2, 2, 2]), timeout=60)
        print(f"member start to balanced: {time.monotonic() - joined_at:.2f} s")
        for mem, mark, had in zip(members[:2], marks, before, strict=True):
            kept = had & mem.owned
            assert kept and not (mem.revoked_since(mark) & kept)
        await produce_more(120)
        await wait_until_async(everything_consumed, timeout=60)
        assert duplicates() == after_kill  # revocation committed first: no re-reads

        # kill -9 the broker leading the group's offsets partition while producing:
        # consuming and committing go on at the new coordinator, nothing is lost.
        async with Admin(bs) as admin:
            old = (await find_coordinators(admin._meta, ["g"]))["g"].node_id  # type: ignore[attr-defined]
        before_kill = await committed_total()
        cluster.stop_node(old, kill=True)
        await produce_more(120)
        await wait_until_async(everything_consumed, timeout=90)

        async def commits_moved_on() -> bool:
            try:
                return await committed_total() > before_kill
            except errors.RilletError:
                return False

        await wait_until_async(commits_moved_on, timeout=60)
        cluster.start_node(old)

        # Every member closes (commits, leaves); a new one continues after the commits.
        for mem in live:
            mem.close()
        assert all({"closed": True} in mem.events for mem in live)
        await produce_more(10)
        last = Member(bs, "t", "g")
        members.append(last)
        await wait_until_async(lambda: last.poll() >= 10, timeout=60)
        last.close()
        assert sorted(map(int, last.values)) == list(range(produced - 10, produced))

    try:
        asyncio.run(main())
    finally:
        for mem in members:
            if mem.proc.poll() is None:
                mem.kill()


def test_pattern_static_member_and_deleted_topic(cluster_factory: Any) -> None:
    cluster = group_cluster(cluster_factory)

    async def main() -> None:
        bs = cluster.bootstrap
        async with Admin(bs) as admin:
            await admin.create_topics([NewTopic("p.a", 1, 1), NewTopic("other", 1, 1)])
            async with Consumer(
                pattern=r"p\..*",
                bootstrap=bs,
                group_id="pg",
                session_timeout_ms=SESSION_MS,
                metadata_max_age_ms=500,  # the pattern is matched again on each refresh
                retry_backoff_ms=50,
            ) as c:

                async def owns(tps: set[TopicPartition]) -> bool:
                    await c.getmany(timeout_ms=20)
                    return c.assignment() == tps

                await wait_until_async(lambda: owns({TopicPartition("p.a", 0)}), timeout=30)
                # A new matching topic joins the subscription.
                await admin.create_topics([NewTopic("p.b", 1, 1)])
                both = {TopicPartition("p.a", 0), TopicPartition("p.b", 0)}
                await wait_until_async(lambda: owns(both), timeout=30)
                await c.commit({TopicPartition("p.b", 0): 0})
                # A deleted topic: its partition leaves the group; committing it is
                # refused with a clear error, before or after the group noticed.
                await admin.delete_topics(["p.b"])
                with pytest.raises(CommitFailedError, match="not assigned|does not exist"):
                    await c.commit({TopicPartition("p.b", 0): 1})
                await wait_until_async(lambda: owns({TopicPartition("p.a", 0)}), timeout=30)

            # Static members: one restarting within the session timeout takes its
            # partitions back with no rebalance for the other.
            await admin.create_topics([NewTopic("s", 2, 1)])
            other = consumer(bs, "s", "sg", group_instance_id="other")
            await other.start()
            revoked: list[set[TopicPartition]] = []

            class Listener:
                def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
                    revoked.append(tps)

            async def balanced(c: Consumer) -> bool:
                await c.getmany(timeout_ms=20)
                await other.getmany(timeout_ms=20)
                return len(c.assignment()) == 1 and len(other.assignment()) == 1

            other._group.listener = Listener()  # type: ignore[union-attr]
            first = consumer(bs, "s", "sg", group_instance_id="restarting")
            await first.start()
            await wait_until_async(lambda: balanced(first), timeout=30)
            kept = first.assignment()
            revoked.clear()
            await first.close()  # leaves with epoch -2: its partition waits for it
            second = consumer(bs, "s", "sg", group_instance_id="restarting")
            await second.start()
            await wait_until_async(lambda: balanced(second), timeout=30)
            assert second.assignment() == kept and revoked == []
            await second.close()
            await other.close()

    asyncio.run(main())


def test_cli_consume_group_commits_and_continues(cluster_factory: Any) -> None:
    cluster = group_cluster(cluster_factory)

    async def setup() -> None:
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topics([NewTopic("c", 2, 1)])
        await produce(cluster.bootstrap, "c", 10)

    asyncio.run(setup())

    def consume(n: int) -> list[int]:
        proc = subprocess.run(
            [sys.executable, "-m", "rillet.client.cli", "consume", "c", "--group", "cg"]
            + ["--from-beginning", "--max-messages", str(n), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "RILLET_BOOTSTRAP": cluster.bootstrap},
        )
        assert proc.returncode == 0, proc.stderr
        return [int(json.loads(line)["value"]) for line in proc.stdout.splitlines()]

    first = consume(4)
    second = consume(6)
    assert len(first) == 4 and sorted(first + second) == list(range(10))

    # The sync facade, in the same group: continues after the CLI's commits.
    asyncio.run(produce(cluster.bootstrap, "c", 3, start=10))
    with SyncConsumer(
        "c", bootstrap=cluster.bootstrap, group_id="cg", enable_auto_commit=False
    ) as sc:
        got: list[int] = []
        wait_until(
            lambda: (
                got.extend(int(r.value) for rs in sc.poll(100).values() for r in rs)
                or len(got) >= 3
            ),
            timeout=60,
        )
        assert sorted(got) == [10, 11, 12]
        assert len(sc.assignment()) == 2
        sc.commit()
        committed = sc.committed([("c", 0), ("c", 1)])
        assert sum(o or 0 for o in committed.values()) == 13
