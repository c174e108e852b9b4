"""The record-batch format: Kafka's RecordBatch v2, on the wire and on disk the same bytes.

Layout (big-endian)::

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8 (2) |
    crc uint32 | attributes int16 | last_offset_delta int32 | base_timestamp int64 |
    max_timestamp int64 | producer_id int64 | producer_epoch int16 | base_sequence int32 |
    record_count int32 | records...

``batch_length`` counts the bytes after the batch_length field. The CRC is CRC-32C over
everything after the crc field, so a leader can stamp base_offset and the leader epoch
without recomputing it. The records are Kafka's varint-encoded ``DefaultRecord``s
(``recordcodec.py`` describes them), compressed as one section when the attributes name
a codec (``codecs.py``). Attribute bits mean what they mean to Kafka: 0-2 the codec, 3
log-append time, 4 transactional, 5 control, 6 delete horizon. Producer id, epoch and
base sequence are -1: rillet has no idempotent producer yet.

Batches of rillet's first format (magic 0x52, ``legacy_records.py``) may still be in old
logs: every reader dispatches on each batch's magic byte, and nothing writes them.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import crc32c as _crc32c

from rillet.client.wire import codecs, legacy_records
from rillet.client.wire import recordcodec as _twin
from rillet.client.wire.errors import CorruptRecordError, InvalidRecordError

MAGIC = 2  # Kafka's RecordBatch v2
LEGACY_MAGIC = legacy_records.MAGIC
_MAGICS = (MAGIC, LEGACY_MAGIC)

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
# Offsets of fields inside the header that are read or patched in place.
BASE_OFFSET_POS = 0
LENGTH_POS = 8
EPOCH_POS = 12
MAGIC_POS = 16
CRC_POS = 17
ATTRIBUTES_POS = 21
LAST_OFFSET_DELTA_POS = 23
CRC_START = ATTRIBUTES_POS
LOG_OVERHEAD = 12  # base_offset + batch_length: what batch_length does not count

_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_U = struct.Struct(">I")
# base_offset, batch_length, partition_leader_epoch: the 16 bytes a leader stamps (the
# CRC starts after them), written as a prefix of its own when the batch is read-only.
STAMPED_PREFIX = struct.Struct(">qii")
_PREFIX = struct.Struct(">qiibI")  # up to and including crc
# From batch_length on, only what an append needs: batch_length, magic, crc,
# last_offset_delta, max_timestamp, record_count (pad bytes skip the rest). Six ints
# instead of thirteen plus a named tuple: check_batch runs once per produced batch.
_CHECKED = struct.Struct(">i4xbI2xi8xq14xi")
_crc32c_of = _crc32c.crc32c

# attribute bits, as Kafka defines them
COMPRESSION_MASK = 0x07
COMPRESSION_NONE = codecs.NONE
COMPRESSION_GZIP = codecs.GZIP
COMPRESSION_SNAPPY = codecs.SNAPPY
COMPRESSION_LZ4 = codecs.LZ4
COMPRESSION_ZSTD = codecs.ZSTD
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40

COMPRESSION_BY_NAME = codecs.BY_NAME
COMPRESSION_NAMES = codecs.NAMES
MAX_DECOMPRESSED_BYTES = codecs.MAX_DECOMPRESSED_BYTES
# A leader decodes on its event loop, where the cost grows with the expanded size (a
# section of millions of tiny records takes seconds): there a batch may expand at most
# this many times its size limit (max.message.bytes), or 8 MiB. Real data compresses
# far less than 32x at batch granularity.
PRODUCE_EXPANSION = 32

# The C codec where it was built (``pip install`` with a C compiler), else its twin.
codec: Any = _twin
if not os.environ.get("RILLET_NO_NATIVE"):  # set, the twin runs (to compare, to debug)
    with contextlib.suppress(ImportError):  # no C compiler at install time
        from rillet.client import _recordcodec as codec  # type: ignore[no-redef]
NATIVE = codec is not _twin

NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on the wire and on disk."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK


class Record(NamedTuple):
    """One decoded record. A plain tuple underneath, so it is cheap to build."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list | None


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Read a batch's header fields without touching its records."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(f"batch header truncated: {len(buf) - pos} of {HEADER_SIZE} bytes")
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def crc_of(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    return _crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + size])


def check_batch(
    buf: bytes | bytearray | memoryview, pos: int, max_size: int | None
) -> tuple[int, int, int, int]:
    """Check one batch at ``pos``: complete, a known magic (v2, or the legacy one old logs
    hold), sane length, CRC matches.

    Returns (size, last_offset_delta, max_timestamp, record_count): what a log append
    needs, without building a BatchHeader. Raises CorruptRecordError (or
    MessageTooLargeError when ``max_size`` is exceeded).
    """
    avail = len(buf) - pos
    if avail < HEADER_SIZE:
        raise CorruptRecordError(f"batch truncated: {avail} bytes, header needs {HEADER_SIZE}")
    batch_length, magic, crc, last_offset_delta, max_timestamp, record_count = _CHECKED.unpack_from(
        buf, pos + LENGTH_POS
    )
    if magic not in _MAGICS:
        base = _Q.unpack_from(buf, pos)[0]
        raise CorruptRecordError(f"bad magic {magic} at batch offset {base}")
    size = batch_length + LOG_OVERHEAD
    if size < HEADER_SIZE:
        raise CorruptRecordError(f"batch length {batch_length} shorter than its header")
    # A length pointing past the buffer is a torn or corrupt batch, whatever the limit:
    # check it before the size limit so a flipped length bit is never "too large".
    if size > avail:
        raise CorruptRecordError(f"batch truncated: length says {size} bytes, {avail} present")
    if max_size is not None and size > max_size:
        from rillet.client.wire.errors import MessageTooLargeError

        raise MessageTooLargeError(f"batch of {size} bytes exceeds the limit of {max_size}")
    if record_count < 0 or last_offset_delta < 0:
        raise CorruptRecordError("negative record count or offset delta")
    actual = _crc32c_of(memoryview(buf)[pos + CRC_START : pos + size])
    if actual != crc:
        base = _Q.unpack_from(buf, pos)[0]
        raise CorruptRecordError(
            f"CRC mismatch in batch at offset {base}: stored {crc:#010x}, computed {actual:#010x}"
        )
    return size, last_offset_delta, max_timestamp, record_count


def validate_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, max_size: int | None = None
) -> BatchHeader:
    """``check_batch``, returning the whole header.

    Raises CorruptRecordError (or MessageTooLargeError when ``max_size`` is exceeded).
    """
    check_batch(buf, pos, max_size)
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def validate_produced(
    buf: bytes | bytearray | memoryview, *, compacted: bool, max_size: int | None = None
) -> None:
    """What a leader checks of a producer's batches before it appends any of them, so
    that every record it stores can be read back (Kafka's LogValidator).

    Per batch: ``validate_batch`` (a batch over ``max_size`` raises MessageTooLargeError
    before anything is decompressed); magic 2 (the legacy format is only ever read from
    old logs); base offset 0 (producers leave offsets to the leader); at least one record
    and ``record_count == last_offset_delta + 1`` (only the cleaner leaves gaps); no
    attribute bit but the codec's (rillet has no transactions, and log-append time and
    the delete horizon are the broker's to set); a known codec; a records section that
    decodes into exactly ``record_count`` well-formed records with offset deltas
    ``0..count-1``; ``max_timestamp`` the largest record timestamp. Raises
    CorruptRecordError for a batch whose CRC or length fails and InvalidRecordError for
    the first batch that fails any other check.

    On a ``compacted`` topic every record must have a key (the cleaner keeps records by
    key): InvalidRecordError naming the batch and the record's index.

    Followers never call this: they store the leader's bytes as they are (a compacted
    batch has gaps), checking only CRC and offsets.
    """
    pos = 0
    end = len(buf)
    index = 0
    limit = MAX_DECOMPRESSED_BYTES
    if max_size is not None:
        limit = min(limit, max(PRODUCE_EXPANSION * max_size, 8 << 20))
    while pos < end:
        h = validate_batch(buf, pos, max_size=max_size)  # CRC, length: CORRUPT_MESSAGE
        try:
            _validate_produced_batch(buf, pos, h, compacted, index, limit)
        except CorruptRecordError as e:
            # The CRC held, so these are the bytes the producer made: sending them again
            # cannot help. INVALID_RECORD is not retriable (Kafka's validator answers it
            # too); CORRUPT_MESSAGE would have the client retry until its timeout.
            raise InvalidRecordError(str(e)) from e
        pos += h.batch_length + LOG_OVERHEAD
        index += 1


def _validate_produced_batch(
    buf: bytes | bytearray | memoryview,
    pos: int,
    h: BatchHeader,
    compacted: bool,
    index: int,
    limit: int,
) -> None:
    n = h.record_count
    where = f"batch {index}"
    if h.magic != MAGIC:
        raise CorruptRecordError(
            f"{where} has magic {h.magic:#x}, not Kafka's v2 (2): a client older than the "
            "broker's record format sent it"
        )
    if h.base_offset != 0:
        raise CorruptRecordError(f"{where} has base offset {h.base_offset}; a producer sends 0")
    if n < 1 or h.last_offset_delta != n - 1:
        raise CorruptRecordError(
            f"{where} says {n} records but its last offset delta is {h.last_offset_delta}"
        )
    a = h.attributes
    if a & ~COMPRESSION_MASK:
        raise CorruptRecordError(
            f"{where} has attribute bits {a & ~COMPRESSION_MASK:#x} (transactional, control, "
            "log-append time or delete horizon), which a producer to rillet cannot set"
        )
    try:
        section = _records_section(buf, pos, h, limit)  # an unknown codec raises here too
        largest, _, first_null_key = codec.check_records(section, n, h.base_timestamp, True)
    except (CorruptRecordError, ValueError) as e:
        raise CorruptRecordError(f"{where}: {e}") from e
    if h.max_timestamp != largest:
        raise CorruptRecordError(
            f"{where} says max timestamp {h.max_timestamp}, its records' largest is {largest}"
        )
    if compacted and first_null_key >= 0:
        raise InvalidRecordError(
            f"{where}, record {first_null_key} has no key: a compacted topic keeps records by key"
        )


def iter_batches(buf: bytes | bytearray | memoryview, *, validate: bool = True):
    """Yield ``(position, header)`` for each batch in a buffer of back-to-back batches.

    Stops at a trailing partial batch (as a fetch response may end with one) when
    ``validate`` is False; raises CorruptRecordError on it when True.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        if validate:
            h = validate_batch(buf, pos)
        else:
            if end - pos < HEADER_SIZE:
                return
            h = BatchHeader._make(HEADER.unpack_from(buf, pos))
            size = h.batch_length + LOG_OVERHEAD
            # A length shorter than the header would never advance pos: stop, never loop.
            if size > end - pos or size < HEADER_SIZE:
                return
        yield pos, h
        pos += h.batch_length + LOG_OVERHEAD


# --- compression -------------------------------------------------------------------


def _decompress(codec_id: int, data: bytes | memoryview, limit: int = MAX_DECOMPRESSED_BYTES):
    return codecs.decompress(codec_id, data, limit)


# --- encoding ----------------------------------------------------------------------


def encode_batch(
    values: Sequence[Any],
    keys: Sequence[Any] | None = None,
    *,
    headers: Sequence[Any] | None = None,
    timestamps: Sequence[int] | None = None,
    timestamp_ms: int = 0,
    offset_deltas: Sequence[int] | None = None,
    compression: int = COMPRESSION_NONE,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """Build one v2 batch from columns of record fields.

    ``values`` (bytes-like or None) is required; ``keys`` (bytes-like or None),
    ``headers`` (per record None or a list of ``(str, bytes | None)`` pairs),
    ``timestamps`` (ms) and ``offset_deltas`` (increasing; the cleaner's gaps) are
    optional columns of the same length. Without ``timestamps`` every record takes
    ``timestamp_ms``. ``attributes`` adds bits beside the codec's (log-append time, the
    delete horizon). Raises TypeError for a field of the wrong type and ValueError for an
    empty batch, columns of different lengths or a number that does not fit its field.
    """
    if compression not in codecs.NAMES:
        raise ValueError(f"unknown compression codec {compression}")
    attributes = (attributes & ~COMPRESSION_MASK) | compression
    compress = codecs.COMPRESSORS.get(compression)
    return codec.build_batch(
        values,
        keys,
        headers,
        timestamps,
        timestamp_ms,
        offset_deltas,
        attributes,
        base_offset,
        partition_leader_epoch,
        producer_id,
        producer_epoch,
        base_sequence,
        compress,
    )


def assemble_batch(
    body: bytes,
    *,
    attributes: int,
    record_count: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Put a header with a fresh CRC in front of an already packed records section."""
    out = bytearray(HEADER_SIZE + len(body))
    HEADER.pack_into(
        out,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(body),
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    out[HEADER_SIZE:] = body
    _U.pack_into(out, CRC_POS, _crc32c.crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def rebuild_batch(
    h: BatchHeader,
    offsets: Sequence[int],
    timestamps: Sequence[int],
    keys: Sequence[Any],
    values: Sequence[Any],
    headers: Sequence[Any],
) -> bytes:
    """Some of a batch's records (decoded columns, at their offsets) as a new v2 batch in
    its place: its base offset, last offset, leader epoch, producer fields, codec and
    timestamp type are kept (the cleaner drops records; convert rewrites legacy ones).

    The last offset stays even when the last record is gone, as Kafka's cleaner keeps
    it: a batch is a log's unit, and its last offset ends the log when it is the last
    batch (recovery, truncation and a follower's fetch position read it there)."""
    data = encode_batch(
        values,
        keys,
        headers=headers,
        timestamps=timestamps,
        offset_deltas=[o - h.base_offset for o in offsets],
        compression=h.compression,
        base_offset=h.base_offset,
        partition_leader_epoch=h.partition_leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
        attributes=h.attributes & ATTR_LOG_APPEND_TIME,
    )
    if offsets[-1] == h.last_offset:
        return data
    out = bytearray(data)  # the last offset delta is under the CRC: patch, then re-sum
    _I.pack_into(out, LAST_OFFSET_DELTA_POS, h.last_offset_delta)
    _U.pack_into(out, CRC_POS, _crc32c_of(memoryview(out)[CRC_START:]))
    return bytes(out)


def stamp(buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Set base_offset and partition_leader_epoch in place; the CRC does not cover them."""
    _Q.pack_into(buf, pos + BASE_OFFSET_POS, base_offset)
    _I.pack_into(buf, pos + EPOCH_POS, leader_epoch)


# --- decoding ----------------------------------------------------------------------


def _records_section(
    buf: bytes | bytearray | memoryview,
    pos: int,
    h: BatchHeader,
    limit: int = MAX_DECOMPRESSED_BYTES,
) -> bytes | memoryview:
    """A batch's records section, decompressed (a view into ``buf`` when it is not)."""
    body = memoryview(buf)[pos + HEADER_SIZE : pos + h.batch_length + LOG_OVERHEAD]
    c = h.attributes & COMPRESSION_MASK
    if h.magic == LEGACY_MAGIC:
        return legacy_records.decompress(h.attributes, body, limit)
    return codecs.decompress(c, body, limit) if c else body


def _append_time(h: BatchHeader) -> int | None:
    """The one timestamp of a batch stamped with log-append time (Kafka keeps it in the
    max timestamp; the records' own are ignored), else None."""
    return h.max_timestamp if h.attributes & ATTR_LOG_APPEND_TIME else None


def decode_columns(
    buf: bytes | bytearray | memoryview, pos: int = 0, header: BatchHeader | None = None
) -> tuple[list[int], list[int], list, list, list]:
    """Decode one batch into columns: (offsets, timestamps, keys, values, headers).

    The header is not re-validated here; call ``validate_batch`` first on untrusted input.
    Raises CorruptRecordError for records that do not decode.
    """
    h = header if header is not None else read_header(buf, pos)
    section = _records_section(buf, pos, h)
    if h.magic == LEGACY_MAGIC:
        return legacy_records.decode_columns(
            section, h.attributes, h.record_count, h.base_offset, h.base_timestamp
        )
    try:
        return codec.decode_columns(
            section, h.record_count, h.base_offset, h.base_timestamp, _append_time(h)
        )
    except ValueError as e:
        raise CorruptRecordError(f"batch at offset {h.base_offset}: {e}") from e


def decode_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    h: BatchHeader,
    cls: type,
    topic: str,
    partition: int,
    min_offset: int,
) -> list:
    """One batch's records at or past ``min_offset`` as ``cls(topic, partition, offset,
    timestamp, key, value, headers)`` tuples: the consumer's path, built in C."""
    if h.magic == LEGACY_MAGIC:
        new = tuple.__new__
        return [
            new(cls, (topic, partition, *r))
            for r in zip(*decode_columns(buf, pos, h), strict=True)
            if r[0] >= min_offset
        ]
    section = _records_section(buf, pos, h)
    try:
        return codec.decode_records(
            section,
            h.record_count,
            h.base_offset,
            h.base_timestamp,
            _append_time(h),
            cls,
            topic,
            partition,
            min_offset,
        )
    except ValueError as e:
        raise CorruptRecordError(f"batch at offset {h.base_offset}: {e}") from e


def decode_arrow(
    buf: bytes | bytearray | memoryview, pos: int, h: BatchHeader, lo: int, hi: int
) -> tuple:
    """One batch's records with ``lo <= offset < hi`` as Arrow-ready buffers (see
    ``recordcodec.decode_arrow``): the Spark reader's path."""
    if h.magic == LEGACY_MAGIC:
        cols = decode_columns(buf, pos, h)
        keep = [i for i, o in enumerate(cols[0]) if lo <= o < hi]
        return _twin.arrow_columns(*([c[i] for i in keep] for c in cols))
    section = _records_section(buf, pos, h)
    try:
        return codec.decode_arrow(
            section, h.record_count, h.base_offset, h.base_timestamp, _append_time(h), lo, hi
        )
    except ValueError as e:
        raise CorruptRecordError(f"batch at offset {h.base_offset}: {e}") from e


def decode_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, header: BatchHeader | None = None
) -> list[Record]:
    """Decode one batch into Record tuples."""
    cols = decode_columns(buf, pos, header)
    return list(map(Record._make, zip(*cols, strict=True)))


def decode_all(buf: bytes | bytearray | memoryview, *, validate: bool = True) -> list[Record]:
    """Decode every complete batch in a buffer (a fetch response, a segment)."""
    out: list[Record] = []
    for pos, h in iter_batches(buf, validate=validate):
        out.extend(decode_batch(buf, pos, h))
    return out
