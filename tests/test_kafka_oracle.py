"""kafka-python as an independent oracle of our v2 batches.

kafka-python reads and writes Kafka's RecordBatch v2 with its own code (its own varints,
CRC-32C, codec framing), so agreement both ways is evidence that what we write is what
Kafka writes and that we read what Kafka clients send: every codec, null keys and
values, headers, timestamp deltas either way, the cleaner's offset gaps, stamped base
offsets and leader epochs.
"""

from __future__ import annotations

import struct
import warnings
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rillet.client.consumer import ConsumerRecord
from rillet.client.wire import codecs, records

with warnings.catch_warnings():  # kafka-python loads its protocol schemas a deprecated way
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

CODECS = sorted(records.COMPRESSION_NAMES)  # none, gzip, snappy, lz4, zstd
CODEC_IDS = [records.COMPRESSION_NAMES[c] for c in CODECS]

# A record as both sides see it: (offset, timestamp, key, value, headers); headers is a
# list of (str, bytes | None) pairs, None when the record has none (kafka-python says []).
Row = tuple[int, int, bytes | None, bytes | None, list | None]


def _kp_rows(buf: bytes | bytearray) -> list[Row]:
    """Parse one batch with kafka-python, checking its CRC first."""
    batch = DefaultRecordBatch(bytearray(buf))
    assert batch.validate_crc(), "kafka-python computes a different CRC"
    return [
        (r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers] or None)
        for r in batch
    ]


def _kp_build(rows: list[Row], codec: int) -> bytearray:
    """A batch as kafka-python's producer builds it; offsets are the rows' offset deltas."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for offset, ts, key, value, headers in rows:
        assert builder.append(offset, ts, key, value, headers or []) is not None
    return builder.build()


def _ours(buf: bytes | bytearray) -> list[Row]:
    h = records.validate_batch(buf)
    via_records = [tuple(r) for r in records.decode_batch(buf)]
    consumer = records.decode_records(buf, 0, h, ConsumerRecord, "t", 3, -1)
    assert all(type(r) is ConsumerRecord for r in consumer)
    assert [(r.topic, r.partition) for r in consumer] == [("t", 3)] * len(consumer)
    assert [tuple(r)[2:] for r in consumer] == via_records
    assert _from_arrow(records.decode_arrow(buf, 0, h, -(2**63), 2**63 - 1)) == via_records
    return via_records


def _from_arrow(chunk: tuple) -> list[Row]:
    """Read ``decode_arrow``'s buffers back into rows, by the layout its docstring gives."""
    n, offsets, timestamps, kv, ko, kd, vv, vo, vd, headers = chunk

    def longs(b: bytes) -> list[int]:
        return list(struct.unpack(f"<{n}q", b))

    def binary(validity: bytes, offs: bytes, data: bytes) -> list[bytes | None]:
        o = array("i")
        o.frombytes(offs)
        if struct.pack("=i", 1) != struct.pack("<i", 1):
            o.byteswap()
        assert len(o) == n + 1
        return [
            bytes(data[o[i] : o[i + 1]]) if validity[i >> 3] >> (i & 7) & 1 else None
            for i in range(n)
        ]

    hs = headers if headers is not None else [None] * n
    return list(
        zip(
            longs(offsets),
            longs(timestamps),
            binary(kv, ko, kd),
            binary(vv, vo, vd),
            hs,
            strict=True,
        )
    )


def _encode(rows: list[Row], codec: int, **kw) -> bytes:
    """Our batch of ``rows`` (offsets as deltas from ``base_offset``)."""
    base = kw.pop("base_offset", 0)
    return records.encode_batch(
        [r[3] for r in rows],
        [r[2] for r in rows],
        headers=[r[4] for r in rows],
        timestamps=[r[1] for r in rows],
        offset_deltas=[r[0] for r in rows],
        compression=codec,
        base_offset=base,
        **kw,
    )


# Compressible enough that kafka-python keeps its compressed form (it sends a batch
# uncompressed when compression does not make it smaller).
ROWS: list[Row] = [
    (0, 1_700_000_000_000, b"key-0", b"value " * 40, [("trace", b"abc"), ("empty", b"")]),
    (1, 1_699_999_999_000, None, b"value " * 40, None),  # negative timestamp delta
    (2, 1_700_000_000_500, b"", None, [("null", None), ("clé-ü-☃", b"\x00\xff")]),
    (3, 1_700_000_000_500, b"key-3", b"", []),
    (4, 1_700_000_000_001, b"\x00" * 300, b"v" * 1000, [("h", b"x" * 70)] * 3),
]


def _expected(rows: list[Row], base_offset: int = 0) -> list[Row]:
    return [(base_offset + o, t, k, v, list(h) if h else None) for o, t, k, v, h in rows]


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_kafka_python_reads_our_batches(codec: int):
    buf = _encode(ROWS, codec)
    batch = DefaultRecordBatch(bytearray(buf))
    assert batch.compression_type == codec
    assert (batch.base_offset, batch.magic, batch.records_count) == (0, 2, len(ROWS))
    assert batch.first_timestamp == ROWS[0][1]
    assert batch.max_timestamp == max(r[1] for r in ROWS)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    assert not batch.is_transactional and not batch.is_control_batch
    assert _kp_rows(buf) == _expected(ROWS)


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_kafka_python_reads_the_cleaners_gaps_and_a_leaders_stamp(codec: int):
    """A compacted batch keeps its original offsets (gaps between them) and its base
    offset; a leader stamps base offset and leader epoch outside the CRC."""
    gapped = [(d, *ROWS[i % len(ROWS)][1:]) for i, d in enumerate((0, 3, 4, 10, 11, 40))]
    buf = bytearray(_encode(gapped, codec, base_offset=1000, partition_leader_epoch=5))
    batch = DefaultRecordBatch(bytearray(buf))
    assert (batch.base_offset, batch.leader_epoch, batch.last_offset_delta) == (1000, 5, 40)
    assert batch.next_offset == 1041
    assert _kp_rows(buf) == _expected(gapped, 1000)
    records.stamp(buf, 0, 2**40, 2**31 - 1)
    batch = DefaultRecordBatch(bytearray(buf))
    assert (batch.base_offset, batch.leader_epoch) == (2**40, 2**31 - 1)
    assert _kp_rows(buf) == _expected(gapped, 2**40)


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_we_read_kafka_pythons_batches(codec: int):
    buf = _kp_build(ROWS, codec)
    h = records.validate_batch(buf)
    assert h.compression == codec  # kafka-python kept it compressed
    # kafka-python, as a producer, leaves the leader epoch 0 (Java's producer: -1).
    assert (h.base_offset, h.partition_leader_epoch) == (0, 0)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1)
    assert _ours(buf) == _expected(ROWS)
    records.validate_produced(buf, compacted=False)
    with pytest.raises(records.InvalidRecordError, match="record 1 has no key"):
        records.validate_produced(buf, compacted=True)


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_we_read_gaps_kafka_python_writes(codec: int):
    """kafka-python's builder takes any increasing offset per record (it writes the
    number as the offset delta), so it can build a batch as the cleaner leaves it."""
    gapped = [(d, *ROWS[i % len(ROWS)][1:]) for i, d in enumerate((0, 2, 9, 10, 1000))]
    buf = bytearray(_kp_build(gapped, codec))
    assert records.validate_batch(buf).last_offset_delta == 1000
    assert _ours(buf) == _expected(gapped)
    records.stamp(buf, 0, 500, 7)
    assert _ours(buf) == _expected(gapped, 500)
    # Only the cleaner leaves gaps: a producer's batch with them is refused.
    with pytest.raises(records.InvalidRecordError, match="last offset delta is 1000"):
        records.validate_produced(_kp_build(gapped, codec), compacted=False)
    records.validate_batch(buf)  # the stamp left the CRC valid


def test_memory_records_reads_a_fetch_of_several_of_our_batches():
    """A fetch response holds batches back to back: kafka-python's reader walks ours."""
    bufs = [_encode(ROWS, c, base_offset=10 * i) for i, c in enumerate(CODECS)]
    mr = MemoryRecords(b"".join(bufs))
    seen = []
    while mr.has_next():
        batch = mr.next_batch()
        assert batch.validate_crc()
        seen.extend((r.offset, r.value) for r in batch)
    assert seen == [(10 * i + o, r[3]) for i in range(len(CODECS)) for o, r in enumerate(ROWS)]


def test_uncompressed_batches_are_byte_identical_but_for_the_leader_epoch():
    """For the same records, our uncompressed batch is kafka-python's, byte for byte,
    except partition_leader_epoch (bytes 12..16): we write -1 as Java's producer does,
    kafka-python writes 0. The CRC does not cover those bytes, so it agrees too."""
    ours = _encode(ROWS, records.COMPRESSION_NONE)
    theirs = bytes(_kp_build(ROWS, records.COMPRESSION_NONE))
    assert len(ours) == len(theirs)
    assert ours[:12] == theirs[:12]
    assert (ours[12:16], theirs[12:16]) == (b"\xff" * 4, b"\x00" * 4)
    assert ours[16:] == theirs[16:]
    assert _encode(ROWS, records.COMPRESSION_NONE, partition_leader_epoch=0) == theirs


# --- random records, both ways --------------------------------------------------------

_header = st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=6))


@st.composite
def _rows(draw) -> list[Row]:
    n = draw(st.integers(1, 12))
    base_ts = draw(st.integers(0, 2**45))
    deltas = draw(st.lists(st.integers(1, 2**20), min_size=n - 1, max_size=n - 1))
    offsets = [0]
    for d in deltas:
        offsets.append(offsets[-1] + d)
    if draw(st.booleans()):  # a producer's batch: contiguous
        offsets = list(range(n))
    rows = []
    for o in offsets:
        ts = base_ts + draw(st.integers(-(2**40), 2**40))
        key = draw(st.none() | st.binary(max_size=20))
        value = draw(st.none() | st.binary(max_size=60))
        headers = draw(st.none() | st.lists(_header, min_size=1, max_size=3))
        rows.append((o, ts, key, value, headers))
    return rows


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _rows(),
    st.sampled_from(CODECS),
    st.integers(0, 2**50),
    st.integers(-1, 2**31 - 1),
)
def test_random_batches_agree_both_ways(rows: list[Row], codec: int, base: int, epoch: int):
    expected = _expected(rows, base)
    ours = bytearray(_encode(rows, codec, base_offset=base, partition_leader_epoch=epoch))
    assert _kp_rows(ours) == expected
    assert DefaultRecordBatch(bytearray(ours)).leader_epoch == epoch

    theirs = _kp_build(rows, codec)
    h = records.validate_batch(theirs)
    assert h.compression in (codec, records.COMPRESSION_NONE)  # it may skip compression
    records.stamp(theirs, 0, base, epoch)
    assert _ours(theirs) == expected
    if codec == records.COMPRESSION_NONE:
        ours[12:16] = theirs[12:16]
        assert ours == theirs
    if rows[-1][0] == len(rows) - 1:  # contiguous: what a producer may send
        records.stamp(theirs, 0, 0, 0)
        records.validate_produced(theirs, compacted=False)


# --- codec framing as Kafka's Java client writes it -----------------------------------


def test_kafka_pythons_snappy_is_xerial_framed_and_we_read_it():
    """Java's client (snappy-java's SnappyOutputStream) frames snappy in the xerial
    block stream; kafka-python writes the same, so its batch stands in for Java's."""
    big = [(i, 5, b"k", bytes([i % 7]) * 50_000, None) for i in range(3)]  # > one 32 KiB block
    buf = _kp_build(big, records.COMPRESSION_SNAPPY)
    h = records.validate_batch(buf)
    assert h.compression == records.COMPRESSION_SNAPPY
    assert bytes(buf[records.HEADER_SIZE : records.HEADER_SIZE + 8]) == b"\x82SNAPPY\x00"
    assert _ours(buf) == _expected(big)


def test_our_snappy_starts_with_the_xerial_header_in_32k_blocks():
    big = [(i, 5, b"k", bytes([i % 7]) * 50_000, None) for i in range(3)]
    buf = _encode(big, records.COMPRESSION_SNAPPY)
    body = buf[records.HEADER_SIZE :]
    assert body[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    pos, blocks = 16, 0
    while pos < len(body):
        (n,) = struct.unpack_from(">i", body, pos)
        assert 0 < n <= len(body) - pos - 4
        pos += 4 + n
        blocks += 1
    assert pos == len(body)
    section = sum(len(r[3]) for r in big)
    assert blocks >= section // (32 * 1024)  # snappy-java's 32 KiB input blocks
    assert _kp_rows(buf) == _expected(big)


def test_kafka_pythons_lz4_decodes():
    buf = _kp_build(ROWS, records.COMPRESSION_LZ4)
    assert records.validate_batch(buf).compression == records.COMPRESSION_LZ4
    assert _ours(buf) == _expected(ROWS)


def test_our_lz4_frame_has_kafkas_flags():
    """Kafka's KafkaLZ4BlockOutputStream writes an LZ4 frame with version 01, independent
    blocks, no block checksum, no content size and no content checksum, 64 KiB blocks."""
    buf = _encode(ROWS, records.COMPRESSION_LZ4)
    body = buf[records.HEADER_SIZE :]
    assert body[:4] == struct.pack("<I", 0x184D2204)  # the LZ4 frame magic
    flg, bd = body[4], body[5]
    assert flg >> 6 == 0b01  # version
    assert flg & 0x20  # block independence
    assert not flg & 0x10  # block checksum
    assert not flg & 0x08  # content size
    assert not flg & 0x04  # content checksum
    assert not flg & 0x03  # reserved bit, dictionary id
    assert (bd >> 4) & 0x07 == 4  # block maximum size: 64 KiB
    assert not bd & 0x8F  # reserved bits
    assert codecs.compress(records.COMPRESSION_LZ4, b"")[4] == flg  # every frame alike
