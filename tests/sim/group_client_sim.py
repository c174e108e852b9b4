"""A seeded co-simulation of group consumers: several client membership machines
(client/group_membership.py) against the broker's coordinator core
(broker/group/coordinator.py), under a time-ordered scheduler.

Faults: message delays (each direction of a consumer's connection stays in order, as a
TCP connection does), lost requests and responses, consumers that stall (a GC pause or
a stopped process, its timers late), crash and restart (static ones under their
instance id), a coordinator that stalls (its clock jumps past sessions on resume) or
moves (a new one loads the group from the records), partitions added to the topic.

Consumers process records, auto-commit their positions with their member epoch, commit
before revoking, and start a newly assigned partition at the group's committed offset.

Checked after every event:
- no partition is owned (being assigned, consumed or being revoked) by two consumers
  whose lease still holds (a stalled consumer past its lease touches nothing: it
  finds it lost on waking, before consuming);
- a revocation only ever gives up partitions the latest assignment no longer lists, so
  a member that keeps a partition across a rebalance keeps consuming it;
- a commit the coordinator accepts never moves a partition's offset backwards and is
  never ahead of what some consumer processed;
and once faults stop, the group settles: every consumer STABLE, every partition of the
topic owned by exactly one of them, each owning what the coordinator lists.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from rillet.broker.group.assignors import TopicSpec
from rillet.broker.group.coordinator import (
    NONE,
    GroupConfig,
    GroupCoordinator,
    GroupRecord,
    GroupState,
    Heartbeat,
    HeartbeatResponse,
    OffsetCommit,
    OffsetCommitResponse,
)
from rillet.client.group_membership import (
    Assign,
    Effect,
    Fatal,
    GroupMembership,
    HeartbeatRequest,
    HeartbeatResult,
    Lose,
    MembershipConfig,
    Revoke,
    SendHeartbeat,
    State,
)
from rillet.client.wire import errors

SESSION_MS = 3_000
REBALANCE_MS = 2_000
INTERVAL_MS = 200
REQUEST_TIMEOUT_MS = 800
COMMIT_INTERVAL_MS = 300
TOPIC, TOPIC_ID = "t", "T"
STALE_MEMBER_EPOCH = errors.code_of("STALE_MEMBER_EPOCH")
FENCED = {errors.code_of("FENCED_MEMBER_EPOCH"), errors.code_of("UNKNOWN_MEMBER_ID")}


class SimulationFailure(AssertionError):
    pass


@dataclass
class SimConsumer:
    name: str
    static: bool
    machine: GroupMembership
    incarnation: int = 1
    alive: bool = True
    stalled_until: int = 0
    positions: dict[int, int] = field(default_factory=dict)
    """partition -> next offset to process (only for partitions consuming)."""
    revoking: set[int] = field(default_factory=set)
    """Partitions being revoked: no longer handed to the application, so the position
    the revocation commits is final."""
    committing: bool = False
    commit_queue: list[tuple[dict[int, int], int, Callable[[], None]]] = field(default_factory=list)
    """Commits wait for the one in flight (retries included), as the driver's lock does:
    a retried older commit must never land after a newer one."""
    wake_at: int | None = None
    """The timer event pending for the machine's next wakeup (one at a time)."""
    to_coordinator_at: int = 0
    from_coordinator_at: int = 0
    """Delivery time of the latest message each way: later ones never overtake it."""

    @property
    def runnable(self) -> bool:
        return self.alive


class GroupClientSim:
    def __init__(self, seed: int, echo_trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.echo = echo_trace
        self.trace: list[str] = []
        self.now = 0
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._order = 0
        self.config = GroupConfig(session_timeout_ms=SESSION_MS, heartbeat_interval_ms=INTERVAL_MS)
        self.partitions = self.rng.randint(1, 8)
        self.coordinator = GroupCoordinator("g", self.config)
        self.coordinator.update_topics(self._topics())
        self.records: list[GroupRecord] = []
        self.coordinator_epoch = 0
        """Bumped when the coordinator moves: answers of the old one never arrive."""
        self.coordinator_stalled_until = 0
        self.high_watermark: dict[int, int] = {}
        self.processed: dict[int, int] = {}
        """partition -> highest offset any consumer processed, plus one."""
        self.committed: dict[int, int] = {}
        self.loss = self.rng.choice([0.0, 0.05, 0.2])
        self.max_delay = self.rng.choice([5, 50, 300])
        n = self.rng.randint(1, 5)
        self.consumers = [self._new_consumer(f"c{i}", self.rng.random() < 0.4) for i in range(n)]
        self.faults = True
        for c in self.consumers:
            self.run_effects(c, c.machine.subscribe([TOPIC], self.now))
        self.at(0, self.coordinator_tick)

    # --- plumbing ----------------------------------------------------------------------

    def _topics(self) -> dict[str, TopicSpec]:
        return {TOPIC: TopicSpec(TOPIC_ID, self.partitions)}

    def _new_consumer(self, name: str, static: bool, incarnation: int = 1) -> SimConsumer:
        machine = GroupMembership(
            MembershipConfig(
                "g",
                f"{name}-{incarnation}",
                instance_id=name if static else None,
                session_timeout_ms=SESSION_MS,
                rebalance_timeout_ms=REBALANCE_MS,
            )
        )
        machine.names = {TOPIC_ID: TOPIC}
        c = SimConsumer(name, static, machine, incarnation)
        self.at(self.now + self.rng.randint(0, 50), lambda: self.process(c))
        self.at(self.now + COMMIT_INTERVAL_MS, lambda: self.auto_commit(c, c.incarnation))
        return c

    def at(self, when: int, fn: Callable[[], None]) -> None:
        self._order += 1
        heapq.heappush(self._queue, (when, self._order, fn))

    def log(self, line: str) -> None:
        entry = f"t={self.now} {line}"
        self.trace.append(entry)
        if self.echo:
            print(entry)

    def fail(self, message: str) -> None:
        tail = "\n".join(self.trace[-40:])
        raise SimulationFailure(
            f"seed {self.seed}: {message}\n{tail}\n"
            f"replay: RILLET_SIM_SEED={self.seed} .venv/bin/pytest "
            "tests/test_group_client_sim.py -k replay -s"
        )

    def delay(self) -> int:
        return self.rng.randint(1, self.max_delay)

    def lost(self) -> bool:
        return self.faults and self.rng.random() < self.loss

    def send(
        self,
        c: SimConsumer,
        handle: Callable[[], object],
        reply: Callable[[object], None],
        timeout: Callable[[], None],
    ) -> None:
        """A request over c's connection: in order each way; either may be lost (then
        ``timeout`` runs after the request timeout)."""
        incarnation, coordinator_epoch = c.incarnation, self.coordinator_epoch
        sent = self.now
        if self.lost():
            self.at(sent + REQUEST_TIMEOUT_MS, lambda: self.on_client(c, incarnation, timeout))
            return
        arrive = max(c.to_coordinator_at, sent + self.delay())
        c.to_coordinator_at = arrive

        def delivered() -> None:
            if self.coordinator_epoch != coordinator_epoch:
                self.at(sent + REQUEST_TIMEOUT_MS, lambda: self.on_client(c, incarnation, timeout))
                return
            if self.now < self.coordinator_stalled_until:
                # A stalled coordinator handles the request when it resumes, having
                # first expired what lapsed meanwhile (its tick runs before).
                self.at(self.coordinator_stalled_until + 1, delivered)
                return
            answer = handle()
            if self.lost() or self.now - sent >= REQUEST_TIMEOUT_MS:
                self.at(
                    max(self.now, sent + REQUEST_TIMEOUT_MS),
                    lambda: self.on_client(c, incarnation, timeout),
                )
                return
            back = max(c.from_coordinator_at, self.now + self.delay())
            if back - sent >= REQUEST_TIMEOUT_MS:
                self.at(sent + REQUEST_TIMEOUT_MS, lambda: self.on_client(c, incarnation, timeout))
                return
            c.from_coordinator_at = back
            self.at(back, lambda: self.on_client(c, incarnation, lambda: reply(answer)))

        self.at(arrive, delivered)

    def on_client(self, c: SimConsumer, incarnation: int, fn: Callable[[], None]) -> None:
        """Run fn in consumer c once it is running (a stalled one runs it on waking)."""
        if not c.alive or c.incarnation != incarnation:
            return
        if self.now < c.stalled_until:
            self.at(c.stalled_until, lambda: self.on_client(c, incarnation, fn))
            return
        self.run_effects(c, c.machine.poll(self.now))  # timers first: a lapsed lease
        fn()
        self.wake(c)
        self.check()

    def wake(self, c: SimConsumer) -> None:
        self.run_effects(c, c.machine.poll(self.now))
        when = c.machine.next_wakeup_ms()
        if when is None:
            return
        when = max(when, self.now + 1)
        if c.wake_at is not None and c.wake_at <= when:
            return
        c.wake_at = when
        incarnation = c.incarnation

        def timer() -> None:
            if c.wake_at == when:
                c.wake_at = None
                self.on_client(c, incarnation, lambda: None)

        self.at(when, timer)

    def apply(self, step_records: tuple[GroupRecord, ...]) -> None:
        self.records += step_records

    # --- the coordinator ---------------------------------------------------------------

    def coordinator_tick(self) -> None:
        if self.now >= self.coordinator_stalled_until:
            self.apply(self.coordinator.tick(self.now).records)
            self.check()
        self.at(self.now + 100, self.coordinator_tick)

    def move_coordinator(self) -> None:
        self.coordinator_epoch += 1
        self.coordinator = GroupCoordinator.load(
            "g", self.records, self._topics(), self.now, self.config
        )
        self.log("coordinator moves: a new one loads the group")

    def heartbeat_at_coordinator(self, req: HeartbeatRequest) -> HeartbeatResponse:
        step = self.coordinator.heartbeat(
            Heartbeat(
                req.member_id,
                req.member_epoch,
                instance_id=req.instance_id,
                rack=req.rack,
                rebalance_timeout_ms=req.rebalance_timeout_ms,
                subscribed_topics=(
                    None if req.subscribed_topics is None else frozenset(req.subscribed_topics)
                ),
                server_assignor=req.server_assignor,
                owned=None if req.owned is None else dict(req.owned),
            ),
            self.now,
        )
        self.apply(step.records)
        assert isinstance(step.response, HeartbeatResponse)
        return step.response

    def commit_at_coordinator(self, member_id: str, epoch: int, p: int, offset: int) -> int:
        step = self.coordinator.commit_offset(
            OffsetCommit(member_id, epoch, TOPIC, p, offset), self.now
        )
        self.apply(step.records)
        assert isinstance(step.response, OffsetCommitResponse)
        code = step.response.error_code
        if code == NONE:
            previous = self.committed.get(p, 0)
            if offset < previous:
                self.fail(f"commit of {p}@{offset} by {member_id} moves back from {previous}")
            if offset > self.processed.get(p, 0):
                self.fail(f"commit of {p}@{offset} ahead of what was processed")
            self.committed[p] = offset
        self.log(f"commit {member_id}@{epoch} {p}:{offset} -> {code}")
        return code

    # --- the consumer's driver -------------------------------------------------------------

    def run_effects(self, c: SimConsumer, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, SendHeartbeat):
                self.send_heartbeat(c, effect.request)
            elif isinstance(effect, Revoke):
                self.revoke(c, effect)
            elif isinstance(effect, Assign):
                self.assign(c, effect)
            elif isinstance(effect, Lose):
                self.log(f"{c.machine.member_id} loses {sorted(effect.partitions)}")
                for _, p in effect.partitions:
                    c.positions.pop(p, None)
                    c.revoking.discard(p)
            elif isinstance(effect, Fatal):
                self.fail(f"{c.machine.member_id}: fatal {effect.error!r}")

    def send_heartbeat(self, c: SimConsumer, req: HeartbeatRequest) -> None:
        m = c.machine
        self.log(f"{m.member_id} hb@{req.member_epoch} owned={req.owned}")

        def reply(answer: object) -> None:
            assert isinstance(answer, HeartbeatResponse)
            result = HeartbeatResult(
                answer.error_code,
                answer.member_epoch,
                answer.heartbeat_interval_ms,
                answer.assignment,
            )
            self.log(
                f"{m.member_id} <- err={answer.error_code} epoch={answer.member_epoch} "
                f"assignment={answer.assignment}"
            )
            effects = m.on_heartbeat_response(result, self.now)
            if answer.assignment is not None and answer.error_code == NONE:
                target = {(TOPIC, p) for ps in answer.assignment.values() for p in ps}
                for e in effects:
                    if isinstance(e, Revoke) and e.partitions & target:
                        self.fail(f"{m.member_id} revokes {e.partitions & target} it keeps")
            self.run_effects(c, effects)

        def timeout() -> None:
            self.log(f"{m.member_id} heartbeat failed")
            self.run_effects(c, m.on_heartbeat_failed(self.now))

        self.send(c, lambda: self.heartbeat_at_coordinator(req), reply, timeout)

    def commit(self, c: SimConsumer, offsets: dict[int, int], done: Callable[[], None]) -> None:
        """Commit with the member's current epoch, one commit at a time; done runs at
        the end either way."""
        c.commit_queue.append((offsets, c.machine.generation, done))
        if not c.committing:
            self._next_commit(c)

    def _next_commit(self, c: SimConsumer) -> None:
        if not c.commit_queue:
            c.committing = False
            return
        c.committing = True
        offsets, generation, done = c.commit_queue.pop(0)

        def finish() -> None:
            done()
            self._next_commit(c)

        self._commit_one(c, offsets, generation, finish)

    def _commit_one(
        self, c: SimConsumer, offsets: dict[int, int], generation: int, done: Callable[[], None]
    ) -> None:
        """STALE_MEMBER_EPOCH retries after a heartbeat interval with the new epoch;
        fenced drops everything."""
        m = c.machine
        offsets = {p: o for p, o in sorted(offsets.items()) if m.owns((TOPIC, p))}
        if not offsets or not m.in_group or m.generation != generation:
            done()
            return
        member_id, epoch = m.member_id, m.member_epoch

        def handle() -> object:
            return {
                p: self.commit_at_coordinator(member_id, epoch, p, o) for p, o in offsets.items()
            }

        def reply(answer: object) -> None:
            assert isinstance(answer, dict)
            codes = set(answer.values())
            if codes & FENCED:
                self.run_effects(c, m.on_fenced(self.now))
                done()
            elif STALE_MEMBER_EPOCH in codes:
                self.at(
                    self.now + INTERVAL_MS,
                    lambda: self.on_client(
                        c, c.incarnation, lambda: self._commit_one(c, offsets, generation, done)
                    ),
                )
            else:
                done()

        self.send(c, handle, reply, done)

    def revoke(self, c: SimConsumer, action: Revoke) -> None:
        m = c.machine
        self.log(f"{m.member_id} revokes {sorted(action.partitions)}")
        c.revoking |= {p for _, p in action.partitions}
        offsets = {p: c.positions[p] for _, p in sorted(action.partitions) if p in c.positions}

        def finished() -> None:
            if not m.is_current(action.seq):
                return
            for _, p in sorted(action.partitions):
                c.positions.pop(p, None)
                c.revoking.discard(p)
            self.run_effects(c, m.revoke_done(action.seq, self.now))

        def committed() -> None:
            # then the listener, which takes a while
            incarnation = c.incarnation
            self.at(
                self.now + self.rng.randint(0, 100),
                lambda: self.on_client(c, incarnation, finished),
            )

        self.commit(c, offsets, committed)

    def assign(self, c: SimConsumer, action: Assign) -> None:
        m = c.machine
        self.log(f"{m.member_id} assigns {sorted(action.partitions)}")

        def handle() -> object:
            return {p: self.committed.get(p, 0) for _, p in sorted(action.partitions)}

        def reply(answer: object) -> None:
            assert isinstance(answer, dict)
            if not m.is_current(action.seq):
                return
            for p, offset in answer.items():
                c.positions[p] = offset
            self.run_effects(c, m.assign_done(action.seq, self.now))

        def timeout() -> None:
            if m.is_current(action.seq):
                self.send(c, handle, reply, timeout)  # OffsetFetch is retried

        self.send(c, handle, reply, timeout)

    def process(self, c: SimConsumer) -> None:
        """The application consumes some records of each partition it consumes."""
        incarnation = c.incarnation

        def consume() -> None:
            m = c.machine
            self.run_effects(c, m.poll(self.now))  # the lease is checked before consuming
            for p in list(c.positions):
                if p in c.revoking:
                    continue
                if not m.owns((TOPIC, p)):
                    self.fail(f"{m.member_id} consumes {p} it does not own")
                end = self.high_watermark.get(p, 0)
                n = min(self.rng.randint(0, 5), end - c.positions[p])
                if n > 0:
                    c.positions[p] += n
                    self.processed[p] = max(self.processed.get(p, 0), c.positions[p])
            self.at(
                self.now + self.rng.randint(20, 100),
                lambda: self.on_client(c, incarnation, consume),
            )

        self.on_client(c, incarnation, consume)

    def auto_commit(self, c: SimConsumer, incarnation: int) -> None:
        def run() -> None:
            self.commit(c, dict(c.positions), lambda: None)
            self.at(self.now + COMMIT_INTERVAL_MS, lambda: self.auto_commit(c, incarnation))

        self.on_client(c, incarnation, run)

    # --- checks -----------------------------------------------------------------------------

    def check(self) -> None:
        seen: dict[tuple[str, int], str] = {}
        for c in self.consumers:
            m = c.machine
            if not c.alive or self.now >= m.lease_deadline_ms():
                continue  # past its lease it drops everything at its next step, first
            for tp in m.owned.values():
                if tp in seen:
                    self.fail(f"{tp} owned by {seen[tp]} and {m.member_id}")
                seen[tp] = m.member_id

    # --- the schedule ---------------------------------------------------------------------

    def fault(self) -> None:
        if not self.faults:
            return
        r = self.rng.random()
        c = self.rng.choice(self.consumers)
        if r < 0.2:
            for p in range(self.partitions):
                self.high_watermark[p] = self.high_watermark.get(p, 0) + self.rng.randint(0, 20)
        elif r < 0.35:
            pause = self.rng.choice([50, INTERVAL_MS * 2, SESSION_MS // 2, SESSION_MS * 2])
            c.stalled_until = max(c.stalled_until, self.now + pause)
            self.log(f"{c.machine.member_id} stalls for {pause} ms")
        elif r < 0.45:
            if c.alive:
                c.alive = False
                self.log(f"{c.machine.member_id} crashes")
        elif r < 0.55:
            if not c.alive:
                i = self.consumers.index(c)
                new = self._new_consumer(c.name, c.static, c.incarnation + 1)
                self.consumers[i] = new
                self.log(f"{c.name} restarts as {new.machine.member_id}")
                self.run_effects(new, new.machine.subscribe([TOPIC], self.now))
        elif r < 0.60:
            if c.alive and c.machine.state is State.STABLE:
                self.log(f"{c.machine.member_id} closes")
                self.run_effects(c, c.machine.leave(self.now))
        elif r < 0.65:
            pause = self.rng.choice([INTERVAL_MS, SESSION_MS // 2, SESSION_MS * 2])
            self.coordinator_stalled_until = self.now + pause
            self.log(f"coordinator stalls for {pause} ms")
        elif r < 0.70:
            self.move_coordinator()
        elif r < 0.73:
            self.partitions += 1
            self.apply(self.coordinator.update_topics(self._topics()).records)
            self.log(f"the topic grows to {self.partitions} partitions")
        self.at(self.now + self.rng.randint(50, 500), self.fault)

    def run_until(self, end: int) -> None:
        budget = 200_000
        while self._queue and self._queue[0][0] <= end:
            budget -= 1
            if budget == 0:
                self.fail("too many events: a timer loop")
            when, _, fn = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            fn()
        self.now = end

    def settle(self) -> None:
        """Faults stop, stopped consumers restart: the group must settle."""
        self.faults = False
        gone = (State.UNSUBSCRIBED, State.PREPARE_LEAVING, State.LEAVING)
        for i, c in enumerate(self.consumers):
            if not c.alive or c.machine.state in gone:
                c.alive = False  # a closing one exits before its leave is answered
                new = self._new_consumer(c.name, c.static, c.incarnation + 1)
                self.consumers[i] = new
                self.run_effects(new, new.machine.subscribe([TOPIC], self.now))
        self.run_until(self.now + 4 * SESSION_MS)
        g = self.coordinator
        if g.state is not GroupState.STABLE:
            self.fail(f"group did not settle: {g.state}")
        owners: dict[tuple[str, int], str] = {}
        for c in self.consumers:
            m = c.machine
            if m.state is not State.STABLE:
                self.fail(f"{m.member_id} is {m.state} after the faults stopped")
            member = g.members.get(m.member_id)
            listed = {(TOPIC, p) for ps in (member.assigned if member else {}).values() for p in ps}
            if set(m.owned.values()) != listed:
                self.fail(f"{m.member_id} owns {sorted(m.owned.values())}, listed {sorted(listed)}")
            for tp in listed:
                owners[tp] = m.member_id
        wanted = {(TOPIC, p) for p in range(self.partitions)}
        if set(owners) != wanted:
            self.fail(f"owned {sorted(owners)}, topic has {sorted(wanted)}")


def run_seed(seed: int, echo_trace: bool = False, duration_ms: int = 20_000) -> GroupClientSim:
    sim = GroupClientSim(seed, echo_trace)
    sim.at(100, sim.fault)
    sim.run_until(duration_ms)
    sim.settle()
    return sim
