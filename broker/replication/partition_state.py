"""Replication state of one partition on one broker, as a sans-I/O core.

This is the decision logic of Kafka's Partition (leader side: follower positions, high
watermark, ISR changes, acks) and of its fetcher (follower side, in follower_state.py),
with no sockets, files or clocks: the driver passes `now_ms` in, reads the log through
the small EpochLogView protocol and applies the effects each call returns.

Effects are returned from the call that caused them (no outbox): every event method
returns a tuple of effects, or a FetchDecision holding them. Apply them in tuple order.
The ordering rules are written in docs/replication.md ("Effects").
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, replace

from rillet.broker.replication.follower_state import FollowerState
from rillet.broker.replication.purgatory import PendingProduce, ProducePurgatory
from rillet.broker.replication.types import (
    ACKS_ALL,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AlterPartitionResponse,
    AppendFetched,
    AssignEpochStartOffset,
    CompleteProduce,
    Effect,
    EpochEndOffset,
    EpochLogView,
    FailProduce,
    FetchClock,
    FetchDecision,
    FetchRequest,
    FetchResponse,
    IncrementLogStartOffset,
    ProposeAlterPartition,
    ReplicationConfig,
    UpdateHighWatermark,
    invariant,
)
from rillet.client.wire import errors

NOT_LEADER_OR_FOLLOWER = errors.code_of("NOT_LEADER_OR_FOLLOWER")
FENCED_LEADER_EPOCH = errors.code_of("FENCED_LEADER_EPOCH")
UNKNOWN_LEADER_EPOCH = errors.code_of("UNKNOWN_LEADER_EPOCH")
NOT_ENOUGH_REPLICAS = errors.code_of("NOT_ENOUGH_REPLICAS")
INVALID_REQUIRED_ACKS = errors.code_of("INVALID_REQUIRED_ACKS")
OFFSET_OUT_OF_RANGE = errors.code_of("OFFSET_OUT_OF_RANGE")
OFFSET_MOVED_TO_TIERED_STORAGE = errors.code_of("OFFSET_MOVED_TO_TIERED_STORAGE")
INELIGIBLE_REPLICA = errors.code_of("INELIGIBLE_REPLICA")

# AlterPartition errors after which the controller certainly did not apply the change:
# the leader goes back to its committed ISR (Kafka: handleAlterPartitionError).
_ALTER_NOT_APPLIED = frozenset(
    errors.code_of(n) for n in ("OPERATION_NOT_ATTEMPTED", "INELIGIBLE_REPLICA")
)
# Errors that mean "your view is stale": keep the pending (maximal) ISR and wait for the
# metadata update that must follow. Any other error is transient: resend on next tick.
_ALTER_AWAIT_METADATA = frozenset(
    errors.code_of(n)
    for n in (
        "FENCED_LEADER_EPOCH",
        "INVALID_UPDATE_VERSION",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "NEW_LEADER_ELECTED",
        "INVALID_REQUEST",
    )
)


class Role(enum.Enum):
    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


class ReplicaProgress:
    """The leader's view of one follower (Kafka: ReplicaState).

    ``clock``: set while the follower is caught up at the leader's log end through a
    fetch session (``FetchClock``): every later fetch of that session repeats this
    position, so the fetch times are at least the clock's time (``settle`` writes them
    in before anything else reads or moves them)."""

    __slots__ = (
        "log_end_offset",
        "last_caught_up_time_ms",
        "last_fetch_time_ms",
        "last_fetch_leader_log_end_offset",
        "clock",
    )

    def __init__(self, last_caught_up_time_ms: int = 0) -> None:
        self.log_end_offset = UNDEFINED_OFFSET  # unknown until the follower fetches
        self.last_caught_up_time_ms = last_caught_up_time_ms
        self.last_fetch_time_ms = 0
        self.last_fetch_leader_log_end_offset = UNDEFINED_OFFSET
        self.clock: FetchClock | None = None

    def caught_up_time_ms(self) -> int:
        clock = self.clock
        if clock is None:
            return self.last_caught_up_time_ms
        return max(self.last_caught_up_time_ms, clock.last_fetch_ms)

    def is_caught_up(self, leader_log_end_offset: int, now_ms: int, lag_max_ms: int) -> bool:
        return (
            self.log_end_offset == leader_log_end_offset
            or now_ms - self.caught_up_time_ms() <= lag_max_ms
        )

    def settle(self) -> None:
        """Write in the session fetches the clock stood for, and detach it."""
        clock = self.clock
        if clock is not None:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, clock.last_fetch_ms)
            self.last_fetch_time_ms = max(self.last_fetch_time_ms, clock.last_fetch_ms)
            self.clock = None

    def on_fetch(
        self,
        fetch_offset: int,
        leader_log_end_offset: int,
        now_ms: int,
        clock: FetchClock | None = None,
    ) -> None:
        """Kafka's updateFetchStateOrThrow: caught up now if it asked for the leader's end,
        or caught up as of its previous fetch if it reached the end the leader had then.
        A session's fetch at the leader's end attaches that session's ``clock``."""
        self.settle()
        if fetch_offset >= leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
            self.clock = clock
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end_offset = leader_log_end_offset
        self.last_fetch_time_ms = now_ms


@dataclass(frozen=True, slots=True)
class PendingIsrChange:
    """An AlterPartition sent but not yet committed (Kafka: PendingExpandIsr /
    PendingShrinkIsr). `maximal_isr` = committed ISR union proposed ISR: the HW waits for
    all of it, so whichever ISR the controller commits holds every record below the HW."""

    kind: str  # "expand" | "shrink"
    proposal: ProposeAlterPartition
    maximal_isr: tuple[int, ...]


class PartitionState:
    """One partition on one broker: leader, follower, or neither (before metadata)."""

    def __init__(
        self,
        broker_id: int,
        log: EpochLogView,
        config: ReplicationConfig | None = None,
        high_watermark: int = 0,
        is_isr_eligible: Callable[[int], bool] | None = None,
    ) -> None:
        """``is_isr_eligible(broker_id)``: may that broker join an ISR now (Kafka's
        isReplicaIsrEligible: registered and unfenced, read from the driver's metadata
        image)? An expansion the controller would refuse is not proposed; default: any."""
        invariant(
            0 <= high_watermark <= log.log_end_offset,
            f"checkpointed HW {high_watermark} outside [0, {log.log_end_offset}]",
        )
        self.broker_id = broker_id
        self.config = config or ReplicationConfig()
        self._log = log
        self.role = Role.NONE
        self.leader_id: int | None = None
        self.leader_epoch = UNDEFINED_EPOCH
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()  # the committed ISR (from metadata or a commit)
        self.high_watermark = high_watermark
        self.leader_epoch_start_offset = UNDEFINED_OFFSET
        self._leader_log_end_offset = UNDEFINED_OFFSET
        self._followers: dict[int, ReplicaProgress] = {}
        self._pending: PendingIsrChange | None = None
        self._awaiting_proposal_id: int | None = None
        self._resend = False
        self._next_proposal_id = 1
        self._purgatory = ProducePurgatory()
        self._follower: FollowerState | None = None
        # A fetch response's leader HW, held while its batches are being appended: the
        # follower HW moves only once they are in the log (on_fetched_appended).
        self._fetched_leader_hw: int | None = None
        self._fetched_leader_start = 0  # the leader's log start in that response
        self._is_isr_eligible = is_isr_eligible
        # Followers the controller refused as INELIGIBLE_REPLICA (e.g. in controlled
        # shutdown, which the metadata image does not show): not proposed again until
        # metadata about that broker changes (on_brokers_changed) or a new leader epoch,
        # or every fetch of theirs would cost a refused AlterPartition.
        self._refused_ineligible: set[int] = set()

    # ---- read-only views -----------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR the HW is computed over: committed ISR, plus a pending expansion's new
        member; a pending shrink still counts its leaving members."""
        return self._pending.maximal_isr if self._pending is not None else self.isr

    @property
    def pending_isr_change(self) -> PendingIsrChange | None:
        return self._pending

    @property
    def high_watermark_behind_epoch_start(self) -> bool:
        """A new leader's HW is the one it knew as a follower, which can sit below
        records the previous leader had already committed, until the followers fetch
        again. Meanwhile the HW answered as the "latest offset" would go backwards (a
        reader taking it as "everything acknowledged so far" would miss acknowledged
        records), so ListOffsets latest answers OFFSET_NOT_AVAILABLE, as Kafka does."""
        return self.is_leader and self.high_watermark < self.leader_epoch_start_offset

    @property
    def pending_produce_count(self) -> int:
        return len(self._purgatory)

    def follower_log_end_offset(self, replica_id: int) -> int:
        """The leader's knowledge of a follower's LEO (UNDEFINED_OFFSET if unknown)."""
        progress = self._followers.get(replica_id)
        return progress.log_end_offset if progress is not None else UNDEFINED_OFFSET

    def log_end_offset(self) -> int:
        if self.role is Role.LEADER:
            return self._leader_log_end_offset
        return self._log.log_end_offset

    def max_readable_offset(self, for_consumer: bool = True) -> int:
        """Exclusive end of what a reader may fetch: the HW for consumers (on a leader or,
        for fetch-from-follower, on a follower), the log end offset for replicas."""
        return self.high_watermark if for_consumer else self.log_end_offset()

    def validate_leader_epoch(self, current_leader_epoch: int | None) -> int | None:
        """Kafka's checkCurrentLeaderEpoch: an older epoch in a request is fenced, a newer
        one means this broker has not seen the metadata yet. None/-1 skips the check."""
        if current_leader_epoch is None or current_leader_epoch == UNDEFINED_EPOCH:
            return None
        if current_leader_epoch < self.leader_epoch:
            return FENCED_LEADER_EPOCH
        if current_leader_epoch > self.leader_epoch:
            return UNKNOWN_LEADER_EPOCH
        return None

    # ---- metadata ------------------------------------------------------------------

    def become_leader(
        self,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Sequence[int],
        isr: Sequence[int],
        now_ms: int,
    ) -> tuple[Effect, ...]:
        """Apply metadata naming this broker leader (Kafka: Partition.makeLeader)."""
        self._check_assignment(replicas, isr, must_be_in_isr=True)
        if self._is_stale(leader_epoch, partition_epoch):
            return ()
        if (
            self.role is Role.LEADER
            and leader_epoch == self.leader_epoch
            and partition_epoch == self.partition_epoch
        ):
            return ()  # redelivery of what we hold; keep any pending ISR change
        was_leader = self.role is Role.LEADER
        effects: list[Effect] = []
        self._follower = None
        self.replicas, self.isr = tuple(replicas), tuple(isr)
        self._pending, self._resend = None, False
        if not was_leader or leader_epoch > self.leader_epoch:
            self._refused_ineligible.clear()
            effects.extend(self._start_leader_epoch(leader_epoch, was_leader, now_ms))
        self._sync_followers(now_ms)
        self.role, self.leader_id = Role.LEADER, self.broker_id
        self.leader_epoch, self.partition_epoch = leader_epoch, partition_epoch
        effects.extend(self._maybe_advance_high_watermark())
        return tuple(effects)

    def become_follower(
        self,
        leader_id: int,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Sequence[int],
        isr: Sequence[int],
    ) -> tuple[Effect, ...]:
        """Apply metadata naming another broker leader (Kafka: Partition.makeFollower).
        No truncation here: the first fetch carries last_fetched_epoch and the leader
        says where we diverge."""
        if leader_id == self.broker_id:
            raise ValueError("become_follower names this broker as leader")
        self._check_assignment(replicas, isr, must_be_in_isr=False)
        if self._is_stale(leader_epoch, partition_epoch):
            return ()
        effects: list[Effect] = []
        same_leader = self.role is Role.FOLLOWER and leader_epoch == self.leader_epoch
        if self.role is Role.LEADER:
            effects.extend(self._purgatory.fail_all(NOT_LEADER_OR_FOLLOWER))
        self.replicas, self.isr = tuple(replicas), tuple(isr)
        self.leader_epoch, self.partition_epoch = leader_epoch, partition_epoch
        if same_leader:
            return tuple(effects)
        self.role, self.leader_id = Role.FOLLOWER, leader_id
        self._followers.clear()
        self._refused_ineligible.clear()
        self._pending, self._resend = None, False
        self._leader_log_end_offset = UNDEFINED_OFFSET
        self.leader_epoch_start_offset = UNDEFINED_OFFSET
        self._follower = FollowerState(self.broker_id, leader_id, leader_epoch, self._log)
        return tuple(effects)

    def shutdown(self) -> tuple[Effect, ...]:
        """Stop replicating this partition (partition removed, broker stopping)."""
        effects = tuple(self._purgatory.fail_all(NOT_LEADER_OR_FOLLOWER))
        self.role, self.leader_id, self._follower = Role.NONE, None, None
        self._followers.clear()
        self._pending, self._resend = None, False
        return effects

    def on_brokers_changed(self, broker_ids: Collection[int]) -> None:
        """Metadata about these brokers changed (registered, fenced, unfenced...): an
        expansion the controller refused as INELIGIBLE_REPLICA may now succeed."""
        self._refused_ineligible.difference_update(broker_ids)

    def _is_stale(self, leader_epoch: int, partition_epoch: int) -> bool:
        if leader_epoch < self._log.latest_epoch:
            # The log holds records of a later epoch, so newer metadata was applied here
            # before: this is an old image (a restarted broker catching up on metadata
            # sees those first). Leading in it would stamp records with an older epoch.
            return True
        if leader_epoch != self.leader_epoch:
            return leader_epoch < self.leader_epoch
        return partition_epoch < self.partition_epoch

    def _check_assignment(
        self, replicas: Sequence[int], isr: Sequence[int], must_be_in_isr: bool
    ) -> None:
        if len(set(replicas)) != len(replicas) or not set(isr) <= set(replicas):
            raise ValueError(f"bad assignment: replicas {list(replicas)}, isr {list(isr)}")
        if self.broker_id not in replicas or (must_be_in_isr and self.broker_id not in isr):
            raise ValueError(f"broker {self.broker_id} not in replicas/isr {replicas}/{isr}")

    def _start_leader_epoch(self, leader_epoch: int, was_leader: bool, now_ms: int) -> list[Effect]:
        """A new leader epoch starts at our log end (Kafka caches it at once, so a
        follower holding later-epoch records from a quick failover can truncate)."""
        start = self._log.log_end_offset
        invariant(self.high_watermark <= start, f"HW {self.high_watermark} above LEO {start}")
        self.leader_epoch_start_offset = start
        self._leader_log_end_offset = start
        if not was_leader:
            self._followers = {}  # every follower's LEO is unknown until it fetches
        for replica_id, progress in self._followers.items():
            progress.settle()
            progress.last_caught_up_time_ms = now_ms if replica_id in self.isr else 0
        return [AssignEpochStartOffset(leader_epoch, start)]

    def _sync_followers(self, now_ms: int) -> None:
        for replica_id in self.replicas:
            if replica_id != self.broker_id and replica_id not in self._followers:
                caught_up = now_ms if replica_id in self.isr else 0
                self._followers[replica_id] = ReplicaProgress(caught_up)
        for replica_id in list(self._followers):
            if replica_id not in self.replicas:
                del self._followers[replica_id]

    # ---- leader: fetches, appends, time --------------------------------------------

    def on_follower_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        last_fetched_epoch: int,
        now_ms: int,
        current_leader_epoch: int | None = None,
        clock: FetchClock | None = None,
        remote_log_start: int = UNDEFINED_OFFSET,
    ) -> FetchDecision:
        """A follower fetched (Kafka: fetchRecords + updateFollowerFetchState). ``clock``:
        the fetch came through a session whose later fetches may leave this partition
        out while it stays caught up (see FetchClock and ``is_idle_follower``).
        ``remote_log_start``: the first offset the remote tier holds (UNDEFINED_OFFSET:
        none); a fetch below the local log start at or above it is answered
        OFFSET_MOVED_TO_TIERED_STORAGE, not OFFSET_OUT_OF_RANGE."""
        error = self.validate_leader_epoch(current_leader_epoch)
        if error is None and (self.role is not Role.LEADER or replica_id not in self._followers):
            error = NOT_LEADER_OR_FOLLOWER
        if error is not None:
            return self._fetch_decision(error)
        if last_fetched_epoch != UNDEFINED_EPOCH:
            epoch, end_offset = self._log.end_offset_for_epoch(last_fetched_epoch)
            if epoch < last_fetched_epoch or end_offset < fetch_offset:
                return self._fetch_decision(errors.NONE, EpochEndOffset(epoch, end_offset))
        if not self._log.log_start_offset <= fetch_offset <= self._leader_log_end_offset:
            tiered = (
                remote_log_start != UNDEFINED_OFFSET
                and remote_log_start <= fetch_offset < self._log.log_start_offset
            )
            return self._fetch_decision(
                OFFSET_MOVED_TO_TIERED_STORAGE if tiered else OFFSET_OUT_OF_RANGE
            )
        self._followers[replica_id].on_fetch(
            fetch_offset, self._leader_log_end_offset, now_ms, clock
        )
        effects = self._maybe_expand_isr(replica_id)
        effects.extend(self._maybe_advance_high_watermark())
        return self._fetch_decision(errors.NONE, None, tuple(effects))

    def on_fetch_request(
        self,
        request: FetchRequest,
        now_ms: int,
        clock: FetchClock | None = None,
        remote_log_start: int = UNDEFINED_OFFSET,
    ) -> FetchDecision:
        """on_follower_fetch for a FetchRequest value."""
        return self.on_follower_fetch(
            request.replica_id,
            request.fetch_offset,
            request.last_fetched_epoch,
            now_ms,
            request.current_leader_epoch,
            clock,
            remote_log_start,
        )

    def is_idle_follower(self, replica_id: int) -> bool:
        """Would the same fetch again change nothing but the follower's fetch times? True
        when this broker leads, the follower is in the committed ISR (so no expansion can
        follow) and its position is the leader's log end (nothing to send). A session
        may then leave the partition unread until something about it changes."""
        if self.role is not Role.LEADER or replica_id not in self.isr:
            return False
        progress = self._followers.get(replica_id)
        return progress is not None and progress.log_end_offset == self._leader_log_end_offset

    def on_leader_append(self, log_end_offset: int, now_ms: int) -> tuple[Effect, ...]:
        """The leader appended records; its log now ends at `log_end_offset`."""
        del now_ms  # kept in the signature: appends are events with a time, like the rest
        if self.role is not Role.LEADER:
            raise ValueError("on_leader_append on a broker that is not the leader")
        invariant(
            log_end_offset >= self._leader_log_end_offset,
            f"leader LEO moved back {self._leader_log_end_offset} -> {log_end_offset}",
        )
        self._leader_log_end_offset = log_end_offset
        return tuple(self._maybe_advance_high_watermark())

    def needs_tick(self) -> bool:
        """Could ``tick`` return effects, now or later, before another event reaches this
        core? Only with acks=all waiters (expiry), an ISR change in flight (a resend)
        or, on a leader, an ISR member not at the leader's log end (a shrink: one at the
        end is caught up however long ago it fetched). A driver with thousands of idle
        partitions ticks only those that do, re-checking a partition after any event."""
        if len(self._purgatory):
            return True
        if self.role is not Role.LEADER:
            return False
        if self._awaiting_proposal_id is not None or self._pending is not None:
            return True
        leo = self._leader_log_end_offset
        followers = self._followers
        return any(followers[r].log_end_offset != leo for r in self.isr if r != self.broker_id)

    def needs_prompt_tick(self) -> bool:
        """Whether a tick now could do what should not wait for the next ISR check:
        expire acks=all waiters, or resend a refused ISR change. A driver ticks these
        every tick interval, and the rest (ISR shrink checks) every half lag time, as
        Kafka's isr-expiration task does."""
        if len(self._purgatory):
            return True
        return self.role is Role.LEADER and self._pending is not None and self._resend

    def tick(self, now_ms: int) -> tuple[Effect, ...]:
        """Time passed: expire acks=all waiters, resend a failed AlterPartition, or
        propose shrinking the ISR (Kafka: maybeShrinkIsr on the isr-expiration timer)."""
        effects: list[Effect] = list(self._purgatory.expire(now_ms))
        if self.role is not Role.LEADER or self._awaiting_proposal_id is not None:
            return tuple(effects)
        if self._pending is not None:
            if self._resend:
                effects.append(self._resend_pending(self._pending))
            return tuple(effects)
        lag_max_ms = self.config.replica_lag_time_max_ms
        leo = self._leader_log_end_offset
        out_of_sync = {
            r
            for r in self.isr
            if r != self.broker_id and not self._followers[r].is_caught_up(leo, now_ms, lag_max_ms)
        }
        if out_of_sync:
            new_isr = tuple(r for r in self.isr if r not in out_of_sync)
            effects.append(self._propose("shrink", new_isr))
        return tuple(effects)

    # ---- leader: ISR changes -------------------------------------------------------

    def _maybe_expand_isr(self, replica_id: int) -> list[Effect]:
        """Kafka's canAddReplicaToIsr + isFollowerInSync: no change in flight, and the
        follower reached both the HW and the start of this leader epoch."""
        if self._pending is not None or self._awaiting_proposal_id is not None:
            return []
        if replica_id in self.isr or replica_id in self._refused_ineligible:
            return []
        if self._is_isr_eligible is not None and not self._is_isr_eligible(replica_id):
            return []  # fenced: the controller would answer INELIGIBLE_REPLICA
        leo = self._followers[replica_id].log_end_offset
        if leo < self.high_watermark or leo < self.leader_epoch_start_offset:
            return []
        new_isr = tuple(r for r in self.replicas if r in self.isr or r == replica_id)
        return [self._propose("expand", new_isr)]

    def _propose(self, kind: str, new_isr: tuple[int, ...]) -> ProposeAlterPartition:
        invariant(self.broker_id in new_isr, f"proposed ISR {new_isr} drops the leader")
        proposal = ProposeAlterPartition(
            proposal_id=self._next_proposal_id,
            leader_id=self.broker_id,
            leader_epoch=self.leader_epoch,
            partition_epoch=self.partition_epoch,
            new_isr=new_isr,
        )
        maximal = tuple(r for r in self.replicas if r in self.isr or r in new_isr)
        self._pending = PendingIsrChange(kind, proposal, maximal)
        return self._send(proposal)

    def _resend_pending(self, pending: PendingIsrChange) -> ProposeAlterPartition:
        """The same change again under a fresh id, so a late answer to the old send
        cannot be mistaken for this one."""
        proposal = replace(pending.proposal, proposal_id=self._next_proposal_id)
        self._pending = replace(pending, proposal=proposal)
        return self._send(proposal)

    def _send(self, proposal: ProposeAlterPartition) -> ProposeAlterPartition:
        invariant(self._awaiting_proposal_id is None, "two AlterPartitions in flight")
        self._next_proposal_id += 1
        self._resend = False
        self._awaiting_proposal_id = proposal.proposal_id
        return proposal

    def on_alter_partition_response(
        self, proposal_id: int, response: AlterPartitionResponse
    ) -> tuple[Effect, ...]:
        """The controller answered ProposeAlterPartition `proposal_id` (Kafka:
        handleAlterPartitionUpdate / handleAlterPartitionError)."""
        if proposal_id != self._awaiting_proposal_id:
            raise ValueError(f"no AlterPartition {proposal_id} is outstanding")
        self._awaiting_proposal_id = None
        pending = self._pending
        if (
            self.role is not Role.LEADER
            or pending is None
            or pending.proposal.proposal_id != proposal_id
        ):
            return ()  # metadata moved on while it was in flight; the answer is stale
        if response.error_code != errors.NONE:
            return self._on_alter_partition_error(response.error_code, pending)
        if (
            response.leader_epoch != self.leader_epoch
            or response.partition_epoch < self.partition_epoch
        ):
            return ()  # stale answer: keep the maximal ISR until metadata arrives
        if self.broker_id not in response.isr or not set(response.isr) <= set(self.replicas):
            raise ValueError(f"controller committed an impossible ISR {response.isr}")
        self.isr = tuple(response.isr)
        self.partition_epoch = response.partition_epoch
        self._pending = None
        return tuple(self._maybe_advance_high_watermark())

    def _on_alter_partition_error(
        self, error_code: int, pending: PendingIsrChange
    ) -> tuple[Effect, ...]:
        if error_code == INELIGIBLE_REPLICA and pending.kind == "expand":
            self._refused_ineligible.update(set(pending.proposal.new_isr) - set(self.isr))
        if error_code in _ALTER_NOT_APPLIED:
            self._pending = None  # the controller says it did not apply it
            return tuple(self._maybe_advance_high_watermark())
        if error_code not in _ALTER_AWAIT_METADATA:
            self._resend = True  # transient (timeout, NOT_CONTROLLER...): resend on tick
        return ()

    # ---- leader: high watermark and acks -------------------------------------------

    def _maybe_advance_high_watermark(self) -> list[Effect]:
        """HW = min LEO over the maximal ISR, the leader's own LEO included; it only
        moves forward (Kafka: maybeIncrementLeaderHW)."""
        if self.role is not Role.LEADER:
            return []
        new_hw = self._leader_log_end_offset
        for replica_id in self.maximal_isr:
            if replica_id != self.broker_id:
                new_hw = min(new_hw, self.follower_log_end_offset(replica_id))
        if new_hw <= self.high_watermark:
            return []
        self.high_watermark = new_hw
        effects: list[Effect] = [UpdateHighWatermark(new_hw)]
        effects.extend(self._purgatory.complete_up_to(new_hw, len(self.isr)))
        return effects

    def check_produce(
        self, acks: int, min_insync_replicas: int, current_leader_epoch: int | None = None
    ) -> int | None:
        """Whether this broker may append a produce now: None, or the error code."""
        if acks not in (0, 1, ACKS_ALL):
            return INVALID_REQUIRED_ACKS
        error = self.validate_leader_epoch(current_leader_epoch)
        if error is not None:
            return error
        if self.role is not Role.LEADER:
            return NOT_LEADER_OR_FOLLOWER
        if acks == ACKS_ALL and len(self.isr) < min_insync_replicas:
            return NOT_ENOUGH_REPLICAS  # Kafka checks the committed ISR's size
        return None

    def await_produce(
        self,
        produce_id: Hashable,
        required_offset: int,
        min_insync_replicas: int,
        deadline_ms: int,
    ) -> tuple[Effect, ...]:
        """Hold an appended acks=all produce until the HW reaches `required_offset`
        (its last offset + 1). Completes at once if the HW is already there."""
        if self.role is not Role.LEADER:
            return (FailProduce(produce_id, NOT_LEADER_OR_FOLLOWER),)
        if required_offset > self._leader_log_end_offset:
            raise ValueError(f"required offset {required_offset} beyond the log end")
        if self.high_watermark >= required_offset:
            ok = len(self.isr) >= min_insync_replicas
            code = errors.NONE if ok else errors.code_of("NOT_ENOUGH_REPLICAS_AFTER_APPEND")
            return (CompleteProduce(produce_id, code),)
        pending = PendingProduce(produce_id, required_offset, min_insync_replicas, deadline_ms)
        self._purgatory.add(pending)
        return ()

    def expire(self, now_ms: int) -> tuple[Effect, ...]:
        """acks=all waiters past their deadline fail with REQUEST_TIMED_OUT (tick does
        this too)."""
        return tuple(self._purgatory.expire(now_ms))

    # ---- follower ------------------------------------------------------------------

    def fetch_request(self) -> FetchRequest | None:
        """What to fetch from the leader next, or None when not a follower."""
        return self._follower.fetch_request() if self._follower is not None else None

    def on_fetch_response(self, response: FetchResponse) -> tuple[Effect, ...]:
        """The leader answered our fetch: truncate, append, move the HW.

        With batches to append (``AppendFetched``), the HW waits for
        ``on_fetched_appended``: moved now, a failed append would leave it above the log
        end, and this follower would serve consumers records it does not have."""
        self._fetched_leader_hw = None
        if self._follower is None:
            return ()
        effects, new_hw = self._follower.on_fetch_response(response, self.high_watermark)
        answered = response.error_code == errors.NONE and response.diverging_epoch is None
        if any(isinstance(effect, AppendFetched) for effect in effects):
            self._fetched_leader_hw = response.high_watermark
            self._fetched_leader_start = response.log_start_offset
            return tuple(effects)
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            effects.append(UpdateHighWatermark(new_hw))
        if answered:
            effects.extend(self._follow_log_start(response.log_start_offset))
        return tuple(effects)

    def on_leader_local_start(
        self,
        fetch_offset: int,
        leader_epoch: int,
        local_start: int,
        remote_epochs: Sequence[tuple[int, int]],
    ) -> tuple[Effect, ...]:
        """The answer to a ``ListLeaderLocalStart``: the leader's local log start, and the
        remote segments' leader epochs (FollowerState.on_leader_local_start)."""
        if self._follower is None:
            return ()
        effects, new_hw = self._follower.on_leader_local_start(
            fetch_offset, leader_epoch, local_start, remote_epochs, self.high_watermark
        )
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            effects.append(UpdateHighWatermark(new_hw))
        return tuple(effects)

    def on_fetched_appended(self) -> tuple[Effect, ...]:
        """The driver appended the batches of the last fetch response: the follower HW
        becomes min(leader HW, own log end) (Kafka), and never moves back."""
        leader_hw, self._fetched_leader_hw = self._fetched_leader_hw, None
        if leader_hw is None or self._follower is None:
            return ()
        effects: list[Effect] = []
        new_hw = max(self.high_watermark, min(leader_hw, self._log.log_end_offset))
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            effects.append(UpdateHighWatermark(new_hw))
        effects.extend(self._follow_log_start(self._fetched_leader_start))
        return tuple(effects)

    def _follow_log_start(self, leader_log_start: int) -> list[Effect]:
        """Kafka's follower takes its leader's log start after each fetch (bounded by its
        own HW): below it, this replica may hold records the leader never had (written
        as a deposed leader) that no epoch check can find any more, since the leader's
        epoch history starts at its log start too; they must not count as committed."""
        start = min(leader_log_start, self.high_watermark)
        if start <= self._log.log_start_offset:
            return []
        return [IncrementLogStartOffset(start)]

    def _fetch_decision(
        self,
        error_code: int,
        diverging_epoch: EpochEndOffset | None = None,
        effects: tuple[Effect, ...] = (),
    ) -> FetchDecision:
        return FetchDecision(
            error_code=error_code,
            high_watermark=self.high_watermark,
            log_start_offset=self._log.log_start_offset,
            log_end_offset=self.log_end_offset(),
            diverging_epoch=diverging_epoch,
            effects=effects,
        )
