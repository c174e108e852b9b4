"""Seeded co-simulations of group consumers (tests/sim/group_client_sim.py): the
client's membership machines against the coordinator core, with delays, lost messages,
stalls, crashes, restarts, coordinator stalls and moves, checked after every event.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_group_client_sim.py -k replay -s
"""

from __future__ import annotations

import pytest
from sim.group_client_sim import SimulationFailure, run_seed
from sim.seeds import first_failure, replay, run_block, run_many, seeds_from_env

from rillet.client.group_membership import GroupMembership

QUICK_SEEDS = 120


@pytest.mark.parametrize("block", range(3))
def test_random_faults_keep_consumers_safe_and_live(block: int) -> None:
    run_block(run_seed, block, 3, QUICK_SEEDS)


@pytest.mark.slow
@pytest.mark.timeout(0)  # thousands of seeds: the suite-wide 300 s bound would cut them
def test_random_faults_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS seeds after the quick ones."""
    run_many(run_seed, QUICK_SEEDS, seeds_from_env(2_000), SimulationFailure)


def test_replay() -> None:
    replay(run_seed)


def test_a_consumer_that_ignores_its_lease_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # A consumer that keeps its partitions while its heartbeats go unanswered still
    # consumes them after the coordinator gave them to another member.
    monkeypatch.setattr(GroupMembership, "lease_deadline_ms", lambda self: 1 << 62)
    assert "owned by" in first_failure(run_seed, 200, SimulationFailure)


def test_a_consumer_that_ignores_the_rebalance_timeout_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Counting only the session: a member whose revocation takes longer than the
    # rebalance timeout is dropped by the coordinator while still consuming.
    monkeypatch.setattr(
        GroupMembership,
        "lease_deadline_ms",
        lambda self: self._last_ok_send_ms + self.config.session_timeout_ms,
    )
    assert "owned by" in first_failure(run_seed, 200, SimulationFailure)
