"""RemoteReader serves a remote segment byte for byte as Log.read serves the local one,
never serves damaged bytes, keeps its chunk cache within bounds, does one GET per chunk
however many reads want it, and reads ahead for sequential consumers.

Counts of GETs on a MemoryObjectStore stand in for timing: no test here sleeps."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from remote_helpers import build_log, closed_segments, epochs_of

from rillet.client.wire import records
from rillet.storage import Log, LogConfig
from rillet.storage.remote.copier import upload_segment
from rillet.storage.remote.layout import RemoteManifest, SegmentKeys, segment_keys
from rillet.storage.remote.reader import ChunkCache, RemoteReader
from rillet.storage.remote.store import MemoryObjectStore, ObjectStore, RemoteStorageError
from rillet.storage.segment import LogSegment

CHUNK = 1000  # small and odd: batches and index entries straddle chunk boundaries


@dataclass
class Remote:
    """A segment of a local log, uploaded."""

    segment: LogSegment
    keys: SegmentKeys
    manifest: RemoteManifest
    end: int  # the next segment's base offset


def upload_all(log: Log, store: ObjectStore, chunk: int = CHUNK) -> list[Remote]:
    segments = closed_segments(log)
    out = []
    for seg, nxt in zip(segments, [*segments[1:], log.active_segment], strict=True):
        keys = segment_keys("t", "tid", 0, seg.base_offset, f"id{seg.base_offset}")
        epochs = epochs_of(log, seg, nxt.base_offset)
        manifest = upload_segment(store, keys, seg, epochs, f"id{seg.base_offset}", chunk)
        out.append(Remote(seg, keys, manifest, nxt.base_offset))
    return out


def reader_for(store: ObjectStore, *, cache: int = 1 << 20, prefetch: int = 0) -> RemoteReader:
    return RemoteReader(store, cache, CHUNK, threads=2, prefetch_chunks=prefetch)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Log]:
    log = build_log(tmp_path_factory.mktemp("reader") / "t-0")
    yield log
    log.close()


@pytest.fixture(scope="module")
def uploaded(log: Log) -> tuple[MemoryObjectStore, list[Remote]]:
    store = MemoryObjectStore()
    return store, upload_all(log, store)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_reads_match_the_local_log(
    log: Log, uploaded: tuple[MemoryObjectStore, list[Remote]], data: st.DataObject
) -> None:
    store, remotes = uploaded
    r = data.draw(st.sampled_from(remotes))
    offset = data.draw(st.integers(r.segment.base_offset, r.end - 1))
    max_bytes = data.draw(st.one_of(st.integers(0, 3 * CHUNK), st.integers(0, 60_000)))
    max_offset = data.draw(st.one_of(st.none(), st.integers(offset - 2, r.end + 3)))
    reader = reader_for(store, prefetch=data.draw(st.integers(0, 3)))

    async def read() -> bytes:
        try:
            return await reader.read(r.keys, r.manifest, offset, max_bytes, max_offset)
        finally:
            await reader.wait_prefetched()
            reader.close()

    got = asyncio.run(read())
    want = log.read_bytes(offset, max_bytes, max_offset)
    assert got == want


def test_reads_past_the_segment_end_are_empty(
    uploaded: tuple[MemoryObjectStore, list[Remote]],
) -> None:
    store, remotes = uploaded
    reader = reader_for(store)
    r = remotes[0]

    async def reads() -> list[bytes]:
        return [
            await reader.read(r.keys, r.manifest, r.manifest.end_offset + 1, 10_000),
            await reader.read(r.keys, r.manifest, r.manifest.end_offset + 100, 10_000),
            await reader.read(r.keys, r.manifest, r.segment.base_offset, 10_000, 0),
        ]

    assert asyncio.run(reads()) == [b"", b"", b""]
    reader.close()


def test_sequential_consumer_reads_every_record_in_order(
    log: Log, uploaded: tuple[MemoryObjectStore, list[Remote]]
) -> None:
    store, remotes = uploaded
    reader = reader_for(store, prefetch=2)

    async def consume() -> list[int]:
        offsets: list[int] = []
        for r in remotes:
            manifest = await reader.manifest(r.keys)
            assert manifest == r.manifest
            offset = r.segment.base_offset
            while data := await reader.read(r.keys, manifest, offset, 5000):
                batch_records = records.decode_all(data)
                offsets += [rec.offset for rec in batch_records if rec.offset >= offset]
                offset = batch_records[-1].offset + 1
        await reader.wait_prefetched()
        return offsets

    assert asyncio.run(consume()) == list(range(remotes[-1].end))
    reader.close()


def test_reads_match_against_moto(log: Log, s3_server: str) -> None:
    from rillet.storage.remote.store import S3ObjectStore

    store = S3ObjectStore("reader-test", endpoint_url=s3_server)
    remotes = upload_all(log, store)[:3]
    reader = reader_for(store, prefetch=2)
    rng = random.Random(7)

    async def compare() -> None:
        for r in remotes:
            manifest = await reader.manifest(r.keys)
            assert manifest == r.manifest
            for _ in range(15):
                offset = rng.randint(r.segment.base_offset, r.end - 1)
                max_bytes = rng.choice((0, 500, 4000, 30_000))
                got = await reader.read(r.keys, manifest, offset, max_bytes)
                assert got == log.read_bytes(offset, max_bytes)
        await reader.wait_prefetched()

    asyncio.run(compare())
    reader.close()


# -- damage ----------------------------------------------------------------------------


def fresh_copy(log: Log, index: int = 1) -> tuple[MemoryObjectStore, Remote]:
    store = MemoryObjectStore()
    return store, upload_all(log, store)[index]


def read_all(reader: RemoteReader, r: Remote, max_bytes: int = 1 << 20) -> bytes:
    async def go() -> bytes:
        try:
            return await reader.read(r.keys, r.manifest, r.segment.base_offset, max_bytes)
        finally:
            await reader.wait_prefetched()

    return asyncio.run(go())


def assert_damaged(excinfo: pytest.ExceptionInfo[RemoteStorageError], key: str) -> None:
    assert excinfo.value.retriable is False
    assert key in str(excinfo.value)


@pytest.mark.parametrize("where", [0, 17, 999, 1000, 5001, -1])
def test_a_flipped_byte_in_the_log_object_is_never_served(log: Log, where: int) -> None:
    store, r = fresh_copy(log)
    position = where % r.manifest.size_bytes
    store.corrupt(r.keys.log, position)
    reader = reader_for(store, prefetch=3)
    with pytest.raises(RemoteStorageError) as damaged:
        read_all(reader, r)
    assert_damaged(damaged, r.keys.log)
    assert (r.keys.log, position // CHUNK) not in reader.cache
    reader.close()


def test_a_flipped_byte_in_the_manifest_is_detected(log: Log) -> None:
    store, r = fresh_copy(log)
    store.corrupt(r.keys.manifest, 40)
    reader = reader_for(store)
    with pytest.raises(RemoteStorageError) as damaged:
        asyncio.run(reader.manifest(r.keys))
    assert_damaged(damaged, r.keys.manifest)
    reader.close()


def test_a_truncated_log_object_is_detected(log: Log) -> None:
    store, r = fresh_copy(log)
    store.truncate(r.keys.log, r.manifest.size_bytes - 10)
    reader = reader_for(store)
    with pytest.raises(RemoteStorageError) as damaged:
        read_all(reader, r)
    assert_damaged(damaged, r.keys.log)

    # The chunks before the cut still serve reads that need only them.
    async def early() -> bytes:
        return await reader.read(r.keys, r.manifest, r.segment.base_offset, 0)

    assert asyncio.run(early()) == records_at(r, r.segment.base_offset)
    reader.close()


def records_at(r: Remote, offset: int) -> bytes:
    """The first batch of the segment, from the local file."""
    from rillet.storage import fs

    data = fs.read_bytes(r.segment.log_path)
    h = records.read_header(data)
    assert h.base_offset <= offset <= h.last_offset
    return data[: h.size]


def test_batch_crc_is_checked_even_when_the_chunks_check_out(log: Log) -> None:
    """Bytes damaged before upload (local corruption) carry chunk CRCs that match: the
    batch CRC still refuses them."""
    store, r = fresh_copy(log)
    data = bytearray(store.get(r.keys.log))
    first = records.read_header(data)
    data[first.size + 70] ^= 0x01  # inside the second batch's records
    chunks = tuple(crc32c.crc32c(bytes(data[i : i + CHUNK])) for i in range(0, len(data), CHUNK))
    manifest = replace(r.manifest, chunk_crcs=chunks)
    store.put(r.keys.log, bytes(data))
    reader = reader_for(store)
    with pytest.raises(RemoteStorageError) as damaged:
        asyncio.run(reader.read(r.keys, manifest, r.segment.base_offset, 1 << 20))
    assert_damaged(damaged, r.keys.log)
    # The first batch alone is intact and served.
    got = asyncio.run(reader.read(r.keys, manifest, r.segment.base_offset, 0))
    assert got == bytes(data[: first.size])
    reader.close()


def test_an_outage_is_a_retriable_error_then_reads_resume(log: Log) -> None:
    store, r = fresh_copy(log)
    reader = reader_for(store)
    store.unavailable = True
    with pytest.raises(RemoteStorageError) as down:
        read_all(reader, r)
    assert down.value.retriable is True
    assert reader.get_errors >= 1
    store.unavailable = False
    assert read_all(reader, r) == log.read_bytes(r.segment.base_offset, 1 << 20)
    reader.close()


# -- the cache, single flight, read-ahead ---------------------------------------------------


def test_chunk_cache_is_a_bounded_lru() -> None:
    cache = ChunkCache(250)
    cache.put(("a", 0), b"x" * 100)
    cache.put(("a", 1), b"y" * 100)
    assert cache.get(("a", 0)) == b"x" * 100  # now the most recent
    cache.put(("b", 0), b"z" * 100)  # evicts ("a", 1), the least recent
    assert ("a", 1) not in cache and ("a", 0) in cache and ("b", 0) in cache
    assert cache.size_bytes == 200
    cache.put(("c", 0), b"w" * 300)  # larger than the bound: never kept
    assert ("c", 0) not in cache and cache.size_bytes == 200
    cache.put(("a", 0), b"v" * 50)  # replaced, accounted
    assert cache.size_bytes == 150
    cache.discard_object("a")
    assert len(cache) == 1 and cache.size_bytes == 100
    assert (cache.hits, cache.misses) == (1, 0)


def test_the_cache_stays_within_its_bound(
    log: Log, uploaded: tuple[MemoryObjectStore, list[Remote]]
) -> None:
    store, remotes = uploaded
    bound = 3 * CHUNK + 500
    reader = reader_for(store, cache=bound, prefetch=2)
    rng = random.Random(3)

    async def reads() -> None:
        for _ in range(200):
            r = rng.choice(remotes)
            offset = rng.randint(r.segment.base_offset, r.end - 1)
            max_bytes = rng.choice((0, 2000, 9000))
            got = await reader.read(r.keys, r.manifest, offset, max_bytes)
            assert got == log.read_bytes(offset, max_bytes)
            assert reader.cache.size_bytes <= bound
            await reader.wait_prefetched()
            assert reader.cache.size_bytes <= bound

    asyncio.run(reads())
    assert len(reader.cache) <= 3
    reader.close()


def test_concurrent_reads_of_one_chunk_do_one_get(log: Log) -> None:
    store, r = fresh_copy(log)
    offset = r.segment.base_offset

    async def once() -> bytes:
        return await reader_for(store).read(r.keys, r.manifest, offset, 0)

    alone = asyncio.run(once())
    gets_alone = len(store.gets)
    assert gets_alone >= 1
    store.gets.clear()
    reader = reader_for(store)

    async def together() -> list[bytes]:
        return await asyncio.gather(*(reader.read(r.keys, r.manifest, offset, 0) for _ in range(8)))

    assert asyncio.run(together()) == [alone] * 8
    assert len(store.gets) == gets_alone
    reader.close()


def test_manifest_reads_are_cached_and_shared(log: Log) -> None:
    store, r = fresh_copy(log)
    reader = reader_for(store)

    async def many() -> list[RemoteManifest]:
        first = await asyncio.gather(*(reader.manifest(r.keys) for _ in range(5)))
        return [*first, await reader.manifest(r.keys)]

    assert asyncio.run(many()) == [r.manifest] * 6
    assert [g for g in store.gets if g[0] == r.keys.manifest] == [(r.keys.manifest, 0, None)]
    reader.close()


def test_the_manifest_cache_is_bounded(log: Log) -> None:
    store = MemoryObjectStore()
    remotes = upload_all(log, store)
    reader = RemoteReader(store, 1 << 20, CHUNK, 2, 0, manifest_cache_bytes=4000)

    async def all_manifests() -> None:
        for r in remotes:
            await reader.manifest(r.keys)

    asyncio.run(all_manifests())
    assert reader._manifest_bytes <= 4000 or len(reader._manifests) == 1
    assert len(reader._manifests) < len(remotes)
    reader.close()


def test_sequential_reads_hit_prefetched_chunks(tmp_path: Path) -> None:
    # Small batches, so that a read never reaches further than the read-ahead.
    log = Log.open(tmp_path / "s-0", LogConfig(segment_bytes=40_000, index_interval_bytes=512))
    rng = random.Random(5)
    for i in range(400):
        n = rng.randint(1, 4)
        log.append(
            records.encode_batch([rng.randbytes(rng.randint(1, 100)) for _ in range(n)],
                                 timestamp_ms=i),
            0,
        )  # fmt: skip
    store = MemoryObjectStore()
    r = upload_all(log, store, chunk=2048)[0]
    assert r.manifest.chunk_count >= 8
    reader = RemoteReader(store, 1 << 20, 2048, threads=2, prefetch_chunks=2)

    async def consume() -> list[int]:
        waited: list[int] = []  # GETs each read had to wait for
        offset = r.segment.base_offset
        while True:
            before = len(store.gets)
            data = await reader.read(r.keys, r.manifest, offset, 1500)
            waited.append(len(store.gets) - before)
            await reader.wait_prefetched()  # stands for the consumer's think time
            if not data:
                return waited
            offset = [h for _, h in records.iter_batches(data)][-1].next_offset

    waited = asyncio.run(consume())
    assert waited[0] >= 1 and len(waited) > r.manifest.chunk_count
    # After the first read, every read found its chunks already fetched ahead ...
    assert all(w == 0 for w in waited[1:])
    # ... and every chunk was fetched exactly once.
    assert sorted(g[1] for g in store.gets) == [i * 2048 for i in range(r.manifest.chunk_count)]
    reader.close()
    log.close()


def test_offset_for_timestamp_matches_the_local_log(
    log: Log, uploaded: tuple[MemoryObjectStore, list[Remote]]
) -> None:
    store, remotes = uploaded
    reader = reader_for(store)
    stamps = sorted(
        {h.max_timestamp for r in remotes for _, h in r.segment.headers_from(0)}
        | {h.base_timestamp for r in remotes for _, h in r.segment.headers_from(0)}
    )
    rng = random.Random(11)
    probes = [stamps[0] - 1, *rng.sample(stamps, 60), *(s + 1 for s in rng.sample(stamps, 30))]
    probes.append(stamps[-1] + 10**6)

    async def remote_answer(ts: int) -> int | None:
        for r in remotes:
            found = await reader.offset_for_timestamp(r.keys, r.manifest, ts)
            if found is not None:
                return found
        return None

    async def compare() -> None:
        for ts in probes:
            local = log.offset_for_timestamp(ts)
            want = local.offset if local is not None and local.offset < remotes[-1].end else None
            assert await remote_answer(ts) == want, ts

    asyncio.run(compare())
    reader.close()


def test_no_read_ahead_without_a_cache_to_keep_it(log: Log) -> None:
    store, r = fresh_copy(log)
    reader = reader_for(store, cache=0, prefetch=3)

    async def read_twice() -> list[bytes]:
        out = []
        for _ in range(2):
            out.append(await reader.read(r.keys, r.manifest, r.segment.base_offset, 0))
            await reader.wait_prefetched()
        return out

    first, second = asyncio.run(read_twice())
    assert first == second == records_at(r, r.segment.base_offset)
    assert len(store.gets) == 2  # the one chunk, once per read: nothing ahead, nothing kept
    assert reader.cache.size_bytes == 0
    reader.close()


class GatedStore(MemoryObjectStore):
    """GETs of ``key`` block until ``gate`` is set (a connection that trickles)."""

    def __init__(self, key: str = "") -> None:
        super().__init__()
        self.key = key
        self.gate = threading.Event()
        self.blocked = threading.Event()  # a GET is waiting at the gate

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key == self.key and not self.gate.is_set():
            self.blocked.set()
            self.gate.wait(60)  # a guard against a hung test, never reached when it passes
        return super().get(key, start, end)


def gated_copy(log: Log) -> tuple[GatedStore, Remote]:
    store = GatedStore()
    r = upload_all(log, store)[1]
    store.key = r.keys.log
    return store, r


def test_a_reupload_under_the_same_keys_is_never_served_old_bytes(tmp_path: Path) -> None:
    """A retried upload writes the same keys again; chunks cached from the old object
    must not answer a read under the new manifest."""
    a = build_log(tmp_path / "a" / "t-0", seed=1)
    b = build_log(tmp_path / "b" / "t-0", seed=2)
    store = MemoryObjectStore()
    keys = segment_keys("t", "tid", 0, 0, "same")
    ma = upload_segment(store, keys, closed_segments(a)[0], [], "same", CHUNK)
    reader = reader_for(store)

    async def go() -> bytes:
        await reader.read(keys, ma, 0, 3000)
        mb = upload_segment(store, keys, closed_segments(b)[0], [], "same", CHUNK)
        return await reader.read(keys, mb, 0, 3000)

    assert asyncio.run(go()) == b.read_bytes(0, 3000)
    reader.close()
    a.close()
    b.close()


def test_a_manifest_under_another_segments_key_is_refused(log: Log) -> None:
    store = MemoryObjectStore()
    remotes = upload_all(log, store)
    r0, r1 = remotes[0], remotes[1]
    store.put(r1.keys.manifest, store.get(r0.keys.manifest))
    reader = reader_for(store)
    with pytest.raises(RemoteStorageError) as caught:
        asyncio.run(reader.manifest(r1.keys))
    assert caught.value.retriable is False
    reader.close()


def test_an_offset_the_manifest_promises_but_the_object_lacks_is_damage(log: Log) -> None:
    """A manifest claiming offsets its object does not hold (written for a segment that
    grew meanwhile) must fail the read, never answer b"" (the end of the segment)."""
    store, r = fresh_copy(log)
    promised = replace(r.manifest, end_offset=r.manifest.end_offset + 50)
    reader = reader_for(store)
    with pytest.raises(RemoteStorageError) as caught:
        asyncio.run(reader.read(r.keys, promised, r.manifest.end_offset + 10, 1000))
    assert caught.value.retriable is False
    late = replace(r.manifest, max_timestamp_ms=r.manifest.max_timestamp_ms + 10_000)
    with pytest.raises(RemoteStorageError):
        asyncio.run(reader.offset_for_timestamp(r.keys, late, late.max_timestamp_ms))
    reader.close()


def test_a_get_that_never_returns_fails_and_the_next_read_starts_afresh(log: Log) -> None:
    store, r = gated_copy(log)
    reader = RemoteReader(store, 1 << 20, CHUNK, threads=2, prefetch_chunks=0, get_timeout_s=0.05)
    want = log.read_bytes(r.segment.base_offset, 0)

    async def go() -> bytes:
        with pytest.raises(RemoteStorageError) as stuck:
            await reader.read(r.keys, r.manifest, r.segment.base_offset, 0)
        assert stuck.value.retriable is True
        assert not reader._inflight  # the stuck GET is no longer joined
        store.key = ""  # the store answers again, for any new GET
        return await reader.read(r.keys, r.manifest, r.segment.base_offset, 0)

    try:
        assert asyncio.run(go()) == want
    finally:
        store.gate.set()
    reader.close()


def test_reads_fail_fast_once_every_thread_is_stuck(log: Log) -> None:
    store, r = gated_copy(log)
    reader = RemoteReader(store, 1 << 20, CHUNK, threads=1, prefetch_chunks=0, get_timeout_s=0.05)

    async def go() -> None:
        with pytest.raises(RemoteStorageError):
            await reader.read(r.keys, r.manifest, r.segment.base_offset, 0)
        before = len(store.gets)
        with pytest.raises(RemoteStorageError, match="not answering") as fast:
            await reader.read(r.keys, r.manifest, r.segment.base_offset, 0)
        assert fast.value.retriable is True and len(store.gets) == before

    try:
        asyncio.run(go())
    finally:
        store.gate.set()
    reader.close()


def test_close_fails_waiting_reads_as_retriable_and_later_reads_too(log: Log) -> None:
    store, r = gated_copy(log)
    reader = reader_for(store)

    async def go() -> None:
        pending = asyncio.ensure_future(reader.read(r.keys, r.manifest, r.segment.base_offset, 0))
        await asyncio.to_thread(store.blocked.wait, 60)
        reader.close()
        with pytest.raises(RemoteStorageError) as waiting:
            await pending
        assert waiting.value.retriable is True
        for later in (
            reader.read(r.keys, r.manifest, r.segment.base_offset, 0),
            reader.manifest(r.keys),
        ):
            with pytest.raises(RemoteStorageError):
                await later

    try:
        asyncio.run(go())
    finally:
        store.gate.set()


def test_forget_cancels_the_segments_gets(log: Log) -> None:
    """A deleted segment's GET under way must not put its chunk in the cache later."""
    store, r = gated_copy(log)
    other = upload_all(log, store)[2]
    reader = RemoteReader(store, 1 << 20, CHUNK, threads=1, prefetch_chunks=0)

    async def go() -> None:
        pending = asyncio.ensure_future(reader.read(r.keys, r.manifest, r.segment.base_offset, 0))
        await asyncio.to_thread(store.blocked.wait, 60)
        reader.forget(r.keys)
        with pytest.raises(RemoteStorageError) as waiting:
            await pending
        assert waiting.value.retriable is True
        store.gate.set()
        # One thread: this read's GET runs after the forgotten one returned.
        await reader.read(other.keys, other.manifest, other.segment.base_offset, 0)

    try:
        asyncio.run(go())
    finally:
        store.gate.set()
    assert all(k[0] != r.keys.log for k in reader.cache._chunks)
    reader.close()


def test_read_ahead_never_multiplies_gets_for_many_sequential_readers(tmp_path: Path) -> None:
    """16 sequential consumers over a cache of 8 chunks: read-ahead cannot be kept until
    its readers come, so it must stand back, not evict and fetch again."""
    store = MemoryObjectStore()
    parts = []
    for p in range(16):
        log = Log.open(
            tmp_path / f"s-{p}", LogConfig(segment_bytes=40_000, index_interval_bytes=512)
        )
        rng = random.Random(p)
        for i in range(400):
            values = [rng.randbytes(rng.randint(1, 100)) for _ in range(rng.randint(1, 4))]
            log.append(records.encode_batch(values, timestamp_ms=i), 0)
        keys = segment_keys("t", "tid", p, 0, "x")
        parts.append((keys, upload_segment(store, keys, log.segments[0], [], "x", 2048)))
        log.close()

    def gets(prefetch: int) -> tuple[int, int]:
        store.gets.clear()
        reader = RemoteReader(store, 8 * 2048, 2048, threads=2, prefetch_chunks=prefetch)
        ahead_peak = 0

        async def consume() -> None:
            nonlocal ahead_peak
            offsets = [0] * len(parts)
            done = [False] * len(parts)

            async def one(i: int) -> None:
                nonlocal ahead_peak
                keys, m = parts[i]
                data = await reader.read(keys, m, offsets[i], 1500)
                ahead_peak = max(ahead_peak, sum(reader._ahead.values()))
                if not data:
                    done[i] = True
                    return
                offsets[i] = [h for _, h in records.iter_batches(data)][-1].next_offset

            while not all(done):
                await asyncio.gather(*(one(i) for i in range(len(parts)) if not done[i]))
            await reader.wait_prefetched()

        asyncio.run(consume())
        reader.close()
        return len(store.gets), ahead_peak

    without, _ = gets(0)
    with_prefetch, ahead_peak = gets(4)
    assert with_prefetch <= without + 32  # a few probes, not a multiple
    assert ahead_peak <= 4 * 2048  # read-ahead in flight or unused: half the cache


def test_reads_under_way_hold_bounded_bytes(log: Log) -> None:
    """Eight concurrent reads of a whole segment: the bytes they hold at once stay
    within the bound (one read may exceed it alone), and all get their answer."""
    store, r = fresh_copy(log)
    size = r.manifest.size_bytes
    bound = size + 2 * CHUNK
    reader = RemoteReader(store, 0, CHUNK, threads=2, prefetch_chunks=0, read_bytes_in_flight=bound)

    async def go() -> list[bytes]:
        return await asyncio.gather(
            *(reader.read(r.keys, r.manifest, r.segment.base_offset, size) for _ in range(8))
        )

    want = log.read_bytes(r.segment.base_offset, size)
    assert asyncio.run(go()) == [want] * 8
    assert 0 < reader.read_bytes_peak <= bound
    assert reader.read_bytes_held == 0
    reader.close()


def test_reads_of_batches_larger_than_max_bytes_never_wait_for_each_other(log: Log) -> None:
    """Reads that each hold part of the bound and then need more for a batch past
    their max_bytes must not wait on one another."""
    store, r = fresh_copy(log)
    reader = RemoteReader(
        store, 0, CHUNK, threads=2, prefetch_chunks=0, read_bytes_in_flight=3 * CHUNK
    )
    offsets = [h.base_offset for _, h in r.segment.headers_from(0)]

    async def go() -> list[bytes]:
        return await asyncio.gather(*(reader.read(r.keys, r.manifest, o, 0) for o in offsets))

    assert asyncio.run(go()) == [log.read_bytes(o, 0) for o in offsets]
    assert reader.read_bytes_held == 0
    reader.close()
