"""Consumer logic against the in-memory fake cluster: decoding, positions, seek,
prefetch bounds, leader changes, OFFSET_OUT_OF_RANGE, CRC checks; plus Admin and the
sync facade."""

from __future__ import annotations

import pytest
from test_client_fake_broker import FakeCluster

from rillet.client.admin import Admin, AdminError, NewTopic
from rillet.client.consumer import Consumer, ConsumerRecord, TopicPartition, decode_records
from rillet.client.producer import Producer
from rillet.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from rillet.client.wire import errors, records
from rillet.client.wire.errors import CorruptRecordError, OffsetOutOfRangeError


@pytest.fixture
async def fake():
    cluster = await FakeCluster(3).start()
    cluster.create("t", 3)
    yield cluster
    await cluster.stop()


async def fill(fake: FakeCluster, n: int, partition: int = 0, topic: str = "t") -> None:
    async with Producer(fake.bootstrap, batch_size=1024) as p:
        await p.send_many(topic, [b"%d" % i for i in range(n)], partition=partition)
        await p.flush()


async def consume(c: Consumer, n: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    while len(out) < n:
        for recs in (await c.getmany(timeout_ms=5000)).values():
            out += recs
    return out


def test_decode_records_skips_below_fetch_offset_and_checks_crc() -> None:
    buf = records.encode_batch([b"a", b"b", b"c"], [None, b"k", None], base_offset=10)
    recs, nxt = decode_records(TopicPartition("t", 0), memoryview(buf), 11)
    assert [(r.offset, r.key, r.value) for r in recs] == [(11, b"k", b"b"), (12, None, b"c")]
    assert nxt == 13 and isinstance(recs[0], ConsumerRecord) and recs[0].topic == "t"
    partial, nxt = decode_records(TopicPartition("t", 0), memoryview(buf + buf[:20]), 0)
    assert len(partial) == 3 and nxt == 13  # a trailing partial batch waits for later
    bad = bytearray(buf)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        decode_records(TopicPartition("t", 0), memoryview(bad), 0)


async def test_from_beginning_reads_everything_in_order(fake: FakeCluster) -> None:
    await fill(fake, 5000, partition=1)
    async with Consumer("t", bootstrap=fake.bootstrap, from_beginning=True) as c:
        recs = await consume(c, 5000)
        assert [int(r.value) for r in recs] == list(range(5000))
        assert c.position(("t", 1)) == 5000
        assert c.assignment() == {TopicPartition("t", p) for p in range(3)}


async def test_latest_skips_old_records(fake: FakeCluster) -> None:
    await fill(fake, 10)
    async with Consumer(assignment=[("t", 0)], bootstrap=fake.bootstrap) as c:
        assert c.position(("t", 0)) == 10
        await fill(fake, 3)
        assert [r.offset for r in await consume(c, 3)] == [10, 11, 12]


async def test_offsets_of_partitions_outside_the_assignment(fake: FakeCluster) -> None:
    # As Kafka's endOffsets/beginningOffsets: any partition, not only assigned ones. The
    # consumer used to look up leaders in metadata that never tracked the topic, and
    # retried until metadata_wait_ms ran out.
    await fill(fake, 7, partition=2)
    async with Consumer(assignment=[], bootstrap=fake.bootstrap, metadata_wait_ms=60_000) as c:
        assert await c.end_offsets([("t", 2), ("t", 0)]) == {
            TopicPartition("t", 2): 7,
            TopicPartition("t", 0): 0,
        }
        assert await c.beginning_offsets([("t", 2)]) == {TopicPartition("t", 2): 0}


async def test_getmany_max_records_and_seek(fake: FakeCluster) -> None:
    await fill(fake, 100)
    async with Consumer(assignment=[("t", 0)], bootstrap=fake.bootstrap, from_beginning=True) as c:
        got = await c.getmany(timeout_ms=5000, max_records=7)
        assert [r.offset for r in got[TopicPartition("t", 0)]] == list(range(7))
        assert c.position(("t", 0)) == 7
        c.seek(("t", 0), 50)
        assert (await consume(c, 1))[0].offset == 50
        await c.seek_to_beginning()
        assert (await consume(c, 1))[0].offset == 0
        await c.seek_to_end()
        assert c.position(("t", 0)) == 100


async def test_prefetch_is_bounded(fake: FakeCluster) -> None:
    await fill(fake, 20_000)
    async with Consumer(
        assignment=[("t", 0)],
        bootstrap=fake.bootstrap,
        from_beginning=True,
        max_partition_fetch_bytes=4096,
        fetch_max_wait_ms=10,
    ) as c:
        await consume(c, 1)
        await c.getmany(timeout_ms=100, max_records=1)
        assert c._buffered_chunks[TopicPartition("t", 0)] <= 2
        assert c._buffered_bytes <= 3 * 4096 + 1024


async def test_follows_a_leader_change(fake: FakeCluster) -> None:
    await fill(fake, 100)
    async with Consumer(
        assignment=[("t", 0)],
        bootstrap=fake.bootstrap,
        from_beginning=True,
        retry_backoff_ms=5,
        fetch_max_wait_ms=50,
    ) as c:
        assert len(await consume(c, 100)) == 100
        fake.move_leader("t", 0, 3)
        await fill(fake, 50)
        recs = await consume(c, 50)
        assert [r.offset for r in recs] == list(range(100, 150))


async def test_offset_out_of_range_resets_or_raises(fake: FakeCluster) -> None:
    await fill(fake, 10)
    async with Consumer(
        assignment=[("t", 0)], bootstrap=fake.bootstrap, auto_offset_reset="earliest"
    ) as c:
        c.seek(("t", 0), 1000)
        assert (await consume(c, 1))[0].offset == 0
    async with Consumer(
        assignment=[("t", 0)],
        bootstrap=fake.bootstrap,
        from_beginning=True,
        auto_offset_reset="none",
    ) as c:
        c.seek(("t", 0), 1000)
        with pytest.raises(OffsetOutOfRangeError):
            await consume(c, 1)


async def test_a_fetch_error_on_damaged_data_fails_the_consumer_a_retriable_one_retries(
    fake: FakeCluster,
) -> None:
    """As Kafka's consumer: CORRUPT_MESSAGE in a fetch answer (a broker found the data
    damaged, e.g. in its remote tier) is raised to the application, not retried forever;
    KAFKA_STORAGE_ERROR (the remote store unreachable) is retried at the same offset."""
    await fill(fake, 10)
    part = fake.topics["t"][0]
    part.fetch_inject = [errors.code_of("KAFKA_STORAGE_ERROR")] * 2
    async with Consumer(
        assignment=[("t", 0)], bootstrap=fake.bootstrap, from_beginning=True, retry_backoff_ms=5
    ) as c:
        assert [r.offset for r in await consume(c, 10)] == list(range(10))
        assert part.fetch_inject == []
    part.fetch_inject = [errors.code_of("CORRUPT_MESSAGE")]
    async with Consumer(
        assignment=[("t", 0)], bootstrap=fake.bootstrap, from_beginning=True, retry_backoff_ms=5
    ) as c:
        with pytest.raises(CorruptRecordError):
            await consume(c, 1)


async def test_async_iteration(fake: FakeCluster) -> None:
    await fill(fake, 30, partition=2)
    async with Consumer(assignment=[("t", 2)], bootstrap=fake.bootstrap, from_beginning=True) as c:
        seen = []
        async for r in c:
            seen.append(r.offset)
            if len(seen) == 30:
                break
    assert seen == list(range(30))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Consumer()
    with pytest.raises(ValueError):
        Consumer("t", assignment=[("t", 0)])
    with pytest.raises(ValueError):
        Consumer("t", auto_offset_reset="middle")


async def test_admin_topics_and_cluster(fake: FakeCluster) -> None:
    async with Admin(fake.bootstrap) as a:
        await a.create_topics([NewTopic("new", 4, 2, {"retention.ms": "1000"})])
        assert "new" in await a.list_topics()
        (desc,) = await a.describe_topics(["new"])
        assert len(desc.partitions) == 4 and desc.replication_factor == 2
        with pytest.raises(AdminError, match="TOPIC_ALREADY_EXISTS"):
            await a.create_topics([NewTopic("new", 1, 1)])
        with pytest.raises(AdminError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            await a.describe_topics(["nope"])
        cluster = await a.describe_cluster()
        assert cluster.cluster_id == "fake-cluster" and len(cluster.brokers) == 3
        await a.delete_topics(["new"])
        assert "new" not in await a.list_topics()


async def test_sync_facade(fake: FakeCluster) -> None:
    import asyncio

    def work() -> list[bytes]:
        with SyncAdmin(fake.bootstrap) as admin:
            admin.create_topics([NewTopic("s", 1, 1)])
        with SyncProducer(bootstrap=fake.bootstrap) as p:
            assert p.send("s", b"one").offset == 0
            p.produce("s", b"two")
            p.send_many("s", [b"three", b"four"])
            p.flush()
        with SyncConsumer("s", bootstrap=fake.bootstrap, from_beginning=True) as c:
            out: list[bytes] = []
            for r in c:
                out.append(r.value)
                if len(out) == 4:
                    return out
        return out

    # The fake cluster runs on this test's loop: the facade's own loop is another thread.
    assert await asyncio.get_running_loop().run_in_executor(None, work) == [
        b"one",
        b"two",
        b"three",
        b"four",
    ]
