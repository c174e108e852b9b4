"""The append hot path's two implementations (storage/batchwrite.py): the C extension and
its pure-Python twin keep one contract, byte for byte.

Each test runs against both; the native one is skipped only where it was not built, and
`test_native_extension_is_built_where_a_compiler_exists` makes a silently failed build
(the extension is optional in pyproject) fail CI instead of quietly running slower.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import resource
import shutil
import signal
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import crc32c
import pytest
from helpers import log_records, stamped
from hypothesis import given, settings
from hypothesis import strategies as st

from rillet.client.wire import records
from rillet.client.wire.errors import StorageError
from rillet.storage import Log, LogConfig, batchwrite, fs
from rillet.storage.dump import scan_file, segment_files

IMPLS = ["native", "python"]


def impl(name: str) -> batchwrite.WriteBatch:
    if name == "python":
        return batchwrite.write_batch_py
    if not batchwrite.NATIVE:
        pytest.skip("the C extension was not built here")
    return batchwrite.write_batch


def make_batch(n: int = 5, size: int = 10, ts: int = 1000) -> bytes:
    return records.encode_batch(
        [bytes([i % 251]) * size for i in range(n)], timestamps=[ts + i for i in range(n)]
    )


def write_to_file(tmp_path: Path, name: str, data, *args) -> tuple[object, bytes]:
    path = tmp_path / f"{name}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        result = impl(name)(fd, data, *args)
    finally:
        os.close(fd)
    return result, path.read_bytes()


def test_native_extension_is_built_where_a_compiler_exists() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the pure-Python twin runs")
    assert batchwrite.NATIVE, "pip install ran with a C compiler but built no _batchwrite"


# -- the CRC the native path computes itself (AVX-512 folding) ------------------------


def crc_levels() -> list[int]:
    if not batchwrite.NATIVE:
        return []
    from rillet.storage import _batchwrite

    return list(range(_batchwrite.CRC_LEVEL + 1))  # 0: the crc32c package, 1: folding


# Folding works in 256-byte turns, then 64-byte ones, then 16; below 256 bytes it is the
# crc32 instruction alone: every edge of those, and a 16 KiB batch's CRC span.
EDGES = [
    0,
    1,
    7,
    8,
    9,
    15,
    16,
    17,
    255,
    256,
    257,
    271,
    272,
    319,
    320,
    321,
    511,
    512,
    513,
    767,
    768,
    1023,
    1024,
    1025,
    4096 + 48 + 15,
    16214,
    16384,
]


@pytest.mark.parametrize("n", EDGES)
def test_native_crc_matches_crc32c_at_block_edges(n: int) -> None:
    from rillet.storage import _batchwrite

    for level in crc_levels():
        for fill in (os.urandom(n + 3), b"\xff" * (n + 3), b"\x00" * (n + 3)):
            for start in (0, 1, 3):
                data = memoryview(fill)[start : start + n]
                assert _batchwrite.crc32c(data, level) == crc32c.crc32c(data), (level, start)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40_000))
def test_native_crc_matches_crc32c(data: bytes) -> None:
    from rillet.storage import _batchwrite

    for level in crc_levels():
        assert _batchwrite.crc32c(data, level) == crc32c.crc32c(data)


# -- the happy path -------------------------------------------------------------------

BUFFERS = {
    "bytes": lambda b: b,
    "memoryview-of-bytes": lambda b: memoryview(b"xx" + b + b"yy")[2:-2],
    "bytearray": bytearray,
    "memoryview-of-bytearray": lambda b: memoryview(bytearray(b"xx" + b + b"yy"))[2:-2],
}


@pytest.mark.parametrize("kind", BUFFERS)
@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("n, size", [(1, 1), (157, 100), (40, 8000)])
def test_a_valid_batch_is_written_stamped(tmp_path, name, kind, n, size) -> None:
    b = make_batch(n, size)
    data = BUFFERS[kind](b)
    result, on_disk = write_to_file(tmp_path, name, data, 42, 7, 1 << 20, 1 << 30)
    h = records.read_header(b)
    assert result == (len(b), h.last_offset_delta, h.max_timestamp, n)
    assert on_disk == stamped(b, 42, 7)
    if isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly):
        assert bytes(data) == stamped(b, 42, 7)  # writable: stamped in place
    else:
        assert bytes(data) == b  # read-only: left as it was


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.binary(max_size=300), min_size=1, max_size=30),
    base=st.integers(0, 2**62),
    epoch=st.integers(0, 2**31 - 1),
    writable=st.booleans(),
)
def test_both_implementations_agree(tmp_path_factory, values, base, epoch, writable) -> None:
    if not batchwrite.NATIVE:
        return
    tmp = tmp_path_factory.mktemp("agree")
    b = records.encode_batch(values)
    outs = []
    for name in IMPLS:
        data = bytearray(b) if writable else b
        outs.append(write_to_file(tmp, name, data, base, epoch, 1 << 20, 1 << 30))
    assert outs[0] == outs[1]
    assert outs[0][1] == stamped(b, base, epoch)


# -- everything else: None, nothing written, the buffer untouched ----------------------


def _flip(b: bytes, pos: int) -> bytes:
    out = bytearray(b)
    out[pos] ^= 0x01
    return bytes(out)


GOOD = make_batch(19, 50)  # 1,140 bytes: a whole number of 4-byte words (see below)
REFUSED = {
    "empty": b"",
    "shorter than a header": GOOD[:60],
    "truncated": GOOD[:-1],
    "trailing bytes": GOOD + b"\x00",
    "two batches": GOOD + GOOD,
    "bad magic": _flip(GOOD, records.MAGIC_POS),
    "flipped crc": _flip(GOOD, records.CRC_POS),
    "flipped attributes": _flip(GOOD, records.ATTRIBUTES_POS),
    "flipped record byte": _flip(GOOD, len(GOOD) - 1),
    "length says more": _flip(GOOD, records.LENGTH_POS + 3),
    "no records": records.assemble_batch(
        b"\x90",
        attributes=0,
        record_count=0,
        last_offset_delta=0,
        base_timestamp=0,
        max_timestamp=0,
    ),
}


@pytest.mark.parametrize("writable", [False, True], ids=["read-only", "writable"])
@pytest.mark.parametrize("case", REFUSED)
@pytest.mark.parametrize("name", IMPLS)
def test_anything_but_one_valid_batch_returns_none_and_writes_nothing(
    tmp_path, name, case, writable
) -> None:
    original = REFUSED[case]
    data = bytearray(original) if writable else original
    result, on_disk = write_to_file(tmp_path, name, data, 5, 1, 1 << 20, 1 << 30)
    assert result is None and on_disk == b""
    assert bytes(data) == original


@pytest.mark.parametrize("name", IMPLS)
def test_size_and_offset_delta_limits(tmp_path, name) -> None:
    h = records.read_header(GOOD)
    for max_size, max_delta, ok in [
        (len(GOOD), h.last_offset_delta, True),
        (len(GOOD) - 1, 1 << 30, False),  # over max.message.bytes
        (1 << 20, h.last_offset_delta - 1, False),  # relative offsets would overflow
    ]:
        result, on_disk = write_to_file(tmp_path, name, GOOD, 0, 0, max_size, max_delta)
        assert (result is not None, len(on_disk)) == (ok, len(GOOD) if ok else 0)


@pytest.mark.parametrize("name", IMPLS)
def test_out_of_range_arguments_are_refused_alike(tmp_path, name) -> None:
    bad = REFUSED["flipped crc"]
    for fd, base, epoch in [(-1, 0, 0), (3, 2**63, 0), (3, 0, 2**31), (3, -(2**63) - 1, 0)]:
        # An invalid batch is None whatever the arguments...
        assert impl(name)(fd, bad, base, epoch, 2**70, -(2**70)) is None
    data = bytearray(GOOD)
    for base, epoch in [(2**63, 0), (0, 2**31), (0, -(2**31) - 1)]:
        with pytest.raises(OverflowError):  # ...a valid one must fit the file's fields
            write_to_file(tmp_path, name, data, base, epoch, 1 << 20, 1 << 30)
    with pytest.raises(OSError) as refused:
        impl(name)(-1, data, 0, 0, 1 << 20, 1 << 30)
    assert refused.value.errno == errno.EBADF
    assert bytes(data) == GOOD  # nothing stamped before the refusal
    # Limits beyond int64 saturate rather than fail.
    result, on_disk = write_to_file(tmp_path, name, GOOD, 1, 1, 2**70, 2**70)
    assert result is not None and on_disk == stamped(GOOD, 1, 1)


@pytest.mark.parametrize("name", IMPLS)
def test_any_writable_exporter_is_stamped_in_place(tmp_path, name) -> None:
    arr = array.array("B", GOOD)
    result, on_disk = write_to_file(tmp_path, name, arr, 4, 2, 1 << 20, 1 << 30)
    assert result is not None and on_disk == bytes(arr) == stamped(GOOD, 4, 2)
    assert len(GOOD) % 4 == 0
    words = memoryview(bytearray(GOOD)).cast("I")  # sized in bytes, not in items
    result, on_disk = write_to_file(tmp_path, name, words, 4, 2, 1 << 20, 1 << 30)
    assert result is not None and result[0] == len(GOOD) and on_disk == stamped(GOOD, 4, 2)


# -- short and failed writes ----------------------------------------------------------


@pytest.mark.parametrize("writable", [False, True], ids=["read-only", "writable"])
@pytest.mark.parametrize("name", IMPLS)
def test_a_short_write_returns_what_was_written(name, writable) -> None:
    b = make_batch(50, 2000)  # ~100 KiB: more than an empty pipe takes at once
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
        capacity = fcntl.fcntl(w, 1032)  # F_GETPIPE_SZ
        result = impl(name)(w, bytearray(b) if writable else b, 9, 3, 1 << 20, 1 << 30)
        assert result is not None
        written = result[0]
        assert 0 < written < len(b) and written <= capacity
        got = b""
        while len(got) < written:
            got += os.read(r, written - len(got))
        assert got == stamped(b, 9, 3)[:written]
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("name", IMPLS)
def test_a_failing_write_raises_oserror(tmp_path, name) -> None:
    fd = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError):
            impl(name)(fd, GOOD, 0, 0, 1 << 20, 1 << 30)
    finally:
        os.close(fd)


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """RLIMIT_FSIZE: a write crossing ``limit`` comes back short, one at it fails EFBIG."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


@pytest.mark.parametrize("over", [0, 5, 100], ids=["fails", "short-5", "short-100"])
@pytest.mark.parametrize("batches", [1, 2], ids=["one-batch", "two-batches"])
@pytest.mark.parametrize("name", IMPLS)
def test_a_failed_append_leaves_no_bytes_behind(tmp_path, monkeypatch, name, batches, over):
    """A disk that fills mid-write: the append raises, the partial bytes are cut, and the
    next append lands where the log says, so reads and `log verify` stay right."""
    monkeypatch.setattr(fs, "write_batch", impl(name))
    log = Log.open(tmp_path / "t-0", LogConfig())
    log.append(make_batch(3), 1)
    size = log.active_segment.size
    payload = make_batch(4, 20) * batches
    with file_size_limit(size + over), pytest.raises(OSError):
        log.append(payload, 1)
    assert (log.log_end_offset, log.active_segment.size) == (3, size)
    assert os.path.getsize(log.active_segment.log_path) == size
    assert log.append(make_batch(2), 1) == (3, 4)
    offsets = [
        (h.base_offset, h.last_offset) for _, h in records.iter_batches(log.read_bytes(0, 1 << 20))
    ]
    assert offsets == [(0, 2), (3, 4)]
    log.close()
    reports = [scan_file(p) for p in segment_files(tmp_path / "t-0")]  # as `log verify`
    assert [r.problem for r in reports] == [None] and reports[0].batches == 2


@pytest.mark.parametrize("name", IMPLS)
def test_a_partial_write_that_cannot_be_cut_makes_the_log_read_only(tmp_path, monkeypatch, name):
    """The file now holds bytes the log does not account for: refuse further appends
    (as Kafka takes a failed log dir offline) rather than write after them."""
    monkeypatch.setattr(fs, "write_batch", impl(name))
    log = Log.open(tmp_path / "t-0", LogConfig())
    log.append(make_batch(3), 1)
    size = log.active_segment.size

    def no_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fs, "ftruncate", no_truncate)
    with file_size_limit(size + 5), pytest.raises(OSError):
        log.append(make_batch(4, 20), 1)
    monkeypatch.undo()
    assert log.failure is not None
    with pytest.raises(StorageError, match="failed earlier"):
        log.append(make_batch(2), 1)
    assert os.path.getsize(log.active_segment.log_path) == size + 5  # nothing after them
    assert [r.value for r in log_records(log)] == [
        r.value for r in records.decode_all(make_batch(3))
    ]  # what was acknowledged still reads
    log.close()
