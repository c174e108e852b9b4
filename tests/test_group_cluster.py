"""Consumer groups on real processes (3 controllers, 3 brokers), at the wire level with
raw requests: FindCoordinator creates `__consumer_offsets` and names the leader of the
group's partition; members join and split partitions; commits are acknowledged, and
visible to OffsetFetch, only once replicated; kill -9 of the coordinator hands the
group, epochs, assignments and offsets to the new leader; a restart of every broker
restores them. API behaviour and error codes in detail: tests/test_group_broker.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import wait_until_async
from replication_cluster import BROKERS, CONTROLLERS, Client, replication_cluster, run

from rillet.broker.group.placement import partition_for
from rillet.client.wire import errors
from rillet.client.wire import messages as m

pytestmark = pytest.mark.cluster

OFFSETS = "__consumer_offsets"
PARTITIONS = 3  # of the offsets topic
code = errors.code_of
RETRIABLE = {code("COORDINATOR_NOT_AVAILABLE"), code("REQUEST_TIMED_OUT"), code("NOT_COORDINATOR")}
GROUP_SETTINGS = {
    "offsets.topic.num.partitions": PARTITIONS,
    "offsets.commit.timeout.ms": 1500,
    "group.consumer.session.timeout.ms": 60_000,  # members outlive the faults below
    "min.insync.replicas": 2,
    # A paused follower stays in the ISR: a commit then waits for it, not for a shrink.
    "replica.lag.time.max.ms": 60_000,
}


def group_cluster(cluster_factory: Any, session_ms: int | None = None) -> Any:
    """replication_cluster's timings with the group settings; ``session_ms``: the
    controllers' broker session timeout instead of its short one."""
    if session_ms is None:
        return replication_cluster(cluster_factory, **GROUP_SETTINGS)
    broker = {**BROKER_TIMINGS, **GROUP_SETTINGS}
    controller = {"broker.session.timeout.ms": session_ms, "broker.heartbeat.interval.ms": 250}
    overrides: dict[int, dict[str, Any]] = {b: dict(broker) for b in BROKERS}
    overrides.update({c: dict(controller) for c in CONTROLLERS})
    return cluster_factory(controllers=3, brokers=3, node_overrides=overrides)


BROKER_TIMINGS = {
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 100,
    "broker.heartbeat.interval.ms": 250,
}


class Groups:
    """Raw group requests, each to the group's coordinator as FindCoordinator names it;
    the answer is kept until a request to it fails or is answered with a coordinator
    error (FindCoordinator itself may go to a paused broker, which answers nothing)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.known: dict[str, int] = {}

    async def coordinator(self, group: str, timeout: float = 30, not_on: int = -1) -> int:
        """The coordinator FindCoordinator names (other than ``not_on``: a killed node
        stays named until the controller fences it)."""

        async def found() -> int | None:
            try:
                response = await self.client.any_request(
                    m.FindCoordinatorRequest(coordinator_keys=[group])
                )
            except errors.RilletError:
                return None
            (c,) = response.coordinators
            return c.node_id if c.error_code == 0 and c.node_id != not_on else None

        node = await wait_until_async(found, timeout=timeout, message=f"coordinator of {group}")
        self.known[group] = node
        return node

    async def call(self, group: str, request: Any, retry: bool = True, timeout: float = 30) -> Any:
        """Send to the coordinator; with ``retry``, again (after a new FindCoordinator)
        while the answer is a retriable coordinator error."""
        answer: list[Any] = []

        async def attempt() -> bool:
            node = self.known.get(group)
            if node is None:
                node = await self.coordinator(group)
            try:
                conn = await self.client.conn(node)
                response, _ = await conn.call(request, raise_errors=False, timeout_ms=5000)
            except errors.RilletError:
                self.known.pop(group, None)
                return False
            answer[:] = [response]
            failed = _first_code(response) in {*RETRIABLE, code("COORDINATOR_LOAD_IN_PROGRESS")}
            if failed:
                self.known.pop(group, None)
            return not retry or not failed

        await wait_until_async(attempt, timeout=timeout, message=f"{type(request).__name__}")
        return answer[0]

    async def heartbeat(self, group: str, member: str, epoch: int, **kw: Any) -> Any:
        if epoch == 0:
            kw.setdefault("subscribed_topic_names", ["t"])
            kw.setdefault("rebalance_timeout_ms", 60_000)
        if "owned" in kw:
            kw["topic_partitions"] = [[t, sorted(ps)] for t, ps in kw.pop("owned").items()]
        return await self.call(group, m.ConsumerGroupHeartbeatRequest(group, member, epoch, **kw))

    async def commit(
        self, group: str, partition: int, offset: int, member: str, epoch: int, retry: bool = True
    ) -> int:
        request = m.OffsetCommitRequest(
            group_id=group,
            generation_id_or_member_epoch=epoch,
            member_id=member,
            topics=[m.OffsetCommitTopic("t", [m.OffsetCommitPartition(partition, offset)])],
        )
        response = await self.call(group, request, retry=retry)
        return response.topics[0].partitions[0].error_code

    async def fetch(self, group: str, retry: bool = True) -> tuple[int, dict[int, int]]:
        request = m.OffsetFetchRequest(groups=[m.OffsetFetchGroup(group, None, -1, None)])
        (g,) = (await self.call(group, request, retry=retry)).groups
        return g.error_code, {
            p.partition: p.committed_offset for t in g.topics for p in t.partitions
        }


def _first_code(response: Any) -> int:
    if isinstance(response, m.OffsetCommitResponse):
        return response.topics[0].partitions[0].error_code
    if isinstance(response, m.OffsetFetchResponse):
        return response.groups[0].error_code
    return getattr(response, "error_code", 0)


def assigned(response: Any) -> set[int]:
    return {p for tp in response.assignment or [] for p in tp.partitions}


async def join_two(groups: Groups, group: str, topic_id: str) -> dict[str, tuple[int, set[int]]]:
    """Members a and b join and reconcile until both are stable: {member: (epoch, owned)}."""
    a = await groups.heartbeat(group, "a", 0)
    assert a.error_code == 0 and assigned(a) == set(range(6)), a
    b = await groups.heartbeat(group, "b", 0)
    assert b.error_code == 0 and assigned(b) == set(), b
    a = await groups.heartbeat(group, "a", a.member_epoch)
    kept = assigned(a)
    a = await groups.heartbeat(group, "a", a.member_epoch, owned={topic_id: kept})
    b = await groups.heartbeat(group, "b", b.member_epoch)
    assert assigned(a) | assigned(b) == set(range(6)) and not assigned(a) & assigned(b)
    assert len(assigned(a)) == len(assigned(b)) == 3
    return {"a": (a.member_epoch, assigned(a)), "b": (b.member_epoch, assigned(b))}


async def offsets_partition(client: Client, group: str) -> tuple[int, list[int]]:
    parts = await client.partitions(OFFSETS)
    p = parts[partition_for(group, PARTITIONS)]
    return p.leader, p.isr


def test_a_group_is_coordinated_by_its_offsets_partition_leader(cluster_factory: Any) -> None:
    cluster = group_cluster(cluster_factory)

    async def body(client: Client) -> None:
        groups = Groups(client)
        await client.create_topic("t", 6, 3, {})
        leader = await groups.coordinator("g")
        # The offsets topic exists now: internal, replicated, and "g" lives on the
        # partition Kafka's hash names, led by the coordinator.
        meta = await client.any_request(m.MetadataRequest([OFFSETS, "t"]))
        offsets, t = meta.topics
        assert offsets.is_internal and not t.is_internal and t.topic_id
        assert len(offsets.partitions) == PARTITIONS
        assert all(len(p.replicas) == 3 for p in offsets.partitions)
        assert (await offsets_partition(client, "g"))[0] == leader
        # Another broker answers NOT_COORDINATOR for the group (once its own metadata
        # shows the offsets topic: COORDINATOR_NOT_AVAILABLE before).
        other = next(b for b in BROKERS if b != leader)
        conn = await client.conn(other)

        async def refused() -> int | None:
            response, _ = await conn.call(
                m.ConsumerGroupHeartbeatRequest(
                    "g", "x", 0, rebalance_timeout_ms=60_000, subscribed_topic_names=["t"]
                ),
                raise_errors=False,
            )
            c = response.error_code
            return None if c == code("COORDINATOR_NOT_AVAILABLE") else c

        assert await wait_until_async(refused, timeout=10) == code("NOT_COORDINATOR")

        members = await join_two(groups, "g", t.topic_id)
        epoch, owned = members["a"]
        p = min(owned)
        assert await groups.commit("g", p, 100, "a", epoch) == 0
        assert await groups.fetch("g") == (0, {p: 100})

        # Each broker lists the groups it coordinates: only the coordinator has "g".
        for b in BROKERS:
            listed, _ = await (await client.conn(b)).call(m.ListGroupsRequest())
            names = [x.group_id for x in listed.groups]
            assert names == (["g"] if b == leader else []), (b, listed)
        described = await groups.call("g", m.ConsumerGroupDescribeRequest(["g"]))
        (d,) = described.groups
        assert (d.error_code, d.group_state) == (0, "Stable")
        assert {x.member_id for x in d.members} == {"a", "b"}
        assert all(x.assignment[0].topic_name == "t" for x in d.members)
        deleted = await groups.call("g", m.DeleteGroupsRequest(["g"]))
        assert deleted.results[0].error_code == code("NON_EMPTY_GROUP")

    run(cluster, body)


def test_a_commit_is_answered_and_visible_only_once_replicated(cluster_factory: Any) -> None:
    # Paused followers must not be fenced (and dropped from the ISR) while the commit
    # and the fetch wait for them: a session well above offsets.commit.timeout.ms.
    cluster = group_cluster(cluster_factory, session_ms=6_000)

    async def body(client: Client) -> None:
        groups = Groups(client)
        await client.create_topic("t", 6, 3, {})
        await groups.coordinator("g")
        a = await groups.heartbeat("g", "a", 0)
        epoch = a.member_epoch
        assert await groups.commit("g", 0, 10, "a", epoch) == 0
        leader, isr = await offsets_partition(client, "g")
        followers = [b for b in isr if b != leader]
        assert len(followers) == 2

        # Both followers paused (still in the ISR): the commit is written on the leader
        # but never replicated, so it is not acknowledged and OffsetFetch does not show
        # it either.
        for f in followers:
            cluster.pause_node(f)
        try:
            committing = asyncio.ensure_future(groups.commit("g", 0, 20, "a", epoch, retry=False))
            fetched = await groups.fetch("g", retry=False)
            assert fetched[0] in RETRIABLE or fetched == (0, {0: 10}), fetched
            assert await committing in RETRIABLE
        finally:
            for f in followers:
                cluster.resume_node(f)
        # Replicated once they are back: the commit's record survives (its outcome was
        # unknown to the client, as for any timed-out acks=all write).
        await wait_until_async(
            lambda: _fetched(groups, "g", {0: 20}), timeout=30, message="commit replicated"
        )

        # One follower killed: once the controller fenced it the ISR is 2, still
        # min.insync.replicas; with the second stopped too, commits fail retriably with
        # nothing written, and OffsetFetch keeps the last committed offset.
        cluster.stop_node(followers[0], kill=True)
        cluster.stop_node(followers[1], kill=True)

        async def shrunk() -> bool:
            return (await offsets_partition(client, "g"))[1] == [leader]

        await wait_until_async(shrunk, timeout=30, message="ISR shrunk to the leader")
        assert await groups.commit("g", 0, 30, "a", epoch, retry=False) == code(
            "COORDINATOR_NOT_AVAILABLE"
        )
        assert await groups.fetch("g") == (0, {0: 20})
        # Back to min.insync.replicas: commits go through again.
        cluster.start_node(followers[0])
        assert await groups.commit("g", 0, 40, "a", epoch) == 0
        assert await groups.fetch("g") == (0, {0: 40})

    run(cluster, body)


async def _fetched(groups: Groups, group: str, expected: dict[int, int]) -> bool:
    try:
        return await groups.fetch(group, retry=False) == (0, expected)
    except AssertionError:
        return False


def test_the_group_survives_the_coordinator_and_a_full_restart(cluster_factory: Any) -> None:
    cluster = group_cluster(cluster_factory)

    async def body(client: Client) -> None:
        groups = Groups(client)
        await client.create_topic("t", 6, 3, {})
        old = await groups.coordinator("g")
        meta = await client.any_request(m.MetadataRequest(["t"]))
        topic_id = meta.topics[0].topic_id
        members = await join_two(groups, "g", topic_id)
        for name, (epoch, owned) in members.items():
            for p in owned:
                assert await groups.commit("g", p, 1000 + p, name, epoch) == 0
        committed = {p: 1000 + p for p in range(6)}
        assert await groups.fetch("g") == (0, committed)

        async def unchanged() -> None:
            # Members keep their epochs and assignments, offsets are all there.
            for name, (epoch, owned) in members.items():
                r = await groups.heartbeat("g", name, epoch)
                assert r.error_code == 0 and r.member_epoch == epoch, r
                assert assigned(r) == owned
            assert await groups.fetch("g") == (0, committed)

        cluster.stop_node(old, kill=True)
        await groups.coordinator("g", timeout=60, not_on=old)
        await unchanged()
        cluster.start_node(old)

        for b in BROKERS:
            cluster.stop_node(b)
        for b in BROKERS:
            cluster.start_node(b)
        await client.close()
        await unchanged()

    run(cluster, body)
