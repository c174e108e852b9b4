"""LoopLagMonitor: lateness of a periodic wake-up becomes max, histogram and warnings."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from rillet.client.runtime.looplag import HeapFreezer, LoopLagMonitor


class FakeTime:
    """A clock and a sleep: each sleep takes its interval plus the next scripted stall."""

    def __init__(self, stalls_ms: list[float]) -> None:
        self.now = 0.0
        self.stalls_ms = list(stalls_ms)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if not self.stalls_ms:
            raise asyncio.CancelledError
        self.now += seconds + self.stalls_ms.pop(0) / 1000


def test_lateness_is_recorded_as_max_histogram_and_stalls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeTime([0, 3, 40, 350, 7])
    monitor = LoopLagMonitor(
        "node-1", interval_ms=50, warn_ms=200, clock=fake.clock, sleep=fake.sleep
    )
    with caplog.at_level(logging.WARNING), pytest.raises(asyncio.CancelledError):
        asyncio.run(monitor.run())
    snap = monitor.snapshot()
    assert snap["loop_lag_max_ms"] == pytest.approx(350, abs=0.1)
    assert snap["loop_lag_samples"] == 5
    assert snap["loop_stalls"] == 1
    buckets = snap["loop_lag_buckets_ms"]
    assert isinstance(buckets, dict)
    assert buckets["5"] == 2 and buckets["10"] == 1 and buckets["50"] == 1 and buckets["500"] == 1
    stalls = [r for r in caplog.records if "stalled" in r.getMessage()]
    assert len(stalls) == 1 and "350 ms" in stalls[0].getMessage()


def test_a_stall_warning_names_what_the_loop_was_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> str | None:
        monitor = LoopLagMonitor("node-1")
        monitor.start()
        stack = monitor.loop_stack()  # taken on the loop thread itself: this coroutine
        monitor.stop()
        return stack

    stack = asyncio.run(main())
    assert stack is not None and "main" in stack
    monitor = LoopLagMonitor("node-1", warn_ms=100)
    with caplog.at_level(logging.WARNING):
        monitor.observe(250, stack)
    assert "the loop was running" in caplog.text and "in main" in caplog.text


def test_garbage_collection_on_the_loop_thread_is_timed_and_named_in_a_stall(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> LoopLagMonitor:
        monitor = LoopLagMonitor("node-1")
        monitor.start()
        gc.collect()
        monitor.stop()
        return monitor

    monitor = asyncio.run(main())
    assert monitor.gc_max_ms > 0 and monitor.snapshot()["gc_max_ms"] == round(monitor.gc_max_ms, 1)
    assert monitor._on_gc not in gc.callbacks
    with caplog.at_level(logging.WARNING):
        monitor.observe(300, None, gc_ms=250)
    assert "300 ms (250 ms collecting garbage)" in caplog.text


def test_a_stall_reports_the_stack_sampled_most_often_and_its_share() -> None:
    monitor = LoopLagMonitor("node-1")
    monitor._samples = {"stack a": 3, "stack b": 1}
    assert monitor._most_sampled() == "(in 3 of 4 samples)\nstack a"
    assert monitor._most_sampled() is None  # the next stall starts afresh


def test_the_heap_is_frozen_once_enough_state_was_added_and_counting_restarts() -> None:
    frozen: list[int] = []
    freezer = HeapFreezer("node-1", threshold=1000, freeze=lambda: frozen.append(1))
    freezer.grew(600)
    assert frozen == []
    freezer.grew(400)
    assert frozen == [1]
    freezer.grew(999)
    assert frozen == [1]
    freezer.grew(5000)
    assert frozen == [1, 1] and freezer.freezes == 2
