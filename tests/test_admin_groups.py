"""Admin's consumer-group operations over the real wire against fake brokers
(tests/fake_groups.py): batching, following a coordinator, lag, and the errors that
tell an operator what to do. The same operations against real processes are in
test_group_admin_cluster.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from fake_groups import FakeGroupCluster, member, threaded_cluster

from rillet.client.admin import Admin, AdminError, PartitionLag
from rillet.client.sync import SyncAdmin
from rillet.client.wire.errors import (
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    NonEmptyGroupError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

GUARD_S = 20


@pytest.fixture
async def fake() -> AsyncIterator[FakeGroupCluster]:
    cluster = await FakeGroupCluster().start()
    try:
        yield cluster
    finally:
        await cluster.stop()


@pytest.fixture
async def admin(fake: FakeGroupCluster) -> AsyncIterator[Admin]:
    async with Admin(fake.bootstrap, timeout_ms=2_000, retry_backoff_ms=10) as a:
        yield a


async def test_list_groups_merges_every_broker_and_filters_states(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    fake.group("a").coordinator = 1
    fake.group("b").coordinator = 2
    fake.group("c").coordinator = 3
    fake.group("b").members = [member("m1", {"t": [0]})]
    listed = await asyncio.wait_for(admin.list_groups(), GUARD_S)
    assert [(g.group_id, g.state, g.coordinator) for g in listed] == [
        ("a", "Empty", 1),
        ("b", "Stable", 2),
        ("c", "Empty", 3),
    ]
    stable = await asyncio.wait_for(admin.list_groups(["STABLE"]), GUARD_S)
    assert [g.group_id for g in stable] == ["b"]
    assert listed[1].as_dict() == {
        "group_id": "b",
        "state": "Stable",
        "type": "consumer",
        "protocol_type": "consumer",
        "coordinator": 2,
    }


async def test_list_groups_fails_when_a_broker_does_not_answer(fake: FakeGroupCluster) -> None:
    fake.group("a").coordinator = 2
    fake.silent.add(2)
    async with Admin(fake.bootstrap, timeout_ms=300, request_timeout_ms=100) as admin:
        with pytest.raises(RequestTimedOutError, match="broker 2 did not list its groups"):
            await asyncio.wait_for(admin.list_groups(), GUARD_S)


async def test_describe_groups_asks_each_coordinator_once_after_one_lookup(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    for gid, node in (("a", 1), ("b", 2), ("c", 2)):
        fake.group(gid).coordinator = node
    fake.group("b").members = [
        member("m2", {"t": [1]}, client_id="c2", host="/10.0.0.2", instance_id="i2"),
        member("m1", {"t": [0, 2], "u": [0]}, client_id="c1"),
    ]
    described = await asyncio.wait_for(admin.describe_groups(["b", "a", "c"]), GUARD_S)
    assert [d.group_id for d in described] == ["b", "a", "c"]
    assert fake.lookups == 1
    assert fake.describes == {1: 1, 2: 1}
    b = described[0]
    assert (b.state, b.group_epoch, b.assignor, b.coordinator) == ("Stable", 1, "uniform", 2)
    assert [mb.member_id for mb in b.members] == ["m1", "m2"]
    m1, m2 = b.members
    assert m1.assignment == {"t": (0, 2), "u": (0,)} and m1.target == m1.assignment
    assert (m2.instance_id, m2.client_id, m2.client_host) == ("i2", "c2", "/10.0.0.2")
    assert b.owner("t", 2) is m1 and b.owner("t", 3) is None
    assert b.as_dict()["members"][0]["assignment"] == {"t": [0, 2], "u": [0]}


async def test_describe_names_every_group_that_does_not_exist(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    fake.group("a")
    with pytest.raises(AdminError) as raised:
        await asyncio.wait_for(admin.describe_groups(["a", "x", "y"]), GUARD_S)
    assert set(raised.value.errors) == {"x", "y"}
    assert isinstance(raised.value.errors["x"], GroupIdNotFoundError)
    assert "group 'x' does not exist" in str(raised.value)


async def test_describe_follows_a_coordinator_that_moved(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    fake.group("a").coordinator = 3
    fake.moved_once.add("a")  # the first answer is NOT_COORDINATOR
    (d,) = await asyncio.wait_for(admin.describe_groups(["a"]), GUARD_S)
    assert d.coordinator == 3
    assert fake.lookups == 2 and fake.describes == {3: 2}


async def test_group_lag_per_partition_with_owner_and_uncommitted_partitions(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    fake.create("t", 3)
    for p, end in enumerate((10, 7, 0)):
        fake.topics["t"][p].end_offset = end
    await admin.alter_group_offsets("g", {("t", 0): 4, ("t", 1): 7})
    fake.group("g").members = [member("m1", {"t": [0, 1]}), member("m2", {"t": [2]})]
    lag = await asyncio.wait_for(admin.group_lag("g"), GUARD_S)
    rows = [
        (p.topic, p.partition, p.committed_offset, p.log_end_offset, p.lag) for p in lag.partitions
    ]
    assert rows == [("t", 0, 4, 10, 6), ("t", 1, 7, 7, 0), ("t", 2, None, 0, None)]
    assert [p.member.member_id if p.member else None for p in lag.partitions] == ["m1", "m1", "m2"]
    assert lag.total_lag == 6
    as_dict = lag.as_dict()
    assert as_dict["state"] == "Stable" and as_dict["total_lag"] == 6
    assert as_dict["partitions"][2] == {
        "topic": "t",
        "partition": 2,
        "committed_offset": None,
        "log_end_offset": 0,
        "lag": None,
        "member_id": "m2",
        "instance_id": None,
        "client_id": "app",
        "host": "/127.0.0.1",
    }


async def test_group_lag_of_an_unknown_group_is_not_found(admin: Admin) -> None:
    with pytest.raises(AdminError, match="group 'nope' does not exist"):
        await asyncio.wait_for(admin.group_lag("nope"), GUARD_S)


async def test_offsets_of_a_group_with_members_are_refused_clearly(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    fake.group("g").members = [member("m1", {"t": [0]})]
    with pytest.raises(AdminError) as raised:
        await asyncio.wait_for(admin.alter_group_offsets("g", {("t", 0): 1}), GUARD_S)
    assert isinstance(raised.value.errors["g"], NonEmptyGroupError)
    assert "group 'g' has active members; stop them first" in str(raised.value)
    assert fake.groups["g"].offsets == {}


async def test_committed_offsets_round_trip(fake: FakeGroupCluster, admin: Admin) -> None:
    await admin.alter_group_offsets("g", {("t", 0): 5, ("t", 1): 9, ("u", 0): 1})
    got = await asyncio.wait_for(admin.list_group_offsets("g"), GUARD_S)
    assert {tp: c.offset for tp, c in got.items()} == {("t", 0): 5, ("t", 1): 9, ("u", 0): 1}
    some = await admin.list_group_offsets("g", [("t", 1)])
    assert list(some) == [("t", 1)]


async def test_offsets_of_many_groups_take_one_request_per_coordinator(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    for gid, node in (("a", 1), ("b", 2), ("c", 2)):
        fake.group(gid).coordinator = node
    fake.group("a").offsets = {("t", 0): 5}
    fake.group("b").offsets = {("t", 0): 7, ("u", 1): 2}
    got = await asyncio.wait_for(admin.list_offsets_of_groups(["a", "b", "c"]), GUARD_S)
    offsets = {g: {tp: c.offset for tp, c in v.items()} for g, v in got.items()}  # type: ignore[union-attr]
    assert offsets == {"a": {("t", 0): 5}, "b": {("t", 0): 7, ("u", 1): 2}, "c": {}}
    assert fake.lookups == 1 and fake.offset_fetches == {1: 1, 2: 1}


async def test_delete_groups_reports_each_group(fake: FakeGroupCluster, admin: Admin) -> None:
    fake.group("busy").members = [member("m1", {"t": [0]})]
    fake.group("idle").offsets[("t", 0)] = 3
    results = await asyncio.wait_for(admin.delete_groups(["busy", "idle", "none"]), GUARD_S)
    assert [(r.group_id, r.ok) for r in results] == [
        ("busy", False),
        ("idle", True),
        ("none", False),
    ]
    assert isinstance(results[0].error, NonEmptyGroupError)
    assert "has active members; stop them first" in str(results[0].error)
    assert isinstance(results[2].error, GroupIdNotFoundError)
    assert results[1].as_dict() == {"group_id": "idle", "error": "NONE", "message": None}
    with pytest.raises(AdminError, match="group 'idle' does not exist"):
        await admin.describe_groups(["idle"])


async def test_delete_group_offsets_of_a_subscribed_topic_is_refused(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    g = fake.group("g")
    g.members = [member("m1", {"t": [0]})]
    g.offsets.update({("t", 0): 1, ("old", 0): 2})
    await admin.delete_group_offsets("g", [("old", 0)])
    assert g.offsets == {("t", 0): 1}
    with pytest.raises(AdminError) as raised:
        await admin.delete_group_offsets("g", [("t", 0)])
    assert isinstance(raised.value.errors["t-0"], GroupSubscribedToTopicError)
    assert "subscribed to topic 't'" in str(raised.value)


async def test_list_offsets_by_spec_and_unknown_topics(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    fake.create("t", 2)
    fake.topics["t"][1].end_offset = 12
    got = await admin.list_offsets({("t", 0): -2, ("t", 1): -1})
    assert got == {("t", 0): 0, ("t", 1): 12}
    with pytest.raises(AdminError) as raised:
        await admin.list_offsets({("nope", 0): -1, ("t", 5): -1})
    assert set(raised.value.errors) == {"nope", "t-5"}
    assert all(isinstance(e, UnknownTopicOrPartitionError) for e in raised.value.errors.values())


def test_sync_admin_forwards_the_group_operations() -> None:
    for fake in threaded_cluster():  # its own loop: SyncAdmin blocks the calling thread
        fake.call(lambda c: c.create("t", 1))
        with SyncAdmin(fake.cluster.bootstrap, timeout_ms=2_000) as admin:
            admin.alter_group_offsets("g", {("t", 0): 0})
            assert [g.group_id for g in admin.list_groups()] == ["g"]
            assert admin.describe_groups(["g"])[0].state == "Empty"
            assert {tp: c.offset for tp, c in admin.list_group_offsets("g").items()} == {
                ("t", 0): 0
            }
            assert admin.group_lag("g").partitions[0].lag == 0
            (offsets,) = admin.list_offsets_of_groups(["g"]).values()
            assert {tp: c.offset for tp, c in offsets.items()} == {("t", 0): 0}  # type: ignore[union-attr]
            assert admin.list_offsets({("t", 0): -1}) == {("t", 0): 0}
            admin.delete_group_offsets("g", [("t", 0)])
            assert admin.list_group_offsets("g") == {}
            assert [r.ok for r in admin.delete_groups(["g"])] == [True]


async def test_describe_looks_up_again_when_the_coordinator_is_gone(
    fake: FakeGroupCluster, admin: Admin
) -> None:
    fake.group("a").coordinator = 2
    (d,) = await admin.describe_groups(["a"])
    assert d.coordinator == 2
    await fake.stop_broker(2)  # the connection to it breaks; its partitions move to 3
    fake.groups["a"].coordinator = 3
    (d,) = await asyncio.wait_for(admin.describe_groups(["a"]), GUARD_S)
    assert d.coordinator == 3


def test_lag_is_log_end_minus_commit_even_past_the_end() -> None:
    assert PartitionLag("t", 0, 4, 10).lag == 6
    assert PartitionLag("t", 0, 12, 10).lag == -2  # a commit past the log end: shown
    assert PartitionLag("t", 0, None, 10).lag is None
    assert PartitionLag("t", 0, 3, None).lag is None
