"""The record-batch format: round trips and corruption detection, as properties."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers import bytes_field as _bytes_field
from helpers import uvarint as _uvarint
from helpers import zigzag as _varint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rillet.client.wire import records
from rillet.client.wire.errors import (
    CorruptRecordError,
    InvalidRecordError,
    MessageTooLargeError,
)

COMPRESSIONS = sorted(records.COMPRESSION_NAMES)  # none, gzip, snappy, lz4, zstd

small_bytes = st.binary(max_size=40)
header_lists = st.lists(
    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3
)


@st.composite
def batches(draw):
    n = draw(st.integers(1, 20))
    values = draw(st.lists(st.none() | small_bytes, min_size=n, max_size=n))
    keys = draw(st.lists(st.none() | small_bytes, min_size=n, max_size=n))
    headers = draw(st.none() | st.lists(st.none() | header_lists, min_size=n, max_size=n))
    timestamps = draw(st.none() | st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    compression = draw(st.sampled_from(COMPRESSIONS))
    return values, keys, headers, timestamps, compression


def _normalize_headers(h):
    return [list(pair) for pair in h] if h else None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.integers(0, 2**40), st.integers(-1, 2**20))
def test_encode_decode_round_trip(batch, base_offset, epoch):
    values, keys, headers, timestamps, compression = batch
    buf = records.encode_batch(
        values,
        keys,
        headers=headers,
        timestamps=timestamps,
        timestamp_ms=77,
        compression=compression,
        base_offset=base_offset,
        partition_leader_epoch=epoch,
    )
    h = records.validate_batch(buf)
    assert (h.base_offset, h.partition_leader_epoch) == (base_offset, epoch)
    assert h.record_count == len(values)
    # check_batch's lean unpack (pad bytes between fields) reads the same fields.
    padded = b"\0" * 5 + buf + b"\0" * 3
    assert records.check_batch(padded, 5, None) == (
        h.size,
        h.last_offset_delta,
        h.max_timestamp,
        h.record_count,
    )
    assert h.compression == compression
    decoded = records.decode_batch(buf)
    assert [r.offset for r in decoded] == list(range(base_offset, base_offset + len(values)))
    assert [r.value for r in decoded] == values
    assert [r.key for r in decoded] == keys
    expected_ts = timestamps if timestamps is not None else [77] * len(values)
    assert [r.timestamp for r in decoded] == expected_ts
    assert h.max_timestamp == max(expected_ts)
    want_headers = [_normalize_headers(x) for x in headers] if headers else [None] * len(values)
    assert [_normalize_headers(r.headers) for r in decoded] == want_headers


@settings(max_examples=60, deadline=None)
@given(batches(), st.data())
def test_flipped_bit_after_crc_field_is_detected(batch, data):
    values, keys, headers, timestamps, compression = batch
    buf = bytearray(
        records.encode_batch(
            values, keys, headers=headers, timestamps=timestamps, compression=compression
        )
    )
    pos = data.draw(st.integers(records.CRC_START, len(buf) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    buf[pos] ^= 1 << bit
    with pytest.raises(CorruptRecordError):
        records.validate_batch(buf)
    with pytest.raises(CorruptRecordError):
        records.check_batch(memoryview(bytes(buf)), 0, None)


def test_check_batch_errors_name_the_batch():
    buf = bytearray(records.encode_batch([b"x"], base_offset=4321))
    buf[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC mismatch in batch at offset 4321"):
        records.check_batch(buf, 0, None)
    buf[records.MAGIC_POS] = 3  # neither v2 nor the legacy format
    with pytest.raises(CorruptRecordError, match="bad magic 3 at batch offset 4321"):
        records.check_batch(buf, 0, None)
    with pytest.raises(CorruptRecordError, match="header needs"):
        records.check_batch(buf[:60], 0, None)


def test_stamp_keeps_crc_valid():
    buf = bytearray(records.encode_batch([b"a", b"b"]))
    records.stamp(buf, 0, 1234, 9)
    h = records.validate_batch(buf)
    assert (h.base_offset, h.partition_leader_epoch) == (1234, 9)


def test_offset_deltas_round_trip():
    buf = records.encode_batch([b"x", b"y"], [b"k1", b"k2"], offset_deltas=[2, 7], base_offset=100)
    h = records.validate_batch(buf)
    assert h.last_offset == 107
    assert [r.offset for r in records.decode_batch(buf)] == [102, 107]


def test_truncated_length_is_corrupt_not_too_large():
    buf = bytearray(records.encode_batch([b"x" * 100]))
    records._I.pack_into(buf, records.LENGTH_POS, 1 << 30)
    with pytest.raises(CorruptRecordError):
        records.validate_batch(buf, max_size=1000)
    with pytest.raises(MessageTooLargeError):
        records.validate_batch(records.encode_batch([b"x" * 100]), max_size=50)


def test_iter_batches_stops_on_impossible_length_without_validation():
    buf = bytearray(records.encode_batch([b"x"]))
    records._I.pack_into(buf, records.LENGTH_POS, -12)  # would never advance
    assert list(records.iter_batches(buf, validate=False)) == []


# --- what a leader accepts from a producer (validate_produced) -------------------------


def _record(
    offset_delta: int,
    value: bytes | None = b"v",
    key: bytes | None = b"k",
    *,
    ts_delta: int = 0,
    headers: bytes = b"\x00",
    length_adjust: int = 0,
) -> bytes:
    """One hand-made DefaultRecord; ``headers`` is the raw header part (count and pairs),
    ``length_adjust`` makes its length field lie."""
    body = (
        b"\x00"
        + _varint(ts_delta)
        + _varint(offset_delta)
        + _bytes_field(key)
        + _bytes_field(value)
        + headers
    )
    return _varint(len(body) + length_adjust) + body


def _restamped(body: bytes, *, count: int, last_delta: int, attributes: int = 0, ts: int = 5):
    """A batch around ``body`` with a fresh, valid CRC: only the records check can refuse it."""
    buf = records.assemble_batch(
        body,
        attributes=attributes,
        record_count=count,
        last_offset_delta=last_delta,
        base_timestamp=ts,
        max_timestamp=ts,
    )
    records.validate_batch(buf)  # length, magic and CRC pass
    return buf


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_validate_produced_accepts_what_a_producer_encodes(batch):
    values, keys, headers, timestamps, compression = batch
    buf = records.encode_batch(
        values, keys, headers=headers, timestamps=timestamps, compression=compression
    )
    records.validate_produced(buf + buf, compacted=False)
    if None in keys:
        with pytest.raises(InvalidRecordError, match=f"record {keys.index(None)} has no key"):
            records.validate_produced(buf, compacted=True)
    else:
        records.validate_produced(buf, compacted=True)


def test_hand_made_records_decode_as_built():
    """The hand-made records the tests below break are well formed when unbroken."""
    body = _record(0, b"a", b"k", headers=b"\x02\x02h" + _bytes_field(b"x")) + _record(1, None)
    buf = _restamped(body, count=2, last_delta=1)
    records.validate_produced(buf, compacted=True)
    assert [tuple(r) for r in records.decode_batch(buf)] == [
        (0, 5, b"k", b"a", [("h", b"x")]),
        (1, 5, b"k", None, None),
    ]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"\xc2 not a record", "record 0: record of .* bytes runs past the end"),
        (b"\xff" * 6, "record 0: varint longer than 5 bytes"),
        (b"\x00", "record 0: empty record"),
        (_varint(-3) + b"\x00", "record 0: negative record length"),
        (_record(0, length_adjust=1) + b"\x00", "record 0: record length says"),
        (_record(0, length_adjust=-1), "record 0: record length says"),
        (_record(0) + b"\x00\x00", "records section has 2 bytes after its 1 records"),
        (_record(0, key=None)[:-1], "record 0: record of .* bytes runs past the end"),
        (_record(0, headers=b"\x01"), "record 0: negative header count"),
        (_record(0, headers=b"\x02" + _varint(-1) + _varint(-1)), "record 0: null header key"),
        (_record(0, headers=b"\x02\x02\xff" + _varint(-1)), "record 0: header key is not UTF-8"),
        (_record(0, headers=b"\x02\x08h" + _varint(-1)), "record 0: header key of 4 bytes"),
        (_varint(7) + b"\x00\x00\x00\x02k" + _varint(-2) + b"\x00", "record 0: value length -2"),
    ],
)
def test_validate_produced_refuses_a_records_section_that_does_not_decode(body, problem):
    buf = _restamped(body, count=1, last_delta=0)
    with pytest.raises(InvalidRecordError, match=f"batch 0: {problem}"):
        records.validate_produced(buf, compacted=False)
    with pytest.raises(CorruptRecordError, match=problem):  # and a reader says so too
        records.decode_batch(buf)


def test_validate_produced_refuses_a_count_the_records_do_not_match():
    body = _record(0, b"a") + _record(1, b"b")  # two records
    assert len(records.decode_batch(_restamped(body, count=2, last_delta=1))) == 2
    buf = _restamped(body, count=3, last_delta=2)
    with pytest.raises(InvalidRecordError, match="batch 0: record 2: varint runs past the end"):
        records.validate_produced(buf, compacted=False)
    buf = _restamped(body, count=1, last_delta=0)
    with pytest.raises(InvalidRecordError, match="bytes after its 1 records"):
        records.validate_produced(buf, compacted=False)


def test_validate_produced_refuses_a_last_offset_delta_other_than_count_minus_one():
    body = _record(0, b"a") + _record(1, b"b")
    for delta in (0, 5):
        buf = _restamped(body, count=2, last_delta=delta)
        with pytest.raises(InvalidRecordError, match="last offset delta"):
            records.validate_produced(buf, compacted=False)
    # A compacted batch (gaps in its offset deltas) is the cleaner's, never a producer's.
    gaps = records.encode_batch([b"x", b"y"], [b"k1", b"k2"], offset_deltas=[0, 3])
    with pytest.raises(InvalidRecordError, match="last offset delta"):
        records.validate_produced(gaps, compacted=True)
    # The header's last delta is count - 1, but the records' own deltas are not 0..1.
    for deltas, problem in (
        ((1, 1), "record 0: offset delta 1, expected 0"),
        ((0, 0), "record 1: offset delta 0, expected 1"),
        ((1, 0), "record 0: offset delta 1, expected 0"),
    ):
        hole = _restamped(_record(deltas[0]) + _record(deltas[1]), count=2, last_delta=1)
        with pytest.raises(InvalidRecordError, match=problem):
            records.validate_produced(hole, compacted=True)


def test_validate_produced_refuses_an_unknown_codec_or_attribute():
    body = _record(0, b"a")
    for codec in (5, 6, 7):  # numbers Kafka does not use
        buf = _restamped(body, count=1, last_delta=0, attributes=codec)
        with pytest.raises(InvalidRecordError, match=f"unknown compression codec {codec}"):
            records.validate_produced(buf, compacted=False)
    for codec in (1, 2, 3, 4):  # a known codec over a section it did not compress
        buf = _restamped(body, count=1, last_delta=0, attributes=codec)
        with pytest.raises(InvalidRecordError, match="cannot decompress records"):
            records.validate_produced(buf, compacted=False)
    # Transactional, control, log-append time, delete horizon: Kafka's bits a producer to
    # rillet may not set; 0x80 and up: bits Kafka does not define.
    for bit in (0x08, 0x10, 0x20, 0x40, 0x80, 0x4000):
        buf = _restamped(body, count=1, last_delta=0, attributes=bit)
        with pytest.raises(InvalidRecordError, match=f"attribute bits {bit:#x}"):
            records.validate_produced(buf, compacted=False)
        lz4 = records.codecs.compress(records.COMPRESSION_LZ4, body)
        buf = _restamped(lz4, count=1, last_delta=0, attributes=bit | records.COMPRESSION_LZ4)
        with pytest.raises(InvalidRecordError, match=f"attribute bits {bit:#x}"):
            records.validate_produced(buf, compacted=False)


def test_validate_produced_refuses_header_fields_a_producer_does_not_send():
    with pytest.raises(InvalidRecordError, match="base offset 7"):
        records.validate_produced(records.encode_batch([b"x"], base_offset=7), compacted=False)
    body = _record(0, b"a")
    lying = records.assemble_batch(
        body,
        attributes=0,
        record_count=1,
        last_offset_delta=0,
        base_timestamp=5,
        max_timestamp=1 << 50,  # would hold a time-retained segment forever
    )
    with pytest.raises(InvalidRecordError, match="max timestamp"):
        records.validate_produced(lying, compacted=False)


def test_validate_produced_refuses_a_keyless_record_on_a_compacted_topic():
    good = records.encode_batch([b"a"], [b"k"])
    keyless = records.encode_batch([b"a", b"b", b"c"], [b"k", b"k", None])
    records.validate_produced(good + keyless, compacted=False)
    with pytest.raises(InvalidRecordError, match="batch 1, record 2 has no key"):
        records.validate_produced(good + keyless, compacted=True)
    # A v2 key is bytes or null, nothing else: a key the cleaner could not map (a list)
    # cannot be written at all.
    with pytest.raises(TypeError, match="record 1: a key must be bytes or None, not list"):
        records.encode_batch([b"a", b"b"], [b"k", [1, 2]])
    # A hand-made keyless record, compressed, is refused the same way.
    section = _record(0, b"a") + _record(1, b"b", key=None)
    for codec in sorted(records.COMPRESSION_NAMES):
        body = records.codecs.compress(codec, section) if codec else section
        buf = _restamped(body, count=2, last_delta=1, attributes=codec)
        records.validate_produced(buf, compacted=False)
        with pytest.raises(InvalidRecordError, match="batch 0, record 1 has no key"):
            records.validate_produced(buf, compacted=True)


def test_validate_produced_names_the_failing_batch():
    good = records.encode_batch([b"a"])
    bad = _restamped(b"\xc1", count=1, last_delta=0)
    with pytest.raises(InvalidRecordError, match="batch 2"):
        records.validate_produced(good + good + bad, compacted=False)


def test_validate_produced_refuses_an_oversized_batch_before_decoding_it():
    zstd = records.encode_batch([b"x" * 1000], compression=records.COMPRESSION_ZSTD)
    with pytest.raises(MessageTooLargeError):
        records.validate_produced(zstd, compacted=False, max_size=len(zstd) - 1)
    records.validate_produced(zstd, compacted=False, max_size=len(zstd))


def test_validate_produced_reports_a_crc_mismatch_as_such():
    """A flipped bit that also breaks the records is called what it is."""
    buf = bytearray(records.encode_batch([b"a", b"b"], [b"k", b"k"]))
    buf[-3] ^= 0xFF  # inside the records section
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        records.validate_produced(buf, compacted=True)
    buf = bytearray(records.encode_batch([b"a", b"b"]))
    records._I.pack_into(buf, records.HEADER_SIZE - 4, 3)  # record_count, header bits
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        records.validate_produced(buf, compacted=False)


def _bomb(codec: int, *, content_size: bool = True) -> bytes:
    """A small compressed body that expands past MAX_DECOMPRESSED_BYTES (built in chunks,
    so the test itself never holds the expanded bytes)."""
    chunk, chunks = bytes(1 << 20), (records.MAX_DECOMPRESSED_BYTES >> 20) + 1
    size = len(chunk) * chunks
    if codec == records.COMPRESSION_ZSTD:
        import zstandard

        cobj = zstandard.ZstdCompressor().compressobj(size=size if content_size else -1)
        return b"".join([cobj.compress(chunk) for _ in range(chunks)] + [cobj.flush()])
    if codec == records.COMPRESSION_LZ4:
        import lz4.frame

        comp = lz4.frame.LZ4FrameCompressor(block_linked=False)
        begin = comp.begin(source_size=size if content_size else 0)
        parts = [begin] + [comp.compress(chunk) for _ in range(chunks)] + [comp.flush()]
        return b"".join(parts)
    if codec == records.COMPRESSION_GZIP:
        import zlib

        z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return b"".join([z.compress(chunk) for _ in range(chunks)] + [z.flush()])
    import cramjam

    if content_size:  # xerial-framed: 1 MiB blocks, each within the limit, too many of them
        block = bytes(cramjam.snappy.compress_raw(chunk))
        framed = records.codecs._I32.pack(len(block)) + block
        return records.codecs._XERIAL_HEADER + framed * chunks
    # Raw: one block whose length preamble claims more than the limit (the preamble is
    # all a reader can bound it by; a real one would be 12 MB of compressed zeros).
    block = bytes(cramjam.snappy.compress_raw(chunk))
    return _uvarint(size) + block[len(_uvarint(len(chunk))) :]


@pytest.mark.parametrize(
    ("codec", "content_size"),
    [
        (records.COMPRESSION_ZSTD, True),
        (records.COMPRESSION_ZSTD, False),
        (records.COMPRESSION_LZ4, True),
        (records.COMPRESSION_LZ4, False),
        (records.COMPRESSION_GZIP, False),
        (records.COMPRESSION_SNAPPY, True),  # xerial-framed, as Kafka's Java client writes
        (records.COMPRESSION_SNAPPY, False),  # one raw block, as librdkafka may write
    ],
    ids=[
        "zstd-sized",
        "zstd-unsized",
        "lz4-sized",
        "lz4-unsized",
        "gzip",
        "snappy-xerial",
        "snappy-raw",
    ],
)
def test_a_decompression_bomb_is_refused_before_it_expands(codec: int, content_size: bool):
    """A leader decodes every produced batch, so a 1 MB batch that claims (or expands to)
    gigabytes must be refused, not allocated."""
    buf = _restamped(
        _bomb(codec, content_size=content_size), count=1, last_delta=0, attributes=codec
    )
    with pytest.raises(InvalidRecordError, match="decompresses to more than"):
        records.validate_produced(buf, compacted=False)
    with pytest.raises(CorruptRecordError, match="decompresses to more than"):
        records.decode_all(buf)


def test_zstd_batches_decode_on_several_threads_at_once():
    """The leader decodes produced batches on the loop thread while the cleaner decodes on
    executor threads: a codec context shared between threads corrupts data or crashes
    the process (python-zstandard's contexts are not thread-safe). Run in a child, as
    the failure can be a segfault."""
    script = textwrap.dedent(
        """
        import threading
        from rillet.client.wire import records

        values = [bytes([i % 251]) * (200 + i) for i in range(300)]
        batch = records.encode_batch(values, compression=records.COMPRESSION_ZSTD)
        errors = []

        def work():
            try:
                for _ in range(300):
                    assert [r.value for r in records.decode_all(batch)] == values
                    records.encode_batch(values, compression=records.COMPRESSION_ZSTD)
            except BaseException as e:
                errors.append(repr(e))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("errors", errors)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, f"child died ({done.returncode}): {done.stderr[-2000:]}"
    assert "errors []" in done.stdout, done.stdout[-2000:]


def test_a_leader_bounds_expansion_by_the_batch_size_limit():
    """Decoding runs on the leader's event loop, and its cost grows with the expanded
    size: a batch within max.message.bytes may expand at most PRODUCE_EXPANSION times
    (or 8 MiB) there, well below the consumer's 256 MiB cap."""
    buf = records.encode_batch([bytes(9 << 20)], compression=records.COMPRESSION_ZSTD)
    assert len(buf) < 1 << 20
    with pytest.raises(InvalidRecordError, match="decompresses to more than"):
        records.validate_produced(buf, compacted=False, max_size=len(buf))
    records.validate_produced(buf, compacted=False, max_size=1 << 20)  # 32 MiB allowed
    assert records.decode_all(buf)[0].value == bytes(9 << 20)
