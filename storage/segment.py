"""One segment: a ``.log`` file of back-to-back batches plus its two sparse indexes.

Only the active (last) segment is written to, with plain ``fs.write`` calls on an
unbuffered descriptor: one syscall per append, the bytes land in the page cache, and an
fsync from an executor thread can run alongside without Python-level buffers to race on.
Closed segments are immutable until retention, compaction or a follower's truncation
replaces them; their descriptors open lazily on the first read. Under an ``FdCache`` (a
log manager's) an idle, clean descriptor may be closed and is reopened on next use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from rillet.client.wire.records import LOG_OVERHEAD, BatchHeader, stamp
from rillet.storage import fs
from rillet.storage.fdcache import FdCache
from rillet.storage.fileslice import FileSlice
from rillet.storage.index import OffsetIndex, SparseIndex, TimeIndex
from rillet.storage.invariants import invariant
from rillet.storage.scan import BatchScanner, ScanProblem, read_header_at

NO_TIMESTAMP = -1
MAX_RELATIVE_OFFSET = 0xFFFFFFFF


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class LogSegment:
    # Slots: the append hot path reads and writes several of these once per batch.
    __slots__ = (
        "directory",
        "base_offset",
        "size",
        "index_interval",
        "log_path",
        "index",
        "time_index",
        "_fd",
        "_max_timestamp",
        "next_offset",
        "last_batch_base",
        "_created_ms",
        "created_ns",
        "_since_index",
        "_last_indexed_ts",
        "_cache",
        "_used",
        "_pins",
        "_writes",
        "_synced",
        "_ever_opened",
        "_retired",
        "_close_pending",
        "_handed",
    )

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        size: int,
        active: bool,
        index_interval: int,
        suffix: str = "",
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.size = size
        self.index_interval = index_interval
        name = segment_name(base_offset)
        self.log_path = directory / f"{name}.log{suffix}"
        self.index = OffsetIndex(directory / f"{name}.index{suffix}", mutable=active)
        self.time_index = TimeIndex(directory / f"{name}.timeindex{suffix}", mutable=active)
        self._fd: int | None = None
        self._max_timestamp: int | None = None if not active else NO_TIMESTAMP
        self.next_offset = base_offset  # exact for the active segment only
        self.last_batch_base = -1
        self.created_ms = 0
        self._since_index = 0
        self._last_indexed_ts = NO_TIMESTAMP - 1
        # Descriptor book-keeping (see fdcache): the cache that may close it, used since
        # the cache's last sweep, executor threads using it, writes (and truncations)
        # made through it and how many of them the last completed fsync covered.
        self._cache: FdCache | None = None
        self._used = False
        self._pins = 0
        self._writes = 0
        self._synced = 0
        self._ever_opened = False
        self._retired = False  # out of the log (FdCache.forget): never reopened
        self._close_pending = False  # closed while pinned: the last unpin closes it
        self._handed = False  # handed out in this event-loop step (FdCache.hand_out)

    # -- construction ---------------------------------------------------------------

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, index_interval: int, now_ms: int, suffix: str = ""
    ) -> LogSegment:
        seg = cls(
            directory,
            base_offset,
            size=0,
            active=True,
            index_interval=index_interval,
            suffix=suffix,
        )
        flags = fs.O_RDWR | fs.O_CREAT | fs.O_EXCL | fs.O_APPEND
        seg._fd = fs.open(seg.log_path, flags, 0o644)
        seg.created_ms = now_ms
        for index in (seg.index, seg.time_index):
            fs.unlink(index.path, missing_ok=True)  # a stale index from a deleted namesake
        return seg

    def activate(self, now_ms: int) -> None:
        """Make an existing (last) segment the one appended to; reads only its tail."""
        self.index.make_mutable()
        self.time_index.make_mutable()
        self._check_index()
        self._rescan_tail()
        self.created_ms = now_ms  # segment.ms counts from (re)opening, not the first batch

    @property
    def created_ms(self) -> int:
        """When segment.ms starts counting for this segment (wall clock, ms)."""
        return self._created_ms

    @created_ms.setter
    def created_ms(self, now_ms: int) -> None:
        self._created_ms = now_ms
        self.created_ns = now_ms * 1_000_000  # what the append path compares, in ns

    @property
    def fd(self) -> int:
        """The open descriptor (opened, or reopened after the cache closed it, here),
        for a read that uses it at once: marks the segment read, so its cache prefers
        to close others."""
        self._used = True
        fd = self._fd
        return self._open_fd() if fd is None else fd

    def slice(self, position: int, length: int, first_offset: int) -> FileSlice:
        """A read's ``FileSlice``, whose caller uses it later in this event-loop step:
        the descriptor, which the cache keeps open until the step ends, or, when this
        step's reads hold the cache's bound of descriptors already, the bytes (the copy
        the RPC server's pread makes anyway) and no descriptor kept for them."""
        fd = self.fd
        cache = self._cache
        if cache is None or self._handed:
            return FileSlice(fd, self.log_path, position, length, first_offset)
        if not cache.handed_out_full():
            cache.hand_out(self)
            return FileSlice(fd, self.log_path, position, length, first_offset)
        data = fs.pread(fd, length, position)
        cache.close_if_over(self)
        return FileSlice(-1, self.log_path, position, len(data), first_offset, data)

    def _open_fd(self) -> int:
        """Open (or reopen) the descriptor without marking the segment used: appends
        use it at once and hand it to nobody."""
        cache = self._cache
        if cache is not None:
            return cache.fd_of(self)
        fd = self._fd = fs.open(self.log_path, fs.O_RDWR | fs.O_APPEND)
        return fd

    @property
    def dirty(self) -> bool:
        """Written (or cut) since the start of its last completed fsync."""
        return self._writes != self._synced

    def pin(self) -> int:
        """Open and hold the descriptor for use off the loop thread; ``unpin`` after."""
        cache = self._cache
        if cache is None:
            self._pins += 1
            return self.fd
        with cache.lock:
            self._pins += 1
        return cache.fd_of(self)

    def unpin(self) -> None:
        cache = self._cache
        if cache is None:
            self._pins -= 1
            return
        with cache.lock:
            self._unpin_locked(cache)

    def _unpin_locked(self, cache: FdCache) -> None:
        self._pins -= 1
        if not self._pins and self._close_pending:
            self._close_pending = False
            self._close_fd_locked(cache)

    def _close_fd_locked(self, cache: FdCache) -> None:
        if self._fd is not None:
            fs.close(self._fd)
            self._fd = None
        cache.closed(self)

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    # -- appends --------------------------------------------------------------------

    def append(
        self, data: bytes | bytearray | memoryview, entries: list[tuple[int, int, int, int]]
    ) -> None:
        """Write whole batches (validated, stamped) and index them. ``entries`` holds
        (base offset, last offset, max timestamp, size) per batch, in ``data`` order."""
        position = self.size
        expected = self.next_offset
        for base, last, _, size in entries:
            if base < expected:
                invariant(False, f"{self.log_path}: offset {base} < {expected}")
            expected = last + 1
            position += size
        if position != self.size + len(data):
            invariant(False, f"{self.log_path}: batch sizes do not add up to the payload")
        fd = self._fd if self._fd is not None else self._open_fd()
        self._writes += 1
        written = fs.write(fd, data)
        if written != len(data):
            _write_all(fd, memoryview(data)[written:])
        # Book-keeping after the write, so a failed write leaves the segment as it was.
        position = self.size
        for base, last, max_ts, size in entries:
            self._note_batch(base, last, max_ts, size, position)
            position += size
        self.size = position

    def append_one(
        self, data: bytes | bytearray | memoryview, leader_epoch: int, max_size: int
    ) -> tuple[int, int] | None:
        """Check, stamp, write and index one batch at the segment's next offset: the
        produce hot path (one call per produced batch, so the work here stays on locals).

        Returns (last offset, record count), or None having written nothing when ``data``
        is not exactly one valid batch that fits this segment's relative offsets (the
        caller's general path then raises the precise error or rolls first).
        """
        base = self.next_offset
        fd = self._fd
        if fd is None:
            fd = self._open_fd()
        self._writes += 1
        relative = base - self.base_offset
        done = fs.write_batch(
            fd, data, base, leader_epoch, max_size, MAX_RELATIVE_OFFSET - relative
        )
        if done is None:
            return None
        written, last_delta, max_ts, count = done
        size = len(data)
        if written != size:
            self._write_rest(data, written, base, leader_epoch)
        # Book-keeping after the write, so a failed write leaves the segment as it was:
        # _note_batch, inlined.
        position = self.size
        self.size = position + size
        max_seen = self._max_timestamp
        if max_ts > max_seen:  # never None while mutable
            self._max_timestamp = max_seen = max_ts
        since = self._since_index
        if since >= self.index_interval and position:
            self.index.append(relative, position)
            if max_seen > self._last_indexed_ts:
                self.time_index.append(max_seen, relative)
                self._last_indexed_ts = max_seen
            self._since_index = size
        else:
            self._since_index = since + size
        last = base + last_delta
        self.next_offset = last + 1
        self.last_batch_base = base
        return last, count

    def _write_rest(
        self, data: bytes | bytearray | memoryview, written: int, base: int, leader_epoch: int
    ) -> None:
        """Finish a short write (rare: a signal, a nearly full disk) of a stamped batch."""
        full = bytearray(data)
        stamp(full, 0, base, leader_epoch)
        _write_all(self.fd, memoryview(full)[written:])

    def _note_batch(self, base: int, last: int, max_ts: int, size: int, position: int) -> None:
        """Account for one batch at ``position``: end offset, max timestamp, and an index
        entry (offset and time) once index.interval.bytes passed since the last one."""
        if max_ts > self._max_timestamp:  # never None while mutable
            self._max_timestamp = max_ts
        if self._since_index >= self.index_interval and position > 0:
            relative = base - self.base_offset
            self.index.append(relative, position)
            if self._max_timestamp > self._last_indexed_ts:
                self.time_index.append(self._max_timestamp, relative)
                self._last_indexed_ts = self._max_timestamp
            self._since_index = 0
        self._since_index += size
        self.next_offset = last + 1
        self.last_batch_base = base

    def fits(self, last_offset: int) -> bool:
        return last_offset - self.base_offset <= MAX_RELATIVE_OFFSET

    # -- lookups --------------------------------------------------------------------

    def headers_from(
        self, position: int, end: int | None = None
    ) -> Iterator[tuple[int, BatchHeader]]:
        """Batch headers from ``position`` by pread, 61 bytes each (no record bytes)."""
        stop = self.size if end is None else end
        while position < stop:
            h = read_header_at(self.fd, position)
            yield position, h
            position += h.batch_length + LOG_OVERHEAD

    def find(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= ``offset`` (holds it, or follows a gap)."""
        entry = self.index.floor(offset - self.base_offset)
        start = entry[1] if entry else 0
        for position, h in self.headers_from(start):
            if h.last_offset >= offset:
                return position, h
        return None

    def read_end(self, start: int, first: BatchHeader, max_bytes: int, max_offset: int) -> int:
        """End of a read from ``start``: whole batches within ``max_bytes`` and below
        ``max_offset``, but at least ``first``. Jumps by the index, then walks <= a few KiB."""
        limit = start + max(max_bytes, first.batch_length + LOG_OVERHEAD)
        position = start + first.batch_length + LOG_OVERHEAD
        jump = self._index_jump(limit, max_offset)
        if jump is not None and jump > position:
            position = jump
        for pos, h in self.headers_from(position):
            if pos + h.batch_length + LOG_OVERHEAD > limit or h.last_offset >= max_offset:
                return pos
        return self.size

    def _index_jump(self, limit: int, max_offset: int) -> int | None:
        """Largest indexed batch start with position <= ``limit`` and base offset <=
        ``max_offset``: both columns increase, so every batch before it ends by ``limit``
        and has a last offset below ``max_offset``."""
        by_position = self.index.floor_value(limit)
        by_offset = self.index.floor(max_offset - self.base_offset)
        if by_position is None or by_offset is None:
            return None
        return min(by_position[1], by_offset[1])

    @property
    def max_timestamp(self) -> int:
        """Largest timestamp in the segment (retention reads it), NO_TIMESTAMP if empty."""
        if self._max_timestamp is None:
            last = self.time_index.last()
            if last is not None:
                self._max_timestamp = last[0]
            else:
                self._max_timestamp = max(
                    (h.max_timestamp for _, h in self.headers_from(0)), default=NO_TIMESTAMP
                )
        return self._max_timestamp

    def find_timestamp(self, timestamp: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose max timestamp is >= ``timestamp``."""
        entry = self.time_index.floor_before(timestamp)
        start = 0
        if entry is not None:
            hit = self.index.floor(entry[1])
            start = hit[1] if hit else 0
        for position, h in self.headers_from(start):
            if h.max_timestamp >= timestamp:
                return position, h
        return None

    # -- recovery and truncation ---------------------------------------------------

    def recover(
        self, min_offset: int, on_batch: Callable[[BatchHeader], None] | None = None
    ) -> tuple[int, ScanProblem | None]:
        """Validate every batch, rebuild both indexes, cut the file at the first bad one.

        Returns (bytes cut, problem or None). Leaves the segment mutable (active-like);
        the caller seals it if it is not the last.
        """
        self.index.make_mutable()
        self.time_index.make_mutable()
        self.index.clear()
        self.time_index.clear()
        self._max_timestamp, self._since_index = NO_TIMESTAMP, 0
        self._last_indexed_ts = NO_TIMESTAMP - 1
        self.next_offset, self.last_batch_base = max(min_offset, self.base_offset), -1
        scanner = BatchScanner(self.fd, min_offset=self.next_offset)
        for position, h, _view in scanner:
            size = h.batch_length + LOG_OVERHEAD
            self._note_batch(h.base_offset, h.last_offset, h.max_timestamp, size, position)
            if on_batch is not None:
                on_batch(h)
            self.next_offset, self.last_batch_base = h.next_offset, h.base_offset
        file_size = fs.fstat_size(self.fd)
        cut = file_size - scanner.end
        # The index files may describe bytes a crash lost (a roll's job writes them
        # before it fsyncs the data): the rebuilt ones in memory replace them, on disk
        # when the caller seals this segment, or at its roll, flush or close.
        for index in (self.index, self.time_index):
            fs.unlink(index.path, missing_ok=True)
        # Dirty: what recovery kept may be unsynced pages of a run that crashed.
        self._writes += 1
        if cut:
            fs.ftruncate(self.fd, scanner.end)
        self.size = scanner.end
        return cut, scanner.problem

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns bytes removed."""
        self.index.make_mutable()  # whatever happens, this is the active segment now
        self.time_index.make_mutable()
        hit = self.find(offset)
        if hit is None:
            self._rescan_tail()  # a closed segment's next_offset was never tracked
            return 0
        position, h = hit
        removed = self.size - position
        # Index files on disk describe the cut tail: gone, so that until a roll or close
        # writes them again, recovery rebuilds them rather than trusting them.
        for index in (self.index, self.time_index):
            fs.unlink(index.path, missing_ok=True)
        fs.ftruncate(self.fd, position)
        self._writes += 1
        self.size = position
        self.index.truncate_values_from(position)
        self.time_index.truncate_values_from(h.base_offset - self.base_offset)
        self._rescan_tail()
        self.next_offset = max(min(offset, h.base_offset), self.next_offset)
        return removed

    def _rescan_tail(self) -> None:
        """Recompute end offset, max timestamp and index spacing from the last entry on."""
        last = self.index.last()
        start = last[1] if last else 0
        self.next_offset = self.base_offset if last is None else self.base_offset + last[0]
        last_time = self.time_index.last()
        self._max_timestamp = last_time[0] if last_time else NO_TIMESTAMP
        self._last_indexed_ts = last_time[0] if last_time else NO_TIMESTAMP - 1
        self._since_index = 0
        self.last_batch_base = -1
        for position, h in self.headers_from(start):
            self._max_timestamp = max(self._max_timestamp, h.max_timestamp)
            self._since_index = position + h.batch_length + LOG_OVERHEAD - start
            self.next_offset, self.last_batch_base = h.next_offset, h.base_offset

    def _check_index(self) -> None:
        last = self.index.last()
        if last is not None and last[1] >= self.size:
            self.index.truncate_values_from(self.size)  # a stale tail: cut, then rescan

    # -- durability and lifecycle -----------------------------------------------------

    def seal(self) -> tuple[bytes, bytes]:
        """Stop appending: add the final time entry; returns index bytes to persist."""
        last = self.time_index.last()
        if self.last_batch_base >= 0 and (last is None or self.max_timestamp > last[0]):
            self.time_index.append(self.max_timestamp, self.last_batch_base - self.base_offset)
            self._last_indexed_ts = self.max_timestamp
        return self.index_snapshot()

    def index_snapshot(self) -> tuple[bytes, bytes]:
        return self.index.to_bytes(), self.time_index.to_bytes()

    def write_indexes(self, snapshot: tuple[bytes, bytes], *, fsync: bool) -> None:
        SparseIndex.write_file(self.index.path, snapshot[0], fsync=fsync)
        SparseIndex.write_file(self.time_index.path, snapshot[1], fsync=fsync)

    def freeze(self) -> None:
        self.index.freeze()
        self.time_index.freeze()

    def fsync(self) -> None:
        """fsync what was written: through the open descriptor, or, when the cache
        closed a dirty one, through the file reopened (fsync covers the file, not the
        descriptor). Safe from any thread."""
        writes = self._writes
        cache = self._cache
        if cache is None:
            if self._fd is not None:
                fs.fsync(self._fd)
            elif writes != self._synced and not self._fsync_own():
                return
        else:
            with cache.lock:
                fd = self._fd
                if fd is None and (writes == self._synced or self._retired):
                    return  # closed clean, or out of the log (its path may be another's)
                if fd is not None:
                    self._pins += 1
            if fd is None:
                if not self._fsync_own():
                    return
            else:
                try:
                    fs.fsync(fd)
                finally:
                    with cache.lock:
                        self._unpin_locked(cache)
        if writes > self._synced:
            self._synced = writes

    def _fsync_own(self) -> bool:
        """fsync the file through a descriptor of our own, closed again at once (a flush
        of thousands of closed dirty segments must not reopen them all into the cache).
        False when the file is gone: retired meanwhile (a cut), its records with it."""
        try:
            own = fs.open(self.log_path, fs.O_RDWR | fs.O_APPEND)
        except FileNotFoundError:
            return False
        try:
            fs.fsync(own)
        finally:
            fs.close(own)
        return True

    def release(self) -> None:
        """Close the descriptor and keep the rest (it reopens on use). Only for a
        segment no other thread can reach yet: of a log just opened off the loop,
        before an ``FdCache`` adopts it."""
        invariant(self._cache is None and not self._pins, f"{self.log_path}: release in use")
        if self._fd is not None:
            fs.close(self._fd)
            self._fd = None
            self._ever_opened = True  # the next open is a reopen (FdCache.reopens)

    def close(self) -> None:
        cache = self._cache
        if cache is None:
            if self._fd is not None:
                fs.close(self._fd)
                self._fd = None
        else:
            with cache.lock:
                if self._pins:  # a thread is using the descriptor: it closes it after
                    self._close_pending = True
                else:
                    self._close_fd_locked(cache)
        self.index.forget()
        self.time_index.forget()

    def paths(self) -> list[Path]:
        return [self.log_path, self.index.path, self.time_index.path]


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = fs.write(fd, view)
        view = view[written:]
