"""Property test: three replicas with fake logs, a toy controller, and random
interleavings of appends, acks=all produces, fetch requests and responses (delayed,
dropped, answered by whoever receives them), ISR proposals and answers (committed,
rejected, timed out before or after the controller applied them), metadata delivered
late, ticks, and leader changes.

Invariants, checked after every step:
- a broker's high watermark never moves back (leader or follower, across role changes);
- every record ever below some leader's HW ("committed") is present, identical, on
  every replica in the controller's committed ISR;
- the controller only elects a leader holding every committed record;
- an acknowledged acks=all record is committed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from test_replication_fakes import Record, Replica

from rillet.broker.replication.types import (
    AlterPartitionResponse,
    FetchRequest,
    FetchResponse,
    ProposeAlterPartition,
)
from rillet.client.wire import errors

BROKERS = (1, 2, 3)
LAG_MS = 50
MIN_ISR = 2
E = errors.code_of


@dataclass(frozen=True)
class Version:
    """One committed PartitionChange in the toy controller's metadata log."""

    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]


class ReplicationMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.now = 0
        self.replicas = {b: Replica(b, LAG_MS) for b in BROKERS}
        self.versions = [Version(1, 1, 1, BROKERS)]
        self.applied = {b: 0 for b in BROKERS}
        self.alter_inbox: list[tuple[int, ProposeAlterPartition]] = []
        self.alter_replies: list[tuple[int, int, AlterPartitionResponse]] = []
        self.fetch_requests: dict[int, tuple[int, FetchRequest]] = {}
        self.fetch_responses: dict[int, tuple[FetchResponse, list[Record]]] = {}
        self.committed: list[Record] = []
        self.last_hw = {b: 0 for b in BROKERS}
        self.acked: dict[str, tuple[int, int]] = {}  # produce id -> (first, end offset)
        self.next_value = 0
        for b in BROKERS:
            self._apply_metadata(b)

    # ---- helpers ------------------------------------------------------------------

    @property
    def current(self) -> Version:
        return self.versions[-1]

    def _collect(self, broker: int) -> None:
        replica = self.replicas[broker]
        self.alter_inbox.extend((broker, p) for p in replica.proposals)
        replica.proposals.clear()

    def _apply_metadata(self, broker: int) -> None:
        version = self.versions[self.applied[broker]]
        self.applied[broker] += 1
        replica = self.replicas[broker]
        if version.leader == broker:
            effects = replica.state.become_leader(
                version.leader_epoch, version.partition_epoch, BROKERS, version.isr, self.now
            )
        else:
            effects = replica.state.become_follower(
                version.leader, version.leader_epoch, version.partition_epoch, BROKERS, version.isr
            )
        replica.apply(effects)
        self._collect(broker)

    def _commit(self, leader: int, leader_epoch: int, isr: tuple[int, ...]) -> Version:
        version = Version(leader, leader_epoch, self.current.partition_epoch + 1, isr)
        self.versions.append(version)
        return version

    # ---- what is enabled (rules only run when they can do something) -------------

    def _behind(self) -> list[int]:
        return [b for b in BROKERS if self.applied[b] < len(self.versions)]

    def _believed_leaders(self) -> list[int]:
        return [b for b in BROKERS if self.replicas[b].state.is_leader]

    def _idle_followers(self) -> list[int]:
        return [
            b
            for b in BROKERS
            if self.replicas[b].state.fetch_request() is not None
            and b not in self.fetch_requests
            and b not in self.fetch_responses
        ]

    def _electable(self) -> list[int]:
        return [b for b in self.current.isr if b != self.current.leader]

    # ---- rules: metadata and the controller ----------------------------------------

    @precondition(lambda self: self._behind())
    @rule(pick=st.integers(0, 2), all_of_it=st.booleans())
    def deliver_metadata(self, pick: int, all_of_it: bool) -> None:
        behind = self._behind()
        broker = behind[pick % len(behind)]
        self._apply_metadata(broker)
        while all_of_it and self.applied[broker] < len(self.versions):
            self._apply_metadata(broker)

    @precondition(lambda self: self._electable())
    @rule(pick=st.integers(0, 2), remove_old=st.booleans())
    def elect_new_leader(self, pick: int, remove_old: bool) -> None:
        """Failover: the controller picks another committed-ISR member."""
        cur = self.current
        candidates = self._electable()
        new_leader = candidates[pick % len(candidates)]
        log = self.replicas[new_leader].log
        n = len(self.committed)
        assert log.read(0, n) == self.committed, f"elected {new_leader} lacks committed data"
        isr = tuple(b for b in cur.isr if not (remove_old and b == cur.leader))
        self._commit(new_leader, cur.leader_epoch + 1, isr)

    @precondition(lambda self: self._electable())
    @rule(pick=st.integers(0, 2))
    def fence_follower(self, pick: int) -> None:
        """The controller drops a follower from the ISR (broker fenced)."""
        cur = self.current
        followers = self._electable()
        gone = followers[pick % len(followers)]
        self._commit(cur.leader, cur.leader_epoch, tuple(b for b in cur.isr if b != gone))

    @precondition(lambda self: self.alter_inbox)
    @rule(pick=st.integers(0, 5), outcome=st.sampled_from(["apply", "lost", "late", "ineligible"]))
    def controller_handles_alter(self, pick: int, outcome: str) -> None:
        broker, proposal = self.alter_inbox.pop(pick % len(self.alter_inbox))
        cur = self.current
        if outcome == "lost":
            reply = AlterPartitionResponse(E("REQUEST_TIMED_OUT"))
        elif proposal.leader_epoch != cur.leader_epoch or proposal.leader_id != cur.leader:
            reply = AlterPartitionResponse(E("FENCED_LEADER_EPOCH"))
        elif proposal.partition_epoch != cur.partition_epoch:
            reply = AlterPartitionResponse(E("INVALID_UPDATE_VERSION"))
        elif outcome == "ineligible" and len(proposal.new_isr) > len(cur.isr):
            reply = AlterPartitionResponse(E("INELIGIBLE_REPLICA"))
        else:
            version = self._commit(cur.leader, cur.leader_epoch, proposal.new_isr)
            reply = AlterPartitionResponse(
                errors.NONE, version.isr, version.leader_epoch, version.partition_epoch
            )
            if outcome == "late":  # applied, but the answer is a timeout
                reply = AlterPartitionResponse(E("REQUEST_TIMED_OUT"))
        self.alter_replies.append((broker, proposal.proposal_id, reply))

    @precondition(lambda self: self.alter_replies)
    @rule(pick=st.integers(0, 5))
    def deliver_alter_reply(self, pick: int) -> None:
        broker, proposal_id, reply = self.alter_replies.pop(pick % len(self.alter_replies))
        replica = self.replicas[broker]
        replica.apply(replica.state.on_alter_partition_response(proposal_id, reply))
        self._collect(broker)

    # ---- rules: brokers -------------------------------------------------------------

    @precondition(lambda self: self._believed_leaders())
    @rule(pick=st.integers(0, 2), count=st.integers(1, 3), acks_all=st.booleans())
    def append(self, pick: int, count: int, acks_all: bool) -> None:
        leaders = self._believed_leaders()  # a deposed leader may still append
        broker = leaders[pick % len(leaders)]
        replica = self.replicas[broker]
        values = [f"v{self.next_value + i}" for i in range(count)]
        self.next_value += count
        if not acks_all:
            replica.append(values, self.now)
        else:
            produce_id = values[0]
            if replica.produce(produce_id, values, MIN_ISR, self.now, timeout_ms=2_000) is None:
                end = replica.log.log_end_offset
                self.acked[produce_id] = (end - count, end)
        self._collect(broker)

    def _send_fetch(self, broker: int) -> None:
        state = self.replicas[broker].state
        request = state.fetch_request()
        assert request is not None and state.leader_id is not None
        self.fetch_requests[broker] = (state.leader_id, request)

    def _serve_fetch(self, broker: int) -> None:
        target, request = self.fetch_requests.pop(broker)
        self.fetch_responses[broker] = self.replicas[target].serve(request, self.now)
        self._collect(target)

    def _deliver_fetch_response(self, broker: int) -> None:
        self.replicas[broker].receive(*self.fetch_responses.pop(broker))

    @precondition(lambda self: self._idle_followers())
    @rule(pick=st.integers(0, 2))
    def send_fetch(self, pick: int) -> None:
        idle = self._idle_followers()
        self._send_fetch(idle[pick % len(idle)])

    @precondition(lambda self: self._idle_followers())
    @rule(pick=st.integers(0, 2), rounds=st.integers(1, 4))
    def fetch_round_trips(self, pick: int, rounds: int) -> None:
        """The common case, compressed: request, answer and response back to back."""
        idle = self._idle_followers()
        broker = idle[pick % len(idle)]
        for _ in range(rounds):
            if broker not in self._idle_followers():
                break
            self._send_fetch(broker)
            self._serve_fetch(broker)
            self._deliver_fetch_response(broker)

    @precondition(lambda self: self.fetch_requests)
    @rule(pick=st.integers(0, 2), drop=st.booleans())
    def serve_fetch(self, pick: int, drop: bool) -> None:
        broker = sorted(self.fetch_requests)[pick % len(self.fetch_requests)]
        if drop:
            del self.fetch_requests[broker]
        else:
            self._serve_fetch(broker)

    @precondition(lambda self: self.fetch_responses)
    @rule(pick=st.integers(0, 2), drop=st.booleans())
    def deliver_fetch_response(self, pick: int, drop: bool) -> None:
        broker = sorted(self.fetch_responses)[pick % len(self.fetch_responses)]
        if drop:
            del self.fetch_responses[broker]
        else:
            self._deliver_fetch_response(broker)

    @rule(broker=st.sampled_from(BROKERS), dt=st.integers(0, 40))
    def tick(self, broker: int, dt: int) -> None:
        self.now += dt
        replica = self.replicas[broker]
        replica.apply(replica.state.tick(self.now))
        self._collect(broker)

    # ---- invariants -----------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        # One entry point, so the order is fixed: committed records are extended first.
        self._high_watermarks_never_move_back_and_cover_identical_records()
        self._committed_isr_holds_every_committed_record()
        self._acknowledged_writes_are_committed()

    def _high_watermarks_never_move_back_and_cover_identical_records(self) -> None:
        for b, replica in self.replicas.items():
            hw = replica.state.high_watermark
            assert hw >= self.last_hw[b], f"broker {b} HW moved back {self.last_hw[b]} -> {hw}"
            assert hw <= replica.log.log_end_offset
            self.last_hw[b] = hw
            below = replica.log.read(0, hw)
            n = min(hw, len(self.committed))
            assert below[:n] == self.committed[:n], f"broker {b} diverges below its HW"
            if hw > len(self.committed):
                self.committed.extend(below[len(self.committed) :])

    def _committed_isr_holds_every_committed_record(self) -> None:
        n = len(self.committed)
        for b in self.current.isr:
            log = self.replicas[b].log
            assert log.read(0, n) == self.committed, f"ISR member {b} lacks committed records"

    def _acknowledged_writes_are_committed(self) -> None:
        for replica in self.replicas.values():
            for produce_id, code in replica.results.items():
                if code == errors.NONE:
                    first, end = self.acked[produce_id]
                    assert end <= len(self.committed), f"acked {produce_id} not committed"
                    assert self.committed[first][1] == produce_id


EXAMPLES = int(os.environ.get("RILLET_REPLICATION_EXAMPLES", "150"))

ReplicationMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_replication_invariants = ReplicationMachine.TestCase
