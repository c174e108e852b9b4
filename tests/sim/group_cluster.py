"""A seeded simulation of one consumer group: the real GroupCoordinator core driven by
simulated consumers whose heartbeats and responses are lost, who crash, restart (static
or dynamic), leave, change subscriptions and commit, while topics grow and time jumps.

Consumers follow the KIP-848 client contract: they give up what a response no longer
lists before heartbeating again, drop everything on FENCED_MEMBER_EPOCH or
UNKNOWN_MEMBER_ID and rejoin with epoch 0, and treat their partitions as lost once a
whole session timeout passed without an answer (so a silent consumer never outlives the
membership the coordinator keeps for it).

Checked after every event:
- the coordinator never lists a partition under two members (assigned or revoking);
- a consumer the coordinator still knows owns only what the coordinator lists for it,
  so no two such consumers own one partition at once;
- a commit the coordinator accepts comes from a consumer it lists as that partition's
  owner, at the member's current epoch;
and at the end, after faults stop: the group settles (STABLE), every subscribed
partition is assigned, and each consumer owns exactly its listed partitions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from rillet.broker.group import records_codec as codec
from rillet.broker.group.assignors import TopicSpec
from rillet.broker.group.coordinator import (
    NONE,
    GroupConfig,
    GroupCoordinator,
    GroupState,
    Heartbeat,
    HeartbeatResponse,
    OffsetCommit,
    OffsetCommitResponse,
    OffsetDeleteResponse,
    Step,
)
from rillet.client.group_membership import nest

SESSION_MS = 3_000
REBALANCE_MS = 2_000
INTERVAL_MS = 200


class SimulationFailure(AssertionError):
    pass


@dataclass
class Consumer:
    name: str
    static: bool
    incarnation: int = 0
    member_id: str = ""
    epoch: int = 0
    owned: set[tuple[str, int]] = field(default_factory=set)
    alive: bool = True
    last_answer_ms: int = 0
    topics: frozenset[str] = frozenset({"a"})

    @property
    def instance_id(self) -> str | None:
        return self.name if self.static else None

    def new_incarnation(self, keep_id: bool = False) -> None:
        # A fenced client may rejoin under the same member id (Kafka 4.0 clients keep it).
        if not keep_id or not self.member_id:
            self.incarnation += 1
            self.member_id = f"{self.name}-{self.incarnation}"
        self.epoch = 0
        self.owned = set()


def group_state(g: GroupCoordinator) -> tuple[object, ...]:
    """What the records must carry: everything but the timers, which restart on load."""
    members = {
        mid: replace(m, session_deadline_ms=0, rebalance_deadline_ms=None)
        for mid, m in sorted(g.members.items())
    }
    return (
        g.group_epoch,
        g.target_assignment_epoch,
        members,
        dict(sorted(g.static_members.items())),
        {m: {t: ps for t, ps in parts.items() if ps} for m, parts in sorted(g.target.items())},
        dict(sorted(g.offsets.items())),
        dict(g.subscribed_metadata),
    )


class GroupSim:
    def __init__(self, seed: int, echo_trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.echo = echo_trace
        self.trace: list[str] = []
        self.now = 0
        self.coordinator = GroupCoordinator(
            "g", GroupConfig(session_timeout_ms=SESSION_MS, heartbeat_interval_ms=INTERVAL_MS)
        )
        self.topics = {"a": TopicSpec("A", self.rng.randint(1, 8)), "b": TopicSpec("B", 3)}
        self.coordinator.update_topics(self.topics)
        # Built only from the records the live core writes, as a new coordinator loads
        # them: after every event it must hold the same group.
        self.shadow = GroupCoordinator.load("g", [], self.topics, 0, self.coordinator.config)
        n = self.rng.randint(1, 5)
        self.consumers = [Consumer(f"c{i}", static=self.rng.random() < 0.4) for i in range(n)]
        for c in self.consumers:
            c.new_incarnation()
        self.loss = self.rng.choice([0.0, 0.1, 0.3])
        # The records as the offsets partition holds them (records_codec), to check that
        # loading the log, and loading what compaction leaves of it, give the live group.
        self.disk: list[codec.KeyValue] = []

    def log(self, line: str) -> None:
        entry = f"t={self.now} {line}"
        self.trace.append(entry)
        if self.echo:
            print(entry)

    def fail(self, message: str) -> None:
        tail = "\n".join(self.trace[-30:])
        raise SimulationFailure(
            f"seed {self.seed}: {message}\n{tail}\n"
            f"replay: RILLET_SIM_SEED={self.seed} .venv/bin/pytest "
            "tests/test_group_sim.py -k replay -s"
        )

    # --- the consumer side ------------------------------------------------------------

    def heartbeat(self, c: Consumer, lose_response: bool = False) -> None:
        if self.now - c.last_answer_ms >= SESSION_MS and c.epoch > 0:
            self.log(f"{c.member_id} session lapsed on its side: drops {sorted(c.owned)}")
            c.new_incarnation()
        joining = c.epoch == 0
        req = Heartbeat(
            c.member_id,
            c.epoch,
            instance_id=c.instance_id,
            rebalance_timeout_ms=REBALANCE_MS if joining else None,
            subscribed_topics=c.topics if joining else c.topics,
            owned=nest(c.owned),
        )
        step = self.apply(self.coordinator.heartbeat(req, self.now))
        resp = step.response
        assert isinstance(resp, HeartbeatResponse)
        if lose_response:
            self.log(f"{c.member_id} hb@{c.epoch}: response lost ({resp.error_code})")
            return
        self.log(
            f"{c.member_id} hb@{c.epoch} owned={sorted(c.owned)} -> err={resp.error_code} "
            f"epoch={resp.member_epoch} assignment={resp.assignment}"
        )
        c.last_answer_ms = self.now
        if resp.error_code != NONE:
            # Fenced, unknown, or an instance id still held: start over.
            c.new_incarnation(keep_id=self.rng.random() < 0.5)
            return
        c.epoch = resp.member_epoch
        assert resp.assignment is not None
        c.owned = {(t, p) for t, ps in resp.assignment.items() for p in ps}

    def commit(self, c: Consumer) -> None:
        if not c.owned:
            return
        topic_id, p = self.rng.choice(sorted(c.owned))
        name = {t.topic_id: n for n, t in self.topics.items()}[topic_id]
        step = self.apply(
            self.coordinator.commit_offset(
                OffsetCommit(c.member_id, c.epoch, name, p, self.now), self.now
            )
        )
        resp = step.response
        assert isinstance(resp, OffsetCommitResponse)
        self.log(f"{c.member_id} commit {topic_id}-{p}@{c.epoch} -> {resp.error_code}")
        if resp.error_code == NONE:
            owners = self.coordinator.owner_of(topic_id, p)
            member = self.coordinator.members.get(c.member_id)
            if owners != [c.member_id] or member is None or member.member_epoch != c.epoch:
                self.fail(f"commit by {c.member_id} accepted for {topic_id}-{p} owned by {owners}")

    def apply(self, step: Step) -> Step:
        for record in step.records:
            self.shadow.replay(record)
            self.disk += codec.encode(record)
        return step

    def failover(self) -> None:
        """Another coordinator takes over: it loads the group from the log, then is told
        the topics as they are now (they may have changed since the records were
        written), as GroupManager does after a load."""
        self.check_disk()
        records = [r for r in (codec.decode(k, v) for k, v in self.disk) if r is not None]
        config = self.coordinator.config
        self.coordinator = GroupCoordinator.load("g", records, self.topics, self.now, config)
        self.shadow = GroupCoordinator.load("g", records, self.topics, self.now, config)
        self.apply(self.coordinator.update_topics(dict(self.topics)))
        self.shadow.topics = dict(self.topics)
        g = self.coordinator
        if g.members:
            # The change is seen: the target covers the topics as they are now.
            targeted = {
                (t, p) for parts in g.target.values() for t, ps in parts.items() for p in ps
            }
            wanted = {
                (self.topics[t].topic_id, p)
                for t in g.subscribed_topics()
                for p in range(self.topics[t].partitions)
            }
            if targeted != wanted:
                self.fail(f"after a load the target is {sorted(targeted)}, not {sorted(wanted)}")

    def check_disk(self) -> None:
        """Loading the encoded log, whole or compacted, gives the live group."""
        for name, log in (("log", self.disk), ("compacted log", codec.compact(self.disk))):
            decoded = [codec.decode(k, v) for k, v in log]
            records = [r for r in decoded if r is not None]
            loaded = GroupCoordinator.load("g", records, self.topics, 0, self.coordinator.config)
            if group_state(loaded) != group_state(self.coordinator):
                self.fail(
                    f"loading the {name} gives another group:\n{group_state(loaded)}\n"
                    f"live:\n{group_state(self.coordinator)}"
                )

    def admin(self) -> None:
        """What an admin tool does: commit from outside the group (refused while it has
        members), delete the offsets of topic b (refused while subscribed), or delete
        the group (refused unless empty)."""
        g = self.coordinator
        r = self.rng.random()
        if r < 0.4:
            step = self.apply(g.commit_offset(OffsetCommit("", -1, "b", 0, self.now), self.now))
            assert isinstance(step.response, OffsetCommitResponse)
            if step.response.error_code == NONE and g.members:
                self.fail("an admin commit was accepted while the group has members")
            self.log(f"admin commit b-0 -> {step.response.error_code}")
        elif r < 0.8:
            step = self.apply(g.delete_offsets([("b", p) for p in range(3)]))
            assert isinstance(step.response, OffsetDeleteResponse)
            self.log(f"admin deletes offsets of b -> {sorted(step.response.error_codes.items())}")
        else:
            step = self.apply(g.delete_group())
            self.log(f"admin deletes the group -> {step.response}")
            if g.members and step.records:
                self.fail("a group with members was deleted")

    # --- checks -----------------------------------------------------------------------------

    def check(self) -> None:
        g = self.coordinator
        if group_state(self.shadow) != group_state(g):
            self.fail(
                f"replayed records give another group:\n{group_state(self.shadow)}\n"
                f"live:\n{group_state(g)}"
            )
        seen: dict[tuple[str, int], str] = {}
        for m in g.members.values():
            for t, ps in [*m.assigned.items(), *m.pending_revocation.items()]:
                for p in ps:
                    if (t, p) in seen:
                        self.fail(f"{t}-{p} listed under {seen[(t, p)]} and {m.member_id}")
                    seen[(t, p)] = m.member_id
        for c in self.consumers:
            member = g.members.get(c.member_id)
            if not c.alive or member is None or member.left_static:
                continue
            listed = {
                (t, p)
                for part in (member.assigned, member.pending_revocation)
                for t, ps in part.items()
                for p in ps
            }
            if not c.owned <= listed:
                self.fail(f"{c.member_id} owns {sorted(c.owned - listed)} not listed for it")

    # --- the schedule ---------------------------------------------------------------------

    def step(self) -> None:
        r = self.rng.random()
        c = self.rng.choice(self.consumers)
        if r < 0.45:
            if c.alive:
                self.heartbeat(c, lose_response=self.rng.random() < self.loss)
        elif r < 0.55:
            if c.alive:
                self.commit(c)
        elif r < 0.62:
            if c.alive:
                self.log(f"{c.member_id} crashes")
                c.alive = False
                c.owned = set()
        elif r < 0.70:
            if not c.alive:
                c.alive = True
                c.new_incarnation()
                c.last_answer_ms = self.now
                self.log(f"{c.name} restarts as {c.member_id}")
        elif r < 0.75:
            if c.alive and c.epoch > 0:
                epoch = -2 if c.static and self.rng.random() < 0.7 else -1
                self.apply(
                    self.coordinator.heartbeat(
                        Heartbeat(c.member_id, epoch, instance_id=c.instance_id), self.now
                    )
                )
                self.log(f"{c.member_id} leaves with epoch {epoch}")
                c.owned = set()
                c.alive = False
        elif r < 0.78:
            if c.alive:
                c.topics = self.rng.choice([frozenset({"a"}), frozenset({"a", "b"})])
                self.log(f"{c.member_id} subscribes to {sorted(c.topics)}")
        elif r < 0.79:
            self.admin()
        elif r < 0.80:
            self.topics["a"] = TopicSpec("A", self.topics["a"].partitions + 1)
            if self.rng.random() < 0.5:
                self.apply(self.coordinator.update_topics(dict(self.topics)))
                self.shadow.topics = dict(self.topics)
                self.log(f"topic a grows to {self.topics['a'].partitions}")
            else:
                self.log(f"topic a grows to {self.topics['a'].partitions} while led elsewhere")
                self.failover()
        else:
            self.now += self.rng.choice([10, 50, INTERVAL_MS, 1_000, SESSION_MS // 2])
            self.apply(self.coordinator.tick(self.now))
        self.check()

    def settle(self) -> None:
        """No more faults: live consumers heartbeat every interval until all is quiet."""
        for c in self.consumers:
            if not c.alive:
                c.alive = True
                c.new_incarnation()
                c.last_answer_ms = self.now
        for _ in range(60):
            for c in self.consumers:
                self.heartbeat(c)
                self.check()
            self.now += INTERVAL_MS
            self.apply(self.coordinator.tick(self.now))
            self.check()
        g = self.coordinator
        if g.state is not GroupState.STABLE:
            self.fail(f"group did not settle: {g.state}")
        assigned = set()
        for c in self.consumers:
            member = g.members[c.member_id]
            listed = {(t, p) for t, ps in member.assigned.items() for p in ps}
            if c.owned != listed:
                self.fail(f"{c.member_id} owns {sorted(c.owned)}, listed {sorted(listed)}")
            assigned |= listed
        wanted = {
            (self.topics[t].topic_id, p)
            for c in self.consumers
            for t in c.topics
            for p in range(self.topics[t].partitions)
        }
        if assigned != wanted:
            self.fail(f"assigned {sorted(assigned)} but subscribed {sorted(wanted)}")


def run_seed(seed: int, echo_trace: bool = False, steps: int = 400) -> GroupSim:
    sim = GroupSim(seed, echo_trace)
    for n in range(steps):
        sim.step()
        if n % 100 == 99:
            sim.check_disk()
    sim.settle()
    sim.check_disk()
    # Everyone leaves and the group is deleted: loading its records finds no group.
    for c in sim.consumers:
        sim.apply(sim.coordinator.heartbeat(Heartbeat(c.member_id, -1), sim.now))
    sim.apply(sim.coordinator.delete_group())
    sim.check_disk()
    if not sim.coordinator.is_deleted:
        sim.fail("the group is not deleted after every member left")
    return sim
