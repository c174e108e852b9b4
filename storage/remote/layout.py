"""Where remote segments live in the bucket, and the manifest that describes each one.

Keys (relative to the store's prefix)::

    {topic}-{topic_id}/{partition}/{start_offset:020d}-{segment_id}.log
    {topic}-{topic_id}/{partition}/{start_offset:020d}-{segment_id}.manifest

The topic id in the path keeps a re-created topic of the same name apart from the old
one's objects; the zero-padded start offset makes a listing come back in log order; the
segment id (unique per upload attempt) keeps a retried or competing upload of the same
offsets from overwriting another's objects.

The ``.log`` object is the segment file's bytes, unchanged. The manifest is written
after it and is what makes the upload count: everything a reader needs besides the
batches (the segment's offset and time indexes, a CRC-32C per chunk of the log object,
the leader epochs) in one small self-checksummed object. docs/tiered.md says why.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import quote, unquote

import crc32c

from rillet.storage.index import OFFSET_ENTRY, TIME_ENTRY
from rillet.storage.remote.store import RemoteStorageError

LOG = "log"
MANIFEST = "manifest"


class SegmentKeys(NamedTuple):
    log: str
    manifest: str


def topic_prefix(topic: str, topic_id: str) -> str:
    return f"{topic}-{topic_id}/"


def partition_prefix(topic: str, topic_id: str, partition: int) -> str:
    return f"{topic_prefix(topic, topic_id)}{partition}/"


def segment_keys(
    topic: str, topic_id: str, partition: int, start_offset: int, segment_id: str
) -> SegmentKeys:
    stem = f"{partition_prefix(topic, topic_id, partition)}{start_offset:020d}-{segment_id}"
    return SegmentKeys(f"{stem}.{LOG}", f"{stem}.{MANIFEST}")


def parse_segment_key(key: str) -> tuple[int, str, str] | None:
    """(start offset, segment id, "log" or "manifest") of a segment object's key, or
    None for any other key (an orphan sweep meets foreign objects too)."""
    name = key.rsplit("/", 1)[-1]
    stem, dot, kind = name.rpartition(".")
    if not dot or kind not in (LOG, MANIFEST):
        return None
    offset, dash, segment_id = stem.partition("-")
    if not dash or not segment_id or len(offset) != 20 or not offset.isdigit():
        return None
    return int(offset), segment_id, kind


# The controller's topic ids: 16 random bytes in URL-safe base64 without padding.
TOPIC_ID_CHARS = 22
_ID_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def parse_topic_of_key(key: str) -> tuple[str, str] | None:
    """(topic prefix, topic id) of a segment object's key in this layout
    (``{topic}-{topic_id}/{partition}/{segment object}``), or None for any other key: a
    bucket sweep never touches what it did not write (a shared bucket)."""
    parts = key.split("/")
    if len(parts) != 3 or not parts[1].isdigit() or parse_segment_key(key) is None:
        return None
    head = parts[0]
    topic, dash, topic_id = (
        head[: -TOPIC_ID_CHARS - 1],
        head[-TOPIC_ID_CHARS - 1 : -TOPIC_ID_CHARS],
        head[-TOPIC_ID_CHARS:],
    )
    if not topic or dash != "-" or not set(topic_id) <= _ID_ALPHABET:
        return None
    return head + "/", topic_id


# -- which clusters write under the prefix ------------------------------------------------

# Each cluster writing under a prefix puts one marker object here, named by its cluster
# id, before its first upload, so a bucket sweep can tell that it is not alone: another
# cluster's topic ids are not in its image, and their prefixes would look deleted.
CLUSTER_MARKERS = "_rillet/clusters/"
_MARKER_SUFFIX = ".cluster"


def cluster_marker_key(cluster_id: str) -> str:
    """The marker of ``cluster_id`` (quoted: an id is any string). Never a key of the
    layout: its first part has no topic id, and its name no segment suffix."""
    return f"{CLUSTER_MARKERS}{quote(cluster_id, safe='')}{_MARKER_SUFFIX}"


def parse_cluster_marker(key: str) -> str | None:
    """The cluster id a marker key names, or None for any other key."""
    if not key.startswith(CLUSTER_MARKERS) or not key.endswith(_MARKER_SUFFIX):
        return None
    name = key[len(CLUSTER_MARKERS) : -len(_MARKER_SUFFIX)]
    return unquote(name) if name and "/" not in name else None


# -- the manifest --------------------------------------------------------------------------

MANIFEST_MAGIC = b"RLMF"
MANIFEST_VERSION = 1
# magic | version | segment_id length | start, end offset | size | max timestamp |
# chunk size | chunk count | offset index bytes | time index bytes | epoch count
_FIXED = struct.Struct(">4sHHqqqqIIIII")
_CRC = struct.Struct(">I")
_EPOCH = struct.Struct(">iq")


@dataclass(frozen=True, slots=True)
class RemoteManifest:
    """What a reader needs to serve a remote segment besides its batches."""

    segment_id: str
    start_offset: int  # the segment's base offset
    end_offset: int  # its last offset (inclusive, as Kafka's RemoteLogSegmentMetadata)
    size_bytes: int  # of the log object
    max_timestamp_ms: int
    chunk_size: int
    chunk_crcs: tuple[int, ...]  # CRC-32C of each chunk_size chunk of the log object
    offset_index: bytes  # the segment's .index bytes (relative offset, position)
    time_index: bytes  # its .timeindex bytes (timestamp, relative offset)
    leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset) covering it

    @property
    def chunk_count(self) -> int:
        return -(-self.size_bytes // self.chunk_size)

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """Byte range [start, end) of chunk number ``chunk`` in the log object."""
        start = chunk * self.chunk_size
        return start, min(start + self.chunk_size, self.size_bytes)

    def encode(self) -> bytes:
        sid = self.segment_id.encode()
        parts = [
            _FIXED.pack(
                MANIFEST_MAGIC,
                MANIFEST_VERSION,
                len(sid),
                self.start_offset,
                self.end_offset,
                self.size_bytes,
                self.max_timestamp_ms,
                self.chunk_size,
                len(self.chunk_crcs),
                len(self.offset_index),
                len(self.time_index),
                len(self.leader_epochs),
            ),
            sid,
            struct.pack(f">{len(self.chunk_crcs)}I", *self.chunk_crcs),
            self.offset_index,
            self.time_index,
            b"".join(_EPOCH.pack(e, o) for e, o in self.leader_epochs),
        ]
        body = b"".join(parts)
        return body + _CRC.pack(crc32c.crc32c(body))

    @classmethod
    def decode(cls, data: bytes, *, key: str = "manifest") -> RemoteManifest:
        """Parse and check a manifest; anything damaged raises RemoteStorageError
        (retriable=False: reading the same object again gives the same bytes)."""

        def damaged(why: str) -> RemoteStorageError:
            return RemoteStorageError(f"{key}: damaged manifest ({why})", retriable=False)

        view = memoryview(data)
        if len(view) < _FIXED.size + _CRC.size:
            raise damaged(f"{len(view)} bytes")
        body = view[: -_CRC.size]
        if crc32c.crc32c(body) != _CRC.unpack_from(view, len(body))[0]:
            raise damaged("checksum mismatch")
        (
            magic,
            version,
            sid_len,
            start,
            end,
            size,
            max_ts,
            chunk_size,
            n_crcs,
            index_len,
            time_len,
            n_epochs,
        ) = _FIXED.unpack_from(body)
        if magic != MANIFEST_MAGIC or version != MANIFEST_VERSION:
            raise damaged(f"magic {bytes(magic)!r} version {version}")
        expected = _FIXED.size + sid_len + 4 * n_crcs + index_len + time_len
        expected += _EPOCH.size * n_epochs
        if expected != len(body):
            raise damaged(f"{len(body)} bytes, fields say {expected}")
        pos = _FIXED.size
        sid = bytes(body[pos : pos + sid_len]).decode()
        pos += sid_len
        crcs = struct.unpack_from(f">{n_crcs}I", body, pos)
        pos += 4 * n_crcs
        offset_index = bytes(body[pos : pos + index_len])
        pos += index_len
        time_index = bytes(body[pos : pos + time_len])
        pos += time_len
        epochs = tuple(tuple(e) for e in _EPOCH.iter_unpack(body[pos:]))
        manifest = cls(
            sid, start, end, size, max_ts, chunk_size, crcs, offset_index, time_index, epochs
        )  # type: ignore[arg-type]
        if (
            chunk_size <= 0
            or size <= 0
            or end < start
            or start < 0
            or n_crcs != manifest.chunk_count
            or index_len % OFFSET_ENTRY.size
            or time_len % TIME_ENTRY.size
        ):
            raise damaged("inconsistent fields")
        # The indexes steer every read: entries must rise and stay inside the segment,
        # or a read would start in the wrong place (or past the object).
        span = end - start
        offsets = list(OFFSET_ENTRY.iter_unpack(offset_index))
        if not _rising(offsets, strict=True) or any(
            rel > span or pos >= size for rel, pos in offsets
        ):
            raise damaged("offset index out of order or past the segment")
        times = list(TIME_ENTRY.iter_unpack(time_index))
        if not _rising(times, strict=False) or any(rel > span for _, rel in times):
            raise damaged("time index out of order or past the segment")
        return manifest

    def check_keys(self, keys: SegmentKeys) -> None:
        """The manifest must be the one its key names (start offset, segment id): a
        manifest copied or written under another segment's key is damage, not data."""
        parsed = parse_segment_key(keys.manifest)
        if parsed is not None and (parsed[0], parsed[1]) != (self.start_offset, self.segment_id):
            raise RemoteStorageError(
                f"{keys.manifest}: damaged manifest (it describes segment "
                f"{self.segment_id} at {self.start_offset})",
                retriable=False,
            )


def _rising(entries: list[tuple[int, int]], *, strict: bool) -> bool:
    """Both columns never decrease; with ``strict`` the first strictly rises."""
    for (a0, b0), (a1, b1) in zip(entries, entries[1:], strict=False):
        if a1 < a0 or b1 < b0 or (strict and a1 == a0):
            return False
    return True
