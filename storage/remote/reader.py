"""Serve reads of remote segments: ranged GETs in chunks, checked, cached, read ahead.

A read returns exactly what ``Log.read`` returns on the same segment: whole batches
from the one holding the offset, within ``max_bytes`` but at least one, none reaching
``max_offset``. It finds its start the way a local read does, through the segment's own
offset index (carried in the manifest), then fetches the chunks covering the bytes.
Each chunk is checked against the manifest's CRC-32C as it arrives, and each batch
handed out is checked against its own CRC, so damaged bytes are never served: a damaged
or truncated object raises RemoteStorageError(retriable=False) naming its key.

The event loop never blocks: GETs and chunk checksums run in the reader's own bounded
thread pool; everything else (cache, index lookups, cutting batches) runs on the loop.
The chunk cache is one bounded LRU in bytes shared by every partition, with one GET per
chunk however many reads want it at once; after each read the next chunks of the
segment are fetched in the background for the consumer's next read.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import crc32c

from rillet.client.wire import records
from rillet.client.wire.errors import CorruptRecordError
from rillet.client.wire.records import HEADER_SIZE, BatchHeader
from rillet.storage.index import OffsetIndex, SparseIndex, TimeIndex
from rillet.storage.remote.layout import RemoteManifest, SegmentKeys
from rillet.storage.remote.store import ObjectStore, RemoteStorageError

logger = logging.getLogger(__name__)

T = TypeVar("T")
# (log object key, start, end, CRC-32C): the bytes a manifest vouches for, not just
# where they are, so a re-upload under the same key never serves the old object's.
ChunkKey = tuple[str, int, int, int]
NO_LIMIT = 1 << 63  # a read without max_offset: every offset of the segment qualifies
MANIFEST_CACHE_BYTES = 16 * 1024 * 1024
GET_TIMEOUT_S = 30.0
READ_BYTES_IN_FLIGHT = 64 * 1024 * 1024


class Held:
    """Bytes of the reader's in-flight bound that a read's answer still holds after the
    read returned: its caller releases them (once) when it is done with the bytes, e.g.
    once they have been written to a socket."""

    __slots__ = ("_reader", "nbytes")

    def __init__(self, reader: RemoteReader, nbytes: int) -> None:
        self._reader = reader
        self.nbytes = nbytes

    def release(self) -> None:
        n, self.nbytes = self.nbytes, 0
        if n:
            self._reader._release(n)


class ChunkCache:
    """A bounded LRU of verified chunks, in bytes. Loop-thread only (no lock).

    A chunk larger than the whole bound is never kept. ``hits``/``misses`` count lookups.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0
        self._chunks: OrderedDict[ChunkKey, bytes] = OrderedDict()
        # Keys of recently evicted chunks (no data): a miss on one means the cache is
        # too small for what is being read, and read-ahead would only make it worse.
        self._ghosts: OrderedDict[ChunkKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, key: ChunkKey) -> bool:
        return key in self._chunks

    def get(self, key: ChunkKey) -> bytes | None:
        data = self._chunks.get(key)
        if data is None:
            self.misses += 1
            return None
        self.hits += 1
        self._chunks.move_to_end(key)
        return data

    def put(self, key: ChunkKey, data: bytes) -> None:
        old = self._chunks.pop(key, None)
        if old is not None:
            self.size_bytes -= len(old)
        if len(data) > self.max_bytes:
            return
        self._chunks[key] = data
        self.size_bytes += len(data)
        while self.size_bytes > self.max_bytes:
            gone, evicted = self._chunks.popitem(last=False)
            self.size_bytes -= len(evicted)
            self._ghosts[gone] = None
            while len(self._ghosts) > max(2 * len(self._chunks), 64):
                self._ghosts.popitem(last=False)

    def recently_evicted(self, key: ChunkKey) -> bool:
        return key in self._ghosts

    def discard_object(self, object_key: str) -> None:
        """Drop every chunk of one object (a deleted remote segment)."""
        for key in [k for k in self._chunks if k[0] == object_key]:
            self.size_bytes -= len(self._chunks.pop(key))


@dataclass(slots=True)
class _Cached:
    """A manifest and its indexes, decoded once for the reads that follow."""

    manifest: RemoteManifest
    charge: int  # bytes counted against the manifest cache's bound
    offsets: SparseIndex = field(init=False)
    times: SparseIndex = field(init=False)

    def __post_init__(self) -> None:
        self.offsets = OffsetIndex.from_bytes(self.manifest.offset_index, "remote .index")
        self.times = TimeIndex.from_bytes(self.manifest.time_index, "remote .timeindex")


class RemoteReader:
    """Reads of remote segments for one broker; see the module docstring.

    ``chunk_size`` is the size the copier is given for new uploads; reads use each
    manifest's own, so segments uploaded under an older setting stay readable.
    ``prefetch_chunks`` chunks past the end of each read are fetched in the background.
    """

    def __init__(
        self,
        store: ObjectStore,
        cache_bytes: int,
        chunk_size: int,
        threads: int,
        prefetch_chunks: int,
        *,
        manifest_cache_bytes: int = MANIFEST_CACHE_BYTES,
        get_timeout_s: float = GET_TIMEOUT_S,
        read_bytes_in_flight: int = READ_BYTES_IN_FLIGHT,
    ) -> None:
        self.store = store
        self.cache = ChunkCache(cache_bytes)
        self.chunk_size = chunk_size
        self.prefetch_chunks = prefetch_chunks
        self.get_timeout_s = get_timeout_s
        self._threads = max(threads, 1)
        self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="remote")
        # Threads still stuck in a call whose deadline passed (see _in_pool).
        self._abandoned = 0
        self._abandoned_lock = threading.Lock()
        # Bytes that reads under way may hold at once (one read alone may exceed it).
        self.read_bytes_limit = read_bytes_in_flight
        self.read_bytes_held = 0
        self.read_bytes_peak = 0
        self._read_waiters: list[asyncio.Future[None]] = []
        # Read-ahead: chunks fetched ahead and not used yet (kept to half the cache),
        # and demand GETs under way (read-ahead waits while there are any).
        self._ahead: dict[ChunkKey, int] = {}
        self._demand = 0
        # Whether read-ahead pays: +1 per chunk read ahead then used, -1 per chunk read
        # ahead then evicted unused. Below 0 it pauses for ``_ahead_pause`` reads,
        # doubling each time it proves useless again (many sequential consumers on a
        # cache too small for their read-ahead would otherwise multiply the GETs).
        self._ahead_score = 0
        self._ahead_skip = 0
        self._ahead_pause = 1
        self.prefetch_wasted = 0
        self._inflight: dict[ChunkKey, asyncio.Task[bytes]] = {}
        self._manifests: OrderedDict[str, _Cached] = OrderedDict()
        self._manifest_bytes = 0
        self._manifest_cache_bytes = manifest_cache_bytes
        self._manifest_inflight: dict[str, asyncio.Task[RemoteManifest]] = {}
        self._background: set[asyncio.Task[bytes]] = set()
        self._closed = False
        # What went to the store (KIP-958's remote fetch metrics).
        self.get_requests = 0
        self.get_bytes = 0
        self.get_errors = 0

    # -- manifests --------------------------------------------------------------------

    async def manifest(self, keys: SegmentKeys) -> RemoteManifest:
        """The segment's manifest, from the bounded cache or one GET (shared by every
        caller asking meanwhile). RemoteStorageError when missing, damaged, or not the
        manifest its key names."""
        self._check_open()
        cached = self._manifests.get(keys.manifest)
        if cached is not None:
            self._manifests.move_to_end(keys.manifest)
            return cached.manifest
        task = self._manifest_inflight.get(keys.manifest)
        if task is None:
            task = self._spawn(self._fetch_manifest(keys))
            self._manifest_inflight[keys.manifest] = task
            task.add_done_callback(lambda _: self._manifest_inflight.pop(keys.manifest, None))
        return await self._join(task)

    async def _fetch_manifest(self, keys: SegmentKeys) -> RemoteManifest:
        data = await self._get(keys.manifest, 0, None)
        manifest = await self._in_pool(RemoteManifest.decode, data, key=keys.manifest)
        manifest.check_keys(keys)
        self._remember(keys, manifest)
        return manifest

    def _remember(self, keys: SegmentKeys, manifest: RemoteManifest) -> _Cached:
        old = self._manifests.pop(keys.manifest, None)
        if old is not None:
            self._manifest_bytes -= old.charge
        # The index bytes, plus their decoded columns at about twice that.
        charge = 3 * (len(manifest.offset_index) + len(manifest.time_index))
        charge += 4 * len(manifest.chunk_crcs) + 256
        cached = _Cached(manifest, charge)
        self._manifests[keys.manifest] = cached
        self._manifest_bytes += charge
        while self._manifest_bytes > self._manifest_cache_bytes and len(self._manifests) > 1:
            _, evicted = self._manifests.popitem(last=False)
            self._manifest_bytes -= evicted.charge
        return cached

    def _cached(self, keys: SegmentKeys, manifest: RemoteManifest) -> _Cached:
        cached = self._manifests.get(keys.manifest)
        if cached is not None and (cached.manifest is manifest or cached.manifest == manifest):
            self._manifests.move_to_end(keys.manifest)
            return cached
        # A different manifest under the same key (a re-upload): it replaces the cached
        # one; chunks are keyed by their CRCs, so the old object's are never served.
        return self._remember(keys, manifest)

    def forget(self, keys: SegmentKeys) -> None:
        """Drop what is cached of a segment (it was deleted remotely), and cancel its
        GETs under way so their chunks never land in the cache afterwards (readers
        waiting on them get a retriable RemoteStorageError)."""
        cached = self._manifests.pop(keys.manifest, None)
        if cached is not None:
            self._manifest_bytes -= cached.charge
        task = self._manifest_inflight.pop(keys.manifest, None)
        if task is not None:
            task.cancel()
        for key in [k for k in self._inflight if k[0] == keys.log]:
            self._inflight.pop(key).cancel()
        for key in [k for k in self._ahead if k[0] == keys.log]:
            del self._ahead[key]
        self.cache.discard_object(keys.log)

    # -- reads ------------------------------------------------------------------------

    async def read(
        self,
        keys: SegmentKeys,
        manifest: RemoteManifest,
        offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        *,
        keep: list[Held] | None = None,
    ) -> bytes:
        """Whole batches from the one holding ``offset``, as ``Log.read`` cuts them on
        the same segment.

        With ``keep``, the answer's bytes stay counted against the in-flight bound after
        the read returns, until the ``Held`` appended to it is released: an answer that
        waits to be sent is memory too, and many of them could otherwise pile up past
        any bound.

        b"" means nothing of this segment qualifies: ``offset`` is at or past
        ``max_offset`` or past ``manifest.end_offset``. A compacted segment may end
        before the next one starts (a gap of offsets no batch holds): a caller whose
        offset is past ``manifest.end_offset`` must move on to the segment holding the
        next offset, not take b"" for the end of the log. An offset up to
        ``end_offset`` that finds no batch means the object is damaged, and raises.
        """
        self._check_open()
        end = NO_LIMIT if max_offset is None else max_offset
        if offset >= end or offset > manifest.end_offset:
            return b""
        cached = self._cached(keys, manifest)
        # Bytes this read may hold: its answer plus the chunks at either end of it.
        want = min(max_bytes, manifest.size_bytes) + 2 * manifest.chunk_size
        reserved = await self._reserve(want)
        kept = 0
        try:
            held: dict[int, bytes] = {}  # this read's chunks, whatever the cache evicts
            found = await self._find(keys, cached, offset, held)
            if found is None:
                raise _damaged(
                    keys.log, f"no batch holds offset {offset} (end offset {manifest.end_offset})"
                )
            position, first = found
            if first.last_offset >= end:
                return b""
            extra = first.size + 2 * manifest.chunk_size - reserved
            if extra > 0:
                # One batch larger than max_bytes: counted, but never waited for (two
                # reads each holding part of the bound and waiting for more would wait
                # for each other forever).
                self.read_bytes_held += extra
                self.read_bytes_peak = max(self.read_bytes_peak, self.read_bytes_held)
                reserved += extra
            limit = position + max(max_bytes, first.size)
            stop = min(limit, manifest.size_bytes)
            data = await self._range(keys, manifest, position, stop, held)
            held.clear()
            cut = self._cut(keys, manifest, position, data, first, end)
            result = data if cut == len(data) else data[:cut]
            del data
            self._check_batches(keys, position, result)
            self._prefetch(keys, manifest, (position + cut - 1) // manifest.chunk_size)
            if keep is not None and result:
                kept = len(result)  # within the reservation: it covered the answer
                keep.append(Held(self, kept))
            return result
        finally:
            self._release(reserved - kept)

    async def _reserve(self, n: int) -> int:
        """Wait until ``n`` more bytes fit the in-flight read bound (a read larger than
        the whole bound waits until it is alone), then count them."""
        loop = asyncio.get_running_loop()
        while self.read_bytes_held and self.read_bytes_held + n > self.read_bytes_limit:
            waiter: asyncio.Future[None] = loop.create_future()
            self._read_waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._read_waiters:
                    self._read_waiters.remove(waiter)
        self.read_bytes_held += n
        self.read_bytes_peak = max(self.read_bytes_peak, self.read_bytes_held)
        return n

    def _release(self, n: int) -> None:
        self.read_bytes_held -= n
        waiters, self._read_waiters = self._read_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _cut(
        self,
        keys: SegmentKeys,
        manifest: RemoteManifest,
        start: int,
        data: bytes,
        first: BatchHeader,
        end: int,
    ) -> int:
        """Bytes of ``data`` (the object from ``start`` up to the read's byte limit or
        the object's end) that the read returns: ``Segment.read_end``'s rule, walking
        the headers in hand instead of jumping by the index (the bytes are needed
        anyway; the walk gives the same answer)."""
        p = first.size
        at_object_end = start + len(data) == manifest.size_bytes
        while p < len(data):
            if p + HEADER_SIZE > len(data) and not at_object_end:
                return p  # a batch starting here cannot end within the limit
            h = self._header(keys, data, p, start)
            if start + p + h.size > manifest.size_bytes:
                raise _damaged(keys.log, f"batch at {start + p} runs past the object's end")
            if p + h.size > len(data) or h.last_offset >= end:
                return p
            p += h.size
        return p

    async def _find(
        self, keys: SegmentKeys, cached: _Cached, offset: int, held: dict[int, bytes]
    ) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= ``offset`` (``Segment.find``)."""
        manifest = cached.manifest
        entry = cached.offsets.floor(offset - manifest.start_offset)
        start = entry[1] if entry else 0
        return await self._walk(keys, manifest, start, "last_offset", offset, held)

    async def _walk(
        self,
        keys: SegmentKeys,
        manifest: RemoteManifest,
        position: int,
        column: str,
        at: int,
        held: dict[int, bytes],
    ) -> tuple[int, BatchHeader] | None:
        """From ``position``, the first batch whose ``column`` is >= ``at``. Holds
        only the chunks from the current header on (an index-less segment walks from
        0: what it passed is let go)."""
        size = manifest.chunk_size
        while position < manifest.size_bytes:
            for i in [i for i in held if i < position // size]:
                del held[i]
            stop = min(position + HEADER_SIZE, manifest.size_bytes)
            data = await self._range(keys, manifest, position, stop, held)
            h = self._header(keys, data, 0, position)
            if h.size < HEADER_SIZE or position + h.size > manifest.size_bytes:
                raise _damaged(keys.log, f"batch at {position} has length {h.batch_length}")
            if getattr(h, column) >= at:
                return position, h
            position += h.size
        return None

    @staticmethod
    def _header(keys: SegmentKeys, data: bytes, p: int, start: int) -> BatchHeader:
        try:
            h = records.read_header(data, p)
        except CorruptRecordError as exc:
            raise _damaged(keys.log, f"at {start + p}: {exc}") from exc
        if h.size < HEADER_SIZE:
            raise _damaged(keys.log, f"batch at {start + p} has length {h.batch_length}")
        return h

    @staticmethod
    def _check_batches(keys: SegmentKeys, start: int, data: bytes) -> None:
        """Every batch's own CRC (and framing), before any is served."""
        try:
            for _ in records.iter_batches(data, validate=True):
                pass
        except CorruptRecordError as exc:
            raise _damaged(keys.log, f"in the read from {start}: {exc}") from exc

    async def offset_for_timestamp(
        self, keys: SegmentKeys, manifest: RemoteManifest, timestamp: int
    ) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp`` in this segment
        (``Log.offset_for_timestamp`` within one segment), or None."""
        self._check_open()
        if manifest.max_timestamp_ms < timestamp:
            return None
        cached = self._cached(keys, manifest)
        # Segment.find_timestamp: start at the batch the time index points below it.
        entry = cached.times.floor_before(timestamp)
        start = 0
        if entry is not None:
            hit = cached.offsets.floor(entry[1])
            start = hit[1] if hit else 0
        held: dict[int, bytes] = {}
        found = await self._walk(keys, manifest, start, "max_timestamp", timestamp, held)
        if found is None:  # the manifest promised a batch this late: the object lacks it
            raise _damaged(keys.log, f"no batch reaches timestamp {timestamp}")
        position, h = found
        data = await self._range(keys, manifest, position, position + h.size, held)
        self._check_batches(keys, position, data)
        try:
            offsets, stamps, *_ = records.decode_columns(data, 0, h)
        except CorruptRecordError as exc:
            raise _damaged(keys.log, f"batch at {position}: {exc}") from exc
        for off, ts in zip(offsets, stamps, strict=True):
            if ts >= timestamp:
                return off
        return None

    # -- chunks -----------------------------------------------------------------------

    async def _range(
        self,
        keys: SegmentKeys,
        manifest: RemoteManifest,
        start: int,
        end: int,
        held: dict[int, bytes],
    ) -> bytes:
        """Object bytes [start, end) from verified chunks (fetched at once when missing).
        ``held`` keeps the chunks one read has used, so it never fetches one twice."""
        if end <= start:
            return b""
        size = manifest.chunk_size
        first, last = start // size, (end - 1) // size
        if first == last:
            chunk = await self._chunk(keys, manifest, first, held)
            return chunk[start - first * size : end - first * size]
        chunks = await asyncio.gather(
            *(self._chunk(keys, manifest, i, held) for i in range(first, last + 1))
        )
        # One copy: the wanted part of each chunk, joined.
        views = [memoryview(c) for c in chunks]
        views[-1] = views[-1][: end - last * size]
        views[0] = views[0][start - first * size :]
        return b"".join(views)

    @staticmethod
    def _chunk_key(keys: SegmentKeys, manifest: RemoteManifest, i: int) -> ChunkKey:
        start, end = manifest.chunk_range(i)
        return (keys.log, start, end, manifest.chunk_crcs[i])

    async def _chunk(
        self, keys: SegmentKeys, manifest: RemoteManifest, i: int, held: dict[int, bytes]
    ) -> bytes:
        data = held.get(i)
        if data is not None:
            return data
        key = self._chunk_key(keys, manifest, i)
        data = self.cache.get(key)
        if data is None:
            task = self._inflight.get(key)
            if task is None:
                if self.cache.recently_evicted(key):  # fetched again: the cache thrashes
                    self._ahead_score = min(self._ahead_score, 0) - 1
                task = self._start_chunk(keys, manifest, i, demand=True)
            data = await self._join(task)
        if self._ahead.pop(key, None) is not None:  # read ahead, now used
            self._ahead_score = min(self._ahead_score + 1, 8)
            if self._ahead_score >= 4:
                self._ahead_pause = 1
        held[i] = data
        return data

    def _start_chunk(
        self, keys: SegmentKeys, manifest: RemoteManifest, i: int, *, demand: bool
    ) -> asyncio.Task[bytes]:
        key = self._chunk_key(keys, manifest, i)
        task = self._spawn(self._fetch_chunk(keys, manifest, i, key))
        self._inflight[key] = task
        if demand:
            self._demand += 1

        def done(_: asyncio.Task[bytes]) -> None:
            if self._inflight.get(key) is task:
                del self._inflight[key]
            if demand:
                self._demand -= 1

        task.add_done_callback(done)
        return task

    async def _fetch_chunk(
        self, keys: SegmentKeys, manifest: RemoteManifest, i: int, key: ChunkKey
    ) -> bytes:
        start, end = manifest.chunk_range(i)
        data = await self._get(keys.log, start, end, manifest.chunk_crcs[i])
        if len(data) != end - start:
            raise _damaged(keys.log, f"chunk {i}: {len(data)} bytes of {end - start} (truncated)")
        self.cache.put(key, data)
        return data

    async def _get(self, key: str, start: int, end: int | None, crc: int | None = None) -> bytes:
        """One GET in the pool; with ``crc``, the bytes' CRC-32C is checked there too
        (off the loop, in the same hop)."""
        self.get_requests += 1
        try:
            data = await self._in_pool(_get_checked, self.store, key, start, end, crc)
        except RemoteStorageError:
            self.get_errors += 1
            raise
        self.get_bytes += len(data)
        return data

    def _prefetch(self, keys: SegmentKeys, manifest: RemoteManifest, last_chunk: int) -> None:
        """Start GETs of the ``prefetch_chunks`` chunks after ``last_chunk`` that are
        neither cached nor coming: a sequential reader's next reads find them.

        Read-ahead must never cost more GETs than it saves. It waits while demand GETs
        are under way (they go first in the FIFO pool), and what it has fetched and not
        yet seen used, in the cache or coming, stays within half the cache: beyond that
        it would evict the chunks it read ahead before their readers come for them
        (many sequential consumers and a small cache)."""
        if self.prefetch_chunks <= 0:
            return
        for key in [k for k in self._ahead if k not in self.cache and k not in self._inflight]:
            del self._ahead[key]  # evicted unused, or its GET failed
            self._ahead_score -= 1
            self.prefetch_wasted += 1
        if self._ahead_skip > 0:
            self._ahead_skip -= 1
            return
        if self._ahead_score < 0:
            self._ahead_skip = self._ahead_pause
            self._ahead_pause = min(2 * self._ahead_pause, 1 << 10)
            self._ahead_score = 0
            return
        if self._demand:
            return
        budget = self.cache.max_bytes // 2
        ahead = sum(self._ahead.values())
        # After a pause, probe with one chunk before trusting read-ahead with more.
        depth = self.prefetch_chunks if self._ahead_pause == 1 else 1
        stop = min(last_chunk + 1 + depth, manifest.chunk_count)
        for i in range(last_chunk + 1, stop):
            key = self._chunk_key(keys, manifest, i)
            if key in self.cache or key in self._inflight:
                continue
            length = key[2] - key[1]
            if ahead + length > budget:
                return
            ahead += length
            self._ahead[key] = length
            task = self._start_chunk(keys, manifest, i, demand=False)
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def wait_prefetched(self) -> None:
        """Wait for the read-ahead started so far (its failures are only logged)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # -- plumbing ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteStorageError("remote reader closed", retriable=True)

    def _spawn(self, coro: Coroutine[object, object, T]) -> asyncio.Task[T]:
        if self._closed:
            coro.close()
            raise RemoteStorageError("remote reader closed", retriable=True)
        task: asyncio.Task[T] = asyncio.ensure_future(coro)
        task.add_done_callback(_consume)
        return task

    async def _join(self, task: asyncio.Task[T]) -> T:
        """Wait for a task other readers may share. Shielded: a cancelled reader must not
        cancel what others wait for. When the shared task itself was cancelled (close,
        forget), its waiters get a retriable RemoteStorageError, not a CancelledError
        they would take for their own cancellation."""
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                raise RemoteStorageError(
                    "remote read abandoned: the reader closed or the segment was deleted",
                    retriable=True,
                ) from None
            raise

    async def _in_pool(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Run ``fn`` in the pool within ``get_timeout_s`` (queueing included).

        A call past its deadline fails with a retriable error and the next read starts
        afresh; its thread cannot be stopped (a GET stuck on a trickling connection) and
        is abandoned, still counted as busy until it returns. Once every thread is
        abandoned, calls fail at once rather than queue behind them."""
        if self._abandoned >= self._threads:
            raise RemoteStorageError(
                f"remote store not answering: {self._abandoned} GETs stuck past "
                f"{self.get_timeout_s}s",
                retriable=True,
            )
        try:
            future: Future[T] = self._pool.submit(fn, *args, **kwargs)
        except RuntimeError as exc:  # shut down
            raise RemoteStorageError("remote reader closed", retriable=True) from exc
        waiting = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait({waiting}, timeout=self.get_timeout_s)
        except asyncio.CancelledError:
            future.cancel()  # not started yet: never runs
            raise
        if not done:
            if not future.cancel():  # running: abandon the thread
                with self._abandoned_lock:
                    self._abandoned += 1
                future.add_done_callback(self._unabandon)
                waiting.add_done_callback(_consume)  # its late outcome is nobody's
            raise RemoteStorageError(
                f"remote store call took over {self.get_timeout_s}s", retriable=True
            )
        if waiting.cancelled():  # the pool shut down under it
            raise RemoteStorageError("remote reader closed", retriable=True)
        return waiting.result()

    def _unabandon(self, _: Future[object]) -> None:
        with self._abandoned_lock:
            self._abandoned -= 1

    def close(self) -> None:
        """Stop: reads under way and later fail with a retriable RemoteStorageError;
        the threads stop (GETs under way finish alone)."""
        self._closed = True
        for task in [*self._inflight.values(), *self._manifest_inflight.values()]:
            task.cancel()
        for task in list(self._background):
            task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _get_checked(
    store: ObjectStore, key: str, start: int, end: int | None, crc: int | None
) -> bytes:
    data = store.get(key, start, end)
    if crc is not None and end is not None and len(data) == end - start:
        actual = crc32c.crc32c(data)
        if actual != crc:
            raise _damaged(
                key, f"bytes [{start}, {end}) CRC-32C {actual:#010x}, manifest {crc:#010x}"
            )
    return data


def _consume(task: asyncio.Future) -> None:
    """Mark a shared task's outcome seen, so a failure no reader waited for (read-ahead)
    is logged here rather than as 'exception was never retrieved'."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("remote read failed: %s", task.exception())


def _damaged(key: str, why: str) -> RemoteStorageError:
    return RemoteStorageError(f"{key}: damaged remote data ({why})", retriable=False)
