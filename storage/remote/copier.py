"""Upload a closed segment to the object store, and delete one; the upload rate limit.

Blocking: run these in threads. ``upload_segment`` reads the segment twice through its
pinned descriptor: once, paced by the rate limiter, to checksum every chunk (the CRCs
must be known before the log object's PUT carries the whole-object one in its metadata),
then streaming the PUT, so a 64 MiB segment is never held in memory at once. The
manifest goes last: its presence means the log object before it is whole.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Sequence

import crc32c

from rillet.client.wire.errors import CorruptRecordError
from rillet.storage import fs
from rillet.storage.index import OffsetIndex, TimeIndex
from rillet.storage.remote.layout import RemoteManifest, SegmentKeys
from rillet.storage.remote.store import CRC_METADATA, ObjectStore
from rillet.storage.segment import NO_TIMESTAMP, LogSegment

READ_BYTES = 1 << 20  # the checksum pass reads at most this much at once


class RateLimiter:
    """A thread-safe token bucket of bytes per second (-1: unlimited).

    Holds at most one second's worth of tokens, so an idle copier bursts one second of
    bytes at most. A request larger than that takes the bucket into debt, and the
    caller sleeps the debt off: callers are served in arrival order and none starves.
    ``clock`` and ``sleep`` are injectable so tests check the arithmetic without time.
    """

    def __init__(
        self,
        bytes_per_second: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if bytes_per_second == 0 or bytes_per_second < -1:
            raise ValueError(f"bytes_per_second must be positive or -1, not {bytes_per_second}")
        self.rate = bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(max(bytes_per_second, 0))
        self._stamp = clock()

    @property
    def unlimited(self) -> bool:
        return self.rate < 0

    def reserve(self, n: int) -> float:
        """Take ``n`` bytes' tokens now; returns the seconds to wait before using them."""
        if self.rate < 0 or n <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            elapsed = max(now - self._stamp, 0.0)
            self._stamp = now
            self._tokens = min(self._tokens + elapsed * self.rate, float(self.rate)) - n
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def acquire(self, n: int) -> None:
        """Block until ``n`` more bytes fit the rate."""
        wait = self.reserve(n)
        if wait > 0:
            self._sleep(wait)


class LocalSegmentError(Exception):
    """The local segment cannot be uploaded as it is: empty, still being appended to (its
    size, index and batches disagree), or its file unreadable or changed under the
    upload. Not a RemoteStorageError: retrying against the store cannot help, and the
    store is not at fault."""


class _SegmentBody(io.RawIOBase):
    """The first ``size`` bytes of a pinned segment file as a seekable stream, for a
    PUT that streams (and may rewind to retry) instead of holding the file.

    Every pass that reads it from the start in order is checked chunk by chunk against
    the CRCs the checksum pass computed: the PUT sends what the manifest vouches for,
    or fails. A chunk that differs raises before its last bytes are handed out (so the
    request is cut short and S3 stores nothing); ``verified`` says a whole in-order pass
    matched.
    """

    def __init__(self, fd: int, size: int, chunk_size: int, crcs: Sequence[int], path: str) -> None:
        self._fd = fd
        self._size = size
        self._pos = 0
        self._chunk_size = chunk_size
        self._crcs = crcs
        self._path = path
        self._running = 0  # CRC-32C of the current chunk so far, for an in-order pass
        self._in_order = True  # this pass has read every byte from 0 up to _pos
        self.verified = False
        self.mismatch: str | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        pos = min(max(base + offset, 0), self._size)
        if pos != self._pos:
            self._in_order = pos == 0
            self._running = 0
        self._pos = pos
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        try:
            data = fs.pread(self._fd, n, self._pos)
        except OSError as exc:
            raise LocalSegmentError(f"{self._path}: read at {self._pos}: {exc}") from exc
        if not data:
            raise LocalSegmentError(f"{self._path}: ended at {self._pos} of {self._size} bytes")
        if self._in_order:
            self._verify(data)
        memoryview(buffer)[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def _verify(self, data: bytes) -> None:
        """Fold ``data`` (the bytes at ``_pos``) into the running chunk CRC, comparing
        each chunk as it completes."""
        pos, view = self._pos, memoryview(data)
        while view:
            chunk = pos // self._chunk_size
            chunk_end = min((chunk + 1) * self._chunk_size, self._size)
            take = min(len(view), chunk_end - pos)
            self._running = crc32c.crc32c(view[:take], self._running)
            pos += take
            view = view[take:]
            if pos == chunk_end:
                if self._running != self._crcs[chunk]:
                    self.mismatch = (
                        f"{self._path}: chunk {chunk} changed between the checksum pass "
                        f"and the upload ({self._running:#010x}, was {self._crcs[chunk]:#010x})"
                    )
                    raise LocalSegmentError(self.mismatch)
                self._running = 0
                if pos == self._size:
                    self.verified = True

    def __len__(self) -> int:
        return self._size


def upload_segment(
    store: ObjectStore,
    keys: SegmentKeys,
    segment: LogSegment,
    leader_epochs: Sequence[tuple[int, int]],
    segment_id: str,
    chunk_size: int,
    limiter: RateLimiter | None = None,
) -> RemoteManifest:
    """Copy a closed segment (never the active one) to ``keys``: the log object with its
    CRC-32C in metadata, then the manifest. Returns the manifest. Raises
    RemoteStorageError when the store fails (a retry may upload the same keys again:
    PUTs replace whole objects) and LocalSegmentError when the segment itself cannot be
    uploaded (empty, still growing, changed or unreadable): then no manifest is written.

    Everything the manifest says is taken from one snapshot: the descriptor is pinned
    first, the size read once, the indexes must point inside it, and the end offset and
    max timestamp come from the batches within it."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, not {chunk_size}")
    fd = segment.pin()
    try:
        size = segment.size
        if size <= 0:
            raise LocalSegmentError(f"{segment.log_path}: an empty segment has nothing to upload")
        offset_index, time_index = segment.index_snapshot()
        chunk_crcs, whole_crc = _checksum(fd, size, chunk_size, limiter, segment)
        end_offset, max_timestamp = _tail(segment, size, offset_index, time_index)
        body = _SegmentBody(fd, size, chunk_size, chunk_crcs, str(segment.log_path))
        store.put(keys.log, body, {CRC_METADATA: f"{whole_crc:08x}"})
        if body.mismatch is not None or not body.verified:
            # The store read the body some other way than once in order (or a check
            # failed inside the SDK, which may wrap our error): no vouching for it.
            raise LocalSegmentError(
                body.mismatch or f"{segment.log_path}: the upload's bytes were never verified"
            )
        if segment.size != size:
            raise LocalSegmentError(
                f"{segment.log_path}: grew from {size} to {segment.size} bytes during the "
                "upload (an active segment)"
            )
    finally:
        segment.unpin()
    manifest = RemoteManifest(
        segment_id=segment_id,
        start_offset=segment.base_offset,
        end_offset=end_offset,
        size_bytes=size,
        max_timestamp_ms=max_timestamp,
        chunk_size=chunk_size,
        chunk_crcs=tuple(chunk_crcs),
        offset_index=offset_index,
        time_index=time_index,
        leader_epochs=tuple((int(e), int(o)) for e, o in leader_epochs),
    )
    data = manifest.encode()
    store.put(keys.manifest, data, {CRC_METADATA: f"{crc32c.crc32c(data):08x}"})
    return manifest


def _checksum(
    fd: int, size: int, chunk_size: int, limiter: RateLimiter | None, segment: LogSegment
) -> tuple[list[int], int]:
    """CRC-32C of each chunk and of the whole file's first ``size`` bytes."""
    crcs: list[int] = []
    whole = 0
    position = 0
    while position < size:
        chunk_end = min(position + chunk_size, size)
        chunk_crc = 0
        while position < chunk_end:
            n = min(READ_BYTES, chunk_end - position)
            if limiter is not None:
                limiter.acquire(n)
            try:
                data = fs.pread(fd, n, position)
            except OSError as exc:
                raise LocalSegmentError(f"{segment.log_path}: read at {position}: {exc}") from exc
            if len(data) != n:
                raise LocalSegmentError(
                    f"{segment.log_path}: {position + len(data)} bytes, expected {size}"
                )
            chunk_crc = crc32c.crc32c(data, chunk_crc)
            whole = crc32c.crc32c(data, whole)
            position += n
        crcs.append(chunk_crc)
    return crcs, whole


def _tail(
    segment: LogSegment, size: int, offset_index: bytes, time_index: bytes
) -> tuple[int, int]:
    """(last offset, max timestamp) of the batches in the segment's first ``size`` bytes
    (a closed segment's ``next_offset`` is not tracked), walking headers from the last
    index entry, or from the one below the time index's last entry when that is earlier.
    Refuses indexes that point at or past ``size`` and a batch cut by it: both mean the
    segment was appended to after ``size`` was read."""
    path = segment.log_path
    offsets = OffsetIndex.from_bytes(offset_index, str(segment.index.path))
    times = TimeIndex.from_bytes(time_index, str(segment.time_index.path))
    last_entry = offsets.last()
    if last_entry is not None and last_entry[1] >= size:
        raise LocalSegmentError(
            f"{path}: index entry at {last_entry[1]} is past the {size} bytes read (active?)"
        )
    start = last_entry[1] if last_entry else 0
    max_ts = NO_TIMESTAMP
    last_time = times.last()
    if last_time is not None:
        max_ts = last_time[0]
        below = offsets.floor(last_time[1])
        start = min(start, below[1] if below else 0)
    last = None
    try:
        for position, h in segment.headers_from(start, size):
            if position + h.size > size:
                raise LocalSegmentError(
                    f"{path}: batch at {position} runs past the {size} bytes read (active?)"
                )
            last = h
            max_ts = max(max_ts, h.max_timestamp)
    except CorruptRecordError as exc:
        raise LocalSegmentError(f"{path}: {exc}") from exc
    except OSError as exc:
        raise LocalSegmentError(f"{path}: {exc}") from exc
    if last is None:
        raise LocalSegmentError(f"{path}: no batch found")
    if last_time is not None and last_time[1] > last.last_offset - segment.base_offset:
        raise LocalSegmentError(f"{path}: time index points past the last batch (active?)")
    return last.last_offset, max_ts


def delete_segment(store: ObjectStore, keys: SegmentKeys) -> None:
    """Delete a remote segment: the manifest first, so that a delete cut short never
    leaves a manifest whose log object is gone (a manifest vouches for a whole upload)."""
    store.delete([keys.manifest])
    store.delete([keys.log])
