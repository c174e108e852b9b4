"""Leader election and ISR rules: pure functions from a partition to the change it needs.

``eligible(b)`` says whether broker b may lead or join an ISR right now: registered,
unfenced and not in controlled shutdown (the controller builds it from the image and its
in-memory state). The rules, as Kafka's without ELR:

- A new leader comes from the ISR only, in replica order (so the preferred leader wins
  when it is eligible), unless the topic enables unclean.leader.election; then, with no
  eligible ISR member, the first eligible replica leads and the ISR becomes just it.
- Removing brokers from a partition (fencing, controlled shutdown, unregistering) never
  empties its ISR: the last member stays, so that replica (which holds every committed
  record) can lead again when it comes back. With no eligible ISR member the leader is
  NO_LEADER (-1): the partition is offline.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from rillet.controller.metadata.image import (
    NO_LEADER,
    NO_LEADER_CHANGE,
    Partition,
    PartitionChange,
)

Eligible = Callable[[int], bool]


def choose_leader(p: Partition, isr: tuple[int, ...], eligible: Eligible) -> int:
    """The first replica, in replica order, that is in ``isr`` and eligible."""
    for r in p.replicas:
        if r in isr and eligible(r):
            return r
    return NO_LEADER


def change_of(
    p: Partition,
    leader: int | None = None,
    isr: tuple[int, ...] | None = None,
    replicas: tuple[int, ...] | None = None,
    adding: tuple[int, ...] | None = None,
    removing: tuple[int, ...] | None = None,
) -> PartitionChange | None:
    """A PartitionChange holding only the fields that differ from ``p``; None if none do."""
    lead = NO_LEADER_CHANGE if leader is None or leader == p.leader else leader
    new_isr = None if isr is None or isr == p.isr else isr
    new_replicas = None if replicas is None or replicas == p.replicas else replicas
    new_adding = None if adding is None or adding == p.adding_replicas else adding
    new_removing = None if removing is None or removing == p.removing_replicas else removing
    if (lead, new_isr, new_replicas, new_adding, new_removing) == (
        NO_LEADER_CHANGE,
        None,
        None,
        None,
        None,
    ):
        return None
    return PartitionChange(
        p.topic_id, p.partition, lead, new_isr, new_replicas, new_adding, new_removing
    )


def remove_brokers(
    p: Partition, gone: Collection[int], eligible: Eligible, unclean: bool
) -> PartitionChange | None:
    """Move leadership off ``gone`` brokers and shrink them out of the ISR."""
    if p.leader not in gone and not any(b in gone for b in p.isr):
        return None
    isr = tuple(b for b in p.isr if b not in gone)
    if not isr:  # never empty: keep the leader (or the last member) as the ISR
        isr = (p.leader,) if p.leader in p.isr else p.isr[-1:]
    leader = p.leader
    if leader in gone or leader == NO_LEADER:
        leader = choose_leader(p, isr, lambda b: b not in gone and eligible(b))
    if leader == NO_LEADER and unclean:
        leader, isr = unclean_choice(p, lambda b: b not in gone and eligible(b), isr)
    return change_of(p, leader=leader, isr=isr)


def unclean_choice(
    p: Partition, eligible: Eligible, isr: tuple[int, ...]
) -> tuple[int, tuple[int, ...]]:
    """(leader, isr) of an unclean election: any eligible replica, alone in the ISR."""
    for r in p.replicas:
        if eligible(r):
            return r, (r,)
    return NO_LEADER, isr


def elect_offline(p: Partition, eligible: Eligible, unclean: bool) -> PartitionChange | None:
    """A leader for an offline partition, if an eligible ISR member (or replica) exists."""
    if p.leader != NO_LEADER:
        return None
    leader = choose_leader(p, p.isr, eligible)
    isr = p.isr
    if leader == NO_LEADER and unclean:
        leader, isr = unclean_choice(p, eligible, isr)
    if leader == NO_LEADER:
        return None
    return change_of(p, leader=leader, isr=isr)


def elect_preferred(p: Partition, eligible: Eligible) -> PartitionChange | None:
    """Make the first replica leader, if it is in the ISR and eligible and not leading."""
    pref = p.replicas[0]
    if p.leader == pref or pref not in p.isr or not eligible(pref):
        return None
    return change_of(p, leader=pref)


def complete_reassignment(p: Partition, eligible: Eligible) -> PartitionChange | None:
    """Finish a reassignment once every target replica is in the ISR (KIP-455)."""
    if not p.is_reassigning:
        return None
    target = tuple(r for r in p.replicas if r not in p.removing_replicas)
    if not all(r in p.isr for r in target):
        return None
    isr = tuple(r for r in p.isr if r in target)
    leader = p.leader
    if leader not in target:
        leader = choose_leader(p, isr, eligible)
    return change_of(p, leader=leader, isr=isr, replicas=target, adding=(), removing=())
