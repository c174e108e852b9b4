"""The controller's replicated state machine, without I/O: what the Raft log means.

`ControllerStateMachine` is the `StateMachine` the shared `RaftDriver` applies Ready to,
in production (`ControllerServer`) and in the Raft simulation alike. It owns:

- the images (`PendingImages`): committed entries decode to metadata records and replay
  into the committed image through `MetadataDelta`; a snapshot replaces it;
- leadership: on becoming Raft leader it starts a fresh `QuorumController` for the term
  (its in-memory state, heartbeats and sessions, belongs to one term) and drops the
  uncommitted proposals of an earlier term; it becomes *active* only once it has applied
  its own term's first entry, so every operation reads an image that holds everything
  an earlier leader committed;
- the cluster id: written by the first active controller of a new quorum, learned from
  the image by everyone else;
- the snapshot policy: a snapshot after so many records or bytes since the last one, and
  never before the entries applied since the last one outweigh it (so writing snapshots
  costs at most about as much as applying the entries, however large the image), encoded
  by a `SnapshotEncoder` (production: on a worker thread, off the event loop);
- pending proposals: each proposal's callback fires once its entry commits, or fails
  when leadership or the log moved under it;
- entry bounds (`EntryLimits`): an operation's records are proposed as as many entries
  as it takes to keep each under a record count and a byte size, so no single entry
  stalls the loops that append, replicate, apply and fetch it (docs/controller.md,
  "Large operations").

Callbacks, not futures, report outcomes, so the asyncio server and the simulator wrap the
same object.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rillet.client.wire.errors import NotControllerError, PolicyViolationError
from rillet.controller.metadata.describe import CLUSTER_ID_KEY, cluster_id_of
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    RESOURCE_BROKER,
    Config,
    MetadataImage,
    MetadataRecord,
    check,
    decode_records,
    decode_snapshot,
    encode_records,
    encode_snapshot,
)
from rillet.controller.metadata.quorum import ControllerConfig, PendingImages, QuorumController
from rillet.controller.raft.core import (
    EntryKind,
    NotLeader,
    RaftNode,
    Ready,
    Role,
    Snapshot,
    TooManyUncommitted,
)

log = logging.getLogger(__name__)

# Called with None once the proposal commits, or with the error that ends its wait.
OnCommit = Callable[[Exception | None], None]


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """Snapshot once this many records or bytes were applied since the last snapshot, and
    at least as many entry bytes as the last snapshot took."""

    max_records: int = 20_000
    max_bytes: int = 16 * 1024 * 1024


# Encodes a (immutable) image and hands the bytes to the callback, or None when encoding
# failed. `encode_at_once` is the default (the simulator, tests); the server encodes on a
# worker thread: the snapshot of 50,000 partitions took about a second to encode, and on
# the loop that stopped Raft heartbeats long enough for an election.
SnapshotEncoder = Callable[[MetadataImage, Callable[[bytes | None], None]], None]


def encode_at_once(image: MetadataImage, done: Callable[[bytes | None], None]) -> None:
    done(encode_snapshot(image))


@dataclass(frozen=True, slots=True)
class EntryLimits:
    """The most records, and encoded bytes, one Raft entry may hold (a single record
    larger than ``max_bytes`` still goes, alone, up to ``max_record_bytes``).

    ``max_record_bytes`` is far below what the Raft store takes in one entry (64 MiB,
    past which persisting is fatal) and below what a FetchMetadata answer carries, so
    a record that passes it can always be written, replicated and fetched; no record
    a valid operation plans comes near it (the largest, a broker's registration, is
    bounded field by field)."""

    max_records: int = 1000
    max_bytes: int = 128 * 1024
    max_record_bytes: int = 1024 * 1024


Chunk = tuple[list[MetadataRecord], bytes]  # records and their encoding: one entry


def split_records(records: list[MetadataRecord], limits: EntryLimits) -> Iterator[Chunk]:
    """``records`` cut into consecutive entries, each within ``limits``, in order; lazily,
    so a caller that yields between entries also spreads the encoding.

    An entry is only ever cut between units: a run of one resource's Config records is one
    unit (every other record is a unit of its own), so a leader lost between entries
    leaves each resource altered wholly or not at all, as IncrementalAlterConfigs
    promises. A unit of more than ``limits.max_records`` records, or one record larger
    than ``limits.max_record_bytes``, raises PolicyViolationError (callers split every
    entry before proposing the first, so nothing of such an operation is proposed)."""
    batch: list[list[MetadataRecord]] = []
    size = 0
    for unit in _units(records):
        if len(unit) > limits.max_records:
            raise PolicyViolationError(
                f"{len(unit):,} config records of one resource are over the "
                f"{limits.max_records:,}-record limit of one metadata log entry"
            )
        if size + len(unit) > limits.max_records:
            yield from _encode_units(batch, limits)
            batch, size = [], 0
        batch.append(unit)
        size += len(unit)
    yield from _encode_units(batch, limits)


def _units(records: list[MetadataRecord]) -> Iterator[list[MetadataRecord]]:
    """The units no entry boundary may cut: runs of one resource's Config records."""
    unit: list[MetadataRecord] = []
    for r in records:
        if unit and not (isinstance(r, Config) and _same_resource(unit[-1], r)):
            yield unit
            unit = []
        unit.append(r)
    if unit:
        yield unit


def _same_resource(a: MetadataRecord, b: Config) -> bool:
    return (
        isinstance(a, Config)
        and a.resource_type == b.resource_type
        and a.resource_name == b.resource_name
    )


def _encode_units(units: list[list[MetadataRecord]], limits: EntryLimits) -> list[Chunk]:
    out: list[Chunk] = []
    _encode_within(units, limits, out)
    return out


def _encode_within(
    units: list[list[MetadataRecord]], limits: EntryLimits, out: list[Chunk]
) -> None:
    records = [r for unit in units for r in unit]
    data = encode_records(records)
    if len(data) <= limits.max_bytes or len(units) <= 1:
        if len(data) > limits.max_record_bytes:
            kind = type(records[0]).__name__
            raise PolicyViolationError(
                f"a {kind} metadata record of {len(data):,} bytes is over the "
                f"{limits.max_record_bytes:,}-byte limit of one record"
            )
        out.append((records, data))
        return
    half = len(units) // 2  # rare (records of several KiB each): halve until they fit
    _encode_within(units[:half], limits, out)
    _encode_within(units[half:], limits, out)


class ControllerStateMachine:
    def __init__(
        self,
        node_id: int,
        controller_config: ControllerConfig,
        snapshot_policy: SnapshotPolicy,
        *,
        entry_limits: EntryLimits = EntryLimits(),
        new_cluster_id: Callable[[], str],
        rng: random.Random,
        on_applied: Callable[[], None] = lambda: None,
        on_cluster_id: Callable[[str], None] = lambda cid: None,
        snapshot_encoder: SnapshotEncoder = encode_at_once,
    ) -> None:
        self.node_id = node_id
        self.controller_config = controller_config
        self.snapshot_policy = snapshot_policy
        self.entry_limits = entry_limits
        self.new_cluster_id = new_cluster_id
        self.rng = rng
        self.on_applied = on_applied  # after every apply and every loss of leadership
        self.on_cluster_id = on_cluster_id
        self.images = PendingImages(EMPTY_IMAGE)
        self.ctl: QuorumController | None = None
        self.active = False  # the Raft leader that has applied its own term's first entry
        self.cluster_id: str | None = None
        self._propose_entry: Callable[[bytes], int] | None = None
        self._node: RaftNode | None = None
        self._leader_term: int | None = None
        self._last_leader: int | None = None
        self._waiters: dict[int, tuple[int, OnCommit]] = {}
        self._since_snapshot_records = 0
        self._since_snapshot_bytes = 0
        self.snapshot_encoder = snapshot_encoder
        self._encoding: int | None = None  # offset of the image being encoded
        self._encoded: tuple[int, bytes] | None = None  # encoded, not yet handed over
        self._last_snapshot_bytes = 0
        self.applied_records = 0  # records of every entry applied so far

    def restore(self, snapshot: Snapshot | None) -> None:
        """At start, from the stored snapshot (the node re-delivers the entries after it)."""
        if snapshot is not None:
            self.images = PendingImages(decode_snapshot(snapshot.data))
            self._learn_cluster_id()

    def bind(self, node: RaftNode, propose_entry: Callable[[bytes], int]) -> None:
        """The node whose log this is, and how to propose to it (the driver's `propose`)."""
        self._node = node
        self._propose_entry = propose_entry

    @property
    def image(self) -> MetadataImage:
        return self.images.committed

    # -- StateMachine: step 3 and after advance ----------------------------------------

    def apply(self, ready: Ready) -> None:
        """Restore a snapshot, replay committed entries, settle the proposals they answer."""
        node = self._node
        if node is not None and self._leader_term is not None and not self._leads(node):
            # One Ready can hold both the step-down and the new leader's commits (inputs
            # batched during an fsync or a stalled loop): this term's proposals go first,
            # or they would be replayed over entries that replaced them.
            self._lose_leadership(node.term)
        if ready.snapshot is not None:
            self.images = PendingImages(decode_snapshot(ready.snapshot.data))
            self.fail_waiters("a snapshot replaced this controller's state")
            self._since_snapshot_records = self._since_snapshot_bytes = 0
            self._last_snapshot_bytes = len(ready.snapshot.data)
            log.info(
                "controller %d: loaded snapshot at offset %d", self.node_id, ready.snapshot.index
            )
        entries = []
        for e in ready.committed_entries:
            records = decode_records(e.data) if e.kind == EntryKind.NORMAL else []
            entries.append((e.index, e.term, records))
            self._since_snapshot_records += len(records)
            self.applied_records += len(records)
            self._since_snapshot_bytes += len(e.data)
        if entries:
            self.images.commit(entries, want_delta=False)
            for index, term, _ in entries:
                waiter = self._waiters.pop(index, None)
                if waiter is not None:
                    proposed_term, on_commit = waiter
                    replaced = proposed_term != term
                    on_commit(NotControllerError("the proposal was replaced") if replaced else None)
        if entries or ready.snapshot is not None:
            self._learn_cluster_id()
            self.on_applied()

    def after_advance(self, node: RaftNode) -> tuple[int, bytes] | None:
        self._track_leadership(node)
        return self._snapshot_due(node)

    def _track_leadership(self, node: RaftNode) -> None:
        if node.leader_id != self._last_leader:
            self._last_leader = node.leader_id
            log.info(
                "controller %d: quorum leader is now %s (term %d)",
                self.node_id,
                node.leader_id,
                node.term,
            )
        if node.role is Role.LEADER and self._leader_term != node.term:
            self._become_leader(node.term)
        elif node.role is not Role.LEADER and self._leader_term is not None:
            self._lose_leadership(node.term)
        if (
            node.role is Role.LEADER
            and not self.active
            and node.applied_index >= node.term_start_index
        ):
            self._become_active(node.term)

    def _leads(self, node: RaftNode) -> bool:
        """The node still leads the term this machine's proposals belong to."""
        return node.role is Role.LEADER and node.term == self._leader_term

    def _become_leader(self, term: int) -> None:
        """Raft leader, not yet active: a new QuorumController; proposals start afresh."""
        self._leader_term = term
        self.active = False
        self.images.reset()
        self.ctl = QuorumController(self.controller_config, rng=self.rng)

    def _lose_leadership(self, term: int) -> None:
        """Uncommitted proposals may be truncated by the next leader: forget them."""
        log.info("controller %d: no longer the active controller (term %d)", self.node_id, term)
        self._leader_term, self.active, self.ctl = None, False, None
        self.fail_waiters("leadership lost")
        self.images.reset()
        self.on_applied()

    def _become_active(self, term: int) -> None:
        self.active = True
        if cluster_id_of(self.images.pending) is None:
            new_id = self.new_cluster_id()
            record = Config(RESOURCE_BROKER, CLUSTER_ID_KEY[0], CLUSTER_ID_KEY[1], new_id)
            try:
                self.propose([record])
            except NotControllerError:
                # A leadership transfer began before this term's first entry applied: stay
                # inactive; the next Ready retries, or the transfer ends the term.
                self.active = False
                return
            log.info("controller %d: writing cluster id %s", self.node_id, new_id)
        log.info(
            "controller %d: active controller for term %d at offset %d",
            self.node_id,
            term,
            self.images.committed.offset,
        )

    def _learn_cluster_id(self) -> None:
        cid = cluster_id_of(self.images.committed)
        if cid is None or cid == self.cluster_id:
            return
        self.cluster_id = cid
        self.on_cluster_id(cid)

    def _snapshot_due(self, node: RaftNode) -> tuple[int, bytes] | None:
        """An encoded snapshot to hand to the node, once the policy says so. Encoding may
        finish later (a worker thread): the snapshot is then handed over at a later
        Ready, if the node has not moved past it (a leader's snapshot installed)."""
        if self._encoding is None and self._encoded is None:
            self._maybe_start_snapshot(node)
        encoded, self._encoded = self._encoded, None
        if encoded is None:
            return None
        offset, data = encoded
        if not node.log.snapshot_index < offset <= node.applied_index:
            return None
        self._last_snapshot_bytes = len(data)
        return encoded

    def _maybe_start_snapshot(self, node: RaftNode) -> None:
        policy = self.snapshot_policy
        if (
            self._since_snapshot_records < policy.max_records
            and self._since_snapshot_bytes < policy.max_bytes
        ) or self._since_snapshot_bytes < self._last_snapshot_bytes:
            return
        image = self.images.committed
        if image.offset <= node.log.snapshot_index or image.offset > node.applied_index:
            return
        log.info(
            "controller %d: snapshot at offset %d after %d records",
            self.node_id,
            image.offset,
            self._since_snapshot_records,
        )
        self._since_snapshot_records = self._since_snapshot_bytes = 0
        self._encoding = offset = image.offset

        def done(data: bytes | None) -> None:
            if self._encoding != offset:
                return  # a reset (a snapshot installed) dropped this one
            self._encoding = None
            if data is not None:
                self._encoded = (offset, data)

        self.snapshot_encoder(image, done)

    # -- proposals ---------------------------------------------------------------------

    def propose(self, records: list[MetadataRecord], on_commit: OnCommit | None = None) -> int:
        """Propose an operation's records as bounded entries (`split_records`); returns
        the last one's index. ``on_commit`` fires when the last entry commits (Raft
        commits in order, so the others have too).

        Raises NotControllerError when this node cannot propose; entries proposed before
        it stand (the caller decides what a partial proposal means). PolicyViolationError
        (a record too large, more entries than Raft holds uncommitted) comes before any
        entry is proposed.
        """
        chunks = self.split_checked(records)
        for chunk in chunks[:-1]:
            self.propose_chunk(chunk)
        return self.propose_chunk(chunks[-1], on_commit)

    def split(self, records: list[MetadataRecord]) -> Iterator[Chunk]:
        return split_records(records, self.entry_limits)

    def split_checked(self, records: list[MetadataRecord]) -> list[Chunk]:
        """Every entry of an operation, encoded, once it is known they can all be
        proposed: PolicyViolationError for a record over the entry limits (`split`) or
        for more entries than Raft takes uncommitted (proposing them would fail half-way,
        and a client told NOT_CONTROLLER would only send the operation again). Pure: the
        server runs it on a worker thread for a large operation."""
        chunks = list(self.split(records))
        room = self._node.config.max_uncommitted_entries if self._node is not None else None
        if room is not None and len(chunks) > room:
            raise PolicyViolationError(
                f"the operation needs {len(chunks):,} metadata log entries "
                f"({len(records):,} records); at most {room:,} can be in flight"
            )
        return chunks

    def propose_chunk(self, chunk: Chunk, on_commit: OnCommit | None = None) -> int:
        """Propose one entry of `split`'s; returns its log index."""
        if not self.active or self._propose_entry is None or self._node is None:
            raise NotControllerError(f"controller {self.node_id} is not active")
        records, data = chunk
        node = self._node
        if not self._leads(node):  # stepped down: the next Ready tells the machine
            raise NotControllerError(f"controller {self.node_id} is no longer the leader")
        # Replayed onto the pending image before Raft sees it: records that do not apply
        # (computed from an image another operation changed meanwhile) raise here. In
        # the log they would fail every controller's apply, on every restart too.
        index, term = node.log.last_index() + 1, node.term
        image = self.images.prepare(records, index, term)
        try:
            proposed = self._propose_entry(data)
        except (NotLeader, TooManyUncommitted) as e:
            raise NotControllerError(str(e)) from None
        check(proposed == index, f"entry proposed at {proposed}, prepared for {index}")
        self.images.add(records, index, term, image)
        if on_commit is not None:
            self._waiters[index] = (term, on_commit)
        return index

    def tick(self, now_ms: int) -> None:
        """Session expiry and leader rebalance, on the active controller only."""
        records = self.tick_records(now_ms)
        if records:
            self.propose(records)

    def tick_records(self, now_ms: int) -> list[MetadataRecord]:
        """What `tick` would propose (the server proposes it giving the loop turns)."""
        if not self.active or self.ctl is None:
            return []
        return self.ctl.tick(self.images.pending, now_ms).records

    def fail_waiters(self, reason: str) -> None:
        waiters, self._waiters = self._waiters, {}
        for _, on_commit in waiters.values():
            on_commit(NotControllerError(reason))
