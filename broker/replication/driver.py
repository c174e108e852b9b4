"""``PartitionDriver``: the one interpreter of a partition core's effects, and the event
entry points that feed the core and apply what it returns.

The driver owns no I/O itself: it takes the partition's storage (its log), its network
(how AlterPartition is sent, how a produce is answered, how waiting fetches are woken)
and a clock as parameters, as Kafka's ``KafkaRaftClient(network, log, time)`` does. The
broker's ReplicaManager passes the real log, an asyncio outbox and the event loop's
clock; the deterministic simulator (tests/sim/replication_cluster.py) and the core's
fake-driven tests pass in-memory ones. So the code that turns effects into I/O, and the
order of the core calls around a leader append, is the same code in production and
under simulation: a mistake here fails a simulation seed, not only a cluster test.

Every method is synchronous and does its storage writes before it returns, so a caller
that must order its side effects (Produce appends, docs/architecture.md "Pipelining")
keeps that order by calling it before its first ``await``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rillet.broker.replication.partition_state import PartitionState
from rillet.broker.replication.types import (
    ACKS_ALL,
    UNDEFINED_OFFSET,
    AlterPartitionResponse,
    AppendFetched,
    AssignEpochStartOffset,
    CompleteProduce,
    Effect,
    FailProduce,
    FetchClock,
    FetchDecision,
    FetchRequest,
    FetchResponse,
    IncrementLogStartOffset,
    ListLeaderLocalStart,
    ProposeAlterPartition,
    Truncate,
    TruncateFullyAndStartAt,
    UpdateHighWatermark,
)
from rillet.client.wire import errors

Clock = Callable[[], int]
"""Milliseconds, monotonic: the event loop's time in a broker, the SimClock in a test."""


class ReplicaStorage(Protocol):
    """The writes the driver makes to a partition's log (broker: ``LogStorage`` around
    storage.Log; tests: an in-memory log)."""

    @property
    def log_end_offset(self) -> int: ...

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None: ...

    def set_high_watermark(self, high_watermark: int) -> None:
        """Retention and compaction must not pass it (a lagging follower still needs the
        records above it)."""
        ...

    def append_as_leader(self, data: Any, leader_epoch: int) -> tuple[int, int]:
        """Append a produce's batches in ``leader_epoch``; (first, last) offset. Raises
        when nothing was appended."""
        ...

    def append_fetched(self, effect: AppendFetched, fetched: Any) -> None: ...

    def truncate_to(self, offset: int) -> None: ...

    def truncate_fully_and_start_at(self, offset: int) -> None: ...

    def increment_log_start_offset(self, offset: int) -> None:
        """Records below ``offset`` are gone (a follower takes its leader's log start)."""
        ...


class ReplicaNetwork(Protocol):
    """What leaves the partition: AlterPartition to the controller, answers to acks=all
    producers, and wake-ups for fetches parked on the partition."""

    def send_alter_partition(self, proposal: ProposeAlterPartition) -> None:
        """Send it; the answer (or REQUEST_TIMED_OUT) must come back through
        ``PartitionDriver.on_alter_partition_response``, once."""
        ...

    def complete_produce(self, produce_id: Hashable, error_code: int) -> None: ...

    def high_watermark_updated(self, high_watermark: int) -> None:
        """Consumers read below the HW: wake their fetches."""
        ...

    def log_appended(self) -> None:
        """Followers read up to the log end: wake their fetches."""
        ...


@dataclass(frozen=True, slots=True)
class LeaderAppend:
    """The outcome of ``PartitionDriver.append_as_leader``: a refusal code, or NONE and
    the offsets the batches got."""

    error_code: int
    first_offset: int = -1
    last_offset: int = -1


class PartitionDriver:
    """One partition's core, driven: every event goes in through a method here, and the
    effects it returns are carried out by ``apply``, in order."""

    __slots__ = ("state", "storage", "network", "clock")

    def __init__(
        self,
        state: PartitionState,
        storage: ReplicaStorage,
        network: ReplicaNetwork,
        clock: Clock,
    ) -> None:
        self.state = state
        self.storage = storage
        self.network = network
        self.clock = clock

    # -- the interpreter ---------------------------------------------------------------

    def apply(self, effects: Sequence[Effect], fetched: Any = None) -> None:
        """Carry out a core call's effects, in order (docs/replication.md, "Effects").
        ``fetched`` holds the bytes (or records) an AppendFetched appends."""
        for effect in effects:
            match effect:
                case AssignEpochStartOffset(epoch, start):
                    self.storage.assign_epoch_start_offset(epoch, start)
                case UpdateHighWatermark(hw):
                    self.storage.set_high_watermark(hw)
                    self.network.high_watermark_updated(hw)
                case CompleteProduce(pid, code) | FailProduce(pid, code):
                    self.network.complete_produce(pid, code)  # type: ignore[arg-type]
                case ProposeAlterPartition():
                    self.network.send_alter_partition(effect)
                case Truncate(offset):
                    self.storage.truncate_to(offset)  # also drops empty epochs at the end
                case TruncateFullyAndStartAt(offset, epochs):
                    self.storage.truncate_fully_and_start_at(offset)
                    for epoch, start in epochs:  # the remote records' epochs, after the cut
                        self.storage.assign_epoch_start_offset(epoch, start)
                case IncrementLogStartOffset(offset):
                    self.storage.increment_log_start_offset(offset)
                case AppendFetched():
                    if fetched is None:
                        raise ValueError("AppendFetched without the fetched bytes")
                    self.storage.append_fetched(effect, fetched)
                    self.network.log_appended()
                case ListLeaderLocalStart():
                    pass  # a question for the leader: the fetcher, which sees it returned, asks
                case _:
                    raise TypeError(f"unknown replication effect {effect!r}")

    # -- metadata and time --------------------------------------------------------------

    def become_leader(
        self,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Sequence[int],
        isr: Sequence[int],
    ) -> None:
        self.apply(
            self.state.become_leader(leader_epoch, partition_epoch, replicas, isr, self.clock())
        )

    def become_follower(
        self,
        leader: int,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Sequence[int],
        isr: Sequence[int],
    ) -> None:
        self.apply(self.state.become_follower(leader, leader_epoch, partition_epoch, replicas, isr))

    def on_brokers_changed(self, broker_ids: Collection[int]) -> None:
        self.state.on_brokers_changed(broker_ids)

    def shutdown(self) -> None:
        """Stop the role: pending acks=all produces fail NOT_LEADER_OR_FOLLOWER."""
        self.apply(self.state.shutdown())

    def tick(self) -> None:
        """Expire acks=all waiters, resend AlterPartitions, propose ISR shrinks."""
        self.apply(self.state.tick(self.clock()))

    def on_alter_partition_response(
        self, proposal_id: int, response: AlterPartitionResponse
    ) -> None:
        self.apply(self.state.on_alter_partition_response(proposal_id, response))

    # -- leader ----------------------------------------------------------------------------

    def append_as_leader(
        self,
        data: Any,
        acks: int,
        min_insync_replicas: int,
        produce_id: Hashable = None,
        deadline_ms: int = 0,
    ) -> LeaderAppend:
        """A produce: check the core may take it, append, let the HW move, and for
        acks=all park ``produce_id`` until the HW passes the batches (its answer comes
        through ``network.complete_produce``, possibly before this returns). A storage
        error propagates with nothing appended and the core untouched."""
        state = self.state
        code = state.check_produce(acks, min_insync_replicas)
        if code is not None:
            return LeaderAppend(code)
        first, last = self.storage.append_as_leader(data, state.leader_epoch)
        now = self.clock()
        self.apply(state.on_leader_append(self.storage.log_end_offset, now))
        self.network.log_appended()
        if acks == ACKS_ALL:
            self.apply(state.await_produce(produce_id, last + 1, min_insync_replicas, deadline_ms))
        return LeaderAppend(errors.NONE, first, last)

    def on_follower_fetch(
        self,
        request: FetchRequest,
        clock: FetchClock | None = None,
        remote_log_start: int = UNDEFINED_OFFSET,
    ) -> FetchDecision:
        """A follower's fetch position reaches the core (HW, ISR expansion); the decision
        says whether to send it records or a diverging epoch. ``clock``: its fetch
        session's (``FetchClock``), None for a sessionless fetch. ``remote_log_start``:
        the remote tier's first offset (UNDEFINED_OFFSET: none)."""
        decision = self.state.on_fetch_request(request, self.clock(), clock, remote_log_start)
        self.apply(decision.effects)
        return decision

    # -- follower --------------------------------------------------------------------------

    def on_fetch_response(self, response: FetchResponse, fetched: Any) -> tuple[Effect, ...]:
        """The leader answered our fetch: truncate, append ``fetched``, move the HW.
        Returns the effects applied (none: the answer changed nothing)."""
        effects = self.state.on_fetch_response(response)
        self.apply(effects, fetched)  # an append that raises leaves the HW where it was
        moved = self.state.on_fetched_appended()
        self.apply(moved)
        return effects + moved

    def on_leader_local_start(
        self,
        question: ListLeaderLocalStart,
        local_start: int,
        remote_epochs: Sequence[tuple[int, int]],
    ) -> tuple[Effect, ...]:
        """The leader's answer to ``question``: empty the log and start it at its local
        log start, with the remote records' epochs (or nothing, if the answer is stale)."""
        effects = self.state.on_leader_local_start(
            question.fetch_offset, question.leader_epoch, local_start, remote_epochs
        )
        self.apply(effects)
        return effects
