"""Seeded simulations of one consumer group (tests/sim/group_cluster.py): the real
coordinator core under lost responses, crashes, static and dynamic restarts, leaves,
subscription changes, growing topics and time jumps, checked after every event.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_group_sim.py -k replay -s
"""

from __future__ import annotations

import pytest
from sim.group_cluster import SimulationFailure, run_seed
from sim.seeds import first_failure, replay, run_block, run_many, seeds_from_env

from rillet.broker.group.coordinator import GroupCoordinator, TargetAssignmentMetadataRecord

QUICK_SEEDS = 160


@pytest.mark.parametrize("block", range(4))
def test_random_faults_keep_the_group_safe_and_live(block: int) -> None:
    run_block(run_seed, block, 4, QUICK_SEEDS)


@pytest.mark.slow
@pytest.mark.timeout(0)  # thousands of seeds: the suite-wide 300 s bound would cut them
def test_random_faults_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS seeds after the quick ones."""
    run_many(run_seed, QUICK_SEEDS, seeds_from_env(20_000), SimulationFailure)


def test_replay() -> None:
    replay(run_seed)


def test_a_coordinator_that_assigns_before_release_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without revoke-before-assign a partition is handed out while its owner still has it.
    monkeypatch.setattr(GroupCoordinator, "_owned_by_others", lambda self, member: set())
    assert "listed under" in first_failure(run_seed, 50, SimulationFailure)


def test_a_coordinator_that_accepts_stale_commits_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # Accepting a commit from an older epoch lets a consumer that lost a partition
    # overwrite its new owner's position.
    monkeypatch.setattr(GroupCoordinator, "_validate_commit", lambda self, req: 0)
    assert "accepted" in first_failure(run_seed, 100, SimulationFailure)


def test_records_that_miss_a_change_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    # The replayed group must equal the live one: a record kind that is not applied
    # (here the target's epoch) shows as a difference.
    original = GroupCoordinator.replay

    def drops_target_epoch(self: GroupCoordinator, record: object) -> None:
        if not isinstance(record, TargetAssignmentMetadataRecord):
            original(self, record)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupCoordinator, "replay", drops_target_epoch)
    assert "replayed records" in first_failure(run_seed, 10, SimulationFailure)
