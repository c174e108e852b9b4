"""ReplicaManager's produce and fetch entry points, called directly as the handlers call
them: ``append_records`` and ``fetch_messages`` take decoded per-partition inputs and
answer with typed per-partition results (the handlers only decode and encode)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import cast

import pytest
from helpers import stamped
from test_replication_checkpoint import broker_config

from rillet.broker.link.alter_partition_manager import Proposal
from rillet.broker.replica import LogStorage
from rillet.broker.replica_fetch import FetchParams, FetchPartition
from rillet.broker.replica_manager import AppendResult, ReplicaManager
from rillet.broker.replication.fetcher import FetcherManager, SourceFetcher
from rillet.broker.replication.types import AlterPartitionResponse, AppendFetched
from rillet.client.runtime.looplag import HeapFreezer
from rillet.client.wire import errors, records
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    Endpoint,
    MetadataDelta,
    MetadataImage,
    Partition,
    RegisterBroker,
    Topic,
    TopicPartition,
    UnfenceBroker,
)
from rillet.controller.metadata.quorum import ControllerConfig, QuorumController
from rillet.storage import Log, LogConfig, LogManager, retention

E = errors.code_of
TP = TopicPartition("t", 0)


async def commit(manager: ReplicaManager, image: MetadataImage, recs: list) -> MetadataImage:
    delta = MetadataDelta(image)
    delta.replay_all(recs, image.offset + 1, 1)
    image = delta.apply()
    await manager.on_metadata(delta, image)
    return image


async def register(manager: ReplicaManager) -> tuple[QuorumController, MetadataImage]:
    """Broker 1 registered and unfenced, through a controller's own record making."""
    quorum = QuorumController(ControllerConfig())
    image = EMPTY_IMAGE
    reg = quorum.register_broker(image, 1, "inc", [("BROKER", "h", 1)], None, 0)
    image = await commit(manager, image, reg.records)
    epoch = reg.response.broker_epoch
    beat = quorum.broker_heartbeat(image, 1, epoch, image.offset, False, False, 0)
    return quorum, await commit(manager, image, beat.records)


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[ReplicaManager]:
    """Broker 1 leads ``t-0``, its only replica."""
    logs = LogManager(tmp_path)
    logs.startup()
    manager = ReplicaManager(broker_config(tmp_path), logs)
    quorum, image = await register(manager)
    image = await commit(manager, image, quorum.create_topics(image, [("t", 1, 1, {})]).records)
    assert manager.replicas[TP].is_leader
    yield manager
    await manager.shutdown()
    logs.close()


def batch(*values: bytes) -> memoryview:
    return memoryview(bytearray(records.encode_batch(list(values), timestamp_ms=1000)))


async def test_append_records_answers_each_partition_in_request_order(
    manager: ReplicaManager,
) -> None:
    results = await manager.append_records(
        [(TP, batch(b"a", b"b")), (TopicPartition("nope", 0), batch(b"x")), (TP, batch(b"c"))],
        acks=1,
        timeout_ms=1000,
    )
    assert results == [
        AppendResult("t", 0, errors.NONE, base_offset=0, log_start_offset=0),
        AppendResult("nope", 0, E("UNKNOWN_TOPIC_OR_PARTITION")),
        AppendResult("t", 0, errors.NONE, base_offset=2, log_start_offset=0),
    ]


async def test_append_records_acks_all_waits_for_the_high_watermark(
    manager: ReplicaManager,
) -> None:
    (result,) = await manager.append_records([(TP, batch(b"a"))], acks=-1, timeout_ms=1000)
    assert result.error_code == errors.NONE and result.base_offset == 0
    assert manager.replicas[TP].state.high_watermark == 1  # a one-replica ISR commits at once
    assert manager.replicas[TP].produce_waiters == {}


async def test_append_records_refusal_and_min_insync_replicas(manager: ReplicaManager) -> None:
    manager.replicas[TP].min_insync_replicas = 2
    (refused,) = await manager.append_records([(TP, batch(b"a"))], acks=-1, timeout_ms=1000)
    assert refused == AppendResult("t", 0, E("NOT_ENOUGH_REPLICAS"), log_start_offset=0)
    (bad,) = await manager.append_records([(TP, batch(b"a"))], acks=2, timeout_ms=1000)
    assert bad.error_code == E("INVALID_REQUIRED_ACKS")
    assert manager.replicas[TP].log.log_end_offset == 0  # neither was written


async def test_fetch_messages_returns_a_byte_range_per_partition(manager: ReplicaManager) -> None:
    await manager.append_records([(TP, batch(b"a", b"b"))], acks=1, timeout_ms=1000)
    params = FetchParams(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
    result = await manager.fetch_messages(
        params,
        [FetchPartition("t", 0, 0, -1, None, 1 << 20), FetchPartition("gone", 0, 0, -1, None, 10)],
    )
    ok, missing = result.partitions
    assert (ok.error_code, ok.high_watermark, ok.log_start_offset) == (errors.NONE, 2, 0)
    assert ok.records is not None and result.nbytes == ok.nbytes == ok.records.length > 0
    data = manager.replicas[TP].log.read_bytes(0, 1 << 20)
    assert [r.value for r in records.decode_all(data)] == [b"a", b"b"]
    assert missing.error_code == E("UNKNOWN_TOPIC_OR_PARTITION") and missing.records is None


async def test_fetch_messages_long_polls_until_an_append(manager: ReplicaManager) -> None:
    params = FetchParams(replica_id=-1, max_wait_ms=30_000, min_bytes=1, max_bytes=1 << 20)
    fetch = asyncio.ensure_future(
        manager.fetch_messages(params, [FetchPartition("t", 0, 0, -1, None, 1 << 20)])
    )
    await asyncio.sleep(0)
    assert not fetch.done()  # parked on the partition
    await manager.append_records([(TP, batch(b"a"))], acks=1, timeout_ms=1000)
    (p,) = (await fetch).partitions
    assert p.high_watermark == 1 and p.nbytes > 0


async def test_append_records_validates_every_batch_before_appending_any(
    manager: ReplicaManager,
) -> None:
    """A partition's batches in one produce are all or nothing (Kafka's LogValidator):
    a CRC-valid batch whose records do not decode refuses the good batch before it."""
    good = records.encode_batch([b"a"], timestamp_ms=1000)
    garbage = records.assemble_batch(
        b"\xc1",
        attributes=0,
        record_count=1,
        last_offset_delta=0,
        base_timestamp=0,
        max_timestamp=0,
    )
    (refused,) = await manager.append_records(
        [(TP, memoryview(bytearray(good + garbage)))], acks=1, timeout_ms=1000
    )
    assert refused.error_code == E("INVALID_RECORD")
    assert refused.error_message is not None and "batch 1" in refused.error_message
    assert manager.replicas[TP].log.log_end_offset == 0


def test_only_the_leader_validates_records(tmp_path: Path) -> None:
    """A follower stores the leader's bytes as they are: a batch the cleaner shortened
    (record count below last offset delta + 1) is refused from a producer, taken from a
    leader."""
    log = Log.open(tmp_path / "c-0", LogConfig(cleanup_policy="compact"))
    storage = LogStorage(log)
    cleaned = records.encode_batch([b"x", b"y"], [b"k1", b"k2"], offset_deltas=[0, 3])
    try:
        with pytest.raises(errors.InvalidRecordError, match="last offset delta"):
            storage.append_as_leader(memoryview(bytearray(cleaned)), 1)
        assert log.log_end_offset == 0
        storage.append_fetched(AppendFetched(0, 4), stamped(cleaned, 0, 1))
        assert log.log_end_offset == 4
    finally:
        log.close()


async def test_a_fetch_for_another_incarnation_of_the_topic_is_refused(
    manager: ReplicaManager,
) -> None:
    """A follower names its replica's topic id: a leader still holding a deleted topic
    of the same name (or already the re-created one) must not hand it records, whose
    leader epochs the new topic's restart would accept (found by replication seed 14)."""
    await manager.append_records([(TP, batch(b"a"))], acks=1, timeout_ms=1000)
    params = FetchParams(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
    topic_id = manager.replicas[TP].topic_id
    same, other = (
        await manager.fetch_messages(
            params,
            [
                FetchPartition("t", 0, 0, -1, None, 1 << 20, topic_id),
                FetchPartition("t", 0, 0, -1, None, 1 << 20, "another-incarnation"),
            ],
        )
    ).partitions
    assert same.error_code == errors.NONE and same.nbytes > 0
    assert other.error_code == E("INCONSISTENT_TOPIC_ID") and other.records is None


async def test_isr_expansions_of_many_partitions_go_in_one_alter_partition_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower's fetch of 40 partitions lets the leader expand every ISR: one
    AlterPartition request carries them all, each answer reaches its partition, a
    partition removed before the request went is left out, and the log holds one INFO
    line per request and per metadata delta, not one per partition."""
    sent: list[list[Proposal]] = []

    async def alter_partitions(batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        sent.append(list(batch))
        return [AlterPartitionResponse(0, p.new_isr, p.leader_epoch, 1) for _, p in batch]

    logs = LogManager(tmp_path)
    logs.startup()
    manager = ReplicaManager(broker_config(tmp_path), logs, alter_partitions=alter_partitions)
    endpoints = (Endpoint("BROKER", "h", 1),)
    recs: list = [RegisterBroker(b, f"inc-{b}", 1, endpoints, None) for b in (1, 2)]
    recs += [UnfenceBroker(b, 1) for b in (1, 2)]
    recs.append(Topic("t", "tid"))
    recs += [Partition("tid", p, (1, 2), (1,), 1, 0, 0) for p in range(40)]
    with caplog.at_level(logging.INFO, logger="rillet.broker"):
        await commit(manager, EMPTY_IMAGE, recs)
        params = FetchParams(replica_id=2, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20)
        wanted = [FetchPartition("t", p, 0, -1, 0, 1 << 20) for p in range(40)]
        await manager.fetch_messages(params, wanted)
        await manager.remove(TopicPartition("t", 39), delete_log=False)
        while not sent or manager.alter_partitions.queue.in_flight is not None:
            await asyncio.sleep(0)
        (batch,) = sent
        assert [tp.partition for tp, _ in batch] == list(range(39))
        assert all(p.new_isr == (1, 2) for _, p in batch)
        assert all(manager.replicas[TopicPartition("t", p)].state.isr == (1, 2) for p in range(39))
        await manager.shutdown()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert lines == [
        "metadata offset 0: leader of 40 (t-0, t-1, t-2, t-3, t-4, +35 more), follower of 0, "
        "removed 0",
        "AlterPartition: 39 partitions: 39 accepted",
    ]


async def test_new_logs_are_created_while_the_loop_keeps_running(
    manager: ReplicaManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creating a log is a mkdir and several fsyncs: created on the loop, the thousands
    of partitions of one CreateTopics held a broker's loop for about 100 s, its
    heartbeats stopped and the controller fenced it. They are created on a worker
    thread: here the creation blocks until a coroutine on the loop has run."""
    loop_ran = threading.Event()
    real_open = LogManager.open_unregistered

    def open_after_the_loop_ran(self: LogManager, *args: object, **kwargs: object) -> Log:
        assert loop_ran.wait(timeout=30), "the loop was blocked while logs were created"
        return real_open(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LogManager, "open_unregistered", open_after_the_loop_ran)

    async def on_the_loop() -> None:
        loop_ran.set()

    quorum = QuorumController(ControllerConfig())
    created = quorum.create_topics(manager.image, [("more", 20, 1, {})]).records
    asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(on_the_loop()))
    await commit(manager, manager.image, created)
    assert all(manager.replicas[TopicPartition("more", p)].is_leader for p in range(20))


def test_a_fetcher_names_a_few_added_partitions_not_all(caplog: pytest.LogCaptureFixture) -> None:
    """A follower of thousands of partitions logged each one's name in one INFO line."""
    fetcher = SourceFetcher(cast(FetcherManager, None), 2)
    with caplog.at_level(logging.INFO, logger="rillet.broker"):
        fetcher.set_partitions({TopicPartition("t", p) for p in range(3000)})
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        "fetcher from 2: now 3000 partition(s), added 3000 (t-0, t-1, t-2, t-3, t-4, +2995 more)"
    )


async def test_roles_are_taken_a_slice_per_turn_and_the_image_published_after_the_last(
    manager: ReplicaManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taking the roles of the 10,000 partitions of one CreateTopics in one go held a
    broker's loop for over a second. A task running at every loop turn sees them taken a
    slice at a time, and never sees the new image before all are taken."""
    monkeypatch.setattr("rillet.broker.replica_manager.ROLES_PER_TURN", 5)
    seen: list[tuple[int, bool]] = []  # (partitions leading, topic in the image)

    async def watch() -> None:
        while True:
            leading = sum(
                1
                for p in range(20)
                if (r := manager.replicas.get(TopicPartition("more", p))) and r.is_leader
            )
            seen.append((leading, manager.image.topic("more") is not None))
            await asyncio.sleep(0)

    quorum = QuorumController(ControllerConfig())
    created = quorum.create_topics(manager.image, [("more", 20, 1, {})]).records
    watcher = asyncio.create_task(watch())
    await commit(manager, manager.image, created)
    watcher.cancel()
    assert {5, 10, 15} <= {leading for leading, _ in seen}
    assert all(leading == 20 for leading, published in seen if published)


async def test_the_heap_is_frozen_as_logs_are_created_and_roles_taken(
    manager: ReplicaManager,
) -> None:
    """Full garbage collections over the structures of 10,000 partitions held a broker's
    loop for up to 0.9 s: the broker freezes its heap as they are built."""
    freezes: list[int] = []
    manager.heap = HeapFreezer("broker-1", threshold=5, freeze=lambda: freezes.append(1))
    quorum = QuorumController(ControllerConfig())
    created = quorum.create_topics(manager.image, [("more", 20, 1, {})]).records
    await commit(manager, manager.image, created)
    assert len(freezes) == 5  # one per 5 of the 20 logs opened, one after the 20 roles


async def test_a_tiered_topic_on_a_broker_without_the_tier_keeps_everything_local(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller cannot refuse it (it does not know broker configs): the broker
    warns once per topic, and local retention deletes nothing, since nothing is remote,
    even past total and local retention."""
    logs = LogManager(tmp_path)
    logs.startup()
    manager = ReplicaManager(broker_config(tmp_path), logs)
    assert manager.remote is None
    try:
        quorum, image = await register(manager)
        configs = {
            "remote.storage.enable": "true",
            "segment.bytes": "1024",
            "local.retention.bytes": "0",
            "retention.ms": "1",  # the batches' timestamps (1000) are long past it
        }
        with caplog.at_level(logging.WARNING, logger="rillet.broker.replica_manager"):
            created = quorum.create_topics(image, [("t", 2, 1, configs)])
            image = await commit(manager, image, created.records)
            altered = quorum.alter_topic_configs(image, "t", {"segment.ms": "60000"})
            image = await commit(manager, image, altered.records)
        warnings = [r.getMessage() for r in caplog.records if "no remote tier" in r.getMessage()]
        assert len(warnings) == 1 and "topic t " in warnings[0]
        log = manager.replicas[TP].log
        for i in range(40):
            (done,) = await manager.append_records([(TP, batch(b"x" * 100))], 1, 1000)
            assert done.error_code == errors.NONE and done.base_offset == i
        assert len(log.segments) > 3 and log.high_watermark == 40
        assert await retention.apply_retention(log, now_ms=10**12) == 0
        assert log.log_start_offset == 0 and len(log.segments) > 3
    finally:
        await manager.shutdown()
        logs.close()
