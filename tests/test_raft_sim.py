"""Seeded simulations of the Raft controller quorum (tests/sim), invariants after every event.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_raft_sim.py -k replay -s
"""

from __future__ import annotations

import os

import pytest
from sim.raft_cluster import SimulationFailure, run_seed, seeds_from_env

# make test: each seed is ~10 s of simulated chaos then <= 20 s of healing, ~0.07 s of CPU.
QUICK_SEEDS = 320


@pytest.mark.parametrize("block", range(8))
def test_random_faults_keep_raft_safe_and_live(block: int) -> None:
    """Seeds alternate 3 and 5 voters; loss, duplication, delay, partitions, crashes."""
    per_block = QUICK_SEEDS // 8
    for seed in range(block * per_block, (block + 1) * per_block):
        run_seed(seed)


@pytest.mark.slow
def test_random_faults_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS seeds after the quick ones."""
    count = seeds_from_env(20_000)
    failures: list[str] = []
    for seed in range(QUICK_SEEDS, QUICK_SEEDS + count):
        try:
            run_seed(seed)
        except SimulationFailure as exc:
            failures.append(str(exc))
            if len(failures) >= 3:
                break
    assert not failures, "\n\n".join(failures)


def test_replay() -> None:
    """Replays RILLET_SIM_SEED with the whole trace echoed (-s to see it)."""
    seed = os.environ.get("RILLET_SIM_SEED")
    if seed is None:
        pytest.skip("set RILLET_SIM_SEED=<seed> to replay one simulation")
    run_seed(int(seed), echo_trace=True)
