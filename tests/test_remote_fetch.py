"""The read side of the remote tier, through ReplicaManager.fetch_messages and the
ListOffsets handler: consumer offsets below a partition's local log start are served
from the RemoteReader, byte for byte what the local log returned before the segments
left local disk, within fetch.max.bytes together with the local partitions of the same
fetch, several partitions at once; a failing store or damaged data gives that partition
an error, never data, and the others are unaffected (broker/remote_fetch.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from test_replica_manager import commit, register

from rillet.broker.config import BrokerConfig, broker_config_table
from rillet.broker.handlers.fetch import ListOffsetsHandler
from rillet.broker.handlers.metadata import MetadataHandlers
from rillet.broker.metrics import BrokerMetrics
from rillet.broker.remote_fetch import RemoteLogViews
from rillet.broker.replica_fetch import FetchParams, FetchPartition, FetchResult
from rillet.broker.replica_manager import ReplicaManager
from rillet.client.runtime.rpc_server import Request
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    SEGMENT_DELETE_STARTED,
    MetadataImage,
    RemoteSegment,
    TopicPartition,
)
from rillet.controller.metadata.quorum import QuorumController
from rillet.controller.metadata.remote_log import RemoteLogView
from rillet.storage import Log, LogConfig, LogManager
from rillet.storage.remote.copier import upload_segment
from rillet.storage.remote.layout import SegmentKeys, segment_keys
from rillet.storage.remote.reader import RemoteReader
from rillet.storage.remote.store import MemoryObjectStore

E = errors.code_of
T0, U0 = TopicPartition("t", 0), TopicPartition("u", 0)
BATCHES_PER_SEGMENT = 4
CHUNK = 512  # bytes per remote chunk: every segment is several
SEGMENTS = 3  # per partition: two closed and offloaded, the active one local


class GatedStore(MemoryObjectStore):
    """A MemoryObjectStore whose GETs can be held: ``hold`` blocks every GET until it is
    set; ``together`` makes GETs wait until that many are under way at once."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: threading.Event | None = None
        self.together: threading.Barrier | None = None

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if self.together is not None:
            self.together.wait(timeout=30)
        if self.hold is not None:
            self.hold.wait(timeout=30)
        return super().get(key, start, end)


@dataclass
class Tier:
    """The remote log manager as the fetch path sees it: its reader (and the calls the
    broker makes on any remote log manager, as no-ops)."""

    store: GatedStore = field(default_factory=GatedStore)
    reader: RemoteReader = field(init=False)

    def __post_init__(self) -> None:
        # Small chunks: a read spans several, each checked against the manifest.
        self.reader = RemoteReader(self.store, 1 << 20, CHUNK, threads=4, prefetch_chunks=1)

    def on_metadata(self, *args: object) -> None:
        """(The remote log manager's copy side: not in these tests.)"""

    async def close(self) -> None:
        self.reader.close()


@dataclass
class Cluster:
    manager: ReplicaManager
    image: MetadataImage
    tier: Tier
    tmp: Path
    quorum: QuorumController
    expected: dict[TopicPartition, dict[int, bytes]] = field(default_factory=dict)
    keys: dict[TopicPartition, list[SegmentKeys]] = field(default_factory=dict)


def config(log_dir: Path, *extra: str) -> BrokerConfig:
    values = broker_config_table().load(
        None,
        ["node.id=1", "listeners=BROKER://127.0.0.1:0", f"log.dirs={log_dir}", *extra],
    )
    return BrokerConfig.from_config(values)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Broker 1 leads ``t-0`` and ``u-0``, each of three segments of four batches; the
    first two segments of each are in the remote tier and gone from local disk."""
    logs = LogManager(tmp_path / "data")
    logs.startup()
    manager = ReplicaManager(config(tmp_path / "data", "remote.fetch.max.wait.ms=200"), logs)
    quorum, image = await register(manager)
    topics = [("t", 1, 1, {"remote.storage.enable": "true"}), ("u", 1, 1, {})]
    image = await commit(manager, image, quorum.create_topics(image, topics).records)
    tier = Tier()
    manager.remote = tier
    manager.metrics = BrokerMetrics()
    c = Cluster(manager, image, tier, tmp_path, quorum)
    for tp in (T0, U0):
        await fill(c, tp)
    yield c
    store = tier.store
    store.together = None
    if store.hold is not None:
        store.hold.set()
    tier.reader.close()
    await manager.shutdown()
    logs.close()


async def fill(c: Cluster, tp: TopicPartition) -> None:
    """Three segments of four batches (timestamps 1000, 1001, ... per batch)."""
    log = c.manager.replicas[tp].log
    n = 0
    for seg in range(SEGMENTS):
        if seg:
            log.roll()
        for _ in range(BATCHES_PER_SEGMENT):
            values = [f"{tp.topic}-{n}-{i}".encode() * 20 for i in range(5)]
            data = records.encode_batch(values, timestamp_ms=1000 + n)
            (r,) = await c.manager.append_records([(tp, memoryview(bytearray(data)))], 1, 1000)
            assert r.error_code == errors.NONE
            n += 1


async def offload(c: Cluster, tp: TopicPartition, count: int = 2) -> None:
    """Upload the first ``count`` segments (remember what a local read of each offset
    returned), commit them as finished remote segments, and move the local log start
    past them, as the remote log manager and local retention do."""
    replica = c.manager.replicas[tp]
    log = replica.log
    hw = replica.state.high_watermark
    await log.wait_background()  # the rolls' index writes
    expected = c.expected.setdefault(tp, {})
    recs = []
    segments = list(log.segments)
    for i, seg in enumerate(segments[:count]):
        end = segments[i + 1].base_offset - 1
        for offset in range(seg.base_offset, end + 1):
            expected[offset] = log.read_bytes(offset, 1 << 20, hw)
        seg_id = f"seg{i}"
        keys = segment_keys(tp.topic, replica.topic_id, tp.partition, seg.base_offset, seg_id)
        manifest = upload_segment(c.tier.store, keys, seg, [(0, seg.base_offset)], seg_id, CHUNK)
        c.keys.setdefault(tp, []).append(keys)
        recs.append(
            RemoteSegment(
                replica.topic_id,
                tp.partition,
                seg_id,
                seg.base_offset,
                end,
                ((0, seg.base_offset),),
                SEGMENT_COPY_FINISHED,
                manifest.size_bytes,
                manifest.max_timestamp_ms,
                1,
                0,
            )
        )
    c.image = await commit(c.manager, c.image, recs)
    log.increment_log_start_offset(segments[count].base_offset)


def consumer(max_bytes: int = 1 << 20, min_bytes: int = 1, max_wait_ms: int = 0) -> FetchParams:
    return FetchParams(-1, max_wait_ms, min_bytes, max_bytes)


def part(tp: TopicPartition, offset: int, max_bytes: int = 1 << 20) -> FetchPartition:
    return FetchPartition(tp.topic, tp.partition, offset, -1, None, max_bytes)


def data_of(result: FetchResult, i: int) -> bytes:
    r = result.partitions[i]
    assert r.records is not None, r
    return r.records.read()


def local_start(c: Cluster, tp: TopicPartition) -> int:
    return c.manager.replicas[tp].log.log_start_offset


async def test_an_offset_below_the_local_start_is_served_remotely_byte_for_byte(
    cluster: Cluster,
) -> None:
    await offload(cluster, T0)
    start = local_start(cluster, T0)
    assert start == 2 * BATCHES_PER_SEGMENT * 5
    for offset in (0, 7, start - 1):
        result = await cluster.manager.fetch_messages(consumer(), [part(T0, offset)])
        (r,) = result.partitions
        assert r.error_code == errors.NONE
        assert r.log_start_offset == 0  # the log start across both tiers
        assert data_of(result, 0) == cluster.expected[T0][offset]
    # The local records are still read locally, and report the same log start.
    result = await cluster.manager.fetch_messages(consumer(), [part(T0, start)])
    (r,) = result.partitions
    assert r.records is not None and r.records.fd >= 0 and r.log_start_offset == 0
    metrics = cluster.manager.metrics
    assert metrics is not None
    assert metrics.total("remote_fetch_requests") == 3
    assert metrics.total("remote_fetch_bytes") == sum(
        len(cluster.expected[T0][o]) for o in (0, 7, start - 1)
    )
    assert metrics.total("remote_fetch_errors") == 0


async def test_remote_and_local_partitions_share_one_fetch_max_bytes(cluster: Cluster) -> None:
    await offload(cluster, T0)
    one = len(cluster.expected[T0][0]) - len(cluster.expected[T0][5])  # a batch's size
    limit = 3 * one + one // 2
    # Local first: it takes what it reads, the remote partition reserves what is left.
    result = await cluster.manager.fetch_messages(
        consumer(max_bytes=limit), [part(U0, 0, one), part(T0, 0)]
    )
    local, remote = result.partitions
    assert (local.nbytes, remote.nbytes) == (one, 2 * one)
    assert data_of(result, 1) == cluster.expected[T0][0][: 2 * one]
    # Remote first: its reservation leaves the local partition less than a batch, so
    # it sends nothing (only the first partition with data may pass the limit).
    result = await cluster.manager.fetch_messages(
        consumer(max_bytes=limit), [part(T0, 0, 3 * one), part(U0, 0)]
    )
    remote, local = result.partitions
    assert (remote.nbytes, local.nbytes) == (3 * one, 0) and local.error_code == errors.NONE
    # A remote partition after a local one gets no batch past its reservation either.
    result = await cluster.manager.fetch_messages(
        consumer(max_bytes=limit), [part(U0, 0), part(T0, 0)]
    )
    local, remote = result.partitions
    assert (local.nbytes, remote.nbytes) == (3 * one, 0) and remote.error_code == errors.NONE
    # The first partition with data may pass the limit by one batch, as a local one may.
    result = await cluster.manager.fetch_messages(consumer(max_bytes=1), [part(T0, 0), part(U0, 0)])
    assert result.nbytes == one and data_of(result, 0) == cluster.expected[T0][0][:one]


async def test_several_partitions_of_one_fetch_are_read_remotely_at_once(
    cluster: Cluster,
) -> None:
    await offload(cluster, T0)
    await offload(cluster, U0)
    # Each GET waits until the other partition's is under way too: one remote read
    # per fetch at a time (KAFKA-14915) would never finish.
    cluster.tier.store.together = threading.Barrier(2)
    result = await cluster.manager.fetch_messages(consumer(4 << 20), [part(T0, 0), part(U0, 3)])
    assert data_of(result, 0) == cluster.expected[T0][0]
    assert data_of(result, 1) == cluster.expected[U0][3]


async def test_a_fetch_with_remote_data_does_not_long_poll(cluster: Cluster) -> None:
    await offload(cluster, T0)
    params = consumer(min_bytes=1 << 30, max_wait_ms=600_000)
    result = await cluster.manager.fetch_messages(params, [part(T0, 0), part(U0, 0)])
    assert result.nbytes < 1 << 30 and data_of(result, 0) == cluster.expected[T0][0]


async def test_a_failing_store_answers_a_retriable_error_on_that_partition_only(
    cluster: Cluster,
) -> None:
    await offload(cluster, T0)
    cluster.tier.store.unavailable = True  # every call fails, retriable (connection refused)
    result = await cluster.manager.fetch_messages(consumer(), [part(T0, 0), part(U0, 0)])
    remote, local = result.partitions
    assert remote.error_code == E("KAFKA_STORAGE_ERROR") and remote.records is None
    assert errors.is_retriable(remote.error_code)
    assert local.error_code == errors.NONE and local.nbytes > 0
    assert cluster.manager.metrics is not None
    assert cluster.manager.metrics.total("remote_fetch_errors") == 1


async def test_a_hung_store_times_out_that_partition_only(cluster: Cluster) -> None:
    await offload(cluster, T0)
    cluster.tier.store.hold = threading.Event()  # remote.fetch.max.wait.ms is 200 here
    result = await cluster.manager.fetch_messages(consumer(), [part(T0, 0), part(U0, 0)])
    remote, local = result.partitions
    assert remote.error_code == E("REQUEST_TIMED_OUT") and remote.records is None
    assert local.error_code == errors.NONE and local.nbytes > 0


async def test_damaged_remote_data_is_an_error_never_data(cluster: Cluster) -> None:
    await offload(cluster, T0)
    seg0, seg1 = cluster.keys[T0]
    cluster.tier.store.corrupt(seg0.log, 100)  # a flipped byte in the first batch
    cluster.tier.store.truncate(seg1.log, 700)  # a cut object (its manifest says more)
    for offset in (0, 5, 20, 35):
        result = await cluster.manager.fetch_messages(consumer(), [part(T0, offset), part(U0, 0)])
        remote, local = result.partitions
        assert remote.error_code == E("CORRUPT_MESSAGE") and remote.records is None, offset
        assert local.error_code == errors.NONE and local.nbytes > 0


async def test_a_segment_deleted_during_the_read_is_out_of_range_not_damage(
    cluster: Cluster,
) -> None:
    await offload(cluster, T0)
    seg0_keys = cluster.keys[T0][0]
    cluster.tier.store.delete([seg0_keys.log, seg0_keys.manifest])  # retention got there
    replica = cluster.manager.replicas[T0]
    seg0 = cluster.image.remote_segments[(replica.topic_id, 0)]["seg0"]
    deleting = RemoteSegment(**{**_fields(seg0), "state": SEGMENT_DELETE_STARTED})
    cluster.image = await commit(cluster.manager, cluster.image, [deleting])
    result = await cluster.manager.fetch_messages(consumer(), [part(T0, 5)])
    assert result.partitions[0].error_code == E("OFFSET_OUT_OF_RANGE")


def _fields(seg: RemoteSegment) -> dict[str, object]:
    return {name: getattr(seg, name) for name in seg.__slots__}  # type: ignore[attr-defined]


async def test_list_offsets_earliest_earliest_local_and_a_remote_timestamp(
    cluster: Cluster,
) -> None:
    await offload(cluster, T0)
    handler = ListOffsetsHandler(cluster.manager)
    start = local_start(cluster, T0)

    async def lookup(ts: int) -> tuple[int, int, int]:
        r = handler.lookup("t", 0, -1, ts)
        if not isinstance(r, tuple):
            r = await r
        return r.error_code, r.offset, r.timestamp

    assert await lookup(-2) == (errors.NONE, 0, -1)  # the remote log start
    assert await lookup(-4) == (errors.NONE, start, -1)  # the local one
    # Batch n holds offsets 5n..5n+4 stamped 1000 + n: batch 3 is remote, batch 9 local.
    assert await lookup(1003) == (errors.NONE, 15, 1003)
    assert await lookup(0) == (errors.NONE, 0, 1000)
    assert await lookup(1009) == (errors.NONE, 45, 1009)
    assert await lookup(5000) == (errors.NONE, -1, -1)
    # Without the tier (off on this broker) earliest is the local start.
    cluster.manager.remote = None
    assert await lookup(-2) == (errors.NONE, start, -1)


async def test_describe_log_dirs_reports_both_tiers_and_the_copy_lag(cluster: Cluster) -> None:
    await offload(cluster, T0, count=1)  # segment 1 is closed but not remote yet
    handlers = MetadataHandlers(cluster.manager.config, cluster.manager, _no_forward, lambda: 1)
    request = m.DescribeLogDirsRequest(
        topics=[m.DescribeLogDirsTopic("t", [0, 7]), m.DescribeLogDirsTopic("u", [0])]
    )
    response = (await handlers.describe_log_dirs(_request(request))).message
    (t0, t7), (u0,) = (t.partitions for t in response.topics)
    log = cluster.manager.replicas[T0].log
    first, second = list(log.segments)[:2]
    assert t0 == m.DescribeLogDirsPartition(
        0,
        errors.NONE,
        log_start_offset=0,
        local_log_start_offset=second.base_offset,
        log_end_offset=log.log_end_offset,
        size_bytes=log.size_bytes,
        remote_log_start_offset=0,
        remote_end_offset=second.base_offset - 1,
        remote_size_bytes=first.size,
        remote_segments=1,
        copy_lag_bytes=second.size,
        copy_lag_segments=1,
        remote_storage=True,
    )
    assert t7.error_code == E("UNKNOWN_TOPIC_OR_PARTITION")
    assert (u0.remote_log_start_offset, u0.copy_lag_segments, u0.remote_storage) == (-1, 0, False)


async def _no_forward(request: object) -> object:
    raise AssertionError("nothing is forwarded")


def _request(message: object) -> Request:
    return cast(Request, SimpleNamespace(message=message))


async def test_a_cancelled_fetch_leaves_no_remote_read_behind(cluster: Cluster) -> None:
    """The client went away (its fetch cancelled) during a remote read: the read's task
    goes too; the GET under way finishes in the reader's thread."""
    await offload(cluster, T0)
    cluster.tier.store.hold = threading.Event()
    before = asyncio.all_tasks()
    fetch = asyncio.ensure_future(cluster.manager.fetch_messages(consumer(), [part(T0, 0)]))
    while not any(
        t.get_coro().__qualname__ == "read_one"  # type: ignore[union-attr]
        for t in asyncio.all_tasks() - before
    ):
        await asyncio.sleep(0)
    fetch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fetch
    for _ in range(3):
        await asyncio.sleep(0)
    left = {t.get_coro().__qualname__ for t in asyncio.all_tasks() - before}  # type: ignore[union-attr]
    assert "read_one" not in left  # (the reader's own shared GET may go on: its cache's)


async def test_a_consumer_reads_across_overlapping_remote_segments(cluster: Cluster) -> None:
    """After a leader change the new leader's first copy overlaps the old one's last
    segment (its replica rolled at other offsets): here 0..19 from the old leader and
    10..39 from the new. A consumer from offset 0 gets every offset once, in order, and
    the same bytes a local read gave, one batch per fetch or all at once."""
    c = cluster
    replica = c.manager.replicas[T0]
    log = replica.log
    hw = replica.state.high_watermark
    second = log.segments[1].base_offset
    local_end = log.segments[2].base_offset
    # The new leader's replica rolled at 10 and 40: the same batches, other files.
    other = Log.open(c.tmp / "other-t-0", LogConfig(segment_bytes=1 << 20), clock=lambda: 0)
    other.truncate_fully_and_start_at(10)
    other.append_as_follower(log.read_bytes(10, 1 << 20, hw) + log.read_bytes(second, 1 << 20, hw))
    other.roll()
    await other.wait_background()
    c.expected[T0] = {o: log.read_bytes(o, 1 << 20, hw) for o in range(second, local_end)}
    await offload(c, T0, count=1)  # the old leader's 0..19; local from 20
    seg = other.segments[0]
    assert (seg.base_offset, other.segments[1].base_offset) == (10, local_end)
    keys = segment_keys("t", replica.topic_id, 0, 10, "new")
    manifest = upload_segment(c.tier.store, keys, seg, [(1, 10)], "new", CHUNK)
    overlap = RemoteSegment(
        replica.topic_id, 0, "new", 10, local_end - 1, ((1, 10),), SEGMENT_COPY_FINISHED,
        manifest.size_bytes, manifest.max_timestamp_ms, 1, 1,
    )  # fmt: skip
    c.image = await commit(c.manager, c.image, [overlap])
    log.increment_log_start_offset(local_end)
    other.close()
    for max_bytes in (1, 1 << 20):
        offsets: list[int] = []
        offset = 0
        while offset < local_end:
            result = await c.manager.fetch_messages(consumer(), [part(T0, offset, max_bytes)])
            assert result.partitions[0].error_code == errors.NONE
            data = data_of(result, 0)
            if max_bytes > 1:
                assert data == c.expected[T0][offset]
            got = [r.offset for r in records.decode_all(data) if r.offset >= offset]
            offsets += got
            offset = got[-1] + 1
        assert offsets == list(range(local_end)), max_bytes


async def test_a_deleted_topic_leaves_the_view_cache(cluster: Cluster) -> None:
    """Nobody asks for a deleted topic's remote log again: the delta that deletes it
    drops its cached view (and segment map) rather than holding them forever."""
    await offload(cluster, T0)
    await cluster.manager.fetch_messages(consumer(), [part(T0, 0)])
    topic_id = cluster.manager.replicas[T0].topic_id
    views = cluster.manager.views
    assert (topic_id, 0) in views._views
    records = cluster.quorum.delete_topics(cluster.image, ["t"]).records
    cluster.image = await commit(cluster.manager, cluster.image, records)
    assert T0 not in cluster.manager.replicas
    assert (topic_id, 0) not in views._views and len(views) == 0


def test_views_of_partitions_gone_changed_or_moved_away_are_dropped() -> None:
    """retain keeps a view only while its segment map is the image's and the broker
    still holds the partition (a replica moved away keeps its map in the image)."""
    seg = RemoteSegment("a", 0, "s", 0, 9, ((0, 0),), SEGMENT_COPY_FINISHED, 10, 1, 1, 0)
    maps = {(tid, 0): {"s": dataclasses.replace(seg, topic_id=tid)} for tid in "abcd"}
    views = RemoteLogViews()
    for tid in "abcd":
        views._views[(tid, 0)] = (maps[(tid, 0)], cast(RemoteLogView, None))
    # a: unchanged and held; b: its topic deleted; c: its map replaced; d: moved away.
    later = {("a", 0): maps[("a", 0)], ("c", 0): dict(maps[("c", 0)]), ("d", 0): maps[("d", 0)]}
    views.retain(cast(MetadataImage, SimpleNamespace(remote_segments=later)), lambda t, p: t != "d")
    assert list(views._views) == [("a", 0)]
