"""Frames on the wire: ``uint32 size | uint32 header_size | msgpack header | payload``.

``size`` counts every byte after itself (so a frame is ``4 + size`` bytes long) and
``header_size`` counts the msgpack header alone; the payload is whatever follows it.
The payload carries record batches and is never msgpack-decoded here.

Copies are the cost on this path (docs/design.md, "Where the time goes"), so:

- ``encode_frame`` returns the frame as a list of parts (prefix and header packed
  together, then the caller's payload parts untouched) for ``transport.writelines``.
- ``FrameDecoder.feed`` hands back payloads as memoryviews. A frame that arrives whole
  inside one chunk is a view into that chunk (no copy); a frame split across chunks is
  gathered once into a buffer that grows as its bytes arrive (geometrically, so the
  copy stays one per byte plus amortised growth). Its prefix only announces a size: a
  peer that sends four bytes announcing 100 MiB and then nothing costs four bytes, not
  an allocation of the announced size (docs/protocol.md, "Limits at the edge").
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from rillet.client.wire.errors import InvalidRequestError

PREFIX = struct.Struct(">II")  # size, header_size
PREFIX_SIZE = PREFIX.size  # 8
SIZE_FIELD = 4  # bytes of the size field, which `size` does not count
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes

Buffer = bytes | bytearray | memoryview
Payload = Buffer | Sequence[Buffer]
Frame = tuple[dict[str, Any], memoryview]

_unpack_prefix = PREFIX.unpack_from
_pack_prefix = PREFIX.pack
_packb = msgpack.packb
_unpackb = msgpack.unpackb
_EMPTY = memoryview(b"")


class FrameError(InvalidRequestError):
    """The peer sent bytes that are not a well-formed frame (the peer's fault).

    ``reason`` is one of the class constants below, so callers and tests can tell the
    cases apart without parsing messages.
    """

    TOO_LARGE = "too_large"
    TOO_SMALL = "too_small"
    HEADER_SIZE = "header_size"
    BAD_HEADER = "bad_header"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _nbytes(part: Buffer) -> int:
    return part.nbytes if type(part) is memoryview else len(part)


def encode_header(header: Mapping[str, Any]) -> bytes:
    """Pack a header map; raise TypeError (the caller's mistake) on unpackable values."""
    return _packb(header, use_bin_type=True)


def encode_frame(header: Mapping[str, Any], payload: Payload = b"") -> list[Buffer]:
    """A frame as parts ready for ``writelines``; payload parts are not copied."""
    packed = _packb(header, use_bin_type=True)
    if isinstance(payload, bytes | bytearray | memoryview):
        size = _nbytes(payload)
        parts: list[Buffer] = [payload] if size else []
    else:
        parts = [p for p in payload if _nbytes(p)]
        size = sum(_nbytes(p) for p in parts)
    size += SIZE_FIELD + len(packed)
    return [_pack_prefix(size, len(packed)) + packed, *parts]


def encode_frame_bytes(header: Mapping[str, Any], payload: Payload = b"") -> bytes:
    """The frame as one bytes object (tests, small control messages)."""
    return b"".join(encode_frame(header, payload))


def decode_header(buf: Buffer) -> dict[str, Any]:
    """Unpack a frame header; it must be exactly one msgpack map."""
    try:
        header = _unpackb(buf, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types (ExtraData, ValueError, ...)
        raise FrameError(FrameError.BAD_HEADER, f"header is not msgpack: {e!r}") from None
    if type(header) is not dict:
        raise FrameError(FrameError.BAD_HEADER, f"header is a {type(header).__name__}, not a map")
    return header


class FrameDecoder:
    """Incremental decoder: ``feed(chunk)`` returns every frame the chunk completes.

    After a FrameError the stream cannot be trusted (or not delimited at all), so the
    decoder refuses further input; the owner closes the connection.
    """

    __slots__ = ("max_frame_bytes", "header_sizes", "_pending", "_total", "_small", "_failed")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        # A split frame being gathered: only the bytes received so far (bytearray grows
        # its capacity by an eighth each time it fills, so appends are amortised O(1)).
        self._pending: bytearray | None = None
        self._total = 0  # the split frame's whole length, size field included
        self._small = b""  # fewer than 4 bytes: not even the size field yet
        self._failed = False
        # The header size of each frame the last feed() returned: a server weighs how much
        # Python work a request may start by it (the payload is handled in C).
        self.header_sizes: list[int] = []

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as frames."""
        pending = self._pending
        return (0 if pending is None else len(pending)) + len(self._small)

    @property
    def pending_frame_bytes(self) -> int:
        """The announced length (size field included) of the frame being gathered, 0 if
        none is: what a server reserves from its node-wide budget for partial requests."""
        return self._total if self._pending is not None else 0

    def feed(self, data: Buffer) -> list[Frame]:
        if self._failed:
            raise FrameError(FrameError.BAD_HEADER, "decoder already failed on this stream")
        try:
            return self._feed(data)
        except FrameError:
            self._failed = True
            raise

    def _feed(self, data: Buffer) -> list[Frame]:
        frames: list[Frame] = []
        self.header_sizes = []
        view = memoryview(data)
        if self._small:
            view = self._complete_size_field(view)
        if self._pending is not None and view:
            view = self._fill(view, frames)
        self._split(view, frames)
        return frames

    def _complete_size_field(self, view: memoryview) -> memoryview:
        """Finish a size field split across chunks (copying only those few bytes)."""
        need = SIZE_FIELD - len(self._small)
        if len(view) < need:
            self._small += bytes(view)
            return view[len(view) :]
        head = self._small + bytes(view[:need])
        self._small = b""
        self._start_pending(head, self._checked_size(head, 0))
        return view[need:]

    def _checked_size(self, buf: Buffer, pos: int) -> int:
        size = int.from_bytes(buf[pos : pos + SIZE_FIELD], "big")
        if size > self.max_frame_bytes:
            raise FrameError(
                FrameError.TOO_LARGE, f"frame of {size} bytes exceeds limit {self.max_frame_bytes}"
            )
        if size < SIZE_FIELD:
            raise FrameError(FrameError.TOO_SMALL, f"frame size {size} < {SIZE_FIELD}")
        return size

    def _start_pending(self, head: Buffer, size: int) -> None:
        # Only what arrived: the size is the peer's claim, not bytes it has sent.
        self._pending, self._total = bytearray(head), SIZE_FIELD + size

    def _fill(self, view: memoryview, frames: list[Frame]) -> memoryview:
        """Append the next bytes to the split frame; emit it once complete."""
        pending = self._pending
        assert pending is not None
        take = min(self._total - len(pending), len(view))
        pending += view[:take]
        if len(pending) == self._total:
            self._pending, self._total = None, 0
            frames.append(self._decode(memoryview(pending), 0))
        return view[take:]

    def _split(self, view: memoryview, frames: list[Frame]) -> None:
        """Emit whole frames found in ``view`` as views into it; keep the tail."""
        pos, end = 0, len(view)
        while end - pos >= SIZE_FIELD:
            size = self._checked_size(view, pos)
            if pos + SIZE_FIELD + size > end:
                self._start_pending(view[pos:], size)
                return
            frames.append(self._decode(view, pos))
            pos += SIZE_FIELD + size
        if pos < end:
            self._small = bytes(view[pos:])

    def _decode(self, view: memoryview, pos: int) -> Frame:
        size, header_size = _unpack_prefix(view, pos)  # size >= SIZE_FIELD: checked already
        if header_size > size - SIZE_FIELD:
            raise FrameError(
                FrameError.HEADER_SIZE,
                f"header_size {header_size} exceeds frame size {size} - {SIZE_FIELD}",
            )
        start = pos + PREFIX_SIZE
        header = decode_header(view[start : start + header_size])
        self.header_sizes.append(header_size)
        payload_start = start + header_size
        payload_end = pos + SIZE_FIELD + size
        payload = view[payload_start:payload_end] if payload_end > payload_start else _EMPTY
        return header, payload
