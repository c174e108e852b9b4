"""client/wire/codecs.py: Kafka's codecs round-trip, bound what they expand to, and turn
every malformed input into CorruptRecordError (a leader decompresses what any producer
sends, so nothing else may escape)."""

from __future__ import annotations

import random
import struct
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rillet.client.wire import codecs
from rillet.client.wire.errors import CorruptRecordError

CODECS = [codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]
IDS = [codecs.NAMES[c] for c in CODECS]
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def _data(size: int, seed: int = 0) -> bytes:
    """Half random, half repetitive: both the literal and the match paths of a codec."""
    rnd = random.Random(seed)
    half = size // 2
    return rnd.randbytes(half) + bytes(b"abcdefgh"[i % 8] for i in range(size - half))


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@pytest.mark.parametrize("size", [0, 1, 32 * 1024 - 1, 32 * 1024, 32 * 1024 + 1, 1 << 20])
def test_round_trip(codec: int, size: int):
    data = _data(size, size)
    packed = codecs.compress(codec, data)
    assert codecs.decompress(codec, packed) == data
    # records.py hands over a view into a larger buffer: an offset slice reads the same.
    framed = memoryview(b"junk" + packed + b"more")[4 : 4 + len(packed)]
    assert codecs.decompress(codec, framed) == data
    assert codecs.decompress(codec, packed, size) == data  # exactly the limit is fine


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@pytest.mark.parametrize("size", [1, 1000, 32 * 1024 + 1, 200_000])
def test_decompression_is_bounded_by_the_limit(codec: int, size: int):
    """``limit`` bytes are accepted, ``limit + 1`` refused: with a limit one short of
    the content, every codec refuses it as corrupt."""
    data = _data(size, 7)
    packed = codecs.compress(codec, data)
    assert codecs.decompress(codec, packed, size) == data
    with pytest.raises(CorruptRecordError, match=f"decompresses to more than {size - 1} bytes"):
        codecs.decompress(codec, packed, size - 1)


def _lz4_sized(data: bytes) -> bytes:
    import lz4.frame

    return lz4.frame.compress(data, block_linked=False, store_size=True)


def _zstd_unsized(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(write_content_size=False).compress(data)


def _snappy_raw(data: bytes) -> bytes:
    import cramjam

    return bytes(cramjam.snappy.compress_raw(data))


def _snappy_one_big_block(data: bytes) -> bytes:
    """A xerial stream whose one block is larger than snappy-java's 32 KiB."""
    block = _snappy_raw(data)
    return XERIAL_HEADER + struct.pack(">i", len(block)) + block


@pytest.mark.parametrize(
    ("codec", "pack"),
    [
        (codecs.LZ4, _lz4_sized),
        (codecs.ZSTD, _zstd_unsized),
        (codecs.SNAPPY, _snappy_raw),
        (codecs.SNAPPY, _snappy_one_big_block),
    ],
    ids=["lz4-with-content-size", "zstd-without-content-size", "snappy-raw", "snappy-big-block"],
)
@pytest.mark.parametrize("size", [0, 1, 100_000])
def test_other_writers_forms_are_read_and_bounded(codec: int, pack, size: int):
    """Forms other Kafka clients write (kafka-python's lz4 with a content size, zstd
    without one, librdkafka's raw snappy, big xerial blocks): read, and bounded alike."""
    data = _data(size, 3)
    packed = pack(data)
    assert codecs.decompress(codec, packed) == data
    assert codecs.decompress(codec, packed, size) == data
    if size:
        with pytest.raises(CorruptRecordError, match="decompresses to more than"):
            codecs.decompress(codec, packed, size - 1)


def test_xerial_blocks_count_against_one_limit():
    """Each block within the limit, all of them together past it: refused."""
    block = _snappy_raw(bytes(1000))
    stream = XERIAL_HEADER + (struct.pack(">i", len(block)) + block) * 5
    assert codecs.decompress(codecs.SNAPPY, stream, 5000) == bytes(5000)
    with pytest.raises(CorruptRecordError, match="decompresses to more than 4999"):
        codecs.decompress(codecs.SNAPPY, stream, 4999)


@pytest.mark.parametrize(
    ("stream", "problem"),
    [
        (XERIAL_HEADER[:8], "header truncated"),
        (XERIAL_HEADER[:15], "header truncated"),
        (XERIAL_HEADER + b"\x00\x00", "block length truncated"),
        (XERIAL_HEADER + struct.pack(">i", 10) + b"\x00" * 9, "runs past the end"),
        (XERIAL_HEADER + struct.pack(">i", 2**31 - 1) + b"\x05", "runs past the end"),
        (XERIAL_HEADER + struct.pack(">i", -1) + b"\x05", "runs past the end"),
        (XERIAL_HEADER + struct.pack(">i", -(2**31)), "runs past the end"),
        (XERIAL_HEADER + struct.pack(">i", 0), "bad snappy length preamble"),
        (XERIAL_HEADER + struct.pack(">i", 1) + b"\x80", "bad snappy length preamble"),
        (XERIAL_HEADER + struct.pack(">i", 6) + b"\xff" * 6, "bad snappy length preamble"),
        (XERIAL_HEADER + struct.pack(">i", 2) + b"\x05a", "cannot decompress"),
    ],
    ids=[
        "magic-only",
        "header-15-bytes",
        "block-length-2-bytes",
        "block-1-byte-short",
        "block-length-huge",
        "block-length-minus-1",
        "block-length-int-min",
        "empty-block",
        "preamble-unterminated",
        "preamble-too-long",
        "block-shorter-than-preamble-says",
    ],
)
def test_malformed_xerial_streams_are_corrupt(stream: bytes, problem: str):
    with pytest.raises(CorruptRecordError, match=problem):
        codecs.decompress(codecs.SNAPPY, stream)


def test_a_xerial_header_without_blocks_is_empty():
    assert codecs.decompress(codecs.SNAPPY, XERIAL_HEADER) == b""


@pytest.mark.parametrize("codec", [5, 6, 7, -1, 99])
def test_unknown_codecs(codec: int):
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec {codec}"):
        codecs.decompress(codec, b"whatever")
    with pytest.raises(ValueError, match=f"unknown compression codec {codec}"):
        codecs.compress(codec, b"whatever")


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage=st.binary(max_size=300), limit=st.integers(0, 1 << 16))
def test_garbage_is_corrupt_never_another_error(codec: int, garbage: bytes, limit: int):
    try:
        out = codecs.decompress(codec, garbage, limit)
    except CorruptRecordError:
        return
    assert isinstance(out, bytes) and len(out) <= limit


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300), draw=st.data())
def test_damaged_streams_are_corrupt_never_another_error(codec: int, data: bytes, draw):
    """Valid streams with a byte changed or a tail cut: the framing's prefixes are where
    a hand-rolled reader (the xerial stream, the snappy preamble) could slip."""
    packed = bytearray(codecs.compress(codec, data))
    if draw.draw(st.booleans(), label="flip"):
        pos = draw.draw(st.integers(0, len(packed) - 1), label="pos")
        packed[pos] = draw.draw(st.integers(0, 255), label="byte")
    else:
        del packed[draw.draw(st.integers(0, len(packed)), label="cut") :]
    prefix = draw.draw(st.sampled_from([b"", XERIAL_HEADER]), label="prefix")
    try:
        out = codecs.decompress(codec, prefix + bytes(packed), 4096)
    except CorruptRecordError:
        return
    assert isinstance(out, bytes) and len(out) <= 4096


@pytest.mark.parametrize("name", list(codecs.BY_NAME))
def test_the_cli_offers_every_codec(name: str):
    from rillet.client.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["produce", "t", "--compression", name]).compression == name
    perf = ["perf", "produce", "--topic", "t", "--num-records", "1", "--compression", name]
    assert parser.parse_args(perf).compression == name


def _gzip_members(*parts: bytes) -> bytes:
    return b"".join(codecs.compress(codecs.GZIP, p) for p in parts)


def _zstd_frames(*parts: bytes) -> bytes:
    import zstandard

    sized, unsized = zstandard.ZstdCompressor(), _zstd_unsized
    return b"".join((sized.compress(p) if i % 2 else unsized(p)) for i, p in enumerate(parts))


@pytest.mark.parametrize(
    ("codec", "pack"),
    [(codecs.GZIP, _gzip_members), (codecs.ZSTD, _zstd_frames)],
    ids=["gzip", "zstd"],
)
def test_concatenated_members_and_frames_read_as_one_section(codec: int, pack):
    """Java's GZIPInputStream reads every member of a gzip stream and zstd-jni every frame
    of a zstd one, and kafka-python does the same (it is the oracle here): a section
    written in parts is the parts' concatenation, bounded as a whole."""
    with warnings.catch_warnings():  # kafka-python loads its schemas a deprecated way
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.codec import gzip_decode, zstd_decode

    parts = [_data(5000, 1), b"", _data(70_000, 2), b"tail"]
    packed = pack(*parts)
    whole = b"".join(parts)
    assert (gzip_decode if codec == codecs.GZIP else zstd_decode)(packed) == whole
    assert codecs.decompress(codec, packed) == whole
    assert codecs.decompress(codec, packed, len(whole)) == whole
    with pytest.raises(CorruptRecordError, match="decompresses to more than"):
        codecs.decompress(codec, packed, len(whole) - 1)
    # Bytes after the last member or frame that are not another one: corrupt.
    with pytest.raises(CorruptRecordError):
        codecs.decompress(codec, packed + b"junkjunk")


def _xerial_block_ends(stream: bytes) -> set[int]:
    ends, pos = set(), 16
    while pos < len(stream):
        pos += 4 + struct.unpack_from(">i", stream, pos)[0]
        ends.add(pos)
    return ends


@pytest.mark.parametrize(
    ("codec", "pack"),
    [
        *((c, lambda d, c=c: [codecs.compress(c, d)]) for c in CODECS),
        (codecs.LZ4, lambda d: [_lz4_sized(d)]),
        (codecs.ZSTD, lambda d: [_zstd_unsized(d)]),
        (codecs.SNAPPY, lambda d: [_snappy_raw(d)]),
        (codecs.GZIP, lambda d: [_gzip_members(d[:1000]), _gzip_members(d[1000:])]),
        (
            codecs.ZSTD,
            lambda d: [_zstd_frames(d[:1000]), _zstd_frames(b""), _zstd_frames(b"", d[1000:])[9:]],
        ),
    ],
    ids=[*IDS, "lz4-sized", "zstd-unsized", "snappy-raw", "gzip-2-members", "zstd-2-frames"],
)
def test_every_truncation_is_corrupt_in_every_form(codec: int, pack):
    """Cut short anywhere, a section never decodes to something else silently, but where
    the cut leaves a whole stream of fewer parts: between gzip members, zstd frames or
    xerial blocks (the records count then tells the batch is short)."""
    data = _data(3000, 11)
    parts = pack(data)
    packed = b"".join(parts)
    whole = {sum(len(p) for p in parts[:i]) for i in range(1, len(parts))}
    if codec == codecs.SNAPPY and packed.startswith(XERIAL_HEADER):
        whole |= _xerial_block_ends(packed) | {16}
    assert codecs.decompress(codec, packed) == data
    for cut in range(len(packed)):
        try:
            out = codecs.decompress(codec, packed[:cut])
        except CorruptRecordError:
            continue
        assert cut in whole and data.startswith(out), cut


def test_skippable_zstd_frames_are_skipped():
    import zstandard

    skip = struct.pack("<II", 0x184D2A53, 3) + b"abc"
    frame = zstandard.ZstdCompressor().compress(b"hello")
    for section in (skip + frame, frame + skip, skip + frame + skip + frame):
        assert codecs.decompress(codecs.ZSTD, section) == b"hello" * section.count(frame)
    for section in (skip, skip[:-1] + frame, frame + skip[:-1]):
        with pytest.raises(CorruptRecordError):
            codecs.decompress(codecs.ZSTD, section)


def test_lz4_reads_every_frame_and_refuses_bytes_after_the_last() -> None:
    """As gzip members and zstd frames: a second lz4 frame is read, not dropped, and
    trailing bytes that start no frame make the section corrupt, not ignored."""
    one = codecs.compress(codecs.LZ4, b"a" * 100)
    two = codecs.compress(codecs.LZ4, b"b" * 50)
    assert codecs.decompress(codecs.LZ4, one + two) == b"a" * 100 + b"b" * 50
    with pytest.raises(CorruptRecordError):
        codecs.decompress(codecs.LZ4, one + b"garbage!")
    with pytest.raises(CorruptRecordError, match="more than"):
        codecs.decompress(codecs.LZ4, one + two, limit=120)
