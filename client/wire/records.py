"""The record-batch format: the wire format and the on-disk format are the same bytes.

Layout (big-endian), as Kafka's v2 batch but with rillet's own magic::

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8 |
    crc uint32 | attributes int16 | last_offset_delta int32 | base_timestamp int64 |
    max_timestamp int64 | producer_id int64 | producer_epoch int16 | base_sequence int32 |
    record_count int32 | records...

``batch_length`` counts the bytes after the batch_length field. The CRC is CRC-32C over
everything after the crc field, so a leader can stamp base_offset and the leader epoch
without recomputing it.

The records section is ONE msgpack array packed in one call, laid out flat: ``stride``
values per record, in this order, each present only when its attribute bit says so::

    [offset_delta?] [timestamp_delta?] key value [headers?]

Offset deltas are implied by position unless ATTR_OFFSET_DELTAS is set (compacted
batches have gaps); timestamp deltas are absent when every record carries the batch's
base timestamp; headers are absent when no record has any. A flat array packs about
four times faster than an array per record (docs/design.md, "Where the time goes"), and
decoding is one ``unpackb`` plus C-level slicing by stride.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import crc32c as _crc32c
import msgpack

from rillet.client.wire.errors import CorruptRecordError, InvalidRecordError

MAGIC = 0x52  # 'R': rillet's own, never one of Kafka's 0..2

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
# Offsets of fields inside the header that are read or patched in place.
BASE_OFFSET_POS = 0
LENGTH_POS = 8
EPOCH_POS = 12
MAGIC_POS = 16
CRC_POS = 17
ATTRIBUTES_POS = 21
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

# attributes bits
COMPRESSION_MASK = 0x07
COMPRESSION_NONE = 0
COMPRESSION_LZ4 = 3  # Kafka's codec numbers, so the names map one onto the other
COMPRESSION_ZSTD = 4
ATTR_LOG_APPEND_TIME = 0x08
ATTR_OFFSET_DELTAS = 0x40
ATTR_TIMESTAMP_DELTAS = 0x80
ATTR_HEADERS = 0x100

COMPRESSION_BY_NAME = {"none": COMPRESSION_NONE, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}
COMPRESSION_NAMES = {v: k for k, v in COMPRESSION_BY_NAME.items()}

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
    """Check one batch at ``pos``: complete, right magic, sane length, CRC matches.

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
    if magic != MAGIC:
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
    that every record it stores can be read back (Kafka's LogValidator, for our format).

    Per batch: ``validate_batch`` (a batch over ``max_size`` raises MessageTooLargeError
    before anything is decompressed); base offset 0 (producers leave offsets to the
    leader); at least one record and ``record_count == last_offset_delta + 1`` (only the
    cleaner leaves gaps); no attribute bit this format does not define; a known codec;
    a records section that decodes, as a consumer decodes it, into exactly
    ``record_count`` records; offset deltas, when present, exactly ``0..count-1``;
    timestamp deltas ints; ``max_timestamp`` the largest record timestamp. Raises
    CorruptRecordError for a batch whose CRC or length fails and InvalidRecordError for
    the first batch that fails any other check.

    On a ``compacted`` topic every key must be present and not an array or a map (the
    cleaner keeps records by key in a dict): InvalidRecordError naming the batch and
    the record's index.

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


_KNOWN_ATTRIBUTES = (
    COMPRESSION_MASK
    | ATTR_LOG_APPEND_TIME
    | ATTR_OFFSET_DELTAS
    | ATTR_TIMESTAMP_DELTAS
    | ATTR_HEADERS
)
_INT = {int}
# What a compacted topic's record cannot have as its key: none at all, or one the
# cleaner cannot use as a dict key (msgpack's unhashable types).
_NOT_KEYS = frozenset({type(None), list, dict})


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
    if h.base_offset != 0:
        raise CorruptRecordError(f"{where} has base offset {h.base_offset}; a producer sends 0")
    if n < 1 or h.last_offset_delta != n - 1:
        raise CorruptRecordError(
            f"{where} says {n} records but its last offset delta is {h.last_offset_delta}"
        )
    a = h.attributes
    if a & ~_KNOWN_ATTRIBUTES:
        raise CorruptRecordError(f"{where} has unknown attribute bits {a & ~_KNOWN_ATTRIBUTES:#x}")
    try:
        flat = _records_section(buf, pos, h, limit)  # an unknown codec raises here too
    except CorruptRecordError as e:
        raise CorruptRecordError(f"{where}: {e}") from e
    stride = stride_of(a)
    if len(flat) != stride * n:
        raise CorruptRecordError(
            f"{where} says {n} records but its records section holds {len(flat)} values "
            f"({stride} per record)"
        )
    i = 0
    if a & ATTR_OFFSET_DELTAS:
        deltas = flat[0::stride]
        if set(map(type, deltas)) != _INT or deltas != list(range(n)):
            raise CorruptRecordError(f"{where} has offset deltas other than 0..{n - 1}")
        i = 1
    if a & ATTR_TIMESTAMP_DELTAS:
        deltas = flat[i::stride]
        if set(map(type, deltas)) != _INT:
            raise CorruptRecordError(f"{where} has a timestamp delta that is not an integer")
        largest = h.base_timestamp + max(deltas)
        i += 1
    else:
        largest = h.base_timestamp
    if h.max_timestamp != largest:
        raise CorruptRecordError(
            f"{where} says max timestamp {h.max_timestamp}, its records' largest is {largest}"
        )
    if compacted:
        keys = flat[i::stride]
        kinds = set(map(type, keys))  # cheaper than hashing every key into a set
        if kinds & _NOT_KEYS:
            bad = next(r for r, k in enumerate(keys) if type(k) in _NOT_KEYS)
            key = keys[bad]
            problem = "has no key" if key is None else f"has a {type(key).__name__} key"
            raise InvalidRecordError(
                f"{where}, record {bad} {problem}: a compacted topic keeps records by key"
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

# zstd contexts are reused (creating one costs more than a small batch's work) but not
# shared: a context used by two threads at once corrupts data or crashes the process,
# and the loop thread (a leader validating produced batches) decodes while executor
# threads (the cleaner) decode and encode. So one pair per thread.
_zstd = threading.local()


def _zstd_compressor():
    c = getattr(_zstd, "c", None)
    if c is None:
        import zstandard

        c = _zstd.c = zstandard.ZstdCompressor(level=3)
    return c


def _zstd_decompressor():
    d = getattr(_zstd, "d", None)
    if d is None:
        import zstandard

        d = _zstd.d = zstandard.ZstdDecompressor()
    return d


def _compress(codec: int, data: bytes) -> bytes:
    if codec == COMPRESSION_ZSTD:
        return _zstd_compressor().compress(data)
    if codec == COMPRESSION_LZ4:
        import lz4.frame

        return lz4.frame.compress(data)
    raise ValueError(f"unknown compression codec {codec}")


# A batch is at most max.message.bytes compressed, but a codec can expand a few KB into
# gigabytes. Every leader decodes what it is sent, so expansion is bounded before any
# allocation: a frame that claims more, or turns out to hold more, is a corrupt batch.
MAX_DECOMPRESSED_BYTES = 256 << 20
# A leader decodes on its event loop, where the cost grows with the expanded size (a
# section of millions of tiny values takes seconds): there a batch may expand at most
# this many times its size limit (max.message.bytes), or 8 MiB. Real data compresses
# far less than 32x at batch granularity.
PRODUCE_EXPANSION = 32


def _decompress(codec: int, data: bytes | memoryview, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    too_big = CorruptRecordError(f"records section decompresses to more than {limit} bytes")
    try:
        if codec == COMPRESSION_ZSTD:
            import zstandard

            decompressor = _zstd_decompressor()
            # A declared content size is allocated up front, so it is checked first;
            # an undeclared one is read through a bounded stream.
            size = zstandard.frame_content_size(data)
            if size > limit:
                raise too_big
            if size >= 0:
                return decompressor.decompress(data)
            with decompressor.stream_reader(data) as reader:
                out = reader.read(limit + 1)
            if len(out) > limit:
                raise too_big
            return out
        if codec == COMPRESSION_LZ4:
            import lz4.frame

            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=limit + 1)
            if len(out) > limit or (not d.eof and not d.needs_input):
                raise too_big
            return out
    except CorruptRecordError:
        raise
    except Exception as e:  # a codec error is a corrupt batch, not a crash
        raise CorruptRecordError(f"cannot decompress records: {e}") from e
    raise CorruptRecordError(f"unknown compression codec {codec}")


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
    packer: msgpack.Packer | None = None,
) -> bytes:
    """Build one batch from columns of record fields, packing all records in one call.

    ``values`` (bytes or None) is required; ``keys``, ``headers`` (per record a list of
    ``(str, bytes)`` pairs, or None), ``timestamps`` (ms) and ``offset_deltas`` are
    optional columns of the same length. Without ``timestamps`` every record takes
    ``timestamp_ms``.
    """
    n = len(values)
    if n == 0:
        raise ValueError("a batch needs at least one record")
    attributes = compression & COMPRESSION_MASK
    columns: list[Sequence[Any]] = []
    if offset_deltas is not None:
        attributes |= ATTR_OFFSET_DELTAS
        columns.append(offset_deltas)
        last_offset_delta = offset_deltas[-1]
    else:
        last_offset_delta = n - 1
    if timestamps is not None:
        base_ts = min(timestamps)
        max_ts = max(timestamps)
        if max_ts != base_ts:
            attributes |= ATTR_TIMESTAMP_DELTAS
            columns.append([t - base_ts for t in timestamps])
    else:
        base_ts = max_ts = timestamp_ms
    columns.append(keys if keys is not None else [None] * n)
    columns.append(values)
    if headers is not None and any(headers):
        attributes |= ATTR_HEADERS
        columns.append(headers)
    stride = len(columns)
    if stride == 2:
        flat: list[Any] = [None] * (2 * n)
        flat[0::2] = columns[0]
        flat[1::2] = columns[1]
    else:
        flat = [None] * (stride * n)
        for i, col in enumerate(columns):
            if len(col) != n:
                raise ValueError("record columns differ in length")
            flat[i::stride] = col
    body = packer.pack(flat) if packer is not None else msgpack.packb(flat, use_bin_type=True)
    if compression != COMPRESSION_NONE:
        body = _compress(compression, body)
    return assemble_batch(
        body,
        attributes=attributes,
        record_count=n,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
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
) -> list:
    body = memoryview(buf)[pos + HEADER_SIZE : pos + h.batch_length + LOG_OVERHEAD]
    if h.attributes & COMPRESSION_MASK:
        body = _decompress(h.attributes & COMPRESSION_MASK, body, limit)
    try:
        flat = msgpack.unpackb(body, use_list=True, raw=False, strict_map_key=False)
    except Exception as e:
        raise CorruptRecordError(f"records section does not decode: {e}") from e
    if not isinstance(flat, list):
        raise CorruptRecordError("records section is not an array")
    return flat


def stride_of(attributes: int) -> int:
    return (
        2
        + bool(attributes & ATTR_OFFSET_DELTAS)
        + bool(attributes & ATTR_TIMESTAMP_DELTAS)
        + bool(attributes & ATTR_HEADERS)
    )


def decode_columns(
    buf: bytes | bytearray | memoryview, pos: int = 0, header: BatchHeader | None = None
) -> tuple[list[int], list[int], list, list, list]:
    """Decode one batch into columns: (offsets, timestamps, keys, values, headers).

    The header is not re-validated here; call ``validate_batch`` first on untrusted input.
    """
    h = header if header is not None else read_header(buf, pos)
    flat = _records_section(buf, pos, h)
    a = h.attributes
    stride = stride_of(a)
    n = h.record_count
    if len(flat) != stride * n:
        raise CorruptRecordError(
            f"records section holds {len(flat)} values, expected {stride} x {n}"
        )
    i = 0
    base = h.base_offset
    if a & ATTR_OFFSET_DELTAS:
        offsets = [base + d for d in flat[0::stride]]
        i = 1
    else:
        offsets = list(range(base, base + n))
    if a & ATTR_TIMESTAMP_DELTAS:
        bt = h.base_timestamp
        timestamps = [bt + d for d in flat[i::stride]]
        i += 1
    else:
        timestamps = [h.base_timestamp] * n
    keys = flat[i::stride]
    values = flat[i + 1 :: stride]
    headers = flat[i + 2 :: stride] if a & ATTR_HEADERS else [None] * n
    return offsets, timestamps, keys, values, headers


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
