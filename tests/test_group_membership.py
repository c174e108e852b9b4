"""The client's membership state machine alone (client/group_membership.py): what it
sends, when, and how it moves partitions; the co-simulation against the coordinator
core is tests/test_group_client_sim.py."""

from __future__ import annotations

from rillet.client.group_membership import (
    Assign,
    Effect,
    Fatal,
    GroupMembership,
    HeartbeatRequest,
    HeartbeatResult,
    Lose,
    MembershipConfig,
    Revoke,
    SendHeartbeat,
    State,
)
from rillet.client.wire import errors

NAMES = {"ID-a": "a", "ID-b": "b"}


def member(**kwargs: object) -> GroupMembership:
    m = GroupMembership(
        MembershipConfig("g", "m1", session_timeout_ms=3_000, rebalance_timeout_ms=10_000, **kwargs)  # type: ignore[arg-type]
    )
    m.names = dict(NAMES)
    return m


def heartbeats(effects: list[Effect]) -> list[HeartbeatRequest]:
    return [e.request for e in effects if isinstance(e, SendHeartbeat)]


def ok(epoch: int, assignment: dict[str, set[int]] | None, interval: int = 500) -> HeartbeatResult:
    parts = None if assignment is None else {t: frozenset(ps) for t, ps in assignment.items()}
    return HeartbeatResult(errors.NONE, epoch, interval, parts)


def joined(assignment: dict[str, set[int]], epoch: int = 5) -> GroupMembership:
    """A member that joined, assigned ``assignment`` and acknowledged it."""
    m = member()
    m.subscribe(["a", "b"], 0)
    effects = m.on_heartbeat_response(ok(epoch, assignment), 10)
    (assign,) = [e for e in effects if isinstance(e, Assign)]
    effects = m.assign_done(assign.seq, 20)
    (ack,) = heartbeats(effects)
    m.on_heartbeat_response(ok(epoch, assignment), 30)
    return m


def test_join_sends_every_field_with_epoch_zero_then_only_what_changed() -> None:
    m = member(instance_id="i1", rack="r1", server_assignor="range")
    (join,) = heartbeats(m.subscribe(["b", "a"], 0))
    assert join == HeartbeatRequest("m1", 0, "i1", "r1", 10_000, ("a", "b"), "range", owned={})
    assert m.state is State.JOINING
    assert m.on_heartbeat_response(ok(3, {}), 5) == []
    (hb,) = heartbeats(m.poll(505))  # the interval from the answer
    assert hb == HeartbeatRequest("m1", 3, owned={})
    assert heartbeats(m.poll(600)) == []  # one heartbeat in flight at a time


def test_assignment_is_fetched_then_acknowledged_at_once() -> None:
    m = member()
    m.subscribe(["a"], 0)
    effects = m.on_heartbeat_response(ok(2, {"ID-a": {0, 1}}), 10)
    assert effects == [Assign(effects[0].seq, frozenset({("a", 0), ("a", 1)}))]  # type: ignore[union-attr]
    assert m.state is State.RECONCILING
    assert heartbeats(m.poll(11)) == []  # the interval has not passed
    (ack,) = heartbeats(m.assign_done(effects[0].seq, 50))  # type: ignore[union-attr]
    assert ack.member_epoch == 2 and ack.owned == {"ID-a": frozenset({0, 1})}
    assert m.state is State.STABLE and m.owned_names() == {("a", 0), ("a", 1)}


def test_revocation_comes_before_new_partitions() -> None:
    m = joined({"ID-a": {0, 1}})
    (hb,) = heartbeats(m.poll(600))
    # The coordinator moves a-1 away and adds b-0: a-1 is revoked first.
    effects = m.on_heartbeat_response(ok(6, {"ID-a": {0}, "ID-b": {0}}), 600)
    (revoke,) = [e for e in effects if isinstance(e, (Revoke, Assign))]
    assert revoke == Revoke(revoke.seq, frozenset({("a", 1)}))
    assert m.owns(("a", 1))  # until the revocation is done
    effects = m.revoke_done(revoke.seq, 610)
    (assign,) = [e for e in effects if isinstance(e, Assign)]
    assert assign.partitions == {("b", 0)} and not m.owns(("a", 1))
    (ack,) = heartbeats(m.assign_done(assign.seq, 620))
    assert ack.owned == {"ID-a": frozenset({0}), "ID-b": frozenset({0})}


def test_kept_partitions_are_never_revoked() -> None:
    m = joined({"ID-a": {0, 1, 2}})
    (hb,) = heartbeats(m.poll(600))
    effects = m.on_heartbeat_response(ok(6, {"ID-a": {0, 1, 2, 3}}), 600)
    assert not any(isinstance(e, Revoke) for e in effects)
    assert [e.partitions for e in effects if isinstance(e, Assign)] == [{("a", 3)}]


def test_a_topic_id_without_a_name_waits_for_metadata() -> None:
    m = member()
    m.subscribe(["a", "c"], 0)
    effects = m.on_heartbeat_response(ok(2, {"ID-a": {0}, "ID-c": {0}}), 10)
    (assign,) = [e for e in effects if isinstance(e, Assign)]
    assert assign.partitions == {("a", 0)} and m.unresolved_topics == {"ID-c"}
    m.assign_done(assign.seq, 20)
    effects = m.on_metadata({**NAMES, "ID-c": "c"}, 30)
    assert [e.partitions for e in effects if isinstance(e, Assign)] == [{("c", 0)}]


def test_fenced_loses_everything_and_rejoins_with_the_same_member_id() -> None:
    m = joined({"ID-a": {0}})
    (hb,) = heartbeats(m.poll(600))
    fenced = HeartbeatResult(errors.code_of("FENCED_MEMBER_EPOCH"))
    effects = m.on_heartbeat_response(fenced, 610)
    assert effects[0] == Lose(frozenset({("a", 0)}))
    (join,) = heartbeats(effects)
    assert (join.member_id, join.member_epoch, join.owned) == ("m1", 0, {})
    assert join.subscribed_topics == ("a", "b")  # every field again


def test_partitions_are_lost_once_a_session_passes_without_an_answer() -> None:
    m = joined({"ID-a": {0}})
    # The last answered heartbeat was sent at 20 (the acknowledgement): the coordinator
    # may drop us 3 s after it accepted that, which was no earlier than it was sent.
    (hb,) = heartbeats(m.poll(600))
    m.on_heartbeat_failed(900)
    assert m.lease_deadline_ms() == 3_020
    assert not any(isinstance(e, Lose) for e in m.poll(3_019))
    effects = m.poll(3_020)
    assert Lose(frozenset({("a", 0)})) in effects and m.state is State.JOINING


def test_an_answer_to_a_heartbeat_sent_before_a_loss_is_ignored() -> None:
    m = joined({"ID-a": {0}})
    (hb,) = heartbeats(m.poll(600))
    assert Lose(frozenset({("a", 0)})) in m.poll(3_020)
    (join,) = heartbeats(m.on_heartbeat_response(ok(5, {"ID-a": {0}}), 3_030))
    assert join.member_epoch == 0
    assert m.member_epoch == 0 and not m.owned


def test_a_failed_heartbeat_is_retried_with_every_field() -> None:
    m = joined({"ID-a": {0}})
    (hb,) = heartbeats(m.poll(600))
    assert hb.subscribed_topics is None
    (again,) = heartbeats(m.on_heartbeat_failed(700) + m.poll(800))
    assert again.subscribed_topics == ("a", "b") and again.member_epoch == 5


def test_a_revocation_not_acknowledged_within_the_rebalance_timeout_is_a_loss() -> None:
    m = joined({"ID-a": {0, 1}})
    (hb,) = heartbeats(m.poll(600))
    effects = m.on_heartbeat_response(ok(5, {"ID-a": {0}}), 650)
    (revoke,) = [e for e in effects if isinstance(e, Revoke)]
    # The listener hangs. The coordinator may have asked for the revocation in answer
    # to any request after the last one whose answer showed nothing pending (the
    # acknowledgement sent at 20), and drops us 10 s after: we must stop first, even
    # while heartbeats are answered.
    for t in range(1_100, 10_000, 500):
        for _ in heartbeats(m.poll(t)):
            m.on_heartbeat_response(ok(5, {"ID-a": {0}}), t + 5)
    assert m.owns(("a", 1)) and m.lease_deadline_ms() == 10_020
    assert Lose(frozenset({("a", 0), ("a", 1)})) in m.poll(10_020)


def test_leave_revokes_then_heartbeats_minus_one() -> None:
    m = joined({"ID-a": {0}})
    (revoke,) = m.leave(600)
    assert isinstance(revoke, Revoke) and revoke.partitions == {("a", 0)}
    (leave,) = heartbeats(m.revoke_done(revoke.seq, 610))
    assert (leave.member_id, leave.member_epoch) == ("m1", -1)
    m.on_heartbeat_response(ok(-1, None), 620)
    assert m.state is State.UNSUBSCRIBED


def test_a_static_member_leaves_with_minus_two() -> None:
    m = GroupMembership(MembershipConfig("g", "m1", instance_id="i1"))
    m.subscribe(["a"], 0)
    m.on_heartbeat_response(ok(1, {}), 5)
    (leave,) = heartbeats(m.leave(10))
    assert (leave.member_epoch, leave.instance_id) == (-2, "i1")


def test_an_instance_id_still_held_is_retried_and_a_fenced_one_is_fatal() -> None:
    m = member(instance_id="i1")
    m.subscribe(["a"], 0)
    held = HeartbeatResult(errors.code_of("UNRELEASED_INSTANCE_ID"))
    assert m.on_heartbeat_response(held, 5) == [] and m.state is State.JOINING
    (retry,) = heartbeats(m.poll(105))
    assert retry.member_epoch == 0
    fenced = HeartbeatResult(errors.code_of("FENCED_INSTANCE_ID"))
    (fatal,) = m.on_heartbeat_response(fenced, 110)
    assert isinstance(fatal, Fatal) and m.state is State.FATAL
    assert heartbeats(m.poll(10_000)) == []
