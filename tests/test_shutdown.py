"""``StopRequests`` (client/runtime/shutdown.py) in one process: how signals and the
owner's exit become a stop request and its urgency, without starting a node."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
from helpers import wait_until_async

from rillet.client.runtime import shutdown
from rillet.client.runtime.shutdown import (
    OWNER_ENV,
    StopRequests,
    owner_value,
    process_start_time,
    unless_set,
)


@pytest.fixture
async def requests(monkeypatch: pytest.MonkeyPatch):
    """A StopRequests whose "exit now" is recorded instead of ending the test process."""
    exits: list[str] = []
    monkeypatch.setattr(StopRequests, "exit_now", lambda self, why: exits.append(why))
    r = StopRequests("test node")
    r.exits = exits  # type: ignore[attr-defined]
    yield r
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    r._unwatch(loop)


@pytest.fixture
def owner():
    """A process to own the node: killed by the test, or at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


async def test_a_first_signal_asks_for_a_clean_stop_a_second_for_haste_a_third_exits(
    requests: StopRequests, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutdown, "URGENT_EXIT_S", 3600.0)  # the bound is not under test
    requests.install()
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(requests.requested.wait(), 30)
    assert requests.controlled and not requests.urgent.is_set()
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.wait_for(requests.urgent.wait(), 30)
    assert requests.exits == []  # type: ignore[attr-defined]
    os.kill(os.getpid(), signal.SIGTERM)
    await wait_until_async(lambda: requests.exits)  # type: ignore[attr-defined]


async def test_urgency_cuts_short_what_the_stop_waits_for(requests: StopRequests) -> None:
    cancelled = asyncio.Event()

    async def controlled_shutdown() -> bool:
        try:
            await asyncio.Event().wait()  # a controller that never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return True

    requests.urgent.set()
    assert await unless_set(requests.urgent, controlled_shutdown()) is None
    assert cancelled.is_set()
    assert await unless_set(None, asyncio.sleep(0, "done")) == "done"


async def test_the_owner_exiting_asks_for_a_stop_without_controlled_shutdown(
    requests: StopRequests, owner: subprocess.Popen, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OWNER_ENV, owner_value(owner.pid, process_start_time(owner.pid)))
    requests.install()
    await asyncio.sleep(0)
    assert not requests.requested.is_set()  # the owner runs
    owner.kill()
    await asyncio.wait_for(requests.requested.wait(), 30)
    assert not requests.controlled


async def test_an_owner_pid_that_is_another_process_now_counts_as_gone(
    requests: StopRequests, owner: subprocess.Popen, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = process_start_time(owner.pid)
    assert started is not None
    monkeypatch.setenv(OWNER_ENV, owner_value(owner.pid, started - 1))  # a recycled pid
    requests.install()
    await asyncio.wait_for(requests.requested.wait(), 30)
    assert not requests.controlled
