"""A partition directory records the topic id it belongs to (Kafka's partition.metadata).

Logs are found by directory name, and a topic deleted and re-created under the same name
has the same directory name. Without the id, a broker that was down during the delete
reuses the dead topic's records at overlapping offsets (issue 11, finding 3).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import log_records, wait_until_async

from rillet.client.wire import records
from rillet.storage import InvariantError, LogManager, checkpoints, retention
from rillet.storage.manager import DELETE_SUFFIX
from rillet.storage.segment import LogSegment

SMALL = {"segment.bytes": 1024, "retention.bytes": 0, "file.delete.delay.ms": 0}


def queued_on(lock: asyncio.Lock) -> bool:
    """Some task waits for ``lock`` (asyncio keeps its waiters in ``_waiters``)."""
    return bool(lock._waiters)


def hold_retention_step(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold retention's executor step (renames, log-start checkpoint) until ``gate`` is
    set; ``entered`` is set once a thread is in it."""
    entered, gate = threading.Event(), threading.Event()
    real = retention._rename_and_checkpoint

    def held(log, gone, start):  # widens the executor hop's window
        entered.set()
        gate.wait(10)
        real(log, gone, start)

    monkeypatch.setattr(retention, "_rename_and_checkpoint", held)
    return entered, gate


def hold_first_fsync(
    monkeypatch: pytest.MonkeyPatch, seg: LogSegment
) -> tuple[threading.Event, threading.Event]:
    """Hold the first fsync of ``seg`` (a flush job's first step) until ``gate`` is set;
    ``entered`` is set once a thread is in it."""
    entered, gate = threading.Event(), threading.Event()
    real_fsync = LogSegment.fsync

    def held(self: LogSegment) -> None:  # widens the window of the job's first step
        if self is seg and not entered.is_set():
            entered.set()
            gate.wait(10)
        real_fsync(self)

    monkeypatch.setattr(LogSegment, "fsync", held)
    return entered, gate


def batch(n: int, tag: bytes = b"r") -> bytes:
    return records.encode_batch([tag + b"%04d" % i for i in range(n)])


def test_first_open_records_the_topic_id_durably(tmp_path):
    manager = LogManager(tmp_path)
    manager.startup()
    log = manager.get_or_create("t", 0, topic_id="id-A")
    assert checkpoints.read_topic_id(log.directory) == "id-A"
    assert (log.directory / checkpoints.PARTITION_METADATA).read_text() == (
        "version: 0\ntopic_id: id-A\n"
    )
    manager.close()


async def test_a_log_of_a_deleted_topic_is_not_reused_for_its_successor(tmp_path):
    manager = LogManager(tmp_path)
    manager.startup()
    old = manager.get_or_create("t", 0, topic_id="id-A")
    old.append(batch(5, b"old"), 1)
    manager.close()
    # The broker was down while "t" was deleted and re-created with a new id.
    manager = LogManager(tmp_path)
    await manager.start(schedule=False)
    assert manager.get("t", 0).log_end_offset == 5  # opened by name at start-up
    assert manager.is_stale("t", 0, "id-B") and not manager.is_stale("t", 0, "id-A")
    with pytest.raises(InvariantError, match="belongs to topic id id-A"):
        manager.get_or_create("t", 0, topic_id="id-B")  # never handed out under id-B
    await manager.delete("t", 0)
    new = manager.get_or_create("t", 0, topic_id="id-B")
    assert (new.log_start_offset, new.log_end_offset) == (0, 0)
    assert checkpoints.read_topic_id(new.directory) == "id-B"
    new.append(batch(3, b"new"), 4)
    assert [r.value for r in log_records(new)] == [b"new%04d" % i for i in range(3)]
    assert not list(tmp_path.glob(f"*{DELETE_SUFFIX}"))  # the old dir is gone
    await manager.close_async()
    manager = LogManager(tmp_path)  # and it stays the new topic's after a restart
    manager.startup()
    again = manager.get_or_create("t", 0, topic_id="id-B")
    assert [r.value for r in log_records(again)] == [b"new%04d" % i for i in range(3)]
    manager.close()


async def test_delete_waits_for_retention_in_flight(tmp_path, monkeypatch):
    # Retention holds the log across an executor hop (renaming segment files by path).
    # A delete arriving meanwhile must wait for it: a new log created at the same path
    # right after the delete would otherwise have its files renamed by the old job.
    manager = LogManager(tmp_path, SMALL)
    await manager.start(schedule=False)
    old = manager.get_or_create("t", 0, topic_id="id-A")
    for _ in range(30):
        old.append(batch(5, b"old"), 1)
    await old.wait_background()
    entered, gate = hold_retention_step(monkeypatch)
    task = asyncio.create_task(retention.apply_retention(old))
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
    deleting = asyncio.create_task(manager.delete("t", 0))
    await wait_until_async(lambda: deleting.done() or queued_on(old.maintenance_lock))
    assert not deleting.done(), "the delete went ahead while retention held the log"
    gate.set()
    await task
    await deleting
    new = manager.get_or_create("t", 0, topic_id="id-B")
    new.append(batch(3, b"new"), 4)
    await manager.close_async()
    manager = LogManager(tmp_path, SMALL)
    manager.startup()
    again = manager.get_or_create("t", 0, topic_id="id-B")
    assert [r.value for r in log_records(again)] == [b"new%04d" % i for i in range(3)]
    manager.close()


async def test_delete_waits_for_a_flush_in_flight(tmp_path, monkeypatch):
    # A maintenance flush (flush_async) of the old log is in its executor job, which
    # writes the leader epochs and the recovery point by path; the new log at the same
    # path must not receive them.
    manager = LogManager(tmp_path)
    await manager.start(schedule=False)
    old = manager.get_or_create("t", 0, topic_id="id-A")
    old.append(batch(5, b"old"), 7)
    entered, gate = hold_first_fsync(monkeypatch, old.active_segment)
    flush = asyncio.create_task(old.flush_async())
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
    deleting = asyncio.create_task(manager.delete("t", 0))
    # The delete takes the maintenance lock, then waits for the tracked flush job.
    await wait_until_async(lambda: deleting.done() or old.maintenance_lock.locked())
    assert not deleting.done(), "the delete went ahead while a flush was writing"
    assert old._pending, "the flush job is not tracked as background work"
    gate.set()
    await asyncio.gather(flush, deleting)
    new = manager.get_or_create("t", 0, topic_id="id-B")
    assert not checkpoints.read_entries(new.directory / checkpoints.LEADER_EPOCH, 2)
    # A new log writes no recovery point: missing, it reads as 0 at the next open.
    assert (checkpoints.read_offset(new.directory / checkpoints.RECOVERY_POINT) or 0) == 0
    await manager.close_async()


def test_a_log_from_before_topic_ids_adopts_the_first_id(tmp_path):
    # Directories written before this file existed carry no id: keep their records.
    manager = LogManager(tmp_path)
    manager.startup()
    manager.get_or_create("t", 0).append(batch(5), 1)
    (tmp_path / "t-0" / checkpoints.PARTITION_METADATA).unlink(missing_ok=True)
    manager.close()
    manager = LogManager(tmp_path)
    manager.startup()
    log = manager.get_or_create("t", 0, topic_id="id-A")
    assert log.log_end_offset == 5
    assert checkpoints.read_topic_id(log.directory) == "id-A"
    manager.close()


@pytest.mark.parametrize("text", ["", "garbage", "version: 9\ntopic_id: x\n", "version: 0\n"])
def test_an_unreadable_partition_metadata_file_reads_as_missing(tmp_path, text):
    (tmp_path / checkpoints.PARTITION_METADATA).write_text(text)
    assert checkpoints.read_topic_id(tmp_path) is None
