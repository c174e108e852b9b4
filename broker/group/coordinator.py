"""One consumer group's coordinator state (KIP-848), as a sans-I/O core.

The driver (the broker leading the group's `__consumer_offsets` partition) passes in
heartbeats, offset commits, topic metadata and `tick(now_ms)`; each call returns a Step:
the records to append to the offsets partition, in order, and the response to send. The
response may be sent only once those records are committed, so a coordinator that loses
its partition never answered anything its successor will not replay. Nothing here does
I/O or reads a clock. docs/groups.md states the rules; the names are Kafka's.

The state is protocol-agnostic so Kafka's classic JoinGroup/SyncGroup can later be served
from it, as Kafka 4.0 does: a classic member is a Member whose epoch is the generation
id, whose subscription comes from its JoinGroup metadata and whose assignment is the
target the server-side assignor computed; SyncGroup returns that target once every
member has revoked what it must (a classic member revokes everything on rejoin, so it
passes through UNREVOKED_PARTITIONS in one step). Only the request decoding and the
response shape would differ; epochs, timers, records and reconciliation are shared.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from rillet.broker.group.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    MemberSpec,
    TopicSpec,
)
from rillet.client.group_membership import flat as _flat
from rillet.client.group_membership import nest as _nest
from rillet.client.wire import errors

NONE = errors.NONE
UNKNOWN_MEMBER_ID = errors.code_of("UNKNOWN_MEMBER_ID")
FENCED_MEMBER_EPOCH = errors.code_of("FENCED_MEMBER_EPOCH")
STALE_MEMBER_EPOCH = errors.code_of("STALE_MEMBER_EPOCH")
UNRELEASED_INSTANCE_ID = errors.code_of("UNRELEASED_INSTANCE_ID")
FENCED_INSTANCE_ID = errors.code_of("FENCED_INSTANCE_ID")
UNSUPPORTED_ASSIGNOR = errors.code_of("UNSUPPORTED_ASSIGNOR")
INVALID_REQUEST = errors.code_of("INVALID_REQUEST")
NON_EMPTY_GROUP = errors.code_of("NON_EMPTY_GROUP")
GROUP_SUBSCRIBED_TO_TOPIC = errors.code_of("GROUP_SUBSCRIBED_TO_TOPIC")

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

Partitions = Mapping[str, frozenset[int]]
"""topic id -> partitions."""


class MemberState(enum.Enum):
    STABLE = "stable"
    """At the target epoch, owning all of its target."""
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    """Must give up partitions before its epoch may advance."""
    UNRELEASED_PARTITIONS = "unreleased_partitions"
    """At the target epoch, waiting for other members to release some of its target."""


class GroupState(enum.Enum):
    EMPTY = "empty"
    ASSIGNING = "assigning"
    RECONCILING = "reconciling"
    STABLE = "stable"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    session_timeout_ms: int = 45_000
    """Kafka's group.consumer.session.timeout.ms: a silent member is removed after this."""
    heartbeat_interval_ms: int = 5_000
    """Kafka's group.consumer.heartbeat.interval.ms, told to members in every response."""
    assignors: tuple[str, ...] = (DEFAULT_ASSIGNOR, "range")
    """Kafka's group.consumer.assignors; the first is the default."""

    def __post_init__(self) -> None:
        if self.session_timeout_ms <= 0 or self.heartbeat_interval_ms <= 0:
            raise ValueError("timeouts must be positive")
        if not self.assignors or any(a not in ASSIGNORS for a in self.assignors):
            raise ValueError(f"assignors must be among {sorted(ASSIGNORS)}")


# --- requests and responses -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Kafka's ConsumerGroupHeartbeatRequest. None means "unchanged since last time"."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack: str | None = None
    rebalance_timeout_ms: int | None = None
    subscribed_topics: frozenset[str] | None = None
    server_assignor: str | None = None
    owned: Partitions | None = None
    """The partitions the member owns now (it reports this after revoking)."""


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error_code: int
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Partitions | None = None
    """What the member may own now; None on errors."""


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """One partition's commit of Kafka's OffsetCommitRequest."""

    member_id: str
    member_epoch: int
    topic: str
    partition: int
    offset: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    error_code: int


@dataclass(frozen=True, slots=True)
class DeleteGroupResponse:
    error_code: int


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponse:
    error_codes: Mapping[tuple[str, int], int]
    """(topic, partition) -> error code."""


# --- records for the offsets topic (shaped after Kafka's ConsumerGroup*Record) ----


@dataclass(frozen=True, slots=True)
class GroupMetadataRecord:
    """ConsumerGroupMetadata: the group epoch."""

    group_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class PartitionMetadataRecord:
    """ConsumerGroupPartitionMetadata: the subscribed topics as the target was last
    computed from (name -> spec). A new coordinator diffs it against the topics it
    sees, so a topic deleted or grown while another broker led the group is noticed."""

    group_id: str
    topics: Mapping[str, TopicSpec]


@dataclass(frozen=True, slots=True)
class MemberMetadataRecord:
    """ConsumerGroupMemberMetadata: what the member asked for."""

    group_id: str
    member_id: str
    instance_id: str | None
    rack: str | None
    rebalance_timeout_ms: int
    subscribed_topics: frozenset[str]
    server_assignor: str | None


@dataclass(frozen=True, slots=True)
class TargetAssignmentMetadataRecord:
    """ConsumerGroupTargetAssignmentMetadata: the epoch the target was computed at."""

    group_id: str
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class TargetAssignmentMemberRecord:
    """ConsumerGroupTargetAssignmentMember: one member's share of the target."""

    group_id: str
    member_id: str
    partitions: Partitions


@dataclass(frozen=True, slots=True)
class CurrentAssignmentRecord:
    """ConsumerGroupCurrentMemberAssignment: where the member is in reconciliation."""

    group_id: str
    member_id: str
    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned: Partitions
    pending_revocation: Partitions
    left_static: bool = False
    """Left with epoch -2 (Kafka writes member epoch -2; we keep the epoch it had)."""


@dataclass(frozen=True, slots=True)
class MemberRemovedRecord:
    """The tombstones Kafka writes for a member's metadata, target and current
    assignment records, as one record."""

    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class OffsetCommitRecord:
    group_id: str
    topic: str
    partition: int
    offset: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class OffsetDeletedRecord:
    """A committed offset removed (Kafka writes a tombstone on the offset's key)."""

    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupDeletedRecord:
    """The group is deleted: tombstones on its metadata and target-metadata keys. Its
    offsets' tombstones precede it; an empty group has no member records left."""

    group_id: str


GroupRecord = (
    GroupMetadataRecord
    | PartitionMetadataRecord
    | MemberMetadataRecord
    | TargetAssignmentMetadataRecord
    | TargetAssignmentMemberRecord
    | CurrentAssignmentRecord
    | MemberRemovedRecord
    | OffsetCommitRecord
    | OffsetDeletedRecord
    | GroupDeletedRecord
)


@dataclass(frozen=True, slots=True)
class Step:
    """What one event produced: records to append (in order), then the response."""

    records: tuple[GroupRecord, ...] = ()
    response: (
        HeartbeatResponse | OffsetCommitResponse | DeleteGroupResponse | OffsetDeleteResponse | None
    ) = None


# --- state --------------------------------------------------------------------------


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None = None
    rack: str | None = None
    rebalance_timeout_ms: int = 300_000
    subscribed_topics: frozenset[str] = frozenset()
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: dict[str, frozenset[int]] = field(default_factory=dict)
    pending_revocation: dict[str, frozenset[int]] = field(default_factory=dict)
    session_deadline_ms: int = 0
    rebalance_deadline_ms: int | None = None
    """Set while the member must revoke: it is removed if it has not by then."""
    left_static: bool = False
    """Left with epoch -2: its assignment waits for its instance id to come back."""


class GroupCoordinator:
    """The state of one consumer group and the rules that move it."""

    def __init__(self, group_id: str, config: GroupConfig | None = None) -> None:
        self.group_id = group_id
        self.config = config or GroupConfig()
        self.group_epoch = 0
        self.target_assignment_epoch = 0
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}
        """instance id -> member id."""
        self.target: dict[str, dict[str, frozenset[int]]] = {}
        self.topics: dict[str, TopicSpec] = {}
        self.subscribed_metadata: dict[str, TopicSpec] = {}
        """The subscribed topics' specs as last recorded (PartitionMetadataRecord)."""
        self.offsets: dict[tuple[str, int], OffsetCommitRecord] = {}

    # --- undo ---------------------------------------------------------------------------

    def copy(self) -> GroupCoordinator:
        """An independent copy, to restore if the records of the next event cannot be
        written. Containers are copied one level deep: the core replaces member
        assignments and target shares rather than changing them in place."""
        c = GroupCoordinator.__new__(GroupCoordinator)
        c.__dict__.update(self.__dict__)
        c.members = {k: replace(m) for k, m in self.members.items()}
        c.static_members = dict(self.static_members)
        c.target = dict(self.target)
        c.topics = dict(self.topics)
        c.subscribed_metadata = dict(self.subscribed_metadata)
        c.offsets = dict(self.offsets)
        return c

    def restore(self, snapshot: GroupCoordinator) -> None:
        """Back to ``snapshot`` (a ``copy``, not used afterwards), all but the session
        timers of members still here: a member whose heartbeat could not be written is
        alive all the same and must not expire for it (timers are not recorded)."""
        for member_id, m in snapshot.members.items():
            current = self.members.get(member_id)
            if current is not None:
                m.session_deadline_ms = max(m.session_deadline_ms, current.session_deadline_ms)
        self.__dict__.update(snapshot.__dict__)

    # --- queries --------------------------------------------------------------------

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.target_assignment_epoch < self.group_epoch:
            return GroupState.ASSIGNING
        if any(
            m.member_epoch != self.target_assignment_epoch or m.state is not MemberState.STABLE
            for m in self.members.values()
        ):
            return GroupState.RECONCILING
        return GroupState.STABLE

    def owner_of(self, topic_id: str, partition: int) -> list[str]:
        """Members that own or are still revoking the partition (never more than one)."""
        return [
            m.member_id
            for m in self.members.values()
            if partition in m.assigned.get(topic_id, ())
            or partition in m.pending_revocation.get(topic_id, ())
        ]

    # --- events ---------------------------------------------------------------------

    def update_topics(self, topics: Mapping[str, TopicSpec]) -> Step:
        """New topic metadata (name -> spec). A change to a subscribed topic bumps the
        group epoch, so the target is recomputed (partitions added, topic deleted)."""
        subscribed = {t for m in self.members.values() for t in m.subscribed_topics}
        changed = any(self.topics.get(t) != topics.get(t) for t in subscribed)
        self.topics = dict(topics)
        if not changed:
            return Step()
        records: list[GroupRecord] = [self._bump_epoch()]
        records += self._maybe_compute_target()
        return Step(tuple(records))

    def heartbeat(self, req: Heartbeat, now_ms: int) -> Step:
        if not req.member_id:
            return self._error(req, INVALID_REQUEST)
        assignor = req.server_assignor
        if assignor is not None and assignor not in self.config.assignors:
            return self._error(req, UNSUPPORTED_ASSIGNOR)
        if req.member_epoch == LEAVE_EPOCH or req.member_epoch == STATIC_LEAVE_EPOCH:
            return self._leave(req, now_ms)
        if req.member_epoch == JOIN_EPOCH:
            return self._join(req, now_ms)
        member = self.members.get(req.member_id)
        if member is None or member.left_static:
            return self._error(req, UNKNOWN_MEMBER_ID)
        if req.instance_id is not None and self.static_members.get(req.instance_id) != (
            member.member_id
        ):
            return self._error(req, FENCED_INSTANCE_ID)
        if req.member_epoch != member.member_epoch and not self._lost_response(member, req):
            return self._error(req, FENCED_MEMBER_EPOCH)
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms
        records = self._update_member(member, req)
        return self._reconcile_and_answer(member, req, records, now_ms)

    def due(self, now_ms: int) -> bool:
        """Whether ``tick(now_ms)`` would change anything (cheap: no copy needed if not)."""
        return any(
            now_ms >= m.session_deadline_ms
            or (m.rebalance_deadline_ms is not None and now_ms >= m.rebalance_deadline_ms)
            for m in self.members.values()
        )

    def tick(self, now_ms: int) -> Step:
        """Remove members whose session expired or who did not revoke in time."""
        records: list[GroupRecord] = []
        for member in sorted(self.members.values(), key=lambda m: m.member_id):
            expired = now_ms >= member.session_deadline_ms
            late = member.rebalance_deadline_ms is not None and (
                now_ms >= member.rebalance_deadline_ms
            )
            if expired or late:
                records += self._remove(member)
        if records:
            records.append(self._bump_epoch())
            records += self._maybe_compute_target()
        return Step(tuple(records))

    def commit_offset(self, req: OffsetCommit, now_ms: int) -> Step:
        """Validate one partition's commit against the member epoch (KIP-848's rule:
        a commit from an older epoch may come from a member that lost the partition)."""
        code = self._validate_commit(req)
        if code != NONE:
            return Step((), OffsetCommitResponse(code))
        record = OffsetCommitRecord(
            self.group_id, req.topic, req.partition, req.offset, req.metadata, now_ms
        )
        self.offsets[(req.topic, req.partition)] = record
        return Step((record,), OffsetCommitResponse(NONE))

    def delete_group(self) -> Step:
        """Kafka's DeleteGroups: only a group without members (NON_EMPTY_GROUP
        otherwise, a static member waiting for its instance included); its offsets go
        with it."""
        if self.members:
            return Step((), DeleteGroupResponse(NON_EMPTY_GROUP))
        records: list[GroupRecord] = [
            OffsetDeletedRecord(self.group_id, t, p) for t, p in sorted(self.offsets)
        ]
        records.append(GroupDeletedRecord(self.group_id))
        for record in records:
            self.replay(record)
        return Step(tuple(records), DeleteGroupResponse(NONE))

    def delete_offsets(self, partitions: Sequence[tuple[str, int]]) -> Step:
        """Kafka's OffsetDelete: a partition of a topic some member subscribes to is
        refused (GROUP_SUBSCRIBED_TO_TOPIC: its owner would commit it again); deleting
        an offset the group never committed succeeds and writes nothing."""
        subscribed = self.subscribed_topics()
        codes: dict[tuple[str, int], int] = {}
        records: list[GroupRecord] = []
        for topic, partition in partitions:
            if topic in subscribed:
                codes[(topic, partition)] = GROUP_SUBSCRIBED_TO_TOPIC
                continue
            codes[(topic, partition)] = NONE
            if (topic, partition) in self.offsets:
                record = OffsetDeletedRecord(self.group_id, topic, partition)
                self.replay(record)
                records.append(record)
        return Step(tuple(records), OffsetDeleteResponse(codes))

    def delete_topic_offsets(self, topics: set[str]) -> Step:
        """Deleted topics: their committed offsets go too, as Kafka's coordinator does,
        so a topic later created with the same name is not read from an old position."""
        records = tuple(
            OffsetDeletedRecord(self.group_id, t, p) for t, p in sorted(self.offsets) if t in topics
        )
        for record in records:
            self.replay(record)
        return Step(records)

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed_topics}

    @property
    def is_deleted(self) -> bool:
        """Nothing left to keep: what loading a deleted group's records ends with."""
        return not self.members and not self.offsets and self.group_epoch == 0

    # --- heartbeat helpers ------------------------------------------------------------

    def _error(self, req: Heartbeat, code: int) -> Step:
        return Step(
            (),
            HeartbeatResponse(code, req.member_id, req.member_epoch, self._interval()),
        )

    def _interval(self) -> int:
        return self.config.heartbeat_interval_ms

    def _lost_response(self, member: Member, req: Heartbeat) -> bool:
        # The member missed the response that moved it to its current epoch: it may keep
        # heartbeating at the previous epoch as long as it owns nothing it should not.
        if req.member_epoch != member.previous_member_epoch or req.owned is None:
            return False
        return _flat(req.owned) <= _flat(member.assigned)

    def _validate_commit(self, req: OffsetCommit) -> int:
        if not req.member_id and req.member_epoch < 0:
            # An admin or manually-assigned commit: allowed only while nobody consumes.
            return NONE if not self.members else UNKNOWN_MEMBER_ID
        member = self.members.get(req.member_id)
        if member is None or member.left_static:
            return UNKNOWN_MEMBER_ID
        if req.member_epoch > member.member_epoch:
            return FENCED_MEMBER_EPOCH
        if req.member_epoch < member.member_epoch:
            return STALE_MEMBER_EPOCH
        return NONE

    def _join(self, req: Heartbeat, now_ms: int) -> Step:
        # Refusals come before any change: a refused request writes no record.
        if req.subscribed_topics is None:
            return self._error(req, INVALID_REQUEST)
        holder: Member | None = None
        if req.instance_id is not None:
            holder_id = self.static_members.get(req.instance_id)
            if holder_id is not None and holder_id != req.member_id:
                holder = self.members.get(holder_id)
            if holder is not None and not holder.left_static:
                return self._error(req, UNRELEASED_INSTANCE_ID)
        records: list[GroupRecord] = []
        existing = self.members.get(req.member_id)
        if existing is not None:
            # Epoch 0 from a known member: it dropped everything (it was fenced, or lost
            # its state); what we still hold for it is released before it joins again.
            records += self._remove(existing)
            records.append(self._bump_epoch())
        if holder is not None:
            return self._static_takeover(holder, req, records, now_ms)
        member = Member(member_id=req.member_id, instance_id=req.instance_id)
        self.members[member.member_id] = member
        if req.instance_id is not None:
            self.static_members[req.instance_id] = member.member_id
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms
        records += self._update_member(member, req, force=True)
        return self._reconcile_and_answer(member, req, records, now_ms)

    def _static_takeover(
        self, old: Member, req: Heartbeat, records: list[GroupRecord], now_ms: int
    ) -> Step:
        # The same instance is back within the session timeout: the new member id takes
        # over the old member's epoch and assignment and no rebalance happens, unless
        # what it asks for differs (then _update_member bumps the epoch as for anyone).
        old_id = old.member_id
        del self.members[old_id]
        share = self.target.pop(old_id, None)
        records.append(MemberRemovedRecord(self.group_id, old_id))
        old.member_id = req.member_id
        old.left_static = False
        old.session_deadline_ms = now_ms + self.config.session_timeout_ms
        self.members[old.member_id] = old
        self.static_members[req.instance_id or ""] = old.member_id
        if share is not None:
            self.target[old.member_id] = share
            records.append(TargetAssignmentMemberRecord(self.group_id, old.member_id, share))
        records.append(self._current_record(old))
        records += self._update_member(old, req, force=True)
        return self._reconcile_and_answer(old, req, records, now_ms)

    def _leave(self, req: Heartbeat, now_ms: int) -> Step:
        member = self.members.get(req.member_id)
        if member is None:
            return self._error(req, UNKNOWN_MEMBER_ID)
        records: list[GroupRecord] = []
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # A static member restarting: keep its assignment for the session timeout.
            member.left_static = True
            member.session_deadline_ms = now_ms + self.config.session_timeout_ms
            records.append(self._current_record(member))
        else:
            records += self._remove(member)
            records.append(self._bump_epoch())
            records += self._maybe_compute_target()
        return Step(
            tuple(records),
            HeartbeatResponse(NONE, req.member_id, req.member_epoch, self._interval()),
        )

    def _remove(self, member: Member) -> list[GroupRecord]:
        del self.members[member.member_id]
        self.target.pop(member.member_id, None)
        instance = member.instance_id
        if instance is not None and self.static_members.get(instance) == member.member_id:
            del self.static_members[instance]
        return [MemberRemovedRecord(self.group_id, member.member_id)]

    def _bump_epoch(self) -> GroupMetadataRecord:
        self.group_epoch += 1
        return GroupMetadataRecord(self.group_id, self.group_epoch)

    def _update_member(
        self, member: Member, req: Heartbeat, force: bool = False
    ) -> list[GroupRecord]:
        """Apply what the request changes; a changed subscription or assignor bumps the
        group epoch and recomputes the target."""
        new = (
            member.subscribed_topics if req.subscribed_topics is None else req.subscribed_topics,
            member.rack if req.rack is None else req.rack,
            member.server_assignor if req.server_assignor is None else req.server_assignor,
        )
        old = (member.subscribed_topics, member.rack, member.server_assignor)
        timeout = (
            member.rebalance_timeout_ms
            if req.rebalance_timeout_ms is None
            else req.rebalance_timeout_ms
        )
        if not force and new == old and timeout == member.rebalance_timeout_ms:
            return []
        member.subscribed_topics, member.rack, member.server_assignor = new
        member.rebalance_timeout_ms = timeout
        rebalance = new != old
        records: list[GroupRecord] = [
            MemberMetadataRecord(
                self.group_id,
                member.member_id,
                member.instance_id,
                member.rack,
                member.rebalance_timeout_ms,
                member.subscribed_topics,
                member.server_assignor,
            )
        ]
        if rebalance or member.member_id not in self.target:
            records.append(self._bump_epoch())
        return records + self._maybe_compute_target()

    def assignor(self) -> str:
        """The assignor the group uses: Kafka picks the one most members ask for, ties
        going to the configured order."""
        names = [m.server_assignor for m in self.members.values() if m.server_assignor]
        if not names:
            return self.config.assignors[0]
        return max(
            self.config.assignors,
            key=lambda a: (names.count(a), -self.config.assignors.index(a)),
        )

    def _maybe_compute_target(self) -> list[GroupRecord]:
        if self.target_assignment_epoch >= self.group_epoch:
            return []
        records: list[GroupRecord] = []
        # Every change of the subscribed topics or of their metadata recomputes the
        # target, so recording the metadata here keeps it current in the log.
        subscribed = self.subscribed_topics()
        metadata = {t: spec for t, spec in sorted(self.topics.items()) if t in subscribed}
        if metadata != self.subscribed_metadata:
            self.subscribed_metadata = metadata
            records.append(PartitionMetadataRecord(self.group_id, metadata))
        active = sorted(self.members.values(), key=lambda m: m.member_id)
        specs = [
            MemberSpec(m.member_id, m.subscribed_topics, m.rack, self.target.get(m.member_id, {}))
            for m in active
        ]
        result = ASSIGNORS[self.assignor()](specs, self.topics) if specs else {}
        self.target = {
            m: {t: frozenset(ps) for t, ps in sorted(parts.items()) if ps}
            for m, parts in result.items()
        }
        self.target_assignment_epoch = self.group_epoch
        records += [
            TargetAssignmentMemberRecord(self.group_id, m, self.target[m])
            for m in sorted(self.target)
        ]
        records.append(TargetAssignmentMetadataRecord(self.group_id, self.target_assignment_epoch))
        return records

    # --- reconciliation -------------------------------------------------------------------

    def _reconcile_and_answer(
        self, member: Member, req: Heartbeat, records: list[GroupRecord], now_ms: int
    ) -> Step:
        before = self._current_record(member)
        self._reconcile(member, req.owned, now_ms)
        after = self._current_record(member)
        if after != before:
            records.append(after)
        return Step(
            tuple(records),
            HeartbeatResponse(
                NONE,
                member.member_id,
                member.member_epoch,
                self._interval(),
                dict(member.assigned),
            ),
        )

    def _owned_by_others(self, member: Member) -> set[tuple[str, int]]:
        held: set[tuple[str, int]] = set()
        for other in self.members.values():
            if other is not member:
                held |= _flat(other.assigned) | _flat(other.pending_revocation)
        return held

    def _reconcile(self, member: Member, owned: Partitions | None, now_ms: int) -> None:
        """Move the member toward the target: revoke first, then assign what is free."""
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            still = _flat(owned) & _flat(member.pending_revocation) if owned is not None else None
            if still is None or still:
                return  # not yet revoked: the epoch must not advance
            member.pending_revocation = {}
            member.rebalance_deadline_ms = None
        target = _flat(self.target.get(member.member_id, {}))
        current = _flat(member.assigned)
        if member.member_epoch == self.target_assignment_epoch and current == target:
            member.state = MemberState.STABLE
            return
        revoke = current - target
        if revoke:
            member.assigned = _nest(current & target)
            member.pending_revocation = _nest(revoke)
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.rebalance_deadline_ms = now_ms + member.rebalance_timeout_ms
            return
        if member.member_epoch != self.target_assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.target_assignment_epoch
        free = (target - current) - self._owned_by_others(member)
        member.assigned = _nest(current | free)
        if _flat(member.assigned) == target:
            member.state = MemberState.STABLE
        else:
            member.state = MemberState.UNRELEASED_PARTITIONS

    def _current_record(self, member: Member) -> CurrentAssignmentRecord:
        return CurrentAssignmentRecord(
            self.group_id,
            member.member_id,
            member.member_epoch,
            member.previous_member_epoch,
            member.state,
            dict(member.assigned),
            dict(member.pending_revocation),
            member.left_static,
        )

    # --- loading --------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        group_id: str,
        records: Sequence[GroupRecord],
        topics: Mapping[str, TopicSpec],
        now_ms: int,
        config: GroupConfig | None = None,
    ) -> GroupCoordinator:
        """Rebuild a group from its records, as a new leader of the offsets partition
        does. Timers are not recorded: every member's session starts anew at `now_ms`
        (Kafka does the same on load), and a member still revoking gets a fresh
        rebalance timeout. The subscribed topics are taken as recorded, not from
        ``topics``: the caller then passes the current topics to ``update_topics``,
        which rebalances if they changed meanwhile."""
        g = cls(group_id, config)
        g.topics = dict(topics)
        for record in records:
            g.replay(record)
        for t in g.subscribed_topics():
            if t in g.subscribed_metadata:
                g.topics[t] = g.subscribed_metadata[t]
            else:
                g.topics.pop(t, None)
        for m in g.members.values():
            m.session_deadline_ms = now_ms + g.config.session_timeout_ms
            if m.state is MemberState.UNREVOKED_PARTITIONS:
                m.rebalance_deadline_ms = now_ms + m.rebalance_timeout_ms
        return g

    def _member_for(self, member_id: str) -> Member:
        member = self.members.get(member_id)
        if member is None:
            member = self.members[member_id] = Member(member_id)
        return member

    def replay(self, record: GroupRecord) -> None:
        """Apply one record written by this class (in the order it was written)."""
        if isinstance(record, GroupMetadataRecord):
            self.group_epoch = record.epoch
        elif isinstance(record, PartitionMetadataRecord):
            self.subscribed_metadata = dict(record.topics)
        elif isinstance(record, TargetAssignmentMetadataRecord):
            self.target_assignment_epoch = record.assignment_epoch
        elif isinstance(record, TargetAssignmentMemberRecord):
            self._member_for(record.member_id)
            self.target[record.member_id] = dict(record.partitions)
        elif isinstance(record, MemberMetadataRecord):
            m = self._member_for(record.member_id)
            m.instance_id = record.instance_id
            m.rack = record.rack
            m.rebalance_timeout_ms = record.rebalance_timeout_ms
            m.subscribed_topics = record.subscribed_topics
            m.server_assignor = record.server_assignor
            if record.instance_id is not None:
                self.static_members[record.instance_id] = record.member_id
        elif isinstance(record, CurrentAssignmentRecord):
            m = self._member_for(record.member_id)
            m.member_epoch = record.member_epoch
            m.previous_member_epoch = record.previous_member_epoch
            m.state = record.state
            m.assigned = dict(record.assigned)
            m.pending_revocation = dict(record.pending_revocation)
            m.left_static = record.left_static
        elif isinstance(record, MemberRemovedRecord):
            removed = self.members.get(record.member_id)
            if removed is not None:
                self._remove(removed)
        elif isinstance(record, OffsetCommitRecord):
            self.offsets[(record.topic, record.partition)] = record
        elif isinstance(record, OffsetDeletedRecord):
            self.offsets.pop((record.topic, record.partition), None)
        elif isinstance(record, GroupDeletedRecord):
            # Back to a group never seen (a new group of that id starts at epoch 0).
            self.group_epoch = self.target_assignment_epoch = 0
            self.target = {}
            self.offsets = {}
            self.subscribed_metadata = {}
