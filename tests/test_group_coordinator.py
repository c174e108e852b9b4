"""The KIP-848 group coordinator core: joins, leaves, incremental moves with
revoke-before-assign, fencing, static membership, timers and commit epoch checks."""

from __future__ import annotations

from sim.group_cluster import group_state

from rillet.broker.group.assignors import TopicSpec
from rillet.broker.group.coordinator import (
    FENCED_INSTANCE_ID,
    FENCED_MEMBER_EPOCH,
    INVALID_REQUEST,
    NONE,
    STALE_MEMBER_EPOCH,
    UNKNOWN_MEMBER_ID,
    UNRELEASED_INSTANCE_ID,
    UNSUPPORTED_ASSIGNOR,
    CurrentAssignmentRecord,
    GroupConfig,
    GroupCoordinator,
    GroupMetadataRecord,
    GroupState,
    Heartbeat,
    HeartbeatResponse,
    MemberRemovedRecord,
    MemberState,
    OffsetCommit,
    OffsetCommitRecord,
    OffsetCommitResponse,
    Step,
)

SESSION = 10_000
TOPICS = {"t": TopicSpec("T", 4)}


def coordinator() -> GroupCoordinator:
    g = GroupCoordinator("g", GroupConfig(session_timeout_ms=SESSION))
    g.update_topics(TOPICS)
    return g


def beat(
    g: GroupCoordinator,
    member_id: str,
    epoch: int,
    now: int = 0,
    owned: dict[str, set[int]] | None = None,
    **kw,
) -> HeartbeatResponse:
    if epoch == 0 and "subscribed_topics" not in kw:
        kw["subscribed_topics"] = frozenset({"t"})
    frozen = None if owned is None else {t: frozenset(p) for t, p in owned.items()}
    step = g.heartbeat(Heartbeat(member_id, epoch, owned=frozen, **kw), now)
    assert isinstance(step.response, HeartbeatResponse)
    return step.response


def parts(resp: HeartbeatResponse) -> set[int]:
    assert resp.assignment is not None
    return set(resp.assignment.get("T", ()))


def assert_single_owners(g: GroupCoordinator) -> None:
    for p in range(TOPICS["t"].partitions):
        assert len(g.owner_of("T", p)) <= 1


def test_first_member_joins_and_gets_every_partition() -> None:
    g = coordinator()
    step = g.heartbeat(Heartbeat("m1", 0, subscribed_topics=frozenset({"t"})), 0)
    resp = step.response
    assert isinstance(resp, HeartbeatResponse)
    assert (resp.error_code, resp.member_epoch) == (NONE, 1)
    assert parts(resp) == {0, 1, 2, 3}
    assert GroupMetadataRecord("g", 1) in step.records
    assert g.state is GroupState.STABLE


def test_a_second_member_gets_partitions_only_after_the_first_revokes() -> None:
    g = coordinator()
    beat(g, "m1", 0)
    r2 = beat(g, "m2", 0)
    # The target gives m2 two partitions, but m1 still owns them: m2 waits at epoch 2.
    assert (r2.member_epoch, parts(r2)) == (2, set())
    assert g.members["m2"].state is MemberState.UNRELEASED_PARTITIONS
    assert_single_owners(g)

    r1 = beat(g, "m1", 1)
    kept = parts(r1)
    assert len(kept) == 2 and r1.member_epoch == 1  # epoch holds until it revokes
    assert g.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    assert g.state is GroupState.RECONCILING

    assert parts(beat(g, "m2", 2)) == set()  # not released yet
    r1 = beat(g, "m1", 1, owned={"T": kept})
    assert (r1.member_epoch, parts(r1)) == (2, kept)
    r2 = beat(g, "m2", 2)
    assert parts(r2) == {0, 1, 2, 3} - kept
    assert g.state is GroupState.STABLE
    assert_single_owners(g)


def test_a_member_that_does_not_report_the_revocation_keeps_its_old_epoch() -> None:
    g = coordinator()
    beat(g, "m1", 0)
    beat(g, "m2", 0)
    beat(g, "m1", 1)
    still = {0, 1, 2, 3}
    r1 = beat(g, "m1", 1, owned={"T": still})
    assert r1.member_epoch == 1
    assert g.members["m1"].pending_revocation


def test_leave_releases_partitions_and_bumps_the_epoch() -> None:
    g = coordinator()
    beat(g, "m1", 0)
    beat(g, "m2", 0)
    beat(g, "m1", 1)
    beat(g, "m1", 1, owned={"T": set(g.members["m1"].assigned["T"])})
    beat(g, "m2", 2)
    step = g.heartbeat(Heartbeat("m2", -1), 0)
    assert isinstance(step.response, HeartbeatResponse)
    assert step.response.member_epoch == -1
    assert MemberRemovedRecord("g", "m2") in step.records
    assert g.group_epoch == 3
    r1 = beat(g, "m1", 2)
    assert (r1.member_epoch, parts(r1)) == (3, {0, 1, 2, 3})


def test_fenced_and_unknown_members() -> None:
    g = coordinator()
    beat(g, "m1", 0)
    assert beat(g, "m1", 7).error_code == FENCED_MEMBER_EPOCH
    assert beat(g, "nobody", 1).error_code == UNKNOWN_MEMBER_ID
    assert beat(g, "", 0).error_code == INVALID_REQUEST
    assert beat(g, "m3", 0, server_assignor="nope").error_code == UNSUPPORTED_ASSIGNOR
    # A fenced member rejoins with epoch 0: what it held is released and reassigned.
    r = beat(g, "m1", 0)
    assert r.error_code == NONE and r.member_epoch == g.group_epoch and parts(r) == {0, 1, 2, 3}


def test_a_lost_response_is_tolerated_at_the_previous_epoch() -> None:
    g = coordinator()
    beat(g, "m1", 0)
    beat(g, "m2", 0)
    beat(g, "m1", 1)
    kept = set(g.members["m1"].assigned["T"])
    beat(g, "m1", 1, owned={"T": kept})  # moves m1 to epoch 2; say the answer is lost
    r = beat(g, "m1", 1, owned={"T": kept})
    assert (r.error_code, r.member_epoch) == (NONE, 2)
    # Owning more than it was given at the previous epoch is not a lost response.
    assert beat(g, "m1", 1, owned={"T": {0, 1, 2, 3}}).error_code == FENCED_MEMBER_EPOCH


def test_session_timeout_removes_a_silent_member() -> None:
    g = coordinator()
    beat(g, "m1", 0, now=0)
    beat(g, "m2", 0, now=0)
    assert g.tick(SESSION - 1) == Step()
    beat(g, "m2", 2, now=SESSION - 1)  # m2 stays alive, m1 goes silent
    step = g.tick(SESSION)
    assert MemberRemovedRecord("g", "m1") in step.records
    assert list(g.members) == ["m2"]
    assert parts(beat(g, "m2", 2, now=SESSION)) == {0, 1, 2, 3}


def test_rebalance_timeout_removes_a_member_that_does_not_revoke() -> None:
    g = coordinator()
    beat(g, "m1", 0, rebalance_timeout_ms=500)
    beat(g, "m2", 0)
    beat(g, "m1", 1, now=100)  # asked to revoke at 100: deadline 600
    assert g.tick(599).records == ()
    beat(g, "m2", 2, now=599)
    step = g.tick(600)
    assert MemberRemovedRecord("g", "m1") in step.records
    assert parts(beat(g, "m2", 2, now=600)) == {0, 1, 2, 3}


def test_static_member_rejoins_within_the_session_without_a_rebalance() -> None:
    g = coordinator()
    beat(g, "a1", 0, instance_id="i")
    beat(g, "b", 0)
    beat(g, "a1", 1, instance_id="i")
    kept = set(g.members["a1"].assigned["T"])
    beat(g, "a1", 1, instance_id="i", owned={"T": kept})
    beat(g, "b", 2)
    epoch = g.group_epoch

    g.heartbeat(Heartbeat("a1", -2, instance_id="i"), 1_000)
    # Its partitions stay reserved: nobody else gets them meanwhile.
    assert parts(beat(g, "b", 2, now=1_000)) == {0, 1, 2, 3} - kept
    r = beat(g, "a2", 0, now=2_000, instance_id="i")
    assert (r.error_code, r.member_epoch, parts(r)) == (NONE, 2, kept)
    assert g.group_epoch == epoch
    assert "a1" not in g.members
    # The old member id is gone, and another process cannot use the instance id.
    assert beat(g, "a1", 2).error_code == UNKNOWN_MEMBER_ID
    assert beat(g, "a3", 0, instance_id="i").error_code == UNRELEASED_INSTANCE_ID
    assert beat(g, "b", 2, instance_id="i").error_code == FENCED_INSTANCE_ID


def test_static_member_that_stays_away_past_the_session_is_removed() -> None:
    g = coordinator()
    beat(g, "a1", 0, instance_id="i")
    g.heartbeat(Heartbeat("a1", -2, instance_id="i"), 0)
    step = g.tick(SESSION)
    assert MemberRemovedRecord("g", "a1") in step.records
    r = beat(g, "a2", 0, now=SESSION, instance_id="i")
    assert r.member_epoch == g.group_epoch == 3


def test_subscription_change_and_new_partitions_bump_the_epoch() -> None:
    g = coordinator()
    beat(g, "m1", 0)
    assert beat(g, "m1", 1, subscribed_topics=frozenset({"t"})).member_epoch == 1
    g.update_topics({"t": TopicSpec("T", 6)})
    r = beat(g, "m1", 1)
    assert (r.member_epoch, parts(r)) == (2, set(range(6)))
    g.update_topics({"t": TopicSpec("T", 6), "u": TopicSpec("U", 2)})  # not subscribed
    assert g.group_epoch == 2
    r = beat(g, "m1", 2, subscribed_topics=frozenset({"u"}))
    assert r.member_epoch == 2 and parts(r) == set()  # revoke T first
    r = beat(g, "m1", 2, owned={})
    assert r.member_epoch == 3 and r.assignment == {"U": frozenset({0, 1})}


def commit(g: GroupCoordinator, member_id: str, epoch: int, offset: int = 5) -> Step:
    return g.commit_offset(OffsetCommit(member_id, epoch, "t", 0, offset), 42)


def code(step: Step) -> int:
    assert isinstance(step.response, OffsetCommitResponse)
    return step.response.error_code


def test_offset_commits_are_checked_against_the_member_epoch() -> None:
    g = coordinator()
    assert code(commit(g, "", -1)) == NONE  # no members: an admin commit is allowed
    beat(g, "m1", 0)
    beat(g, "m2", 0)
    beat(g, "m1", 1)
    beat(g, "m1", 1, owned={"T": set(g.members["m1"].assigned["T"])})  # m1 now at 2
    ok = commit(g, "m1", 2)
    assert code(ok) == NONE
    assert ok.records == (OffsetCommitRecord("g", "t", 0, 5, "", 42),)
    assert code(commit(g, "m1", 1)) == STALE_MEMBER_EPOCH
    assert code(commit(g, "m1", 3)) == FENCED_MEMBER_EPOCH
    assert code(commit(g, "zz", 2)) == UNKNOWN_MEMBER_ID
    assert code(commit(g, "", -1)) == UNKNOWN_MEMBER_ID  # members consume: refused
    assert g.offsets[("t", 0)].offset == 5


def test_current_assignment_records_follow_reconciliation() -> None:
    g = coordinator()
    beat(g, "m1", 0)
    beat(g, "m2", 0)
    step = g.heartbeat(Heartbeat("m1", 1), 0)
    current = [r for r in step.records if isinstance(r, CurrentAssignmentRecord)]
    assert len(current) == 1
    rec = current[0]
    assert rec.state is MemberState.UNREVOKED_PARTITIONS
    assert (rec.member_epoch, rec.previous_member_epoch) == (1, 0)
    assert len(rec.pending_revocation["T"]) == 2
    # An unchanged heartbeat writes nothing.
    assert g.heartbeat(Heartbeat("m1", 1), 0).records == ()


def test_a_new_coordinator_loads_the_group_from_its_records() -> None:
    g = coordinator()
    records = []
    for req in [
        Heartbeat("m1", 0, subscribed_topics=frozenset({"t"}), instance_id="i"),
        Heartbeat("m2", 0, subscribed_topics=frozenset({"t"})),
        Heartbeat("m1", 1, instance_id="i"),
    ]:
        records += g.heartbeat(req, 0).records
    records += commit(g, "m2", 2).records
    loaded = GroupCoordinator.load("g", records, TOPICS, 5_000, g.config)
    assert loaded.group_epoch == g.group_epoch == 2
    assert loaded.target == g.target and loaded.offsets == g.offsets
    assert loaded.static_members == {"i": "m1"}
    m1 = loaded.members["m1"]
    assert m1.state is MemberState.UNREVOKED_PARTITIONS and m1.pending_revocation
    # Timers restart at load: m1 gets a full session and rebalance timeout from now.
    assert m1.session_deadline_ms == 5_000 + SESSION
    assert m1.rebalance_deadline_ms == 5_000 + m1.rebalance_timeout_ms
    # Reconciliation goes on where it stopped: m1 revokes and m2 gets what it released.
    kept = set(m1.assigned["T"])
    assert beat(loaded, "m1", 1, now=5_000, owned={"T": kept}).member_epoch == 2
    assert parts(beat(loaded, "m2", 2, now=5_000)) == {0, 1, 2, 3} - kept


def test_a_refused_rejoin_changes_nothing() -> None:
    # Validation comes before any change: a refused request writes no record, so it
    # must leave no change that a loaded coordinator would not see.
    g = coordinator()
    beat(g, "m1", 0, instance_id="i")
    beat(g, "m2", 0)
    epoch = g.group_epoch
    step = g.heartbeat(Heartbeat("m2", 0, subscribed_topics=frozenset({"t"}), instance_id="i"), 0)
    assert isinstance(step.response, HeartbeatResponse)
    assert step.response.error_code == UNRELEASED_INSTANCE_ID and step.records == ()
    assert "m2" in g.members and g.group_epoch == epoch
    assert beat(g, "m2", 0, subscribed_topics=None).error_code == INVALID_REQUEST
    assert "m2" in g.members and g.group_epoch == epoch


def test_the_group_uses_the_assignor_its_members_ask_for() -> None:
    g = coordinator()
    g.update_topics({"t": TopicSpec("T", 5)})
    beat(g, "m2", 0, server_assignor="range")
    beat(g, "m1", 0, server_assignor="range")
    assert g.target == {"m1": {"T": frozenset({0, 1, 2})}, "m2": {"T": frozenset({3, 4})}}


def test_only_an_empty_group_is_deleted_and_its_offsets_go_with_it() -> None:
    from rillet.broker.group.coordinator import (
        NON_EMPTY_GROUP,
        DeleteGroupResponse,
        GroupDeletedRecord,
        OffsetDeletedRecord,
    )

    g = coordinator()
    beat(g, "m1", 0)
    commit(g, "m1", 1)
    refused = g.delete_group()
    assert refused == Step((), DeleteGroupResponse(NON_EMPTY_GROUP))
    log = [*g.heartbeat(Heartbeat("m1", -1), 0).records]
    step = g.delete_group()
    assert step.response == DeleteGroupResponse(NONE)
    assert step.records == (OffsetDeletedRecord("g", "t", 0), GroupDeletedRecord("g"))
    assert g.offsets == {} and g.group_epoch == 0 and g.is_deleted
    # A group of the same id starts afresh, and its records replay over the old ones.
    again = beat(g, "m9", 0)
    assert again.member_epoch == 1
    log += step.records
    assert GroupCoordinator.load("g", log, TOPICS, 0).is_deleted


def test_offsets_of_a_subscribed_topic_are_not_deleted() -> None:
    from rillet.broker.group.coordinator import (
        GROUP_SUBSCRIBED_TO_TOPIC,
        OffsetDeletedRecord,
        OffsetDeleteResponse,
    )

    g = coordinator()
    assert code(g.commit_offset(OffsetCommit("", -1, "u", 1, 7), 0)) == NONE
    beat(g, "m1", 0)  # subscribes to t
    commit(g, "m1", 1)
    step = g.delete_offsets([("t", 0), ("u", 1), ("u", 2)])
    assert step.response == OffsetDeleteResponse(
        {("t", 0): GROUP_SUBSCRIBED_TO_TOPIC, ("u", 1): NONE, ("u", 2): NONE}
    )
    assert step.records == (OffsetDeletedRecord("g", "u", 1),)  # u-2 had none
    assert set(g.offsets) == {("t", 0)}


def test_restoring_a_copy_undoes_an_event_but_not_a_members_session() -> None:
    # What the driver does when an event's records cannot be written: the group goes
    # back to the copy, except that a member that heartbeated is still alive.
    g = coordinator()
    beat(g, "m1", 0)
    commit(g, "m1", 1)
    before = g.copy()
    state = group_state(g)
    a = beat(g, "m1", 1, now=5_000, subscribed_topics=frozenset({"t", "u"}))
    assert a.error_code == 0 and g.group_epoch == 2
    beat(g, "m2", 0, now=5_000)
    commit(g, "m1", 1, offset=9)
    g.restore(before)
    assert group_state(g) == state
    assert g.members["m1"].session_deadline_ms == 5_000 + SESSION
    assert not g.tick(SESSION).records  # m1's session was not cut short by the undo
