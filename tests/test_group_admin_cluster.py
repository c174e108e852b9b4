"""Admin's group operations and `rillet group` against real controller and broker
processes. Groups are made by RawMember (tests/group_members.py): heartbeats and
commits sent by hand, as a group consumer would."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator

import pytest
from group_members import RawMember
from helpers import run_cli

from rillet.client.admin import Admin, AdminError, NewTopic
from rillet.client.producer import Producer
from rillet.client.wire.errors import GroupIdNotFoundError, NonEmptyGroupError
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

GUARD_S = 120
PARTITIONS = 3
PER_PARTITION = (10, 7, 4)  # records produced to each partition
COMMITTED = {("t", 0): 6, ("t", 1): 7}  # what the member commits (nothing for t-2)
T0 = 1_700_000_000_000  # record timestamps: T0 + offset seconds


@pytest.fixture
def group_cluster(cluster_factory) -> Iterator[LocalCluster]:  # noqa: ANN001
    # A small offsets topic: 50 partitions of RF 3 is only slower to create here.
    yield cluster_factory(controllers=1, brokers=3, overrides={"offsets.topic.num.partitions": 5})


async def setup_topic(bootstrap: str) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topics([NewTopic("t", PARTITIONS, 3)])
    async with Producer(bootstrap=bootstrap, acks="all") as producer:
        for p, count in enumerate(PER_PARTITION):
            for i in range(count):
                producer.send("t", f"{p}-{i}".encode(), partition=p, timestamp=T0 + i * 1000)
        await producer.flush()


async def active_member(bootstrap: str, group: str) -> RawMember:
    member = RawMember(bootstrap, group, ["t"], client_id="raw-1")
    await member.join_until_owning(PARTITIONS)
    await member.commit(COMMITTED)
    return member


async def admin_scenario(bootstrap: str) -> None:
    await setup_topic(bootstrap)
    member = await active_member(bootstrap, "g")
    async with Admin(bootstrap) as admin:
        listed = await admin.list_groups()
        assert [(g.group_id, g.state.lower()) for g in listed] == [("g", "stable")]

        (desc,) = await admin.describe_groups(["g"])
        assert desc.state.lower() == "stable"
        assert desc.group_epoch >= 1 and desc.assignment_epoch == desc.group_epoch
        (mb,) = desc.members
        # (Client id and host: the broker does not record them yet; the fake-broker tests
        # check that Admin passes them on.)
        assert (mb.member_id, mb.member_epoch) == (member.member_id, member.epoch)
        assert mb.assignment == {"t": (0, 1, 2)} and mb.target == mb.assignment
        assert mb.subscribed_topics == ("t",)

        lag = await admin.group_lag("g")
        rows = [
            (p.partition, p.committed_offset, p.log_end_offset, p.lag, p.member.member_id)
            for p in lag.partitions
        ]
        assert rows == [
            (0, 6, 10, 4, member.member_id),
            (1, 7, 7, 0, member.member_id),
            (2, None, 4, None, member.member_id),
        ]
        # More records: the lag follows the log end.
        async with Producer(bootstrap=bootstrap, acks="all") as producer:
            for i in range(5):
                producer.send("t", b"more", partition=1, timestamp=T0 + (7 + i) * 1000)
            await producer.flush()
        lag = await admin.group_lag("g")
        assert [(p.log_end_offset, p.lag) for p in lag.partitions][1] == (12, 5)
        assert lag.total_lag == 9

        with pytest.raises(AdminError) as raised:
            await admin.alter_group_offsets("g", {("t", 0): 0})
        assert isinstance(raised.value.errors["g"], NonEmptyGroupError)
        assert "has active members; stop them first" in str(raised.value)
        (refused,) = await admin.delete_groups(["g"])
        assert isinstance(refused.error, NonEmptyGroupError)

        await member.leave()
        (desc,) = await admin.describe_groups(["g"])
        assert desc.state.lower() == "empty" and desc.members == ()

        await admin.alter_group_offsets("g", {("t", 0): 2, ("t", 2): 4})
        got = await admin.list_group_offsets("g")
        assert {tp: c.offset for tp, c in got.items()} == {
            ("t", 0): 2,
            ("t", 1): 7,
            ("t", 2): 4,
        }
        await admin.delete_group_offsets("g", [("t", 1)])
        assert ("t", 1) not in await admin.list_group_offsets("g")

        (deleted,) = await admin.delete_groups(["g"])
        assert deleted.ok, deleted.error
        with pytest.raises(AdminError) as raised:
            await admin.describe_groups(["g"])
        assert isinstance(raised.value.errors["g"], GroupIdNotFoundError)
    await member.close()


def test_admin_group_operations(group_cluster: LocalCluster) -> None:
    async def run() -> None:
        await asyncio.wait_for(admin_scenario(group_cluster.bootstrap), GUARD_S)

    asyncio.run(run())


def rillet(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    return run_cli(cluster.bootstrap, *args, ok=ok, timeout=GUARD_S)


async def cli(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    # In a thread: the member's heartbeats and commits share this event loop.
    return await asyncio.to_thread(rillet, cluster, *args, ok=ok)


async def committed(cluster: LocalCluster, group: str) -> dict[str, int]:
    out = (await cli(cluster, "group", "describe", group, "--json")).stdout
    (doc,) = json.loads(out)["groups"]
    return {
        f"{p['topic']}-{p['partition']}": p["committed_offset"]
        for p in doc["partitions"]
        if p["committed_offset"] is not None
    }


async def cli_scenario(cluster: LocalCluster) -> None:
    await setup_topic(cluster.bootstrap)
    member = await active_member(cluster.bootstrap, "app")

    listed = json.loads((await cli(cluster, "group", "list", "--json")).stdout)["groups"]
    assert [g["group_id"] for g in listed] == ["app"]
    out = (await cli(cluster, "group", "describe", "app", "--json")).stdout
    (doc,) = json.loads(out)["groups"]
    rows = [
        (p["partition"], p["committed_offset"], p["log_end_offset"], p["lag"])
        for p in doc["partitions"]
    ]
    assert rows == [(0, 6, 10, 4), (1, 7, 7, 0), (2, None, 4, None)]
    assert doc["total_lag"] == 4 and len(doc["members"]) == 1
    human = (await cli(cluster, "group", "describe", "app")).stdout
    assert "LOG-END-OFFSET" in human and member.member_id in human

    # Refused, dry run or not, while the member is there.
    for extra in ([], ["--execute"]):
        refused = await cli(
            cluster,
            "group",
            "reset-offsets",
            "app",
            "--all-topics",
            "--to-earliest",
            *extra,
            ok=False,
        )
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert "group 'app' has active members; stop them first" in refused.stderr
    gone = await cli(cluster, "group", "delete", "app", ok=False)
    assert gone.returncode == 1 and "has active members" in gone.stderr

    await member.leave()
    await member.close()
    before = await committed(cluster, "app")
    assert before == {"t-0": 6, "t-1": 7}
    dry = await cli(cluster, "group", "reset-offsets", "app", "--topic", "t", "--to-earliest")
    assert "Dry run" in dry.stdout and await committed(cluster, "app") == before

    async def reset(*mode: str) -> dict[str, int]:
        await cli(cluster, "group", "reset-offsets", "app", "--topic", "t", *mode, "--execute")
        return await committed(cluster, "app")

    assert await reset("--to-earliest") == {"t-0": 0, "t-1": 0, "t-2": 0}
    assert await reset("--to-latest") == {"t-0": 10, "t-1": 7, "t-2": 4}
    assert await reset("--shift-by", "-5") == {"t-0": 5, "t-1": 2, "t-2": 0}
    assert await reset("--to-offset", "8") == {"t-0": 8, "t-1": 7, "t-2": 4}
    assert await reset("--to-current") == {"t-0": 8, "t-1": 7, "t-2": 4}
    # Record i of each partition is stamped T0 + i s: T0 + 5 s is offset 5, where there
    # is one; partition 2's last record is older, so its log end.
    when = "2023-11-14T22:13:25+00:00"  # T0 + 5 s
    assert await reset("--to-datetime", when) == {"t-0": 5, "t-1": 5, "t-2": 4}

    out = (
        await cli(
            cluster,
            "group",
            "reset-offsets",
            "app",
            "--topic",
            "t:1",
            "--to-offset",
            "1",
            "--json",
        )
    ).stdout
    dry_json = json.loads(out)
    assert dry_json["executed"] is False and dry_json["partitions"][0]["new_offset"] == 1

    deleted = json.loads((await cli(cluster, "group", "delete", "app", "--json")).stdout)
    assert deleted == {"results": [{"group_id": "app", "error": "NONE", "message": None}]}
    missing = await cli(cluster, "group", "describe", "app", ok=False)
    assert missing.returncode == 1 and "group 'app' does not exist" in missing.stderr
    unknown_topic = await cli(
        cluster, "group", "reset-offsets", "app", "--topic", "nope", "--to-earliest", ok=False
    )
    assert unknown_topic.returncode == 1 and "'nope' does not exist" in unknown_topic.stderr


def test_group_cli(group_cluster: LocalCluster) -> None:
    asyncio.run(asyncio.wait_for(cli_scenario(group_cluster), 4 * GUARD_S))
