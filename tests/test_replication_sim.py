"""Seeded simulations of partition replication (tests/sim/replication_cluster.py): the real
PartitionState on three brokers and the real QuorumController, with loss, delay,
duplication, isolation, crashes and restarts; invariants after every event.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_replication_sim.py -k replay -s
"""

from __future__ import annotations

import os

import pytest
from sim.replication_cluster import SimulationFailure, run_seed, seeds_from_env

QUICK_SEEDS = 200  # make test: ~0.06 s of CPU per seed (8 s simulated chaos, then healing)


@pytest.mark.parametrize("block", range(4))
def test_random_faults_keep_committed_records_and_the_hw(block: int) -> None:
    per_block = QUICK_SEEDS // 4
    for seed in range(block * per_block, (block + 1) * per_block):
        run_seed(seed)


@pytest.mark.slow
def test_random_faults_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS seeds after the quick ones."""
    count = seeds_from_env(2000)
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
