"""The group core's records as key/value records of `__consumer_offsets`.

Kafka-shaped: the key is a 2-byte big-endian record type (Kafka's numbers) followed by
the key fields, the value a 2-byte version followed by the body; key fields and body
are msgpack (docs/groups.md says why not Kafka's binary schemas). Keys are unique per
entity, so compaction keeps each entity's latest state:

| type | record | key fields |
| --- | --- | --- |
| 1 | offset commit | group, topic, partition |
| 3 | ConsumerGroupMetadata | group |
| 4 | ConsumerGroupPartitionMetadata | group |
| 5 | ConsumerGroupMemberMetadata | group, member |
| 6 | ConsumerGroupTargetAssignmentMetadata | group |
| 7 | ConsumerGroupTargetAssignmentMember | group, member |
| 8 | ConsumerGroupCurrentMemberAssignment | group, member |

A null value is a tombstone: a member removed writes three (types 5, 7, 8), a deleted
offset one on its key, a deleted group three (types 6, 4 and 3) after its offsets'.
Decoding maps each log record back to one core record; a tombstone decodes to the
removal it stands for, so replaying a compacted log, where only the latest record of a
key is left, rebuilds the same group as replaying the whole log.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

import msgpack

from rillet.broker.group.assignors import TopicSpec
from rillet.broker.group.coordinator import (
    CurrentAssignmentRecord,
    GroupDeletedRecord,
    GroupMetadataRecord,
    GroupRecord,
    MemberMetadataRecord,
    MemberRemovedRecord,
    MemberState,
    OffsetCommitRecord,
    OffsetDeletedRecord,
    PartitionMetadataRecord,
    Partitions,
    TargetAssignmentMemberRecord,
    TargetAssignmentMetadataRecord,
)

OFFSET_COMMIT = 1
GROUP_METADATA = 3
PARTITION_METADATA = 4
MEMBER_METADATA = 5
TARGET_METADATA = 6
TARGET_MEMBER = 7
CURRENT_ASSIGNMENT = 8
VALUE_VERSION = 0

_SHORT = struct.Struct(">h")

KeyValue = tuple[bytes, bytes | None]


class GroupRecordError(ValueError):
    """A record of the offsets topic that is not one of ours."""


def _key(kind: int, *fields: object) -> bytes:
    return _SHORT.pack(kind) + msgpack.packb(list(fields), use_bin_type=True)


def _value(*body: object) -> bytes:
    return _SHORT.pack(VALUE_VERSION) + msgpack.packb(list(body), use_bin_type=True)


def _parts(p: Partitions) -> list[list[object]]:
    return [[t, sorted(ps)] for t, ps in sorted(p.items())]


def _unparts(rows: list[list[object]]) -> dict[str, frozenset[int]]:
    return {str(t): frozenset(ps) for t, ps in rows}  # type: ignore[arg-type]


def encode(record: GroupRecord) -> list[KeyValue]:
    """The log records (key, value or None) standing for one core record, in order."""
    g = record.group_id
    if isinstance(record, OffsetCommitRecord):
        key = _key(OFFSET_COMMIT, g, record.topic, record.partition)
        return [(key, _value(record.offset, record.metadata, record.commit_timestamp_ms))]
    if isinstance(record, OffsetDeletedRecord):
        return [(_key(OFFSET_COMMIT, g, record.topic, record.partition), None)]
    if isinstance(record, GroupMetadataRecord):
        return [(_key(GROUP_METADATA, g), _value(record.epoch))]
    if isinstance(record, TargetAssignmentMetadataRecord):
        return [(_key(TARGET_METADATA, g), _value(record.assignment_epoch))]
    if isinstance(record, PartitionMetadataRecord):
        topics = [
            [name, spec.topic_id, spec.partitions, [sorted(r) for r in spec.racks]]
            for name, spec in sorted(record.topics.items())
        ]
        return [(_key(PARTITION_METADATA, g), _value(topics))]
    if isinstance(record, MemberMetadataRecord):
        body = _value(
            record.instance_id,
            record.rack,
            record.rebalance_timeout_ms,
            sorted(record.subscribed_topics),
            record.server_assignor,
        )
        return [(_key(MEMBER_METADATA, g, record.member_id), body)]
    if isinstance(record, TargetAssignmentMemberRecord):
        return [(_key(TARGET_MEMBER, g, record.member_id), _value(_parts(record.partitions)))]
    if isinstance(record, CurrentAssignmentRecord):
        body = _value(
            record.member_epoch,
            record.previous_member_epoch,
            record.state.value,
            _parts(record.assigned),
            _parts(record.pending_revocation),
            record.left_static,
        )
        return [(_key(CURRENT_ASSIGNMENT, g, record.member_id), body)]
    if isinstance(record, MemberRemovedRecord):
        m = record.member_id
        kinds = (MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT)
        return [(_key(kind, g, m), None) for kind in kinds]
    if isinstance(record, GroupDeletedRecord):
        kinds = (TARGET_METADATA, PARTITION_METADATA, GROUP_METADATA)
        return [(_key(kind, g), None) for kind in kinds]
    raise TypeError(f"not a group record: {record!r}")


def group_of(key: bytes) -> str:
    """The group id a key belongs to (every key's first field)."""
    return str(_unpack_key(key)[1][0])


def _unpack_key(key: bytes) -> tuple[int, list[object]]:
    if len(key) < 3:
        raise GroupRecordError(f"key of {len(key)} bytes")
    (kind,) = _SHORT.unpack_from(key)
    try:
        fields = msgpack.unpackb(key[2:], raw=False)
    except Exception as e:
        raise GroupRecordError(f"key fields do not decode: {e!r}") from e
    if not isinstance(fields, list) or not fields:
        raise GroupRecordError("key fields are not a list")
    return kind, fields


def decode(key: bytes, value: bytes | None) -> GroupRecord | None:
    """One log record as the core record it stands for; None for a record that
    changes nothing on replay (a target- or partition-metadata tombstone, which a
    group-metadata tombstone always follows)."""
    kind, k = _unpack_key(key)
    g = str(k[0])
    try:
        if value is None:
            return _tombstone(kind, g, k)
        if len(value) < 2:
            raise GroupRecordError(f"value of {len(value)} bytes")
        (version,) = _SHORT.unpack_from(value)
        if version != VALUE_VERSION:
            # Written by a newer broker: guessing at it could rebuild a wrong group.
            raise GroupRecordError(f"record type {kind}: unknown value version {version}")
        return _body(kind, g, k, msgpack.unpackb(value[2:], raw=False))
    except GroupRecordError:
        raise
    except Exception as e:  # any malformed field: one error type for the loader
        raise GroupRecordError(f"record type {kind}: {e!r}") from e


def _tombstone(kind: int, g: str, k: list[object]) -> GroupRecord | None:
    if kind == OFFSET_COMMIT:
        return OffsetDeletedRecord(g, str(k[1]), int(k[2]))  # type: ignore[call-overload]
    if kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT):
        return MemberRemovedRecord(g, str(k[1]))
    if kind == GROUP_METADATA:
        return GroupDeletedRecord(g)
    if kind in (TARGET_METADATA, PARTITION_METADATA):
        return None
    raise GroupRecordError(f"unknown record type {kind}")


def _body(kind: int, g: str, k: list[object], b: list) -> GroupRecord:
    if kind == OFFSET_COMMIT:
        return OffsetCommitRecord(g, str(k[1]), int(k[2]), b[0], b[1], b[2])  # type: ignore[call-overload]
    if kind == GROUP_METADATA:
        return GroupMetadataRecord(g, b[0])
    if kind == TARGET_METADATA:
        return TargetAssignmentMetadataRecord(g, b[0])
    if kind == PARTITION_METADATA:
        topics = {
            str(name): TopicSpec(str(tid), int(n), tuple(frozenset(r) for r in racks))
            for name, tid, n, racks in b[0]
        }
        return PartitionMetadataRecord(g, topics)
    member = str(k[1])
    if kind == MEMBER_METADATA:
        return MemberMetadataRecord(g, member, b[0], b[1], b[2], frozenset(b[3]), b[4])
    if kind == TARGET_MEMBER:
        return TargetAssignmentMemberRecord(g, member, _unparts(b[0]))
    if kind == CURRENT_ASSIGNMENT:
        return CurrentAssignmentRecord(
            g, member, b[0], b[1], MemberState(b[2]), _unparts(b[3]), _unparts(b[4]), b[5]
        )
    raise GroupRecordError(f"unknown record type {kind}")


def compact(log: list[KeyValue]) -> list[KeyValue]:
    """What compaction leaves of ``log``: the latest record of each key, in log order
    (tombstones kept, as before ``delete.retention.ms`` passes)."""
    last: Mapping[bytes, int] = {key: i for i, (key, _) in enumerate(log)}
    return [kv for i, kv in enumerate(log) if last[kv[0]] == i]
