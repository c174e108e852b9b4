"""Per-node clocks that drift: each node reads the simulated time through a clock of its own.

Production hands the cores monotonic clocks (``time.monotonic``, the event loop's time),
which run at slightly different rates on different machines, start from unrelated
origins and, seen from a process, leap forward when the machine is suspended or the
process is descheduled for long. A `DriftingClock` is that: simulated time scaled by a
rate near 1, plus an offset, plus the steps taken so far.

A monotonic clock never goes back, and the Raft core refuses one that does
(`RaftNode.tick` raises). The replication core and the broker's link to the controller
tolerate one, so a broker's clock may also step back here (a wall clock set back, were
one ever passed to them): safety must not depend on it.
"""

from __future__ import annotations

import random

from .scheduler import SimClock

MAX_RATE_SKEW = 0.02  # rates in [0.98, 1.02]
MAX_STEP_MS = 400


class DriftingClock:
    def __init__(self, sim: SimClock, rate: float, offset_ms: int, monotonic: bool) -> None:
        self.sim = sim
        self.rate = rate
        self.offset_ms = offset_ms
        self.monotonic = monotonic

    @classmethod
    def random(cls, sim: SimClock, rng: random.Random, monotonic: bool) -> DriftingClock:
        rate = 1 + rng.uniform(-MAX_RATE_SKEW, MAX_RATE_SKEW)
        return cls(sim, rate, rng.randint(0, 10**9), monotonic)

    def __call__(self) -> int:
        return self.offset_ms + int(self.sim.now_ms * self.rate)

    def step(self, step_ms: int) -> None:
        """The clock leaps ``step_ms`` away from where its rate would put it."""
        if step_ms < 0 and self.monotonic:
            raise ValueError("a monotonic clock does not step back")
        self.offset_ms += step_ms

    def random_step(self, rng: random.Random) -> int:
        """Mostly forward; back too, unless monotonic. Returns the step taken."""
        step_ms = rng.randint(1, MAX_STEP_MS)
        if not self.monotonic and rng.random() < 0.3:
            step_ms = -step_ms
        self.step(step_ms)
        return step_ms

    def __repr__(self) -> str:
        return f"clock(rate {self.rate:.4f}, offset {self.offset_ms} ms)"
