"""Event-loop lag: how late a task that sleeps a fixed interval wakes up.

Every node runs one event loop for its RPC handlers, Raft timers and heartbeats, so one
callback that holds the loop for a second delays all of them: a controller that stalls
longer than the election timeout loses its quorum, a broker that stalls longer than the
session timeout is fenced. ``LoopLagMonitor`` measures it: a task sleeps ``interval_ms``
and records how much later than that it woke (the *lag*, which is the longest stretch
some other callback held the loop in that interval, near enough). It keeps the largest
lag seen and a histogram, and logs a WARNING for a lag over ``warn_ms``.

Logging *what* held the loop is what makes the warning useful, and a sleeping task only
learns of the stall after it ended. So a watchdog thread (``watchdog=True``) checks every
``interval_ms`` whether the loop task is overdue by more than ``warn_ms`` and, while it
is, samples the loop thread's current Python stack (``sys._current_frames``: cheap, no
tracing); the WARNING then carries the stack seen most often during the stall, with its
share of the samples (a poor man's profile: a long stall is rarely one call). Outside a
stall the thread only reads a timestamp, so it costs nothing measurable; it is a daemon
and stops with the monitor.

A stall can also come from the cyclic garbage collector, which runs inside whatever
allocation triggered it (often in C, where the stack shows nothing): a ``gc.callbacks``
hook times every collection, and a stall warning says how much of it was collection.

``HeapFreezer`` shortens those collections. A full (generation 2) collection walks every
tracked object, so with the structures of thousands of partitions it took 0.5 to 0.9 s
on a broker. Once a node has added a lot of long-lived state (a broker taking on
thousands of partitions, a controller applying thousands of records) it calls
``gc.freeze()``, which moves every object alive then out of the collector's sight: later
collections walk only what was allocated since. The price: a cycle among frozen objects
that later becomes garbage is never collected (plain reference counting still frees
everything else, which is nearly all of it), so it freezes only after growth.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import logging
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

# Upper bounds in milliseconds; the last bucket counts everything above the last bound.
LAG_BUCKETS_MS = (5, 10, 25, 50, 100, 200, 500, 1000, 2000, 5000)


class LoopLagMonitor:
    def __init__(
        self,
        name: str,
        *,
        interval_ms: int = 50,
        warn_ms: int = 200,
        watchdog: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.name = name
        self.interval_ms = interval_ms
        self.warn_ms = warn_ms
        self.clock = clock
        self.sleep = sleep
        self.max_lag_ms = 0.0
        self.samples = 0
        self.stalls = 0  # lags over warn_ms
        self.buckets = [0] * (len(LAG_BUCKETS_MS) + 1)
        self.gc_max_ms = 0.0  # the longest garbage collection seen
        self._gc_ms = 0.0  # collection time since the last wake-up
        self._gc_started: float | None = None
        self._watchdog = watchdog
        self._expected_wake = 0.0  # when the loop task should run next (clock seconds)
        self._loop_thread: int | None = None
        self._samples: dict[str, int] = {}  # stacks seen during the current stall
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    # -- measuring -----------------------------------------------------------------

    def observe(self, lag_ms: float, stack: str | None = None, gc_ms: float = 0.0) -> None:
        """Record one wake-up ``lag_ms`` late (what held the loop and how much of it was
        garbage collection, when known)."""
        lag_ms = max(lag_ms, 0.0)
        self.samples += 1
        self.max_lag_ms = max(self.max_lag_ms, lag_ms)
        self.buckets[bisect.bisect_left(LAG_BUCKETS_MS, lag_ms)] += 1
        if lag_ms > self.warn_ms:
            self.stalls += 1
            collecting = f" ({gc_ms:.0f} ms collecting garbage)" if gc_ms >= 1 else ""
            where = f"; the loop was running:\n{stack}" if stack else ""
            log.warning(
                "%s: event loop stalled for %.0f ms%s%s", self.name, lag_ms, collecting, where
            )

    def snapshot(self) -> dict[str, object]:
        """The figures as plain numbers: max, count, stalls and the histogram buckets."""
        bounds = [*(str(b) for b in LAG_BUCKETS_MS), "inf"]
        return {
            "loop_lag_max_ms": round(self.max_lag_ms, 1),
            "loop_lag_samples": self.samples,
            "loop_stalls": self.stalls,
            "gc_max_ms": round(self.gc_max_ms, 1),
            "loop_lag_buckets_ms": dict(zip(bounds, self.buckets, strict=True)),
        }

    async def run(self) -> None:
        """Sleep ``interval_ms`` over and over; each wake-up's lateness is a sample."""
        interval_s = self.interval_ms / 1000
        while True:
            start = self.clock()
            self._expected_wake = start + interval_s
            await self.sleep(interval_s)
            late_ms = (self.clock() - start - interval_s) * 1000
            stack = self._most_sampled()
            gc_ms, self._gc_ms = self._gc_ms, 0.0
            self.observe(late_ms, stack, gc_ms)

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Start measuring on the running loop (and the watchdog thread, if asked)."""
        self._loop_thread = threading.get_ident()
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self.run(), name="loop-lag")
        if self._watchdog:
            self._thread = threading.Thread(
                target=self._watch, name=f"{self.name}-loop-watchdog", daemon=True
            )
            self._thread.start()
        return self._task

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self._loop_thread:
            return  # a collection on another thread does not hold the loop
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            took_ms = (time.perf_counter() - self._gc_started) * 1000
            self._gc_started = None
            self._gc_ms += took_ms
            self.gc_max_ms = max(self.gc_max_ms, took_ms)

    def _watch(self) -> None:
        interval_s = self.interval_ms / 1000
        while not self._stop.wait(interval_s):
            overdue_ms = (self.clock() - self._expected_wake) * 1000
            if overdue_ms > self.warn_ms and self._expected_wake:
                stack = self.loop_stack()
                if stack is not None:
                    self._samples[stack] = self._samples.get(stack, 0) + 1

    def _most_sampled(self) -> str | None:
        """The stack sampled most often during the stall that just ended, and its share."""
        samples, self._samples = self._samples, {}
        if not samples:
            return None
        stack, count = max(samples.items(), key=lambda kv: kv[1])
        return f"(in {count} of {sum(samples.values())} samples)\n{stack}"

    def loop_stack(self) -> str | None:
        """The loop thread's Python stack right now (innermost last), or None."""
        frame = sys._current_frames().get(self._loop_thread or -1)
        if frame is None:
            return None
        return "".join(traceback.format_stack(frame, limit=12))


class HeapFreezer:
    """``gc.freeze()`` once ``threshold`` units of long-lived state (partitions, records)
    were added since the last freeze (see the module docstring)."""

    def __init__(self, name: str, threshold: int, freeze: Callable[[], None] = gc.freeze) -> None:
        self.name = name
        self.threshold = threshold
        self.freeze = freeze
        self.freezes = 0
        self._since = 0

    def grew(self, units: int) -> None:
        self._since += units
        if self._since < self.threshold:
            return
        self.freeze()
        self.freezes += 1
        log.info("%s: froze the heap after %d additions", self.name, self._since)
        self._since = 0
