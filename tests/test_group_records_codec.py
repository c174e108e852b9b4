"""The group records as `__consumer_offsets` key/value records: Kafka's key layout,
round trips, tombstones, and loading a compacted log (the group simulator also loads its
whole encoded log and its compacted form after its runs: tests/sim/group_cluster.py)."""

from __future__ import annotations

import struct

import pytest
from sim.group_cluster import SimulationFailure, run_seed
from sim.seeds import first_failure

from rillet.broker.group import records_codec as codec
from rillet.broker.group.assignors import TopicSpec
from rillet.broker.group.coordinator import (
    CurrentAssignmentRecord,
    GroupDeletedRecord,
    GroupMetadataRecord,
    MemberMetadataRecord,
    MemberRemovedRecord,
    MemberState,
    OffsetCommitRecord,
    OffsetDeletedRecord,
    PartitionMetadataRecord,
    TargetAssignmentMemberRecord,
    TargetAssignmentMetadataRecord,
)

RECORDS = [
    OffsetCommitRecord("g", "t", 3, 42, "meta", 1_700_000_000_000),
    GroupMetadataRecord("g", 7),
    MemberMetadataRecord("g", "m", "inst", "rack-a", 30_000, frozenset({"t", "u"}), "range"),
    MemberMetadataRecord("g", "m2", None, None, 1, frozenset(), None),
    TargetAssignmentMetadataRecord("g", 7),
    TargetAssignmentMemberRecord("g", "m", {"T": frozenset({0, 2}), "U": frozenset({1})}),
    CurrentAssignmentRecord(
        "g", "m", 7, 6, MemberState.UNREVOKED_PARTITIONS, {"T": frozenset({0})},
        {"U": frozenset({1})}, True,
    ),
    PartitionMetadataRecord(
        "g",
        {"t": TopicSpec("T", 2, (frozenset({"r1", "r2"}), frozenset())), "u": TopicSpec("U", 1)},
    ),
]  # fmt: skip


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_records_round_trip(record: object) -> None:
    ((key, value),) = codec.encode(record)  # type: ignore[arg-type]
    assert value is not None and struct.unpack(">h", value[:2]) == (0,)
    assert codec.decode(key, value) == record
    assert codec.group_of(key) == "g"


def test_keys_carry_kafkas_record_types() -> None:
    types = [struct.unpack(">h", codec.encode(r)[0][0][:2])[0] for r in RECORDS]  # type: ignore[arg-type]
    assert types == [1, 3, 5, 5, 6, 7, 8, 4]


def test_removals_are_tombstones_on_the_entities_keys() -> None:
    removed = codec.encode(MemberRemovedRecord("g", "m"))
    member_keys = {k for r in RECORDS[2:] for k, _ in codec.encode(r) if b"m" in k[2:]}  # type: ignore[arg-type]
    assert all(v is None for _, v in removed)
    assert (
        {k for k, _ in removed}
        == {
            codec.encode(r)[0][0]  # type: ignore[arg-type]
            for r in (RECORDS[2], RECORDS[5], RECORDS[6])
        }
        <= member_keys
    )
    assert [codec.decode(k, v) for k, v in removed] == [MemberRemovedRecord("g", "m")] * 3
    ((okey, ovalue),) = codec.encode(OffsetDeletedRecord("g", "t", 3))
    assert okey == codec.encode(RECORDS[0])[0][0] and ovalue is None  # type: ignore[arg-type]
    deleted = codec.encode(GroupDeletedRecord("g"))
    assert [codec.decode(k, v) for k, v in deleted] == [None, None, GroupDeletedRecord("g")]


def test_compaction_keeps_the_latest_record_of_each_key_in_order() -> None:
    log = [(b"a", b"1"), (b"b", b"1"), (b"a", None), (b"c", b"1"), (b"b", b"2")]
    assert codec.compact(log) == [(b"a", None), (b"c", b"1"), (b"b", b"2")]


def test_records_that_are_not_ours_are_refused() -> None:
    with pytest.raises(codec.GroupRecordError):
        codec.decode(b"\x00", b"\x00\x00")
    with pytest.raises(codec.GroupRecordError):
        codec.decode(struct.pack(">h", 99) + b"\x91\xa1g", b"\x00\x00\x90")
    ((key, value),) = codec.encode(RECORDS[1])
    assert value is not None
    with pytest.raises(codec.GroupRecordError, match="version"):
        codec.decode(key, b"\x00\x09" + value[2:])
    # Malformed bodies and key fields are the same error, never msgpack's or IndexError.
    with pytest.raises(codec.GroupRecordError):
        codec.decode(key, b"\x00\x00\xc1")
    with pytest.raises(codec.GroupRecordError):
        codec.decode(key, b"\x00\x00\x90")
    offset_key = struct.pack(">h", 1) + b"\x91\xa1g"  # an offset key without topic
    with pytest.raises(codec.GroupRecordError):
        codec.decode(offset_key, None)


def test_a_codec_that_loses_member_tombstones_fails_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = codec.decode

    def no_removals(key: bytes, value: bytes | None) -> object:
        record = original(key, value)
        return None if isinstance(record, MemberRemovedRecord) else record

    monkeypatch.setattr(codec, "decode", no_removals)
    assert "loading the" in first_failure(run_seed, 20, SimulationFailure)
