"""Reading rillet's first record format (magic 0x52), which logs written before Kafka's
v2 became the one format may still hold.

Nothing writes it any more: ``records.decode_columns`` dispatches here on a batch's
magic byte, and ``rillet log convert`` rewrites such logs as v2. The header is v2's; the
records section is ONE msgpack array, laid out flat with ``stride`` values per record,
each present only when its attribute bit says so::

    [offset_delta?] [timestamp_delta?] key value [headers?]

Offset deltas were implied by position unless 0x40 was set (compacted batches have
gaps), timestamp deltas (0x80) were from the batch's base timestamp, and headers (0x100)
were per record a list of ``[str, bytes]`` pairs or None. The codecs were lz4 (3) and
zstd (4), compressing the whole section as in v2. Keys and values were any msgpack
value, in practice bytes or None; v2 holds only bytes, so a str is read as its UTF-8
bytes and any other value as its msgpack bytes (``_as_bytes``); so is a header value,
and a bytes header key is read as UTF-8 text (``_header_key``).
"""

from __future__ import annotations

from typing import Any

import msgpack

from rillet.client.wire import codecs
from rillet.client.wire.errors import CorruptRecordError

MAGIC = 0x52  # 'R'
ATTR_OFFSET_DELTAS = 0x40
ATTR_TIMESTAMP_DELTAS = 0x80
ATTR_HEADERS = 0x100
KNOWN_ATTRIBUTES = 0x07 | 0x08 | ATTR_OFFSET_DELTAS | ATTR_TIMESTAMP_DELTAS | ATTR_HEADERS


def _stride(attributes: int) -> int:
    return (
        2
        + bool(attributes & ATTR_OFFSET_DELTAS)
        + bool(attributes & ATTR_TIMESTAMP_DELTAS)
        + bool(attributes & ATTR_HEADERS)
    )


def decode_columns(
    section: Any, attributes: int, count: int, base_offset: int, base_timestamp: int
) -> tuple[list[int], list[int], list, list, list]:
    """``(offsets, timestamps, keys, values, headers)`` of a legacy batch's records
    section (already decompressed)."""
    try:
        flat = msgpack.unpackb(section, use_list=True, raw=False, strict_map_key=False)
    except Exception as e:
        raise CorruptRecordError(f"records section does not decode: {e}") from e
    if not isinstance(flat, list):
        raise CorruptRecordError("records section is not an array")
    a = attributes
    stride = _stride(a)
    n = count
    if len(flat) != stride * n:
        raise CorruptRecordError(
            f"records section holds {len(flat)} values, expected {stride} x {n}"
        )
    i = 0
    if a & ATTR_OFFSET_DELTAS:
        offsets = [base_offset + d for d in flat[0::stride]]
        i = 1
    else:
        offsets = list(range(base_offset, base_offset + n))
    if a & ATTR_TIMESTAMP_DELTAS:
        timestamps = [base_timestamp + d for d in flat[i::stride]]
        i += 1
    else:
        timestamps = [base_timestamp] * n
    keys = _as_bytes(flat[i::stride])
    values = _as_bytes(flat[i + 1 :: stride])
    if a & ATTR_HEADERS:
        headers = [
            None if not hs else [(_header_key(k), *_as_bytes([v])) for k, v in hs]
            for hs in flat[i + 2 :: stride]
        ]
    else:
        headers = [None] * n
    return offsets, timestamps, keys, values, headers


def _header_key(k: object) -> str:
    """v2 header keys are text: old bytes keys are read as UTF-8 (what a str key
    would have been), anything else as its str()."""
    if isinstance(k, bytes):
        return k.decode("utf-8", "replace")
    return k if isinstance(k, str) else str(k)


def _as_bytes(column: list) -> list:
    if all(type(v) is bytes or v is None for v in column):
        return column
    return [
        v
        if type(v) is bytes or v is None
        else v.encode()
        if isinstance(v, str)
        else msgpack.packb(v, use_bin_type=True)
        for v in column
    ]


def decompress(attributes: int, section: Any, limit: int = codecs.MAX_DECOMPRESSED_BYTES) -> Any:
    codec = attributes & 0x07
    if codec not in (0, codecs.LZ4, codecs.ZSTD):
        raise CorruptRecordError(f"unknown compression codec {codec} in a legacy batch")
    return codecs.decompress(codec, section, limit) if codec else section
