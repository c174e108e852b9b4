"""Replica placement for new partitions, reassignment plans, and preferred leaders.

Round robin from a random (seeded) start, so over many topics leaders and replicas
balance across brokers; followers are placed at a per-topic random shift from the
leader, so broker b's followers do not all sit on b+1. With racks, brokers are first
interleaved rack by rack (r1-a, r2-a, r3-a, r1-b, ...), the leader walks that list, and
each follower takes the next broker in the list whose rack this partition does not use
yet, until every rack holds one replica; only then may a rack hold a second.

Only unfenced brokers are offered; the caller passes them in. The first replica of a
partition is its preferred leader.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BrokerSlot:
    broker_id: int
    rack: str | None = None


class PlacementError(ValueError):
    """The request cannot be placed (too few brokers); the caller maps it to an error code."""


def place_replicas(
    brokers: Sequence[BrokerSlot],
    num_partitions: int,
    replication_factor: int,
    rng: random.Random,
) -> list[tuple[int, ...]]:
    """Replica lists for partitions 0..num_partitions-1 of a new topic."""
    if replication_factor < 1 or num_partitions < 1:
        raise PlacementError("partitions and replication factor must be at least 1")
    if replication_factor > len(brokers):
        raise PlacementError(
            f"replication factor {replication_factor} > {len(brokers)} available brokers"
        )
    ordered = sorted(brokers, key=lambda b: b.broker_id)
    racks = {b.rack for b in ordered}
    if len(racks) > 1:
        return _place_rack_aware(ordered, num_partitions, replication_factor, rng)
    ids = [b.broker_id for b in ordered]
    return _place_round_robin(ids, num_partitions, replication_factor, rng)


def _follower_order(ring: Sequence[int], first: int, shift: int) -> list[int]:
    """Indexes of every other broker, starting ``shift`` places after the leader.

    ``(shift + j) % (n - 1)`` runs over n-1 distinct values for j in 0..n-2, and the
    ``+ 1`` skips the leader's own slot, so no broker repeats.
    """
    n = len(ring)
    if n == 1:
        return []
    return [(first + 1 + (shift + j) % (n - 1)) % n for j in range(n - 1)]


def _place_round_robin(
    ids: list[int], num_partitions: int, rf: int, rng: random.Random
) -> list[tuple[int, ...]]:
    n = len(ids)
    start, shift = rng.randrange(n), rng.randrange(n)
    out: list[tuple[int, ...]] = []
    for p in range(num_partitions):
        if p > 0 and p % n == 0:
            shift += 1  # a new lap: vary follower spacing so replica pairs do not repeat
        first = (start + p) % n
        followers = _follower_order(ids, first, shift)[: rf - 1]
        out.append((ids[first], *(ids[i] for i in followers)))
    return out


def _interleave_racks(brokers: Sequence[BrokerSlot]) -> list[BrokerSlot]:
    """r1-a, r2-a, r3-a, r1-b, ...: neighbours in the ring sit on different racks."""
    by_rack: dict[str, list[BrokerSlot]] = defaultdict(list)
    for b in brokers:
        by_rack[b.rack or ""].append(b)
    lanes = [by_rack[r] for r in sorted(by_rack)]
    out: list[BrokerSlot] = []
    for i in range(max(len(lane) for lane in lanes)):
        out.extend(lane[i] for lane in lanes if i < len(lane))
    return out


def _place_rack_aware(
    brokers: Sequence[BrokerSlot], num_partitions: int, rf: int, rng: random.Random
) -> list[tuple[int, ...]]:
    ring = _interleave_racks(brokers)
    n = len(ring)
    start, shift = rng.randrange(n), rng.randrange(n)
    out: list[tuple[int, ...]] = []
    for p in range(num_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        order = [ring[i] for i in _follower_order(ring, first, shift)]
        chosen = [ring[first]]
        for b in order:  # first pass: one replica per rack
            if len(chosen) < rf and all(c.rack != b.rack for c in chosen):
                chosen.append(b)
        for b in order:  # more replicas than racks: fill up in ring order
            if len(chosen) < rf and b not in chosen:
                chosen.append(b)
        out.append(tuple(b.broker_id for b in chosen))
    return out


# ---------------------------------------------------------------------------- reassignment


@dataclass(frozen=True, slots=True)
class ReassignmentPlan:
    replicas: tuple[int, ...]  # target first, then the replicas being removed
    adding: tuple[int, ...]
    removing: tuple[int, ...]


def reassignment_plan(current: Sequence[int], target: Sequence[int]) -> ReassignmentPlan:
    """KIP-455: replicate to the union while the new replicas catch up, then drop the old."""
    adding = tuple(b for b in target if b not in current)
    removing = tuple(b for b in current if b not in target)
    return ReassignmentPlan(tuple(target) + removing, adding, removing)


def validate_assignment(
    replicas: Sequence[int], registered: Iterable[int], replication_factor: int | None = None
) -> str | None:
    """An error message for a manual assignment, or None when it is acceptable."""
    known = set(registered)
    if not replicas:
        return "a replica list is empty"
    if len(set(replicas)) != len(replicas):
        return f"duplicate brokers in {list(replicas)}"
    if replication_factor is not None and len(replicas) != replication_factor:
        return f"{list(replicas)} does not have {replication_factor} replicas"
    unknown = [b for b in replicas if b not in known]
    if unknown:
        return f"brokers {unknown} are not registered"
    return None


# ---------------------------------------------------------------------------- leaders


def preferred_leader(replicas: Sequence[int]) -> int:
    return replicas[0] if replicas else -1


def leader_imbalance(
    partitions: Iterable[tuple[Sequence[int], int]], live: Iterable[int]
) -> dict[int, float]:
    """Per live broker: the share of partitions it prefers to lead that it does not lead.

    ``partitions`` yields (replicas, leader) pairs. Kafka's
    leader.imbalance.per.broker.percentage compares this (x100) with its threshold.
    """
    preferred: Mapping[int, int] = defaultdict(int)
    not_leading: Mapping[int, int] = defaultdict(int)
    live_set = set(live)
    for replicas, leader in partitions:
        pref = preferred_leader(replicas)
        if pref not in live_set:
            continue
        preferred[pref] += 1  # type: ignore[index]
        if leader != pref:
            not_leading[pref] += 1  # type: ignore[index]
    return {b: not_leading[b] / preferred[b] for b in sorted(preferred)}
