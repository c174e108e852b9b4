"""The frame codec: round trips, any chunking of the stream, and malformed frames."""

from __future__ import annotations

import struct
import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rillet.client.wire.errors import InvalidRequestError
from rillet.client.wire.framing import (
    PREFIX,
    FrameDecoder,
    FrameError,
    encode_frame,
    encode_frame_bytes,
)


def decode_all(stream: bytes, chunk: int = 1 << 20, max_frame: int = 1 << 20) -> list:
    decoder = FrameDecoder(max_frame)
    frames = []
    for pos in range(0, len(stream), chunk):
        frames += decoder.feed(stream[pos : pos + chunk])
    assert decoder.buffered_bytes == 0
    return [(h, bytes(p)) for h, p in frames]


def test_round_trip_header_and_payload() -> None:
    header = {"api": 0, "correlation_id": 7, "topics": [["t", [[0, 3]]]]}
    assert decode_all(encode_frame_bytes(header, b"abc")) == [(header, b"abc")]


def test_empty_payload() -> None:
    assert decode_all(encode_frame_bytes({"a": 1})) == [({"a": 1}, b"")]


def test_payload_parts_are_not_copied_and_concatenate() -> None:
    first, second = b"x" * 10, memoryview(b"y" * 5)
    parts = encode_frame({"a": 1}, [first, second, b""])
    assert parts[1] is first and parts[2] is second and len(parts) == 3
    size, header_size = PREFIX.unpack_from(parts[0])
    assert size == 4 + header_size + 15
    assert decode_all(b"".join(parts)) == [({"a": 1}, b"x" * 10 + b"y" * 5)]


def test_whole_frame_in_one_chunk_is_a_view_into_that_chunk() -> None:
    chunk = encode_frame_bytes({"a": 1}, b"payload") * 2
    frames = FrameDecoder().feed(chunk)
    assert [p.obj for _, p in frames] == [chunk, chunk]


def test_every_split_point_of_a_stream() -> None:
    frames = [({"i": i, "s": "z" * i}, bytes([i]) * (i * 13)) for i in range(6)]
    stream = b"".join(encode_frame_bytes(h, p) for h, p in frames)
    for cut in range(1, len(stream)):
        decoder = FrameDecoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert [(h, bytes(p)) for h, p in got] == frames, cut


VALUES = st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary()


@settings(max_examples=60, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.dictionaries(st.text(max_size=5), VALUES),
            st.binary(max_size=300),
        ),
        max_size=8,
    ),
    chunk=st.integers(1, 64),
)
def test_any_chunking_round_trips(frames: list, chunk: int) -> None:
    stream = b"".join(encode_frame_bytes(h, p) for h, p in frames)
    assert decode_all(stream, chunk) == frames


def frame_bytes(size: int, header_size: int, body: bytes) -> bytes:
    return struct.pack(">II", size, header_size) + body


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (struct.pack(">I", 2_000_000), FrameError.TOO_LARGE),  # rejected before the body
        (struct.pack(">I", 3) + b"abc", FrameError.TOO_SMALL),
        (frame_bytes(4 + 10, 11, b"\x80" * 10), FrameError.HEADER_SIZE),
        (frame_bytes(4 + 1, 1, b"\xc1"), FrameError.BAD_HEADER),  # 0xc1: never used
        (frame_bytes(4 + 2, 2, b"\x91\x01"), FrameError.BAD_HEADER),  # an array
        (frame_bytes(4 + 2, 2, b"\x80\x80"), FrameError.BAD_HEADER),  # two maps
        (frame_bytes(4 + 1, 1, b"\x81"), FrameError.BAD_HEADER),  # a truncated map
    ],
    ids=["too-large", "too-small", "header-size", "not-msgpack", "not-map", "extra", "cut"],
)
def test_malformed_frames_are_reported_precisely(stream: bytes, reason: str) -> None:
    decoder = FrameDecoder(max_frame_bytes=1_000_000)
    with pytest.raises(FrameError) as info:
        for i in range(len(stream)):  # byte by byte: the check must not depend on chunking
            decoder.feed(stream[i : i + 1])
    assert info.value.reason == reason
    assert isinstance(info.value, InvalidRequestError)
    with pytest.raises(FrameError):  # a failed stream stays failed
        decoder.feed(encode_frame_bytes({"a": 1}))


def test_frames_before_a_bad_one_in_earlier_feeds_are_delivered() -> None:
    decoder = FrameDecoder()
    good = decoder.feed(encode_frame_bytes({"ok": True}, b"p"))
    assert [h for h, _ in good] == [{"ok": True}]
    with pytest.raises(FrameError):
        decoder.feed(frame_bytes(5, 1, b"\xc1"))


def test_header_keys_may_be_ints_in_nested_maps() -> None:
    header = {"a": {1: [1, 2]}}
    assert decode_all(encode_frame_bytes(header)) == [(header, b"")]


def test_an_announced_size_allocates_nothing_until_its_bytes_arrive() -> None:
    # Four bytes announcing 100 MiB used to allocate (and zero) 100 MiB at once.
    decoder = FrameDecoder(100 << 20)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        decoder.feed(struct.pack(">I", 100 << 20))
        decoder.feed(struct.pack(">I", 10) + b"x" * 1000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert decoder.buffered_bytes == 1008 and decoder.pending_frame_bytes == 4 + (100 << 20)
    assert grown < 64 * 1024  # what arrived, and bookkeeping; not the announced size


def test_large_split_frame_is_gathered_once() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    stream = encode_frame_bytes({"big": 1}, payload)
    decoder = FrameDecoder(2 << 20)
    got = []
    for pos in range(0, len(stream), 65536):
        got += decoder.feed(stream[pos : pos + 65536])
    ((header, view),) = got
    assert header == {"big": 1} and view == payload
    assert isinstance(view.obj, bytearray) and len(view.obj) == len(stream)


def test_unpackable_header_is_the_callers_type_error() -> None:
    with pytest.raises(TypeError):
        encode_frame({"a": object()})
    assert msgpack.unpackb(encode_frame({"b": b"\x00"})[0][8:]) == {"b": b"\x00"}
