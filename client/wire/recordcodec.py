"""Kafka's v2 records, encoded and decoded: the pure-Python twin of ``_recordcodec``.

A batch (``records.py`` has the 61-byte header) holds ``record_count`` records back to
back, each laid out as Kafka's ``DefaultRecord``::

    length varint | attributes int8 (0) | timestamp_delta varlong | offset_delta varint |
    key_length varint | key | value_length varint | value |
    header_count varint | [key_length varint | key (UTF-8) | value_length varint | value]...

Every varint is zigzag-encoded (a signed number), at most 5 bytes (int32) or 10
(varlong, int64). ``length`` counts the bytes after it; a length of -1 is a null key or
value. Timestamp deltas are from the batch's base timestamp (its first record's), offset
deltas from its base offset. The records section is what a codec compresses as a whole.

Two implementations keep one contract: the C extension ``rillet.client._recordcodec``
(built where a C compiler exists) and this module, used when the extension is missing or
``RILLET_NO_NATIVE`` is set. They agree byte for byte on what they build and on what they
decode, and both raise ValueError, naming the record, on a records section that is
malformed (tests/test_recordcodec.py runs every test against both). Both take the
already-decompressed records section; ``records.py`` owns the header and the codecs.

The functions:

``build_batch(values, keys, headers, timestamps, timestamp_ms, offset_deltas,
attributes, base_offset, leader_epoch, producer_id, producer_epoch, base_sequence,
compress) -> bytes``
    One whole batch, header and CRC-32C included. ``values`` is a sequence of bytes-like
    or None; ``keys``, ``headers`` (per record None or a sequence of ``(str, bytes |
    None)`` pairs), ``timestamps`` (ms) and ``offset_deltas`` are None or sequences of
    the same length. Without ``timestamps`` every record has ``timestamp_ms``. The base
    timestamp is the first record's, as Kafka's builder sets it. ``compress`` (None, or a
    callable from the records section to its compressed bytes) runs when ``attributes``
    names a codec. Raises TypeError for a value, key or header of the wrong type and
    ValueError for columns of different lengths, an empty batch, or a number that does
    not fit its field.

``decode_columns(section, count, base_offset, base_timestamp, append_time)``
    ``(offsets, timestamps, keys, values, headers)``: five lists of ``count`` items.
    ``append_time`` is None, or the timestamp every record takes (a batch stamped with
    log-append time carries it as its max timestamp). A record without headers has None.

``decode_records(section, count, base_offset, base_timestamp, append_time, cls, topic,
partition, min_offset)``
    A list of ``cls`` tuples ``(topic, partition, offset, timestamp, key, value,
    headers)`` for the records at or past ``min_offset``. ``cls`` is a tuple subclass
    without instance dict (a NamedTuple): the consumer's record type.

``decode_arrow(section, count, base_offset, base_timestamp, append_time, lo, hi)``
    The records with ``lo <= offset < hi`` as Arrow-ready buffers: ``(n, offsets,
    timestamps, key_validity, key_offsets, key_data, value_validity, value_offsets,
    value_data, headers)``. ``offsets`` and ``timestamps`` are n little-endian int64s;
    each validity is a bitmap of n bits (LSB first, 1 = not null); each ``*_offsets`` is
    n + 1 little-endian int32s into ``*_data``; ``headers`` is None when no kept record
    has any, else a list of n items as in ``decode_columns``.

``check_records(section, count, base_timestamp, contiguous) -> (max_timestamp,
last_offset_delta, first_null_key)``
    Walks the records without building them, as a leader checks what a producer sent:
    exactly ``count`` well-formed records filling the section, offset deltas strictly
    increasing from 0 or more (``contiguous``: exactly ``0..count-1``). Returns the
    largest record timestamp, the last offset delta and the index of the first record
    with a null key (-1 when none has).

``column_cut(values, keys, start, room, overhead) -> (end, nbytes)``
    Where a slice of the producer's ``send_many`` records ends: the fewest records from
    ``values[start]`` on whose sizes (``len(value) + len(key) + overhead``, None counting
    0) add up to ``room`` or more, else all of them. Checks each value and key as
    ``build_batch`` does (TypeError naming the record), so a bad record is refused before
    it joins a batch other records share.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import crc32c as _crc32c

MAGIC = 2
# base_offset, batch_length, partition_leader_epoch, magic, crc, attributes,
# last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch,
# base_sequence, record_count
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = _HEADER.size  # 61
_CRC_POS = 17
_CRC_START = 21
_LOG_OVERHEAD = 12
_U32 = struct.Struct(">I")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BYTES_LIKE = (bytes, bytearray, memoryview)


def _zigzag_varint(v: int, what: str, long: bool = False) -> bytes:
    """``v`` as Kafka writes a signed varint (zigzag, 7 bits a byte, low group first)."""
    if long:
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise ValueError(f"{what} {v} does not fit an int64")
        u = ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF
    else:
        if not _INT32_MIN <= v <= _INT32_MAX:
            raise ValueError(f"{what} {v} does not fit an int32")
        u = ((v << 1) ^ (v >> 31)) & 0xFFFFFFFF
    if u < 0x80:
        return _SMALL[u]
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


_SMALL = [bytes((u,)) for u in range(0x80)]
_NULL = b"\x01"  # zigzag(-1): a null key, value or header value


def _field(b: Any, what: str) -> bytes:
    """A nullable byte field: its length varint, then its bytes."""
    if b is None:
        return _NULL
    if not isinstance(b, _BYTES_LIKE):
        raise TypeError(f"{what} must be bytes or None, not {type(b).__name__}")
    if type(b) is not bytes:
        b = bytes(b)
    return _zigzag_varint(len(b), f"{what} length") + b


def _headers_part(hs: Any, index: int) -> bytes:
    if not hs:
        return b"\x00"
    parts = [_zigzag_varint(len(hs), "header count")]
    for pair in hs:
        try:
            k, v = pair
        except (TypeError, ValueError):
            raise TypeError(f"record {index}: a header must be a (str, bytes) pair") from None
        if not isinstance(k, str):
            raise TypeError(f"record {index}: a header key must be str, not {type(k).__name__}")
        kb = k.encode()
        parts.append(_zigzag_varint(len(kb), "header key length"))
        parts.append(kb)
        parts.append(_field(v, f"record {index}: a header value"))
    return b"".join(parts)


def build_batch(
    values: Sequence[Any],
    keys: Sequence[Any] | None,
    headers: Sequence[Any] | None,
    timestamps: Sequence[int] | None,
    timestamp_ms: int,
    offset_deltas: Sequence[int] | None,
    attributes: int,
    base_offset: int,
    leader_epoch: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    compress: Callable[[bytes], bytes] | None,
) -> bytes:
    n = len(values)
    if n == 0:
        raise ValueError("a batch needs at least one record")
    for col in (keys, headers, timestamps, offset_deltas):
        if col is not None and len(col) != n:
            raise ValueError("record columns differ in length")
    if timestamps is not None:
        base_ts = timestamps[0]
        max_ts = max(timestamps)
    else:
        base_ts = max_ts = timestamp_ms
    parts: list[bytes] = []
    append = parts.append
    prev_delta = -1
    for i in range(n):
        if offset_deltas is not None:
            od = offset_deltas[i]
            if od <= prev_delta:
                raise ValueError(f"record {i}: offset deltas must increase")
            prev_delta = od
        else:
            od = i
        td = 0 if timestamps is None else timestamps[i] - base_ts
        body = b"".join(
            (
                b"\x00",  # record attributes: unused by Kafka, always 0
                _zigzag_varint(td, f"record {i}: timestamp delta", long=True),
                _zigzag_varint(od, f"record {i}: offset delta"),
                _field(None if keys is None else keys[i], f"record {i}: a key"),
                _field(values[i], f"record {i}: a value"),
                b"\x00" if headers is None else _headers_part(headers[i], i),
            )
        )
        append(_zigzag_varint(len(body), "record length"))
        append(body)
    section = b"".join(parts)
    if attributes & 0x07:
        if compress is None:
            raise ValueError("attributes name a codec but no compress function was given")
        section = bytes(compress(section))
    last_delta = n - 1 if offset_deltas is None else offset_deltas[-1]
    for v, lo, hi, what in (
        (base_offset, _INT64_MIN, _INT64_MAX, "base offset"),
        (leader_epoch, _INT32_MIN, _INT32_MAX, "leader epoch"),
        (attributes, -(2**15), 2**15 - 1, "attributes"),
        (base_ts, _INT64_MIN, _INT64_MAX, "base timestamp"),
        (max_ts, _INT64_MIN, _INT64_MAX, "max timestamp"),
        (producer_id, _INT64_MIN, _INT64_MAX, "producer id"),
        (producer_epoch, -(2**15), 2**15 - 1, "producer epoch"),
        (base_sequence, _INT32_MIN, _INT32_MAX, "base sequence"),
        (n, 0, _INT32_MAX, "record count"),
        (HEADER_SIZE - _LOG_OVERHEAD + len(section), 0, _INT32_MAX, "batch length"),
    ):
        if not lo <= v <= hi:
            raise ValueError(f"{what} {v} does not fit its field")
    out = bytearray(HEADER_SIZE + len(section))
    _HEADER.pack_into(
        out,
        0,
        base_offset,
        HEADER_SIZE - _LOG_OVERHEAD + len(section),
        leader_epoch,
        MAGIC,
        0,
        attributes,
        last_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        n,
    )
    out[HEADER_SIZE:] = section
    _U32.pack_into(out, _CRC_POS, _crc32c.crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


# --- decoding ----------------------------------------------------------------------


class _Reader:
    """A cursor over a records section; every read is bounds-checked."""

    __slots__ = ("buf", "pos", "end", "record")

    def __init__(self, section: bytes | bytearray | memoryview) -> None:
        self.buf = bytes(section)
        self.pos = 0
        self.end = len(self.buf)
        self.record = 0

    def fail(self, problem: str) -> ValueError:
        return ValueError(f"record {self.record}: {problem}")

    def varint(self, long: bool = False) -> int:
        buf, pos = self.buf, self.pos
        limit = 10 if long else 5
        u = shift = 0
        for i in range(limit):
            if pos + i >= self.end:
                raise self.fail("varint runs past the end of the records")
            b = buf[pos + i]
            u |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos + i + 1
                if u > (0xFFFFFFFFFFFFFFFF if long else 0xFFFFFFFF):
                    raise self.fail(f"varint does not fit an int{64 if long else 32}")
                return (u >> 1) ^ -(u & 1)
            shift += 7
        raise self.fail(f"varint longer than {limit} bytes")

    def field(self, what: str) -> bytes | None:
        n = self.varint()
        if n == -1:
            return None
        if n < 0:
            raise self.fail(f"{what} length {n}")
        start = self.pos
        if n > self.end - start:
            raise self.fail(f"{what} of {n} bytes runs past the end of the records")
        self.pos = start + n
        return self.buf[start : start + n]


def _read_record(
    r: _Reader, base_ts: int
) -> tuple[int, int, bytes | None, bytes | None, list | None]:
    """One record: (offset_delta, timestamp, key, value, headers)."""
    length = r.varint()
    if length < 0:
        raise r.fail(f"negative record length {length}")
    start = r.pos
    if length > r.end - start:
        raise r.fail(f"record of {length} bytes runs past the end of the records")
    if length < 1:
        raise r.fail("empty record")
    r.pos += 1  # attributes: unused
    ts = base_ts + r.varint(long=True)
    if not _INT64_MIN <= ts <= _INT64_MAX:
        raise r.fail("timestamp does not fit an int64")
    od = r.varint()
    key = r.field("key")
    value = r.field("value")
    nh = r.varint()
    if nh < 0:
        raise r.fail(f"negative header count {nh}")
    hs: list | None = None
    if nh:
        hs = []
        for _ in range(nh):
            hk = r.field("header key")
            if hk is None:
                raise r.fail("null header key")
            try:
                name = hk.decode()
            except UnicodeDecodeError:
                raise r.fail("header key is not UTF-8") from None
            hs.append((name, r.field("header value")))
            if r.pos - start > length:
                break
    if r.pos - start != length:
        raise r.fail(f"record length says {length} bytes, its fields take {r.pos - start}")
    return od, ts, key, value, hs


def _walk(section: Any, count: int, base_ts: int, base_offset: int = 0) -> Any:
    if count < 0:
        raise ValueError(f"negative record count {count}")
    r = _Reader(section)
    for i in range(count):
        r.record = i
        rec = _read_record(r, base_ts)
        if not _INT64_MIN <= base_offset + rec[0] <= _INT64_MAX:
            raise r.fail("offset does not fit an int64")
        yield rec
    if r.pos != r.end:
        raise ValueError(f"records section has {r.end - r.pos} bytes after its {count} records")


def decode_columns(
    section: Any, count: int, base_offset: int, base_timestamp: int, append_time: int | None
) -> tuple[list, list, list, list, list]:
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list = []
    values: list = []
    headers: list = []
    for od, ts, k, v, hs in _walk(section, count, base_timestamp, base_offset):
        offsets.append(base_offset + od)
        timestamps.append(ts if append_time is None else append_time)
        keys.append(k)
        values.append(v)
        headers.append(hs)
    return offsets, timestamps, keys, values, headers


def decode_records(
    section: Any,
    count: int,
    base_offset: int,
    base_timestamp: int,
    append_time: int | None,
    cls: type,
    topic: str,
    partition: int,
    min_offset: int,
) -> list:
    new = tuple.__new__
    out = []
    for od, ts, k, v, hs in _walk(section, count, base_timestamp, base_offset):
        offset = base_offset + od
        if offset >= min_offset:
            t = ts if append_time is None else append_time
            out.append(new(cls, (topic, partition, offset, t, k, v, hs)))
    return out


def _binary_column(items: list) -> tuple[bytes, bytes, bytes]:
    """(validity bitmap, n + 1 int32 offsets, data) of a list of bytes-or-None."""
    validity = bytearray((len(items) + 7) // 8)
    offsets = array("i", [0])
    pos = 0
    for i, b in enumerate(items):
        if b is not None:
            validity[i >> 3] |= 1 << (i & 7)
            pos += len(b)
        offsets.append(pos)
    if pos > _INT32_MAX:
        raise ValueError("decoded column exceeds 2 GiB")
    data = b"".join(b for b in items if b is not None)
    return bytes(validity), _little(offsets), data


def _little(a: array) -> bytes:
    if struct.pack("=i", 1) != struct.pack("<i", 1):
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def decode_arrow(
    section: Any,
    count: int,
    base_offset: int,
    base_timestamp: int,
    append_time: int | None,
    lo: int,
    hi: int,
) -> tuple:
    cols = decode_columns(section, count, base_offset, base_timestamp, append_time)
    keep = [i for i, o in enumerate(cols[0]) if lo <= o < hi]
    if len(keep) < count:
        cols = tuple([c[i] for i in keep] for c in cols)
    return arrow_columns(*cols)


def arrow_columns(
    offsets: list[int], timestamps: list[int], keys: list, values: list, headers: list
) -> tuple:
    """``decode_arrow``'s buffers from decoded columns (also how records of the legacy
    format reach the Spark reader)."""
    kv, ko, kd = _binary_column(keys)
    vv, vo, vd = _binary_column(values)
    return (
        len(offsets),
        _little(array("q", offsets)),
        _little(array("q", timestamps)),
        kv,
        ko,
        kd,
        vv,
        vo,
        vd,
        headers if any(h is not None for h in headers) else None,
    )


def check_records(
    section: Any, count: int, base_timestamp: int, contiguous: bool
) -> tuple[int, int, int]:
    max_ts: int | None = None
    prev = -1
    first_null_key = -1
    for i, (od, ts, k, _v, _hs) in enumerate(_walk(section, count, base_timestamp)):
        if (od != i) if contiguous else (od <= prev):
            want = f"{i}" if contiguous else f"more than {prev}"
            raise ValueError(f"record {i}: offset delta {od}, expected {want}")
        prev = od
        if max_ts is None or ts > max_ts:
            max_ts = ts
        if k is None and first_null_key < 0:
            first_null_key = i
    if max_ts is None:
        raise ValueError("a batch needs at least one record")
    return max_ts, prev, first_null_key


def column_cut(
    values: Sequence[Any], keys: Sequence[Any] | None, start: int, room: int, overhead: int, /
) -> tuple[int, int]:
    if not _INT64_MIN <= room <= _INT64_MAX:
        raise OverflowError("room does not fit 64 bits")
    if not 0 <= overhead <= _INT32_MAX:
        raise ValueError("overhead must be within 0..2**31-1")
    n = len(values)
    if keys is not None and len(keys) != n:
        raise ValueError("values and keys differ in length")
    if not 0 <= start <= n:
        raise ValueError(f"start {start} is outside 0..{n}")
    total = 0
    i = start
    while i < n:
        add = _field_length(values[i], i, "a value") + overhead
        if keys is not None:
            add += _field_length(keys[i], i, "a key")
        total += add
        if total > _INT64_MAX:
            raise OverflowError("the records' sizes do not fit 64 bits")
        i += 1
        if total >= room:
            break
    return i, total


def _field_length(b: Any, index: int, what: str) -> int:
    if b is None:
        return 0
    if not isinstance(b, _BYTES_LIKE):
        raise TypeError(f"record {index}: {what} must be bytes or None, not {type(b).__name__}")
    n = memoryview(b).nbytes if type(b) is memoryview else len(b)
    if n > _INT32_MAX:
        raise ValueError(f"record {index}: {what} length {n} does not fit an int32")
    return n
