"""The leader proposes no ISR expansion for a broker its metadata shows fenced (Kafka's
isReplicaIsrEligible): a restarted follower fetches before the controller unfences it,
and proposing it anyway costs one refused AlterPartition per fetch."""

from __future__ import annotations

from test_replication_fakes import FakeLog, Replica

from rillet.broker.replication.partition_state import PartitionState
from rillet.broker.replication.types import ReplicationConfig


def test_fenced_follower_is_not_proposed_until_eligible() -> None:
    fenced = {2}
    leader = Replica(1)
    leader.state = PartitionState(
        1, leader.log, ReplicationConfig(30_000), is_isr_eligible=lambda b: b not in fenced
    )
    follower = Replica(2)
    leader.apply(leader.state.become_leader(0, 0, (1, 2), (1,), now_ms=0))
    follower.apply(follower.state.become_follower(1, 0, 0, (1, 2), (1,)))
    leader.append(["a", "b"])
    follower.fetch_from(leader, now_ms=10)
    follower.fetch_from(leader, now_ms=20)  # caught up, but fenced: no proposal
    assert leader.proposals == []
    fenced.clear()
    follower.fetch_from(leader, now_ms=30)
    assert [p.new_isr for p in leader.proposals] == [(1, 2)]


def test_default_is_every_replica_eligible() -> None:
    state = PartitionState(1, FakeLog())
    assert state.pending_isr_change is None  # constructed without a check, as before
