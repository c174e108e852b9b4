"""Limits a controller enforces before anything reaches the Raft log: max.partitions,
max.broker.partitions, bounded broker registrations, and the size of one metadata record
and of one operation (docs/controller.md, "Limits").

A request for a few million partitions once planned them all and then failed, fatally,
inside the Raft store; a client's retry took down the next leader. These tests pin that
such requests are refused as a whole, cheaply, with a non-retriable error, and that an
operation that cannot be written whole leaves nothing in the log.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_controller_state_machine import Quorum, register
from test_quorum_controller import Cluster

from rillet.client.admin import Admin, NewTopic
from rillet.client.wire.errors import PolicyViolationError, code_of
from rillet.controller.metadata.image import Config, RegisterBroker
from rillet.controller.metadata.quorum import CreatableTopic
from rillet.controller.state_machine import EntryLimits, split_records

E = code_of


def test_a_request_past_max_partitions_is_refused_whole_before_any_placement() -> None:
    c = Cluster(max_partitions=1000)
    assert c.create("existing", 400).error_code == 0
    # Thirty topics of 100,000 partitions: refused from a sum, nothing planned at all.
    huge = [CreatableTopic(f"t{i}", 100_000, 3) for i in range(30)]
    with pytest.raises(PolicyViolationError, match="max.partitions is 1,000"):
        c.ctl.create_topics(c.image, huge)
    # 400 held + 601 asked passes the limit: every topic of the request is refused.
    with pytest.raises(PolicyViolationError, match="1,001"):
        c.ctl.create_topics(c.image, [CreatableTopic("a", 300, 3), CreatableTopic("b", 301, 3)])
    with pytest.raises(PolicyViolationError):  # validate_only says so too
        c.ctl.create_topics(c.image, [CreatableTopic("a", 601, 3)], validate_only=True)
    assert c.create("fits", 600).error_code == 0  # exactly the limit


def test_partitions_of_a_topic_still_being_built_count_towards_max_partitions() -> None:
    c = Cluster(max_partitions=100)
    records, _ = c.ctl.create_topics(c.image, [CreatableTopic("big", 80, 3)])
    # Only the Topic record and part of its partitions are in: the topic is building.
    c.run((records[:10], None))
    assert c.image.building_topics
    with pytest.raises(PolicyViolationError):
        c.ctl.create_topics(c.image, [CreatableTopic("more", 30, 3)])


def test_max_broker_partitions_refuses_a_topic_whose_placement_overfills_a_broker() -> None:
    c = Cluster(max_broker_partitions=10)
    assert c.create("a", 8).error_code == 0  # 8 replicas on each of the 3 brokers
    result = c.create("b", 3)  # 11 on each
    assert result.error_code == E("POLICY_VIOLATION"), result
    assert "max.broker.partitions is 10" in result.error_message
    assert c.last_records == []
    assert c.create("c", 2).error_code == 0  # 10 on each: at the limit
    # Replication factor 1 spreads the replicas: no broker has room for one more.
    assert c.create("d", 1, rf=1).error_code == E("POLICY_VIOLATION")


def test_topics_of_one_request_count_together_against_max_broker_partitions() -> None:
    c = Cluster(max_broker_partitions=10)
    on_1 = {p: [1] for p in range(6)}
    _, results = c.ctl.create_topics(
        c.image, [CreatableTopic("x", assignments=on_1), CreatableTopic("y", assignments=on_1)]
    )
    assert [r.error_code for r in results] == [0, E("POLICY_VIOLATION")]
    assert "broker 1 would hold 12 replicas" in results[1].error_message
    # Far more replicas than the live brokers can take: refused whole, before placing.
    with pytest.raises(PolicyViolationError, match="live broker"):
        c.ctl.create_topics(c.image, [CreatableTopic("z", 11, 3)])


def test_manual_assignments_count_against_the_limits() -> None:
    c = Cluster(max_broker_partitions=2)
    assert c.create("a", assignments={0: [1], 1: [1]}).error_code == 0
    result = c.create("b", assignments={0: [1, 2]})
    assert result.error_code == E("POLICY_VIOLATION") and "broker 1" in result.error_message


@pytest.mark.parametrize(
    "field",
    ["rack", "incarnation", "host", "listener", "endpoints"],
)
def test_a_registration_with_oversized_fields_is_refused_without_records(field: str) -> None:
    c = Cluster()
    big = "x" * 2_000_000
    args = {
        "incarnation": "inc-9",
        "endpoints": [("PLAINTEXT", "h", 9009)],
        "rack": None,
    }
    if field == "rack":
        args["rack"] = big
    elif field == "incarnation":
        args["incarnation"] = big
    elif field == "host":
        args["endpoints"] = [("PLAINTEXT", big, 9009)]
    elif field == "listener":
        args["endpoints"] = [(big, "h", 9009)]
    else:
        args["endpoints"] = [("PLAINTEXT", "h", p) for p in range(100_000)]
    records, resp = c.ctl.register_broker(
        c.image, 9, args["incarnation"], args["endpoints"], args["rack"], c.now
    )
    assert records == [] and resp.error_code == E("INVALID_REQUEST"), resp
    assert len(resp.error_message) < 200  # names the field, does not echo it


def test_a_record_over_the_record_limit_is_refused_by_the_split() -> None:
    record = Config(2, "t", "k", "v" * 5000)
    with pytest.raises(PolicyViolationError, match="Config metadata record"):
        list(split_records([record], EntryLimits(max_bytes=1000, max_record_bytes=4096)))
    # Below the record limit, a record larger than an entry still goes, alone.
    ((part, _),) = list(split_records([record], EntryLimits(max_bytes=1000)))
    assert part == [record]


def test_an_operation_that_cannot_be_written_whole_leaves_nothing_in_the_log() -> None:
    """A record too large for the Raft store used to fail inside persist, which is
    fatal: on the leader, and on each follower that received the entry. Now the whole
    operation is encoded and checked before its first entry is proposed."""
    q = Quorum()
    q.elect(1)
    q.run(100)
    active = q.machines[1]
    last = q.nodes[1].log.last_index()
    good = register(active, 7)
    huge = RegisterBroker(8, "inc-8", 99, (), "r" * (2 * 1024 * 1024))
    with pytest.raises(PolicyViolationError):
        active.propose([*good, huge])  # the good record first: it must not go either
    assert q.nodes[1].log.last_index() == last and active.images.pending == active.image
    # More entries than Raft holds uncommitted: refused before the first is proposed.
    many = [Config(2, f"t{i}", "k", "v") for i in range(20)]
    active.entry_limits = EntryLimits(max_records=1)
    q.nodes[1].config = dataclasses.replace(q.nodes[1].config, max_uncommitted_entries=10)
    with pytest.raises(PolicyViolationError, match="20 metadata log entries"):
        active.propose(many)
    assert q.nodes[1].log.last_index() == last
    active.entry_limits = EntryLimits()
    active.propose(good)  # the controller goes on, still leading
    q.run(100)
    assert q.nodes[1].role.name == "LEADER"
    assert all(7 in m.image.brokers for m in q.machines.values())


async def test_the_admin_client_does_not_retry_a_policy_violation() -> None:
    """Each retry of the reported request took down one more controller: a refusal
    must reach the caller after one request."""
    admin = Admin("127.0.0.1:1", timeout_ms=60_000, retry_backoff_ms=1)
    sent: list[object] = []

    async def request_any(message: object, **_: object) -> object:
        sent.append(message)
        raise PolicyViolationError("max.partitions is 10")

    admin._meta.request_any = request_any  # type: ignore[method-assign]
    with pytest.raises(PolicyViolationError, match="max.partitions"):
        await admin.create_topics([NewTopic("t", 3_000_000, 3)])
    assert len(sent) == 1
    await admin.close()


@pytest.mark.parametrize("broker_id", [-1, -7, 2**31])
def test_a_registration_with_a_broker_id_outside_int32_or_negative_is_refused(
    broker_id: int,
) -> None:
    # -1 is NO_LEADER: a broker registered under it was placed, made leader, and its
    # partitions then read as leaderless everywhere.
    c = Cluster()
    records, resp = c.ctl.register_broker(
        c.image, broker_id, "inc-x", [("PLAINTEXT", "h", 9009)], None, c.now
    )
    assert records == [] and resp.error_code == E("INVALID_REQUEST"), resp
    assert "broker id" in resp.error_message


@pytest.mark.timeout(60)
def test_delete_topics_of_many_names_is_answered_in_linear_time() -> None:
    # The plan runs on the loop with every other write waiting: a duplicate check that
    # counted each name in the whole list took 4 s for 20,000 names and would take
    # about 15 minutes for these (a request of 2 MiB).
    c = Cluster()
    assert c.create("t", 3).error_code == 0
    names = [f"x{i}" for i in range(300_000)] + ["t", "t", "x5"]
    records, results = c.ctl.delete_topics(c.image, names)
    assert records == []
    assert len(results) == len(names)
    codes = {r.name: r.error_code for r in results}
    assert codes["t"] == codes["x5"] == E("INVALID_REQUEST")
    assert codes["x6"] == E("UNKNOWN_TOPIC_OR_PARTITION")


def test_elect_leaders_naming_a_topic_many_times_works_each_partition_once() -> None:
    # A request naming one topic N times made N records per partition (all planned on
    # the loop): a 100 KiB request against a topic of 10,000 partitions, a billion.
    c = Cluster()
    assert c.create("t", 6).error_code == 0
    c.heartbeat(1, fence=True)  # leadership leaves broker 1
    assert c.heartbeat(1).is_fenced is False
    for p in c.image.topic("t").partitions.values():  # broker 1 back in every ISR
        assert c.alter("t", (*c.p("t", p.partition).isr, 1), p.partition).error_code == 0
    moved = [p for p in c.image.topic("t").partitions.values() if p.leader != p.replicas[0]]
    assert moved
    records, results = c.ctl.elect_preferred_leaders(c.image, ["t"] * 1000)
    assert len(records) == len(moved)
    assert len(results) == 6


def test_manual_assignments_meet_the_per_topic_partition_limit_too() -> None:
    # Counts past it were refused; the same topic given as assignments was created.
    c = Cluster(max_partitions_per_topic=10)
    result = c.create("t", assignments={p: [1 + p % 3] for p in range(11)}, rf=1)
    assert result.error_code == E("INVALID_PARTITIONS"), result
    assert c.last_records == []
    assert c.create("u", assignments={p: [1 + p % 3] for p in range(10)}, rf=1).error_code == 0


@pytest.mark.timeout(60)
def test_the_name_collision_check_is_linear_in_topics_and_request() -> None:
    # Each new name with a '.' or '_' was compared with every topic of the cluster: for
    # these 40,000 against 40,000 minutes (on the loop for a request of
    # fewer than 1,000 partitions).
    c = Cluster()
    c.run(c.ctl.create_topics(c.image, [CreatableTopic(f"t.{i}", 1, 1) for i in range(40_000)]))
    asked = [CreatableTopic(f"u.{i}", 1, 1) for i in range(40_000)] + [CreatableTopic("t_7", 1, 1)]
    records, results = c.ctl.create_topics(c.image, asked, validate_only=True)
    assert [r.error_code for r in results].count(0) == 40_000
    assert results[-1].error_code == E("INVALID_TOPIC_EXCEPTION")
