"""Seeded simulations of the Raft controller quorum (tests/sim), invariants after every event.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_raft_sim.py -k replay -s
"""

from __future__ import annotations

import pytest
from sim.raft_cluster import SimulationFailure, run_seed
from sim.seeds import replay, run_block, run_many, seeds_from_env

# make test: each seed is ~10 s of simulated chaos then <= 20 s of healing, ~0.07 s of CPU.
QUICK_SEEDS = 320


@pytest.mark.parametrize("block", range(8))
def test_random_faults_keep_raft_safe_and_live(block: int) -> None:
    """Seeds alternate 3 and 5 voters; loss, duplication, delay, partitions, crashes."""
    run_block(run_seed, block, 8, QUICK_SEEDS)


@pytest.mark.slow
def test_random_faults_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS seeds after the quick ones."""
    run_many(run_seed, QUICK_SEEDS, seeds_from_env(20_000), SimulationFailure)


def test_replay() -> None:
    """Replays RILLET_SIM_SEED with the whole trace echoed (-s to see it)."""
    replay(run_seed)
