"""Per-record cost of the record codec, in nanoseconds (best of several runs). Prints JSON.

A batch of 100-byte values (16 KiB and 256 KiB of them, no keys or headers, one
timestamp, as a producer's batch mostly is) is built, then decoded three ways: the
consumer's (``decode_records``), columns (``decode_columns``) and Arrow buffers
(``decode_arrow``, the Spark reader's). Each is measured for:

- ``native``: ``rillet.client._recordcodec``, the C codec (where it was built);
- ``python``: its pure-Python twin, ``client/wire/recordcodec.py``;
- ``msgpack (previous format)``: the msgpack records section rillet used before Kafka's
  v2, its encode and decode reconstructed below from that commit so that "before" runs
  in the same process as "after";
- ``kafka-python``: kafka-python's DefaultRecordBatchBuilder / DefaultRecordBatch, the
  peer (build, and a record-by-record read for decode_records).

Only the records section is measured (plus header and CRC when building): decompression
and batch framing are the same for all.
"""

from __future__ import annotations

import json
import struct
import timeit
from typing import Any

import crc32c
import msgpack

from rillet.client.consumer import ConsumerRecord
from rillet.client.wire import recordcodec as twin

try:
    from rillet.client import _recordcodec as native
except ImportError:  # built without a C compiler
    native = None  # type: ignore[assignment]

try:
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
except ImportError:
    DefaultRecordBatch = DefaultRecordBatchBuilder = None  # type: ignore[assignment,misc]

VALUE_SIZE = 100
SIZES = {"16KiB": 16 << 10, "256KiB": 256 << 10}
TS = 1_700_000_000_000


# --- the previous format: msgpack columns (git show 41e3efa~1:client/wire/records.py) --

_HEADER = struct.Struct(">qiibIhiqqqhii")
_U = struct.Struct(">I")


def msgpack_encode(values: list, timestamps: list) -> bytes:
    """encode_batch of the msgpack format: keys and values interleaved, one packb call."""
    n = len(values)
    base_ts, max_ts = min(timestamps), max(timestamps)
    flat: list[Any] = [None] * (2 * n)
    flat[0::2] = [None] * n
    flat[1::2] = values
    body = msgpack.packb(flat, use_bin_type=True)
    out = bytearray(_HEADER.size + len(body))
    _HEADER.pack_into(
        out,
        0,
        0,
        _HEADER.size - 12 + len(body),
        -1,
        0x52,
        0,
        0,
        n - 1,
        base_ts,
        max_ts,
        -1,
        -1,
        -1,
        n,
    )
    out[_HEADER.size :] = body
    _U.pack_into(out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return bytes(out)


def msgpack_columns(section: bytes, n: int, base: int, base_ts: int) -> tuple:
    """decode_columns of the msgpack format (stride 2: no deltas, no headers)."""
    flat = msgpack.unpackb(section, use_list=True, raw=False, strict_map_key=False)
    return list(range(base, base + n)), [base_ts] * n, flat[0::2], flat[1::2], [None] * n


def msgpack_records(section: bytes, n: int, base: int, base_ts: int) -> list:
    new = tuple.__new__
    cls = ConsumerRecord
    return [
        new(cls, ("t", 0, *r))
        for r in zip(*msgpack_columns(section, n, base, base_ts), strict=True)
    ]


def msgpack_arrow(section: bytes, n: int, base: int, base_ts: int) -> tuple:
    return twin.arrow_columns(*msgpack_columns(section, n, base, base_ts))


# --- kafka-python ----------------------------------------------------------------------


def kafka_build(values: list) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
    for i, v in enumerate(values):
        b.append(i, timestamp=TS, key=None, value=v, headers=[])
    return bytes(b.build())


def kafka_records(data: bytes) -> list:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in DefaultRecordBatch(data)]


# --- measuring -------------------------------------------------------------------------


def per_record_ns(fn: Any, n: int) -> float:
    number = max(1, 20_000 // n)
    best = min(timeit.repeat(fn, number=number, repeat=7)) / number
    return round(best / n * 1e9, 1)


def run(size: int) -> dict[str, dict[str, float]]:
    n = size // VALUE_SIZE
    values = [bytes([i % 251]) * VALUE_SIZE for i in range(n)]
    timestamps = [TS] * n
    args = (values, None, None, timestamps, TS, None, 0, 0, -1, -1, -1, -1, None)
    impls = {"python": twin} if native is None else {"native": native, "python": twin}
    out: dict[str, dict[str, float]] = {}
    for name, m in impls.items():
        sec = m.build_batch(*args)[twin.HEADER_SIZE :]
        out[name] = {
            "build": per_record_ns(lambda m=m: m.build_batch(*args), n),
            "decode_records": per_record_ns(
                lambda m=m, s=sec: m.decode_records(s, n, 0, TS, None, ConsumerRecord, "t", 0, 0),
                n,
            ),
            "decode_columns": per_record_ns(
                lambda m=m, s=sec: m.decode_columns(s, n, 0, TS, None), n
            ),
            "decode_arrow": per_record_ns(
                lambda m=m, s=sec: m.decode_arrow(s, n, 0, TS, None, 0, 1 << 62), n
            ),
        }
    old = msgpack_encode(values, timestamps)[_HEADER.size :]
    out["msgpack (previous format)"] = {
        "build": per_record_ns(lambda: msgpack_encode(values, timestamps), n),
        "decode_records": per_record_ns(lambda: msgpack_records(old, n, 0, TS), n),
        "decode_columns": per_record_ns(lambda: msgpack_columns(old, n, 0, TS), n),
        "decode_arrow": per_record_ns(lambda: msgpack_arrow(old, n, 0, TS), n),
    }
    if DefaultRecordBatchBuilder is not None:
        data = kafka_build(values)
        out["kafka-python"] = {
            "build": per_record_ns(lambda: kafka_build(values), n),
            "decode_records": per_record_ns(lambda: kafka_records(data), n),
        }
    return out


def main() -> None:
    # The layouts agree: what the two codecs build is what kafka-python reads.
    if DefaultRecordBatch is not None:
        data = twin.build_batch([b"x"], None, None, None, TS, None, 0, 0, -1, -1, -1, -1, None)
        assert [r.value for r in DefaultRecordBatch(data)] == [b"x"]
    result: dict[str, Any] = {"value_bytes": VALUE_SIZE, "unit": "ns per record"}
    for label, size in SIZES.items():
        result[label] = {"records": size // VALUE_SIZE, **run(size)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
