"""Seeded simulations of partition replication (tests/sim/replication_cluster.py): the real
PartitionState on three brokers and the real QuorumController, with loss, delay,
duplication, isolation, crashes and restarts; invariants after every event.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_replication_sim.py -k replay -s
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sim.replication_cluster import SimulationFailure, run_seed
from sim.seeds import replay, run_block, run_many, seeds_from_env

from rillet.broker.replication.driver import PartitionDriver
from rillet.broker.replication.types import Effect, Truncate

QUICK_SEEDS = 200  # make test: ~0.06 s of CPU per seed (8 s simulated chaos, then healing)


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


def test_the_simulation_runs_the_production_effect_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The brokers here run the PartitionDriver the broker's ReplicaManager runs: an
    interpreter that loses Truncate effects (a follower keeps records its leader never
    had) is caught by the very first seed."""
    apply = PartitionDriver.apply

    def apply_without_truncate(
        self: PartitionDriver, effects: Sequence[Effect], fetched: object = None
    ) -> None:
        apply(self, [e for e in effects if not isinstance(e, Truncate)], fetched)

    run_seed(0)  # the seed passes with the real interpreter...
    monkeypatch.setattr(PartitionDriver, "apply", apply_without_truncate)
    with pytest.raises(SimulationFailure):
        run_seed(0)  # ...and fails with the broken one
