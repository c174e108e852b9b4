"""Simulated time: a clock that only moves when the scheduler runs the next event."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field


class SimClock:
    """The only clock in a simulation. Cores get `now_ms` from it through their driver."""

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms = start_ms


@dataclass(order=True, slots=True)
class _Event:
    at_ms: int
    seq: int  # ties run in scheduling order, so a seed always replays identically
    callback: Callable[[], None] = field(compare=False)
    label: str = field(compare=False, default="")


class Scheduler:
    """A priority queue of callbacks keyed by simulated time."""

    def __init__(self, clock: SimClock, max_pending_events: int = 1_000_000) -> None:
        self.clock = clock
        self.max_pending_events = max_pending_events
        self._queue: list[_Event] = []
        self._seq = 0
        self.events_run = 0

    def at(self, at_ms: int, callback: Callable[[], None], label: str = "") -> None:
        if len(self._queue) >= self.max_pending_events:
            raise RuntimeError(f"more than {self.max_pending_events} pending events")
        self._seq += 1
        heapq.heappush(
            self._queue, _Event(max(at_ms, self.clock.now_ms), self._seq, callback, label)
        )

    def after(self, delay_ms: int, callback: Callable[[], None], label: str = "") -> None:
        self.at(self.clock.now_ms + delay_ms, callback, label)

    def run_until(self, until_ms: int, after_each: Callable[[], None] | None = None) -> None:
        """Run events due at or before `until_ms`, calling `after_each` after every one."""
        while self._queue and self._queue[0].at_ms <= until_ms:
            event = heapq.heappop(self._queue)
            self.clock.now_ms = event.at_ms
            event.callback()
            self.events_run += 1
            if after_each is not None:
                after_each()
        self.clock.now_ms = max(self.clock.now_ms, until_ms)
