"""Random fault schedules on real processes (tests/chaos.py says what runs and what is
checked). Two short schedules run in `make test`; `make chaos` runs RILLET_CHAOS_SEEDS
(default 100) longer ones; RILLET_CHAOS_SEED=N replays one, printing its schedule."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from chaos import ChaosFailure, run_seed, schedule

pytestmark = pytest.mark.cluster

SHORT_STEPS = 3
LONG_STEPS = 6


def test_a_schedule_is_fixed_by_its_seed() -> None:
    assert schedule(7, LONG_STEPS) == schedule(7, LONG_STEPS)
    kinds = {s.kind for seed in range(50) for s in schedule(seed, LONG_STEPS)}
    assert kinds == {
        "kill", "pause", "bounce", "controller", "two", "recreate", "s3-stop", "s3-pause",
        "coordinator", "consumer",
    }  # fmt: skip
    assert {s.kind for s in schedule(75, SHORT_STEPS)} == {"controller", "s3-stop", "s3-pause"}
    assert {s.kind for s in schedule(15, SHORT_STEPS)} == {"consumer", "kill", "coordinator"}


# 75: both S3 faults; 15: the group's consumer and coordinator killed (see above)
@pytest.mark.parametrize("seed", [15, 75])
def test_short_chaos_schedule(cluster_factory, seed: int) -> None:
    result = run_seed(cluster_factory, seed, SHORT_STEPS)
    assert result.violations == 0
    assert sum(result.faults.values()) == SHORT_STEPS
    assert result.acked_checked > 0
    assert result.bytes_compared > 0
    assert result.remote_records > 0  # offset 0 of the tiered topic was read from S3
    assert result.group_consumed > 0
    assert result.commit_samples > 0


@pytest.mark.slow
@pytest.mark.timeout(0)  # ~20 s a schedule: the suite-wide 300 s bound would cut it short
def test_chaos_many_seeds(cluster_factory) -> None:
    count = int(os.environ.get("RILLET_CHAOS_SEEDS", 100))
    first = int(os.environ.get("RILLET_CHAOS_FIRST", 1000))
    failures: list[str] = []
    faults: Counter[str] = Counter()
    acked = ran = duplicates = 0
    for seed in range(first, first + count):
        ran += 1
        try:
            result = run_seed(cluster_factory, seed, LONG_STEPS)
        except ChaosFailure as e:
            print(e, flush=True)  # now: a later timeout must not lose it
            failures.append(str(e))
            if len(failures) >= 3:
                break
            continue
        faults.update(result.faults)
        acked += result.acked_checked
        duplicates += result.group_duplicates
    print(
        f"chaos: {ran} schedules, {len(failures)} failed, faults {dict(faults)}, "
        f"{acked} acknowledged records checked, {duplicates} records the group consumed twice"
    )
    assert not failures, "\n\n".join(failures)


@pytest.mark.timeout(0)
def test_chaos_replay(cluster_factory) -> None:
    seed = os.environ.get("RILLET_CHAOS_SEED")
    if seed is None:
        pytest.skip("set RILLET_CHAOS_SEED=<seed> to replay one chaos schedule")
    steps = int(os.environ.get("RILLET_CHAOS_STEPS", LONG_STEPS))
    run_seed(cluster_factory, int(seed), steps, keep=True)
