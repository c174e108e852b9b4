"""The sans-I/O Raft core of the controller quorum (docs/raft.md, docs/design.md).

`RaftNode` is a pure state machine: it never touches a socket, a file, a clock, a task
or an event loop. The driver feeds it peers' messages (`step`), the passing of time
(`tick(now_ms)`) and client proposals (`propose`), and collects its effects as a typed
`Ready`, whose field comments state the order in which they must be carried out.

The driver loop (see docs/raft.md):

    while node.has_ready():
        ready = node.ready()
        store.persist(ready)            # 1. fsync snapshot, entries, hard state
        for msg in ready.messages:      # 2. only after 1 is durable
            send(msg)
        state_machine.apply(ready)      # 3. restore snapshot, apply committed entries
        node.advance(ready)             # 4. tell the core all of the above is done

Implemented: elections with randomized timeouts in [T, 2T), pre-vote, check-quorum,
leader stickiness (a follower that heard from a leader in the last T ignores votes),
log replication with fast back-off, commit of current-term entries by counting (a
no-op starts every term), a leader lease, snapshots and InstallSnapshot, and
leadership transfer through TimeoutNow. Membership is fixed by configuration.

Any number of inputs may arrive between two Readies (everything that came in during an
fsync, or while the event loop was stalled), so a role or term change drops, in the same
step, what the role or term being left still had queued (`enter_role`, `enter_term`).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields

__all__ = [
    "AppendRequest",
    "AppendResponse",
    "Entry",
    "EntryKind",
    "HardState",
    "InstallSnapshot",
    "LEADER_MESSAGES",
    "Message",
    "NotLeader",
    "PreVoteRequest",
    "PreVoteResponse",
    "RaftConfig",
    "RaftError",
    "RaftEvent",
    "RaftInvariantError",
    "RaftNode",
    "RaftUsageError",
    "Ready",
    "Role",
    "Snapshot",
    "StorageState",
    "TimeoutNow",
    "TooManyUncommitted",
    "VoteRequest",
    "VoteResponse",
    "message_from_dict",
]


# ---------------------------------------------------------------------------
# Errors and the invariant helper


class RaftError(Exception):
    """Base class of the errors this module raises."""


class NotLeader(RaftError):
    """A proposal or read reached a node that cannot serve it (local: retry elsewhere)."""

    def __init__(self, leader_id: int | None, reason: str = "not the leader") -> None:
        super().__init__(f"{reason} (leader hint: {leader_id})")
        self.leader_id = leader_id


class TooManyUncommitted(RaftError):
    """The leader already holds `max_uncommitted_entries` uncommitted entries."""


class RaftUsageError(RaftError):
    """The driver broke the API contract (local fault), e.g. ready() twice."""


class RaftInvariantError(RaftError):
    """An internal invariant that guards data does not hold: a bug, never retriable."""


def invariant(condition: bool, message: str) -> None:
    """Always-on assertion (unlike `assert`, survives python -O)."""
    if not condition:
        raise RaftInvariantError(message)


# ---------------------------------------------------------------------------
# Log entries, persisted state, configuration


class EntryKind(enum.IntEnum):
    NORMAL = 0
    NOOP = 1  # appended by every new leader; the application skips it


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    data: bytes
    kind: int = EntryKind.NORMAL

    def to_list(self) -> list[object]:
        return [self.index, self.term, int(self.kind), self.data]

    @classmethod
    def from_list(cls, raw: list[object] | tuple[object, ...]) -> Entry:
        index, term, kind, data = raw
        return cls(int(index), int(term), bytes(data), int(kind))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class HardState:
    """What must survive a crash besides the log: term, vote and (lazily) commit."""

    term: int = 0
    vote: int | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The application's state machine as of `index` (whose entry had `term`)."""

    index: int
    term: int
    data: bytes


@dataclass(frozen=True, slots=True)
class StorageState:
    """Everything a node recovers from its durable store on start."""

    hard_state: HardState = HardState()
    snapshot: Snapshot | None = None
    entries: tuple[Entry, ...] = ()
    # Names the disk this state lives on: created with the store, kept for its life, new
    # after a wipe. Followers put it in every answer, so a leader knows whether the log
    # that acknowledged an index is still there (0: none, a peer of an older version).
    storage_id: int = 0


@dataclass(frozen=True, slots=True)
class RaftConfig:
    node_id: int
    voters: tuple[int, ...]
    election_timeout_ms: int = 1000  # Kafka quorum.election.timeout.ms; randomized in [T, 2T)
    heartbeat_interval_ms: int = 100
    pre_vote: bool = True
    # A follower whose leader's process is gone (its address refuses connections:
    # `peer_unreachable`) campaigns at once instead of waiting out the election timeout.
    prevote_on_leader_loss: bool = True
    check_quorum: bool = True
    # The lease is shortened by this much to cover clock-rate drift between nodes.
    max_clock_drift_ms: int = 100
    max_entries_per_append: int = 64
    # Bytes of entry data per AppendRequest (at least one entry goes): a follower far
    # behind is sent bounded messages, each written, acknowledged and applied in turn.
    max_bytes_per_append: int = 1024 * 1024
    max_inflight_entries: int = 1024  # optimistic window per follower in REPLICATE state
    max_uncommitted_entries: int = 10_000
    max_committed_entries_per_ready: int = 1024
    # Bytes of committed entry data one Ready hands the state machine (at least one
    # entry): applying runs on the event loop, so this bounds how long one Ready holds it.
    max_committed_bytes_per_ready: int = 64 * 1024

    def validate(self) -> None:
        if self.node_id not in self.voters:
            raise RaftUsageError(f"node {self.node_id} is not among voters {self.voters}")
        if len(set(self.voters)) != len(self.voters):
            raise RaftUsageError(f"duplicate voters in {self.voters}")
        if not 0 < self.heartbeat_interval_ms < self.election_timeout_ms:
            raise RaftUsageError("need 0 < heartbeat_interval_ms < election_timeout_ms")
        if not 0 <= self.max_clock_drift_ms < self.election_timeout_ms:
            raise RaftUsageError("need 0 <= max_clock_drift_ms < election_timeout_ms")
        for name in (
            "max_entries_per_append",
            "max_bytes_per_append",
            "max_inflight_entries",
            "max_uncommitted_entries",
            "max_committed_entries_per_ready",
            "max_committed_bytes_per_ready",
        ):
            if getattr(self, name) < 1:
                raise RaftUsageError(f"{name} must be >= 1")


# ---------------------------------------------------------------------------
# Messages: frozen, slotted, each with a plain-dict form for msgpack.


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    term: int
    src: int
    dst: int

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"type": type(self).__name__}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "entries":
                value = [e.to_list() for e in value]
            out[f.name] = value
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PreVoteRequest(Message):
    """Would you vote for me in `term`? Changes nobody's term (Raft thesis 9.6)."""

    last_log_index: int
    last_log_term: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PreVoteResponse(Message):
    granted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteRequest(Message):
    last_log_index: int
    last_log_term: int
    leader_transfer: bool = False  # sent after TimeoutNow: voters ignore leader stickiness


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteResponse(Message):
    granted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendRequest(Message):
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int
    sent_ms: int  # leader's clock when sent; echoed back, it dates the leader's lease


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResponse(Message):
    success: bool
    match_index: int  # on success: the follower's log matches the leader's up to here
    reject_index: int  # on failure: prev_index of the rejected request
    hint_index: int  # on failure: where the leader should back off to (see handle_)
    hint_term: int  # on failure: the follower's term at prev_index, 0 if it had none
    sent_ms: int  # echo of the request's sent_ms
    storage_id: int = 0  # the follower's StorageState.storage_id


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSnapshot(Message):
    snapshot_index: int
    snapshot_term: int
    data: bytes
    sent_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutNow(Message):
    """Leadership transfer: start an election now, skipping pre-vote."""


# What only a leader sends.
LEADER_MESSAGES = (AppendRequest, InstallSnapshot, TimeoutNow)

_MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.__name__: cls
    for cls in (
        PreVoteRequest,
        PreVoteResponse,
        VoteRequest,
        VoteResponse,
        AppendRequest,
        AppendResponse,
        InstallSnapshot,
        TimeoutNow,
    )
}


def message_from_dict(raw: dict[str, object]) -> Message:
    """Inverse of `Message.to_dict`. Raises ValueError on a malformed dict (remote fault)."""
    kind = raw.get("type")
    cls = _MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown raft message type {kind!r}")
    kwargs: dict[str, object] = {}
    for f in fields(cls):
        if f.name not in raw:
            if f.default is not MISSING:  # added later: older peers do not send it
                continue
            raise ValueError(f"{kind} lacks field {f.name!r}")
        value = raw[f.name]
        if f.name == "entries":
            value = tuple(Entry.from_list(e) for e in value)  # type: ignore[union-attr]
        elif f.name == "data":
            value = bytes(value)  # type: ignore[arg-type]
        kwargs[f.name] = value
    return cls(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Ready: the effects of a batch of step/tick/propose calls.


@dataclass(frozen=True, slots=True)
class RaftEvent:
    """Something an operator wants in the log: who leads, and why an election happened."""

    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class Ready:
    """Effects the driver must carry out, in this order, then call `advance(ready)`.

    Step 1, persist. `snapshot`, then `entries`, then `hard_state` MUST be durable
    (fsynced) before ANY of `messages` is sent, when `must_sync` is true. A vote or an
    acknowledgement sent before its cause is on disk can lose committed data after a crash.
    """

    # A snapshot received from the leader. Persist it, replacing the WHOLE stored log
    # (every stored entry, whatever its index, and the old snapshot).
    snapshot: Snapshot | None
    # Entries to append. The store first drops every stored entry whose index is
    # >= entries[0].index (this is how a follower's conflicting tail is truncated).
    entries: tuple[Entry, ...]
    # The new term/vote/commit, or None if unchanged. Term and vote must be durable
    # before sending; a store may write a change of commit alone lazily (must_sync false).
    hard_state: HardState | None
    # True when step 1 must fsync before step 2 (new entries, snapshot, term or vote).
    must_sync: bool
    # Step 2, send: only after step 1 is durable. Each message names its `dst`.
    messages: tuple[Message, ...]
    # Step 3, apply: after step 1. If `snapshot` is set, first restore the state machine
    # from it; then apply these committed entries in order (skip EntryKind.NOOP).
    committed_entries: tuple[Entry, ...]
    # Step 4: log these (driver's logger), at any time.
    events: tuple[RaftEvent, ...]


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


# ---------------------------------------------------------------------------
# The in-memory log


class RaftLog:
    """Entries after a snapshot point; tracks which tail is not yet persisted."""

    def __init__(self, snapshot_index: int, snapshot_term: int, entries: Iterable[Entry]) -> None:
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term
        self.entries: list[Entry] = list(entries)
        for offset, entry in enumerate(self.entries):
            invariant(
                entry.index == snapshot_index + 1 + offset,
                f"log gap: entry {entry.index} at position {offset} after "
                f"snapshot {snapshot_index}",
            )
        self.unstable_from = self.last_index() + 1  # first index not yet persisted

    def last_index(self) -> int:
        return self.entries[-1].index if self.entries else self.snapshot_index

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.snapshot_term

    def term(self, index: int) -> int | None:
        """Term of the entry at `index`; None when compacted away or beyond the end."""
        if index == self.snapshot_index:
            return self.snapshot_term
        if index < self.snapshot_index or index > self.last_index():
            return None
        return self.entries[index - self.snapshot_index - 1].term

    def slice(self, first: int, max_count: int, max_bytes: int | None = None) -> tuple[Entry, ...]:
        """Up to ``max_count`` entries from ``first``; with ``max_bytes``, only as many as
        keep their data within it (but always the first)."""
        invariant(first > self.snapshot_index, f"slice from {first} is compacted")
        start = first - self.snapshot_index - 1
        entries = self.entries[start : start + max_count]
        if max_bytes is None:
            return tuple(entries)
        size = 0
        for n, entry in enumerate(entries):
            size += len(entry.data)
            if size > max_bytes and n > 0:
                return tuple(entries[:n])
        return tuple(entries)

    def entries_between(
        self, first: int, last: int, max_bytes: int | None = None
    ) -> tuple[Entry, ...]:
        if last < first:
            return ()
        return self.slice(first, last - first + 1, max_bytes)

    def truncate_from(self, index: int) -> None:
        invariant(index > self.snapshot_index, f"truncating compacted index {index}")
        del self.entries[index - self.snapshot_index - 1 :]
        self.unstable_from = min(self.unstable_from, index)

    def append(self, entry: Entry) -> None:
        invariant(
            entry.index == self.last_index() + 1,
            f"append of {entry.index} after last index {self.last_index()}",
        )
        invariant(
            entry.term >= self.last_term(),
            f"entry term {entry.term} below last term {self.last_term()}",
        )
        self.entries.append(entry)

    def unstable(self) -> tuple[Entry, ...]:
        if self.unstable_from > self.last_index():
            return ()
        return self.slice(max(self.unstable_from, self.snapshot_index + 1), len(self.entries))

    def compact(self, index: int) -> int:
        """Drop entries up to `index`; returns the term of `index`."""
        term = self.term(index)
        invariant(term is not None, f"cannot compact to unknown index {index}")
        assert term is not None  # for the type checker; checked just above
        del self.entries[: index - self.snapshot_index]
        self.snapshot_index, self.snapshot_term = index, term
        return term

    def reset(self, snapshot_index: int, snapshot_term: int) -> None:
        self.entries.clear()
        self.snapshot_index, self.snapshot_term = snapshot_index, snapshot_term
        self.unstable_from = snapshot_index + 1

    def first_index_of_term(self, index: int) -> int:
        """Smallest index i <= `index` such that entries i..index all share one term."""
        term = self.term(index)
        while index - 1 > self.snapshot_index and self.term(index - 1) == term:
            index -= 1
        return index

    def last_index_of_term(self, term: int, at_most: int) -> int | None:
        index = min(at_most, self.last_index())
        while index > self.snapshot_index:
            entry_term = self.term(index)
            if entry_term == term:
                return index
            if entry_term is not None and entry_term < term:
                return None
            index -= 1
        return None


# ---------------------------------------------------------------------------
# Leader's view of a follower


class ProgressState(enum.Enum):
    PROBE = "probe"  # one append in flight until we learn where the follower's log ends
    REPLICATE = "replicate"  # stream appends optimistically, bounded by max_inflight_entries
    SNAPSHOT = "snapshot"  # an InstallSnapshot is in flight


NEVER_MS = -(2**62)


@dataclass(slots=True)
class Progress:
    match_index: int
    next_index: int
    state: ProgressState = ProgressState.PROBE
    probe_sent: bool = False
    pending_snapshot_index: int = 0
    snapshot_sent_ms: int = NEVER_MS
    last_heard_ms: int = NEVER_MS
    lease_sent_ms: int = NEVER_MS  # sent_ms of the newest request this follower answered
    # The follower storage whose answers this progress reflects (None until the first),
    # and the ones it replaced: their late answers speak for a log that is gone.
    storage_id: int | None = None
    retired_storage_ids: set[int] = field(default_factory=set)


# ---------------------------------------------------------------------------
# The node


@dataclass(slots=True)
class _Election:
    pre_vote: bool
    votes: dict[int, bool] = field(default_factory=dict)


class RaftNode:
    """One member of the controller quorum. All inputs arrive through method calls."""

    def __init__(
        self,
        config: RaftConfig,
        storage_state: StorageState | None = None,
        *,
        rng: random.Random | None = None,
        now_ms: int = 0,
    ) -> None:
        config.validate()
        state = storage_state or StorageState()
        self.config = config
        self.node_id = config.node_id
        self.storage_id = state.storage_id
        self.peers = tuple(v for v in config.voters if v != config.node_id)
        self.quorum = len(config.voters) // 2 + 1
        self.rng = rng if rng is not None else random.Random()
        self.now_ms = now_ms
        snap = state.snapshot
        self.snapshot: Snapshot | None = snap
        self.log = RaftLog(snap.index if snap else 0, snap.term if snap else 0, state.entries)
        hard = state.hard_state
        self.term = hard.term
        self.vote = hard.vote
        self.commit_index = max(hard.commit, self.log.snapshot_index)
        invariant(
            self.commit_index <= self.log.last_index(),
            f"stored commit {hard.commit} beyond last index {self.log.last_index()}",
        )
        self.applied_index = self.log.snapshot_index
        self.role = Role.FOLLOWER
        self.leader_id: int | None = None
        # A restarted node has forgotten when it last heard from a leader, so it treats its
        # start as such a contact: it cannot help depose a leader whose lease still runs.
        self.leader_contact_ms = now_ms
        self.election_deadline_ms = 0
        self.election: _Election | None = None
        self.progress: dict[int, Progress] = {}
        self.heartbeat_due_ms = 0
        self.check_quorum_due_ms = 0
        self.term_start_index = 0
        self.transfer_target: int | None = None
        self.transfer_deadline_ms = 0
        self.timeout_now_sent = False
        self.lease_fence_ms = NEVER_MS
        self.broadcast_pending = False
        self.pending_snapshot: Snapshot | None = None
        self.outbox: list[Message] = []
        self.events: list[RaftEvent] = []
        self.prev_hard_state = HardState(self.term, self.vote, hard.commit)
        self.ready_outstanding = False
        self.reset_election_timer()
        if not self.peers:
            # The only voter: no one else can lead or vote, so the election timeout
            # would protect nothing (Kafka's KRaft campaigns at once here too).
            self.election_deadline_ms = now_ms

    # -- read-only view ----------------------------------------------------

    def status(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "role": self.role.value,
            "term": self.term,
            "leader_id": self.leader_id,
            "vote": self.vote,
            "commit_index": self.commit_index,
            "applied_index": self.applied_index,
            "last_index": self.log.last_index(),
            "snapshot_index": self.log.snapshot_index,
        }

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def lease_duration_ms(self) -> int:
        return self.config.election_timeout_ms - self.config.max_clock_drift_ms

    def is_leader_with_lease(self, now_ms: int) -> bool:
        """True when no other node can have become leader yet (leases need bounded drift).

        A majority answered appends this leader sent at or after `lease start`; each of
        them ignores vote requests for election_timeout_ms after hearing from it.

        Never with `prevote_on_leader_loss`: a follower that finds the leader's address
        refusing connections forgets that promise, and a refused connection does not
        prove the leader dead (a listener closed before the leader stops leading, a
        firewall that rejects), so a lease would not be safe. Both cannot be had.
        """
        if self.config.prevote_on_leader_loss:
            return False
        if self.role is not Role.LEADER or self.transfer_target is not None:
            return False
        sent = sorted([now_ms] + [p.lease_sent_ms for p in self.progress.values()], reverse=True)
        lease_start_ms = sent[self.quorum - 1]
        if lease_start_ms < self.lease_fence_ms:
            return False
        return now_ms < lease_start_ms + self.lease_duration_ms()

    def read_index(self, now_ms: int) -> int:
        """Commit index a linearizable read must wait to have applied (lease-based)."""
        if not self.is_leader_with_lease(now_ms):
            raise NotLeader(self.leader_id, "no leader lease")
        if self.commit_index < self.term_start_index:
            raise NotLeader(self.leader_id, "leader has not committed its term's first entry")
        return self.commit_index

    # -- inputs ------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Time passes. `now_ms` comes from the driver's monotonic clock."""
        if now_ms < self.now_ms:
            raise RaftUsageError(f"clock went back from {self.now_ms} to {now_ms}")
        self.now_ms = now_ms
        if self.role is Role.LEADER:
            self.tick_leader()
        elif self.now_ms >= self.election_deadline_ms:
            self.handle_election_timeout()

    def peer_unreachable(self, peer: int, now_ms: int, since_ms: int | None = None) -> None:
        """The driver found nothing listening at ``peer``'s address: a refused
        connection, so its process is gone (a stopped or cut-off process times out
        instead, and is not reported). A follower of that peer need not wait out the
        election timeout: it forgets when it last heard from it, so its leader
        stickiness no longer refuses others' (pre-)votes, and campaigns after a short
        delay (the other followers notice at about the same moment; they take turns by
        node id, so their campaigns stay apart). A refused connection is strong evidence, not
        proof: a leader whose listener closed before it stopped leading, or behind a
        firewall that rejects, is reported while alive; then it is deposed early (it
        could not hear its followers' answers anyway), and that is why this setting and
        the leader lease exclude each other (`is_leader_with_lease`). ``since_ms``, when
        the failed connect was started: a report older than the leader's last contact
        (a restarted node that already leads again) is ignored."""
        if now_ms < self.now_ms:
            raise RaftUsageError(f"clock went back from {self.now_ms} to {now_ms}")
        self.now_ms = now_ms
        if (
            not self.config.prevote_on_leader_loss
            or self.role is not Role.FOLLOWER
            or peer != self.leader_id
            or not self.in_leader_lease()
            or (since_ms is not None and self.leader_contact_ms > since_ms)
        ):
            return
        self.emit(
            "leader_unreachable",
            f"leader {peer} of term {self.term} is gone (connection refused): campaigning "
            "without waiting out the election timeout",
        )
        self.leader_contact_ms = NEVER_MS
        # The followers notice at about the same moment: they take turns by node id, a
        # heartbeat interval apart (jittered within the first half), so two campaigns
        # rarely split the vote (random delays alone did in a third of kills).
        rank = sorted(v for v in self.config.voters if v != peer).index(self.node_id)
        interval = self.config.heartbeat_interval_ms
        delay_ms = rank * interval + self.rng.randrange(max(1, interval // 2))
        self.election_deadline_ms = min(self.election_deadline_ms, self.now_ms + delay_ms)

    def propose(self, data: bytes) -> int:
        """Append `data` to the log as leader; returns its index. Commit shows in a Ready."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader_id)
        if self.transfer_target is not None:
            raise NotLeader(self.transfer_target, "leadership transfer in progress")
        if self.log.last_index() - self.commit_index >= self.config.max_uncommitted_entries:
            raise TooManyUncommitted(f"{self.config.max_uncommitted_entries} entries uncommitted")
        return self.append_as_leader(bytes(data), EntryKind.NORMAL)

    def transfer_leadership(self, target: int) -> None:
        """Hand leadership to `target` once it has caught up (TimeoutNow)."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader_id)
        if target == self.node_id:
            return
        if target not in self.progress:
            raise RaftUsageError(f"{target} is not a voter")
        self.transfer_target = target
        self.transfer_deadline_ms = self.now_ms + self.config.election_timeout_ms
        self.timeout_now_sent = False
        self.emit("transfer_started", f"transferring leadership of term {self.term} to {target}")
        self.maybe_send_timeout_now(target)
        if not self.timeout_now_sent:
            self.send_append(target)

    def compact(self, index: int, snapshot_data: bytes) -> Snapshot:
        """The application's state as of applied `index`; drops log entries up to it.

        The driver persists the returned snapshot, then compacts its stored log prefix.
        """
        invariant(
            index <= self.applied_index,
            f"snapshot at {index} beyond applied index {self.applied_index}",
        )
        if index <= self.log.snapshot_index:
            return self.snapshot or Snapshot(index, self.log.term(index) or 0, snapshot_data)
        term = self.log.compact(index)
        self.snapshot = Snapshot(index, term, bytes(snapshot_data))
        return self.snapshot

    def step(self, msg: Message, now_ms: int | None = None) -> None:
        """A message from a peer (already decoded), received at ``now_ms`` when given.

        The time moves on without firing timers (the next `tick` does): a message handled
        after the loop stalled must date the leader contact it makes by when it was
        handled, not by the last tick, or the node's election deadline (counted from a
        time before it acknowledged the leader, so renewing that leader's lease) passes at
        its next tick, and it deposes a leader whose lease still runs.
        """
        if now_ms is not None:
            if now_ms < self.now_ms:
                raise RaftUsageError(f"clock went back from {self.now_ms} to {now_ms}")
            self.now_ms = now_ms
        if msg.dst != self.node_id:
            raise RaftUsageError(f"message for {msg.dst} stepped into node {self.node_id}")
        if msg.src not in self.config.voters or msg.src == self.node_id:
            return  # not a member: drop (remote fault, nothing to answer)
        if msg.term > self.term:
            if not self.handle_higher_term(msg):
                return
        elif msg.term < self.term:
            self.handle_lower_term(msg)
            return
        self.dispatch(msg)

    # -- outputs -----------------------------------------------------------

    def has_ready(self) -> bool:
        return bool(
            self.outbox
            or self.events
            or self.broadcast_due()
            or self.pending_snapshot
            or self.log.unstable()
            or self.current_hard_state() != self.prev_hard_state
            or self.commit_index > self.applied_index
        )

    def ready(self) -> Ready:
        if self.ready_outstanding:
            raise RaftUsageError("ready() called again before advance()")
        if self.broadcast_due():
            self.broadcast_append(heartbeat=False)
        hard = self.current_hard_state()
        hard_changed = hard != self.prev_hard_state
        entries = self.log.unstable()
        first_apply = (
            max(self.applied_index, self.pending_snapshot.index if self.pending_snapshot else 0) + 1
        )
        last_apply = min(
            self.commit_index, first_apply + self.config.max_committed_entries_per_ready - 1
        )
        committed = self.log.entries_between(
            first_apply, last_apply, self.config.max_committed_bytes_per_ready
        )
        term_or_vote_changed = (hard.term, hard.vote) != (
            self.prev_hard_state.term,
            self.prev_hard_state.vote,
        )
        ready = Ready(
            snapshot=self.pending_snapshot,
            entries=entries,
            hard_state=hard if hard_changed else None,
            must_sync=bool(entries or self.pending_snapshot or term_or_vote_changed),
            messages=tuple(self.outbox),
            committed_entries=committed,
            events=tuple(self.events),
        )
        self.outbox.clear()
        self.events.clear()
        self.ready_outstanding = True
        return ready

    def advance(self, ready: Ready) -> None:
        """The driver persisted, sent and applied everything in `ready`."""
        if not self.ready_outstanding:
            raise RaftUsageError("advance() without an outstanding ready()")
        self.ready_outstanding = False
        if ready.hard_state is not None:
            self.prev_hard_state = ready.hard_state
        if ready.snapshot is not None:
            if self.pending_snapshot == ready.snapshot:
                self.pending_snapshot = None
            self.applied_index = max(self.applied_index, ready.snapshot.index)
        if ready.entries:
            last = ready.entries[-1]
            if self.log.term(last.index) == last.term:  # still ours: not truncated since
                self.log.unstable_from = max(self.log.unstable_from, last.index + 1)
        if ready.committed_entries:
            last_applied = ready.committed_entries[-1].index
            invariant(
                last_applied <= self.commit_index,
                f"applied {last_applied} beyond commit {self.commit_index}",
            )
            self.applied_index = max(self.applied_index, last_applied)

    # -- internals: helpers ------------------------------------------------

    def broadcast_due(self) -> bool:
        """Entries appended as leader wait to go out; only ever sent by a leader."""
        return self.broadcast_pending and self.role is Role.LEADER

    def current_hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.commit_index)

    def emit(self, kind: str, text: str) -> None:
        self.events.append(RaftEvent(kind, f"node {self.node_id}: {text}"))

    def send(self, msg: Message) -> None:
        self.outbox.append(msg)

    def reset_election_timer(self) -> None:
        timeout_ms = self.config.election_timeout_ms
        self.election_deadline_ms = self.now_ms + self.rng.randrange(timeout_ms, 2 * timeout_ms)

    def in_leader_lease(self) -> bool:
        """Leader stickiness: we heard from a live leader within the election timeout."""
        if self.role is Role.LEADER:
            return True
        return self.now_ms < self.leader_contact_ms + self.config.election_timeout_ms

    def log_up_to_date(self, last_log_term: int, last_log_index: int) -> bool:
        return (last_log_term, last_log_index) >= (self.log.last_term(), self.log.last_index())

    def set_commit(self, index: int) -> None:
        invariant(
            index <= self.log.last_index(),
            f"commit {index} beyond last index {self.log.last_index()}",
        )
        if index > self.commit_index:
            self.commit_index = index

    # -- internals: role changes -------------------------------------------

    def enter_role(self, role: Role, leader_id: int | None) -> None:
        """The one place a role changes. What only a leader has (follower progress, a
        pending broadcast, heartbeat and check-quorum due times, a transfer, the lease
        fence, appends queued but not yet handed out in a Ready) goes in the same step,
        so nothing `ready()` emits afterwards speaks for a role the node has left."""
        if self.role is Role.LEADER:
            self.outbox = [m for m in self.outbox if not isinstance(m, LEADER_MESSAGES)]
        self.role = role
        self.leader_id = leader_id
        self.election = None
        self.progress = {}
        self.broadcast_pending = False
        self.heartbeat_due_ms = self.check_quorum_due_ms = 0
        self.term_start_index = 0
        self.transfer_target = None
        self.transfer_deadline_ms = 0
        self.timeout_now_sent = False
        self.lease_fence_ms = NEVER_MS

    def enter_term(self, term: int) -> None:
        """Messages queued in the term being left are not sent: an acknowledgement of
        entries the new term's leader then overwrote, a vote never persisted. Any message
        may be lost, so dropping them is safe, and each Ready's messages then match what
        that Ready persists."""
        self.term, self.vote = term, None
        self.outbox = [m for m in self.outbox if m.term >= term]

    def become_follower(self, term: int, leader_id: int | None) -> None:
        invariant(term >= self.term, f"term going back from {self.term} to {term}")
        if term > self.term:
            self.enter_term(term)
        if leader_id is not None and leader_id != self.leader_id:
            self.emit("leader_changed", f"following leader {leader_id} in term {term}")
        elif self.role is Role.LEADER:
            self.emit("stepped_down", f"stepped down as leader; now in term {term}")
        self.enter_role(Role.FOLLOWER, leader_id)
        self.reset_election_timer()

    def become_pre_candidate(self) -> None:
        self.enter_role(Role.PRE_CANDIDATE, None)
        self.election = _Election(pre_vote=True, votes={self.node_id: True})
        self.reset_election_timer()
        self.emit("pre_vote_started", f"pre-vote for term {self.term + 1}")
        for peer in self.peers:
            self.send(
                PreVoteRequest(
                    term=self.term + 1,
                    src=self.node_id,
                    dst=peer,
                    last_log_index=self.log.last_index(),
                    last_log_term=self.log.last_term(),
                )
            )
        self.maybe_finish_election()

    def become_candidate(self, leader_transfer: bool = False) -> None:
        self.enter_role(Role.CANDIDATE, None)
        self.enter_term(self.term + 1)
        self.vote = self.node_id
        self.election = _Election(pre_vote=False, votes={self.node_id: True})
        self.reset_election_timer()
        why = " (leadership transfer)" if leader_transfer else ""
        self.emit("election_started", f"election for term {self.term}{why}")
        for peer in self.peers:
            self.send(
                VoteRequest(
                    term=self.term,
                    src=self.node_id,
                    dst=peer,
                    last_log_index=self.log.last_index(),
                    last_log_term=self.log.last_term(),
                    leader_transfer=leader_transfer,
                )
            )
        self.maybe_finish_election()

    def become_leader(self) -> None:
        invariant(self.role is Role.CANDIDATE, f"leader from role {self.role}")
        voters = sorted(
            n
            for n, ok in (self.election.votes if self.election else {}).items()
            if ok and n != self.node_id
        )
        self.enter_role(Role.LEADER, self.node_id)
        last = self.log.last_index()
        self.progress = {
            p: Progress(match_index=0, next_index=last + 1, last_heard_ms=self.now_ms)
            for p in self.peers
        }
        self.heartbeat_due_ms = self.now_ms + self.config.heartbeat_interval_ms
        self.check_quorum_due_ms = self.now_ms + self.config.election_timeout_ms
        self.emit(
            "became_leader", f"became leader in term {self.term} after winning votes from {voters}"
        )
        self.term_start_index = self.append_as_leader(b"", EntryKind.NOOP)

    # -- internals: elections ----------------------------------------------

    def handle_election_timeout(self) -> None:
        timeout_ms = self.now_ms - self.leader_contact_ms
        if not self.peers:
            self.emit("election_timeout", f"the only voter: campaigning (term {self.term})")
        elif self.leader_contact_ms == NEVER_MS and self.role is Role.FOLLOWER:
            self.emit(
                "election_timeout",
                f"campaigning: leader {self.leader_id} is gone (term {self.term})",
            )
        elif self.role is Role.FOLLOWER and self.leader_id is not None:
            self.emit(
                "election_timeout",
                f"election timeout: no heartbeat from leader "
                f"{self.leader_id} for {timeout_ms} ms (term {self.term})",
            )
        else:
            self.emit(
                "election_timeout",
                f"election timeout as {self.role.value} in term "
                f"{self.term}: no leader heard for {timeout_ms} ms",
            )
        if self.config.pre_vote:
            self.become_pre_candidate()
        else:
            self.become_candidate()

    def handle_vote_request(self, msg: PreVoteRequest | VoteRequest) -> None:
        pre_vote = isinstance(msg, PreVoteRequest)
        if pre_vote and msg.term > self.term:
            can_vote = not self.in_leader_lease()
        else:
            can_vote = self.vote == msg.src or (self.vote is None and self.leader_id is None)
        granted = can_vote and self.log_up_to_date(msg.last_log_term, msg.last_log_index)
        if pre_vote:
            self.send(
                PreVoteResponse(
                    term=msg.term if granted else self.term,
                    src=self.node_id,
                    dst=msg.src,
                    granted=granted,
                )
            )
            return
        if granted:
            self.vote = msg.src
            self.reset_election_timer()
            self.emit("vote_granted", f"voted for {msg.src} in term {self.term}")
        self.send(VoteResponse(term=self.term, src=self.node_id, dst=msg.src, granted=granted))

    def handle_vote_response(self, msg: PreVoteResponse | VoteResponse) -> None:
        election = self.election
        if election is None or election.pre_vote != isinstance(msg, PreVoteResponse):
            return
        if election.pre_vote and msg.granted and msg.term != self.term + 1:
            return  # a grant from an earlier round
        election.votes.setdefault(msg.src, msg.granted)
        self.maybe_finish_election()

    def maybe_finish_election(self) -> None:
        election = self.election
        if election is None:
            return
        granted = sum(1 for ok in election.votes.values() if ok)
        rejected = len(election.votes) - granted
        if granted >= self.quorum:
            if election.pre_vote:
                self.become_candidate()
            else:
                self.become_leader()
        elif rejected >= self.quorum:
            kind = "pre-vote" if election.pre_vote else "election"
            self.emit(
                "election_lost",
                f"lost {kind} for term {self.term + 1 if election.pre_vote else self.term}",
            )
            self.become_follower(self.term, None)

    # -- internals: message dispatch ---------------------------------------

    def handle_higher_term(self, msg: Message) -> bool:
        """Returns whether `msg` still needs handling after adopting (or not) its term."""
        if isinstance(msg, PreVoteRequest):
            return True  # a pre-vote never changes our term
        if isinstance(msg, PreVoteResponse):
            if msg.granted:
                return msg.term == self.term + 1
            self.become_follower(msg.term, None)
            return False
        if isinstance(msg, VoteRequest):
            if self.in_leader_lease() and not msg.leader_transfer:
                self.emit(
                    "vote_ignored",
                    f"ignored vote request from {msg.src} for term "
                    f"{msg.term}: leader {self.leader_id} heard recently",
                )
                return False
            self.become_follower(msg.term, None)
            return True
        if isinstance(msg, AppendRequest | InstallSnapshot | TimeoutNow):
            self.become_follower(msg.term, msg.src)
            return True
        self.become_follower(msg.term, None)
        return False

    def handle_lower_term(self, msg: Message) -> None:
        if isinstance(msg, AppendRequest | InstallSnapshot | TimeoutNow):
            # Tell a deposed leader about the newer term so it steps down.
            self.send(
                AppendResponse(
                    term=self.term,
                    src=self.node_id,
                    dst=msg.src,
                    success=False,
                    match_index=0,
                    reject_index=0,
                    hint_index=0,
                    hint_term=0,
                    sent_ms=0,
                    storage_id=self.storage_id,
                )
            )
        elif isinstance(msg, PreVoteRequest):
            self.send(PreVoteResponse(term=self.term, src=self.node_id, dst=msg.src, granted=False))
        elif isinstance(msg, VoteRequest):
            self.send(VoteResponse(term=self.term, src=self.node_id, dst=msg.src, granted=False))

    def dispatch(self, msg: Message) -> None:
        if isinstance(msg, PreVoteRequest | VoteRequest):
            self.handle_vote_request(msg)
        elif isinstance(msg, PreVoteResponse | VoteResponse):
            self.handle_vote_response(msg)
        elif isinstance(msg, AppendRequest | InstallSnapshot | TimeoutNow):
            invariant(
                self.role is not Role.LEADER,
                f"two leaders in term {self.term}: {self.node_id} and {msg.src}",
            )
            if self.role is not Role.FOLLOWER or self.leader_id != msg.src:
                self.become_follower(self.term, msg.src)
            self.leader_contact_ms = self.now_ms
            self.reset_election_timer()
            if isinstance(msg, AppendRequest):
                self.handle_append(msg)
            elif isinstance(msg, InstallSnapshot):
                self.handle_install_snapshot(msg)
            else:
                self.handle_timeout_now(msg)
        elif isinstance(msg, AppendResponse) and self.role is Role.LEADER:
            self.handle_append_response(msg)

    # -- internals: follower side of replication ---------------------------

    def reply_append(self, msg: AppendRequest | InstallSnapshot, match_index: int) -> None:
        self.send(
            AppendResponse(
                term=self.term,
                src=self.node_id,
                dst=msg.src,
                success=True,
                match_index=match_index,
                reject_index=0,
                hint_index=0,
                hint_term=0,
                sent_ms=msg.sent_ms,
                storage_id=self.storage_id,
            )
        )

    def handle_append(self, msg: AppendRequest) -> None:
        if msg.prev_index < self.commit_index:
            # Our committed prefix matches the leader's; resume after it.
            self.reply_append(msg, self.commit_index)
            return
        local_term = self.log.term(msg.prev_index)
        if local_term != msg.prev_term:
            self.reject_append(msg, local_term)
            return
        for entry in msg.entries:
            existing = self.log.term(entry.index)
            if existing == entry.term:
                continue
            if existing is not None:
                invariant(
                    entry.index > self.commit_index,
                    f"leader {msg.src} overwrites committed entry {entry.index}",
                )
                self.log.truncate_from(entry.index)
            self.log.append(entry)
        last_new = msg.prev_index + len(msg.entries)
        self.set_commit(min(msg.commit, last_new))
        self.reply_append(msg, last_new)

    def reject_append(self, msg: AppendRequest, local_term: int | None) -> None:
        if local_term is None:  # our log ends before prev_index
            hint_index, hint_term = self.log.last_index(), 0
        else:  # conflicting term at prev_index: skip the whole term at once
            hint_index, hint_term = self.log.first_index_of_term(msg.prev_index), local_term
        self.send(
            AppendResponse(
                term=self.term,
                src=self.node_id,
                dst=msg.src,
                success=False,
                match_index=0,
                reject_index=msg.prev_index,
                hint_index=hint_index,
                hint_term=hint_term,
                sent_ms=msg.sent_ms,
                storage_id=self.storage_id,
            )
        )

    def handle_install_snapshot(self, msg: InstallSnapshot) -> None:
        if msg.snapshot_index <= self.commit_index:
            self.reply_append(msg, self.commit_index)
            return
        if self.log.term(msg.snapshot_index) == msg.snapshot_term:
            self.set_commit(msg.snapshot_index)  # we hold the entries: just commit them
        else:
            snapshot = Snapshot(msg.snapshot_index, msg.snapshot_term, msg.data)
            self.log.reset(snapshot.index, snapshot.term)
            self.snapshot = snapshot
            self.pending_snapshot = snapshot
            self.commit_index = snapshot.index
            self.emit(
                "snapshot_installed",
                f"installing snapshot at index {snapshot.index} "
                f"(term {snapshot.term}) from leader {msg.src}",
            )
        self.reply_append(msg, msg.snapshot_index)

    def handle_timeout_now(self, msg: TimeoutNow) -> None:
        self.emit("timeout_now", f"leader {msg.src} hands over leadership of term {self.term}")
        self.become_candidate(leader_transfer=True)

    # -- internals: leader side of replication -----------------------------

    def append_as_leader(self, data: bytes, kind: EntryKind) -> int:
        index = self.log.last_index() + 1
        self.log.append(Entry(index, self.term, data, kind))
        self.broadcast_pending = True
        self.maybe_commit()  # a single voter commits alone
        return index

    def tick_leader(self) -> None:
        if self.now_ms >= self.heartbeat_due_ms:
            self.heartbeat_due_ms = self.now_ms + self.config.heartbeat_interval_ms
            self.broadcast_append(heartbeat=True)
        if self.transfer_target is not None and self.now_ms >= self.transfer_deadline_ms:
            self.emit(
                "transfer_aborted",
                f"leadership transfer to {self.transfer_target} "
                f"timed out after {self.config.election_timeout_ms} ms",
            )
            self.transfer_target = None
            self.lease_fence_ms = self.now_ms
        if self.config.check_quorum and self.now_ms >= self.check_quorum_due_ms:
            self.check_quorum_due_ms = self.now_ms + self.config.election_timeout_ms
            self.maybe_step_down_without_quorum()

    def maybe_step_down_without_quorum(self) -> None:
        since_ms = self.now_ms - self.config.election_timeout_ms
        active = [p for p, pr in self.progress.items() if pr.last_heard_ms >= since_ms]
        if len(active) + 1 >= self.quorum:
            return
        self.emit(
            "check_quorum_failed",
            f"stepping down in term {self.term}: heard from "
            f"only {sorted(active)} in the last {self.config.election_timeout_ms} ms",
        )
        self.become_follower(self.term, None)

    def broadcast_append(self, heartbeat: bool) -> None:
        self.broadcast_pending = False
        for peer in self.peers:
            self.send_append(peer, heartbeat=heartbeat)

    def send_append(self, peer: int, heartbeat: bool = False) -> None:
        pr = self.progress[peer]
        if pr.state is ProgressState.SNAPSHOT:
            self.send_while_snapshotting(peer, pr, heartbeat)
            return
        prev_index = pr.next_index - 1
        prev_term = self.log.term(prev_index)
        if prev_term is None:  # the follower needs entries we compacted away
            self.send_snapshot(peer, pr)
            return
        window_full = (pr.state is ProgressState.PROBE and pr.probe_sent) or (
            pr.next_index - 1 - pr.match_index >= self.config.max_inflight_entries
        )
        entries: tuple[Entry, ...] = ()
        if not window_full and pr.next_index <= self.log.last_index():
            entries = self.log.slice(
                pr.next_index,
                self.config.max_entries_per_append,
                self.config.max_bytes_per_append,
            )
        if not entries and not heartbeat:
            return
        self.send(
            AppendRequest(
                term=self.term,
                src=self.node_id,
                dst=peer,
                prev_index=prev_index,
                prev_term=prev_term,
                entries=entries,
                commit=self.commit_index,
                sent_ms=self.now_ms,
            )
        )
        if pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        elif entries:
            pr.next_index = entries[-1].index + 1

    def send_while_snapshotting(self, peer: int, pr: Progress, heartbeat: bool) -> None:
        if self.now_ms - pr.snapshot_sent_ms >= self.config.election_timeout_ms:
            self.send_snapshot(peer, pr)  # presumed lost
        elif heartbeat:
            self.send(
                AppendRequest(
                    term=self.term,
                    src=self.node_id,
                    dst=peer,
                    prev_index=self.log.snapshot_index,
                    prev_term=self.log.snapshot_term,
                    entries=(),
                    commit=self.commit_index,
                    sent_ms=self.now_ms,
                )
            )

    def send_snapshot(self, peer: int, pr: Progress) -> None:
        snap = self.snapshot
        invariant(
            snap is not None and snap.index == self.log.snapshot_index,
            f"no snapshot data for compacted index {self.log.snapshot_index}",
        )
        assert snap is not None  # for the type checker; checked just above
        pr.state = ProgressState.SNAPSHOT
        pr.pending_snapshot_index = snap.index
        pr.snapshot_sent_ms = self.now_ms
        self.emit(
            "snapshot_sent",
            f"sending snapshot at index {snap.index} to {peer} (it needs index {pr.next_index})",
        )
        self.send(
            InstallSnapshot(
                term=self.term,
                src=self.node_id,
                dst=peer,
                snapshot_index=snap.index,
                snapshot_term=snap.term,
                data=snap.data,
                sent_ms=self.now_ms,
            )
        )

    def handle_append_response(self, msg: AppendResponse) -> None:
        pr = self.progress[msg.src]
        if msg.storage_id in pr.retired_storage_ids:
            return  # a late answer from a disk the follower no longer has
        if pr.storage_id is None:
            pr.storage_id = msg.storage_id
        elif msg.storage_id != pr.storage_id:
            self.follower_lost_state(msg.src, pr, msg.storage_id)
        pr.last_heard_ms = self.now_ms
        pr.lease_sent_ms = max(pr.lease_sent_ms, msg.sent_ms)
        if msg.success:
            self.handle_append_success(msg.src, pr, msg.match_index)
        else:
            self.handle_append_reject(msg.src, pr, msg)

    def handle_append_success(self, peer: int, pr: Progress, match_index: int) -> None:
        invariant(
            match_index <= self.log.last_index(),
            f"{peer} acknowledges {match_index} beyond our last {self.log.last_index()}",
        )
        progressed = match_index > pr.match_index
        pr.match_index = max(pr.match_index, match_index)
        pr.next_index = max(pr.next_index, pr.match_index + 1)
        if pr.state is ProgressState.PROBE or (
            pr.state is ProgressState.SNAPSHOT and pr.match_index >= pr.pending_snapshot_index
        ):
            pr.state = ProgressState.REPLICATE
            pr.next_index = pr.match_index + 1
            pr.probe_sent = False
        if progressed:
            self.maybe_commit()
        self.maybe_send_timeout_now(peer)
        self.send_append(peer)

    def handle_append_reject(self, peer: int, pr: Progress, msg: AppendResponse) -> None:
        # The storage that acknowledged match_index still holds it, so a rejection at or
        # below it answers an older request, overtaken by the acknowledgement on the way.
        if msg.reject_index <= pr.match_index or pr.state is ProgressState.SNAPSHOT:
            return  # stale, or answered by the snapshot in flight
        if msg.hint_term == 0:
            next_index = msg.hint_index + 1
        else:
            ours = self.log.last_index_of_term(msg.hint_term, msg.reject_index)
            next_index = ours + 1 if ours is not None else msg.hint_index
        next_index = min(next_index, msg.reject_index)
        pr.next_index = max(pr.match_index + 1, next_index)
        pr.state = ProgressState.PROBE
        pr.probe_sent = False
        self.send_append(peer)

    def follower_lost_state(self, peer: int, pr: Progress, storage_id: int) -> None:
        """The follower answers from another storage than the one that acknowledged
        `match_index` (a wiped or replaced disk): what that storage held is gone. Start
        over from what the new one holds, as for a follower never heard from; the answer
        at hand then places it. The commit index never moves back; a lower match only
        makes later commits wait for other voters. Only a change of storage lowers a
        match: within one storage, acknowledged entries are durable."""
        self.emit(
            "follower_lost_state",
            f"{peer} lost its log: storage {pr.storage_id} that acknowledged index "
            f"{pr.match_index} was replaced by storage {storage_id}; replicating it afresh",
        )
        if pr.storage_id is not None:
            pr.retired_storage_ids.add(pr.storage_id)
        pr.storage_id = storage_id
        pr.match_index = 0
        pr.next_index = 1
        pr.state = ProgressState.PROBE
        pr.probe_sent = False
        pr.pending_snapshot_index = 0
        pr.snapshot_sent_ms = NEVER_MS

    def maybe_commit(self) -> None:
        if self.role is not Role.LEADER:
            return
        matches = sorted(
            [self.log.last_index()] + [p.match_index for p in self.progress.values()], reverse=True
        )
        candidate = matches[self.quorum - 1]
        # Only an entry of the current term commits by counting (Raft paper, Figure 8);
        # earlier entries commit with it.
        if candidate > self.commit_index and self.log.term(candidate) == self.term:
            self.set_commit(candidate)

    def maybe_send_timeout_now(self, peer: int) -> None:
        if self.transfer_target != peer or self.timeout_now_sent:
            return
        if self.progress[peer].match_index == self.log.last_index():
            self.timeout_now_sent = True
            self.send(TimeoutNow(term=self.term, src=self.node_id, dst=peer))
