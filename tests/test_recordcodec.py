"""Kafka's v2 records: the C codec (``rillet.client._recordcodec``) and its pure-Python
twin (``client/wire/recordcodec.py``) keep one contract, byte for byte and item for item.

Each test runs against both; the native one is skipped only where it was not built, and
`test_native_extension_is_built_where_a_compiler_exists` makes a silently failed build
(the extension is optional) fail instead of quietly running slower. The property tests
compare the two directly: what both build, what both decode, and how both refuse a
damaged section (the same exception type, or the same result).
"""

from __future__ import annotations

import array
import gc
import shutil
import sysconfig
import zlib
from types import ModuleType
from typing import Any, NamedTuple

import crc32c
import pytest
from helpers import bytes_field as field
from helpers import zigzag as zz
from hypothesis import given, settings
from hypothesis import strategies as st

from rillet.client.consumer import ConsumerRecord
from rillet.client.wire import recordcodec as twin

try:
    from rillet.client import _recordcodec as native
except ImportError:  # built without a C compiler
    native = None  # type: ignore[assignment]

IMPLS = ["native", "python"]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
HEADER = twin.HEADER_SIZE


def impl(name: str) -> ModuleType:
    if name == "python":
        return twin
    if native is None:
        pytest.skip("the C extension was not built here")
    return native


def both() -> tuple[ModuleType, ModuleType]:
    if native is None:
        pytest.skip("the C extension was not built here")
    return native, twin


def test_native_extension_is_built_where_a_compiler_exists() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the pure-Python twin runs")
    assert native is not None, "pip install ran with a C compiler but built no _recordcodec"


# -- helpers ----------------------------------------------------------------------------


def build(m: ModuleType, values: list, **kw: Any) -> bytes:
    """build_batch with the producer's defaults for what a test does not name."""
    a = {
        "keys": None,
        "headers": None,
        "timestamps": None,
        "timestamp_ms": 1000,
        "offset_deltas": None,
        "attributes": 0,
        "base_offset": 0,
        "leader_epoch": -1,
        "producer_id": -1,
        "producer_epoch": -1,
        "base_sequence": -1,
        "compress": None,
    }
    a.update(kw)
    return m.build_batch(values, *a.values())


def record(
    body: bytes | None = None,
    *,
    td: int = 0,
    od: int = 0,
    key: bytes | None = None,
    value: bytes | None = b"v",
    headers: bytes = b"\x00",
) -> bytes:
    """One record, its length varint first; `body` replaces the fields when given."""
    if body is None:
        body = b"\x00" + zz(td) + zz(od) + field(key) + field(value) + headers
    return zz(len(body)) + body


def outcome(f: Any, *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", f(*args))
    except (ValueError, TypeError, OverflowError) as e:
        return ("error", type(e))


class Rec(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list | None


def decoders(m: ModuleType, section: Any, count: int, base_offset: int, base_ts: int) -> dict:
    """Every decoder's outcome on one section (check_records both ways)."""
    return {
        "columns": outcome(m.decode_columns, section, count, base_offset, base_ts, None),
        "columns_append": outcome(m.decode_columns, section, count, base_offset, base_ts, 77),
        "records": outcome(
            m.decode_records, section, count, base_offset, base_ts, None, Rec, "t", 3, 0
        ),
        "arrow": outcome(m.decode_arrow, section, count, base_offset, base_ts, None, 0, 2**62),
        "check": outcome(m.check_records, section, count, base_ts, True),
        "check_gaps": outcome(m.check_records, section, count, base_ts, False),
    }


# -- building ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", IMPLS)
def test_build_matches_the_layout_and_crc(name: str) -> None:
    m = impl(name)
    data = build(m, [b"ab", None], keys=[b"k", None], timestamps=[10, 7], base_offset=5)
    body = record(key=b"k", value=b"ab") + record(td=-3, od=1, key=None, value=None)
    assert data[HEADER:] == body
    assert data[16] == 2  # magic
    assert int.from_bytes(data[17:21], "big") == crc32c.crc32c(data[21:])
    assert int.from_bytes(data[:8], "big") == 5
    assert int.from_bytes(data[8:12], "big") == len(data) - 12
    assert int.from_bytes(data[27:35], "big") == 10  # base timestamp: the first record's
    assert int.from_bytes(data[35:43], "big") == 10  # max timestamp
    assert int.from_bytes(data[57:61], "big") == 2


@pytest.mark.parametrize("name", IMPLS)
def test_build_compresses_the_records_section(name: str) -> None:
    m = impl(name)
    seen: list[bytes] = []

    def compress(section: bytes) -> bytearray:  # bytes-like is enough
        seen.append(section)
        return bytearray(zlib.compress(section))

    data = build(m, [b"x" * 100] * 3, attributes=1, compress=compress)
    plain = build(m, [b"x" * 100] * 3)
    assert seen == [plain[HEADER:]]
    assert data[HEADER:] == zlib.compress(seen[0])
    assert int.from_bytes(data[21:23], "big") == 1
    with pytest.raises(ValueError):
        build(m, [b"x"], attributes=1)  # a codec named but no compress function


@pytest.mark.parametrize("name", IMPLS)
def test_build_accepts_bytes_like_fields(name: str) -> None:
    m = impl(name)
    mv = memoryview(b"0123456789")
    data = build(
        m,
        [bytearray(b"ab"), mv[2:5], mv[::2]],
        keys=[mv[:0], None, b"k"],
        headers=[None, [["h", bytearray(b"1")]], (("é", mv[1:2]),)],
    )
    assert data == build(
        twin,
        [b"ab", b"234", b"02468"],
        keys=[b"", None, b"k"],
        headers=[None, [("h", b"1")], [("é", b"1")]],
    )


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize(
    ("values", "kw"),
    [
        (["s"], {}),
        ([b"v"], {"keys": ["k"]}),
        ([1], {}),
        ([b"v"], {"headers": [[(b"k", b"v")]]}),
        ([b"v"], {"headers": [[("k", "v")]]}),
        ([b"v"], {"headers": [[("k", b"v", b"x")]]}),
        ([b"v"], {"headers": [["kv"]]}),
        ([b"v"], {"headers": [[None]]}),
        ([b"v"], {"headers": [iter([("k", b"v")])]}),  # no len(): not a sequence
    ],
)
def test_build_refuses_fields_of_the_wrong_type(name: str, values: list, kw: dict) -> None:
    with pytest.raises(TypeError):
        build(impl(name), values, **kw)


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize(
    ("values", "kw"),
    [
        ([], {}),
        ([b"a", b"b"], {"keys": [None]}),
        ([b"a"], {"headers": [None, None]}),
        ([b"a", b"b"], {"timestamps": [1]}),
        ([b"a", b"b"], {"offset_deltas": [0]}),
        ([b"a", b"b"], {"offset_deltas": [1, 1]}),
        ([b"a"], {"offset_deltas": [-1]}),
        ([b"a", b"b"], {"offset_deltas": [0, 2**31]}),
        ([b"a", b"b"], {"offset_deltas": [0, 2**70]}),
        ([b"a", b"b"], {"timestamps": [INT64_MIN, 1]}),
        ([b"a", b"b"], {"timestamps": [0, 2**63]}),
        ([b"a", b"b"], {"timestamps": [2**63, 2**63]}),
        ([b"a"], {"timestamp_ms": 2**63}),
        ([b"a"], {"base_offset": 2**63}),
        ([b"a"], {"leader_epoch": 2**31}),
        ([b"a"], {"attributes": 2**15}),
        ([b"a"], {"producer_id": INT64_MIN - 1}),
        ([b"a"], {"producer_epoch": 2**15}),
        ([b"a"], {"base_sequence": -(2**31) - 1}),
        ([b"a"], {"headers": [[("\udc80", b"")]]}),  # a lone surrogate: no UTF-8 for it
    ],
)
def test_build_refuses_what_does_not_fit(name: str, values: list, kw: dict) -> None:
    with pytest.raises(ValueError):
        build(impl(name), values, **kw)


def test_build_checks_fields_in_the_twins_order() -> None:
    """An earlier record's problem wins over a later one's, whatever its kind."""
    for m in both():
        with pytest.raises(ValueError):
            build(m, [b"a", "s"], offset_deltas=[0, 2**40])  # a record's delta, then its value
        with pytest.raises(TypeError):
            build(m, ["s", b"a"], offset_deltas=[0, 2**40])
        with pytest.raises(TypeError):
            build(m, ["s", b"a"], timestamps=[2**63, 0])  # the base's range comes last


# -- decoding ---------------------------------------------------------------------------


def section_of(data: bytes) -> bytes:
    return data[HEADER:]


@pytest.mark.parametrize("name", IMPLS)
def test_decode_columns_records_and_arrow(name: str) -> None:
    m = impl(name)
    hs = [("a", b"1"), ("ü", None)]
    values = [b"v0", None, b"", b"v3" * 50] + [b"x"] * 6
    keys = [None, b"k1", b"", None] + [b"k"] * 6
    data = build(
        m,
        values,
        keys=keys,
        headers=[hs, None, [], None] + [None] * 6,
        timestamps=[100, 90, 200, -5] + [1] * 6,
        offset_deltas=[0, 2, 3, 9] + list(range(10, 16)),
        base_offset=1000,
    )
    sec = section_of(data)
    offsets = [1000, 1002, 1003, 1009] + list(range(1010, 1016))
    ts = [100, 90, 200, -5] + [1] * 6
    heads = [hs, None, None, None] + [None] * 6
    assert m.decode_columns(sec, 10, 1000, 100, None) == (offsets, ts, keys, values, heads)
    assert m.decode_columns(sec, 10, 1000, 100, 7) == (offsets, [7] * 10, keys, values, heads)

    recs = m.decode_records(memoryview(data)[HEADER:], 10, 1000, 100, None, Rec, "t", 2, 1003)
    assert all(type(r) is Rec for r in recs)
    assert recs == [Rec("t", 2, *r) for r in zip(offsets, ts, keys, values, heads, strict=True)][2:]
    assert recs[0].offset == 1003 and hash(recs[0]) == hash(tuple(recs[0]))

    n, o, t, kv, ko, kd, vv, vo, vd, h = m.decode_arrow(
        bytearray(sec), 10, 1000, 100, None, 1002, 1011
    )
    assert n == 4
    assert o == b"".join(x.to_bytes(8, "little") for x in (1002, 1003, 1009, 1010))
    assert t == b"".join(x.to_bytes(8, "little", signed=True) for x in (90, 200, -5, 1))
    assert (kv, kd, vv, vd) == (b"\x0b", b"k1k", b"\x0e", b"v3" * 50 + b"x")
    assert ko == b"".join(x.to_bytes(4, "little") for x in (0, 2, 2, 2, 3))
    assert vo == b"".join(x.to_bytes(4, "little") for x in (0, 0, 0, 100, 101))
    assert h is None  # no kept record has headers
    assert m.decode_arrow(sec, 10, 1000, 100, None, 0, 1001)[9] == [hs]
    assert m.decode_arrow(sec, 10, 1000, 100, None, 2**70, -(2**70))[0] == 0
    assert m.decode_arrow(sec, 10, 1000, 100, None, -(2**70), 2**70)[0] == 10

    assert m.check_records(sec, 10, 100, False) == (200, 15, 0)
    with pytest.raises(ValueError, match="record 1: offset delta 2, expected 1"):
        m.check_records(sec, 10, 100, True)


@pytest.mark.parametrize("name", IMPLS)
def test_decode_records_builds_the_consumers_record_type(name: str) -> None:
    m = impl(name)
    sec = section_of(build(m, [b"a", b"b"], keys=[b"k", None]))
    for cls in (ConsumerRecord, Rec, tuple):
        recs = m.decode_records(sec, 2, 0, 1000, None, cls, "t", 0, 0)
        assert [type(r) for r in recs] == [cls, cls]
        assert recs[1] == ("t", 0, 1, 1000, None, b"b", None)

    class WithDict(tuple):  # instances have a __dict__: the general path builds them
        pass

    recs = m.decode_records(sec, 2, 0, 1000, None, WithDict, "t", 0, 1)
    assert type(recs[0]) is WithDict and recs == [("t", 0, 1, 1000, None, b"b", None)]
    with pytest.raises(TypeError):
        m.decode_records(sec, 2, 0, 1000, None, list, "t", 0, 0)


def test_records_of_atomic_fields_are_left_out_of_the_cyclic_collector() -> None:
    """A record whose fields are all atomic (str, int, bytes, None) can be in no reference
    cycle, so the C codec untracks it. Left tracked, the records a consumer holds (up to
    ``fetch_max_bytes`` of them) survived into the oldest generation and every full
    collection walked them: CPython untracks exact tuples on its own, never a NamedTuple.
    Records with headers hold a list, and stay tracked."""
    m, _ = both()
    sec = section_of(build(m, [b"a", b"b"], headers=[None, [("h", b"v")]]))
    plain, with_headers = m.decode_records(sec, 2, 0, 1000, None, ConsumerRecord, "t", 0, 0)
    assert not gc.is_tracked(plain) and gc.is_tracked(with_headers)

    class WithDict(tuple):  # the general path: an instance may point anywhere
        pass

    recs = m.decode_records(sec, 2, 0, 1000, None, WithDict, "t", 0, 0)
    recs[0].loop = recs
    assert gc.is_tracked(recs[0])


@pytest.mark.parametrize("name", IMPLS)
def test_empty_section_with_no_records(name: str) -> None:
    m = impl(name)
    assert m.decode_columns(b"", 0, 0, 0, None) == ([], [], [], [], [])
    assert m.decode_records(b"", 0, 0, 0, None, Rec, "t", 0, 0) == []
    assert m.decode_arrow(b"", 0, 0, 0, None, 0, 10)[0] == 0
    with pytest.raises(ValueError):
        m.check_records(b"", 0, 0, True)  # a batch needs a record


MALFORMED = {
    "truncated varint": (b"\x80", 1),
    "6-byte int32 varint": (b"\x80\x80\x80\x80\x80\x00", 1),
    "int32 varint past 32 bits": (b"\xff\xff\xff\xff\x1f", 1),
    "11-byte varlong": (record(b"\x00" + b"\x80" * 10 + b"\x00" + b"\x00\x01\x01\x00"), 1),
    "varlong past 64 bits": (record(b"\x00" + b"\xff" * 9 + b"\x02" + b"\x00\x01\x01\x00"), 1),
    "record length past end": (zz(100) + b"\x00" * 10, 1),
    "negative record length": (zz(-2) + b"\x00" * 10, 1),
    "empty record": (zz(0), 1),
    "key length past end": (record(b"\x00\x00\x00" + zz(50) + b"k"), 1),
    "negative key length": (record(b"\x00\x00\x00" + zz(-2) + b"\x01\x00"), 1),
    "negative value length": (record(b"\x00\x00\x00\x01" + zz(-5) + b"\x00"), 1),
    "negative header count": (record(headers=zz(-1)), 1),
    "header count past the record": (record(headers=zz(1000)), 1),
    "null header key": (record(headers=zz(1) + field(None) + field(b"v")), 1),
    "header key not UTF-8": (record(headers=zz(1) + field(b"\xff") + field(b"v")), 1),
    "header key a surrogate": (record(headers=zz(1) + field(b"\xed\xa0\x80") + field(None)), 1),
    "header key overlong": (record(headers=zz(1) + field(b"\xc0\x80") + field(None)), 1),
    "header key cut short": (record(headers=zz(1) + field(b"\xe2\x82") + field(None)), 1),
    "header key past U+10FFFF": (
        record(headers=zz(1) + field(b"\xf4\x90\x80\x80") + field(None)),
        1,
    ),
    "record longer than its fields": (record(b"\x00\x00\x00\x01\x01\x00\x00"), 1),
    "record shorter than its fields": (zz(3) + b"\x00\x00\x00\x01\x01\x00", 1),
    "trailing bytes": (record() + b"\x00", 1),
    "fewer records than counted": (record(), 2),
    "more records than counted": (record() + record(od=1), 1),
    "negative count": (record(), -1),
    "count far past the section": (record(), 2**31 - 1),
}


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_sections_raise_value_error(name: str, case: str) -> None:
    m = impl(name)
    section, count = MALFORMED[case]
    for kind, result in decoders(m, section, count, 0, 0).items():
        assert result == ("error", ValueError), (kind, result)


def test_valid_header_keys_decode() -> None:
    """The strict UTF-8 check lets every well-formed sequence through, edges included."""
    keys = [
        "",
        "a",
        "\x7f",
        "\x80",
        "\u07ff",
        "\u0800",
        "\ud7ff",
        "\ue000",
        "\uffff",
        "\U00010000",
        "\U0010ffff",
        "héllo wörld ✓ 🎉",
    ]
    for m in (twin, native) if native is not None else (twin,):
        sec = section_of(build(m, [b"v"], headers=[[(k, None) for k in keys]]))
        assert m.decode_columns(sec, 1, 0, 0, None)[4] == [[(k, None) for k in keys]]


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize(
    ("base_offset", "base_ts", "sec"),
    [
        (INT64_MAX, 0, record(od=1)),  # offset past int64
        (INT64_MIN, 0, record(od=-1)),
        (0, INT64_MAX, record(td=1)),  # timestamp past int64
        (0, INT64_MIN, record(td=-1)),
        (2**63, 0, record()),  # a base offset no header holds
        (0, 2**63, record()),
    ],
)
def test_offsets_and_timestamps_past_int64(
    name: str, base_offset: int, base_ts: int, sec: bytes
) -> None:
    for kind, result in decoders(impl(name), sec, 1, base_offset, base_ts).items():
        if kind.startswith("check") and base_offset != 0:
            continue  # check_records takes no base offset
        assert result == ("error", ValueError), (kind, result)


@pytest.mark.parametrize("name", IMPLS)
def test_append_time_must_fit_the_arrow_column(name: str) -> None:
    sec = section_of(build(impl(name), [b"a"]))
    with pytest.raises(OverflowError):
        impl(name).decode_arrow(sec, 1, 0, 0, 2**63, 0, 10)
    assert impl(name).decode_columns(sec, 1, 0, 0, 2**63)[1] == [2**63]  # taken as given


# -- the two implementations against each other ----------------------------------------

nullable_bytes = st.one_of(st.none(), st.binary(max_size=24))
header_lists = st.one_of(
    st.none(),
    st.just([]),
    st.lists(st.tuples(st.text(max_size=6), nullable_bytes), min_size=1, max_size=4),
)
int64s = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),
    st.integers(INT64_MAX - 2**32, INT64_MAX),
    st.integers(INT64_MIN, INT64_MIN + 2**32),
    st.integers(-(2**45), 2**45),
)


@st.composite
def batches(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 12))
    values = draw(st.lists(nullable_bytes, min_size=n, max_size=n))
    keys = draw(st.one_of(st.none(), st.lists(nullable_bytes, min_size=n, max_size=n)))
    headers = draw(st.one_of(st.none(), st.lists(header_lists, min_size=n, max_size=n)))
    ts_base = draw(int64s)
    timestamps = draw(
        st.one_of(
            st.none(),
            st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n).map(
                lambda ds: [ts_base + d for d in ds]
            ),
        )
    )
    deltas = draw(
        st.one_of(
            st.none(),
            st.lists(st.integers(1, 2**29), min_size=n, max_size=n).map(
                lambda gaps: [sum(gaps[: i + 1]) - gaps[0] for i in range(n)]
            ),
        )
    )
    return {
        "values": values,
        "keys": keys,
        "headers": headers,
        "timestamps": timestamps,
        "timestamp_ms": ts_base,
        "offset_deltas": deltas,
        "base_offset": draw(int64s),
    }


def build_both(b: dict) -> tuple[tuple[str, Any], tuple[str, Any]]:
    args = (
        b["values"],
        b["keys"],
        b["headers"],
        b["timestamps"],
        b["timestamp_ms"],
        b["offset_deltas"],
        0,
        b["base_offset"],
        7,
        1234,
        5,
        42,
        None,
    )
    assert native is not None
    return outcome(native.build_batch, *args), outcome(twin.build_batch, *args)


@settings(max_examples=300, deadline=None)
@given(batches())
def test_build_and_decode_agree_and_round_trip(b: dict) -> None:
    both()
    built_native, built_python = build_both(b)
    assert built_native == built_python
    if built_python[0] == "error":
        return
    data = built_python[1]
    n = len(b["values"])
    base_ts = int.from_bytes(data[27:35], "big", signed=True)
    sec = section_of(data)
    results = decoders(native, sec, n, b["base_offset"], base_ts)
    assert results == decoders(twin, sec, n, b["base_offset"], base_ts)
    deltas = b["offset_deltas"] or list(range(n))
    offsets = [b["base_offset"] + d for d in deltas]
    ts = b["timestamps"] or [b["timestamp_ms"]] * n
    if max(offsets) > INT64_MAX or min(ts) < INT64_MIN:  # the header fits, a record not
        assert results["columns"] == ("error", ValueError)
        return
    heads = [h or None for h in b["headers"] or [None] * n]
    keys = b["keys"] or [None] * n
    assert results["columns"] == ("ok", (offsets, ts, keys, b["values"], heads))
    assert results["check_gaps"] == (
        "ok",
        (max(ts), deltas[-1], keys.index(None) if None in keys else -1),
    )


@settings(max_examples=150, deadline=None)
@given(batches(), st.integers(-5, 2**31), st.integers(-5, 2**31))
def test_decode_arrow_agrees_for_any_range(b: dict, lo_delta: int, hi_delta: int) -> None:
    both()
    _, built = build_both(b)
    if built[0] == "error":
        return
    n, sec, base = len(b["values"]), section_of(built[1]), b["base_offset"]
    base_ts = int.from_bytes(built[1][27:35], "big", signed=True)
    lo, hi = base + lo_delta, base + hi_delta
    args = (sec, n, base, base_ts, None, lo, hi)
    assert outcome(native.decode_arrow, *args) == outcome(twin.decode_arrow, *args)
    args = (sec, n, base, base_ts, None, Rec, "t", 0, lo)
    assert outcome(native.decode_records, *args) == outcome(twin.decode_records, *args)


@settings(max_examples=300, deadline=None)
@given(batches(), st.data())
def test_damaged_sections_fail_alike(b: dict, data: st.DataObject) -> None:
    """Truncated, flipped or spliced sections: both raise ValueError or both decode the
    same (a flip inside a value is still a valid section)."""
    both()
    _, built = build_both(b)
    if built[0] == "error":
        return
    sec = bytearray(section_of(built[1]))
    n = len(b["values"])
    how = data.draw(st.sampled_from(["truncate", "flip", "splice"]))
    if how == "truncate":
        del sec[data.draw(st.integers(0, len(sec) - 1)) :]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(sec) - 1))
            sec[i] = data.draw(st.integers(0, 255))
    else:
        i = data.draw(st.integers(0, len(sec)))
        sec[i:i] = data.draw(st.binary(min_size=1, max_size=12))
    count = data.draw(st.sampled_from([n, n - 1, n + 1, 0]))
    base_ts = int.from_bytes(built[1][27:35], "big", signed=True)
    results = decoders(native, bytes(sec), count, b["base_offset"], base_ts)
    assert results == decoders(twin, bytes(sec), count, b["base_offset"], base_ts)
    for kind, (status, result) in results.items():
        assert status == "ok" or result is ValueError, kind


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(-1, 8), int64s, int64s)
def test_random_bytes_fail_alike(
    section: bytes, count: int, base_offset: int, base_ts: int
) -> None:
    both()
    results = decoders(native, section, count, base_offset, base_ts)
    assert results == decoders(twin, section, count, base_offset, base_ts)


def test_columns_changed_by_python_code_during_the_build_are_not_read_freed() -> None:
    """A header's __bool__ runs Python code mid-build; here it empties the values list.
    The C codec walks its own copies of the columns (under the sanitizer test this would
    be a use-after-free otherwise): it builds what it was given, whatever the list holds
    now."""
    m, _ = both()
    values = [b"a"] * 5

    class Clears(list):
        def __bool__(self) -> bool:
            values.clear()
            return True

    data = build(m, values, headers=[Clears([("k", b"v")]), None, None, None, None])
    assert m.decode_columns(data[HEADER:], 5, 0, 1000, None)[3] == [b"a"] * 5


@pytest.mark.parametrize("name", IMPLS)
def test_a_released_memoryview_is_refused_not_read(name: str) -> None:
    """``with memoryview(buf) as mv: producer.send(..., mv)`` releases the view before
    the batch is built: building must refuse it, never copy the freed buffer."""
    with memoryview(array.array("B", b"\x42" * (1 << 16))) as mv:
        pass
    for values, headers in (([mv], None), ([b"v"], [[("h", mv)]])):
        with pytest.raises(ValueError, match="released"):
            impl(name).build_batch(values, None, headers, None, 0, None, 0, 0, -1, -1, -1, -1, None)


def test_a_column_resized_while_another_is_taken_is_refused() -> None:
    """Turning an iterable column into a sequence runs its ``__iter__``, which may shrink
    a column already taken: the native build checks every length again, instead of
    reading past the shrunken list (the twin takes len() first and refuses the
    iterable outright)."""
    values = [b"v" * 100 for _ in range(1000)]

    class Shrinks:
        def __iter__(self):
            del values[1:]
            return iter([None] * 1000)

    with pytest.raises((ValueError, TypeError)):
        impl("native").build_batch(
            values, Shrinks(), None, None, 0, None, 0, 0, -1, -1, -1, -1, None
        )


# --- column_cut: the producer's send_many slices ------------------------------------


@pytest.mark.parametrize("name", IMPLS)
def test_column_cut_takes_the_fewest_records_that_fill_the_room(name: str) -> None:
    cut = impl(name).column_cut
    values = [b"a" * 10, None, bytearray(b"xyz"), memoryview(b"12345")]
    assert cut(values, None, 0, 1 << 62, 8) == (4, 10 + 0 + 3 + 5 + 4 * 8)
    assert cut(values, None, 0, 18, 8) == (1, 18)  # the record that reaches it included
    assert cut(values, None, 0, 19, 8) == (2, 26)
    assert cut(values, None, 2, 1, 8) == (3, 11)  # at least one record
    assert cut(values, None, 4, 100, 8) == (4, 0)  # nothing left
    keys = [None, b"kk", None, b"k"]
    assert cut(values, keys, 0, 1 << 62, 8) == (4, 10 + 0 + 3 + 5 + 4 * 8 + 3)


@pytest.mark.parametrize("name", IMPLS)
def test_column_cut_refuses_what_build_batch_refuses(name: str) -> None:
    cut = impl(name).column_cut
    with pytest.raises(TypeError, match="record 1: a value must be bytes or None, not str"):
        cut([b"ok", "text"], None, 0, 1 << 62, 8)
    with pytest.raises(TypeError, match="record 2: a key must be bytes or None, not int"):
        cut([b"a"] * 3, [b"k", None, 7], 0, 1 << 62, 8)
    with pytest.raises(ValueError, match="differ in length"):
        cut([b"a"] * 3, [b"k"], 0, 1 << 62, 8)
    with pytest.raises(ValueError, match="outside"):
        cut([b"a"], None, 2, 10, 8)
    with memoryview(b"gone") as mv:
        pass
    with pytest.raises(ValueError, match="released"):
        cut([mv], None, 0, 10, 8)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=30),
    st.booleans(),
    st.integers(0, 30),
    st.integers(-5, 600),
    st.integers(0, 20),
)
def test_column_cut_native_and_twin_agree(
    values: list, keyed: bool, start: int, room: int, overhead: int
) -> None:
    native_impl, python_impl = both()
    keys = [v[:3] if v else None for v in values] if keyed else None
    start = min(start, len(values))
    assert native_impl.column_cut(values, keys, start, room, overhead) == (
        python_impl.column_cut(values, keys, start, room, overhead)
    )
