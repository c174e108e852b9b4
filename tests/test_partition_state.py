"""Scenario tests for the partition replication core (broker/replication/partition_state.py).

Each test drives PartitionState objects over in-memory FakeLogs with explicit times,
the way a broker driver would, and names the Kafka behaviour it pins down.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_replication_fakes import FakeLog, Replica, batches_of

from rillet.broker.handlers.fetch import ListOffsetsHandler
from rillet.broker.replication.partition_state import PartitionState, Role
from rillet.broker.replication.types import (
    AlterPartitionResponse,
    AppendFetched,
    EpochEndOffset,
    FetchClock,
    FetchResponse,
    IncrementLogStartOffset,
    ListLeaderLocalStart,
    ProposeAlterPartition,
    ReplicationConfig,
    ReplicationInvariantError,
    Truncate,
    TruncateFullyAndStartAt,
    UpdateHighWatermark,
)
from rillet.client.wire import errors
from rillet.controller.metadata.image import TopicPartition

NONE = errors.NONE
E = errors.code_of


def trio(lag_ms: int = 30_000, isr: tuple[int, ...] = (1, 2, 3), epoch: int = 1):
    """Brokers 1, 2, 3; 1 leads `epoch` with `isr`."""
    a, b, c = (Replica(i, lag_ms) for i in (1, 2, 3))
    a.apply(a.state.become_leader(epoch, 1, (1, 2, 3), isr, now_ms=0))
    for r in (b, c):
        r.apply(r.state.become_follower(1, epoch, 1, (1, 2, 3), isr))
    return a, b, c


def commit(leader: Replica, proposal: ProposeAlterPartition, partition_epoch: int | None = None):
    """The controller accepts `proposal` and answers the leader."""
    new_epoch = proposal.partition_epoch + 1 if partition_epoch is None else partition_epoch
    response = AlterPartitionResponse(NONE, proposal.new_isr, proposal.leader_epoch, new_epoch)
    leader.apply(leader.state.on_alter_partition_response(proposal.proposal_id, response))


def fail(leader: Replica, proposal: ProposeAlterPartition, code: int) -> None:
    leader.apply(
        leader.state.on_alter_partition_response(proposal.proposal_id, AlterPartitionResponse(code))
    )


# ---- high watermark ---------------------------------------------------------------


def test_hw_is_min_leo_over_isr_and_unknown_follower_leo_holds_it_back() -> None:
    a, b, c = trio()
    a.append(["m0", "m1", "m2"])
    assert a.state.high_watermark == 0
    b.fetch_from(a)  # b asks at 0, gets 3 records
    b.fetch_from(a)  # b asks at 3: leader now knows b's LEO
    assert a.state.follower_log_end_offset(2) == 3
    assert a.state.high_watermark == 0  # c's LEO still unknown
    c.fetch_from(a)
    c.fetch_from(a)
    assert a.state.high_watermark == 3
    assert a.hw_updates == [3]


def test_follower_hw_is_min_of_leader_hw_and_own_leo() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0", "m1"])
    b.fetch_from(a)
    b.fetch_from(a)
    assert a.state.high_watermark == 2
    a.append(["m2", "m3"])
    b.fetch_from(a)  # gets m2, m3 and the leader's HW 2
    assert b.state.high_watermark == 2
    c.fetch_from(a)  # not in the ISR: HW min(2, own LEO 4) = 2
    assert c.state.high_watermark == 2


def test_follower_hw_moves_only_after_its_append_succeeds() -> None:
    # Kafka sets the follower HW after appending (min(leader HW, own LEO)). Set before,
    # a failed append (full disk, a refused batch) left the HW above the log end, so
    # consumers fetching from this follower were told of records it does not have.
    a, b, c = trio(isr=(1, 2))  # c catches up from outside the ISR
    a.append(["m0", "m1", "m2"])
    b.fetch_from(a)
    b.fetch_from(a)
    assert a.state.high_watermark == 3

    def failing_append(records: object) -> None:
        raise OSError(28, "No space left on device")

    c.log.append = failing_append  # type: ignore[method-assign]
    with pytest.raises(OSError):
        c.fetch_from(a)  # m0-m2 and the leader's HW 3; the append fails
    assert c.log.log_end_offset == 0
    assert c.state.high_watermark == 0
    assert c.hw_updates == []
    del c.log.append  # the disk has room again: the same fetch now moves the HW
    c.fetch_from(a)
    assert (c.log.log_end_offset, c.state.high_watermark, c.hw_updates) == (3, 3, [3])


def test_hw_never_moves_back_when_a_follower_reports_a_lower_offset() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0", "m1"])
    b.fetch_from(a)
    b.fetch_from(a)
    assert a.state.high_watermark == 2
    # b restarted and lost unflushed records: it fetches from 1 again.
    decision = a.state.on_follower_fetch(2, 1, 1, now_ms=5, current_leader_epoch=1)
    assert decision.error_code == NONE
    assert a.state.follower_log_end_offset(2) == 1
    assert a.state.high_watermark == 2


def test_new_leader_keeps_its_hw_and_waits_for_isr_followers_before_advancing() -> None:
    a, b, c = trio()
    a.append(["m0", "m1"])
    for r in (b, c, b, c):
        r.fetch_from(a)
    b.fetch_from(a)  # learns HW 2
    assert b.state.high_watermark == 2
    a.append(["m2"])
    b.fetch_from(a)  # b has m2, c does not; HW stays 2
    # a fails; b leads epoch 2 with the same ISR.
    b.apply(b.state.become_leader(2, 2, (1, 2, 3), (1, 2, 3), now_ms=100))
    assert b.state.high_watermark == 2
    assert b.state.follower_log_end_offset(3) == -1  # unknown until c fetches
    c.apply(c.state.become_follower(2, 2, 2, (1, 2, 3), (1, 2, 3)))
    c.fetch_from(b, now_ms=110)
    c.fetch_from(b, now_ms=111)
    assert b.state.high_watermark == 2  # a (still in ISR) has not fetched
    a.apply(a.state.become_follower(2, 2, 2, (1, 2, 3), (1, 2, 3)))
    assert a.state.high_watermark == 2  # the old leader's HW does not move back
    a.fetch_from(b, now_ms=112)
    assert b.state.high_watermark == 3
    assert a.log.records == b.log.records == c.log.records


def test_leader_alone_in_isr_advances_hw_on_its_own_append() -> None:
    a, _, _ = trio(isr=(1,))
    a.append(["m0"])
    assert a.state.high_watermark == 1


# ---- ISR shrink and expand --------------------------------------------------------


def test_isr_shrinks_after_lag_time_and_not_before() -> None:
    a, b, c = trio(lag_ms=100)
    a.append(["m0"], now_ms=0)
    b.fetch_from(a, now_ms=10)
    b.fetch_from(a, now_ms=20)  # b is caught up at 20
    assert a.state.tick(100) == ()  # c was caught up at election time 0: 100 - 0 <= 100
    (proposal,) = a.state.tick(101)
    assert isinstance(proposal, ProposeAlterPartition)
    assert proposal.new_isr == (1, 2)
    assert (proposal.leader_epoch, proposal.partition_epoch) == (1, 1)


def test_follower_at_leader_end_stays_in_isr_without_fetching() -> None:
    # Kafka's isCaughtUp: LEO == leader LEO counts as caught up, however old the fetch.
    a, b, c = trio(lag_ms=100)
    for r in (b, c):
        r.fetch_from(a, now_ms=1)
    assert a.state.tick(10_000) == ()


def test_follower_that_keeps_fetching_but_never_reaches_the_end_is_removed() -> None:
    a, b, c = trio(lag_ms=100, isr=(1, 2))
    for t in range(0, 400, 10):
        a.append([f"m{t}"], now_ms=t)
        # b fetches but is always one fetch behind the end the leader had last time.
        a.state.on_follower_fetch(2, 0, -1, now_ms=t, current_leader_epoch=1)
    effects = a.state.tick(400)
    assert [p.new_isr for p in effects if isinstance(p, ProposeAlterPartition)] == [(1,)]


def test_expansion_proposed_when_follower_reaches_hw_and_epoch_start() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0", "m1"])
    b.fetch_from(a)
    b.fetch_from(a)
    c.fetch_from(a)  # c at 0 < HW 2: no proposal yet
    assert a.proposals == []
    c.fetch_from(a)  # c at 2 == HW
    (proposal,) = a.proposals
    assert proposal.new_isr == (1, 2, 3)
    commit(a, proposal)
    assert a.state.isr == (1, 2, 3) and a.state.partition_epoch == 2
    assert a.state.pending_isr_change is None


def test_expansion_waits_for_the_leader_epoch_start_offset() -> None:
    # A follower at a new leader's lagging HW may still lack records an earlier leader
    # committed; Kafka's isFollowerInSync also wants it at the leader epoch start.
    a, b, c = trio(lag_ms=100)
    a.append(["m0"])
    for r in (b, c, b, c):
        r.fetch_from(a, now_ms=1)
    a.append(["m1", "m2"], now_ms=2)
    b.fetch_from(a, now_ms=3)  # b has m1, m2; c stops fetching
    (shrink,) = a.state.tick(200)
    commit(a, shrink)  # ISR (1, 2)
    a.state.on_follower_fetch(2, 3, 1, now_ms=201, current_leader_epoch=1)  # answer lost
    assert a.state.high_watermark == 3  # m1, m2 committed
    assert (b.state.high_watermark, c.log.log_end_offset) == (1, 1)
    b.apply(b.state.become_leader(2, 3, (1, 2, 3), (1, 2), now_ms=300))
    c.apply(c.state.become_follower(2, 2, 3, (1, 2, 3), (1, 2)))
    assert b.state.leader_epoch_start_offset == 3
    c.fetch_from(b, now_ms=301)  # c at 1 == b's HW: not enough, it lacks m1, m2
    assert b.proposals == []
    c.fetch_from(b, now_ms=302)
    assert [p.new_isr for p in b.proposals] == [(1, 2, 3)]
    assert c.log.records == a.log.records


def lagging_new_leader() -> tuple[Replica, Replica, Replica]:
    """b leads epoch 2 with the HW it knew as a follower (1) while m1, m2 were
    committed under a (HW 3); a and c follow b."""
    a, b, c = trio(lag_ms=100)
    a.append(["m0"])
    for r in (b, c, b, c):
        r.fetch_from(a, now_ms=1)
    a.append(["m1", "m2"], now_ms=2)
    b.fetch_from(a, now_ms=3)
    c.fetch_from(a, now_ms=4)
    for follower in (2, 3):  # their next fetches move a's HW; the answers are lost
        a.state.on_follower_fetch(follower, 3, 1, now_ms=5, current_leader_epoch=1)
    assert a.state.high_watermark == 3 and b.state.high_watermark == 1
    assert not a.state.high_watermark_behind_epoch_start
    b.apply(b.state.become_leader(2, 3, (1, 2, 3), (1, 2, 3), now_ms=300))
    for r in (a, c):
        r.apply(r.state.become_follower(2, 2, 3, (1, 2, 3), (1, 2, 3)))
    return a, b, c


def test_a_new_leaders_latest_offset_is_unavailable_until_its_hw_reaches_the_epoch_start() -> None:
    # "latest" must not answer b's HW 1, or a reader would miss acknowledged m1, m2.
    a, b, c = lagging_new_leader()
    assert b.state.high_watermark_behind_epoch_start
    assert not c.state.high_watermark_behind_epoch_start  # followers answer nothing
    for r in (a, c, a, c):
        r.fetch_from(b, now_ms=301)
    assert b.state.high_watermark >= 3
    assert not b.state.high_watermark_behind_epoch_start


def test_list_offsets_on_a_lagging_new_leader_says_not_yet() -> None:
    a, b, c = lagging_new_leader()
    log = SimpleNamespace(log_start_offset=0, offset_for_timestamp=lambda ts: None)
    replica = SimpleNamespace(state=b.state, log=log, is_leader=True, topic_id="t-id")
    manager = SimpleNamespace(replicas={TopicPartition("t", 0): replica}, remote=None)
    handler = ListOffsetsHandler(manager)  # type: ignore[arg-type]

    def ask(ts: int) -> tuple[int, int]:
        r = handler.lookup("t", 0, -1, ts)
        return r.error_code, r.offset

    not_yet = E("OFFSET_NOT_AVAILABLE")
    assert ask(-1) == (not_yet, -1)  # latest
    assert ask(1_700_000_000_000) == (not_yet, -1)  # a time with no record below the HW
    assert ask(-2) == (NONE, 0)  # earliest is safe to answer
    assert errors.is_retriable(not_yet)
    for r in (a, c, a, c):
        r.fetch_from(b, now_ms=301)
    assert ask(-1) == (NONE, b.state.high_watermark)
    assert ask(1_700_000_000_000) == (NONE, -1)


def test_only_one_alter_partition_in_flight() -> None:
    a, b, c = trio(lag_ms=100, isr=(1, 2))
    a.append(["m0"])
    (shrink,) = a.state.tick(500)  # b never fetched: shrink to (1,)
    assert shrink.new_isr == (1,)
    c.fetch_from(a, now_ms=501)
    c.fetch_from(a, now_ms=502)  # c reached the HW, but a change is in flight
    assert a.state.tick(1000) == ()
    commit(a, shrink)
    assert a.state.isr == (1,)
    c.fetch_from(a, now_ms=1001)
    assert [p.new_isr for p in a.proposals] == [(1, 3)]


def test_hw_during_pending_shrink_still_waits_for_the_leaving_member() -> None:
    a, b, c = trio(lag_ms=100)
    b.fetch_from(a, now_ms=1)
    c.fetch_from(a, now_ms=1)
    a.append(["m0", "m1"], now_ms=2)
    b.fetch_from(a, now_ms=3)
    b.fetch_from(a, now_ms=4)  # b has both; c is stuck at 0
    (shrink,) = a.state.tick(200)
    assert shrink.new_isr == (1, 2)
    assert a.state.maximal_isr == (1, 2, 3)
    assert a.state.high_watermark == 0  # the controller may still reject the shrink
    commit(a, shrink)
    assert a.state.high_watermark == 2


def test_hw_during_pending_expand_counts_the_joining_member() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0"])
    b.fetch_from(a)
    b.fetch_from(a)
    c.fetch_from(a)
    c.fetch_from(a)  # c reaches HW 1: expansion proposed
    (expand,) = a.proposals
    a.append(["m1", "m2"])
    b.fetch_from(a)
    b.fetch_from(a)  # b has everything; c does not
    assert a.state.maximal_isr == (1, 2, 3)
    assert a.state.high_watermark == 1  # c may be in the ISR the controller commits
    commit(a, expand)
    assert a.state.high_watermark == 1
    c.fetch_from(a)
    c.fetch_from(a)
    assert a.state.high_watermark == 3


def test_expand_not_applied_reverts_to_committed_isr_and_hw_advances() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0"])
    for r in (b, b, c, c):
        r.fetch_from(a)
    (expand,) = a.proposals
    a.append(["m1"])
    b.fetch_from(a)
    b.fetch_from(a)
    assert a.state.high_watermark == 1
    fail(a, expand, E("INELIGIBLE_REPLICA"))
    assert a.state.pending_isr_change is None
    assert a.state.high_watermark == 2


def test_transient_alter_error_keeps_maximal_isr_and_resends_on_tick() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0"])
    for r in (b, b, c, c):
        r.fetch_from(a)
    (expand,) = a.proposals
    fail(a, expand, E("REQUEST_TIMED_OUT"))  # the controller may have applied it
    assert a.state.maximal_isr == (1, 2, 3)
    (again,) = a.state.tick(1)
    assert again.new_isr == expand.new_isr and again.proposal_id != expand.proposal_id
    assert a.state.tick(2) == ()  # one in flight
    commit(a, again)
    assert a.state.isr == (1, 2, 3)


def test_stale_version_error_waits_for_metadata() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0"])
    for r in (b, b, c, c):
        r.fetch_from(a)
    (expand,) = a.proposals
    fail(a, expand, E("INVALID_UPDATE_VERSION"))
    assert a.state.maximal_isr == (1, 2, 3)
    assert a.state.tick(1) == ()  # no resend, no new proposal
    # The controller had committed it; the metadata arrives.
    a.apply(a.state.become_leader(1, 2, (1, 2, 3), (1, 2, 3), now_ms=2))
    assert a.state.isr == (1, 2, 3) and a.state.pending_isr_change is None


def test_metadata_redelivery_keeps_the_pending_change() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0"])
    for r in (b, b, c, c):
        r.fetch_from(a)
    assert a.state.become_leader(1, 1, (1, 2, 3), (1, 2), now_ms=1) == ()
    assert a.state.maximal_isr == (1, 2, 3)


def test_alter_response_after_metadata_moved_on_is_ignored() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0"])
    for r in (b, b, c, c):
        r.fetch_from(a)
    (expand,) = a.proposals
    a.apply(a.state.become_leader(1, 3, (1, 2, 3), (1, 2), now_ms=1))  # controller's change
    commit(a, expand, partition_epoch=2)
    assert a.state.isr == (1, 2) and a.state.partition_epoch == 3
    with pytest.raises(ValueError):
        commit(a, expand)  # answered already


# ---- acks ---------------------------------------------------------------------------


def test_produce_refusals() -> None:
    a, b, _ = trio(isr=(1, 2))
    assert a.state.check_produce(2, 1) == E("INVALID_REQUIRED_ACKS")
    assert a.state.check_produce(-1, 3) == E("NOT_ENOUGH_REPLICAS")
    assert a.state.check_produce(-1, 2) is None
    assert a.state.check_produce(1, 3) is None  # min.insync only binds acks=all
    assert a.state.check_produce(0, 3) is None
    assert b.state.check_produce(1, 1) == E("NOT_LEADER_OR_FOLLOWER")
    assert a.state.check_produce(1, 1, current_leader_epoch=0) == E("FENCED_LEADER_EPOCH")
    assert a.state.check_produce(1, 1, current_leader_epoch=2) == E("UNKNOWN_LEADER_EPOCH")


def test_acks_all_completes_exactly_when_hw_passes_its_last_offset() -> None:
    a, b, _ = trio(isr=(1, 2))
    assert a.produce("p1", ["m0", "m1"], min_isr=2) is None
    assert a.produce("p2", ["m2"], min_isr=2) is None
    b.fetch_from(a)  # b gets all 3, leader still thinks b is at 0
    assert a.results == {}
    a.state.on_follower_fetch(2, 1, 1, now_ms=1, current_leader_epoch=1)
    assert a.results == {}  # HW 1: p1 needs 2
    a.apply(a.state.on_follower_fetch(2, 2, 1, now_ms=2, current_leader_epoch=1).effects)
    assert a.results == {"p1": NONE}
    a.apply(a.state.on_follower_fetch(2, 3, 1, now_ms=3, current_leader_epoch=1).effects)
    assert a.results == {"p1": NONE, "p2": NONE}
    assert a.state.pending_produce_count == 0


def test_acks_all_after_isr_shrinks_below_min_isr_reports_after_append_error() -> None:
    a, b, _ = trio(lag_ms=100, isr=(1, 2))
    assert a.produce("p", ["m0"], min_isr=2, now_ms=0) is None
    (shrink,) = a.state.tick(200)
    commit(a, shrink)  # ISR (1,): HW reaches 1 at once
    assert a.results == {"p": E("NOT_ENOUGH_REPLICAS_AFTER_APPEND")}


def test_acks_all_times_out() -> None:
    a, _, _ = trio(isr=(1, 2))
    a.produce("p", ["m0"], min_isr=2, now_ms=0, timeout_ms=50)
    a.apply(a.state.expire(49))
    assert a.results == {}
    a.apply(a.state.tick(50))
    assert a.results == {"p": E("REQUEST_TIMED_OUT")}


def test_leadership_loss_fails_pending_produces() -> None:
    a, _, _ = trio(isr=(1, 2))
    a.produce("p1", ["m0"], min_isr=2)
    a.produce("p2", ["m1"], min_isr=2)
    a.apply(a.state.become_follower(2, 2, 2, (1, 2, 3), (1, 2)))
    assert a.results == {"p1": E("NOT_LEADER_OR_FOLLOWER"), "p2": E("NOT_LEADER_OR_FOLLOWER")}
    assert a.state.role is Role.FOLLOWER


def test_produce_already_below_hw_completes_at_once() -> None:
    a, _, _ = trio(isr=(1,))
    a.produce("p", ["m0"])
    assert a.results == {"p": NONE}


# ---- epochs, fetch validation, consumers -------------------------------------------


def test_fetch_with_old_or_new_leader_epoch_is_refused() -> None:
    a, _, _ = trio()
    assert a.state.on_follower_fetch(2, 0, -1, 0, current_leader_epoch=0).error_code == E(
        "FENCED_LEADER_EPOCH"
    )
    assert a.state.on_follower_fetch(2, 0, -1, 0, current_leader_epoch=2).error_code == E(
        "UNKNOWN_LEADER_EPOCH"
    )
    assert a.state.on_follower_fetch(9, 0, -1, 0).error_code == E("NOT_LEADER_OR_FOLLOWER")


def test_stale_metadata_is_ignored() -> None:
    a, _, _ = trio(epoch=5)
    assert a.state.become_follower(2, 4, 9, (1, 2, 3), (1, 2, 3)) == ()
    assert a.state.role is Role.LEADER and a.state.leader_epoch == 5


def test_a_restarted_broker_ignores_metadata_older_than_its_log() -> None:
    """A restarted broker catching up on metadata may be handed an old image first (a
    snapshot or batch behind the controller's end). Its log holds records of epoch 2, so
    an image naming it leader in epoch 1 is stale: leading then would stamp new records
    with an older epoch than the log's last ones and drop epoch 2 from its epoch cache.
    Found by the replication simulator once metadata came from a Raft quorum."""
    a, b, _ = trio(epoch=2)
    a.append(["m0", "m1"])
    b.fetch_from(a)
    assert b.log.latest_epoch == 2
    b.state = PartitionState(2, b.log, ReplicationConfig(30_000))  # restarted: memory lost
    assert b.state.become_leader(1, 1, (1, 2, 3), (1, 2, 3), now_ms=0) == ()
    assert b.state.become_follower(1, 1, 1, (1, 2, 3), (1, 2, 3)) == ()
    assert b.state.role is not Role.LEADER and b.state.leader_epoch < 2
    b.apply(b.state.become_follower(1, 2, 3, (1, 2, 3), (1, 2, 3)))  # the current image
    assert b.state.role is Role.FOLLOWER and b.state.leader_epoch == 2


def test_consumers_read_only_below_the_hw() -> None:
    a, b, _ = trio(isr=(1, 2))
    a.append(["m0", "m1"])
    b.fetch_from(a)
    assert a.state.max_readable_offset() == 0
    assert a.state.max_readable_offset(for_consumer=False) == 2
    b.fetch_from(a)
    assert a.state.max_readable_offset() == 2
    b.fetch_from(a)
    assert b.state.max_readable_offset() == 2  # fetch from follower: below its HW


def test_fetch_below_log_start_restarts_the_follower_at_the_leader_start() -> None:
    a, b, _ = trio(isr=(1, 2))
    a.append(["m0", "m1", "m2"])
    a.log.log_start_offset = 2  # retention deleted the first records
    a.log.records = a.log.records[2:]
    decision = a.state.on_follower_fetch(2, 0, -1, 0, current_leader_epoch=1)
    assert decision.error_code == E("OFFSET_OUT_OF_RANGE")
    response = FetchResponse(0, 1, decision.error_code, 0, decision.log_start_offset)
    assert b.state.on_fetch_response(response)[0] == TruncateFullyAndStartAt(2)


def test_follower_ignores_a_response_to_an_older_request() -> None:
    a, b, _ = trio()
    a.append(["m0"])
    request = b.state.fetch_request()
    assert request is not None
    response, records = a.serve(request, 0)
    b.receive(response, records)
    assert b.log.log_end_offset == 1
    b.receive(response, records)  # duplicate: fetch_offset no longer matches
    assert b.log.log_end_offset == 1


def test_follower_refuses_batches_that_overlap_its_log() -> None:
    a, b, _ = trio()
    a.append(["m0", "m1"])
    b.fetch_from(a)  # b's log ends at 2
    overlapping = FetchResponse(2, 1, NONE, 0, 0, None, batches_of(1, [(1, "x"), (1, "y")]))
    with pytest.raises(ReplicationInvariantError, match="below 2"):
        b.state.on_fetch_response(overlapping)
    backwards = FetchResponse(
        2, 1, NONE, 0, 0, None, batches_of(4, [(1, "x")]) + batches_of(3, [(1, "y")])
    )
    with pytest.raises(ReplicationInvariantError, match="below 5"):
        b.state.on_fetch_response(backwards)


def test_follower_accepts_the_offset_gaps_of_a_compacted_log() -> None:
    # Compaction removes whole batches: the leader's next batch may start past the
    # follower's log end (Kafka only requires offsets to increase).
    _, b, _ = trio()
    gap = FetchResponse(0, 1, NONE, 0, 0, None, batches_of(5, [(1, "x"), (1, "y")]))
    effects = b.state.on_fetch_response(gap)
    assert effects == (AppendFetched(0, 7),)


# ---- KIP-101 / KIP-279: truncation by leader epoch ----------------------------------


def test_kip101_follower_with_uncommitted_records_truncates_to_new_leader_log() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0", "m1"])
    b.fetch_from(a)
    b.fetch_from(a)
    a.append(["lost"])  # only on a; HW is 2
    # a fails; b takes over (epoch 2) and writes; a returns as a follower.
    b.apply(b.state.become_leader(2, 2, (1, 2, 3), (1, 2), now_ms=0))
    b.append(["n2"])
    a.apply(a.state.become_follower(2, 2, 2, (1, 2, 3), (1, 2)))
    request = a.state.fetch_request()
    assert request is not None and (request.fetch_offset, request.last_fetched_epoch) == (3, 1)
    decision = b.state.on_fetch_request(request, 1)
    assert decision.diverging_epoch == EpochEndOffset(1, 2)
    a.fetch_from(b, 1)
    assert a.log.log_end_offset == 2  # truncated the uncommitted "lost"
    a.fetch_from(b, 2)
    assert a.log.records == b.log.records == [(1, "m0"), (1, "m1"), (2, "n2")]
    assert a.state.high_watermark == 2


def test_kip279_two_quick_failovers_follower_truncates_by_epoch() -> None:
    a, b, c = trio()
    a.append(["r0"])
    for r in (b, c, b, c):
        r.fetch_from(a)
    a.append(["a1"])  # uncommitted, only on a
    # a fails: b leads epoch 2, writes b1, and fails before anyone fetches it.
    b.apply(b.state.become_leader(2, 2, (1, 2, 3), (1, 2, 3), now_ms=0))
    b.append(["b1"])
    # c leads epoch 3 (still in the ISR), never having seen epoch 2.
    c.apply(c.state.become_leader(3, 3, (1, 2, 3), (1, 2, 3), now_ms=0))
    c.append(["c1", "c2"])
    for r in (a, b):
        r.apply(r.state.become_follower(3, 3, 3, (1, 2, 3), (1, 2, 3)))
    for _ in range(3):
        a.fetch_from(c, 1)
        b.fetch_from(c, 1)
    assert a.log.records == b.log.records == c.log.records
    assert c.log.records == [(1, "r0"), (3, "c1"), (3, "c2")]
    assert c.state.high_watermark == 3


def test_truncation_takes_several_rounds_through_unknown_epochs() -> None:
    leader = Replica(1)
    leader.log.append([(1, "r0"), (3, "z")])
    leader.apply(leader.state.become_leader(5, 5, (1, 2), (1, 2), now_ms=0))
    follower = Replica(2)
    follower.log.append([(1, "r0"), (2, "x"), (4, "y")])
    follower.apply(follower.state.become_follower(1, 5, 5, (1, 2), (1, 2)))
    truncations = []
    for _ in range(4):
        request = follower.state.fetch_request()
        assert request is not None
        response, records = leader.serve(request, 0)
        effects = follower.state.on_fetch_response(response)
        truncations += [e.offset for e in effects if isinstance(e, Truncate)]
        follower.apply(effects, records)
    assert truncations == [2, 1]
    assert follower.log.records == leader.log.records


def test_empty_follower_fetches_from_zero() -> None:
    state = PartitionState(2, FakeLog())
    state.become_follower(1, 1, 1, (1, 2), (1, 2))
    request = state.fetch_request()
    assert request is not None and (request.fetch_offset, request.last_fetched_epoch) == (0, -1)


def test_partial_fetch_keeps_follower_hw_at_its_own_leo() -> None:
    a, b, _ = trio(isr=(1, 2))
    a.append(["m0", "m1", "m2"])
    b.fetch_from(a)
    b.fetch_from(a)
    assert a.state.high_watermark == 3
    c = Replica(3)
    c.apply(c.state.become_follower(1, 1, 1, (1, 2, 3), (1, 2)))
    request = c.state.fetch_request()
    assert request is not None
    response, records = a.serve(request, 0)
    first = records[:1]  # the leader's size limit cut the answer after one record
    c.receive(
        FetchResponse(0, 1, NONE, response.high_watermark, 0, None, batches_of(0, first)), first
    )
    assert c.state.high_watermark == 1


def test_shutdown_fails_waiters_and_stops_replicating() -> None:
    a, _, _ = trio(isr=(1, 2))
    a.produce("p", ["m0"], min_isr=2)
    a.apply(a.state.shutdown())
    assert a.results == {"p": E("NOT_LEADER_OR_FOLLOWER")}
    assert a.state.role is Role.NONE and a.state.fetch_request() is None


def test_controller_shrinking_the_isr_lets_the_hw_advance() -> None:
    # The controller fences broker 2 and drops it from the ISR (same leader epoch).
    a, _, c = trio(isr=(1, 2, 3))
    assert a.produce("p", ["m0"], min_isr=2) is None
    c.fetch_from(a)
    c.fetch_from(a)
    assert a.results == {}
    a.apply(a.state.become_leader(1, 2, (1, 2, 3), (1, 3), now_ms=1))
    assert a.state.high_watermark == 1 and a.results == {"p": NONE}


def test_follower_falls_back_to_its_hw_when_leader_knows_no_such_epoch() -> None:
    _, b, _ = trio()
    b.log.append([(1, "x"), (1, "y")])
    response = FetchResponse(2, 1, NONE, 0, 0, EpochEndOffset(-1, -1))
    assert b.state.on_fetch_response(response) == (Truncate(0),)


def test_ineligible_follower_is_not_proposed_again_until_its_broker_changes() -> None:
    # A follower in controlled shutdown looks eligible in the image (metadata does not
    # carry that state), so the controller refuses INELIGIBLE_REPLICA. Without a memory
    # of that, every fetch of the follower would cost another refused AlterPartition.
    a, b, c = trio(isr=(1, 2))
    a.append(["m0"])
    for r in (b, b, c, c):
        r.fetch_from(a)
    (expand,) = a.proposals
    assert expand.new_isr == (1, 2, 3)
    fail(a, expand, E("INELIGIBLE_REPLICA"))
    for _ in range(3):
        c.fetch_from(a)
    assert a.proposals == [expand]  # no re-proposal on c's later fetches
    a.state.on_brokers_changed([2])  # news about another broker changes nothing
    c.fetch_from(a)
    assert a.proposals == [expand]
    a.state.on_brokers_changed([3])  # e.g. c re-registered after its restart
    c.fetch_from(a)
    assert [p.new_isr for p in a.proposals] == [(1, 2, 3), (1, 2, 3)]


def test_a_new_leader_epoch_forgets_ineligible_refusals() -> None:
    a, b, c = trio(isr=(1, 2))
    a.append(["m0"])
    for r in (b, b, c, c):
        r.fetch_from(a)
    (expand,) = a.proposals
    fail(a, expand, E("INELIGIBLE_REPLICA"))
    a.apply(a.state.become_leader(2, 2, (1, 2, 3), (1, 2), now_ms=10))
    c.apply(c.state.become_follower(1, 2, 2, (1, 2, 3), (1, 2)))
    c.fetch_from(a)
    c.fetch_from(a)
    assert [p.new_isr for p in a.proposals] == [(1, 2, 3), (1, 2, 3)]


def test_follower_takes_its_leaders_log_start_up_to_its_own_hw() -> None:
    # Found by the replication simulator (seeds 63, 72): a deposed leader kept writing
    # in its old epoch; meanwhile the new leader's retention removed the records where
    # the two logs diverge, and with them its epoch history there. The returning
    # follower, told to truncate to the new leader's first epoch start, kept its own
    # records below it and counted them below its HW. Kafka's follower takes the
    # leader's log start after every fetch; records below it are gone.
    a, b, _ = trio(isr=(1, 2))
    a.append([f"m{i}" for i in range(6)])
    b.fetch_from(a)
    b.fetch_from(a)  # b holds m0-m5, HW 6 on both
    assert (a.state.high_watermark, b.state.high_watermark) == (6, 6)
    a.log.increment_log_start_offset(4)  # retention on the leader
    a.append(["m6"])
    b.fetch_from(a)
    assert b.log.log_start_offset == 4
    assert b.log.read(4) == a.log.read(4)


def test_follower_log_start_never_passes_its_own_hw() -> None:
    _, b, _ = trio()
    fetched = [(1, "x"), (1, "y")]
    response = FetchResponse(0, 1, NONE, 5, 9, None, batches_of(0, fetched))
    effects = b.driver.on_fetch_response(response, fetched)
    # HW min(leader HW 5, own end 2) = 2: the log start follows only that far.
    assert effects == (AppendFetched(0, 2), UpdateHighWatermark(2), IncrementLogStartOffset(2))
    assert (b.log.log_start_offset, b.state.high_watermark) == (2, 2)


# ---- fetch-session clock (a follower's idle partitions left unread) --------------------


def test_a_session_clock_stands_for_fetches_of_an_idle_partition_left_unread() -> None:
    """A follower caught up through a fetch session is fetched again by every fetch of
    that session, though the leader no longer reads the partition: the session's clock
    stands for those fetches, so an append finds it caught up as of the session's last
    fetch (not its last explicit one), and it leaves the ISR once the session stops."""
    a, b, c = trio(lag_ms=100, isr=(1, 2))
    clock = FetchClock()
    a.append(["m0"], now_ms=0)
    a.state.on_follower_fetch(2, 1, -1, now_ms=10, current_leader_epoch=1, clock=clock)
    assert a.state.is_idle_follower(2)
    clock.last_fetch_ms = 250  # session fetches up to 250 that did not list it
    a.append(["m1"], now_ms=260)
    assert not a.state.is_idle_follower(2)
    assert a.state.tick(340) == ()  # caught up at 250, not 10
    # The session's next fetch reads it again: still at 1, caught up as of 250.
    a.state.on_follower_fetch(2, 1, -1, now_ms=345, current_leader_epoch=1, clock=clock)
    assert a.state.tick(350) == ()
    (proposal,) = a.state.tick(351)  # the session stopped at 250: more than 100 ms ago
    assert isinstance(proposal, ProposeAlterPartition) and proposal.new_isr == (1,)


def test_an_idle_partition_behind_the_leader_end_ignores_the_clock() -> None:
    a, b, c = trio(lag_ms=100, isr=(1, 2))
    clock = FetchClock()
    a.append(["m0"], now_ms=0)
    # Fetching at 0 with the leader at 1: not caught up, so the clock is not attached.
    a.state.on_follower_fetch(2, 0, -1, now_ms=10, current_leader_epoch=1, clock=clock)
    assert not a.state.is_idle_follower(2)
    clock.last_fetch_ms = 500
    (proposal,) = a.state.tick(501)  # caught up last at 0 (election), never since
    assert isinstance(proposal, ProposeAlterPartition) and proposal.new_isr == (1,)


def test_a_new_leader_epoch_detaches_the_session_clock() -> None:
    a, b, c = trio(lag_ms=100, isr=(1, 2))
    clock = FetchClock()
    a.state.on_follower_fetch(2, 0, -1, now_ms=10, current_leader_epoch=1, clock=clock)
    a.apply(a.state.become_leader(2, 2, (1, 2, 3), (1, 2), now_ms=1000))
    clock.last_fetch_ms = 5000  # the old session's fetches fail the epoch check now
    a.append(["m0"], now_ms=1000)
    (proposal,) = a.state.tick(1101)
    assert isinstance(proposal, ProposeAlterPartition) and proposal.new_isr == (1,)


def test_is_idle_follower_only_in_the_isr_at_the_leader_end() -> None:
    a, b, c = trio(isr=(1, 2))
    for r in (b, c):
        r.fetch_from(a)
    assert a.state.is_idle_follower(2)
    assert not a.state.is_idle_follower(3)  # at the end, but may yet join the ISR
    assert not b.state.is_idle_follower(1)  # not a leader
    a.append(["m0"])
    assert not a.state.is_idle_follower(2)  # records to send


def test_needs_tick_only_while_a_tick_could_act() -> None:
    """A driver ticks only cores that may act on a tick: acks=all waiters to expire, an
    ISR change to resend, or an ISR member not at the leader's end (to shrink)."""
    a, b, c = trio(lag_ms=100)
    assert a.state.needs_tick()  # the followers' positions are unknown yet
    assert not b.state.needs_tick()  # a follower without acks=all waiters
    for r in (b, c):
        r.fetch_from(a, now_ms=1)
    assert not a.state.needs_tick()  # every ISR member at the end: no tick can act
    assert a.produce("p", ["m0"], now_ms=2) is None
    assert a.state.needs_tick()  # an acks=all waiter, and members behind the end
    for r in (b, c, b, c):
        r.fetch_from(a, now_ms=3)
    assert a.results == {"p": NONE} and not a.state.needs_tick()
    a.append(["m1"], now_ms=10)
    b.fetch_from(a, now_ms=10)
    b.fetch_from(a, now_ms=11)  # b at the end, c behind
    (proposal,) = a.state.tick(200)
    assert isinstance(proposal, ProposeAlterPartition) and proposal.new_isr == (1, 2)
    assert a.state.needs_tick()  # the shrink is in flight
    commit(a, proposal)
    assert not a.state.needs_tick()  # ISR (1, 2), both at the end


# ---- the remote tier ----------------------------------------------------------------


def tiered_leader() -> tuple[Replica, Replica, Replica]:
    """Broker 1 leads epoch 2 of m0..m5 (m0-m2 written in epoch 1, m3-m5 in epoch 2) and
    its local log starts at 4: offsets 0-3 are only in the remote tier."""
    a, b, c = trio(isr=(1, 2))
    a.append(["m0", "m1", "m2"])
    a.apply(a.state.become_leader(2, 2, (1, 2, 3), (1, 2), now_ms=0))
    for r in (b, c):
        r.apply(r.state.become_follower(1, 2, 2, (1, 2, 3), (1, 2)))
    a.append(["m3", "m4", "m5"])
    a.log.increment_log_start_offset(4)
    return a, b, c


REMOTE_EPOCHS = ((1, 0), (2, 3))  # the remote segments' leader epochs, as metadata has them


def test_a_fetch_below_the_local_start_that_the_tier_holds_is_moved_to_tiered_storage() -> None:
    a, _, c = tiered_leader()
    request = c.state.fetch_request()
    assert request is not None and request.fetch_offset == 0
    decision = a.driver.on_follower_fetch(request, None, 0)
    assert decision.error_code == E("OFFSET_MOVED_TO_TIERED_STORAGE")
    # Below the remote log start too (remote retention): plain out of range.
    assert a.driver.on_follower_fetch(request, None, 1).error_code == E("OFFSET_OUT_OF_RANGE")
    # No remote tier: out of range, as before.
    assert a.driver.on_follower_fetch(request).error_code == E("OFFSET_OUT_OF_RANGE")


def test_a_follower_below_the_leaders_local_start_restarts_there_with_the_remote_epochs() -> None:
    """Kafka's follower on OFFSET_MOVED_TO_TIERED_STORAGE: ask the leader's earliest local
    offset, rebuild the epoch cache from the remote segments, truncate fully, start at
    the leader's local log start, fetch on from there."""
    a, _, c = tiered_leader()
    request = c.state.fetch_request()
    assert request is not None
    effects = c.driver.on_fetch_response(a.serve(request, 0, remote_log_start=0)[0], [])
    (question,) = effects
    assert question == ListLeaderLocalStart(fetch_offset=0, leader_epoch=2)
    assert c.log.log_end_offset == 0  # nothing happens until the leader answers
    applied = c.driver.on_leader_local_start(question, a.log.log_start_offset, REMOTE_EPOCHS)
    assert applied == (TruncateFullyAndStartAt(4, REMOTE_EPOCHS), UpdateHighWatermark(4))
    assert (c.log.log_start_offset, c.log.log_end_offset) == (4, 4)
    assert c.log.epochs == list(REMOTE_EPOCHS)
    assert c.state.high_watermark == 4  # all below the local start was committed
    request = c.state.fetch_request()
    assert request is not None
    assert (request.fetch_offset, request.last_fetched_epoch) == (4, 2)
    c.fetch_from(a)  # the epoch check passes on the leader's local epochs, records follow
    assert c.log.read(4) == a.log.read(4)
    assert c.log.epochs == list(REMOTE_EPOCHS)


def test_remote_epochs_at_or_past_the_local_start_are_left_to_the_fetched_batches() -> None:
    a, _, c = tiered_leader()
    request = c.state.fetch_request()
    assert request is not None
    (question,) = c.driver.on_fetch_response(a.serve(request, 0, remote_log_start=0)[0], [])
    # The remote tier also holds offset 4 onwards (copied, not yet deleted locally).
    applied = c.driver.on_leader_local_start(question, 4, (*REMOTE_EPOCHS, (3, 4)))
    assert applied[0] == TruncateFullyAndStartAt(4, REMOTE_EPOCHS)


def test_a_stale_local_start_answer_changes_nothing() -> None:
    a, _, c = tiered_leader()
    request = c.state.fetch_request()
    assert request is not None
    (question,) = c.driver.on_fetch_response(a.serve(request, 0, remote_log_start=0)[0], [])
    c.apply(c.state.become_follower(1, 3, 3, (1, 2, 3), (1, 2)))  # a new leader epoch
    assert c.driver.on_leader_local_start(question, 4, REMOTE_EPOCHS) == ()
    assert c.log.log_end_offset == 0
    c.apply(c.state.become_follower(1, 2, 2, (1, 2, 3), (1, 2)))  # (stale: ignored)
    fresh = ListLeaderLocalStart(0, 3)
    # The leader's local start is not past our position (it moved back: a new leader
    # holding more locally): nothing to skip; the next fetch decides.
    assert c.driver.on_leader_local_start(fresh, 0, REMOTE_EPOCHS) == ()
    assert c.driver.on_leader_local_start(fresh, 4, REMOTE_EPOCHS)[0] == TruncateFullyAndStartAt(
        4, REMOTE_EPOCHS
    )
