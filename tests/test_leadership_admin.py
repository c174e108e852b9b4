"""Leader election and reassignment on the client side, without a cluster: the Admin
calls against a tiny in-process server speaking the real protocol, and the pure pieces
of the CLI (plans, status, filters, summaries)."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rillet.client.admin import (
    REASSIGNMENT_ABSENT,
    REASSIGNMENT_COMPLETE,
    REASSIGNMENT_IN_PROGRESS,
    Admin,
    AdminError,
    ReassignmentStatus,
    election_succeeded,
)
from rillet.client.cli.common import CliError
from rillet.client.cli.leader import summarize_election
from rillet.client.cli.partition import parse_plan, parse_replicas, plan_from_args, plan_json
from rillet.client.cli.topic import filter_partitions, partition_counts
from rillet.client.runtime.rpc_server import Request, Response, RpcServer
from rillet.client.wire import messages as m
from rillet.client.wire import schemas
from rillet.client.wire.errors import (
    ElectionNotNeededError,
    InvalidReplicaAssignmentError,
    PreferredLeaderNotAvailableError,
    UnknownTopicOrPartitionError,
    code_of,
)
from rillet.tools.local_cluster import summarize_partitions

NOT_NEEDED = code_of("ELECTION_NOT_NEEDED")
UNKNOWN = code_of("UNKNOWN_TOPIC_OR_PARTITION")


class TinyController:
    """Answers Metadata, ElectLeaders and AlterPartitionReassignments from a small
    table of partitions {(topic, p): [leader, replicas, isr]}, recording requests."""

    def __init__(self) -> None:
        self.parts: dict[tuple[str, int], list[Any]] = {
            ("a", 0): [2, [1, 2], [1, 2]],
            ("a", 1): [2, [2, 1], [2, 1]],
            ("b", 0): [1, [1, 2, 3], [1, 2, 3]],
        }
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.server = RpcServer(
            {
                schemas.METADATA.key: self.metadata,
                schemas.ELECT_LEADERS.key: self.elect,
                schemas.ALTER_PARTITION_REASSIGNMENTS.key: self.reassign,
            }
        )

    async def metadata(self, request: Request) -> Response:
        names = request.fields["topics"] or sorted({t for t, _ in self.parts})
        topics = []
        for name in names:
            rows = [
                [0, p, leader, 0, reps, isr, []]
                for (t, p), (leader, reps, isr) in sorted(self.parts.items())
                if t == name
            ]
            topics.append([0 if rows else UNKNOWN, name, False, rows])
        port = self.server.port
        return Response(
            {
                "cluster_id": "x",
                "controller_id": 9,
                "brokers": [[1, "127.0.0.1", port, None]],
                "topics": topics,
            }
        )

    async def elect(self, request: Request) -> Response:
        self.requests.append(("elect", dict(request.fields)))
        results = []
        for name in request.fields["topics"] or sorted({t for t, _ in self.parts}):
            keys = sorted(k for k in self.parts if k[0] == name)
            if not keys:
                results.append([name, -1, UNKNOWN, None])
            for key in keys:
                leader, reps, _ = self.parts[key]
                code = NOT_NEEDED if leader == reps[0] else 0
                self.parts[key][0] = reps[0]
                results.append([key[0], key[1], code, None])
        return Response({"error_code": 0, "results": results})

    async def reassign(self, request: Request) -> Response:
        self.requests.append(("reassign", dict(request.fields)))
        results = []
        for topic, p, replicas in request.fields["partitions"]:
            bad = replicas is not None and any(b > 3 for b in replicas)
            code = code_of("INVALID_REPLICA_ASSIGNMENT") if bad else 0
            results.append([topic, p, code, "brokers above 3 are unknown" if bad else None])
        return Response({"error_code": 0, "results": results})


@pytest.fixture
async def tiny() -> AsyncIterator[TinyController]:
    ctl = TinyController()
    await ctl.server.start()
    try:
        yield ctl
    finally:
        await ctl.server.stop()


def admin_for(ctl: TinyController) -> Admin:
    return Admin(f"127.0.0.1:{ctl.server.port}", timeout_ms=2000)


async def test_elect_leaders_all_topics_reports_each_partition(tiny: TinyController) -> None:
    async with admin_for(tiny) as admin:
        results = await admin.elect_leaders()
    assert tiny.requests[0][1]["topics"] is None  # nil: every topic
    by = {(r.topic, r.partition): r for r in results}
    assert by[("a", 0)].ok
    assert isinstance(by[("a", 1)].error, ElectionNotNeededError)
    assert all(election_succeeded(r) for r in results)


async def test_elect_leaders_partitions_narrow_the_answer(tiny: TinyController) -> None:
    async with admin_for(tiny) as admin:
        results = await admin.elect_leaders(partitions=[("a", 0), ("a", 7), ("zz", 0)])
    assert tiny.requests[0][1]["topics"] == ["a", "zz"]
    assert [(r.topic, r.partition) for r in results] == [("a", 0), ("a", 7), ("zz", 0)]
    assert results[0].ok
    assert isinstance(results[1].error, UnknownTopicOrPartitionError)  # no such partition
    assert isinstance(results[2].error, UnknownTopicOrPartitionError)  # no such topic


async def test_alter_reassignments_sends_targets_and_cancels(tiny: TinyController) -> None:
    async with admin_for(tiny) as admin:
        await admin.alter_partition_reassignments({("a", 0): [2, 3], ("a", 1): None})
        await admin.alter_partition_reassignments({})  # nothing to send
    assert len(tiny.requests) == 1
    assert tiny.requests[0][1]["partitions"] == [["a", 0, [2, 3]], ["a", 1, None]]


async def test_alter_reassignments_raises_per_partition_errors(tiny: TinyController) -> None:
    async with admin_for(tiny) as admin:
        with pytest.raises(AdminError) as info:
            await admin.alter_partition_reassignments({("a", 0): [2, 3], ("b", 0): [4, 1]})
    assert list(info.value.errors) == ["b-0"]
    assert isinstance(info.value.errors["b-0"], InvalidReplicaAssignmentError)


async def test_list_reassignments_derives_state_from_metadata(tiny: TinyController) -> None:
    tiny.parts[("b", 0)] = [1, [1, 2, 4, 3], [1, 2, 3]]  # target 1,2,4 + removing 3
    async with admin_for(tiny) as admin:
        statuses = await admin.list_partition_reassignments(
            {("a", 0): [1, 2], ("b", 0): [1, 2, 4], ("a", 1): [3, 1]}
        )
        with pytest.raises(AdminError):
            await admin.list_partition_reassignments({("a", 9): [1]})
    done, running, absent = statuses
    assert done.state == REASSIGNMENT_COMPLETE
    assert running.state == REASSIGNMENT_IN_PROGRESS
    assert (running.adding, running.removing) == ((4,), (3,))
    assert absent.state == REASSIGNMENT_ABSENT and absent.adding == absent.removing == ()


def test_reassignment_status_once_new_replica_is_in_sync() -> None:
    s = ReassignmentStatus("t", 0, (1, 2, 4), (1, 2, 4, 3), (1, 2, 3, 4), 1)
    assert s.state == REASSIGNMENT_IN_PROGRESS
    assert s.adding == () and s.removing == (3,)
    assert s.as_dict()["state"] == "in_progress"


# --- CLI pieces ------------------------------------------------------------------------


def test_summarize_election_splits_the_three_outcomes() -> None:
    from rillet.client.admin import PartitionResult

    summary = summarize_election(
        [
            PartitionResult("t", 0),
            PartitionResult("t", 1, ElectionNotNeededError()),
            PartitionResult("t", 2, PreferredLeaderNotAvailableError("broker 3 is fenced")),
        ]
    )
    assert summary["elected"] == ["t-0"] and summary["not_needed"] == ["t-1"]
    assert [(f["partition"], f["error"]) for f in summary["failed"]] == [
        (2, "PREFERRED_LEADER_NOT_AVAILABLE")
    ]


def test_plan_parsing_accepts_kafkas_json_and_refuses_bad_plans() -> None:
    plan = parse_plan(
        {
            "version": 1,
            "partitions": [
                {"topic": "t", "partition": 0, "replicas": [1, 2, 4]},
                {"topic": "u", "partition": 3, "replicas": [2]},
            ],
        }
    )
    assert plan == {("t", 0): [1, 2, 4], ("u", 3): [2]}
    assert parse_plan(plan_json(plan)) == plan  # the rollback output reads back
    for bad in (
        {},
        {"partitions": []},
        {"partitions": [{"topic": "t"}]},
        {"partitions": [{"topic": "t", "partition": 0, "replicas": [1]}] * 2},
    ):
        with pytest.raises(CliError):
            parse_plan(bad)
    assert parse_replicas("1, 2,4") == [1, 2, 4]
    with pytest.raises(CliError):
        parse_replicas("1,x")


def test_plan_from_args_forms(tmp_path) -> None:  # noqa: ANN001
    def ns(**kw: Any) -> argparse.Namespace:
        base = {"plan": None, "topic": None, "partition": None, "replicas": None}
        return argparse.Namespace(**{**base, **kw})

    assert plan_from_args(ns(topic="t", partition=1, replicas="3,1"), need_replicas=True) == {
        ("t", 1): [3, 1]
    }
    assert plan_from_args(ns(topic="t", partition=1), need_replicas=False) == {("t", 1): []}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"partitions": [{"topic": "t", "partition": 0, "replicas": [2]}]}))
    assert plan_from_args(ns(plan=str(path)), need_replicas=True) == {("t", 0): [2]}
    with pytest.raises(CliError):
        plan_from_args(ns(topic="t", partition=1), need_replicas=True)
    with pytest.raises(CliError):
        plan_from_args(ns(plan=str(path), topic="t"), need_replicas=True)
    with pytest.raises(CliError):
        plan_from_args(ns(plan=str(tmp_path / "missing.json")), need_replicas=True)


def _part(p: int, leader: int, replicas: list[int], isr: list[int]) -> dict[str, Any]:
    return {
        "partition": p,
        "leader": leader,
        "replicas": replicas,
        "isr": isr,
        "under_replicated": len(isr) < len(replicas),
        "offline": leader < 0,
    }


def test_describe_filters_and_counts() -> None:
    topics = [
        {"name": "a", "partitions": [_part(0, 1, [1, 2], [1, 2]), _part(1, 2, [2, 3], [2])]},
        {"name": "b", "partitions": [_part(0, -1, [3], [3])]},
        {"name": "c", "partitions": [_part(0, 1, [1], [1])]},
    ]
    assert partition_counts(topics) == {
        "partition_count": 4,
        "under_replicated_partitions": 1,
        "offline_partitions": 1,
    }
    assert filter_partitions(topics, False, False) is topics
    under = filter_partitions(topics, True, False)
    assert [(t["name"], [p["partition"] for p in t["partitions"]]) for t in under] == [("a", [1])]
    either = filter_partitions(topics, True, True)
    assert [t["name"] for t in either] == ["a", "b"]


def test_cluster_partition_summary_counts_from_metadata() -> None:
    P = m.MetadataPartition
    metadata = m.MetadataResponse(
        cluster_id="c",
        controller_id=101,
        brokers=[],
        topics=[
            m.MetadataTopic(
                0,
                "a",
                False,
                [P(0, 0, 1, 0, [1, 2, 3], [1, 2, 3], []), P(0, 1, 2, 0, [2, 3, 1], [2, 1], [3])],
            ),
            m.MetadataTopic(0, "b", False, [P(5, 0, -1, 3, [3], [3], [3])]),  # leaderless
        ],
    )
    assert summarize_partitions(metadata) == {
        "controller_id": 101,
        "partitions": 3,
        "under_replicated": 1,
        "offline": 1,
    }
