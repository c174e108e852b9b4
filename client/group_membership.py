"""A group consumer's membership (KIP-848), as a sans-I/O state machine.

After Kafka's consumer MembershipManager: the machine decides what to send in each
ConsumerGroupHeartbeat, when, and how to move the consumer's partitions toward the
assignment the coordinator gives. It reads no clock and does no I/O: the driver
(``Consumer``) feeds it events with the time (``poll``, ``on_heartbeat_response``,
``on_heartbeat_failed``, ``on_metadata``, ``revoke_done``, ``assign_done``, ``leave``)
and carries out the effects it returns (``SendHeartbeat``, ``Revoke``, ``Assign``,
``Lose``). docs/groups.md ("The client side") states the rules.

Partitions are named by topic id toward the coordinator and by topic name toward the
application; ``owned`` keeps both, so a partition of a topic deleted since it was
assigned can still be revoked by name.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rillet.client.wire import errors

NONE = errors.NONE
FENCED_MEMBER_EPOCH = errors.code_of("FENCED_MEMBER_EPOCH")
UNKNOWN_MEMBER_ID = errors.code_of("UNKNOWN_MEMBER_ID")
UNRELEASED_INSTANCE_ID = errors.code_of("UNRELEASED_INSTANCE_ID")

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

IdPartition = tuple[str, int]
"""(topic id, partition)."""
NamedPartition = tuple[str, int]
"""(topic name, partition): what the application sees."""


class State(enum.Enum):
    UNSUBSCRIBED = "unsubscribed"
    """Not in the group (before the first subscribe, or after leaving)."""
    JOINING = "joining"
    """Heartbeating with epoch 0 until the coordinator answers."""
    RECONCILING = "reconciling"
    """Revoking or assigning partitions toward the latest assignment."""
    ACKNOWLEDGING = "acknowledging"
    """Reconciled: the next heartbeat, sent at once, reports the partitions owned."""
    STABLE = "stable"
    """Owning what the coordinator assigned; heartbeating every interval."""
    PREPARE_LEAVING = "prepare_leaving"
    """Leaving: revoking everything (commit, listener) before the leave heartbeat."""
    LEAVING = "leaving"
    """The leave heartbeat (epoch -1, or -2 for a static member) is out."""
    FATAL = "fatal"
    """An error retrying cannot fix (another process took the instance id...)."""


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    group_id: str
    member_id: str
    """Chosen by the client (a uuid4) and kept across rejoins, as Kafka 4.0 clients do."""
    instance_id: str | None = None
    rack: str | None = None
    server_assignor: str | None = None
    session_timeout_ms: int = 45_000
    """Must not exceed the coordinator's: partitions are lost once this passes without
    an answer, which must happen before the coordinator can give them to another."""
    rebalance_timeout_ms: int = 300_000
    retry_backoff_ms: int = 100


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """What to send; None means "unchanged since the last heartbeat"."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack: str | None = None
    rebalance_timeout_ms: int | None = None
    subscribed_topics: tuple[str, ...] | None = None
    server_assignor: str | None = None
    owned: Mapping[str, frozenset[int]] | None = None
    """topic id -> partitions owned now."""


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """The coordinator's answer, decoded."""

    error_code: int
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: Mapping[str, frozenset[int]] | None = None
    """topic id -> partitions; None: unchanged."""
    error_message: str | None = None


# --- effects ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    request: HeartbeatRequest


@dataclass(frozen=True, slots=True)
class Revoke:
    """Commit (when auto-committing) the partitions' positions, call
    on_partitions_revoked, stop fetching them, then ``revoke_done(seq)``."""

    seq: int
    partitions: frozenset[NamedPartition]


@dataclass(frozen=True, slots=True)
class Assign:
    """Fetch the group's committed offsets (else reset), call on_partitions_assigned,
    start fetching, then ``assign_done(seq)``; skip the fetching part unless
    ``is_current(seq)`` still holds when the offsets are known."""

    seq: int
    partitions: frozenset[NamedPartition]


@dataclass(frozen=True, slots=True)
class Lose:
    """Stop at once (no commit: another member may own them already), then call
    on_partitions_lost."""

    partitions: frozenset[NamedPartition]


@dataclass(frozen=True, slots=True)
class Fatal:
    error: errors.RilletError


Effect = SendHeartbeat | Revoke | Assign | Lose | Fatal


def nest(tps: Iterable[IdPartition]) -> dict[str, frozenset[int]]:
    """(topic id, partition) pairs -> {topic id: partitions}, topics sorted."""
    out: dict[str, set[int]] = {}
    for t, p in tps:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in sorted(out.items())}


def flat(parts: Mapping[str, Iterable[int]]) -> set[IdPartition]:
    """{topic id: partitions} -> (topic id, partition) pairs."""
    return {(t, p) for t, ps in parts.items() for p in ps}


@dataclass(slots=True)
class _InFlight:
    sent_at_ms: int
    reported: frozenset[IdPartition]
    """The owned partitions this request reported."""
    stale: bool = False
    """Sent before the member dropped everything: the answer is ignored."""


class GroupMembership:
    """One consumer's membership in one group."""

    def __init__(self, config: MembershipConfig) -> None:
        self.config = config
        self.member_id = config.member_id
        self.state = State.UNSUBSCRIBED
        self.member_epoch = JOIN_EPOCH
        self.subscription: tuple[str, ...] = ()
        self.names: dict[str, str] = {}
        """topic id -> name, from the latest metadata."""
        self.target: set[IdPartition] = set()
        """The latest assignment the coordinator gave (topic ids)."""
        self.owned: dict[IdPartition, NamedPartition] = {}
        """Partitions this member owns, being assigned or being revoked: what it may
        touch. Never overlaps another live member's (the co-simulation checks it)."""
        self.heartbeat_interval_ms = 0
        self.fatal_error: errors.RilletError | None = None
        self.generation = 0
        """Bumped whenever partitions are lost: a commit issued before may be retried
        (STALE_MEMBER_EPOCH) only while this is unchanged, or an old position could
        land after the partition came back at an earlier committed offset."""
        self._seq = 0
        self._action: Revoke | Assign | None = None
        self._next_heartbeat_ms: int | None = None
        self._in_flight: _InFlight | None = None
        self._sent: dict[str, object] = {}
        """Fields as last sent; empty after a join or a failed heartbeat (send all)."""
        self._reported: frozenset[IdPartition] = frozenset()
        self._last_ok_send_ms = 0
        """Send time of the latest request the coordinator answered: it accepted that
        request no earlier, so its session deadline is no earlier than this plus the
        session timeout."""
        self._clean_send_ms = 0
        """Send time of the latest request whose answer lists all we reported and own:
        the coordinator, which sees owned partitions in every request, then had nothing
        pending for us from before, so any revocation deadline it set is no earlier than
        this plus the rebalance timeout."""

    # --- queries ---------------------------------------------------------------------

    def owns(self, tp: NamedPartition) -> bool:
        return tp in self.owned.values()

    def owned_names(self) -> frozenset[NamedPartition]:
        return frozenset(self.owned.values())

    def is_current(self, seq: int) -> bool:
        """The Revoke/Assign with this seq is still the action in progress."""
        return self._action is not None and self._action.seq == seq

    @property
    def unresolved_topics(self) -> set[str]:
        """Assigned topic ids the metadata does not name yet (refresh it)."""
        return {t for t, _ in self.target if t not in self.names}

    @property
    def in_group(self) -> bool:
        """Has an epoch the coordinator may accept commits at."""
        return self.member_epoch > 0 and self.state in (
            State.RECONCILING,
            State.ACKNOWLEDGING,
            State.STABLE,
            State.PREPARE_LEAVING,
        )

    def lease_deadline_ms(self) -> int:
        """Past this the coordinator may have given our partitions to another member."""
        return min(
            self._last_ok_send_ms + self.config.session_timeout_ms,
            self._clean_send_ms + self.config.rebalance_timeout_ms,
        )

    def next_wakeup_ms(self) -> int | None:
        """When ``poll`` has something to do (a heartbeat or a lease to check)."""
        times: list[int] = []
        if self._next_heartbeat_ms is not None and self._in_flight is None:
            times.append(self._next_heartbeat_ms)
        if (self.owned or self._action is not None) and self.state is not State.LEAVING:
            times.append(self.lease_deadline_ms())
        return min(times) if times else None

    # --- events ----------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str], now_ms: int) -> list[Effect]:
        topics = tuple(sorted(set(topics)))
        if self.state in (State.LEAVING, State.PREPARE_LEAVING, State.FATAL):
            return []
        changed = topics != self.subscription
        self.subscription = topics
        if self.state is State.UNSUBSCRIBED:
            self._rejoin()
        elif changed:
            self._next_heartbeat_ms = now_ms  # tell the coordinator at once
        return self.poll(now_ms)

    def on_metadata(self, names: Mapping[str, str], now_ms: int) -> list[Effect]:
        """New metadata: topic id -> name (assigned ids it did not name may now be)."""
        self.names = dict(names)
        return self._reconcile(now_ms) + self.poll(now_ms)

    def poll(self, now_ms: int) -> list[Effect]:
        """Timers: the lease and the heartbeat."""
        effects: list[Effect] = []
        holding = self.owned or self._action is not None
        if holding and self.state is not State.LEAVING and now_ms >= self.lease_deadline_ms():
            effects += self._lose()
        if (
            self._in_flight is None
            and self._next_heartbeat_ms is not None
            and now_ms >= self._next_heartbeat_ms
        ):
            request = self._build_heartbeat()
            if request is not None:
                reported = frozenset(flat(request.owned or {}))
                self._in_flight = _InFlight(now_ms, reported)
                self._reported = reported
                self._next_heartbeat_ms = None
                if self.state is State.ACKNOWLEDGING:
                    self.state = State.STABLE
                effects.append(SendHeartbeat(request))
        return effects

    def on_heartbeat_response(self, result: HeartbeatResult, now_ms: int) -> list[Effect]:
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return []
        if flight.stale or self.state in (State.UNSUBSCRIBED, State.FATAL):
            return self.poll(now_ms)
        if self.state is State.LEAVING:
            self.state = State.UNSUBSCRIBED
            self.member_epoch = JOIN_EPOCH
            return []
        code = result.error_code
        if code in (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID):
            # The coordinator dropped us: whatever we own may be someone else's now.
            return self._lose() + self.poll(now_ms)
        if code == UNRELEASED_INSTANCE_ID:
            # Our previous incarnation still holds the instance id until its session
            # ends: try again later.
            self._sent.clear()
            self._next_heartbeat_ms = now_ms + max(
                self.config.retry_backoff_ms, self.heartbeat_interval_ms
            )
            return self.poll(now_ms)
        if code != NONE:
            effects = self._lose()
            self.state = State.FATAL
            self._next_heartbeat_ms = None
            self.fatal_error = errors.error_for(code, result.error_message or "heartbeat")
            return [*effects, Fatal(self.fatal_error)]
        self._last_ok_send_ms = flight.sent_at_ms
        self.heartbeat_interval_ms = result.heartbeat_interval_ms
        self.member_epoch = result.member_epoch
        if result.assignment is not None:
            self.target = flat(result.assignment)
        if flight.reported <= self.target and set(self.owned) <= self.target:
            self._clean_send_ms = flight.sent_at_ms
        if self.state is State.JOINING:
            self.state = State.STABLE
        if self._next_heartbeat_ms is None:
            self._next_heartbeat_ms = now_ms + result.heartbeat_interval_ms
        return self._reconcile(now_ms) + self.poll(now_ms)

    def on_heartbeat_failed(self, now_ms: int) -> list[Effect]:
        """No answer (a timeout, a broken connection, no coordinator): the next
        heartbeat, after the backoff, sends every field again."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return []
        if flight.stale:
            return self.poll(now_ms)
        if self.state is State.LEAVING:
            self.state = State.UNSUBSCRIBED  # best effort: the session ends it anyway
            self.member_epoch = JOIN_EPOCH
            return []
        self._sent.clear()
        retry = now_ms + self.config.retry_backoff_ms
        if self._next_heartbeat_ms is None or self._next_heartbeat_ms > retry:
            self._next_heartbeat_ms = retry
        return self.poll(now_ms)

    def on_fenced(self, now_ms: int) -> list[Effect]:
        """A commit answered FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID."""
        if self.state in (State.UNSUBSCRIBED, State.LEAVING, State.FATAL):
            return []
        return self._lose() + self.poll(now_ms)

    def revoke_done(self, seq: int, now_ms: int) -> list[Effect]:
        action = self._action
        if not isinstance(action, Revoke) or action.seq != seq:
            return []
        self._action = None
        gone = {k for k, v in self.owned.items() if v in action.partitions}
        for k in gone:
            del self.owned[k]
        if self.state is State.PREPARE_LEAVING:
            return self._send_leave(now_ms)
        return self._reconcile(now_ms) + self.poll(now_ms)

    def assign_done(self, seq: int, now_ms: int) -> list[Effect]:
        action = self._action
        if not isinstance(action, Assign) or action.seq != seq:
            return []
        self._action = None
        if self.state is State.PREPARE_LEAVING:
            return self._start_leaving(now_ms)
        return self._reconcile(now_ms) + self.poll(now_ms)

    def leave(self, now_ms: int) -> list[Effect]:
        """Revoke everything (commit, listener), then heartbeat epoch -1 (-2 static)."""
        if self.state in (State.UNSUBSCRIBED, State.FATAL, State.LEAVING, State.PREPARE_LEAVING):
            if self.state is State.FATAL:
                self.state = State.UNSUBSCRIBED
            return []
        self.state = State.PREPARE_LEAVING
        if self._action is not None:
            return []  # finish it first; its done event continues the leave
        return self._start_leaving(now_ms)

    # --- internals ---------------------------------------------------------------------

    def _rejoin(self) -> None:
        self.state = State.JOINING
        self.member_epoch = JOIN_EPOCH
        self.target = set()
        self._sent.clear()
        self._reported = frozenset()
        self._next_heartbeat_ms = 0

    def _lose(self) -> list[Effect]:
        lost = frozenset(self.owned.values())
        self.owned.clear()
        self.generation += 1
        self._action = None
        self._seq += 1
        if self._in_flight is not None:
            self._in_flight.stale = True
        if self.state is State.PREPARE_LEAVING:
            self.state = State.UNSUBSCRIBED
            self.member_epoch = JOIN_EPOCH
            self._next_heartbeat_ms = None
        else:
            self._rejoin()
        return [Lose(lost)] if lost else []

    def _start_leaving(self, now_ms: int) -> list[Effect]:
        if self.owned:
            self._seq += 1
            self._action = Revoke(self._seq, frozenset(self.owned.values()))
            return [self._action]
        return self._send_leave(now_ms)

    def _send_leave(self, now_ms: int) -> list[Effect]:
        if self.member_epoch <= 0:
            self.state = State.UNSUBSCRIBED
            self._next_heartbeat_ms = None
            return []
        self.state = State.LEAVING
        self._next_heartbeat_ms = now_ms
        if self._in_flight is not None:
            self._in_flight.stale = True
            return []  # sent once the heartbeat in flight is answered
        return self.poll(now_ms)

    def _build_heartbeat(self) -> HeartbeatRequest | None:
        c = self.config
        if self.state is State.LEAVING:
            epoch = STATIC_LEAVE_EPOCH if c.instance_id is not None else LEAVE_EPOCH
            return HeartbeatRequest(self.member_id, epoch, instance_id=c.instance_id)
        if self.state not in (
            State.JOINING,
            State.RECONCILING,
            State.ACKNOWLEDGING,
            State.STABLE,
        ):
            return None
        # Partitions still being assigned count as owned: reporting less would tell a
        # coordinator waiting for their revocation that they are released.
        owned = nest(self.owned)
        fields: dict[str, object] = {
            "instance_id": c.instance_id,
            "rack": c.rack,
            "rebalance_timeout_ms": c.rebalance_timeout_ms,
            "subscribed_topics": self.subscription,
            "server_assignor": c.server_assignor,
            "owned": owned,
        }
        out = {
            k: (None if k in self._sent and self._sent[k] == v else v) for k, v in fields.items()
        }
        # Owned partitions go in every heartbeat. A lost response may have given us a
        # partition the next answer already takes back: the coordinator then waits for
        # a report of owned partitions without it, and one that never comes (None means
        # "unchanged") would keep it waiting until it drops us at the rebalance timeout,
        # while our answers looked as if nothing was pending.
        out["owned"] = owned
        self._sent = dict(fields)
        return HeartbeatRequest(self.member_id, self.member_epoch, **out)  # type: ignore[arg-type]

    def _reconcile(self, now_ms: int) -> list[Effect]:
        """Revoke what the assignment no longer lists, then assign what it adds."""
        if self._action is not None or self.state not in (
            State.RECONCILING,
            State.ACKNOWLEDGING,
            State.STABLE,
        ):
            return []
        revoke = set(self.owned) - self.target
        if revoke:
            self.state = State.RECONCILING
            self._seq += 1
            self._action = Revoke(self._seq, frozenset(self.owned[k] for k in revoke))
            return [self._action]
        add = {k for k in self.target - set(self.owned) if k[0] in self.names}
        if add:
            self.state = State.RECONCILING
            self._seq += 1
            named = {k: (self.names[k[0]], k[1]) for k in add}
            self.owned.update(named)
            self._action = Assign(self._seq, frozenset(named.values()))
            return [self._action]
        if frozenset(self.owned) != self._reported:
            self.state = State.ACKNOWLEDGING
            self._next_heartbeat_ms = now_ms
        elif self.state is State.RECONCILING:
            self.state = State.STABLE
        return []


__all__ = [
    "Assign",
    "Effect",
    "Fatal",
    "GroupMembership",
    "HeartbeatRequest",
    "HeartbeatResult",
    "Lose",
    "MembershipConfig",
    "Revoke",
    "SendHeartbeat",
    "State",
]
