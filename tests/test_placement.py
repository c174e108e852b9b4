"""Replica placement: balance, rack awareness, determinism; reassignment and leader helpers."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rillet.controller.metadata.placement import (
    BrokerSlot,
    PlacementError,
    leader_imbalance,
    place_replicas,
    reassignment_plan,
    validate_assignment,
)


def brokers(n: int, racks: int = 0) -> list[BrokerSlot]:
    return [BrokerSlot(i, f"rack-{i % racks}" if racks else None) for i in range(n)]


def test_leaders_and_replicas_spread_evenly_across_brokers() -> None:
    placed = place_replicas(brokers(5), 50, 3, random.Random(1))
    leaders = Counter(r[0] for r in placed)
    replicas = Counter(b for r in placed for b in r)
    assert set(leaders.values()) == {10}
    assert set(replicas.values()) == {30}


def test_every_partition_has_distinct_replicas_and_the_asked_factor() -> None:
    for n, rf in [(1, 1), (2, 2), (3, 3), (7, 3), (4, 4)]:
        for r in place_replicas(brokers(n), 23, rf, random.Random(n)):
            assert len(r) == rf and len(set(r)) == rf


def test_follower_pairs_vary_between_laps_so_one_broker_loss_spreads_load() -> None:
    placed = place_replicas(brokers(4), 16, 2, random.Random(3))
    followers_of_0 = {r[1] for r in placed if r[0] == 0}
    assert len(followers_of_0) > 1


def test_same_seed_same_placement_and_different_seeds_vary_the_start() -> None:
    a = place_replicas(brokers(6), 12, 3, random.Random(42))
    b = place_replicas(brokers(6), 12, 3, random.Random(42))
    assert a == b
    starts = {place_replicas(brokers(6), 1, 1, random.Random(s))[0][0] for s in range(30)}
    assert len(starts) > 3


def test_rack_aware_placement_puts_each_replica_on_its_own_rack() -> None:
    bs = brokers(6, racks=3)
    rack_of = {b.broker_id: b.rack for b in bs}
    placed = place_replicas(bs, 60, 3, random.Random(5))
    for r in placed:
        assert len({rack_of[b] for b in r}) == 3
    assert set(Counter(r[0] for r in placed).values()) == {10}
    assert set(Counter(b for r in placed for b in r).values()) == {30}


def test_more_replicas_than_racks_covers_every_rack_first() -> None:
    bs = brokers(6, racks=2)
    rack_of = {b.broker_id: b.rack for b in bs}
    for r in place_replicas(bs, 30, 3, random.Random(9)):
        assert len({rack_of[b] for b in r}) == 2
        assert len(set(r)) == 3


def test_uneven_racks_still_span_racks_where_possible() -> None:
    bs = [BrokerSlot(0, "a"), BrokerSlot(1, "a"), BrokerSlot(2, "a"), BrokerSlot(3, "b")]
    for r in place_replicas(bs, 20, 2, random.Random(2)):
        assert {bs[b].rack for b in r} == {"a", "b"}


def test_replication_factor_above_broker_count_is_refused() -> None:
    with pytest.raises(PlacementError):
        place_replicas(brokers(2), 3, 3, random.Random(0))
    with pytest.raises(PlacementError):
        place_replicas(brokers(2), 0, 1, random.Random(0))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 9),
    racks=st.integers(0, 4),
    partitions=st.integers(1, 40),
    data=st.data(),
)
def test_placement_properties_hold_for_any_cluster(
    n: int, racks: int, partitions: int, data: st.DataObject
) -> None:
    rf = data.draw(st.integers(1, n))
    bs = brokers(n, racks)
    placed = place_replicas(bs, partitions, rf, random.Random(data.draw(st.integers(0, 99))))
    assert len(placed) == partitions
    rack_count = len({b.rack for b in bs})
    leaders = Counter(r[0] for r in placed)
    for r in placed:
        assert len(set(r)) == rf
        assert len({bs[b].rack for b in r}) == min(rf, rack_count)
    assert max(leaders.values()) - min(leaders.get(b.broker_id, 0) for b in bs) <= 1


def test_reassignment_plan_replicates_to_the_union_then_drops_the_old() -> None:
    plan = reassignment_plan([1, 2, 3], [3, 4, 5])
    assert plan.replicas == (3, 4, 5, 1, 2)
    assert plan.adding == (4, 5)
    assert plan.removing == (1, 2)
    same = reassignment_plan([1, 2], [2, 1])
    assert (same.replicas, same.adding, same.removing) == ((2, 1), (), ())


def test_manual_assignment_validation_names_the_problem() -> None:
    assert validate_assignment([1, 2], [1, 2, 3]) is None
    assert "duplicate" in (validate_assignment([1, 1], [1]) or "")
    assert "not registered" in (validate_assignment([1, 9], [1, 2]) or "")
    assert "replicas" in (validate_assignment([1], [1, 2], replication_factor=2) or "")
    assert "empty" in (validate_assignment([], [1]) or "")


def test_leader_imbalance_counts_preferred_partitions_not_led() -> None:
    parts = [((1, 2), 1), ((1, 2), 2), ((2, 1), 2), ((3, 1), 1)]
    ratios = leader_imbalance(parts, live=[1, 2])
    assert ratios == {1: 0.5, 2: 0.0}  # broker 3 is not live: not counted
