"""Faults that must not leave a broker silently half-working (docs/broker.md, "Faults"):
the fatal fault handler and the background-task policies of client/runtime/tasks.py, the
metadata follower and heartbeat loop routing unexpected errors to it, the broker's own
tasks, and a real broker process exiting non-zero when applying metadata fails.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from helpers import wait_until, wait_until_async
from test_broker_inproc import FakeLink, broker_config

from rillet.broker.link.controller_client import (
    BrokerLifecycle,
    MetadataApplyError,
    MetadataFollower,
)
from rillet.broker.server import BrokerServer
from rillet.client.runtime import tasks
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, parse_address
from rillet.storage.segment import LogSegment
from rillet.tools.local_cluster import _CHILDREN


class Recorder:
    """A fatal handler that records instead of exiting."""

    def __init__(self) -> None:
        self.faults: list[tuple[str, BaseException]] = []

    def __call__(self, what: str, error: BaseException) -> None:
        self.faults.append((what, error))


@pytest.fixture
def fatal() -> Iterator[Recorder]:
    recorder = Recorder()
    previous = tasks.set_fatal_handler(recorder)
    try:
        yield recorder
    finally:
        tasks.set_fatal_handler(previous)


# -- task policies ----------------------------------------------------------------------


async def test_fatal_policy_reports_an_exception_but_not_a_cancel_or_a_return(
    fatal: Recorder,
) -> None:
    async def boom() -> None:
        raise KeyError("bug")

    async def forever() -> None:
        await asyncio.Event().wait()

    async def finish() -> None:
        return None

    failing = tasks.on_death_fatal(asyncio.create_task(boom()), "boom task")
    cancelled = tasks.on_death_fatal(asyncio.create_task(forever()), "forever task")
    finished = tasks.on_death_fatal(asyncio.create_task(finish()), "finish task")
    cancelled.cancel()
    await asyncio.gather(failing, cancelled, finished, return_exceptions=True)
    await wait_until_async(lambda: fatal.faults)
    assert [(what, type(e)) for what, e in fatal.faults] == [("boom task", KeyError)]


async def test_expected_to_end_policy_logs_the_exception_at_once(
    caplog: pytest.LogCaptureFixture, fatal: Recorder
) -> None:
    async def boom() -> None:
        raise ValueError("one-shot failed")

    task = tasks.on_death_log(asyncio.create_task(boom()), "one-shot")
    await asyncio.gather(task, return_exceptions=True)
    await wait_until_async(
        lambda: any(
            "one-shot failed" in r.getMessage()
            or (r.exc_info and "one-shot failed" in str(r.exc_info[1]))
            for r in caplog.records
        )
    )
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None
    assert fatal.faults == []


async def test_restart_policy_reruns_the_body_after_an_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    async def flaky() -> None:
        calls.append(len(calls))
        if len(calls) < 3:
            raise RuntimeError(f"failure {len(calls)}")

    await tasks.run_restarting(flaky, "flaky job", backoff_min_s=0.001, backoff_max_s=0.002)
    assert calls == [0, 1, 2]
    failures = [r for r in caplog.records if "flaky job failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)


def test_default_fatal_handler_logs_the_traceback_and_exits_non_zero() -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "from rillet.client.runtime.tasks import fatal_fault\n"
        "def apply():\n"
        "    raise RuntimeError('half-applied metadata')\n"
        "try:\n"
        "    apply()\n"
        "except RuntimeError as e:\n"
        "    fatal_fault('metadata follower: applying a batch failed', e)\n"
        "print('not reached')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == tasks.FATAL_EXIT_CODE, proc.stderr
    assert "not reached" not in proc.stdout
    assert "FATAL: metadata follower: applying a batch failed" in proc.stderr
    assert "Traceback" in proc.stderr and "half-applied metadata" in proc.stderr


# -- the metadata follower and heartbeats ------------------------------------------------


class OneBatchChannel:
    """Answers FetchMetadata with one empty entry at offset 0, then long-polls nothing;
    or raises ``fail_with`` (a fetch error) when set."""

    def __init__(self, fail_with: BaseException | None = None) -> None:
        self.fail_with = fail_with
        self.requests = 0

    async def call(self, request: m.FetchMetadataRequest, **_: Any) -> tuple[Any, memoryview]:
        self.requests += 1
        if self.fail_with is not None:
            raise self.fail_with
        response = m.FetchMetadataResponse.from_header({"high_watermark": 0})
        if request.fetch_offset == 0:
            return response, memoryview(msgpack.packb([[0, 1, b""]]))
        await asyncio.sleep(0.01)  # an empty long poll
        return response, memoryview(b"")


@pytest.mark.parametrize(
    "error", [RuntimeError("listener bug"), errors.NotLeaderOrFollowerError("a rillet error")]
)
async def test_metadata_follower_routes_a_listener_failure_to_the_fatal_handler(
    error: Exception,
) -> None:
    # Even a RilletError from the listener is fatal: the image already moved past the
    # batch, so a retried fetch would never hand it to the listener again.
    faults = Recorder()

    async def listener(delta: Any, image: Any) -> None:
        raise error

    follower = MetadataFollower(
        OneBatchChannel(),
        1,
        listener=listener,  # type: ignore[arg-type]
        on_fatal=faults,
    )
    follower.start()
    try:
        await wait_until_async(lambda: faults.faults)
    finally:
        await follower.stop()
    ((what, fault),) = faults.faults
    assert what == "metadata follower: applying a batch failed"
    assert isinstance(fault, MetadataApplyError) and fault.__cause__ is error


async def test_metadata_follower_retries_fetch_errors_without_a_fault() -> None:
    faults = Recorder()
    channel = OneBatchChannel(fail_with=errors.RequestTimedOutError("no controller"))
    follower = MetadataFollower(channel, 1, on_fatal=faults)  # type: ignore[arg-type]
    follower.start()
    try:
        await wait_until_async(lambda: channel.requests >= 3)
    finally:
        await follower.stop()
    assert faults.faults == []


async def test_an_unexpected_heartbeat_error_is_fatal(fatal: Recorder) -> None:
    class BadHeartbeats:
        async def call(self, request: Any, **_: Any) -> tuple[Any, memoryview]:
            if isinstance(request, m.BrokerRegistrationRequest):
                return m.BrokerRegistrationResponse(broker_epoch=5), memoryview(b"")
            raise KeyError("is_caught_up")  # not a RilletError: nothing the loop expects

    lifecycle = BrokerLifecycle(
        BadHeartbeats(),
        1,
        [],
        lambda: 0,  # type: ignore[arg-type]
        heartbeat_interval_ms=10,
    )
    await lifecycle.start()
    try:
        await wait_until_async(lambda: fatal.faults)
    finally:
        await lifecycle.stop()
    ((what, error),) = fatal.faults
    assert "heartbeat" in what and isinstance(error, KeyError)


async def test_a_controlled_shutdown_asks_at_once_not_at_the_next_heartbeat() -> None:
    """The heartbeat interval is 10 minutes here: only a heartbeat sent at once can carry
    the request within the shutdown's deadline."""
    heartbeats: list[m.BrokerHeartbeatRequest] = []

    class Controller:
        async def call(self, request: Any, **_: Any) -> tuple[Any, memoryview]:
            if isinstance(request, m.BrokerRegistrationRequest):
                return m.BrokerRegistrationResponse(broker_epoch=5), memoryview(b"")
            heartbeats.append(request)
            go = request.want_shut_down
            answer = m.BrokerHeartbeatResponse(True, is_fenced=go, should_shut_down=go)
            return answer, memoryview(b"")

    lifecycle = BrokerLifecycle(
        Controller(),
        1,
        [],
        lambda: 0,  # type: ignore[arg-type]
        heartbeat_interval_ms=600_000,
    )
    await lifecycle.start()
    await wait_until_async(lambda: heartbeats)
    assert await lifecycle.controlled_shutdown(deadline_ms=30_000)
    assert [h.want_shut_down for h in heartbeats] == [False, True]


# -- the broker's own tasks --------------------------------------------------------------


async def test_a_failing_replica_tick_is_fatal(
    tmp_path: Path, fatal: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = BrokerServer(broker_config(tmp_path / "logs"), link=FakeLink(1))
    await server.start()
    try:
        assert server.replicas is not None

        def broken_tick(*args: object) -> None:
            raise RuntimeError("core bug in tick")

        monkeypatch.setattr(server.replicas, "tick_replicas", broken_tick)
        await wait_until_async(lambda: fatal.faults)
    finally:
        await server.stop(controlled=False)
    ((what, error),) = fatal.faults
    assert what == "replica tick task" and "core bug in tick" in str(error)


async def test_a_failing_metrics_sample_restarts_instead_of_ending(
    tmp_path: Path, fatal: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rillet.broker.server.METRICS_SAMPLE_INTERVAL_S", 0.001)
    monkeypatch.setattr("rillet.client.runtime.tasks.RESTART_BACKOFF_MIN_S", 0.001)
    server = BrokerServer(broker_config(tmp_path / "logs"), link=FakeLink(1))
    await server.start()
    try:
        assert server.metrics is not None
        samples: list[int] = []

        def sample() -> None:
            samples.append(1)
            if len(samples) == 1:
                raise RuntimeError("metrics bug")

        monkeypatch.setattr(server.metrics, "sample", sample)
        await wait_until_async(lambda: len(samples) >= 3)  # sampled again after the failure
        metrics_task = next(t for t in server._tasks if t.get_name() == "metrics")
        assert not metrics_task.done()
    finally:
        await server.stop(controlled=False)
    assert fatal.faults == []


# -- a real broker process ---------------------------------------------------------------


@pytest.mark.cluster
async def test_a_log_that_turns_read_only_is_a_fatal_fault(
    tmp_path: Path, fatal: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kafka takes a failed log directory offline and halts the broker when none is left,
    # so the controller fences it and moves its leaderships. rillet has one log dir: a
    # log that turned read-only must not keep its leadership, refusing every produce
    # with KAFKA_STORAGE_ERROR until someone restarts the broker (issue 11, finding 6).
    link = FakeLink(1)
    server = BrokerServer(broker_config(tmp_path / "logs"), link=link)
    await server.start()
    try:
        await link.create_topic("t", 1)
        log = await wait_until_async(lambda: server.logs.get("t", 0))
        log.append(records.encode_batch([b"v"]), 0)

        def eio(self: Any) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(LogSegment, "fsync", eio)
        log.roll()  # the closed segment's background fsync fails: the log is read-only
        await wait_until_async(lambda: fatal.faults)
        ((what, error),) = fatal.faults
        assert "t-0" in what and "log directory" in what
        assert isinstance(error, OSError) and error.errno == errno.EIO
    finally:
        monkeypatch.undo()
        await server.stop(controlled=False)


def test_broker_exits_non_zero_with_the_traceback_when_applying_metadata_fails(
    cluster_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The injected fault fires on the first metadata batch holding a topic, after the
    # replica manager applied it: the node starts normally, then creating a topic kills it.
    monkeypatch.setenv("RILLET_TEST_FAULT", "metadata_apply")
    cluster = cluster_factory(controllers=1, brokers=1)
    (broker_id,) = [n.node_id for n in cluster.nodes.values() if n.is_broker]
    pid = cluster.nodes[broker_id].pid
    proc = _CHILDREN[pid]

    async def create_topic() -> None:
        conn = await Connection.open(*parse_address(cluster.broker_address(broker_id)))
        try:
            await conn.request(
                "CreateTopics", {"topics": [["doomed", 1, 1, [], {}]], "timeout_ms": 20_000}
            )
        except errors.RilletError:
            pass  # the broker may die before it answers
        finally:
            await conn.aclose()

    asyncio.run(create_topic())
    # proc.poll, not pid_alive: that reaps the child and its exit code would be lost.
    wait_until(lambda: proc.poll() is not None, message="the broker to exit")
    assert proc.returncode == tasks.FATAL_EXIT_CODE
    log = (cluster.node_dir(broker_id) / "node.log").read_text()
    assert "FATAL: metadata follower: applying a batch failed" in log
    assert "Traceback" in log and "InjectedTestFault" in log
    assert "controlled shutdown" not in log  # the state is suspect: no clean stop
