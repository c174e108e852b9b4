"""Server-side partition assignors of KIP-848 consumer groups, as pure functions.

Each assignor maps (members, topics) to a target assignment: member id -> {topic id:
partitions}. Every member appears in the result, with an empty map if it gets nothing.
Results depend only on the inputs (everything is iterated in sorted order), so every
replica of a coordinator that replays the same records computes the same target.

Rack awareness follows Kafka: a member that gives a rack prefers partitions with a
replica in that rack, but never at the cost of balance (uniform) or of the range quota
(range). Stickiness (uniform only) outranks rack preference: moving a partition costs a
revoke-then-assign round trip, a remote-rack fetch costs only bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]
"""(topic id, partition index)."""

Assignment = dict[str, dict[str, set[int]]]
"""member id -> {topic id: partitions}."""


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """What an assignor reads of one member."""

    member_id: str
    topics: frozenset[str]
    """Subscribed topic names."""
    rack: str | None = None
    assignment: Mapping[str, frozenset[int]] = field(default_factory=dict)
    """The member's current target (topic id -> partitions): what stickiness keeps."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What an assignor reads of one topic."""

    topic_id: str
    partitions: int
    racks: tuple[frozenset[str], ...] = ()
    """Racks holding a replica, per partition; empty when unknown."""

    def racks_of(self, partition: int) -> frozenset[str]:
        return self.racks[partition] if partition < len(self.racks) else frozenset()


Assignor = Callable[[Sequence[MemberSpec], Mapping[str, TopicSpec]], Assignment]


def _eligible(
    members: Sequence[MemberSpec], topics: Mapping[str, TopicSpec]
) -> dict[TopicPartition, list[str]]:
    """Each subscribed, existing partition -> the sorted ids of members subscribed to it."""
    by_partition: dict[TopicPartition, list[str]] = {}
    for name in sorted({t for m in members for t in m.topics}):
        topic = topics.get(name)
        if topic is None:
            continue  # subscribed but not (yet) created: nothing to assign
        subscribers = sorted(m.member_id for m in members if name in m.topics)
        for p in range(topic.partitions):
            by_partition[(topic.topic_id, p)] = subscribers
    return by_partition


def _racks_by_partition(topics: Mapping[str, TopicSpec]) -> dict[TopicPartition, frozenset[str]]:
    return {(t.topic_id, p): t.racks_of(p) for t in topics.values() for p in range(t.partitions)}


def _result(members: Sequence[MemberSpec], owned: Mapping[str, set[TopicPartition]]) -> Assignment:
    out: Assignment = {m.member_id: {} for m in members}
    for member_id, tps in owned.items():
        for topic_id, p in tps:
            out[member_id].setdefault(topic_id, set()).add(p)
    return out


def uniform(members: Sequence[MemberSpec], topics: Mapping[str, TopicSpec]) -> Assignment:
    """Balanced and sticky (Kafka's UniformAssignor in spirit).

    1. Each member keeps the partitions of its current assignment that it still may own
       (partition exists, topic still subscribed, no earlier member in id order kept it).
    2. Unowned partitions go, in sorted order, to an eligible member with the fewest
       partitions; under the balanced cap a member in a replica's rack is preferred.
    3. While some member holds two or more partitions more than another member eligible
       for one of them, one such partition moves (the donor is the fullest member). Each
       move lowers the sum of squared counts, so this ends; when it has, members with
       equal subscriptions differ by at most one partition. Only surplus moves, which is
       what keeps incremental rebalances small.
    """
    by_id = {m.member_id: m for m in members}
    eligible = _eligible(members, topics)
    racks = _racks_by_partition(topics)
    owned: dict[str, set[TopicPartition]] = {m: set() for m in sorted(by_id)}
    owner: dict[TopicPartition, str] = {}

    for member_id in sorted(by_id):
        for topic_id, parts in sorted(by_id[member_id].assignment.items()):
            for p in sorted(parts):
                tp = (topic_id, p)
                if tp not in owner and member_id in eligible.get(tp, ()):
                    owner[tp] = member_id
                    owned[member_id].add(tp)

    cap = -(-len(eligible) // len(by_id)) if by_id else 0

    def rack_match(member_id: str, tp: TopicPartition) -> bool:
        rack = by_id[member_id].rack
        return rack is not None and rack in racks.get(tp, frozenset())

    given: set[TopicPartition] = set()
    for tp in sorted(eligible):
        if tp in owner:
            continue
        given.add(tp)
        candidates = eligible[tp]
        if not candidates:
            continue
        # A rack-local member under the cap may take it even if a remote one has fewer;
        # step 3 restores balance if that overshoots.
        local = [m for m in candidates if rack_match(m, tp) and len(owned[m]) < cap]
        chosen = min(local or candidates, key=lambda m: (len(owned[m]), m))
        owner[tp] = chosen
        owned[chosen].add(tp)

    kept = {(m, tp) for m, tps in owned.items() for tp in tps if tp not in given}
    while True:
        move = _find_move(owned, eligible, rack_match, kept)
        if move is None:
            break
        tp, donor, taker = move
        owned[donor].discard(tp)
        owned[taker].add(tp)
        owner[tp] = taker
    return _result(members, owned)


def _find_move(
    owned: Mapping[str, set[TopicPartition]],
    eligible: Mapping[TopicPartition, list[str]],
    rack_match: Callable[[str, TopicPartition], bool],
    kept: set[tuple[str, TopicPartition]],
) -> tuple[TopicPartition, str, str] | None:
    """One partition to move from a fuller to an emptier member, or None if balanced.

    A partition the donor was just given moves before one it kept from its current
    assignment: the rack preference of step 2 may overshoot a member, and what it took
    for locality is what should go back, not a partition it was already consuming."""
    for donor in sorted(owned, key=lambda m: (-len(owned[m]), m)):
        best: tuple[tuple[int, int, int, int], TopicPartition, str] | None = None
        for tp in sorted(owned[donor]):
            for taker in eligible[tp]:
                if len(owned[taker]) >= len(owned[donor]) - 1:
                    continue
                # Prefer a partition the donor did not keep, then the emptiest taker,
                # then moving a partition that is remote for the donor and local for
                # the taker.
                rank = (
                    int((donor, tp) in kept),
                    len(owned[taker]),
                    int(rack_match(donor, tp)),
                    int(not rack_match(taker, tp)),
                )
                if best is None or rank < best[0]:
                    best = (rank, tp, taker)
        if best is not None:
            return best[1], donor, best[2]
    return None


def range_assign(members: Sequence[MemberSpec], topics: Mapping[str, TopicSpec]) -> Assignment:
    """Kafka's range assignor: per topic, subscribers sorted by member id get contiguous
    ranges, the first (partitions % subscribers) one partition more.

    With racks known, each member first takes (lowest first) the partitions in its rack
    up to its quota, then the rest fill quotas in partition order, as Kafka's rack-aware
    RangeAssignor does; without racks the layout is exactly contiguous."""
    owned: dict[str, set[TopicPartition]] = {m.member_id: set() for m in members}
    by_id = {m.member_id: m for m in members}
    for name in sorted({t for m in members for t in m.topics}):
        topic = topics.get(name)
        if topic is None:
            continue
        subscribers = sorted(m.member_id for m in members if name in m.topics)
        base, extra = divmod(topic.partitions, len(subscribers))
        quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(subscribers)}
        taken: dict[str, list[int]] = {m: [] for m in subscribers}
        free = list(range(topic.partitions))
        rack_aware = any(topic.racks_of(p) for p in free) and any(
            by_id[m].rack is not None for m in subscribers
        )
        if rack_aware:
            for m in subscribers:
                rack = by_id[m].rack
                for p in list(free):
                    if len(taken[m]) >= quota[m]:
                        break
                    if rack is not None and rack in topic.racks_of(p):
                        taken[m].append(p)
                        free.remove(p)
        for m in subscribers:
            need = quota[m] - len(taken[m])
            taken[m].extend(free[:need])
            del free[:need]
        for m, parts in taken.items():
            owned[m].update((topic.topic_id, p) for p in parts)
    return _result(members, owned)


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_assign}
DEFAULT_ASSIGNOR = "uniform"
