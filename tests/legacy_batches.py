"""The pre-v2 writer (magic 0x52, msgpack records), kept for tests only.

Nothing in rillet writes this format any more; tests use ``encode_legacy_batch`` to
make the old logs that ``legacy_records`` reads and ``rillet log convert`` rewrites.
It is the old ``encode_batch`` reduced to what those tests need: offset deltas,
timestamps, headers and the lz4/zstd codecs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import crc32c
import msgpack

from rillet.client.wire import codecs, legacy_records, records


def encode_legacy_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    *,
    headers: Sequence[Any] | None = None,
    timestamps: Sequence[int] | None = None,
    timestamp_ms: int = 0,
    offset_deltas: Sequence[int] | None = None,
    compression: int = codecs.NONE,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
) -> bytes:
    """One legacy batch from columns of record fields (as the old ``encode_batch``)."""
    n = len(values)
    if compression not in (codecs.NONE, codecs.LZ4, codecs.ZSTD):
        raise ValueError("the legacy format knew lz4 and zstd only")
    attributes = compression
    columns: list[Sequence[Any]] = []
    last_offset_delta = n - 1
    if offset_deltas is not None:
        attributes |= legacy_records.ATTR_OFFSET_DELTAS
        columns.append(offset_deltas)
        last_offset_delta = offset_deltas[-1]
    base_ts = max_ts = timestamp_ms
    if timestamps is not None:
        base_ts, max_ts = min(timestamps), max(timestamps)
        if max_ts != base_ts:
            attributes |= legacy_records.ATTR_TIMESTAMP_DELTAS
            columns.append([t - base_ts for t in timestamps])
    columns.append(keys if keys is not None else [None] * n)
    columns.append(values)
    if headers is not None and any(headers):
        attributes |= legacy_records.ATTR_HEADERS
        columns.append([None if not hs else [list(p) for p in hs] for hs in headers])
    stride = len(columns)
    flat: list[Any] = [None] * (stride * n)
    for i, column in enumerate(columns):
        flat[i::stride] = column
    body = msgpack.packb(flat, use_bin_type=True)
    if compression:
        body = codecs.COMPRESSORS[compression](body)
    out = bytearray(records.HEADER_SIZE + len(body))
    records.HEADER.pack_into(
        out,
        0,
        base_offset,
        records.HEADER_SIZE - records.LOG_OVERHEAD + len(body),
        partition_leader_epoch,
        legacy_records.MAGIC,
        0,
        attributes,
        last_offset_delta,
        base_ts,
        max_ts,
        -1,
        -1,
        -1,
        n,
    )
    out[records.HEADER_SIZE :] = body
    crc = crc32c.crc32c(memoryview(out)[records.CRC_START :])
    out[records.CRC_POS : records.CRC_POS + 4] = crc.to_bytes(4, "big")
    return bytes(out)
