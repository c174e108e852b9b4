"""Seeded simulations of the Raft controller quorum (tests/sim), invariants after every event.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_raft_sim.py -k replay -s
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from sim.raft_cluster import (
    RaftInvariants,
    SimOptions,
    SimulationFailure,
    leader_crash_failover_ms,
    run_seed,
)
from sim.seeds import first_failure, replay, run_block, run_many, seeds_from_env

from rillet.controller.raft.core import AppendResponse, Entry, Progress, RaftNode, Role
from rillet.controller.raft.driver import RaftDriver, ReadyStep
from rillet.controller.state_machine import ControllerStateMachine

# make test: each seed is ~10 s of simulated chaos then <= 20 s of healing, ~0.2 s of CPU
# (slow disks, stalls, load and large entries: ~0.07 s without them).
QUICK_SEEDS = 160


@pytest.mark.parametrize("block", range(8))
def test_random_faults_keep_raft_safe_and_live(block: int) -> None:
    """Seeds alternate 3 and 5 voters; loss, duplication, delay, partitions, crashes."""
    run_block(run_seed, block, 8, QUICK_SEEDS)


@pytest.mark.slow
@pytest.mark.timeout(0)  # thousands of seeds: the suite-wide 300 s bound would cut them
def test_random_faults_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS seeds after the quick ones."""
    run_many(run_seed, QUICK_SEEDS, seeds_from_env(20_000), SimulationFailure)


def test_replay() -> None:
    """Replays RILLET_SIM_SEED with the whole trace echoed (-s to see it)."""
    replay(run_seed)


# The simulation runs the production driver and controller state machine: a known-bad
# variant of either, patched into the shared class, must fail some seed.

MUTANT_SEEDS = 40


def first_failing_seed() -> str:
    return first_failure(run_seed, MUTANT_SEEDS, SimulationFailure)


def sends_before_persisting(
    self: RaftDriver, stopping: Callable[[], bool] = lambda: False
) -> Iterator[ReadyStep]:
    node = self.node
    while not stopping() and node.has_ready():
        ready = node.ready()
        for msg in ready.messages:
            self.network.send(msg)
        yield functools.partial(self.storage.persist_ready, ready)
        self.machine.apply(ready)
        node.advance(ready)
        wanted = self.machine.after_advance(node)
        if wanted is not None:
            yield functools.partial(self.storage.save_snapshot, node.compact(*wanted))


def test_a_driver_that_sends_before_persisting_fails_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(RaftDriver, "ready_steps", sends_before_persisting)
    assert "not yet durable" in first_failing_seed()


def test_a_controller_that_keeps_its_proposals_after_losing_leadership_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the image reset, the next term's operations read records Raft truncated."""

    def lose_leadership_keeping_proposals(self: ControllerStateMachine, term: int) -> None:
        self.active, self.ctl = False, None
        self._leader_term = None
        self.fail_waiters("leadership lost")

    monkeypatch.setattr(
        ControllerStateMachine, "_lose_leadership", lose_leadership_keeping_proposals
    )
    assert "the driver failed: MetadataInvariantError" in first_failing_seed()


def test_a_controller_active_before_its_term_start_applied_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Serving before the new term's no-op applied reads an image without the last
    leader's committed records."""
    track = ControllerStateMachine._track_leadership

    def activate_at_once(self: ControllerStateMachine, node: RaftNode) -> None:
        track(self, node)
        if node.role is Role.LEADER and not self.active:
            self._become_active(node.term)

    monkeypatch.setattr(ControllerStateMachine, "_track_leadership", activate_at_once)
    assert "the driver failed: MetadataInvariantError" in first_failing_seed()


def test_a_leader_that_keeps_its_pending_broadcast_after_stepping_down_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller crash of issue 12: a proposal, then a step-down before the next
    Ready (a write in flight, or a stalled event loop handling its backlog), then
    ready() broadcast to followers the node no longer tracks."""
    enter_role = RaftNode.enter_role

    def keep_broadcast_pending(self: RaftNode, role: Role, leader_id: int | None) -> None:
        pending = self.broadcast_pending
        enter_role(self, role, leader_id)
        self.broadcast_pending = pending

    monkeypatch.setattr(RaftNode, "enter_role", keep_broadcast_pending)
    monkeypatch.setattr(RaftNode, "broadcast_due", lambda self: self.broadcast_pending)
    assert "the driver failed: KeyError" in first_failing_seed()


def test_a_leader_that_dates_a_lost_log_by_request_send_times_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The heuristic storage ids replaced: a rejection saying the follower's log ends
    below its match index, answering a request sent after the one that set the match,
    meant a lost disk. Reordering alone makes it fire (the follower rejects the later
    request before it accepts the earlier one); the simulator wipes no disk then."""
    match_sent: dict[tuple[int, int], int] = {}  # (leader, follower) -> sent_ms of the match
    respond = RaftNode.handle_append_response
    reject = RaftNode.handle_append_reject

    def remember_match_sent(self: RaftNode, msg: AppendResponse) -> None:
        pr = self.progress[msg.src]
        if msg.success and msg.match_index >= pr.match_index:
            key = (self.node_id, msg.src)
            match_sent[key] = max(match_sent.get(key, msg.sent_ms), msg.sent_ms)
        respond(self, msg)

    def lost_if_sent_later(self: RaftNode, peer: int, pr: Progress, msg: AppendResponse) -> None:
        sent_later = msg.sent_ms > match_sent.get((self.node_id, peer), msg.sent_ms)
        if msg.hint_term == 0 and msg.hint_index < pr.match_index and sent_later:
            self.follower_lost_state(peer, pr, msg.storage_id)
        reject(self, peer, pr, msg)

    monkeypatch.setattr(RaftNode, "handle_append_response", remember_match_sent)
    monkeypatch.setattr(RaftNode, "handle_append_reject", lost_if_sent_later)
    assert "no disk was wiped" in first_failing_seed()


# Leader completeness as Raft states it: an entry committed in term T is in the log of
# every leader of a term above T. A leader of an older term may lack it: a paused node
# that resumes and handles a vote granted before the newer term began still wins its
# (older) term (seed 7522 of the replication simulation did that).


class _Log:
    def __init__(self, terms: dict[int, int]) -> None:
        self.terms, self.snapshot_index = terms, 0

    def term(self, index: int) -> int:
        return self.terms.get(index, 0)


def _leader(node_id: int, term: int, terms: dict[int, int]) -> RaftNode:
    return SimpleNamespace(node_id=node_id, term=term, log=_Log(terms))  # type: ignore[return-value]


def _committed_in_term_3() -> tuple[RaftInvariants, list[str]]:
    failures: list[str] = []
    invariants = RaftInvariants(failures.append)  # type: ignore[arg-type]
    invariants.check_leader(_leader(102, 3, {1: 3}))
    invariants.on_commit(102, Entry(1, 3, b"x"), term=3)
    return invariants, failures


def test_a_leader_of_an_older_term_may_lack_what_a_newer_term_committed() -> None:
    invariants, failures = _committed_in_term_3()
    invariants.check_leader(_leader(101, 2, {}))
    assert failures == []


def test_a_leader_of_a_newer_term_must_hold_what_an_older_term_committed() -> None:
    invariants, failures = _committed_in_term_3()
    invariants.check_leader(_leader(100, 4, {}))
    assert len(failures) == 1 and "leader completeness" in failures[0]


def test_a_killed_leaders_followers_elect_a_new_one_well_before_the_election_timeout() -> None:
    """The peers of a crashed leader learn of it from refused reconnects and campaign at
    once (RaftNode.peer_unreachable); without that they wait out the election timeout.
    Simulated time, 20 seeds each way, every invariant (the leader lease's included)
    checked throughout: the medians are what `controller_bench` measures for real."""
    on = [leader_crash_failover_ms(seed) for seed in range(20)]
    off = [leader_crash_failover_ms(seed, refusals=False) for seed in range(20)]
    timeout_ms = SimOptions.for_seed(0).election_timeout_ms
    assert statistics.median(on) < timeout_ms / 2
    assert min(off) >= timeout_ms - SimOptions.for_seed(0).heartbeat_interval_ms
    # A split vote among the early campaigners falls back to the timeout: never worse.
    assert sum(1 for ms in on if ms < timeout_ms) >= 15
