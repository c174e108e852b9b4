"""A log's roll and flush jobs against its delete (and a re-created topic at the same
path): once the close starts, no job of the old log may touch a file. A job let through
after the rename fsyncs a missing directory, which fails the log and halts the broker
(seen in a chaos run: an epoch checkpoint's fsync_dir a second after a re-create), or,
worse, writes the old log's index and checkpoints into the new log's directory."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import log_records, wait_until_async
from test_storage_topic_id import hold_first_fsync, hold_retention_step

from rillet.client.wire import records
from rillet.storage import Log, LogConfig, LogManager, checkpoints, retention
from rillet.storage import manager as manager_module

Job = tuple[Callable[[], None], Callable[[], None]]


def batch(n: int, tag: bytes) -> bytes:
    return records.encode_batch([tag + b"%04d" % i for i in range(n)])


@pytest.mark.parametrize("recreate", [False, True], ids=["deleted", "recreated"])
async def test_a_job_queued_before_a_delete_is_a_no_op_after_it(tmp_path, recreate):
    # The background hook holds the old log's jobs (a roll's fsync, a flush by policy)
    # past its delete: they run only once the directory is gone, or holds a new log.
    jobs: list[Job] = []
    failures: list[BaseException] = []
    manager = LogManager(
        tmp_path,
        {"flush.messages": 1},
        background=lambda job, after: jobs.append((job, after)),
        on_log_failure=lambda log, exc: failures.append(exc),
    )
    await manager.start(schedule=False)
    old = manager.get_or_create("t", 0, topic_id="id-A")
    old.append(batch(5, b"old"), 7)  # a flush job (flush.messages=1)
    old.roll()  # a roll job
    old.append(batch(2, b"old"), 7)
    assert len(jobs) == 3
    await manager.delete("t", 0)
    stale, jobs[:] = list(jobs), []
    if recreate:
        new = manager.get_or_create("t", 0, topic_id="id-B")
        new.append(batch(3, b"new"), 4)  # its own flush job stays queued
    for job, after in stale:
        job()
        after()
    assert old.failure is None and not failures, failures
    if recreate:
        # Nothing of the old log landed in the new one: its epochs, its recovery point,
        # its index (a read through it finds the new records).
        assert not checkpoints.read_entries(new.directory / checkpoints.LEADER_EPOCH, 2)
        # (A fresh log writes no recovery point: absent means 0.)
        assert checkpoints.read_offset(new.directory / checkpoints.RECOVERY_POINT) in (None, 0)
        assert [r.value for r in log_records(new)] == [b"new%04d" % i for i in range(3)]
        await manager.close_async()
        manager = LogManager(tmp_path)
        manager.startup()
        again = manager.get("t", 0)
        assert [r.value for r in log_records(again)] == [b"new%04d" % i for i in range(3)]
        assert again.epochs.entries() == [(4, 0)]
    manager.close()


async def test_a_flush_running_when_a_delete_closes_the_log_finishes_first(tmp_path, monkeypatch):
    # The chaos failure: a maintenance flush of a log whose delete already waited for
    # its background work (none then) starts while the delete closes the log in the
    # executor; the close renamed the directory under the job's epoch checkpoint.
    failures: list[BaseException] = []
    manager = LogManager(tmp_path, on_log_failure=lambda log, exc: failures.append(exc))
    await manager.start(schedule=False)
    old = manager.get_or_create("t", 0, topic_id="id-A")
    old.append(batch(5, b"old"), 7)
    entered, gate = hold_first_fsync(monkeypatch, old.active_segment)
    real_close = manager_module._close_and_rename

    def close_once_flushing(log: Log, target: Path) -> None:  # the walk's flush comes first
        entered.wait(10)
        real_close(log, target)

    monkeypatch.setattr(manager_module, "_close_and_rename", close_once_flushing)
    deleting = asyncio.create_task(manager.delete("t", 0))
    await wait_until_async(lambda: old.maintenance_lock.locked())
    # The delete's wait_background found nothing; the walk's flush starts now.
    flush = asyncio.create_task(old.flush_async())
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
    # The close must wait for the job; without the gate it closes and renames the
    # directory, and the delete finishes, with the job still in its fsync.
    await wait_until_async(lambda: deleting.done() or getattr(old, "_jobs_shut", False))
    assert not deleting.done(), "the delete renamed the directory under a running flush"
    gate.set()
    await asyncio.gather(flush, deleting)
    assert old.failure is None and not failures, failures
    new = manager.get_or_create("t", 0, topic_id="id-B")
    assert not checkpoints.read_entries(new.directory / checkpoints.LEADER_EPOCH, 2)
    await manager.close_async()


def test_close_turns_later_jobs_into_no_ops(tmp_path):
    jobs: list[Job] = []
    log = Log.open(tmp_path / "t-0", background=lambda job, after: jobs.append((job, after)))
    log.append(batch(3, b"a"), 2)
    log.roll()
    log.close()
    (tmp_path / "t-0").rename(tmp_path / "gone")
    for job, after in jobs:
        job()
        after()
    assert log.failure is None
    log.flush()  # nothing to do: the close persisted everything
    assert log.failure is None


async def test_a_close_waits_for_retention_whose_round_was_cancelled(tmp_path, monkeypatch):
    # A shutdown cancels the maintenance task in retention's executor hop: the thread
    # renames on and writes the log-start checkpoint, and the lock is released at once.
    # The close must still wait for it (through wait_background), as a delete must.
    config = LogConfig(segment_bytes=200, retention_bytes=0, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", config)
    for _ in range(6):
        log.append(batch(5, b"r"), 1)
    await log.wait_background()
    log.high_watermark = log.log_end_offset
    entered, gate = hold_retention_step(monkeypatch)
    round_ = asyncio.create_task(retention.apply_retention(log))
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
    round_.cancel()
    with pytest.raises(asyncio.CancelledError):
        await round_
    assert not log.maintenance_lock.locked()
    waiting = asyncio.create_task(log.wait_background())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done(), "wait_background missed retention's executor step"
    gate.set()
    await waiting
    await log.close_async()
    assert log.failure is None
