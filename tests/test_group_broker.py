"""The broker's group APIs on one in-process broker (FakeLink plays the controller):
the offsets topic made on first use, heartbeats, commits and fetches, listing,
describing and deleting, and the error codes of bad input. Replication, failover and
restarts are in tests/test_group_cluster.py, on real processes."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until_async
from test_broker_inproc import FakeLink, batch, broker_config, produce

from rillet.broker.group import records_codec as codec
from rillet.broker.group.coordinator import GroupCoordinator, GroupMetadataRecord, Heartbeat
from rillet.broker.group.manager import _write_error
from rillet.broker.replica_manager import AppendResult
from rillet.broker.server import BrokerServer
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection
from rillet.controller.metadata.image import (
    Endpoint,
    RegisterBroker,
    TopicPartition,
    UnfenceBroker,
)

OFFSETS = "__consumer_offsets"
code = errors.code_of


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[BrokerServer, FakeLink, Connection]]:
    link = FakeLink(1)
    config = broker_config(tmp_path / "logs", "offsets.topic.num.partitions=4")
    server = BrokerServer(config, link=link)
    await server.start()
    conn = await Connection.open("127.0.0.1", server.port)
    try:
        yield server, link, conn
    finally:
        await conn.aclose()
        await server.stop()


async def call(conn: Connection, request: Any) -> Any:
    response, _ = await conn.call(request, raise_errors=False)
    return response


async def find(conn: Connection, *groups: str) -> list[m.Coordinator]:
    response = await call(conn, m.FindCoordinatorRequest(coordinator_keys=list(groups)))
    return list(response.coordinators)


async def ready(conn: Connection, group: str) -> None:
    """FindCoordinator until the offsets topic exists and the group's partition loaded."""

    async def found() -> bool:
        (c,) = await find(conn, group)
        if c.error_code != 0:
            return False
        probe = await fetch(conn, group, None)
        return probe.error_code == 0

    await wait_until_async(found, timeout=10, message=f"coordinator of {group}")


async def heartbeat(conn: Connection, group: str, member: str, epoch: int, **kw: Any) -> Any:
    if epoch == 0:
        kw.setdefault("subscribed_topic_names", ["t"])
        kw.setdefault("rebalance_timeout_ms", 60_000)
    if "owned" in kw:
        kw["topic_partitions"] = [[t, sorted(ps)] for t, ps in kw.pop("owned").items()]
    return await call(conn, m.ConsumerGroupHeartbeatRequest(group, member, epoch, **kw))


async def commit(
    conn: Connection,
    group: str,
    topic: str,
    partition: int,
    offset: int,
    member: str = "",
    epoch: int = -1,
) -> int:
    request = m.OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=epoch,
        member_id=member,
        topics=[m.OffsetCommitTopic(topic, [m.OffsetCommitPartition(partition, offset)])],
    )
    response = await call(conn, request)
    return response.topics[0].partitions[0].error_code


async def fetch(
    conn: Connection,
    group: str,
    topics: dict[str, list[int]] | None,
    member: str | None = None,
    epoch: int = -1,
) -> m.OffsetFetchGroupResult:
    wanted = None if topics is None else [m.OffsetFetchTopic(t, ps) for t, ps in topics.items()]
    response = await call(
        conn, m.OffsetFetchRequest(groups=[m.OffsetFetchGroup(group, member, epoch, wanted)])
    )
    return response.groups[0]


def offsets_of(result: m.OffsetFetchGroupResult) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition): p.committed_offset for t in result.topics for p in t.partitions}


def assigned(response: Any) -> set[int]:
    return {p for tp in response.assignment or [] for p in tp.partitions}


async def test_find_coordinator_creates_the_internal_offsets_topic(node: Any) -> None:
    server, link, conn = node
    (first,) = await find(conn, "g")
    assert first.error_code == code("COORDINATOR_NOT_AVAILABLE") and first.node_id == -1
    await ready(conn, "g")
    (c,) = await find(conn, "g")
    assert (c.node_id, c.host, c.port) == (1, "127.0.0.1", server.port)
    topic = link.image.topic(OFFSETS)
    assert topic is not None and len(topic.partitions) == 4
    config = link.image.topic_config(OFFSETS)
    assert config["cleanup.policy"] == "compact"
    assert config["segment.bytes"] == str(100 * 1024 * 1024)
    meta = await call(conn, m.MetadataRequest([OFFSETS]))
    (t,) = meta.topics
    assert t.is_internal and t.topic_id == topic.topic_id
    # Batched keys; bad keys are refused one by one.
    rows = await find(conn, "a", "", "b")
    assert [r.error_code for r in rows] == [0, code("INVALID_REQUEST"), 0]
    other = await call(conn, m.FindCoordinatorRequest(key_type=1, coordinator_keys=["tx"]))
    assert other.coordinators[0].error_code == code("INVALID_REQUEST")


async def test_clients_cannot_write_create_or_delete_the_offsets_topic(node: Any) -> None:
    _, link, conn = node
    await ready(conn, "g")
    row = await produce(conn, OFFSETS, 0, batch(b"x"))
    assert row[1] == code("INVALID_TOPIC_EXCEPTION") and "internal" in row[5]
    created = await call(
        conn,
        m.CreateTopicsRequest([m.CreatableTopic(OFFSETS, 1, 1, [], {})], timeout_ms=1000),
    )
    assert created.topics[0].error_code == code("INVALID_REQUEST")
    assert "internal" in created.topics[0].error_message
    deleted = await call(conn, m.DeleteTopicsRequest([OFFSETS], timeout_ms=1000))
    assert deleted.responses[0].error_code == code("INVALID_REQUEST")
    assert "internal" in deleted.responses[0].error_message
    assert link.image.topic(OFFSETS) is not None


async def test_members_join_split_the_partitions_and_commit(node: Any) -> None:
    _, link, conn = node
    await link.create_topic("t", 4)
    topic_id = link.image.topic("t").topic_id
    await ready(conn, "g")
    a = await heartbeat(conn, "g", "a", 0)
    assert a.error_code == 0 and a.member_epoch == 1 and assigned(a) == {0, 1, 2, 3}
    assert a.assignment[0].topic_id == topic_id
    b = await heartbeat(conn, "g", "b", 0)
    assert b.member_epoch == 2 and assigned(b) == set()  # a must release first
    a = await heartbeat(conn, "g", "a", 1)
    kept = assigned(a)
    assert len(kept) == 2  # revoking the other two, still at epoch 1
    a = await heartbeat(conn, "g", "a", 1, owned={topic_id: kept})
    assert a.member_epoch == 2
    b = await heartbeat(conn, "g", "b", 2)
    assert assigned(b) == {0, 1, 2, 3} - kept
    # Commits at the member's epoch; fetched back as committed.
    p = min(kept)
    assert await commit(conn, "g", "t", p, 42, "a", 2) == 0
    assert offsets_of(await fetch(conn, "g", {"t": [p, 9]})) == {("t", p): 42, ("t", 9): -1}
    assert offsets_of(await fetch(conn, "g", None)) == {("t", p): 42}
    member_view = await fetch(conn, "g", {"t": [p]}, "a", 2)
    assert member_view.error_code == 0
    assert (await fetch(conn, "g", {"t": [p]}, "a", 1)).error_code == code("STALE_MEMBER_EPOCH")
    assert (await fetch(conn, "g", {"t": [p]}, "zz", 1)).error_code == code("UNKNOWN_MEMBER_ID")


async def test_bad_heartbeats_and_commits_get_their_codes(node: Any) -> None:
    _, link, conn = node
    await link.create_topic("t", 2)
    await link.create_topic("doomed", 1)
    await ready(conn, "g")
    invalid = code("INVALID_REQUEST")
    assert (await heartbeat(conn, "", "a", 0)).error_code == invalid
    assert (await heartbeat(conn, "g", "", 0)).error_code == invalid
    assert (await heartbeat(conn, "g", "a", 0, subscribed_topic_names=None)).error_code == invalid
    assert (await heartbeat(conn, "g", "zz", 3)).error_code == code("UNKNOWN_MEMBER_ID")
    a = await heartbeat(conn, "g", "a", 0)
    assert a.member_epoch == 1
    assert (await heartbeat(conn, "g", "a", 7)).error_code == code("FENCED_MEMBER_EPOCH")
    assert (await commit(conn, "", "t", 0, 1)) == code("INVALID_GROUP_ID")
    assert (await commit(conn, "g", "nope", 0, 1, "a", 1)) == code("UNKNOWN_TOPIC_OR_PARTITION")
    assert (await commit(conn, "g", "t", 5, 1, "a", 1)) == code("UNKNOWN_TOPIC_OR_PARTITION")
    assert (await commit(conn, "g", "t", 0, 1, "zz", 1)) == code("UNKNOWN_MEMBER_ID")
    assert (await commit(conn, "g", "t", 0, 1, "a", 0)) == code("STALE_MEMBER_EPOCH")
    assert (await commit(conn, "g", "t", 0, 1, "a", 2)) == code("FENCED_MEMBER_EPOCH")
    assert (await commit(conn, "g", "t", 0, 1)) == code("UNKNOWN_MEMBER_ID")  # has members
    assert (await commit(conn, "other", "t", 0, 1, "m", 1)) == code("GROUP_ID_NOT_FOUND")
    # A commit to a topic deleted meanwhile.
    assert (await commit(conn, "g", "doomed", 0, 1, "a", 1)) == 0
    await call(conn, m.DeleteTopicsRequest(["doomed"], timeout_ms=1000))
    assert (await commit(conn, "g", "doomed", 0, 2, "a", 1)) == code("UNKNOWN_TOPIC_OR_PARTITION")
    # As Kafka: empty (not null) instance or rack ids, a join without a rebalance
    # timeout or owning partitions, a static leave without an instance id.
    for bad in (
        {"instance_id": ""},
        {"rack_id": ""},
        {"rebalance_timeout_ms": -1},
        {"owned": {"T": {0}}},
    ):
        assert (await heartbeat(conn, "g", "b", 0, **bad)).error_code == invalid, bad
    assert (await heartbeat(conn, "g", "b", -2)).error_code == invalid
    assert (await heartbeat(conn, "g", "b", 0, owned={})).error_code == 0  # owning none
    # Unlike Kafka, an empty subscription joins (a pattern that matches nothing yet).
    assert (await heartbeat(conn, "g", "c", 0, subscribed_topic_names=[])).error_code == 0


async def test_list_describe_and_delete(node: Any) -> None:
    _, link, conn = node
    await link.create_topic("t", 2)
    await link.create_topic("u", 1)
    await ready(conn, "g")
    await ready(conn, "admin-only")
    a = await heartbeat(conn, "g", "a", 0)
    assert assigned(a) == {0, 1}
    assert await commit(conn, "admin-only", "u", 0, 5) == 0  # no members: admin commit
    listed = await call(conn, m.ListGroupsRequest())
    assert {(g.group_id, g.group_state) for g in listed.groups} == {
        ("g", "Stable"),
        ("admin-only", "Empty"),
    }
    stable = await call(conn, m.ListGroupsRequest(states_filter=["stable"]))
    assert [g.group_id for g in stable.groups] == ["g"]
    classic = await call(conn, m.ListGroupsRequest(types_filter=["classic"]))
    assert classic.groups == []

    described = await call(conn, m.ConsumerGroupDescribeRequest(["g", "missing", ""]))
    g, missing, empty = described.groups
    assert (g.error_code, g.group_state, g.group_epoch, g.assignment_epoch) == (0, "Stable", 1, 1)
    assert g.assignor_name == "uniform"
    (member,) = g.members
    assert member.member_id == "a" and member.subscribed_topic_names == ["t"]
    assert [(x.topic_name, x.partitions) for x in member.assignment] == [("t", [0, 1])]
    assert [(x.topic_name, x.partitions) for x in member.target_assignment] == [("t", [0, 1])]
    assert missing.error_code == code("GROUP_ID_NOT_FOUND")
    assert empty.error_code == code("INVALID_GROUP_ID")

    # OffsetDelete: refused for a subscribed topic, fine for another.
    assert await commit(conn, "g", "t", 0, 3, "a", 1) == 0
    assert await commit(conn, "g", "u", 0, 4, "a", 1) == 0
    request = m.OffsetDeleteRequest(
        "g", [m.OffsetDeleteTopic("t", [0]), m.OffsetDeleteTopic("u", [0])]
    )
    response = await call(conn, request)
    codes = {(t.name, p.partition): p.error_code for t in response.topics for p in t.partitions}
    assert codes == {("t", 0): code("GROUP_SUBSCRIBED_TO_TOPIC"), ("u", 0): 0}
    assert offsets_of(await fetch(conn, "g", None)) == {("t", 0): 3}
    missing_group = await call(conn, m.OffsetDeleteRequest("nope", []))
    assert missing_group.error_code == code("GROUP_ID_NOT_FOUND")

    # DeleteGroups: only empty groups.
    deleted = await call(conn, m.DeleteGroupsRequest(["g", "admin-only", "nope", ""]))
    assert [r.error_code for r in deleted.results] == [
        code("NON_EMPTY_GROUP"),
        0,
        code("GROUP_ID_NOT_FOUND"),
        code("INVALID_GROUP_ID"),
    ]
    assert offsets_of(await fetch(conn, "admin-only", None)) == {}
    assert (await heartbeat(conn, "g", "a", -1)).error_code == 0
    assert [r.error_code for r in (await call(conn, m.DeleteGroupsRequest(["g"]))).results] == [0]
    listed = await call(conn, m.ListGroupsRequest())
    assert listed.groups == []


async def test_topic_changes_reach_the_groups(node: Any) -> None:
    _, link, conn = node
    await link.create_topic("t", 2)
    await link.create_topic("u", 1)
    ids = {n: link.image.topic(n).topic_id for n in ("t", "u")}
    await ready(conn, "g")
    a = await heartbeat(conn, "g", "a", 0, subscribed_topic_names=["t", "u"])
    assert {(x.topic_id, p) for x in a.assignment for p in x.partitions} == {
        (ids["t"], 0),
        (ids["t"], 1),
        (ids["u"], 0),
    }
    await call(conn, m.DeleteTopicsRequest(["u"], timeout_ms=1000))
    # The deleted topic leaves the target: the member must give it up.
    a = await heartbeat(conn, "g", "a", a.member_epoch)
    assert {(x.topic_id, p) for x in a.assignment for p in x.partitions} == {
        (ids["t"], 0),
        (ids["t"], 1),
    }


async def test_a_topic_deleted_while_another_broker_led_the_group_reaches_it(node: Any) -> None:
    # The group's records say which topics its target was computed from; the broker
    # that loads it compares them with the topics as they are now.
    server, link, conn = node
    await link.create_topic("t", 4)
    await link.create_topic("u", 2)
    await ready(conn, "g")
    a = await heartbeat(conn, "g", "a", 0, subscribed_topic_names=["t", "u"])
    a = await heartbeat(conn, "g", "a", a.member_epoch)
    mgr = server.groups
    index = mgr.partition_of("g")
    replica = server.replicas.replicas[TopicPartition(OFFSETS, index)]
    mgr._drop(index)  # another broker leads the offsets partition meanwhile
    await call(conn, m.DeleteTopicsRequest(["t"], timeout_ms=1000))
    mgr._start_load(index, replica)  # this broker leads it again and loads the log
    await wait_until_async(lambda: not mgr.partitions[index].loading, timeout=10)
    a = await heartbeat(conn, "g", "a", a.member_epoch)
    assert {tp.topic_id for tp in a.assignment} == {link.image.topic("u").topic_id}


async def test_a_deleted_topics_offsets_go_with_it(node: Any) -> None:
    # A topic created again under the same name starts with no committed offset, or
    # its consumers would skip its first records.
    server, link, conn = node
    await link.create_topic("t", 2)
    await link.create_topic("u", 1)
    await ready(conn, "g")
    assert await commit(conn, "g", "t", 0, 5) == 0
    assert await commit(conn, "g", "u", 0, 7) == 0
    await call(conn, m.DeleteTopicsRequest(["t"], timeout_ms=1000))
    await link.create_topic("t", 2)
    wanted = {"t": [0], "u": [0]}
    assert offsets_of(await fetch(conn, "g", wanted)) == {("t", 0): -1, ("u", 0): 7}
    # The tombstone is in the log: a reload does not bring the offset back.
    mgr = server.groups
    index = mgr.partition_of("g")
    mgr._start_load(index, server.replicas.replicas[TopicPartition(OFFSETS, index)])
    await wait_until_async(lambda: not mgr.partitions[index].loading, timeout=10)
    assert offsets_of(await fetch(conn, "g", wanted)) == {("t", 0): -1, ("u", 0): 7}


async def test_a_topic_deleted_while_the_partition_loads_loses_its_offsets(node: Any) -> None:
    server, link, conn = node
    await link.create_topic("t", 2)
    await ready(conn, "g")
    assert await commit(conn, "g", "t", 0, 5) == 0
    mgr = server.groups
    index = mgr.partition_of("g")
    replica = server.replicas.replicas[TopicPartition(OFFSETS, index)]
    mgr._start_load(index, replica)  # loading (a new leader epoch) while t goes and comes
    await call(conn, m.DeleteTopicsRequest(["t"], timeout_ms=1000))
    await link.create_topic("t", 2)
    await wait_until_async(lambda: not mgr.partitions[index].loading, timeout=10)
    assert offsets_of(await fetch(conn, "g", {"t": [0]})) == {("t", 0): -1}


async def test_a_silent_member_is_removed_by_the_timers(tmp_path: Path) -> None:
    link = FakeLink(1)
    config = broker_config(
        tmp_path / "logs",
        "offsets.topic.num.partitions=1",
        "group.consumer.session.timeout.ms=200",
    )
    server = BrokerServer(config, link=link)
    await server.start()
    conn = await Connection.open("127.0.0.1", server.port)
    try:
        await link.create_topic("t", 2)
        await ready(conn, "g")
        assert (await heartbeat(conn, "g", "a", 0)).member_epoch == 1

        async def empty() -> bool:
            listed = await call(conn, m.ListGroupsRequest())
            return [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Empty")]

        await wait_until_async(empty, timeout=10, message="member removed")
        assert (await heartbeat(conn, "g", "a", 1)).error_code == code("UNKNOWN_MEMBER_ID")
    finally:
        await conn.aclose()
        await server.stop()


async def test_a_failed_write_is_reverted_and_answered_retriably(tmp_path: Path) -> None:
    # One broker, min.insync.replicas=2: every group write is refused NOT_ENOUGH_REPLICAS.
    # The core applied each step before the append, so the manager must drop that state
    # (undo the step) and answer retriably.
    link = FakeLink(1)
    config = broker_config(
        tmp_path / "logs", "offsets.topic.num.partitions=1", "min.insync.replicas=2"
    )
    server = BrokerServer(config, link=link)
    await server.start()
    conn = await Connection.open("127.0.0.1", server.port)
    try:
        await link.create_topic("t", 2)
        await ready(conn, "g")
        a = await heartbeat(conn, "g", "a", 0)
        assert a.error_code == code("COORDINATOR_NOT_AVAILABLE")
        assert await commit(conn, "solo", "t", 0, 5) == code("COORDINATOR_NOT_AVAILABLE")

        async def reloaded() -> bool:
            return (await fetch(conn, "solo", None)).error_code == 0

        await wait_until_async(reloaded, timeout=10, message="partition reloaded")
        assert offsets_of(await fetch(conn, "solo", {"t": [0]})) == {("t", 0): -1}
        assert (await call(conn, m.ListGroupsRequest())).groups == []
        # The member the refused join would have made does not exist.
        assert (await heartbeat(conn, "g", "a", 1)).error_code == code("UNKNOWN_MEMBER_ID")
    finally:
        await conn.aclose()
        await server.stop()


async def test_a_refused_write_undoes_its_step_alone(node: Any) -> None:
    # While the ISR is below min.insync.replicas every append is refused before it
    # reaches the log: each refused step is undone on its group alone, with no reload
    # of the partition (which would restart every member's session).
    server, link, conn = node
    await link.create_topic("t", 2)
    await ready(conn, "g")
    a = await heartbeat(conn, "g", "a", 0)
    mgr = server.groups
    index = mgr.partition_of("g")
    part = mgr.partitions[index]
    replica = server.replicas.replicas[TopicPartition(OFFSETS, index)]
    replica.min_insync_replicas = 2  # the ISR shrank below it
    for i in range(5):
        refused = await heartbeat(conn, "g", f"m{i}", 0)
        assert refused.error_code == code("COORDINATOR_NOT_AVAILABLE")
    assert await commit(conn, "g", "t", 0, 5, "a", a.member_epoch) == code(
        "COORDINATOR_NOT_AVAILABLE"
    )
    assert mgr.partitions[index] is part and not part.loading
    g = part.groups["g"]
    assert set(g.members) == {"a"} and g.offsets == {}
    # a's session runs out: its removal cannot be written, so the removal is undone
    # and made again by a later tick, never lost.
    start = mgr.clock()
    mgr.clock = lambda: start + 10_000_000
    mgr.tick()
    assert set(part.groups["g"].members) == {"a"}
    replica.min_insync_replicas = 1
    mgr.tick()

    async def empty() -> bool:
        listed = await call(conn, m.ListGroupsRequest())
        return [(x.group_id, x.group_state) for x in listed.groups] == [("g", "Empty")]

    await wait_until_async(empty, timeout=10, message="a removed once writes pass")
    assert (await heartbeat(conn, "g", "a", a.member_epoch)).error_code == code("UNKNOWN_MEMBER_ID")


def test_records_too_large_to_write_are_not_retriable() -> None:
    for too_large in ("MESSAGE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"):
        assert _write_error(code(too_large)) == code("UNKNOWN_SERVER_ERROR")
    assert _write_error(code("NOT_ENOUGH_REPLICAS")) == code("COORDINATOR_NOT_AVAILABLE")


async def test_a_broker_that_just_became_follower_answers_not_coordinator(node: Any) -> None:
    # The ReplicaManager takes the follower role before GroupManager.on_metadata drops
    # the partition (roles are applied over several loop turns): in between, the groups
    # still in memory must not answer as coordinator.
    server, link, conn = node
    await link.create_topic("t", 2)
    await ready(conn, "g")
    a = await heartbeat(conn, "g", "a", 0)
    assert await commit(conn, "g", "t", 0, 5, "a", a.member_epoch) == 0
    index = server.groups.partition_of("g")
    tp = TopicPartition(OFFSETS, index)
    p = link.image.partition(OFFSETS, index)
    moved = dataclasses.replace(
        p, leader=2, leader_epoch=p.leader_epoch + 1, replicas=(1, 2), isr=(1, 2)
    )
    server.replicas._become(tp, moved, link.image)
    assert not server.replicas.replicas[tp].is_leader
    hb = await heartbeat(conn, "g", "a", a.member_epoch)
    assert hb.error_code == code("NOT_COORDINATOR")
    assert (await fetch(conn, "g", None)).error_code == code("NOT_COORDINATOR")


def hold_replication(server: BrokerServer, monkeypatch: pytest.MonkeyPatch) -> asyncio.Future[int]:
    """From now on every group append is accepted but never acknowledged by followers
    (nothing reaches the log): its writer waits. Cancel the future returned to end it."""
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def replicating(tp: TopicPartition, data: memoryview, timeout_ms: int) -> Any:
        return AppendResult(tp.topic, tp.partition, 0), never

    monkeypatch.setattr(server.replicas, "start_append", replicating)
    return never


async def test_a_read_waits_for_its_own_groups_writes_only(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another group's write still replicating must not hold back a read of a group
    # whose records are all committed (on a busy partition it would starve).
    server, link, conn = node
    await link.create_topic("t", 2)
    await ready(conn, "g")
    assert await commit(conn, "g", "t", 0, 5) == 0
    mgr = server.groups
    index = mgr.partition_of("g")
    other = next(f"h{i}" for i in range(1000) if mgr.partition_of(f"h{i}") == index)
    never = hold_replication(server, monkeypatch)
    # On its own connection: a connection's requests are answered in order.
    conn2 = await Connection.open("127.0.0.1", server.port)
    stuck = asyncio.get_running_loop().create_task(commit(conn2, other, "t", 0, 1))
    try:
        await wait_until_async(lambda: other in mgr.partitions[index].groups, timeout=10)
        f = await fetch(conn, "g", {"t": [0]})
        assert f.error_code == 0 and offsets_of(f) == {("t", 0): 5}
        assert not stuck.done()
    finally:
        stuck.cancel()
        never.cancel()
        await conn2.aclose()


class CreationSpyLink(FakeLink):
    """Remembers the replication factor of each topic it is asked to create."""

    def __init__(self, node_id: int) -> None:
        super().__init__(node_id)
        self.asked: list[int] = []

    async def forward(self, message: Any) -> Any:
        if isinstance(message, m.CreateTopicsRequest):
            self.asked += [t.replication_factor for t in message.topics]
        return await super().forward(message)


async def test_the_offsets_topic_waits_for_as_many_brokers_as_its_replicas(
    tmp_path: Path,
) -> None:
    # Replication is offsets.topic.replication.factor (3 here) capped at the brokers
    # registered: with a second broker registered but fenced, the topic is not made with
    # one replica for good; the coordinator stays unavailable until that broker is back.
    link = CreationSpyLink(1)
    config = broker_config(tmp_path / "logs", "offsets.topic.replication.factor=3")
    server = BrokerServer(config, link=link)
    await server.start()
    conn = await Connection.open("127.0.0.1", server.port)
    try:
        other = RegisterBroker(2, "b2", 1, (Endpoint("BROKER", "127.0.0.1", 1),), None)
        await link.commit([other])
        (c,) = await find(conn, "g")
        assert c.error_code == code("COORDINATOR_NOT_AVAILABLE")
        assert link.asked == [] and link.image.topic(OFFSETS) is None
        await link.commit([UnfenceBroker(2, 1)])
        await find(conn, "g")
        await wait_until_async(lambda: link.image.topic(OFFSETS) is not None, timeout=10)
        assert link.asked == [2]
    finally:
        await conn.aclose()
        await server.stop()


async def _reload(server: BrokerServer, index: int) -> None:
    """Load the offsets partition again, as after a new leader epoch."""
    mgr = server.groups
    mgr._start_load(index, server.replicas.replicas[TopicPartition(OFFSETS, index)])
    await wait_until_async(lambda: not mgr.partitions[index].loading, timeout=10)


async def test_a_group_that_does_not_load_fails_alone(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A record that does not decode (here: a newer value version) or a replay that
    # raises fails that group only: it answers retriably and is never written over;
    # the partition's other groups load and are served.
    server, link, conn = node
    await link.create_topic("t", 2)
    mgr = server.groups
    await ready(conn, "g")
    index = mgr.partition_of("g")
    bad, broken = [f"x{i}" for i in range(1000) if mgr.partition_of(f"x{i}") == index][:2]
    for group in ("g", bad, broken):
        assert await commit(conn, group, "t", 0, 5) == 0
    key, value = codec.encode(GroupMetadataRecord(bad, 3))[0]
    assert value is not None
    tp = TopicPartition(OFFSETS, index)
    batch = records.encode_batch([b"\x00\x07" + value[2:]], [key], timestamp_ms=0)
    result, done = server.replicas.start_append(tp, memoryview(batch), 5000)
    await server.replicas.finish_append(result, done, 5000)
    assert result.error_code == 0
    load = GroupCoordinator.load

    def load_or_raise(group_id: str, *args: Any) -> GroupCoordinator:
        if group_id == broken:
            raise RuntimeError("replay failed")
        return load(group_id, *args)

    monkeypatch.setattr(GroupCoordinator, "load", load_or_raise)
    await _reload(server, index)
    assert offsets_of(await fetch(conn, "g", {"t": [0]})) == {("t", 0): 5}
    unavailable = code("COORDINATOR_NOT_AVAILABLE")
    for group in (bad, broken):
        assert (await fetch(conn, group, None)).error_code == unavailable
        assert await commit(conn, group, "t", 0, 9) == unavailable
        assert (await heartbeat(conn, group, "a", 0)).error_code == unavailable
    listed = await call(conn, m.ListGroupsRequest())
    assert [x.group_id for x in listed.groups] == ["g"]


async def test_a_group_whose_timers_or_topic_update_raise_stops_no_other(node: Any) -> None:
    server, link, conn = node
    await link.create_topic("t", 2)
    await link.create_topic("u", 1)
    for group in ("g", "h"):
        await ready(conn, group)
        assert (await heartbeat(conn, group, "a", 0)).error_code == 0
    mgr = server.groups

    def live(group: str) -> GroupCoordinator:
        return mgr.partitions[mgr.partition_of(group)].groups[group]

    def fails(*args: Any) -> Any:
        raise RuntimeError("a bug in one group")

    broken = live("g")
    broken.tick = fails  # type: ignore[method-assign]
    broken.update_topics = fails  # type: ignore[method-assign]
    start = mgr.clock()
    mgr.clock = lambda: start + 10_000_000  # every session ran out
    mgr.tick()
    await call(conn, m.DeleteTopicsRequest(["u"], timeout_ms=1000))  # a topic update

    async def h_empty() -> bool:
        listed = await call(conn, m.ListGroupsRequest())
        return ("h", "Empty") in [(x.group_id, x.group_state) for x in listed.groups]

    await wait_until_async(h_empty, timeout=10, message="h's silent member removed")
    assert set(broken.members) == {"a"}  # put back as it was, not half-changed
    # The ticker task itself survives a tick that raises: it ticks again.
    calls: list[int] = []

    def tick_fails() -> None:
        calls.append(1)
        raise RuntimeError("a bug in tick")

    mgr.tick = tick_fails  # type: ignore[method-assign]
    await wait_until_async(lambda: len(calls) >= 2, timeout=10, message="ticker ticks again")


def _summary(g: GroupCoordinator) -> tuple[object, ...]:
    members = {k: (v.member_epoch, dict(v.assigned)) for k, v in sorted(g.members.items())}
    return g.group_epoch, g.target_assignment_epoch, members, dict(sorted(g.target.items()))


async def test_a_timer_write_is_logged_before_a_later_requests_write(node: Any) -> None:
    # Regression: a tick's records were appended from a task started later, so a
    # request handled in between logged its records first and a load rebuilt another
    # group than the one in memory.
    server, link, conn = node
    await link.create_topic("t", 4)
    await ready(conn, "g")
    await heartbeat(conn, "g", "a", 0)
    await heartbeat(conn, "g", "c", 0)
    mgr = server.groups
    index = mgr.partition_of("g")
    part = mgr.partitions[index]
    part.groups["g"].members["a"].session_deadline_ms = 0  # a's session ran out
    mgr.tick()  # removes a and bumps the epoch
    now = mgr.clock()
    joined = Heartbeat("d", 0, subscribed_topics=frozenset({"t"}))
    await mgr.run("g", lambda g: g.heartbeat(joined, now))
    replica = server.replicas.replicas[TopicPartition(OFFSETS, index)]
    await wait_until_async(
        lambda: replica.state.high_watermark >= replica.log.log_end_offset, timeout=10
    )
    by_group, _ = await mgr._read_log(part, replica)
    loaded = GroupCoordinator.load("g", by_group["g"], mgr._topics, now, mgr.group_config)
    assert _summary(loaded) == _summary(part.groups["g"])


async def test_list_groups_shows_committed_states_only(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A group whose first write is still replicating (and may yet be lost) is not
    # listed; a listed group shows the state its committed records give.
    server, link, conn = node
    await link.create_topic("t", 2)
    await ready(conn, "g")
    assert (await heartbeat(conn, "g", "a", 0)).error_code == 0
    never = hold_replication(server, monkeypatch)
    conn2 = await Connection.open("127.0.0.1", server.port)
    mgr = server.groups
    in_flight = [
        asyncio.get_running_loop().create_task(heartbeat(conn2, "p", "a", 0)),
        asyncio.get_running_loop().create_task(heartbeat(conn2, "g", "b", 0)),
    ]
    try:
        await wait_until_async(
            lambda: "b" in mgr.partitions[mgr.partition_of("g")].groups["g"].members, timeout=10
        )
        assert "p" in mgr.partitions[mgr.partition_of("p")].groups
        listed = await call(conn, m.ListGroupsRequest())
        # g as committed: a alone, reconciled (b's join would make it Reconciling).
        assert [(x.group_id, x.group_state) for x in listed.groups] == [("g", "Stable")]
    finally:
        for task in in_flight:
            task.cancel()
        never.cancel()
        await conn2.aclose()


async def test_a_request_for_many_groups_waits_for_them_together(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OffsetFetch of two groups whose writes are both replicating: both waits run at
    # once, so the answer takes the longest wait, not their sum.
    server, link, conn = node
    await link.create_topic("t", 2)
    await ready(conn, "g")
    mgr = server.groups
    index = mgr.partition_of("g")
    one, two = [f"x{i}" for i in range(1000) if mgr.partition_of(f"x{i}") == index][:2]
    never = hold_replication(server, monkeypatch)
    conns = [await Connection.open("127.0.0.1", server.port) for _ in range(3)]
    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(commit(c, g, "t", 0, 1))
        for c, g in zip(conns[:2], (one, two), strict=True)
    ]
    replica = server.replicas.replicas[TopicPartition(OFFSETS, index)]
    try:
        groups = mgr.partitions[index].groups
        await wait_until_async(lambda: one in groups and two in groups, timeout=10)
        both = m.OffsetFetchRequest(
            groups=[m.OffsetFetchGroup(g, None, -1, None) for g in (one, two)]
        )
        before = len(replica.hw_waiters)
        tasks.append(loop.create_task(call(conns[2], both)))
        await wait_until_async(
            lambda: len(replica.hw_waiters) >= before + 2, timeout=10, message="both waiting"
        )
    finally:
        for task in tasks:
            task.cancel()
        never.cancel()
        for c in conns:
            await c.aclose()


async def test_concurrent_deletes_of_one_group_succeed_once(node: Any) -> None:
    server, link, conn = node
    await link.create_topic("t", 2)
    await ready(conn, "g")
    assert await commit(conn, "g", "t", 0, 5) == 0
    mgr = server.groups
    committed = mgr.committed
    arrived: list[str] = []
    both = asyncio.Event()

    async def committed_once_both_looked(group_id: str) -> Any:
        # Both requests read the group (it exists) before either deletes it.
        g = await committed(group_id)
        arrived.append(group_id)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        return g

    mgr.committed = committed_once_both_looked  # type: ignore[method-assign]
    conn2 = await Connection.open("127.0.0.1", server.port)
    try:
        answers = await asyncio.gather(
            *(call(c, m.DeleteGroupsRequest(["g"])) for c in (conn, conn2))
        )
    finally:
        await conn2.aclose()
    codes = sorted(a.results[0].error_code for a in answers)
    assert codes == sorted([0, code("GROUP_ID_NOT_FOUND")])
    assert "g" not in mgr.partitions[mgr.partition_of("g")].groups


async def test_metadata_never_auto_creates_the_offsets_topic(tmp_path: Path) -> None:
    link = FakeLink(1)
    server = BrokerServer(
        broker_config(tmp_path / "logs", "auto.create.topics.enable=true"), link=link
    )
    await server.start()
    conn = await Connection.open("127.0.0.1", server.port)
    try:
        meta = await call(conn, m.MetadataRequest([OFFSETS], allow_auto_topic_creation=True))
        assert meta.topics[0].error_code == code("UNKNOWN_TOPIC_OR_PARTITION")
        other = await call(conn, m.MetadataRequest(["plain"], allow_auto_topic_creation=True))
        assert other.topics[0].error_code == code("LEADER_NOT_AVAILABLE")  # being created
        await wait_until_async(lambda: link.image.topic("plain") is not None, timeout=10)
        assert link.image.topic(OFFSETS) is None
    finally:
        await conn.aclose()
        await server.stop()
