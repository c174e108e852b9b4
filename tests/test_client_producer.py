"""Producer logic against the in-memory fake cluster: batching, ordering, retries,
backpressure, handles, acks=0, send_many, unknown topics. No real broker needed."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from unittest import mock

import pytest
from helpers import wait_until_async
from test_client_fake_broker import FakeCluster

from rillet.client.partitioner import partition_for_key
from rillet.client.producer import DeliveryError, Producer, ProducerClosedError, RecordHandle
from rillet.client.wire import records, schemas
from rillet.client.wire.errors import (
    InvalidRecordError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)


@pytest.fixture
async def fake():
    cluster = await FakeCluster(3).start()
    cluster.create("t", 6)
    yield cluster
    await cluster.stop()


def values_of(fake: FakeCluster, topic: str, partition: int) -> list[bytes]:
    return [r.value for r in fake.records(topic, partition)]


async def test_send_returns_metadata_with_offsets(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap) as p:
        handles = [p.send("t", b"v%d" % i, partition=2) for i in range(5)]
        mds = [await h for h in handles]
    assert [m.offset for m in mds] == [0, 1, 2, 3, 4]
    assert {(m.topic, m.partition) for m in mds} == {("t", 2)}
    assert values_of(fake, "t", 2) == [b"v%d" % i for i in range(5)]


async def test_keyed_records_land_on_the_murmur2_partition_in_order(fake: FakeCluster) -> None:
    keys = [b"key-%d" % (i % 37) for i in range(3000)]
    async with Producer(fake.bootstrap, batch_size=2048) as p:
        for i, k in enumerate(keys):
            await p.produce("t", b"%d" % i, k)
        await p.flush()
    for part in range(6):
        recs = fake.records("t", part)
        assert all(partition_for_key(r.key, 6) == part for r in recs)
        by_key: dict[bytes, list[int]] = {}
        for r in recs:
            by_key.setdefault(r.key, []).append(int(r.value))
        assert all(seq == sorted(seq) for seq in by_key.values())
    assert sum(len(fake.records("t", q)) for q in range(6)) == 3000


async def test_one_encode_per_batch_and_batches_bounded_by_batch_size(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, batch_size=4096, linger_ms=50) as p:
        for _ in range(2000):
            await p.produce("t", b"x" * 100, partition=0)
        await p.flush()
        assert p.stats["records"] == 2000
    sizes = [h.size for _, h in records.iter_batches(bytes(fake.topics["t"][0].log))]
    assert len(sizes) == p.stats["batches"] > 1
    assert max(sizes) < 4096 + 200  # sealed once the estimate reaches batch_size


async def test_one_request_carries_batches_of_many_partitions(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=1000) as p:
        for part in range(6):
            p.send("t", b"v", partition=part)
        await p.flush()
        # six partitions over three leaders: flush seals all at once -> 3 requests
        assert p.stats["requests"] == 3
        assert p.stats["batches"] == 6


async def test_unkeyed_records_stick_to_one_partition_per_batch(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=1000) as p:
        handles = [p.send("t", b"v%d" % i) for i in range(50)]
        await p.flush()
        parts = {(await h).partition for h in handles}
    assert len(parts) == 1


async def test_leader_change_under_pipelined_load_keeps_order(fake: FakeCluster) -> None:
    # Many batches in flight when the leader moves: every later one fails too, and all
    # of them are resent in their original order to the new leader.
    fake.topics["t"][1].move_at = (100, 3)
    async with Producer(fake.bootstrap, batch_size=256, retry_backoff_ms=1, linger_ms=50) as p:
        for i in range(600):
            await p.produce("t", b"%05d" % i, partition=1)
        await p.flush()
        assert p.stats["retries"] >= 1
    assert fake.topics["t"][1].leader == 3
    assert values_of(fake, "t", 1) == [b"%05d" % i for i in range(600)]


async def test_isolated_failures_keep_order_with_one_in_flight_per_partition(
    fake: FakeCluster,
) -> None:
    # A failure that hits one batch and not the next (say an acks=all timeout) could let
    # a later batch overtake the retried one with several in flight; one in flight
    # per partition rules it out.
    fake.topics["t"][1].inject = [NotLeaderOrFollowerError.code] * 3
    async with Producer(
        fake.bootstrap, batch_size=256, retry_backoff_ms=1, max_in_flight_per_partition=1
    ) as p:
        for i in range(300):
            await p.produce("t", b"%05d" % i, partition=1)
        await p.flush()
        assert p.stats["retries"] >= 1
    assert values_of(fake, "t", 1) == [b"%05d" % i for i in range(300)]


async def test_leader_move_is_followed(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, retry_backoff_ms=1) as p:
        await p.send("t", b"before", partition=0)
        fake.move_leader("t", 0, 2)  # the producer's metadata still names broker 1
        md = await p.send("t", b"after", partition=0)
    assert md.offset == 1
    assert values_of(fake, "t", 0) == [b"before", b"after"]


async def test_non_retriable_error_fails_the_handle_and_flush(fake: FakeCluster) -> None:
    fake.topics["t"][3].inject = [InvalidRecordError.code]
    async with Producer(fake.bootstrap) as p:
        h = p.send("t", b"bad", partition=3)
        with pytest.raises(InvalidRecordError, match="t-3: INVALID_RECORD"):
            await h
        with pytest.raises(DeliveryError):
            await p.flush()
        await p.flush()  # errors are reported once
        assert (await p.send("t", b"good", partition=3)).offset == 0


async def test_retries_exhausted_fail_the_batch(fake: FakeCluster) -> None:
    fake.topics["t"][4].inject = [NotLeaderOrFollowerError.code] * 10
    async with Producer(fake.bootstrap, retries=2, retry_backoff_ms=1) as p:
        with pytest.raises(NotLeaderOrFollowerError):
            await p.send("t", b"v", partition=4)
        await p.flush(raise_errors=False)


async def test_buffer_memory_bounds_what_is_buffered(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, buffer_memory=64 * 1024, batch_size=16 * 1024) as p:
        blocked = 0
        for _ in range(5000):
            fut = p.produce("t", b"x" * 100, partition=5)
            if not fut.done():
                blocked += 1
                assert p._accumulator.buffered >= p.buffer_memory
            await fut
            assert p._accumulator.buffered < p.buffer_memory + 200
        await p.flush()
        assert blocked > 0
        assert p._accumulator.buffered == 0
    assert len(fake.records("t", 5)) == 5000


async def test_acks0_sends_one_way(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, acks=0) as p:
        md = await p.send("t", b"v", partition=0)
        assert md.offset == -1
    await asyncio.wait_for(_until(lambda: len(fake.records("t", 0)) == 1), 10)


async def _until(pred) -> None:  # noqa: ANN001
    while not pred():
        await asyncio.sleep(0.01)


async def test_send_many_builds_whole_batches_in_order(fake: FakeCluster) -> None:
    values = [b"%06d" % i for i in range(20_000)]
    async with Producer(fake.bootstrap, batch_size=8192) as p:
        await p.produce("t", b"first", partition=2)
        await p.send_many("t", values, partition=2)
        await p.flush()
    assert values_of(fake, "t", 2) == [b"first", *values]


async def test_a_bad_record_in_send_many_fails_its_call_not_its_batch_mates(
    fake: FakeCluster,
) -> None:
    # send_many's records join the open batch: a str among them used to be found only
    # when the batch was encoded, failing the records of send() in the same batch too.
    async with Producer(fake.bootstrap, linger_ms=50) as p:
        h = p.send("t", b"valid", partition=2)
        with pytest.raises(TypeError, match="value must be bytes"):
            await p.send_many("t", [b"fine", "not bytes"], partition=2)
        with pytest.raises(TypeError, match="key must be bytes"):
            await p.send_many("t", [b"fine", b"fine"], keys=[b"k", "not bytes"])
        assert (await h).offset == 0
        await p.flush()
    assert values_of(fake, "t", 2) == [b"valid"]


async def test_send_many_over_buffer_memory_waits_for_answers_not_a_linger(
    fake: FakeCluster,
) -> None:
    # Keyed send_many left open batches on every partition with the memory used up and
    # nothing in flight: it waited for the linger (10 minutes here) to free any.
    keys = [b"k%d" % i for i in range(2000)]
    async with Producer(
        fake.bootstrap, linger_ms=600_000, batch_size=64 * 1024, buffer_memory=64 * 1024
    ) as p:
        await asyncio.wait_for(p.send_many("t", [b"v" * 100] * 2000, keys), 60)
        await asyncio.wait_for(p.flush(), 60)
    assert sum(len(fake.records("t", q)) for q in range(6)) == 2000


async def test_send_many_keyed_groups_by_partition(fake: FakeCluster) -> None:
    keys = [b"k%d" % (i % 11) for i in range(1000)]
    async with Producer(fake.bootstrap) as p:
        await p.send_many("t", [b"%d" % i for i in range(1000)], keys)
        await p.flush()
    for part in range(6):
        for r in fake.records("t", part):
            assert partition_for_key(r.key, 6) == part


async def test_headers_and_timestamps_round_trip(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=100) as p:
        p.send("t", b"a", partition=0)
        h = p.send("t", b"b", headers=[("h", b"1")], timestamp=1234, partition=0)
        md = await h
    assert md.timestamp == 1234
    recs = fake.records("t", 0)
    assert recs[1].headers == [("h", b"1")] and recs[1].timestamp == 1234
    assert recs[0].headers is None


async def test_unknown_topic_fails_after_max_block(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, max_block_ms=200) as p:
        h = p.send("missing", b"v")
        assert isinstance(h, RecordHandle)
        with pytest.raises(UnknownTopicOrPartitionError):
            await h
        with pytest.raises(DeliveryError):
            await p.flush()


async def test_topic_created_after_first_send_is_delivered(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, max_block_ms=10_000, retry_backoff_ms=5) as p:
        h = p.send("late", b"v")
        fake.create("late", 1)
        assert (await h).offset == 0


async def test_a_partition_without_a_leader_does_not_hold_up_the_others(
    fake: FakeCluster,
) -> None:
    """The first send to a topic waits for its partitions, not for every leader (as
    Kafka's producer does): a partition whose only replica is down leaves the rest of
    the topic writable, and its own records wait for a leader within the delivery
    timeout. Waiting for every leader held a whole topic for max_block_ms, then failed."""
    fake.topics["t"][2].leader = -1
    async with Producer(
        fake.bootstrap, max_block_ms=60_000, delivery_timeout_ms=60_000, retry_backoff_ms=5
    ) as p:
        healthy = p.send("t", b"a", partition=0)
        orphan = p.send("t", b"b", partition=2)
        assert (await asyncio.wait_for(healthy, 10)).offset == 0
        assert not orphan.done()
        fake.topics["t"][2].leader = 3  # a leader is elected
        assert (await asyncio.wait_for(orphan, 10)).offset == 0
    assert values_of(fake, "t", 2) == [b"b"]


async def test_unkeyed_records_skip_partitions_without_a_leader(fake: FakeCluster) -> None:
    """The sticky choice for unkeyed records is made among the partitions that have a
    leader (as Kafka's partitioner does), so they are not left to expire on one that has
    none while the rest of the topic is writable."""
    fake.topics["t"][2].leader = -1
    async with Producer(
        fake.bootstrap, batch_size=1024, delivery_timeout_ms=5_000, retry_backoff_ms=5
    ) as p:
        for _ in range(3000):
            await p.produce("t", b"v" * 50)
        await asyncio.wait_for(p.flush(), 30)
    assert values_of(fake, "t", 2) == []
    assert sum(len(values_of(fake, "t", i)) for i in range(6)) == 3000


async def test_a_topic_with_no_partitions_is_not_taken_as_known() -> None:
    """Not known, and waited for with the metadata backoff, not in a tight loop."""

    class Counting(FakeCluster):
        metadata_requests = 0

        def _metadata(self, node: int, request: Any) -> Any:
            Counting.metadata_requests += 1
            return super()._metadata(node, request)

    fake = await Counting(1).start()
    try:
        fake.create("empty", 0)
        async with Producer(fake.bootstrap, max_block_ms=1000) as p:
            with pytest.raises(UnknownTopicOrPartitionError, match="no partitions"):
                await p.send("empty", b"v")
            with pytest.raises(UnknownTopicOrPartitionError):
                await p.partitions_for("empty")
    finally:
        await fake.stop()
    assert Counting.metadata_requests < 100  # about 2 s of 100 ms backoffs; unbounded before


async def test_closed_producer_refuses_records(fake: FakeCluster) -> None:
    p = Producer(fake.bootstrap)
    await p.start()
    await p.close()
    with pytest.raises(ProducerClosedError):
        p.send("t", b"v")


def test_bad_configuration_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Producer(acks=2)
    with pytest.raises(ValueError):
        Producer(compression="brotli")  # not one of Kafka's codecs


async def test_a_value_that_is_not_bytes_is_refused_at_send(fake: FakeCluster) -> None:
    """Kafka's records hold bytes: a str or any other object is refused when it is
    handed over, before it can share (and fail) a batch with good records."""
    async with Producer(fake.bootstrap, linger_ms=1) as p:
        good = p.send("t", b"good", partition=0)
        assert (await good).offset == 0  # the topic is known now (not held for metadata)
        for bad in ("text", {1, 2}, 5):
            with pytest.raises(TypeError, match="must be bytes"):
                p.send("t", bad, partition=0)
            with pytest.raises(TypeError, match="must be bytes"):
                await p.produce("t", bad, partition=0)
            with pytest.raises(TypeError, match="must be bytes"):
                await p.produce("t", b"v", key=bad, partition=0)
        with pytest.raises(TypeError, match="header key must be str"):
            p.send("t", b"v", headers=[(b"k", b"v")], partition=0)
        with pytest.raises(TypeError, match="header value must be bytes"):
            p.send("t", b"v", headers=[("k", "v")], partition=0)
        await p.flush()
    assert values_of(fake, "t", 0) == [b"good"]


async def test_an_unencodable_value_fails_its_batch_only(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=1) as p:
        # A lone surrogate passes the type checks but has no UTF-8 form.
        bad = p.send("t", b"v", headers=[("\ud800", b"x")], partition=0)
        with pytest.raises(TypeError, match="cannot encode records for t"):
            await bad
        with pytest.raises(DeliveryError):
            await p.flush()
        assert (await p.send("t", b"good", partition=0)).offset == 0


# --- records held for a topic whose metadata is on its way ------------------------------


async def test_a_bad_partition_in_a_first_send_fails_that_record_only(fake: FakeCluster) -> None:
    # "t" has 6 partitions but the producer knows nothing of it yet: both records are
    # held. The out-of-range one fails alone, as it would once the topic is known.
    async with Producer(fake.bootstrap) as p:
        bad = p.send("t", b"bad", partition=9)
        good = p.send("t", b"good", partition=0)
        assert (await asyncio.wait_for(_await(good), 10)).offset == 0
        with pytest.raises(ValueError, match="no partition 9"):
            await asyncio.wait_for(_await(bad), 10)
        with pytest.raises(DeliveryError) as e:
            await asyncio.wait_for(p.flush(), 10)
        assert e.value.failed_records == 1
        assert p._accumulator.buffered == 0
    assert values_of(fake, "t", 0) == [b"good"]


async def test_a_str_key_in_a_first_produce_does_not_hang_flush(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap) as p:
        await p.produce("t", b"bad", key="not-bytes")
        await p.produce("t", b"good", partition=0)
        await asyncio.wait_for(p.flush(raise_errors=False), 10)
        assert p._accumulator.buffered == 0
    assert values_of(fake, "t", 0) == [b"good"]


async def test_a_value_without_len_in_a_first_send_is_refused_at_once(
    fake: FakeCluster,
) -> None:
    async with Producer(fake.bootstrap) as p:
        with pytest.raises(TypeError):
            p.send("t", 12345, partition=0)  # refused, as when the topic is known
        h = p.send("t", b"good", partition=0)
        assert (await asyncio.wait_for(_await(h), 10)).offset == 0
        await asyncio.wait_for(p.flush(), 10)
    assert values_of(fake, "t", 0) == [b"good"]


async def test_a_bad_held_record_gives_its_buffer_memory_back(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, batch_size=1024, buffer_memory=1024) as p:
        p.produce("t", b"bad", partition=9)
        futs = [p.produce("t", b"x" * 100, partition=0) for _ in range(12)]  # all held
        assert not futs[-1].done()  # at the bound: waits for space
        await asyncio.wait_for(futs[-1], 10)
        await asyncio.wait_for(p.produce("t", b"y", partition=0), 10)
        await asyncio.wait_for(p.flush(raise_errors=False), 10)
        assert p._accumulator.buffered == 0


async def test_an_unexpected_error_resolving_a_topic_fails_its_held_records(
    fake: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    async with Producer(fake.bootstrap) as p:
        bug = RuntimeError("a bug while waiting for metadata")
        with mock.patch.object(p._meta, "wait_for_topics", side_effect=bug):
            h = p.send("t", b"v", partition=0)
            with pytest.raises(RuntimeError, match="a bug"):
                await asyncio.wait_for(_await(h), 10)
        with pytest.raises(DeliveryError):
            await asyncio.wait_for(p.flush(), 10)
        assert p._accumulator.buffered == 0
    assert "resolving topic 't' failed" in caplog.text


async def _await(h: Any) -> Any:
    return await h


# --- a leader change while batches are in flight to the old leader ---------------------


class GatedFake(FakeCluster):
    """Produce requests to ``gated`` brokers wait for ``gate`` (an acks=all request
    waiting for its followers, say); ``arrived[node]`` counts the requests received."""

    def __init__(self, brokers: int) -> None:
        super().__init__(brokers)
        self.gated: set[int] = set()
        self.gate = asyncio.Event()
        self.arrived = dict.fromkeys(self.broker_ids, 0)
        self.arrival = asyncio.Condition()

    def _handlers(self, node: int) -> dict[int, Any]:
        handlers = super()._handlers(node)
        answer = handlers[schemas.PRODUCE.key]

        async def produce(request: Any) -> Any:
            async with self.arrival:
                self.arrived[node] += 1
                self.arrival.notify_all()
            if node in self.gated:
                await self.gate.wait()
            return await answer(request)  # the leader check happens now

        handlers[schemas.PRODUCE.key] = produce
        return handlers

    async def until_arrived(self, node: int, n: int) -> None:
        async with self.arrival:
            await self.arrival.wait_for(lambda: self.arrived[node] >= n)


async def test_a_batch_for_a_new_leader_waits_for_those_in_flight_to_the_old() -> None:
    fake = await GatedFake(2).start()
    fake.create("o", 1)  # leader: broker 1
    try:
        # batch_size=1: every record is a batch, sealed at once
        async with Producer(fake.bootstrap, batch_size=1, retry_backoff_ms=1) as p:
            await p.send("o", b"0", partition=0)
            fake.gated.add(1)
            h1 = p.send("o", b"1", partition=0)
            await asyncio.wait_for(fake.until_arrived(1, 2), 10)  # batch 1 at broker 1
            h2 = p.send("o", b"2", partition=0)
            await asyncio.wait_for(fake.until_arrived(1, 3), 10)  # batch 2 too
            fake.move_leader("o", 0, 2)
            await p._meta.refresh(force=True)  # any refresh: another partition's error...
            h3 = p.send("o", b"3", partition=0)
            await asyncio.sleep(0)  # the sender's pass for batch 3 runs
            if not p._accumulator.sealed("o", 0):  # batch 3 went: let it land first
                await asyncio.wait_for(fake.until_arrived(2, 1), 10)
            fake.gate.set()  # batches 1 and 2 fail with NOT_LEADER and are resent
            await asyncio.wait_for(asyncio.gather(_await(h1), _await(h2), _await(h3)), 10)
        assert values_of(fake, "o", 0) == [b"0", b"1", b"2", b"3"]
    finally:
        await fake.stop()


# --- produce() overridden -----------------------------------------------------------------


async def test_a_subclass_override_of_produce_is_called(fake: FakeCluster) -> None:
    seen = []

    class Counting(Producer):
        def produce(self, topic, value, *a, **kw):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN002, ANN003, ANN202
            seen.append(value)
            return super().produce(topic, value, *a, **kw)

    async with Counting(fake.bootstrap) as p:
        await p.produce("t", b"v", partition=0)
    assert seen == [b"v"]
    assert values_of(fake, "t", 0) == [b"v"]


def test_a_class_level_patch_of_produce_is_called() -> None:
    with mock.patch.object(Producer, "produce") as patched:
        Producer().produce("t", b"v")
    patched.assert_called_once_with("t", b"v")


# --- a record refused by produce() or send() ---------------------------------------------


async def test_a_record_refused_with_an_exception_is_not_delivered(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap) as p:
        await p.send("t", b"first", partition=0)  # the topic's metadata is known now
        with pytest.raises(TypeError):
            await p.produce("t", 12345, partition=0)  # no len()
        with pytest.raises(TypeError):
            p.send("t", 12345, partition=0)
        with pytest.raises(ValueError):
            p.send("t", b"bad-headers", partition=0, headers=[("h",)])
        with pytest.raises(ValueError):
            await p.produce("t", b"bad-timestamp", partition=0, timestamp="soon")  # type: ignore[arg-type]
        await p.send("t", b"last", partition=0)
        await asyncio.wait_for(p.flush(), 10)
        assert p._accumulator.buffered == 0
    assert values_of(fake, "t", 0) == [b"first", b"last"]


# --- on_batch_done -----------------------------------------------------------------------


async def test_a_raising_on_batch_done_leaves_no_batch_unfinished(
    fake: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    async with Producer(fake.bootstrap, linger_ms=10_000) as p:
        calls = []

        def on_done(n: int, seconds: float) -> None:
            calls.append(n)
            raise RuntimeError("a bug in the caller's callback")

        p.on_batch_done = on_done
        hs = [p.send("t", b"v", partition=q) for q in (0, 3)]  # one request: broker 1
        with caplog.at_level(logging.ERROR, logger="rillet.client.sender"):
            await asyncio.wait_for(p.flush(), 10)
        assert [(await h).offset for h in hs] == [0, 0]
        assert calls == [1, 1]
    assert "on_batch_done raised" in caplog.text


# --- settings -----------------------------------------------------------------------------


def test_the_settings_are_readable_attributes() -> None:
    p = Producer(
        linger_ms=7,
        compression="lz4",
        max_in_flight=3,
        max_in_flight_per_partition=1,
        max_request_bytes=4096,
        retries=4,
        retry_backoff_ms=50,
        delivery_timeout_ms=9000,
        request_timeout_ms=1500,
    )
    assert (p.linger_s, p.compression) == (0.007, records.COMPRESSION_BY_NAME["lz4"])
    assert (p.max_in_flight, p.max_in_flight_per_partition, p.max_request_bytes) == (3, 1, 4096)
    assert (p.retries, p.retry_backoff_s, p.delivery_timeout_s) == (4, 0.05, 9.0)
    assert p.request_timeout_ms == 1500
    with pytest.raises(AttributeError):
        p.retries = 5  # type: ignore[misc]


async def test_connections_the_brokers_closed_as_idle_are_reopened_unseen() -> None:
    # A producer quiet for longer than the brokers' connections.max.idle.ms finds its
    # connections closed; its next sends go out on new ones, with no error and no retry.
    fake = await FakeCluster(2, idle_ms=100).start()
    fake.create("t", 2)
    try:
        async with Producer(fake.bootstrap, retries=0) as p:
            assert (await p.send("t", b"before", partition=0)).offset == 0
            await wait_until_async(lambda: not any(s.connections for s in fake.servers.values()))
            assert (await p.send("t", b"after", partition=0)).offset == 1
            assert (await p.send("t", b"other", partition=1)).offset == 0
        assert values_of(fake, "t", 0) == [b"before", b"after"]
    finally:
        await fake.stop()
