"""Fuzz driver for the C extensions built with AddressSanitizer and UBSan.

Run by tests/test_recordcodec_sanitizers.py in a subprocess with libasan preloaded:
``python sanitizer_fuzz.py MODULE_DIR codec|batchwrite COUNT SEED``. MODULE_DIR holds
the instrumented ``_recordcodec`` / ``_batchwrite``, imported as top-level modules. Every
input is seeded: a failing seed reproduces. Only ValueError, TypeError and
OverflowError may come back; a memory error or undefined behaviour stops the process
with the sanitizer's report on stderr.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import tempfile
from typing import Any, NamedTuple

from rillet.client.wire import recordcodec as twin

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EXPECTED = (ValueError, TypeError, OverflowError)


class Rec(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Any
    value: Any
    headers: Any


class WithDict(tuple):
    """A tuple subclass with an instance dict: decode_records' general path."""


def random_bytes(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(rng.randrange(n + 1))


def random_columns(rng: random.Random) -> dict:
    n = rng.randrange(1, 20)

    def nullable() -> bytes | None:
        return None if rng.random() < 0.2 else random_bytes(rng, 40)

    def headers() -> list | None:
        if rng.random() < 0.5:
            return None
        names = ["", "a", "ü", "🎉", "key"]
        return [(rng.choice(names), nullable()) for _ in range(rng.randrange(4))]

    base_ts = rng.choice([0, 1_700_000_000_000, INT64_MAX - 5, INT64_MIN + 5])
    gaps = [rng.choice([1, 1, 2, 1000]) for _ in range(n)]
    return {
        "values": [nullable() for _ in range(n)],
        "keys": None if rng.random() < 0.5 else [nullable() for _ in range(n)],
        "headers": None if rng.random() < 0.5 else [headers() for _ in range(n)],
        "timestamps": None
        if rng.random() < 0.5
        else [base_ts + rng.randrange(-1000, 1000) for _ in range(n)],
        "timestamp_ms": base_ts,
        "offset_deltas": None
        if rng.random() < 0.5
        else [sum(gaps[: i + 1]) - gaps[0] for i in range(n)],
        "base_offset": rng.choice([0, 5, INT64_MAX - 3, INT64_MIN]),
    }


def build_args(cols: dict, compress: Any = None, attributes: int = 0) -> tuple:
    return (
        cols["values"],
        cols["keys"],
        cols["headers"],
        cols["timestamps"],
        cols["timestamp_ms"],
        cols["offset_deltas"],
        attributes,
        cols["base_offset"],
        -1,
        -1,
        -1,
        -1,
        compress,
    )


def corrupt_columns(rng: random.Random, cols: dict) -> dict:
    """A wrong type or a number that does not fit, somewhere."""
    cols = dict(cols)
    n = len(cols["values"])
    bad = rng.choice(["str", 1, 2**64, -(2**64), object(), [b"x"], ("k",), ("k", "v")])
    which = rng.choice(["values", "keys", "headers", "timestamps", "offset_deltas"])
    column = list(cols[which] or [None] * n)
    column[rng.randrange(n)] = bad if which != "headers" else [bad]
    cols[which] = column if rng.random() < 0.9 else column[:-1]
    return cols


def mutate(rng: random.Random, section: bytes) -> bytes:
    b = bytearray(section)
    how = rng.randrange(5)
    if how == 0 and b:
        del b[rng.randrange(len(b)) :]
    elif how == 1 and b:
        for _ in range(rng.randrange(1, 5)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif how == 2:
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.choice([b"\xff" * rng.randrange(1, 12), random_bytes(rng, 12)])
    elif how == 3 and b:
        i = rng.randrange(len(b))
        del b[i : i + rng.randrange(1, 8)]
    else:
        return random_bytes(rng, 80)
    return bytes(b)


def call(f: Any, *args: Any) -> None:
    with contextlib.suppress(*EXPECTED):
        f(*args)


def fuzz_codec(codec: Any, count: int, rng: random.Random) -> None:
    corpus: list[tuple[bytes, int, int, int]] = []
    while len(corpus) < 64:
        cols = random_columns(rng)
        try:
            data = twin.build_batch(*build_args(cols))
        except ValueError:
            continue
        base_ts = int.from_bytes(data[27:35], "big", signed=True)
        corpus.append((data[61:], len(cols["values"]), cols["base_offset"], base_ts))
    for i in range(count):
        if i % 8 == 0:  # build: valid, compressed, or with a bad field
            cols = random_columns(rng)
            if rng.random() < 0.3:
                cols = corrupt_columns(rng, cols)
            args = build_args(cols)
            try:
                expected: Any = twin.build_batch(*args)
            except EXPECTED as e:
                expected = type(e)
            try:
                got: Any = codec.build_batch(*args)
            except EXPECTED as e:
                got = type(e)
            assert got == expected, (i, args)
            call(codec.build_batch, *build_args(cols, lambda s: s[::-1], 3))
            # send_many's slices: the same columns, any start and room, as the twin cuts
            cut = (
                cols["values"],
                cols["keys"],
                rng.randrange(-1, len(cols["values"]) + 2),
                rng.choice([-1, 0, 1, 50, 2**40, 2**63 - 1, 2**63]),
                rng.choice([0, 8, -1, 2**62]),
            )
            try:
                expected = twin.column_cut(*cut)
            except EXPECTED as e:
                expected = type(e)
            try:
                got = codec.column_cut(*cut)
            except EXPECTED as e:
                got = type(e)
            assert got == expected, (i, cut)
            continue
        section, n, base_offset, base_ts = rng.choice(corpus)
        if rng.random() < 0.7:
            section = mutate(rng, section)
        count_arg = rng.choice([n, n, n, n - 1, n + 1, 0, -1, 2**31 - 1, 2**40])
        if rng.random() < 0.1:
            base_offset = rng.choice([INT64_MAX, INT64_MIN, 2**63])
        if rng.random() < 0.1:
            base_ts = rng.choice([INT64_MAX, INT64_MIN, 2**63])
        view: Any = rng.choice([section, bytearray(section), memoryview(b"??" + section)[2:]])
        append = rng.choice([None, None, 5, 2**63])
        call(codec.decode_columns, view, count_arg, base_offset, base_ts, append)
        cls = rng.choice([Rec, Rec, tuple, WithDict])
        lo = base_offset + rng.randrange(-2, n + 2)
        call(codec.decode_records, view, count_arg, base_offset, base_ts, append, cls, "t", 0, lo)
        hi = rng.choice([lo + rng.randrange(0, n + 2), 2**70, -(2**70)])
        call(codec.decode_arrow, view, count_arg, base_offset, base_ts, append, lo, hi)
        call(codec.check_records, view, count_arg, base_ts, rng.random() < 0.5)


def fuzz_batchwrite(bw: Any, count: int, rng: random.Random) -> None:
    corpus = []
    while len(corpus) < 32:
        try:
            corpus.append(twin.build_batch(*build_args(random_columns(rng))))
        except ValueError:
            continue
    with tempfile.TemporaryFile() as f:
        fd = f.fileno()
        for i in range(count):
            data = rng.choice(corpus)
            if rng.random() < 0.8:
                data = mutate(rng, data)
            buf: Any = rng.choice([data, bytearray(data), memoryview(b"?" + data)[1:]])
            args = (
                buf,
                rng.choice([0, 7, INT64_MAX, 2**63]),
                rng.choice([0, -1, 2**31]),
                rng.choice([len(data), 1 << 20, 10]),
                rng.choice([2**31, 5, 0]),
            )
            call(bw.write_batch, fd, *args)
            if i % 64 == 0:
                os.ftruncate(fd, 0)
                call(bw.crc32c, data)


def main() -> None:
    module_dir, which, count, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sys.path.insert(0, module_dir)
    rng = random.Random(seed)
    if which == "codec":
        import _recordcodec  # type: ignore[import-not-found]

        assert _recordcodec.__file__.startswith(module_dir), _recordcodec.__file__
        fuzz_codec(_recordcodec, count, rng)
    else:
        import _batchwrite  # type: ignore[import-not-found]

        assert _batchwrite.__file__.startswith(module_dir), _batchwrite.__file__
        fuzz_batchwrite(_batchwrite, count, rng)
    print(f"{which}: {count} inputs, seed {seed}: clean")


if __name__ == "__main__":
    main()
