"""Uploading a closed segment: the log object is the segment file byte for byte, with
its CRC-32C in metadata; the manifest (keys, indexes, per-chunk CRCs, epochs) is written
last and only after the log object is whole; the manifest detects its own damage; the
upload rate limiter's arithmetic."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st
from remote_helpers import build_log, closed_segments, epochs_of, random_batch

from rillet.storage import Log, fs
from rillet.storage.index import OFFSET_ENTRY, TIME_ENTRY
from rillet.storage.remote.copier import (
    CRC_METADATA,
    LocalSegmentError,
    RateLimiter,
    delete_segment,
    upload_segment,
)
from rillet.storage.remote.layout import (
    CLUSTER_MARKERS,
    RemoteManifest,
    cluster_marker_key,
    parse_cluster_marker,
    parse_segment_key,
    parse_topic_of_key,
    partition_prefix,
    segment_keys,
    topic_prefix,
)
from rillet.storage.remote.store import Body, MemoryObjectStore, RemoteStorageError


class RecordingStore(MemoryObjectStore):
    """Remembers the order of writes and deletes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, str]] = []

    def put(self, key: str, data: Body, metadata: Mapping[str, str] | None = None) -> None:
        super().put(key, data, metadata)
        self.writes.append(("put", key))

    def delete(self, keys: Sequence[str]) -> None:
        super().delete(keys)
        self.writes.extend(("delete", k) for k in keys)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Log:
    return build_log(tmp_path_factory.mktemp("log") / "t-0")


def test_layout_keys() -> None:
    assert topic_prefix("orders", "AbC") == "orders-AbC/"
    assert partition_prefix("orders", "AbC", 3) == "orders-AbC/3/"
    keys = segment_keys("orders", "AbC", 3, 1234, "seg-id_1")
    assert keys.log == "orders-AbC/3/00000000000000001234-seg-id_1.log"
    assert keys.manifest == "orders-AbC/3/00000000000000001234-seg-id_1.manifest"
    assert parse_segment_key(keys.log) == (1234, "seg-id_1", "log")
    assert parse_segment_key("prefix/" + keys.manifest) == (1234, "seg-id_1", "manifest")
    for foreign in ("orders-AbC/3/readme.txt", "orders-AbC/3/123-x.log", "x.log", "a/-x.log",
                    "orders-AbC/3/00000000000000001234-.log"):  # fmt: skip
        assert parse_segment_key(foreign) is None


def test_cluster_markers_name_their_cluster_and_are_never_layout_keys() -> None:
    """Any cluster id, even one shaped like a segment object or holding a slash."""
    for cid in ("Zx3-abc_DEF", "a/b", "00000000000000001234-seg.log", "p%20q"):
        key = cluster_marker_key(cid)
        assert key.startswith(CLUSTER_MARKERS) and key.count("/") == 2
        assert parse_cluster_marker(key) == cid
        assert parse_segment_key(key) is None and parse_topic_of_key(key) is None
    for other in ("_rillet/clusters/", "_rillet/clusters/.cluster", "_rillet/clusters/a/b.cluster",
                  segment_keys("orders", "A" * 22, 0, 0, "s").log):  # fmt: skip
        assert parse_cluster_marker(other) is None


def test_upload_writes_the_segment_then_the_manifest(log: Log) -> None:
    segments = closed_segments(log)
    assert len(segments) >= 4
    seg, nxt = segments[1], segments[2]
    store = RecordingStore()
    keys = segment_keys("t", "id", 0, seg.base_offset, "s1")
    epochs = epochs_of(log, seg, nxt.base_offset)
    chunk = 4096
    manifest = upload_segment(store, keys, seg, epochs, "s1", chunk)
    assert store.writes == [("put", keys.log), ("put", keys.manifest)]

    data = fs.read_bytes(seg.log_path)
    assert store.get(keys.log) == data
    info = store.head(keys.log)
    assert info is not None and info.metadata == {CRC_METADATA: f"{crc32c.crc32c(data):08x}"}

    assert RemoteManifest.decode(store.get(keys.manifest)) == manifest
    assert (manifest.segment_id, manifest.start_offset) == ("s1", seg.base_offset)
    assert manifest.end_offset == nxt.base_offset - 1
    assert manifest.size_bytes == len(data) == seg.size
    assert manifest.max_timestamp_ms == seg.max_timestamp
    assert manifest.chunk_size == chunk
    assert manifest.chunk_crcs == tuple(
        crc32c.crc32c(data[i : i + chunk]) for i in range(0, len(data), chunk)
    )
    assert manifest.chunk_count == len(manifest.chunk_crcs) > 1
    assert manifest.offset_index == fs.read_bytes(seg.index.path)
    assert manifest.time_index == fs.read_bytes(seg.time_index.path)
    assert len(manifest.offset_index) >= 8 * 5  # several index entries
    assert manifest.leader_epochs == tuple(epochs)


def test_a_failed_log_put_leaves_no_manifest(log: Log) -> None:
    seg = closed_segments(log)[0]
    store = MemoryObjectStore()
    keys = segment_keys("t", "id", 0, seg.base_offset, "s1")
    store.fail_next(1)
    with pytest.raises(RemoteStorageError):
        upload_segment(store, keys, seg, [(0, 0)], "s1", 4096)
    assert store.keys() == []
    # The manifest's own PUT failing leaves the log object alone, which no reader trusts.
    store.ops.clear()
    real_put = store.put

    def fail_manifest(key: str, data: Body, metadata: Mapping[str, str] | None = None) -> None:
        if key == keys.manifest:
            raise RemoteStorageError("injected", retriable=True)
        real_put(key, data, metadata)

    store.put = fail_manifest  # type: ignore[method-assign]
    with pytest.raises(RemoteStorageError):
        upload_segment(store, keys, seg, [(0, 0)], "s1", 4096)
    assert store.keys() == [keys.log]


def test_upload_is_paced_by_the_limiter(log: Log) -> None:
    seg = closed_segments(log)[0]
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    rate = seg.size // 4
    limiter = RateLimiter(rate, clock=lambda: now[0], sleep=sleep)
    upload_segment(
        MemoryObjectStore(), segment_keys("t", "i", 0, 0, "s"), seg, [], "s", 1024, limiter
    )
    # One second's burst, then the other three quarters at the rate.
    assert sum(slept) == pytest.approx((seg.size - rate) / rate)


def test_delete_segment_removes_the_manifest_first(log: Log) -> None:
    seg = closed_segments(log)[0]
    store = RecordingStore()
    keys = segment_keys("t", "id", 0, seg.base_offset, "s1")
    upload_segment(store, keys, seg, [], "s1", 4096)
    store.writes.clear()
    delete_segment(store, keys)
    assert store.writes == [("delete", keys.manifest), ("delete", keys.log)]
    assert store.keys() == []
    delete_segment(store, keys)  # again: nothing left, no error


MANIFEST = RemoteManifest(
    segment_id="seg-1",
    start_offset=100,
    end_offset=180,
    size_bytes=10_000,
    max_timestamp_ms=1_700_000_000_123,
    chunk_size=4096,
    chunk_crcs=(1, 2, 0xFFFFFFFF),
    offset_index=OFFSET_ENTRY.pack(0, 0) + OFFSET_ENTRY.pack(40, 5000),
    time_index=TIME_ENTRY.pack(1_700_000_000_000, 0) + TIME_ENTRY.pack(1_700_000_000_123, 40),
    leader_epochs=((3, 90), (4, 150)),
)


def test_manifest_round_trip() -> None:
    assert RemoteManifest.decode(MANIFEST.encode()) == MANIFEST
    assert MANIFEST.chunk_range(2) == (8192, 10_000)


@given(st.data())
def test_any_damage_to_a_manifest_is_detected(data: st.DataObject) -> None:
    raw = bytearray(MANIFEST.encode())
    damage = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if damage == "flip":
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif damage == "truncate":
        del raw[data.draw(st.integers(0, len(raw) - 1)) :]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=8))
    with pytest.raises(RemoteStorageError) as damaged:
        RemoteManifest.decode(bytes(raw), key="t/0/x.manifest")
    assert damaged.value.retriable is False
    assert "t/0/x.manifest" in str(damaged.value)


def test_manifest_with_a_wrong_chunk_count_is_refused() -> None:
    wrong = RemoteManifest(**_fields(chunk_crcs=(1, 2)))  # type: ignore[arg-type]
    with pytest.raises(RemoteStorageError):
        RemoteManifest.decode(wrong.encode())


@pytest.mark.parametrize(
    "changes",
    [
        {"end_offset": 99},  # ends before it starts
        {"size_bytes": 0, "chunk_crcs": ()},  # an empty object
        {"offset_index": OFFSET_ENTRY.pack(40, 5000) + OFFSET_ENTRY.pack(0, 0)},
        {"offset_index": OFFSET_ENTRY.pack(0, 0) + OFFSET_ENTRY.pack(0, 10)},
        {"offset_index": OFFSET_ENTRY.pack(0, 0) + OFFSET_ENTRY.pack(40, 10_000)},
        {"offset_index": OFFSET_ENTRY.pack(0, 0) + OFFSET_ENTRY.pack(81, 5000)},
        {"time_index": TIME_ENTRY.pack(5, 0) + TIME_ENTRY.pack(4, 40)},
        {"time_index": TIME_ENTRY.pack(5, 40) + TIME_ENTRY.pack(6, 0)},
        {"time_index": TIME_ENTRY.pack(5, 0) + TIME_ENTRY.pack(6, 81)},
    ],
)
def test_a_manifest_whose_fields_disagree_is_refused(changes: dict[str, object]) -> None:
    """Checksummed but inconsistent (a writer's bug, or another version's): a reader
    steered by it would read the wrong bytes or past the object."""
    wrong = RemoteManifest(**_fields(**changes))  # type: ignore[arg-type]
    with pytest.raises(RemoteStorageError) as caught:
        RemoteManifest.decode(wrong.encode())
    assert caught.value.retriable is False


def test_a_manifest_must_match_its_key() -> None:
    MANIFEST.check_keys(segment_keys("t", "i", 0, 100, "seg-1"))
    for keys in (segment_keys("t", "i", 0, 101, "seg-1"), segment_keys("t", "i", 0, 100, "seg-2")):
        with pytest.raises(RemoteStorageError) as caught:
            MANIFEST.check_keys(keys)
        assert caught.value.retriable is False


def _fields(**changes: object) -> dict[str, object]:
    from dataclasses import asdict

    return {**asdict(MANIFEST), **changes}


def test_rate_limiter_arithmetic() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(1000, clock=lambda: now[0], sleep=sleep)
    limiter.acquire(1000)  # the initial burst: one second's worth
    assert slept == []
    limiter.acquire(500)  # bucket empty: half a second
    assert slept == [pytest.approx(0.5)]
    now[0] += 0.25  # 250 tokens come back while idle
    limiter.acquire(250)
    assert slept == [pytest.approx(0.5)]
    limiter.acquire(3000)  # larger than the bucket: debt, slept off in full
    assert slept[-1] == pytest.approx(3.0)
    now[0] += 100  # a long idle period refills one second's worth, no more
    limiter.acquire(1500)
    assert slept[-1] == pytest.approx(0.5)
    assert limiter.reserve(0) == 0.0


def test_rate_limiter_reservations_queue_up() -> None:
    limiter = RateLimiter(100, clock=lambda: 0.0, sleep=lambda s: None)
    assert limiter.reserve(100) == 0.0
    # Callers arriving together wait one behind the other.
    assert [limiter.reserve(50) for _ in range(3)] == pytest.approx([0.5, 1.0, 1.5])


def test_unlimited_and_invalid_rates() -> None:
    unlimited = RateLimiter(-1, sleep=lambda s: pytest.fail("slept"))
    assert unlimited.unlimited
    unlimited.acquire(1 << 40)
    for bad in (0, -2):
        with pytest.raises(ValueError):
            RateLimiter(bad)


def test_upload_refuses_an_empty_segment(tmp_path: Path) -> None:
    empty = Log.open(tmp_path / "e-0").active_segment
    with pytest.raises(LocalSegmentError, match="empty segment"):
        upload_segment(MemoryObjectStore(), segment_keys("t", "i", 0, 0, "s"), empty, [], "s", 64)


def test_upload_to_s3_streams_the_segment(log: Log, s3_server: str) -> None:
    from rillet.storage.remote.store import S3ObjectStore

    seg = closed_segments(log)[2]
    store = S3ObjectStore("copier-test", prefix="c/", endpoint_url=s3_server)
    keys = segment_keys("t", "id", 0, seg.base_offset, "s3")
    manifest = upload_segment(store, keys, seg, [(0, 0)], "s3", 8192)
    data = fs.read_bytes(seg.log_path)
    assert store.get(keys.log) == data
    info = store.head(keys.log)
    assert info is not None and info.metadata[CRC_METADATA] == f"{crc32c.crc32c(data):08x}"
    assert RemoteManifest.decode(store.get(keys.manifest)) == manifest


def test_index_snapshot_survives_its_columns_being_dropped_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upload_segment reads a closed segment's index off the loop thread, while other
    threads' lookups may push it out of the process-wide LRU of loaded indexes at any
    moment: the lookup that loaded it must still get its columns. A bound of 0 makes
    the eviction happen right after the load."""
    from rillet.storage import index

    log = build_log(tmp_path / "t-0", batches=120)
    seg = closed_segments(log)[0]
    seg.freeze()  # as after the roll's index write: columns on disk only
    monkeypatch.setattr(index, "MAX_LOADED_INDEXES", 0)
    offsets, times = seg.index_snapshot()
    assert offsets == fs.read_bytes(seg.index.path) and len(offsets) > 0
    assert times == fs.read_bytes(seg.time_index.path)
    log.close()


def test_a_segment_changed_under_the_put_is_not_uploaded(tmp_path: Path) -> None:
    """The PUT reads the file again after the checksum pass: a byte that changed in
    between must fail the upload (no manifest), not ship bytes the manifest's CRCs
    contradict, which would make every later read of the segment fail."""
    log = build_log(tmp_path / "t-0")
    seg = closed_segments(log)[1]

    class FlippingStore(MemoryObjectStore):
        def put(self, key: str, data: Body, metadata: Mapping[str, str] | None = None) -> None:
            if key.endswith(".log"):
                fd = os.open(seg.log_path, os.O_RDWR)
                try:
                    old = os.pread(fd, 1, 5000)
                    os.pwrite(fd, bytes([old[0] ^ 1]), 5000)
                finally:
                    os.close(fd)
            super().put(key, data, metadata)

    store = FlippingStore()
    keys = segment_keys("t", "id", 0, seg.base_offset, "s")
    with pytest.raises(LocalSegmentError, match="changed"):
        upload_segment(store, keys, seg, [], "s", 1000)
    stored = store.keys()
    assert keys.manifest not in stored
    log.close()


def test_an_append_during_the_upload_is_refused(tmp_path: Path) -> None:
    """An active segment appended to while it uploads must not yield a manifest whose
    end offset, index or max timestamp cover bytes the log object lacks."""
    log = build_log(tmp_path / "t-0", batches=20, segment_bytes=10**7)
    seg = log.active_segment
    rng = random.Random(3)

    class Appending(RateLimiter):
        def acquire(self, n: int) -> None:  # runs after the size was read
            for _ in range(10):
                log.append(random_batch(rng, 1_800_000_000_000), 99)

    store = MemoryObjectStore()
    keys = segment_keys("t", "id", 0, 0, "s")
    with pytest.raises(LocalSegmentError, match="active"):
        upload_segment(store, keys, seg, [], "s", 1000, Appending(-1))
    stored = store.keys()
    assert keys.manifest not in stored
    log.close()


def test_an_unreadable_segment_is_a_local_error(tmp_path: Path) -> None:
    """A file shorter than its segment says is the broker's problem, not the store's:
    not a RemoteStorageError (which callers retry against the store)."""
    log = build_log(tmp_path / "t-0")
    seg = closed_segments(log)[0]
    os.truncate(seg.log_path, seg.size - 10)
    with pytest.raises(LocalSegmentError) as caught:
        upload_segment(MemoryObjectStore(), segment_keys("t", "i", 0, 0, "s"), seg, [], "s", 64)
    assert not isinstance(caught.value, RemoteStorageError)
    log.close()


def test_the_manifest_describes_only_the_bytes_uploaded(tmp_path: Path) -> None:
    """End offset and max timestamp come from the batches in the uploaded bytes."""
    log = build_log(tmp_path / "t-0")
    for seg, nxt in zip(closed_segments(log), log.segments[1:], strict=True):
        store = MemoryObjectStore()
        keys = segment_keys("t", "id", 0, seg.base_offset, "s")
        manifest = upload_segment(store, keys, seg, [], "s", 1000)
        assert manifest.end_offset == nxt.base_offset - 1
        assert manifest.max_timestamp_ms == max(h.max_timestamp for _, h in seg.headers_from(0))
    log.close()
