"""The high-watermark checkpoint survives a shutdown that cancels the periodic writer
while its executor thread is still writing (broker/replica_manager.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest

from rillet.broker.config import BrokerConfig, broker_config_table
from rillet.broker.replica_manager import ReplicaManager
from rillet.broker.replication import hw_checkpoint
from rillet.controller.metadata.image import TopicPartition
from rillet.storage import LogManager


def broker_config(log_dir: Path) -> BrokerConfig:
    values = broker_config_table().load(
        None, ["node.id=1", "listeners=BROKER://127.0.0.1:0", f"log.dirs={log_dir}"]
    )
    return BrokerConfig.from_config(values)


async def test_cancelled_periodic_checkpoint_does_not_race_the_final_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = LogManager(tmp_path)
    logs.startup()
    manager = ReplicaManager(broker_config(tmp_path), logs)
    tp = TopicPartition("t", 0)
    logs.get_or_create("t", 0, logs.default_config)  # held here, not reopened by metadata
    real_write = hw_checkpoint.write
    first_started, release_first = threading.Event(), threading.Event()
    writes: list[dict[TopicPartition, int]] = []

    def write(log_dir: Path, entries: dict[TopicPartition, int]) -> None:
        if not writes:
            writes.append(entries)
            first_started.set()
            release_first.wait(10)  # the periodic writer's thread, still busy
        else:
            writes.append(entries)
        real_write(log_dir, entries)

    monkeypatch.setattr(hw_checkpoint, "write", write)
    manager._checkpointed_hw = {tp: 5}  # what the periodic write saves
    loop = asyncio.get_running_loop()
    periodic = asyncio.ensure_future(manager.checkpoint_high_watermarks())
    await loop.run_in_executor(None, first_started.wait, 10)
    periodic.cancel()  # shutdown cancels the periodic task mid-write
    manager._checkpointed_hw = {tp: 7}  # the final checkpoint has newer HWs
    final = asyncio.ensure_future(manager.checkpoint_high_watermarks())
    await asyncio.sleep(0)
    # The final write must wait for the cancelled one's thread, not write beside it.
    assert len(writes) == 1
    release_first.set()
    with contextlib.suppress(asyncio.CancelledError):
        await periodic
    await final  # no FileNotFoundError from a temp file renamed under it
    assert [w[tp] for w in writes] == [5, 7]
    assert hw_checkpoint.read(tmp_path) == {tp: 7}
    logs.close()


async def test_a_deleted_partition_leaves_the_checkpoint_before_its_log_goes(
    tmp_path: Path,
) -> None:
    """Found by the replication simulator (seed 111): a broker saw the topic deleted and
    re-created, fetched a few records of the new topic, and crashed before its next
    periodic checkpoint; restarted, it took the deleted topic's checkpointed HW (47) for
    the new log (clamped to its end, 7) and claimed records as committed that were not,
    so its HW later went back. Removing a log must first rewrite the checkpoint."""
    logs = LogManager(tmp_path)
    logs.startup()
    manager = ReplicaManager(broker_config(tmp_path), logs)
    tp = TopicPartition("t", 0)
    logs.get_or_create("t", 0, logs.default_config)
    manager._checkpointed_hw = {tp: 47}
    await manager.checkpoint_high_watermarks()
    assert hw_checkpoint.read(tmp_path) == {tp: 47}
    await manager.remove(tp, delete_log=True)
    # Crash now: whatever log of that name comes next must not find the old HW on disk.
    assert hw_checkpoint.read(tmp_path) == {}


async def test_deleting_many_partitions_rewrites_the_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted topic's partitions leave the checkpoint in one write, made before any
    of their logs goes (one fsynced rewrite per partition delayed applying metadata)."""
    logs = LogManager(tmp_path)
    logs.startup()
    manager = ReplicaManager(broker_config(tmp_path), logs)
    tps = [TopicPartition("t", p) for p in range(20)]
    for tp in [*tps, TopicPartition("u", 0)]:  # u-0 stays
        logs.get_or_create(tp.topic, tp.partition, logs.default_config)
    manager._checkpointed_hw = {tp: 5 for tp in tps} | {TopicPartition("u", 0): 3}
    writes: list[dict[TopicPartition, int]] = []
    real_write = hw_checkpoint.write

    def counting_write(data_dir, entries) -> None:
        assert all(logs.get(tp.topic, tp.partition) is not None for tp in tps)
        writes.append(dict(entries))
        real_write(data_dir, entries)

    monkeypatch.setattr(hw_checkpoint, "write", counting_write)
    await manager.remove_many(tps, delete_log=True)
    assert writes == [{TopicPartition("u", 0): 3}]
    assert all(logs.get(tp.topic, tp.partition) is None for tp in tps)
    assert hw_checkpoint.read(tmp_path) == {TopicPartition("u", 0): 3}
