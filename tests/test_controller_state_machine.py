"""The controller state machine under the shared Raft driver, scenarios driven by hand."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from rillet.client.wire.errors import NotControllerError
from rillet.controller.metadata.describe import cluster_id_of
from rillet.controller.metadata.image import (
    MetadataImage,
    MetadataInvariantError,
    PartitionChange,
    decode_snapshot,
    encode_records,
    encode_snapshot,
)
from rillet.controller.metadata.quorum import ControllerConfig
from rillet.controller.raft.core import (
    AppendRequest,
    Message,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    Snapshot,
)
from rillet.controller.raft.driver import RaftDriver
from rillet.controller.state_machine import (
    ControllerStateMachine,
    SnapshotEncoder,
    SnapshotPolicy,
    encode_at_once,
)

T_MS = 1000


class Storage:
    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def persist_ready(self, ready: Ready) -> None:
        pass

    def save_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)


class Quorum:
    """Three controllers; messages are delivered at once unless a link is blocked."""

    def __init__(
        self,
        snapshot_policy: SnapshotPolicy = SnapshotPolicy(),
        snapshot_encoder: SnapshotEncoder = encode_at_once,
    ) -> None:
        ids = (1, 2, 3)
        self.now_ms = 0
        self.queue: list[Message] = []
        self.blocked: set[tuple[int, int]] = set()
        self.cluster_ids: dict[int, str] = {}
        self.nodes: dict[int, RaftNode] = {}
        self.machines: dict[int, ControllerStateMachine] = {}
        self.storages: dict[int, Storage] = {}
        self.drivers: dict[int, RaftDriver] = {}
        for i in ids:
            node = RaftNode(RaftConfig(node_id=i, voters=ids), rng=random.Random(i), now_ms=0)
            machine = ControllerStateMachine(
                i,
                ControllerConfig(),
                snapshot_policy,
                new_cluster_id=lambda: "the-cluster",
                rng=random.Random(i),
                on_cluster_id=lambda cid, i=i: self.cluster_ids.__setitem__(i, cid),
                snapshot_encoder=snapshot_encoder,
            )
            self.storages[i] = Storage()
            driver = RaftDriver(node, self.storages[i], self, machine, lambda: self.now_ms)
            machine.bind(node, driver.propose)
            self.nodes[i], self.machines[i], self.drivers[i] = node, machine, driver

    def send(self, msg: Message) -> None:
        self.queue.append(msg)

    def deliver(self) -> None:
        for _ in range(10_000):
            for driver in self.drivers.values():
                driver.process_ready()
            if not self.queue:
                return
            msg = self.queue.pop(0)
            if (msg.src, msg.dst) not in self.blocked:
                self.drivers[msg.dst].step(msg)
        raise AssertionError("messages did not settle")

    def run(self, duration_ms: int) -> None:
        end_ms = self.now_ms + duration_ms
        while self.now_ms < end_ms:
            self.now_ms += 10
            for driver in self.drivers.values():
                driver.tick()
            self.deliver()

    def elect(self, node_id: int) -> None:
        self.now_ms = max(self.now_ms, T_MS)
        for other, node in self.nodes.items():
            node.election_deadline_ms = self.now_ms + (0 if other == node_id else 2 * T_MS)
        self.run(10)
        assert self.nodes[node_id].role is Role.LEADER

    def isolate(self, node_id: int) -> None:
        for other in self.nodes:
            if other != node_id:
                self.blocked |= {(node_id, other), (other, node_id)}


def register(machine: ControllerStateMachine, broker_id: int) -> list[object]:
    assert machine.ctl is not None
    records, _ = machine.ctl.register_broker(
        machine.images.pending, broker_id, f"inc-{broker_id}", [("B", "h", 1)], None, 0
    )
    return records


def test_first_active_controller_writes_the_cluster_id_and_everyone_learns_it() -> None:
    q = Quorum()
    q.elect(1)
    q.run(100)
    assert q.machines[1].active and not q.machines[2].active
    assert q.cluster_ids == {1: "the-cluster", 2: "the-cluster", 3: "the-cluster"}
    assert all(cluster_id_of(m.image) == "the-cluster" for m in q.machines.values())


def test_a_proposal_is_answered_when_it_commits_and_replicas_apply_it() -> None:
    q = Quorum()
    q.elect(1)
    q.run(100)
    outcomes: list[Exception | None] = []
    index = q.machines[1].propose(register(q.machines[1], 7), outcomes.append)
    assert q.machines[1].images.pending.brokers.keys() == {7}
    q.run(100)
    assert outcomes == [None]
    assert all(m.image.offset >= index and 7 in m.image.brokers for m in q.machines.values())


def test_losing_leadership_fails_waiters_and_drops_uncommitted_proposals() -> None:
    q = Quorum()
    q.elect(1)
    q.run(100)
    old = q.machines[1]
    q.isolate(1)
    outcomes: list[Exception | None] = []
    old.propose(register(old, 7), outcomes.append)
    q.run(3 * T_MS)
    assert not old.active and old.ctl is None
    assert len(outcomes) == 1 and isinstance(outcomes[0], NotControllerError)
    assert old.images.pending == old.images.committed and 7 not in old.images.pending.brokers
    with pytest.raises(NotControllerError):
        old.propose([])


def test_a_new_leader_is_active_only_after_applying_its_term_start() -> None:
    q = Quorum()
    q.elect(1)
    q.run(100)
    q.isolate(1)
    q.run(3 * T_MS)
    new = next(i for i in (2, 3) if q.nodes[i].role is Role.LEADER)
    assert q.machines[new].active
    assert q.nodes[new].applied_index >= q.nodes[new].term_start_index
    assert q.machines[new].ctl is not q.machines[1].ctl


def test_a_transfer_begun_before_the_term_start_applied_leaves_it_inactive() -> None:
    """The cluster id proposal would raise NotLeader inside the driver: stay inactive."""
    q = Quorum()
    q.now_ms = T_MS + 10
    for other, node in q.nodes.items():
        node.election_deadline_ms = q.now_ms + (0 if other == 1 else 2 * T_MS)
    for driver in q.drivers.values():
        driver.tick()
    while q.nodes[1].role is not Role.LEADER:  # votes only: the no-op is not yet applied
        q.drivers[1].process_ready()
        msg = q.queue.pop(0)
        q.drivers[msg.dst].step(msg)
        q.drivers[msg.dst].process_ready()
    q.nodes[1].transfer_leadership(2)
    q.deliver()  # raises if the driver fails
    assert not q.machines[1].active
    q.run(100)
    assert q.nodes[2].role is Role.LEADER and q.machines[2].active
    assert q.cluster_ids[1] == "the-cluster"


def test_snapshot_after_the_record_threshold_holds_the_committed_image() -> None:
    q = Quorum(SnapshotPolicy(max_records=3))
    q.elect(1)
    q.run(100)
    for broker in (7, 8, 9):
        q.machines[1].propose(register(q.machines[1], broker))
        q.run(20)
    (snapshot, *_) = q.storages[1].snapshots
    image = decode_snapshot(snapshot.data)
    assert image.offset == snapshot.index and set(image.brokers) <= {7, 8, 9}
    assert q.nodes[1].log.snapshot_index == snapshot.index


def test_a_snapshot_encoded_later_is_taken_then_and_raft_goes_on_meanwhile() -> None:
    """The server encodes on a worker thread: until the bytes are back the node keeps
    committing and applying, and then compacts to the image it asked to encode, not to
    the newer one it has by then."""
    asked: list[tuple[MetadataImage, Callable[[bytes | None], None]]] = []
    q = Quorum(SnapshotPolicy(max_records=3), lambda image, done: asked.append((image, done)))
    q.elect(1)
    q.run(100)
    for broker in (7, 8, 9):
        q.machines[1].propose(register(q.machines[1], broker))
        q.run(20)
    assert asked and not q.storages[1].snapshots
    first = len(asked)
    outcomes: list[Exception | None] = []
    q.machines[1].propose(register(q.machines[1], 10), outcomes.append)
    q.run(20)
    assert outcomes == [None] and not q.storages[1].snapshots  # applied, no snapshot yet
    assert len(asked) == first  # one encoding at a time per controller
    for image, done in asked:  # every controller's encoding finishes now
        done(encode_snapshot(image))
    q.run(20)
    (snapshot,) = q.storages[1].snapshots
    encoded_offsets = {image.offset for image, _ in asked}
    assert snapshot.index in encoded_offsets and snapshot.index < q.machines[1].image.offset
    assert decode_snapshot(snapshot.data).offset == snapshot.index
    assert q.nodes[1].log.snapshot_index == snapshot.index


def test_snapshots_wait_until_the_entries_since_outweigh_the_last_one() -> None:
    """A snapshot costs work in proportion to the image; with an image of thousands of
    partitions, one every ``max_records`` records snapshotted several times a second."""
    q = Quorum(SnapshotPolicy(max_records=1))
    q.elect(1)
    q.run(100)
    big: list[object] = []
    for broker in range(100, 400):
        big += register(q.machines[1], broker)
    q.machines[1].propose(big)  # type: ignore[arg-type]
    q.run(20)
    taken = len(q.storages[1].snapshots)
    first = q.storages[1].snapshots[-1]
    assert 399 in decode_snapshot(first.data).brokers
    applied = 0
    broker = 1000
    while len(q.storages[1].snapshots) == taken:
        records = register(q.machines[1], broker)
        q.machines[1].propose(records)  # type: ignore[arg-type]
        q.run(20)
        applied += len(encode_records(records))  # type: ignore[arg-type]
        broker += 1
        assert broker < 10_000, "no second snapshot"
    assert broker - 1000 > 1  # max_records alone would have taken one at once
    assert applied >= len(first.data)


def test_tick_fences_a_silent_broker_on_the_active_controller_only() -> None:
    q = Quorum()
    q.elect(1)
    q.run(100)
    active = q.machines[1]
    active.propose(register(active, 7))
    q.run(200)
    assert active.ctl is not None
    epoch = active.image.brokers[7].broker_epoch
    records, _ = active.ctl.broker_heartbeat(
        active.images.pending, 7, epoch, active.image.offset, False, False, 0
    )
    active.propose(records)
    q.run(200)
    assert not q.machines[3].image.brokers[7].fenced
    q.machines[2].tick(10**9)  # a follower has no sessions to expire
    q.run(200)
    assert not q.machines[3].image.brokers[7].fenced
    active.tick(10**9)
    q.run(200)
    assert q.machines[3].image.brokers[7].fenced


def test_a_step_down_and_the_new_leaders_commits_in_one_ready_drop_the_old_proposals() -> None:
    """Inputs batched between two Readies (during a slow fsync, or when a stalled event
    loop runs again) can depose a leader and commit the new leader's entries at once.
    Its proposals of the old term must go before those entries apply: replayed over
    them, the unregistration of a broker whose registration was replaced broke the
    image (MetadataInvariantError in apply(), stopping the controller)."""
    q = Quorum()
    q.elect(1)
    q.run(100)
    old = q.machines[1]
    q.isolate(1)
    first = old.propose(register(old, 7))
    assert old.ctl is not None
    old.propose(old.ctl.unregister_broker(old.images.pending, 7)[0])
    q.drivers[1].process_ready()
    # 2 leads term 2 and commits its no-op at `first`; 1 is never ticked meanwhile.
    q.now_ms += 2 * T_MS
    q.nodes[2].election_deadline_ms = q.now_ms
    q.nodes[3].election_deadline_ms = q.now_ms + 2 * T_MS
    for _ in range(20):
        q.now_ms += 10
        q.drivers[2].tick()
        q.drivers[3].tick()
        q.deliver()
    new = q.nodes[2]
    assert new.role is Role.LEADER and new.term == 2 and new.commit_index >= first
    assert q.nodes[1].role is Role.LEADER and old.active
    q.nodes[1].step(
        AppendRequest(
            term=2,
            src=2,
            dst=1,
            prev_index=first - 1,
            prev_term=new.log.term(first - 1) or 0,
            entries=new.log.entries_between(first, new.commit_index),
            commit=new.commit_index,
            sent_ms=q.now_ms,
        )
    )
    q.drivers[1].process_ready()  # raised MetadataInvariantError in apply()
    assert not old.active and q.nodes[1].commit_index == new.commit_index
    assert old.images.pending == old.image and 7 not in old.image.brokers


def test_records_that_do_not_apply_never_reach_the_log() -> None:
    """An operation computed on a pending image that another one changed meanwhile (two
    brokers' controlled shutdowns, whose moves are proposed an entry per loop turn) can
    hold a change that does not apply. It used to be appended to the Raft log first:
    every controller then failed applying it, on every restart too."""
    q = Quorum()
    q.elect(1)
    q.run(100)
    active = q.machines[1]
    last = q.nodes[1].log.last_index()
    with pytest.raises(MetadataInvariantError):
        active.propose([PartitionChange("no-such-topic", 0, isr=(1,))])
    assert q.nodes[1].log.last_index() == last and active.images.pending == active.image
    active.propose(register(active, 7))  # the controller goes on
    q.run(100)
    assert all(7 in m.image.brokers for m in q.machines.values())
