"""Partition replication in the deterministic simulator.

Three brokers run the real ``PartitionState`` core (leader, follower, ISR, HW, acks=all)
through the production ``PartitionDriver`` (the effect interpreter the broker uses) over
in-memory logs. Their metadata comes from a quorum of three Raft controllers
(controller_quorum.py): the production ``RaftDriver``, ``RaftNode`` and
``ControllerStateMachine`` of the Raft simulation, answering registrations, heartbeats,
AlterPartition and metadata fetches with the production handlers. A broker reaches the
active controller as the real broker link does, trying voters, following NOT_CONTROLLER
hints and backing off, and registers again when a new controller no longer knows it.

Everything travels over ``SimNetwork`` with seeded loss, delay, duplication and
reordering. Brokers crash (their in-memory state is lost, their log and last HW
checkpoint survive, as after kill -9), restart, pause and shut down under control.
Controllers crash (the active one often: at any write, right after proposing a broker's
registration or AlterPartition, between a Raft append and its commit), are cut from the
other controllers or from the brokers for a while, pause, and now and then two of the
three go down for a while (no quorum). Every node reads its own clock (clocks.py): a rate
within 2 % of the simulated time, an offset of its own, occasional leaps forward (and, for
brokers, back).

Invariants, checked after every event:
- a broker's high watermark never moves back within one incarnation;
- records below any leader's HW are committed: once committed, an offset's record
  never changes on any replica, below that replica's own HW or anywhere once the
  replica becomes leader (a new leader holds every committed record);
- every acknowledged acks=all write is committed at the offset it was acknowledged at;
- the controllers keep the Raft simulation's checks (raft_cluster.py): one leader per
  term, log matching, committed entries never change, the same image at every offset,
  an active controller is a leader, messages only carry what is already durable.

After the chaos everything heals: a controller becomes active again, the ISR refills and
a new write is acknowledged within the liveness bound.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from test_replication_fakes import FakeLog, Record, batches_of

from rillet.broker.replication.driver import PartitionDriver
from rillet.broker.replication.partition_state import PartitionState, Role
from rillet.broker.replication.types import (
    ACKS_ALL,
    AlterPartitionResponse,
    AppendFetched,
    FetchRequest,
    FetchResponse,
    ProposeAlterPartition,
    ReplicationConfig,
)
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.controller.metadata.image import EMPTY_IMAGE, MetadataDelta, MetadataImage
from rillet.controller.metadata.quorum import ControllerConfig

from .clocks import DriftingClock
from .controller_quorum import CONTROLLER_IDS, ControllerAnswer, ControllerLink, ControllerQuorum
from .network import LinkFaults, SimNetwork
from .raft_cluster import SimulationFailure
from .scheduler import Scheduler, SimClock
from .trace import Trace

REPLAY_COMMAND = (
    "RILLET_SIM_SEED={seed} .venv/bin/pytest tests/test_replication_sim.py -k replay -s"
)
BROKER_IDS = (1, 2, 3)
CONTROLLER_FAULTS = frozenset(
    {"crash_controller", "crash_active", "cut_controller", "pause_controller"}
    | {"clock_step", "lose_quorum"}
)
TOPIC = "t"
MIN_ISR = 2
FETCH_MAX_RECORDS = 4
REQUEST_TIMEOUT_MS = 300


# ---------------------------------------------------------------------------
# messages


@dataclass(frozen=True, slots=True)
class Fetch:
    incarnation: int
    fetch_id: int
    request: FetchRequest


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    incarnation: int
    fetch_id: int
    response: FetchResponse
    records: tuple[tuple[int, object], ...]


# ---------------------------------------------------------------------------
# a broker with one partition


class SimStorage:
    """The broker's FakeLog as the driver's storage. A cut also tells the invariants
    which part of the log they have to compare again."""

    def __init__(self, broker: BrokerActor) -> None:
        self.broker = broker
        self.log = broker.log

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        self.log.assign_epoch_start_offset(epoch, start_offset)

    def set_high_watermark(self, high_watermark: int) -> None:
        self.log.set_high_watermark(high_watermark)

    def append_as_leader(self, values: Sequence[object], leader_epoch: int) -> tuple[int, int]:
        return self.log.append_as_leader(values, leader_epoch)

    def append_fetched(self, effect: AppendFetched, fetched: Sequence[Record]) -> None:
        self.log.append_fetched(effect, fetched)

    def truncate_to(self, offset: int) -> None:
        self.log.truncate_to(offset)
        self.broker.checked_end = min(self.broker.checked_end, self.log.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.log.truncate_fully_and_start_at(offset)
        self.broker.checked_end = offset


class BrokerActor:
    """One broker: its PartitionState run by the production PartitionDriver, with the
    simulated network (this actor), storage (SimStorage) and clock; the rest is what
    ReplicaManager and the fetcher do around it (fetch loop, AlterPartition timeouts)."""

    def __init__(self, cluster: ReplicationCluster, broker_id: int) -> None:
        self.actor_id = broker_id
        self.cluster = cluster
        self.clock = cluster.clocks[broker_id]  # its own, drifting: timeouts run on it
        self.link: ControllerLink | None = None  # broker/link: lost in a crash
        self.log = FakeLog()  # survives crashes: the page cache outlives kill -9
        self.hw_checkpoint = 0  # survives crashes too: written now and then
        self.state: PartitionState | None = None
        self.driver: PartitionDriver | None = None  # with the state: lost in a crash
        self.incarnation = 0
        self.image: MetadataImage = EMPTY_IMAGE
        self.seen_hw = 0
        self.fetch_out: int | None = None  # id of the fetch in flight
        self.fetch_ids = 0
        self.fetch_sent_ms = 0
        self.alter_out: set[int] = set()  # proposal ids awaiting the controller
        self.checked_end = 0  # the log below this was compared with the committed records
        self.paused_until = 0  # SIGSTOP: nothing runs, messages queue up, the clock jumps
        self.inbox: list[tuple[int, object]] = []
        self.shutting_down = False  # controlled shutdown asked (SIGTERM)

    @property
    def alive(self) -> bool:
        return self.state is not None

    def start(self) -> None:
        self.incarnation += 1
        hw = max(min(self.hw_checkpoint, self.log.log_end_offset), self.log.log_start_offset)
        self.state = PartitionState(
            self.actor_id,
            self.log,
            ReplicationConfig(400),
            high_watermark=hw,
            is_isr_eligible=lambda b: self.image.is_unfenced(b),
        )
        self.driver = PartitionDriver(self.state, SimStorage(self), self, self.clock)
        self.image, self.seen_hw = EMPTY_IMAGE, hw
        self.fetch_out, self.alter_out = None, set()
        self.paused_until, self.inbox, self.shutting_down = 0, [], False
        self.cluster.trace.add(
            self.cluster.clock.now_ms,
            f"broker {self.actor_id} starts (incarnation {self.incarnation}, "
            f"LEO {self.log.log_end_offset}, HW {hw})",
        )
        self.link = self.cluster.new_link(self)
        self.link.start()
        incarnation = self.incarnation
        self.cluster.scheduler.after(10, lambda: self.tick(incarnation), "tick")

    def status(self) -> str:
        s = self.state
        if s is None:
            return f"broker {self.actor_id}: down"
        reg = self.image.brokers.get(self.actor_id)
        return (
            f"broker {self.actor_id}: {s.role.value} epoch {s.leader_epoch} isr {s.isr} "
            f"pending {s.pending_isr_change} LEO {self.log.log_end_offset} HW "
            f"{s.high_watermark} broker epoch {self.broker_epoch} registered {reg}, "
            f"image offset {self.image.offset}, alter out {self.alter_out}, "
            f"controller {self.link.leader_id if self.link else None}"
        )

    def crash(self) -> None:
        if self.state is None:
            return
        self.cluster.trace.add(self.cluster.clock.now_ms, f"broker {self.actor_id} crashes")
        self.state = self.driver = self.link = None

    @property
    def broker_epoch(self) -> int:
        return self.link.broker_epoch if self.link is not None else -1

    def send(self, dst: int, payload: object) -> None:
        self.cluster.network.send(self.actor_id, dst, payload)

    # -- time ------------------------------------------------------------------------

    def tick(self, incarnation: int) -> None:
        if self.state is None or incarnation != self.incarnation:
            return
        if self.cluster.clock.now_ms < self.paused_until:
            self.cluster.scheduler.at(self.paused_until, lambda: self.tick(incarnation), "tick")
            return
        if self.inbox:
            self.resume()
            if self.state is None:
                return
        now = self.clock()
        assert self.link is not None
        self.link.want_shut_down = self.shutting_down
        self.link.tick()
        if self.driver is not None:
            self.driver.tick()
            self.maybe_fetch(now)
        if self.cluster.rng.random() < 0.05:
            self.hw_checkpoint = self.state.high_watermark if self.state else self.hw_checkpoint
        self.cluster.scheduler.after(10, lambda: self.tick(incarnation), "tick")

    def maybe_fetch(self, now: int) -> None:
        state = self.state
        assert state is not None
        if state.role is not Role.FOLLOWER or state.leader_id in (None, -1):
            return
        if self.fetch_out is not None and now - self.fetch_sent_ms < REQUEST_TIMEOUT_MS:
            return
        request = state.fetch_request()
        if request is not None:
            self.fetch_ids += 1
            self.fetch_out, self.fetch_sent_ms = self.fetch_ids, now
            self.send(state.leader_id, Fetch(self.incarnation, self.fetch_ids, request))

    # -- messages --------------------------------------------------------------------

    def pause(self, duration_ms: int) -> None:
        self.paused_until = self.cluster.clock.now_ms + duration_ms
        self.cluster.trace.add(
            self.cluster.clock.now_ms, f"broker {self.actor_id} paused for {duration_ms} ms"
        )

    def resume(self) -> None:
        """SIGCONT: what arrived meanwhile is handled in arrival order, late."""
        inbox, self.inbox = self.inbox, []
        for src, payload in inbox:
            self.deliver(src, payload)

    def deliver(self, src: int, payload: object) -> None:
        if self.state is None:
            return
        if self.cluster.clock.now_ms < self.paused_until or self.inbox:
            self.inbox.append((src, payload))
            if self.cluster.clock.now_ms >= self.paused_until:
                self.resume()
            return
        match payload:
            case ControllerAnswer(link_id) if self.link and link_id == self.link.link_id:
                self.link.on_answer(payload)
            case Fetch(incarnation, fetch_id, request):
                self.serve_fetch(src, incarnation, fetch_id, request)
            case FetchAnswer(incarnation, fetch_id, response, records) if (
                incarnation == self.incarnation
            ):
                # A duplicated or late answer still reaches the core (it ignores answers
                # that no longer fit the log) but only the awaited one starts the next
                # fetch: else each duplicate would start a fetch chain of its own.
                assert self.driver is not None
                self.driver.on_fetch_response(response, records)
                if fetch_id == self.fetch_out:
                    self.fetch_out = None
                    self.maybe_fetch(self.clock())

    def on_shut_down(self) -> None:
        """The controller says the controlled shutdown is done: the process exits."""
        self.cluster.trace.add(
            self.cluster.clock.now_ms, f"broker {self.actor_id}: controlled shutdown done"
        )
        self.crash()
        broker = self
        self.cluster.scheduler.after(
            self.cluster.rng.randint(50, 1000), lambda: self.cluster.restart(broker), "restart"
        )

    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """What ReplicaManager.on_metadata does with one published (delta, image)."""
        if image.offset <= self.image.offset:
            return
        self.image = image
        p = image.partition(TOPIC, 0)
        state, driver = self.state, self.driver
        if driver is not None and delta.changed_brokers:
            # Every broker a record touched, even one fenced and unfenced in one batch.
            driver.on_brokers_changed(delta.changed_brokers.keys())
        if p is None or state is None or driver is None or self.actor_id not in p.replicas:
            return
        if p.leader == self.actor_id:
            driver.become_leader(p.leader_epoch, p.partition_epoch, p.replicas, p.isr)
            self.cluster.invariants.on_become_leader(self)
        else:
            driver.become_follower(p.leader, p.leader_epoch, p.partition_epoch, p.replicas, p.isr)

    def on_alter_answer(self, pid: int, response: AlterPartitionResponse) -> None:
        self.alter_out.discard(pid)
        if self.driver is not None:
            self.driver.on_alter_partition_response(pid, response)

    def serve_fetch(self, src: int, incarnation: int, fetch_id: int, request: FetchRequest) -> None:
        assert self.driver is not None
        decision = self.driver.on_follower_fetch(request)
        records: list = []
        if decision.error_code == errors.NONE and decision.diverging_epoch is None:
            records = self.log.read(request.fetch_offset)[:FETCH_MAX_RECORDS]
        response = FetchResponse(
            request.fetch_offset,
            request.current_leader_epoch,
            decision.error_code,
            decision.high_watermark,
            decision.log_start_offset,
            decision.diverging_epoch,
            batches_of(request.fetch_offset, records),
        )
        self.send(src, FetchAnswer(incarnation, fetch_id, response, tuple(records)))

    def produce(self, value: object) -> None:
        """An acks=all produce from a client: refused, or appended and awaited."""
        if self.driver is None:
            return
        # Registered first: the driver may answer it before append_as_leader returns.
        self.cluster.pending[value] = (self.actor_id, self.log.log_end_offset)
        outcome = self.driver.append_as_leader(
            [value], ACKS_ALL, MIN_ISR, value, self.clock() + 1000
        )
        if outcome.error_code != errors.NONE:
            del self.cluster.pending[value]

    # -- ReplicaNetwork: what the driver sends out of the partition --------------------

    def send_alter_partition(self, proposal: ProposeAlterPartition) -> None:
        assert self.link is not None
        pid = proposal.proposal_id
        self.alter_out.add(pid)
        self.link.alter_partition(TOPIC, 0, proposal, lambda r: self.on_alter_answer(pid, r))

    def complete_produce(self, produce_id: Hashable, error_code: int) -> None:
        if error_code == errors.NONE:
            self.cluster.invariants.on_ack(produce_id, *self.cluster.pending.pop(produce_id))
        else:
            self.cluster.pending.pop(produce_id, None)

    def high_watermark_updated(self, high_watermark: int) -> None:
        pass  # nothing parks on the HW here: the invariants read it after every event

    def log_appended(self) -> None:
        pass  # followers fetch on their own tick and after each answer


# ---------------------------------------------------------------------------
# invariants


class ReplicationInvariants:
    def __init__(self, cluster: ReplicationCluster) -> None:
        self.cluster = cluster
        self.committed: list[tuple[int, object]] = []  # offset i -> (epoch, value)
        self.acked: dict[object, int] = {}
        self.unverified: dict[object, int] = {}  # acked above the committed end, so far

    def check(self) -> None:
        for broker in self.cluster.brokers.values():
            state = broker.state
            if state is None:
                continue
            hw = state.high_watermark
            if hw < broker.seen_hw:
                self.cluster.fail(
                    f"broker {broker.actor_id}: HW went back {broker.seen_hw} -> {hw}"
                )
            broker.seen_hw = hw
            if state.is_leader:
                self.commit_up_to(broker, hw)
            self.check_prefix(broker, min(hw, len(self.committed)), "below its HW")
        for value, offset in list(self.unverified.items()):
            if offset < len(self.committed):
                if self.committed[offset][1] != value:
                    self.cluster.fail(
                        f"acknowledged {value!r} at {offset}, committed "
                        f"{self.committed[offset]} there"
                    )
                del self.unverified[value]

    def commit_up_to(self, leader: BrokerActor, hw: int) -> None:
        """A leader's HW commits its records below it; committed ones must not change."""
        self.check_prefix(leader, min(hw, len(self.committed)), "leader below its HW")
        if hw > len(self.committed):
            start = len(self.committed)
            self.committed.extend(leader.log.read(start, hw))

    def check_prefix(self, broker: BrokerActor, end: int, where: str) -> None:
        """The broker's records below ``end`` are the committed ones. Incremental: records
        only change by truncation, which lowers ``checked_end``."""
        log = broker.log
        start = max(log.log_start_offset, broker.checked_end)
        if end <= start:
            return
        held = log.read(start, end)
        if held != self.committed[start:end]:
            self.cluster.fail(
                f"broker {broker.actor_id} ({where}) holds {held} at "
                f"[{start}, {end}), committed {self.committed[start:end]}"
            )
        broker.checked_end = end

    def recognized_leader(self, broker: BrokerActor) -> bool:
        """The controller's current leader in its current epoch. A broker that was paused
        (SIGSTOP) handles the metadata that queued up meanwhile, oldest first, so it may
        apply an old image naming it leader in an old epoch: that is not an election, and
        "a new leader holds every committed record" is about elections."""
        p = self.cluster.quorum.newest_image().partition(TOPIC, 0)
        state = broker.state
        return (
            p is not None
            and state is not None
            and p.leader == broker.actor_id
            and p.leader_epoch == state.leader_epoch
        )

    def on_become_leader(self, broker: BrokerActor) -> None:
        """A new leader holds every committed record (no committed record is lost)."""
        if not self.recognized_leader(broker):
            return
        if broker.log.log_end_offset < len(self.committed):
            self.cluster.fail(
                f"new leader {broker.actor_id} ends at {broker.log.log_end_offset}"
                f", below the committed {len(self.committed)}"
            )
        self.check_prefix(broker, len(self.committed), "as new leader")

    def on_ack(self, value: object, leader_id: int, offset: int) -> None:
        self.acked[value] = offset
        self.unverified[value] = offset


# ---------------------------------------------------------------------------
# the cluster and its faults


class ReplicationCluster:
    def __init__(self, seed: int, chaos_ms: int = 8000, echo_trace: bool = False) -> None:
        self.seed = seed
        self.chaos_ms = chaos_ms
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.scheduler = Scheduler(self.clock)
        self.network = SimNetwork(
            self.scheduler, random.Random(self.rng.getrandbits(64)), self.random_link_faults()
        )
        self.trace = Trace(echo=echo_trace)
        # Controllers' clocks only leap forward: the Raft core refuses one going back.
        self.clocks = {
            n: DriftingClock.random(self.clock, self.rng, monotonic=n in CONTROLLER_IDS)
            for n in (*BROKER_IDS, *CONTROLLER_IDS)
        }
        self.quorum = ControllerQuorum(
            seed,
            self.rng,
            self.clock,
            self.scheduler,
            self.network,
            self.trace,
            self.fail,
            dict(self.clocks),
            ControllerConfig(broker_session_timeout_ms=600, broker_heartbeat_interval_ms=100),
        )
        self.brokers = {b: BrokerActor(self, b) for b in BROKER_IDS}
        for broker in self.brokers.values():
            self.network.register(broker)
        self.invariants = ReplicationInvariants(self)
        self.pending: dict[object, tuple[int, int]] = {}
        self.writes = 0
        self.links = 0
        self._chaos = True

    @property
    def chaos(self) -> bool:
        return self._chaos

    @chaos.setter
    def chaos(self, on: bool) -> None:
        self._chaos = self.quorum.chaos = on

    def fail(self, text: str) -> NoReturn:
        raise SimulationFailure(
            f"seed {self.seed}, {self.clock.now_ms} ms: {text}\n"
            f"replay: {REPLAY_COMMAND.format(seed=self.seed)}\n"
            f"--- trace tail ---\n{self.trace.tail()}"
        )

    def random_link_faults(self) -> LinkFaults:
        return LinkFaults(
            loss_rate=self.rng.choice([0.0, 0.02, 0.1]),
            duplicate_rate=self.rng.choice([0.0, 0.05]),
            min_delay_ms=1,
            max_delay_ms=self.rng.choice([3, 20, 60]),
        )

    def new_link(self, broker: BrokerActor) -> ControllerLink:
        """broker/link for a broker process that starts now."""
        self.links += 1
        broker_id = broker.actor_id
        return ControllerLink(
            self.links,
            broker_id,
            broker.send,
            broker.clock,
            random.Random(self.rng.getrandbits(64)),
            broker.on_metadata,
            broker.on_shut_down,
            lambda text: self.trace.add(self.clock.now_ms, f"broker {broker_id}: {text}"),
        )

    def check(self) -> None:
        self.invariants.check()
        self.quorum.check()

    def run(self) -> None:
        self.quorum.start()
        for broker in self.brokers.values():
            broker.start()
        self.scheduler.after(300, self.create_topic, "create topic")
        self.scheduler.after(400, self.write, "write")
        self.scheduler.after(self.rng.randint(500, 1500), self.inject_fault, "fault")
        self.scheduler.run_until(self.chaos_ms, self.check)
        self.heal()
        self.check_liveness()

    def create_topic(self) -> None:
        """An admin's CreateTopics, retried until it succeeds (or finds the topic made by
        an attempt whose answer was lost)."""

        def done(code: int) -> None:
            if code in (errors.NONE, errors.code_of("TOPIC_ALREADY_EXISTS")):
                self.trace.add(self.clock.now_ms, f"topic {TOPIC} created")
            else:
                self.scheduler.after(100, self.create_topic, "create topic")

        self.quorum.create_topic(m.CreatableTopic(TOPIC, 1, 3, [], {}), done)

    def write(self) -> None:
        leaders = [b for b in self.brokers.values() if b.state is not None and b.state.is_leader]
        if leaders:
            self.writes += 1
            self.rng.choice(leaders).produce(f"w{self.writes}")
        self.scheduler.after(self.rng.randint(2, 30), self.write, "write")

    def inject_fault(self) -> None:
        if not self.chaos:
            return
        action = self.rng.choice(
            ["crash", "crash_leader", "isolate", "link_faults", "heal", "pause", "shutdown"]
            + ["crash_controller", "crash_active", "crash_active", "cut_controller"]
            + ["pause_controller", "clock_step", "clock_step", "heal"]
            + (["lose_quorum"] if self.rng.random() < 0.2 else [])
        )
        if action in CONTROLLER_FAULTS:
            self.inject_controller_fault(action)
        else:
            self.inject_broker_fault(action)
        self.scheduler.after(self.rng.randint(100, 1000), self.inject_fault, "fault")

    def inject_broker_fault(self, action: str) -> None:
        broker = self.brokers[self.rng.choice(list(self.brokers))]
        if action == "crash_leader":
            broker = next(
                (b for b in self.brokers.values() if b.state is not None and b.state.is_leader),
                broker,
            )
        if action in ("crash", "crash_leader") and broker.alive:
            broker.crash()
            self.scheduler.after(
                self.rng.randint(50, 1500), lambda: self.restart(broker), "restart"
            )
        elif action == "isolate":
            self.network.isolate(broker.actor_id)
            self.trace.add(self.clock.now_ms, f"isolate broker {broker.actor_id}")
        elif action == "link_faults":
            self.network.faults = self.random_link_faults()
        elif action == "pause" and broker.alive and not broker.inbox:
            broker.pause(self.rng.randint(100, 1500))
        elif action == "shutdown" and broker.alive:
            broker.shutting_down = True
            self.trace.add(self.clock.now_ms, f"broker {broker.actor_id}: controlled shutdown")
        elif action == "heal":
            self.network.heal()
            self.trace.add(self.clock.now_ms, "network healed")

    def inject_controller_fault(self, action: str) -> None:
        """Controllers crash (the active one often), lose their links to the other
        controllers or to the brokers, pause; now and then a majority goes down for a
        while; a node's clock leaps (a broker's back, too)."""
        quorum, now_ms = self.quorum, self.clock.now_ms
        actor = quorum.actors[self.rng.choice(CONTROLLER_IDS)]
        if action == "crash_active":
            actor = quorum.active() or actor
        if action in ("crash_controller", "crash_active"):
            quorum.crash(actor, "fault injection", self.rng.randint(50, 1000))
        elif action == "lose_quorum":
            down_ms = self.rng.randint(500, 3000)
            for victim in self.rng.sample(list(quorum.actors.values()), 2):
                quorum.crash(victim, "quorum lost", down_ms + self.rng.randint(0, 300))
        elif action == "cut_controller":
            others = [n for n in CONTROLLER_IDS if n != actor.actor_id]
            cut_from = self.rng.choice([others, list(BROKER_IDS), others + list(BROKER_IDS)])
            pairs = self.network.cut_between([actor.actor_id], cut_from)
            self.trace.add(now_ms, f"controller {actor.actor_id} cut from {cut_from}")
            self.scheduler.after(
                self.rng.randint(200, 2500), lambda: self.network.mend(pairs), "mend"
            )
        elif action == "pause_controller" and actor.node is not None and not actor.paused:
            actor.pause(self.rng.randint(100, 1500))
        elif action == "clock_step":
            node = self.rng.choice(sorted(self.clocks))
            step_ms = self.clocks[node].random_step(self.rng)
            self.trace.add(now_ms, f"node {node}: clock steps {step_ms:+} ms")

    def restart(self, broker: BrokerActor) -> None:
        if not broker.alive:
            broker.start()

    def heal(self) -> None:
        self.chaos = False
        self.network.heal()
        self.network.faults = LinkFaults(min_delay_ms=1, max_delay_ms=5)
        self.trace.add(self.clock.now_ms, "=== faults healed: liveness phase ===")
        for actor in self.quorum.actors.values():
            self.quorum.restart(actor)
        for broker in self.brokers.values():
            self.restart(broker)

    def check_liveness(self, bound_ms: int = 10_000) -> None:
        """After healing, a controller is active again, the ISR refills and a new write is
        acknowledged."""
        deadline = self.clock.now_ms + bound_ms
        acked_before = len(self.invariants.acked)
        while self.clock.now_ms < deadline:
            self.scheduler.run_until(self.clock.now_ms + 50, self.check)
            p = self.quorum.newest_image().partition(TOPIC, 0)
            if p is not None and len(p.isr) == 3 and len(self.invariants.acked) > acked_before:
                return
        p = self.quorum.newest_image().partition(TOPIC, 0)
        states = "\n".join(b.status() for b in self.brokers.values())
        controllers = "\n".join(
            f"controller {a.actor_id}: {a.node.status() if a.node else 'down'}"
            for a in self.quorum.actors.values()
        )
        self.fail(
            f"liveness: after healing, partition {p} and "
            f"{len(self.invariants.acked) - acked_before} new acks in {bound_ms} ms;"
            f"\n{states}\n{controllers}"
        )


def run_seed(seed: int, echo_trace: bool = False) -> ReplicationCluster:
    cluster = ReplicationCluster(seed, echo_trace=echo_trace)
    cluster.run()
    return cluster
