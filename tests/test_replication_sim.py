"""Seeded simulations of partition replication (tests/sim/replication_cluster.py): the real
PartitionState on three brokers, a quorum of three Raft controllers running the real
controller state machine and handlers (tests/sim/controller_quorum.py), each node on a
drifting clock of its own, with loss, delay, duplication, partitions, pauses, crashes and
restarts of brokers and controllers; invariants after every event.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_replication_sim.py -k replay -s
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sim.replication_cluster import SimulationFailure, run_seed
from sim.seeds import first_failure, replay, run_block, run_many, seeds_from_env
from test_raft_sim import sends_before_persisting

from rillet.broker.replication.driver import PartitionDriver
from rillet.broker.replication.types import Effect, Truncate
from rillet.controller.raft.driver import RaftDriver

# make test: ~0.16 s of CPU per seed (8 s of simulated chaos, then healing).
QUICK_SEEDS = 64


@pytest.mark.parametrize("block", range(4))
def test_random_faults_keep_committed_records_and_the_hw(block: int) -> None:
    run_block(run_seed, block, 4, QUICK_SEEDS)


@pytest.mark.slow
def test_random_faults_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS seeds after the quick ones."""
    run_many(run_seed, QUICK_SEEDS, seeds_from_env(2000), SimulationFailure)


def test_replay() -> None:
    """Replays RILLET_SIM_SEED with the whole trace echoed (-s to see it)."""
    replay(run_seed)


MUTANT_SEEDS = 8


def first_failing_seed() -> str:
    return first_failure(run_seed, MUTANT_SEEDS, SimulationFailure)


def test_the_simulation_runs_the_production_effect_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The brokers here run the PartitionDriver the broker's ReplicaManager runs: an
    interpreter that loses Truncate effects (a follower keeps records its leader never
    had) is caught within a few seeds that pass with the real one."""
    apply = PartitionDriver.apply

    def apply_without_truncate(
        self: PartitionDriver, effects: Sequence[Effect], fetched: object = None
    ) -> None:
        apply(self, [e for e in effects if not isinstance(e, Truncate)], fetched)

    for seed in range(MUTANT_SEEDS):
        run_seed(seed)  # the seeds pass with the real interpreter...
    monkeypatch.setattr(PartitionDriver, "apply", apply_without_truncate)
    first_failing_seed()  # ...and one of them fails with the broken one


def test_the_controllers_run_the_production_raft_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller quorum here is the Raft simulation's actors (the production
    RaftDriver and the Raft checks): a driver that sends before it persists is caught."""
    monkeypatch.setattr(RaftDriver, "ready_steps", sends_before_persisting)
    assert "not yet durable" in first_failing_seed()
