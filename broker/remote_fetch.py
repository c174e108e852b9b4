"""Reads below the local log start, served from the remote (S3) tier.

A consumer fetch whose offset is below its replica's local log start and at or above
the remote log start (the metadata image's finished remote segments,
controller/metadata/remote_log.py) is read from the broker's ``RemoteReader``
(storage/remote/reader.py): the remote segment holding the offset, through ranged GETs
of checksummed chunks. The answer is byte-for-byte what a local read of that segment
returned before it left local disk.

How one Fetch mixes local and remote partitions (docs/tiered.md, "Read path"):

- ``FetchReader.read_all`` (broker/replica_fetch.py) stays synchronous. It marks each
  remote partition with a ``RemoteRead`` holding a byte reservation, min(its partition
  max bytes, what the response has left), taken from the response budget as a local
  read's bytes are; so local and remote partitions together stay within
  ``fetch.max.bytes``, the first partition with data alone allowed one batch more.
- ``ReplicaManager.fetch_messages`` then awaits every remote read of the response at
  once (``read_remote``), bounded by ``remote.fetch.max.wait.ms``, and reads the local
  partitions again in the step that returns, so their file ranges are pinned for the
  handler's zero-copy send as before. A response with remote reads never long-polls.
- Memory: the answers' bytes stay counted against the reader's in-flight bound
  (``RemoteReader.read``'s ``keep``) until the fetch handler's response has been written
  (``FetchResult.held``, ``Response.on_written``): many answers waiting to be sent
  cannot pile up past it.
- Per partition errors: the store unreachable, throttled or failing (a retriable
  ``RemoteStorageError``) answers KAFKA_STORAGE_ERROR, a read past the wait
  REQUEST_TIMED_OUT (both retriable: the consumer retries at the same offset); damaged
  data (a chunk or batch CRC) answers CORRUPT_MESSAGE and is never sent; a segment
  deleted meanwhile (retention) answers OFFSET_OUT_OF_RANGE. Other partitions of the
  same fetch are unaffected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rillet.client.wire import errors, records
from rillet.controller.metadata.image import MetadataImage, RemoteSegment
from rillet.controller.metadata.remote_log import RemoteLogView, remote_log_view
from rillet.storage.fileslice import FileSlice
from rillet.storage.log import TimestampOffset
from rillet.storage.remote.layout import segment_keys
from rillet.storage.remote.store import RemoteStorageError

if TYPE_CHECKING:
    from rillet.broker.metrics import BrokerMetrics
    from rillet.storage.remote.reader import Held, RemoteReader

logger = logging.getLogger(__name__)

NONE = errors.NONE
STORAGE_ERROR = errors.code_of("KAFKA_STORAGE_ERROR")
REQUEST_TIMED_OUT = errors.code_of("REQUEST_TIMED_OUT")
CORRUPT_MESSAGE = errors.code_of("CORRUPT_MESSAGE")
OFFSET_OUT_OF_RANGE = errors.code_of("OFFSET_OUT_OF_RANGE")
UNKNOWN_SERVER_ERROR = errors.code_of("UNKNOWN_SERVER_ERROR")
# Segments one remote read may walk: the one holding the offset, and the next when the
# offset fell in a gap at the first one's end (a batch is never split, so a read
# starting in a gap is served from the next batch, as a local read is).
SEGMENTS_PER_READ = 2


class RemoteTier(Protocol):
    """What the fetch path needs of the broker's remote log manager."""

    @property
    def reader(self) -> RemoteReader: ...


@dataclass(frozen=True, slots=True)
class RemoteRead:
    """One partition of a fetch to be read remotely, with its byte reservation."""

    topic: str
    topic_id: str
    partition: int
    offset: int
    max_bytes: int  # the reservation taken from the response's budget
    max_offset: int  # the high watermark: no batch reaching it is sent
    first: bool  # the response's first partition with data: may exceed max_bytes by a batch
    segments: tuple[RemoteSegment, ...]  # from the one holding ``offset``, oldest first


@dataclass(frozen=True, slots=True)
class RemoteOutcome:
    """What a remote read gave: the batches (b"" for none), or an error code."""

    error_code: int
    data: bytes = b""

    def records(self) -> FileSlice | None:
        """The batches as a read-at-once FileSlice (sent like a local one), or None."""
        if not self.data:
            return None
        base = records.read_header(self.data).base_offset
        return FileSlice(-1, None, 0, len(self.data), base, data=self.data)


class RemoteLogViews:
    """Each partition's RemoteLogView, rebuilt only when the image's segment map of that
    partition changed (a delta replaces the map it touches and shares the rest), so a
    fetch does not sort a partition's segments on every read."""

    def __init__(self) -> None:
        self._views: dict[tuple[str, int], tuple[object, RemoteLogView]] = {}

    def get(self, image: MetadataImage, topic_id: str, partition: int) -> RemoteLogView | None:
        """The partition's finished remote segments, or None when it has none."""
        key = (topic_id, partition)
        segs = image.remote_segments.get(key)
        if not segs:
            self._views.pop(key, None)
            return None
        cached = self._views.get(key)
        if cached is not None and cached[0] is segs:
            view = cached[1]
        else:
            view = remote_log_view(image, topic_id, partition)
            self._views[key] = (segs, view)
        return view if view.segments else None

    def retain(self, image: MetadataImage, held: Callable[[str, int], bool]) -> None:
        """Drop the views nobody will ask for again: a partition whose segment map left
        the image or changed (a deleted topic's), or that ``held`` says this broker no
        longer holds (a replica moved away). ``get`` only refreshes the partition it is
        asked about, so without this such views stayed cached for the process's life.
        Called once per metadata delta; costs one lookup per cached partition."""
        for key, (segs, _) in list(self._views.items()):
            if image.remote_segments.get(key) is not segs or not held(*key):
                del self._views[key]

    def __len__(self) -> int:
        return len(self._views)


def log_start_offset(view: RemoteLogView | None, local_start: int) -> int:
    """The partition's log start across both tiers (Kafka's logStartOffset): the remote
    log start when the tier holds older records than local disk."""
    if view is None:
        return local_start
    return min(view.log_start_offset, local_start)


def holds(view: RemoteLogView | None, offset: int, local_start: int) -> bool:
    """Whether ``offset`` lies below the local log start in the range the tier holds."""
    return view is not None and offset < local_start and view.log_start_offset <= offset


def segments_from(view: RemoteLogView, offset: int, local_start: int) -> tuple[RemoteSegment, ...]:
    """The remote segments a read of ``offset`` may use: the first (by start offset)
    ending at or after it, and the next, of those starting below the local log start.
    Found by bisection: a partition may have a great many remote segments. Overlapping
    segments hold the same batches at the same offsets, so any of them serves a read."""
    out: list[RemoteSegment] = []
    segments = view.segments
    for i in range(view.first_ending_at_or_after(offset), len(segments)):
        seg = segments[i]
        if seg.end_offset < offset:
            continue  # inside an earlier segment, and ends before the offset
        if seg.start_offset >= local_start or len(out) == SEGMENTS_PER_READ:
            break
        out.append(seg)
    return tuple(out)


async def read_one(reader: RemoteReader, read: RemoteRead, held: list[Held] | None = None) -> bytes:
    """Whole batches from the batch holding ``read.offset`` (or the first after it).
    ``held``: ``RemoteReader.read``'s ``keep``."""
    for seg in read.segments:
        keys = segment_keys(
            read.topic, read.topic_id, read.partition, seg.start_offset, seg.segment_id
        )
        manifest = await reader.manifest(keys)
        offset = max(read.offset, seg.start_offset)
        max_bytes = max(read.max_bytes, 1)
        data = await reader.read(keys, manifest, offset, max_bytes, read.max_offset, keep=held)
        if data:
            return data
    return b""


async def read_remote(
    reader: RemoteReader,
    reads: Sequence[RemoteRead],
    timeout_s: float,
    still_remote: Callable[[RemoteRead], bool],
    metrics: BrokerMetrics | None = None,
    held: list[Held] | None = None,
) -> list[RemoteOutcome]:
    """Every read at once (several partitions of one fetch may be remote), each bounded
    by ``timeout_s``; an outcome per read, in order. ``still_remote(read)``: whether the
    read's segments are still in the remote log (a missing object is then damage, not
    retention).

    ``held`` gets what the outcomes' bytes hold of the reader's in-flight bound, for the
    caller to release once they are sent; without it they are released at once."""
    holds: list[list[Held]] = [[] for _ in reads]
    tasks = [
        asyncio.ensure_future(read_one(reader, r, h)) for r, h in zip(reads, holds, strict=True)
    ]
    try:
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    except BaseException:  # the fetch itself cancelled (its connection gone)
        for h in holds:
            _release(h)
        raise
    finally:
        for task in tasks:
            # Past the wait (or the fetch itself cancelled, its connection gone): the
            # GETs finish in the reader's threads and still fill its cache.
            task.cancel()
    out = [_outcome(r, t, t in pending, still_remote) for r, t in zip(reads, tasks, strict=True)]
    for outcome, h in zip(out, holds, strict=True):
        if held is None or not outcome.data:  # nothing sent of it: nothing to hold
            _release(h)
        else:
            held.extend(h)
    if metrics is not None:
        metrics.record_remote_fetch(
            len(reads),
            sum(len(o.data) for o in out),
            sum(1 for o in out if o.error_code != NONE),
        )
    return out


def _release(held: list[Held]) -> None:
    for h in held:
        h.release()
    held.clear()


def _outcome(
    read: RemoteRead,
    task: asyncio.Future[bytes],
    timed_out: bool,
    still_remote: Callable[[RemoteRead], bool],
) -> RemoteOutcome:
    name = f"{read.topic}-{read.partition}"
    if timed_out:
        logger.info("%s: remote read at offset %d timed out", name, read.offset)
        return RemoteOutcome(REQUEST_TIMED_OUT)
    exc = task.exception()
    if exc is None:
        data = task.result()
        if len(data) > read.max_bytes and not read.first:
            return RemoteOutcome(NONE)  # one batch past its reservation: the next fetch
        return RemoteOutcome(NONE, data)
    if isinstance(exc, RemoteStorageError):
        if exc.retriable:
            logger.info("%s: remote read at offset %d failed: %s", name, read.offset, exc)
            return RemoteOutcome(STORAGE_ERROR)
        if not still_remote(read):
            return RemoteOutcome(OFFSET_OUT_OF_RANGE)  # deleted by retention meanwhile
        logger.error("%s: remote data damaged, not served (offset %d): %s", name, read.offset, exc)
        return RemoteOutcome(CORRUPT_MESSAGE)
    logger.error("%s: remote read at offset %d failed", name, read.offset, exc_info=exc)
    return RemoteOutcome(UNKNOWN_SERVER_ERROR)


async def offset_for_timestamp(
    reader: RemoteReader,
    topic: str,
    topic_id: str,
    partition: int,
    view: RemoteLogView,
    local_start: int,
    timestamp: int,
) -> TimestampOffset | None:
    """The first record at or after ``timestamp`` in the remote segments below the local
    log start (offset and its timestamp), or None: Log.offset_for_timestamp's answer
    for the records that left local disk. The segment's time index finds the batch;
    the batch itself gives the record."""
    start = view.log_start_offset
    for seg in view.segments:
        if seg.start_offset >= local_start:
            break
        if 0 <= seg.max_timestamp_ms < timestamp:
            continue  # nothing in it is that late: no GET
        keys = segment_keys(topic, topic_id, partition, seg.start_offset, seg.segment_id)
        manifest = await reader.manifest(keys)
        found = await reader.offset_for_timestamp(keys, manifest, timestamp)
        if found is None:
            continue
        data = await reader.read(keys, manifest, found, 1)
        pos = 0
        while pos < len(data):
            h = records.read_header(data, pos)
            offsets, stamps, *_ = records.decode_columns(data, pos, h)
            for off, ts in zip(offsets, stamps, strict=True):
                if ts >= timestamp and off >= start and off < local_start:
                    return TimestampOffset(off, ts)
            pos += h.size
    return None
