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

from rillet.storage import fs
from rillet.storage.remote.layout import RemoteManifest, SegmentKeys
from rillet.storage.remote.store import ObjectStore, RemoteStorageError
from rillet.storage.segment import LogSegment

CRC_METADATA = "rillet-crc32c"  # the log object's whole-content CRC-32C, 8 hex digits
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


class _SegmentBody(io.RawIOBase):
    """The first ``size`` bytes of a pinned segment file as a seekable stream, for a
    PUT that streams (and may rewind to retry) instead of holding the file."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = min(max(base + offset, 0), self._size)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        data = fs.pread(self._fd, n, self._pos)
        if not data:
            raise OSError(f"segment file ended at {self._pos} of {self._size} bytes")
        memoryview(buffer)[: len(data)] = data
        self._pos += len(data)
        return len(data)

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
    RemoteStorageError when the store fails; a retry may upload the same keys again
    (PUTs replace whole objects)."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, not {chunk_size}")
    size = segment.size
    if size <= 0:
        raise ValueError(f"{segment.log_path}: an empty segment has nothing to upload")
    offset_index, time_index = segment.index_snapshot()
    fd = segment.pin()
    try:
        chunk_crcs, whole_crc = _checksum(fd, size, chunk_size, limiter, segment)
        end_offset = _last_offset(segment)
        body = _SegmentBody(fd, size)
        store.put(keys.log, body, {CRC_METADATA: f"{whole_crc:08x}"})
    finally:
        segment.unpin()
    manifest = RemoteManifest(
        segment_id=segment_id,
        start_offset=segment.base_offset,
        end_offset=end_offset,
        size_bytes=size,
        max_timestamp_ms=segment.max_timestamp,
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
            data = fs.pread(fd, n, position)
            if len(data) != n:
                raise RemoteStorageError(
                    f"{segment.log_path}: {position + len(data)} bytes, expected {size}",
                    retriable=False,
                )
            chunk_crc = crc32c.crc32c(data, chunk_crc)
            whole = crc32c.crc32c(data, whole)
            position += n
        crcs.append(chunk_crc)
    return crcs, whole


def _last_offset(segment: LogSegment) -> int:
    """The segment's last offset, from its last indexed batch on (a closed segment's
    ``next_offset`` is not tracked)."""
    entry = segment.index.last()
    last = None
    for _, h in segment.headers_from(entry[1] if entry else 0):
        last = h
    if last is None:
        raise RemoteStorageError(f"{segment.log_path}: no batch found", retriable=False)
    return last.last_offset


def delete_segment(store: ObjectStore, keys: SegmentKeys) -> None:
    """Delete a remote segment: the manifest first, so that a delete cut short never
    leaves a manifest whose log object is gone (a manifest vouches for a whole upload)."""
    store.delete([keys.manifest])
    store.delete([keys.log])
