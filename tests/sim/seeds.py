"""Running simulator seeds, the same way for every simulated core: a bounded block per
test in `make test`, thousands in `make sim-long`, one seed replayed with its trace."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

import pytest

RunSeed = Callable[..., object]


def seeds_from_env(default_count: int) -> int:
    return int(os.environ.get("RILLET_SIM_SEEDS", default_count))


def run_block(run_seed: RunSeed, block: int, blocks: int, quick_seeds: int) -> None:
    """Seeds of one ``block`` of ``blocks`` (parametrized tests keep each test short)."""
    per_block = quick_seeds // blocks
    for seed in range(block * per_block, (block + 1) * per_block):
        run_seed(seed)


def run_many(
    run_seed: RunSeed, first: int, count: int, failure: type[BaseException], max_failures: int = 3
) -> None:
    """``count`` seeds from ``first``, collecting up to ``max_failures`` reports."""
    failures: list[str] = []
    for seed in range(first, first + count):
        try:
            run_seed(seed)
        except failure as exc:
            failures.append(str(exc))
            if len(failures) >= max_failures:
                break
    assert not failures, "\n\n".join(failures)


def first_failure(
    run_seed: RunSeed, count: int, failure: type[BaseException] = AssertionError
) -> str:
    """The report of the first of seeds 0..``count`` that fails (a known-bad variant of
    a production class patched in must be caught by one)."""
    for seed in range(count):
        try:
            run_seed(seed)
        except failure as exc:
            return str(exc)
    raise AssertionError(f"no seed of {count} caught the bad variant")


def first_failure_matching(
    run_seed: RunSeed, seeds: Iterable[int], failure: type[BaseException], pattern: str
) -> str:
    """The report of the first of ``seeds`` that fails with ``pattern`` (a known-bad
    variant must be caught by one, the way the test names): seeds that pass, or fail
    another way first, are passed over. A short search rather than one pinned seed,
    which any change of byte sizes, draws or timing reschedules."""
    for seed in seeds:
        try:
            run_seed(seed)
        except failure as exc:
            if re.search(pattern, str(exc)):
                return str(exc)
    raise AssertionError(f"no seed of {seeds} failed with {pattern!r}")


def replay(run_seed: RunSeed) -> None:
    """Replays RILLET_SIM_SEED with the whole trace echoed (-s to see it)."""
    seed = os.environ.get("RILLET_SIM_SEED")
    if seed is None:
        pytest.skip("set RILLET_SIM_SEED=<seed> to replay one simulation")
    run_seed(int(seed), echo_trace=True)
