"""Raft controller nodes as actors of the simulation, with invariants checked after every event.

Each `RaftActor` runs the production pieces: the shared `RaftDriver` around a real
`RaftNode`, applying to a real `ControllerStateMachine`, so proposals are metadata
records (brokers, topics, partitions, configs, the cluster id) and the checkers compare
metadata images. The actor itself is the driver's storage (a simulated durable store),
network (the seeded `SimNetwork`) and a checking wrapper of the state machine. A crash
throws away node, state machine and driver; a restart rebuilds them from the durable
store only, so anything the driver did not persist from a Ready is lost, as after kill -9.

The actor schedules the driver's Ready loop as `AsyncRaftLoop` does: a write may take
simulated time (a slow disk), and inputs that arrive meanwhile reach the core at once and
show in the next Ready. Its event loop may also stall (a long CPU task): it handles
nothing until the stall ends, then everything that queued up, then runs the Ready loop.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

import msgpack

from rillet.client.wire.errors import NotControllerError
from rillet.controller.metadata.image import (
    RESOURCE_BROKER,
    Config,
    MetadataImage,
    MetadataRecord,
    decode_snapshot,
    encode_snapshot,
)
from rillet.controller.metadata.quorum import ControllerConfig
from rillet.controller.raft.core import (
    AppendRequest,
    AppendResponse,
    Entry,
    HardState,
    Message,
    PreVoteRequest,
    PreVoteResponse,
    RaftConfig,
    RaftError,
    RaftEvent,
    RaftNode,
    Ready,
    Role,
    Snapshot,
    StorageState,
    VoteRequest,
    VoteResponse,
    message_from_dict,
)
from rillet.controller.raft.driver import BlockingWrite, RaftDriver, ReadyStep
from rillet.controller.state_machine import ControllerStateMachine, SnapshotPolicy, encode_at_once

from .network import LinkFaults, SimNetwork
from .scheduler import Scheduler, SimClock
from .trace import Trace

_LOST_STORAGE = re.compile(r"storage (\d+) that acknowledged")
REPLAY_COMMAND = "RILLET_SIM_SEED={seed} .venv/bin/pytest tests/test_raft_sim.py -k replay -s"
MAX_READIES_PER_RUN = 1000  # a Ready loop that does not settle is a bug of the core


class SimulationFailure(AssertionError):
    """An invariant broke; the message carries the seed's replay command and a trace."""


class SimCrash(Exception):
    """The simulated process dies in the middle of a Ready (raised by its own store)."""


# ---------------------------------------------------------------------------
# Durable store of one simulated node


@dataclass(slots=True)
class SimDurableStore:
    """What survives a crash: only what the driver persisted from Ready (or compact())."""

    hard_state: HardState = HardState()
    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)
    storage_id: int = 0  # a wiped disk comes back with a new one

    def snapshot_index(self) -> int:
        return self.snapshot.index if self.snapshot else 0

    def last_index(self) -> int:
        return self.entries[-1].index if self.entries else self.snapshot_index()

    def term(self, index: int) -> int | None:
        if self.snapshot is not None and index == self.snapshot.index:
            return self.snapshot.term
        first = self.snapshot_index() + 1
        if first <= index <= self.last_index():
            return self.entries[index - first].term
        return 0 if index == 0 else None

    def persist(self, ready: Ready, write_hard_state: bool) -> None:
        if ready.snapshot is not None:
            self.snapshot = ready.snapshot
            self.entries.clear()
        if ready.entries:
            first = ready.entries[0].index
            self.entries = [e for e in self.entries if e.index < first]
            if first != self.last_index() + 1:
                raise SimulationFailure(
                    f"Ready entries start at {first} but the store ends at {self.last_index()}"
                )
            self.entries.extend(ready.entries)
        if ready.hard_state is not None and write_hard_state:
            self.hard_state = ready.hard_state

    def save_snapshot(self, snapshot: Snapshot) -> None:
        if snapshot.index > self.snapshot_index():
            self.snapshot = snapshot
            self.entries = [e for e in self.entries if e.index > snapshot.index]

    def load(self) -> StorageState:
        return StorageState(self.hard_state, self.snapshot, tuple(self.entries), self.storage_id)


# ---------------------------------------------------------------------------
# Invariants shared by the whole cluster


class RaftInvariants:
    """Everything any node ever persisted, committed or applied, checked against the rest."""

    def __init__(self, fail: Callable[[str], None]) -> None:
        self.fail = fail
        self.leader_of_term: dict[int, int] = {}
        self.entry_by_key: dict[tuple[int, int], tuple[int, bytes, int | None]] = {}
        self.committed: dict[int, Entry] = {}
        self.commit_term: dict[int, int] = {}  # index -> the term it was committed in
        self.image_at: dict[int, MetadataImage] = {}
        self.snapshot_at: dict[int, bytes] = {}
        self.cluster_id: str | None = None
        self.checked_leaders: set[tuple[int, int]] = set()
        self.wiped_storage_ids: set[int] = set()

    def on_persist(self, node_id: int, ready: Ready, durable: SimDurableStore) -> None:
        """Log matching: one (index, term) names one payload and one previous term (the
        term of the entry before it in the store the Ready is written to; the node's log
        may have moved on while the write was in flight)."""
        prev_term = durable.term(ready.entries[0].index - 1) if ready.entries else None
        if ready.snapshot is not None:
            prev_term = ready.snapshot.term
        for entry in ready.entries:
            value = (int(entry.kind), entry.data, prev_term)
            seen = self.entry_by_key.setdefault((entry.index, entry.term), value)
            if seen != value:
                self.fail(
                    f"log matching: node {node_id} persists entry {entry.index} "
                    f"term {entry.term} as {value!r}, another node had {seen!r}"
                )
            prev_term = entry.term

    def on_commit(self, node_id: int, entry: Entry, term: int) -> None:
        """``node_id``, in ``term``, holds ``entry`` as committed. The least such term is
        the term it was committed in (the leader that commits sees it first)."""
        self.commit_term[entry.index] = min(term, self.commit_term.get(entry.index, term))
        seen = self.committed.setdefault(entry.index, entry)
        if seen != entry:
            self.fail(
                f"committed entry changed: node {node_id} has {entry} at "
                f"{entry.index}, committed earlier as {seen}"
            )

    def on_image(self, node_id: int, image: MetadataImage) -> None:
        """Replicas that applied the same offset hold the same metadata image."""
        seen = self.image_at.setdefault(image.offset, image)
        if seen != image:
            self.fail(
                f"metadata images diverge: node {node_id} at offset {image.offset}:\n"
                f"{image}\nearlier: {seen}"
            )

    def on_snapshot(self, node_id: int, snapshot: Snapshot) -> None:
        """Snapshots of one offset are the same bytes, and hold the image of that offset."""
        seen = self.snapshot_at.setdefault(snapshot.index, snapshot.data)
        if seen != snapshot.data:
            self.fail(f"node {node_id}: snapshot at {snapshot.index} differs from another's")
        image = decode_snapshot(snapshot.data)
        if image.offset != snapshot.index:
            self.fail(f"snapshot at {snapshot.index} holds the image of offset {image.offset}")
        self.on_image(node_id, image)

    def on_cluster_id(self, node_id: int, cluster_id: str) -> None:
        if self.cluster_id is None:
            self.cluster_id = cluster_id
        elif cluster_id != self.cluster_id:
            self.fail(f"node {node_id} learns cluster id {cluster_id}, not {self.cluster_id}")

    def on_lost_state(self, leader_id: int, text: str) -> None:
        """A leader decides a follower's log is gone only when its disk was wiped: the
        storage it names as replaced was. (Request send times once decided it: a
        rejection reordered behind an acknowledgement looked like a lost log.)"""
        found = _LOST_STORAGE.search(text)
        if found is None:
            self.fail(f"leader {leader_id}: unparsed follower_lost_state event: {text}")
        elif int(found.group(1)) not in self.wiped_storage_ids:
            self.fail(
                f"leader {leader_id} thinks a follower lost its log, no disk was wiped: {text}"
            )

    def check_leader(self, node: RaftNode) -> None:
        term = node.term
        first = self.leader_of_term.setdefault(term, node.node_id)
        if first != node.node_id:
            self.fail(f"two leaders in term {term}: {first} and {node.node_id}")
        if (term, node.node_id) in self.checked_leaders:
            return
        self.checked_leaders.add((term, node.node_id))
        # Raft's leader completeness: what was committed in an earlier term. A leader of
        # an older term may lack what a newer one committed: a node paused mid-election
        # that then handles a vote granted before the newer term began wins its term.
        for index, entry in self.committed.items():
            if self.commit_term[index] >= term:
                continue
            if index > node.log.snapshot_index and node.log.term(index) != entry.term:
                self.fail(
                    f"leader completeness: new leader {node.node_id} of term {term} "
                    f"lacks committed entry {index} (term {entry.term})"
                )

    def check_lease(self, node: RaftNode, now_ms: int) -> None:
        if not node.is_leader_with_lease(now_ms):
            return
        newest = max(self.leader_of_term)
        if newest > node.term:
            self.fail(
                f"lease: node {node.node_id} claims a lease in term {node.term} while "
                f"{self.leader_of_term[newest]} leads term {newest}"
            )


# ---------------------------------------------------------------------------
# One simulated controller: the production driver and state machine, simulated I/O


class RaftHost(Protocol):
    """What a `RaftActor` needs of the simulation around it (a `RaftCluster`, or the
    controller quorum of the replication simulation)."""

    options: SimOptions
    rng: random.Random
    clock: SimClock
    scheduler: Scheduler
    network: SimNetwork
    trace: Trace
    invariants: RaftInvariants

    def fail(self, text: str) -> NoReturn: ...

    def maybe_crash_after_persist(self, actor: RaftActor, ready: Ready) -> bool: ...


class RaftActor:
    """A controller node. For its `RaftDriver` it is the storage, the network and a
    checking wrapper of the `ControllerStateMachine`. ``clock`` is the node's own clock
    (the simulated time by default)."""

    def __init__(
        self,
        cluster: RaftHost,
        node_id: int,
        voters: tuple[int, ...],
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.actor_id = node_id
        self.cluster = cluster
        sim_clock = cluster.clock
        self.clock: Callable[[], int] = clock or (lambda: sim_clock.now_ms)
        self.config = RaftConfig(
            node_id=node_id,
            voters=voters,
            election_timeout_ms=cluster.options.election_timeout_ms,
            heartbeat_interval_ms=cluster.options.heartbeat_interval_ms,
            max_clock_drift_ms=cluster.options.max_clock_drift_ms,
            max_entries_per_append=cluster.options.max_entries_per_append,
            prevote_on_leader_loss=cluster.options.refusals,
        )
        self.wipes = 0
        self.durable = SimDurableStore(storage_id=self.new_storage_id())
        self.node: RaftNode | None = None
        self.machine: ControllerStateMachine | None = None
        self.driver: RaftDriver | None = None
        self.incarnation = 0
        self.seen_term = 0
        self.seen_commit = 0
        self.readies = 0
        self.writing = False  # a blocking write of the Ready loop is in flight
        self.stalled_until = 0  # the event loop runs nothing before then
        self.backlog: list[Callable[[], None]] = []  # what arrived while it stalled
        self.tick_overdue = False  # the tick timer fired while it stalled
        self.draining = False  # handling the backlog: the Ready loop waits until done
        # Snapshot encoding latency: its own stream, so pinned seeds replay as before.
        self.encode_rng = random.Random((cluster.options.seed << 8) ^ node_id)
        self.refusal_rng = random.Random((cluster.options.seed << 9) ^ node_id)

    # -- lifecycle ------------------------------------------------------

    def start(self) -> None:
        cluster = self.cluster
        self.incarnation += 1
        self.reset_loop()
        state = self.durable.load()
        rng = random.Random(cluster.rng.getrandbits(64))
        self.node = RaftNode(self.config, state, rng=rng, now_ms=self.clock())
        self.machine = ControllerStateMachine(
            self.actor_id,
            cluster.options.controller_config,
            SnapshotPolicy(max_records=cluster.options.snapshot_every_records),
            new_cluster_id=lambda: f"sim-{cluster.options.seed}",
            rng=random.Random(cluster.rng.getrandbits(64)),
            on_applied=self.on_applied,
            on_cluster_id=lambda cid: cluster.invariants.on_cluster_id(self.actor_id, cid),
            snapshot_encoder=self.encode_later
            if cluster.options.snapshot_encode_ms != (0, 0)
            else encode_at_once,
        )
        self.machine.restore(state.snapshot)
        self.driver = RaftDriver(self.node, self, self, self, self.clock, on_event=self.on_event)
        self.machine.bind(self.node, self.driver.propose)
        if state.snapshot is not None:
            cluster.invariants.on_image(self.actor_id, self.machine.image)
        self.seen_term = self.node.term
        self.seen_commit = self.node.commit_index
        cluster.trace.add(
            cluster.clock.now_ms,
            f"node {self.actor_id} starts (incarnation {self.incarnation}): {self.node.status()}",
        )
        self.schedule_tick()
        self.run_ready()

    def encode_later(self, image: MetadataImage, done: Callable[[bytes | None], None]) -> None:
        """As the server's worker thread: the bytes come back on the event loop some time
        later, while Raft goes on (and may install a newer snapshot meanwhile)."""
        data = encode_snapshot(image)
        lo, hi = self.cluster.options.snapshot_encode_ms
        incarnation = self.incarnation

        def finish() -> None:
            if incarnation != self.incarnation or self.driver is None:
                return  # the process died: its worker thread with it

            def hand_over() -> None:
                done(data)
                self.run_ready()

            self.on_loop(hand_over)

        self.cluster.scheduler.after(
            self.encode_rng.randint(lo, hi), finish, f"snapshot encoded {self.actor_id}"
        )

    def new_storage_id(self) -> int:
        """Unique per node and wipe, and drawn from no random stream."""
        return 1000 * self.actor_id + self.wipes + 1

    def wipe(self) -> None:
        """The crashed node's disk is wiped (or replaced): it restarts empty, as at the
        cluster's first start, on a storage with a new id."""
        assert self.node is None, "wipe a crashed node only"
        self.cluster.invariants.wiped_storage_ids.add(self.durable.storage_id)
        self.wipes += 1
        self.durable = SimDurableStore(storage_id=self.new_storage_id())
        self.cluster.trace.add(
            self.cluster.clock.now_ms,
            f"node {self.actor_id}: disk wiped, new storage {self.durable.storage_id}",
        )

    def crash(self, why: str) -> None:
        if self.node is None:
            return
        self.cluster.trace.add(self.cluster.clock.now_ms, f"node {self.actor_id} crashes ({why})")
        self.node = self.machine = self.driver = None
        self.reset_loop()
        self.refuse_connections()

    def refuse_connections(self) -> None:
        """The process is gone, so its address refuses connections: each voter's
        transport notices a little later (the connection closes, the reconnect is
        refused) and tells its driver (`peer_unreachable`), unless the link is cut (a
        cut link times out instead of refusing) or the node restarted meanwhile. The
        delays come from a stream of their own, so the other choices of a pinned seed
        stay as they were."""
        if not self.cluster.options.refusals:
            return
        incarnation = self.incarnation
        for peer in self.config.voters:
            other = self.cluster.network.actors.get(peer)
            if peer == self.actor_id or not isinstance(other, RaftActor):
                continue
            delay_ms = self.refusal_rng.randint(1, 80)

            def notice(other: RaftActor = other) -> None:
                if self.incarnation != incarnation or self.node is not None:
                    return  # restarted: the reconnect succeeds
                if (other.actor_id, self.actor_id) in self.cluster.network.blocked:
                    return
                other.refused_by(self.actor_id)

            self.cluster.scheduler.after(delay_ms, notice, f"refused {peer}->{self.actor_id}")

    def refused_by(self, peer: int) -> None:
        if self.driver is None:
            return
        if self.stalled:
            self.backlog.append(lambda: self.refused_by(peer))
            return
        self.driver.peer_unreachable(peer)
        self.run_ready()

    def schedule_tick(self) -> None:
        incarnation = self.incarnation
        delay_ms = self.cluster.options.tick_ms + self.cluster.rng.randint(0, 3)
        self.cluster.scheduler.after(
            delay_ms, lambda: self.on_tick(incarnation), f"tick {self.actor_id}"
        )

    # -- the event loop ---------------------------------------------------

    def reset_loop(self) -> None:
        """A process starts (or dies) with no write in flight and a running event loop."""
        self.writing, self.stalled_until, self.backlog, self.tick_overdue = False, 0, [], False

    @property
    def stalled(self) -> bool:
        return self.cluster.clock.now_ms < self.stalled_until

    def on_loop(self, action: Callable[[], None]) -> None:
        """Run ``action`` on this node's event loop: now, or after a stall ends."""
        if self.stalled:
            self.backlog.append(action)
        else:
            action()

    def stall(self, duration_ms: int) -> None:
        """The event loop is blocked (a long CPU task): no input is handled, no write
        completion resumes the Ready loop, no timer fires, while the others go on."""
        if self.driver is None or self.stalled:
            return
        now_ms = self.cluster.clock.now_ms
        self.stalled_until = now_ms + duration_ms
        self.cluster.trace.add(now_ms, f"node {self.actor_id} stalls for {duration_ms} ms")
        incarnation = self.incarnation
        self.cluster.scheduler.at(
            self.stalled_until, lambda: self.unstall(incarnation), f"unstall {self.actor_id}"
        )

    def unstall(self, incarnation: int) -> None:
        """Everything that queued up is handled at once, in arrival order, before the
        Ready loop runs again (the wake-up event resumes its task after the callbacks
        at hand). The overdue tick comes first or last: uvloop runs due timers before
        polling for I/O, asyncio after."""
        if incarnation != self.incarnation or self.driver is None or self.stalled:
            return
        backlog, self.backlog = self.backlog, []
        if self.tick_overdue:
            self.tick_overdue = False
            tick = functools.partial(self.on_tick, incarnation)
            timers_first = self.cluster.rng.random() < 0.5
            backlog = [tick, *backlog] if timers_first else [*backlog, tick]
        self.cluster.trace.add(
            self.cluster.clock.now_ms, f"node {self.actor_id} resumes: {len(backlog)} queued"
        )
        self.draining = True
        try:
            for action in backlog:
                action()
        finally:
            self.draining = False
        self.run_ready()

    # -- inputs ---------------------------------------------------------

    def on_tick(self, incarnation: int) -> None:
        if self.driver is None or incarnation != self.incarnation:
            return
        if self.stalled:  # the timer fires once, late, when the loop runs again
            self.tick_overdue = True
            return
        self.driver.tick()
        self.run_ready()
        self.schedule_tick()

    def deliver(self, src: int, payload: object) -> None:
        if self.driver is None:
            return
        if self.stalled:
            self.backlog.append(lambda: self.deliver(src, payload))
            return
        self.driver.step(message_from_dict(msgpack.unpackb(payload)))  # type: ignore[arg-type]
        self.run_ready()

    def propose(self, records: list[MetadataRecord]) -> int | None:
        """Through the controller state machine, as a request handler would."""
        if self.machine is None:
            return None
        try:
            index = self.machine.propose(records)
        except NotControllerError:
            return None
        self.run_ready()
        return index

    # -- the driver's Ready loop, scheduled as AsyncRaftLoop does ---------------

    def run_ready(self) -> None:
        """Not while a write is in flight (the loop takes what arrived meanwhile when it
        resumes), nor while the event loop stalls or handles its backlog."""
        driver = self.driver
        if driver is None or self.writing or self.stalled or self.draining:
            return
        self.readies = 0
        self.run_steps(driver.ready_steps())

    def run_steps(self, steps: Iterator[ReadyStep]) -> None:
        def run() -> None:
            for write in steps:
                if write is None:
                    # A turn boundary: inputs there are like inputs during a write, which
                    # the writes already interleave; continuing keeps the seeds' schedules.
                    continue
                delay_ms = self.write_ms(write)
                if delay_ms == 0:
                    write()
                    continue
                self.writing = True
                done = functools.partial(self.write_done, self.incarnation, steps, write)
                self.cluster.scheduler.after(delay_ms, done, f"write done {self.actor_id}")
                return

        self.guarded(run)

    def write_done(
        self, incarnation: int, steps: Iterator[ReadyStep], write: BlockingWrite
    ) -> None:
        """The write is durable now, stall or not (it ran in a thread); the Ready loop
        resumes when the event loop runs."""
        if incarnation != self.incarnation or self.driver is None:
            return
        self.guarded(write)
        if incarnation != self.incarnation or self.driver is None:
            return  # it crashed right after the write

        def resume() -> None:
            self.writing = False
            self.readies = 0
            self.run_steps(steps)

        self.on_loop(resume)

    def write_ms(self, write: BlockingWrite) -> int:
        """The disk's time for a write: an fsync latency plus its bytes at the disk's rate
        (``write`` is the driver's partial of `persist_ready` or `save_snapshot`)."""
        options = self.cluster.options
        low, high = options.fsync_ms
        if high == 0:
            return 0
        size = 0
        for arg in write.args if isinstance(write, functools.partial) else ():
            if isinstance(arg, Ready):
                size += sum(len(e.data) for e in arg.entries)
                size += len(arg.snapshot.data) if arg.snapshot else 0
            elif isinstance(arg, Snapshot):
                size += len(arg.data)
        return self.cluster.rng.randint(low, high) + size // options.disk_bytes_per_ms

    def guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except SimCrash:
            return
        except SimulationFailure:
            raise
        except Exception as e:  # the driver or the state machine broke: report the seed
            self.cluster.fail(f"node {self.actor_id}: the driver failed: {e!r}")

    def on_event(self, event: RaftEvent) -> None:
        self.cluster.trace.add(self.cluster.clock.now_ms, event.text)
        if event.kind == "follower_lost_state":
            self.cluster.invariants.on_lost_state(self.actor_id, event.text)

    def on_applied(self) -> None:
        """After every apply and every loss of leadership (a subclass's hook)."""

    # -- RaftStorage ------------------------------------------------------

    def persist_ready(self, ready: Ready) -> None:
        node = self.node
        assert node is not None
        self.readies += 1
        if self.readies > MAX_READIES_PER_RUN:
            self.cluster.fail(f"node {self.actor_id}: Ready loop did not settle")
        self.cluster.invariants.on_persist(self.actor_id, ready, self.durable)
        if ready.hard_state is not None and ready.hard_state.term < self.durable.hard_state.term:
            self.cluster.fail(f"node {self.actor_id}: durable term goes back")
        # A store may write a commit-only hard state lazily: sometimes "forget" to.
        lazy = not ready.must_sync and self.cluster.rng.random() < 0.3
        self.durable.persist(ready, write_hard_state=not lazy)
        if self.cluster.maybe_crash_after_persist(self, ready):
            raise SimCrash

    def save_snapshot(self, snapshot: Snapshot) -> None:
        self.cluster.invariants.on_snapshot(self.actor_id, snapshot)
        self.durable.save_snapshot(snapshot)

    # -- RaftNetwork ------------------------------------------------------

    def send(self, msg: Message) -> None:
        self.check_persisted_before_send(msg)
        self.cluster.network.send(self.actor_id, msg.dst, msgpack.packb(msg.to_dict()))

    def check_persisted_before_send(self, msg: Message) -> None:
        """The Ready ordering rule, checked on every message: its cause is durable."""
        hard = self.durable.hard_state
        # A pre-vote asks about term + 1 without entering it.
        prospective = isinstance(msg, PreVoteRequest | PreVoteResponse)
        if msg.term > hard.term and not prospective:
            self.cluster.fail(f"node {self.actor_id} sends {msg} in a term not yet durable")
        if isinstance(msg, VoteResponse) and msg.granted and hard.vote != msg.dst:
            self.cluster.fail(f"node {self.actor_id} grants a vote not yet durable: {msg}")
        if isinstance(msg, VoteRequest) and hard.vote != self.actor_id:
            self.cluster.fail(f"node {self.actor_id} campaigns before its self-vote is durable")
        if (
            isinstance(msg, AppendResponse)
            and msg.success
            and (msg.match_index > self.durable.last_index())
        ):
            self.cluster.fail(
                f"node {self.actor_id} acknowledges {msg.match_index} but "
                f"persisted only up to {self.durable.last_index()}"
            )
        if (
            isinstance(msg, AppendRequest)
            and msg.entries
            and (msg.entries[-1].index > self.durable.last_index())
        ):
            self.cluster.fail(f"leader {self.actor_id} sends entries it has not persisted")

    # -- StateMachine: the controller's, checked after every apply --------------

    def apply(self, ready: Ready) -> None:
        machine = self.machine
        assert machine is not None
        invariants = self.cluster.invariants
        machine.apply(ready)
        for entry in ready.committed_entries:
            invariants.on_commit(self.actor_id, entry, self.node.term if self.node else 0)
        if ready.snapshot is not None or ready.committed_entries:
            invariants.on_image(self.actor_id, machine.image)

    def after_advance(self, node: RaftNode) -> tuple[int, bytes] | None:
        assert self.machine is not None
        return self.machine.after_advance(node)

    # -- per-event checks -----------------------------------------------

    def check(self) -> None:
        node, machine = self.node, self.machine
        if node is None or machine is None:
            return
        invariants = self.cluster.invariants
        if node.term < self.seen_term:
            self.cluster.fail(f"node {self.actor_id}: term went back to {node.term}")
        if node.commit_index < self.seen_commit:
            self.cluster.fail(
                f"node {self.actor_id}: commit went back from "
                f"{self.seen_commit} to {node.commit_index}"
            )
        for index in range(
            max(self.seen_commit, node.log.snapshot_index) + 1, node.commit_index + 1
        ):
            entry = node.log.slice(index, 1)[0]
            invariants.on_commit(self.actor_id, entry, node.term)
        self.seen_term, self.seen_commit = node.term, node.commit_index
        if max(machine.image.offset, 0) != node.applied_index:
            self.cluster.fail(
                f"node {self.actor_id}: image at offset {machine.image.offset}, "
                f"Raft applied {node.applied_index}"
            )
        # The machine learns of a step-down after the Ready loop's next advance, which
        # waits for a write in flight.
        if (
            machine.active
            and not self.writing
            and (node.role is not Role.LEADER or machine.ctl is None)
        ):
            self.cluster.fail(f"node {self.actor_id}: active controller but {node.role}")
        if node.role is Role.LEADER:
            invariants.check_leader(node)
            invariants.check_lease(node, self.clock())


# ---------------------------------------------------------------------------
# The cluster and its fault schedule


@dataclass(slots=True)
class SimOptions:
    seed: int
    voters: int = 3
    chaos_ms: int = 10_000
    liveness_bound_ms: int = 20_000
    election_timeout_ms: int = 1000
    heartbeat_interval_ms: int = 100
    tick_ms: int = 10
    max_entries_per_append: int = 8
    snapshot_every_records: int = 30
    controller_tick_ms: int = 250
    max_clock_drift_ms: int = 0  # the clocks here do not drift
    controller_config: ControllerConfig = field(default_factory=ControllerConfig)
    echo_trace: bool = False
    # A synced write takes an fsync latency drawn from this range plus its bytes at
    # disk_bytes_per_ms; (0, 0) is an instant disk (writes run in place).
    fsync_ms: tuple[int, int] = (0, 0)
    disk_bytes_per_ms: int = 2_000
    stalls: bool = False  # the fault schedule also stalls event loops
    proposal_gap_ms: tuple[int, int] = (5, 80)  # between two operations during chaos
    large_topic_partitions: int = 0  # also create topics of up to this many partitions
    # A snapshot's bytes come back this long after it is asked for (the server encodes on
    # a worker thread); (0, 0): at once.
    snapshot_encode_ms: tuple[int, int] = (0, 0)
    # A crashed node's address refuses connections, its peers' transports report it
    # (`RaftActor.refuse_connections`) and their cores campaign early
    # (`prevote_on_leader_loss`, which rules out the leader lease). Off, the lease is
    # claimed and checked. `for_seed` turns it on for half the seeds. The replication and
    # group simulators' quorums leave it off: their pinned seeds (and the mutants each
    # must catch) were found on the schedules without it, and how fast a controller
    # fails over is not theirs to check.
    refusals: bool = False

    @classmethod
    def for_seed(cls, seed: int, echo_trace: bool = False) -> SimOptions:
        """Everything derives from the seed, so the seed alone replays a run."""
        rng = random.Random(seed ^ 0x5EED)
        max_entries_per_append = rng.choice([1, 2, 8, 64])
        return cls(
            seed=seed,
            voters=3 + 2 * (seed % 2),
            echo_trace=echo_trace,
            max_entries_per_append=max_entries_per_append,
            snapshot_every_records=rng.choice([5, 30, 200]),
            fsync_ms=rng.choice([(0, 0), (1, 5), (2, 40), (20, 150)]),
            stalls=rng.random() < 0.75,
            large_topic_partitions=rng.choice([0, 0, 300]),
            # Under load (a proposal every few ms) a write is nearly always in flight.
            # Only with batched appends: one entry per append cannot drain the backlog a
            # partitioned leader builds up within the liveness bound.
            proposal_gap_ms=(1, 10)
            if max_entries_per_append >= 8 and rng.random() < 0.5
            else (5, 80),
            # Drawn from a stream of its own: the draws above keep their values.
            snapshot_encode_ms=random.Random(seed ^ 0xE1C0).choice([(0, 0), (1, 30), (50, 1500)]),
            # Half the seeds, of both voter counts, without drawing (the rest replay).
            refusals=(seed // 2) % 2 == 0,
        )


class RaftCluster:
    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        self.clock = SimClock()
        self.scheduler = Scheduler(self.clock)
        self.network = SimNetwork(
            self.scheduler, random.Random(self.rng.getrandbits(64)), self.random_link_faults()
        )
        self.trace = Trace(echo=options.echo_trace)
        self.invariants = RaftInvariants(self.fail)
        voters = tuple(range(1, options.voters + 1))
        self.actors = {n: RaftActor(self, n, voters) for n in voters}
        for actor in self.actors.values():
            self.network.register(actor)
        self.chaos = True
        self.proposals = 0

    def fail(self, text: str) -> NoReturn:
        seed = self.options.seed
        raise SimulationFailure(
            f"seed {seed}, {self.clock.now_ms} ms: {text}\n"
            f"replay: {REPLAY_COMMAND.format(seed=seed)}\n--- trace tail ---\n"
            f"{self.trace.tail()}"
        )

    def random_link_faults(self) -> LinkFaults:
        return LinkFaults(
            loss_rate=self.rng.choice([0.0, 0.01, 0.05, 0.15]),
            duplicate_rate=self.rng.choice([0.0, 0.02, 0.1]),
            min_delay_ms=1,
            max_delay_ms=self.rng.choice([2, 10, 40]),
        )

    def check_all(self) -> None:
        for actor in self.actors.values():
            actor.check()

    def leaders(self) -> list[RaftActor]:
        return [a for a in self.actors.values() if a.node is not None and a.node.is_leader]

    def maybe_crash_after_persist(self, actor: RaftActor, ready: Ready) -> bool:
        """Sometimes the process dies right after a write, before anything is sent."""
        if self.chaos and self.rng.random() < 0.0005:
            actor.crash("between persist and send")
            self.scheduler.after(self.rng.randint(50, 2000), actor.start, "restart")
            return True
        return False

    # -- the run ----------------------------------------------------------

    def run(self) -> None:
        for actor in self.actors.values():
            actor.start()
        self.scheduler.after(self.rng.randint(200, 1500), self.inject_fault, "fault")
        self.scheduler.after(self.rng.randint(5, 80), self.propose_some, "propose")
        self.scheduler.after(self.options.controller_tick_ms, self.tick_controllers, "ctl tick")
        self.scheduler.run_until(self.options.chaos_ms, self.check_all)
        self.heal()
        self.check_liveness()

    def active_controllers(self) -> list[RaftActor]:
        return [a for a in self.actors.values() if a.machine is not None and a.machine.active]

    def propose_some(self) -> None:
        active = self.active_controllers()
        if active:
            self.proposals += 1
            actor = self.rng.choice(active)
            actor.on_loop(lambda: self.serve_operation(actor))
        gap_ms = self.rng.randint(*self.options.proposal_gap_ms) if self.chaos else 200
        self.scheduler.after(gap_ms, self.propose_some, "propose")

    def serve_operation(self, actor: RaftActor) -> None:
        """A request handler on the actor's event loop (late, after a stall: it may have
        lost leadership meanwhile, or be about to learn it has)."""
        if actor.machine is None or not actor.machine.active:
            return
        records = self.metadata_operation(actor.machine)
        if records:
            actor.propose(records)

    def metadata_operation(self, machine: ControllerStateMachine) -> list[MetadataRecord]:
        """What brokers and admins ask of the active controller, on its pending image."""
        ctl, image, now_ms, rng = machine.ctl, machine.images.pending, self.clock.now_ms, self.rng
        assert ctl is not None
        ops = ["register", "heartbeat", "heartbeat", "create", "alter", "delete"]
        op = rng.choice(ops + ["create_large"] if self.options.large_topic_partitions else ops)
        topics = sorted(image.topics_by_name)
        if op == "register":
            broker = rng.randint(1, 4)
            endpoint = ("PLAINTEXT", f"broker-{broker}", 9092)
            incarnation = f"incarnation-{self.proposals}"
            return ctl.register_broker(image, broker, incarnation, [endpoint], None, now_ms)[0]
        if op == "heartbeat" and image.brokers:
            reg = image.brokers[rng.choice(sorted(image.brokers))]
            args = (reg.broker_id, reg.broker_epoch, image.offset, False, False, now_ms)
            return ctl.broker_heartbeat(image, *args)[0]
        if op == "create":
            topic = (f"topic-{self.proposals % 7}", rng.randint(1, 3), 1, {}, None)
            return ctl.create_topics(image, [topic])[0]
        if op == "create_large":  # one large entry: a long write, a long append
            partitions = rng.randint(1, self.options.large_topic_partitions)
            topic = (f"large-{self.proposals % 2}", partitions, 1, {}, None)
            return ctl.create_topics(image, [topic])[0]
        if op == "alter" and topics:
            change = {"retention.ms": str(rng.randint(1, 10**6))}
            return ctl.alter_topic_configs(image, rng.choice(topics), change)[0]
        if op == "delete" and topics:
            return ctl.delete_topics(image, [rng.choice(topics)])[0]
        return []

    def tick_controllers(self) -> None:
        """Session expiry and leader rebalance on active controllers (the server's ticker)."""
        for actor in self.active_controllers():
            actor.on_loop(functools.partial(self.tick_controller, actor))
        self.scheduler.after(self.options.controller_tick_ms, self.tick_controllers, "ctl tick")

    def tick_controller(self, actor: RaftActor) -> None:
        if actor.machine is None:
            return
        try:
            actor.machine.tick(self.clock.now_ms)
        except NotControllerError:
            return
        actor.run_ready()

    def inject_fault(self) -> None:
        if not self.chaos:
            return
        now_ms = self.clock.now_ms
        action = self.rng.choice(
            [
                "crash",
                "wipe",
                "partition",
                "one_way",
                "isolate_leader",
                "transfer",
                "link_faults",
                "heal",
                "heal",
            ]
            + (["stall", "stall"] if self.options.stalls else [])
        )
        ids = list(self.actors)
        if action == "crash":
            actor = self.actors[self.rng.choice(ids)]
            actor.crash("fault injection")
            self.scheduler.after(
                self.rng.randint(100, 2500), lambda: self.restart(actor), "restart"
            )
        elif action == "wipe":
            actor = self.actors[self.rng.choice(ids)]
            actor.crash("fault injection: its disk is to be wiped")
            self.scheduler.after(
                self.rng.randint(100, 2500), lambda: self.wipe_and_restart(actor), "restart"
            )
        elif action == "partition":
            self.rng.shuffle(ids)
            cut = self.rng.randint(1, len(ids) - 1)
            self.network.partition([ids[:cut], ids[cut:]])
            self.trace.add(now_ms, f"partition {sorted(ids[:cut])} | {sorted(ids[cut:])}")
        elif action == "one_way":
            src, dst = self.rng.sample(ids, 2)
            self.network.cut(src, dst)
            self.trace.add(now_ms, f"one-way cut {src} -> {dst}")
        elif action == "isolate_leader" and self.leaders():
            leader = self.rng.choice(self.leaders()).actor_id
            self.network.isolate(leader)
            self.trace.add(now_ms, f"isolate leader {leader}")
        elif action == "transfer" and self.leaders():
            self.transfer_leadership()
        elif action == "link_faults":
            self.network.faults = self.random_link_faults()
            self.trace.add(now_ms, f"link faults now {self.network.faults}")
        elif action == "heal":
            self.network.heal()
            self.trace.add(now_ms, "network healed")
        elif action == "stall":
            self.stall_someone()
        self.scheduler.after(self.rng.randint(100, 1500), self.inject_fault, "fault")

    def stall_someone(self) -> None:
        """Mostly a leader; shorter than an election timeout (it resumes as leader, with
        a check-quorum round overdue) or longer (a new leader was elected meanwhile)."""
        leaders = self.leaders()
        live = [a for a in self.actors.values() if a.node is not None]
        pool = leaders if leaders and self.rng.random() < 0.8 else live
        if not pool:
            return
        timeout_ms = self.options.election_timeout_ms
        if self.rng.random() < 0.5:
            duration_ms = self.rng.randint(20, timeout_ms)
        else:
            duration_ms = self.rng.randint(2 * timeout_ms, 4 * timeout_ms)
        self.rng.choice(pool).stall(duration_ms)

    def transfer_leadership(self) -> None:
        leader = self.rng.choice(self.leaders())
        assert leader.node is not None
        target = self.rng.choice(leader.node.peers)
        leader.on_loop(lambda: self.transfer(leader, target))

    def transfer(self, leader: RaftActor, target: int) -> None:
        """An admin's request to move leadership, served on the leader's event loop."""
        if leader.node is None:
            return
        try:
            leader.node.transfer_leadership(target)
        except RaftError:
            return
        leader.run_ready()

    def wipe_and_restart(self, actor: RaftActor) -> None:
        if actor.node is not None:
            return
        if self.safe_to_wipe(actor):
            actor.wipe()
        else:
            self.trace.add(self.clock.now_ms, f"node {actor.actor_id} keeps its disk: unsafe")
        actor.start()

    def safe_to_wipe(self, actor: RaftActor) -> bool:
        """Raft assumes a voter keeps what it persisted; a wiped voter may vote again in
        a term and for a log without its old entries. That loses nothing only when (as
        docs/controller.md asks of operators) none of its acknowledgements or votes is
        still needed: everything it holds is committed and every other voter holds all
        that is committed (so its late acknowledgements commit nothing new, and a leader
        it helps elect lacks no committed entry), and no other voter can still be or
        become a candidate in the term it voted in."""
        durable, committed = actor.durable, self.invariants.committed
        last = max(committed, default=0)
        own_last = durable.last_index()
        own_entry = committed.get(own_last)
        if own_last > last or (
            own_last != durable.snapshot_index()
            and (own_entry is None or own_entry.term != durable.term(own_last))
        ):
            return False
        term, vote = durable.hard_state.term, durable.hard_state.vote
        for other in self.actors.values():
            if other is actor:
                continue
            store = other.durable
            if last and store.snapshot_index() < last and store.term(last) != committed[last].term:
                return False
            other_term, other_vote = store.hard_state.term, store.hard_state.vote
            if vote is not None and (
                other_term < term or (other_term == term and other_vote == other.actor_id != vote)
            ):
                return False
        return True

    def restart(self, actor: RaftActor) -> None:
        if actor.node is None:
            actor.start()

    def heal(self) -> None:
        self.chaos = False
        self.network.heal()
        self.network.faults = LinkFaults(min_delay_ms=1, max_delay_ms=10)
        self.trace.add(self.clock.now_ms, "=== faults healed: liveness phase ===")
        for actor in self.actors.values():
            self.restart(actor)

    def check_liveness(self) -> None:
        """A leader emerges and a fresh proposal reaches every node within the bound."""
        deadline_ms = self.clock.now_ms + self.options.liveness_bound_ms
        marker_index: dict[int, int] = {}  # leader term -> index of its marker proposal
        while self.clock.now_ms < deadline_ms:
            if any(self.everyone_applied(index, term) for term, index in marker_index.items()):
                return
            active = self.active_controllers()
            if active:
                leader = max(active, key=lambda a: a.node.term if a.node else 0)
                term = leader.node.term if leader.node else 0
                if term not in marker_index:
                    marker = Config(RESOURCE_BROKER, "", "sim.marker", str(term))
                    index = leader.propose([marker])
                    if index is not None:
                        marker_index[term] = index
            self.scheduler.run_until(self.clock.now_ms + 50, self.check_all)
        self.fail(
            f"liveness: no proposal committed on all nodes within "
            f"{self.options.liveness_bound_ms} ms of healing; "
            f"status {[a.node.status() if a.node else None for a in self.actors.values()]}"
        )

    def everyone_applied(self, index: int, term: int) -> bool:
        entry = self.invariants.committed.get(index)
        if entry is None or entry.term != term:
            return False
        return all(
            a.machine is not None and a.machine.image.offset >= index for a in self.actors.values()
        )


def leader_crash_failover_ms(seed: int, refusals: bool = True) -> int:
    """Simulated ms from a kill of the leader of a settled quorum (no other fault) to a
    new leader, every invariant checked on the way. The leader dies at a random point
    between two heartbeats; its peers learn of it only as the options say (a refused
    reconnect with ``refusals``, else the election timeout)."""
    options = SimOptions.for_seed(seed)
    options.refusals = refusals
    cluster = RaftCluster(options)
    cluster.chaos = False
    cluster.network.faults = LinkFaults(min_delay_ms=1, max_delay_ms=2)
    for actor in cluster.actors.values():
        actor.start()
    step_ms = 10
    while not cluster.leaders() or cluster.clock.now_ms < 3 * options.election_timeout_ms:
        cluster.scheduler.run_until(cluster.clock.now_ms + step_ms, cluster.check_all)
    cluster.scheduler.run_until(
        cluster.clock.now_ms + cluster.rng.randint(0, options.heartbeat_interval_ms),
        cluster.check_all,
    )
    (leader,) = cluster.leaders()
    term = leader.node.term  # type: ignore[union-attr]
    crashed_at = cluster.clock.now_ms
    leader.crash("the failover measurement")
    deadline = crashed_at + 10 * options.election_timeout_ms
    while cluster.clock.now_ms < deadline:
        cluster.scheduler.run_until(cluster.clock.now_ms + 1, cluster.check_all)
        new = [a for a in cluster.leaders() if a.node.term > term]  # type: ignore[union-attr]
        if new:
            return cluster.clock.now_ms - crashed_at
    cluster.fail("no new leader within 10 election timeouts of the leader's crash")


def run_seed(seed: int, echo_trace: bool = False) -> RaftCluster:
    cluster = RaftCluster(SimOptions.for_seed(seed, echo_trace=echo_trace))
    cluster.run()
    return cluster
