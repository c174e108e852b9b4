"""Kafka's batch compression codecs: gzip, snappy, lz4 and zstd.

A batch's attribute bits 0-2 name the codec that compressed its whole records section
(Kafka's numbers: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd). Each is written as Kafka's
Java client writes it, so any Kafka consumer reads our batches, and read in every form
Kafka clients write, so we read theirs:

- gzip: one gzip member (RFC 1952), default level; every member of a stream of several
  is read, as Java's ``GZIPInputStream`` reads them.
- snappy: the block stream of snappy-java (``SnappyOutputStream``, which Kafka uses): an
  8-byte magic ``\\x82SNAPPY\\x00``, two int32s (version 1, minimum version 1), then blocks
  of up to 32 KiB of input, each an int32 length and a raw snappy block. librdkafka and
  others may write one raw snappy block instead; a section without the magic is read as
  that.
- lz4: the LZ4 frame format (never the pre-0.10 broken header checksum), with
  independent 64 KiB blocks, no block or content checksum and no content size, as
  Kafka's ``KafkaLZ4BlockOutputStream`` writes it.
- zstd: one zstd frame, level 3 (Kafka's default); every frame of a section of several
  (skippable ones skipped) is read, as zstd-jni reads them.

A batch is at most ``max.message.bytes`` compressed, but a codec can expand a few KB
into gigabytes, and every leader decompresses what producers send. So ``decompress``
bounds the expansion before it allocates: a section that claims, or turns out to hold,
more than ``limit`` bytes is refused with CorruptRecordError, as is one that does not
decompress at all, stops short, or has bytes after its last member or frame.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable

from rillet.client.wire.errors import CorruptRecordError

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4
BY_NAME = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
NAMES = {v: k for k, v in BY_NAME.items()}

MAX_DECOMPRESSED_BYTES = 256 << 20

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


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block size
_I32 = struct.Struct(">i")


def _gzip_compress(data: bytes) -> bytes:
    c = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def _snappy_compress(data: bytes) -> bytes:
    import cramjam

    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    for start in range(0, len(data), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK]))
        parts.append(_I32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _lz4_compress(data: bytes) -> bytes:
    import lz4.frame

    return lz4.frame.compress(
        data,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        store_size=False,
    )


def _zstd_compress(data: bytes) -> bytes:
    return _zstd_compressor().compress(data)


COMPRESSORS: dict[int, Callable[[bytes], bytes]] = {
    GZIP: _gzip_compress,
    SNAPPY: _snappy_compress,
    LZ4: _lz4_compress,
    ZSTD: _zstd_compress,
}


def compress(codec: int, data: bytes) -> bytes:
    try:
        return COMPRESSORS[codec](data)
    except KeyError:
        raise ValueError(f"unknown compression codec {codec}") from None


# --- decompression -----------------------------------------------------------------


class _TooBig(Exception):
    pass


def _gzip_decompress(data: bytes | memoryview, limit: int) -> bytes:
    # Every member, as Java's GZIPInputStream reads them: a section may be several.
    parts = []
    total = 0
    rest: bytes | memoryview = data
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = d.decompress(rest, limit + 1 - total)
        total += len(out)
        if total > limit:
            raise _TooBig
        if not d.eof:
            raise CorruptRecordError("cannot decompress records: gzip stream is truncated")
        parts.append(out)
        rest = d.unused_data
        if not rest:
            return b"".join(parts)


def _uvarint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    u = shift = 0
    for i in range(5):
        if pos + i >= len(data):
            break
        b = data[pos + i]
        u |= (b & 0x7F) << shift
        if b < 0x80:
            return u, pos + i + 1
        shift += 7
    raise CorruptRecordError("cannot decompress records: bad snappy length preamble")


def _snappy_block(block: bytes | memoryview, limit: int) -> bytes:
    import cramjam

    size, _ = _uvarint(block, 0)  # a raw snappy block starts with its decoded length
    if size > limit:
        raise _TooBig
    return bytes(cramjam.snappy.decompress_raw(block))


def _snappy_decompress(data: bytes | memoryview, limit: int) -> bytes:
    view = memoryview(data)
    if bytes(view[:8]) != _XERIAL_MAGIC:
        return _snappy_block(view, limit)
    if len(view) < 16:
        raise CorruptRecordError("cannot decompress records: snappy stream header truncated")
    parts = []
    total = 0
    pos = 16
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptRecordError("cannot decompress records: snappy block length truncated")
        (n,) = _I32.unpack_from(view, pos)
        pos += 4
        if n < 0 or n > len(view) - pos:
            raise CorruptRecordError("cannot decompress records: snappy block runs past the end")
        block = _snappy_block(view[pos : pos + n], limit - total)
        total += len(block)
        parts.append(block)
        pos += n
    return b"".join(parts)


def _lz4_decompress(data: bytes | memoryview, limit: int) -> bytes:
    import lz4.frame

    # Every frame is read, under one limit, as for gzip members and zstd frames: bytes
    # after a frame are a further frame or a corrupt section, never ignored.
    parts = []
    total = 0
    rest: bytes | memoryview = data
    while True:
        d = lz4.frame.LZ4FrameDecompressor()
        out = d.decompress(rest, max_length=limit - total + 1)
        total += len(out)
        if total > limit or (not d.eof and not d.needs_input):
            raise _TooBig
        if not d.eof:
            raise CorruptRecordError("cannot decompress records: lz4 frame is truncated")
        parts.append(out)
        rest = d.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE = 0x184D2A50  # the low 4 bits are free


def _zstd_frame_count(data: bytes | memoryview) -> int:
    """How many frames (skippable ones too) ``data`` holds, having checked that they fill
    it exactly and that one at least holds data.

    A bounded stream read stops quietly where the input does, so a frame cut short would
    read as less data; walking the block headers (no decompression) finds the cut, and
    any bytes after the last frame that are not another one.
    """
    import zstandard

    view = memoryview(data)
    n = len(view)
    pos = frames = skippable = 0
    while pos < n:
        if n - pos < 8:
            raise CorruptRecordError("cannot decompress records: zstd frame is truncated")
        magic = int.from_bytes(view[pos : pos + 4], "little")
        if magic & ~0xF == _ZSTD_SKIPPABLE:
            pos += 8 + int.from_bytes(view[pos + 4 : pos + 8], "little")
            skippable += 1
            continue
        if magic != _ZSTD_MAGIC:
            raise CorruptRecordError("cannot decompress records: bytes after the zstd frames")
        has_checksum = view[pos + 4] & 0x04
        pos += zstandard.frame_header_size(view[pos:])
        last = False
        while not last:
            if n - pos < 3:
                raise CorruptRecordError("cannot decompress records: zstd frame is truncated")
            block = int.from_bytes(view[pos : pos + 3], "little")
            last = bool(block & 1)
            kind = (block >> 1) & 3  # raw, RLE (one byte), compressed, reserved
            if kind == 3:
                raise CorruptRecordError("cannot decompress records: reserved zstd block type")
            pos += 3 + (1 if kind == 1 else block >> 3)
        pos += 4 if has_checksum else 0
        frames += 1
    if pos > n or not frames:
        raise CorruptRecordError("cannot decompress records: zstd frame is truncated")
    return frames + skippable


def _zstd_decompress(data: bytes | memoryview, limit: int) -> bytes:
    import zstandard

    # Every frame, as zstd-jni (Kafka's Java client) reads them. A declared content size
    # is allocated up front, so it is checked first; a lone frame that declares one is
    # decompressed in one call, anything else read through a bounded stream.
    frames = _zstd_frame_count(data)
    size = zstandard.frame_content_size(data)
    if size > limit:
        raise _TooBig
    if size >= 0 and frames == 1:
        return _zstd_decompressor().decompress(data)
    with _zstd_decompressor().stream_reader(data, read_across_frames=True) as reader:
        out = reader.read(limit + 1)
    if len(out) > limit:
        raise _TooBig
    return out


_DECOMPRESSORS: dict[int, Callable[[bytes | memoryview, int], bytes]] = {
    GZIP: _gzip_decompress,
    SNAPPY: _snappy_decompress,
    LZ4: _lz4_decompress,
    ZSTD: _zstd_decompress,
}


def decompress(codec: int, data: bytes | memoryview, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """The records section compressed with ``codec``, at most ``limit`` bytes of it."""
    fn = _DECOMPRESSORS.get(codec)
    if fn is None:
        raise CorruptRecordError(f"unknown compression codec {codec}")
    try:
        return fn(data, limit)
    except _TooBig:
        raise CorruptRecordError(
            f"records section decompresses to more than {limit} bytes"
        ) from None
    except CorruptRecordError:
        raise
    except Exception as e:  # a codec error is a corrupt batch, not a crash
        raise CorruptRecordError(f"cannot decompress records: {e}") from e
