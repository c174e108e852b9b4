"""Fetch sessions (Kafka's KIP-227 incremental fetch), the leader's side: a pure state
machine, no I/O and no clock; the Fetch handler (broker/handlers/fetch.py) is its driver.

A follower of 6,700 partitions, or a consumer of thousands, used to send every partition
on every Fetch and get an answer for every one, though almost all were idle. With a
session the broker remembers what the client fetches, so each request lists only what
changed and each answer only what has news:

- ``session_epoch`` 0 is a **full fetch** that opens a session: the request lists every
  partition, the answer carries all of them and the new ``session_id`` (0 when the cache
  is full and no session could be made: the client simply fetches in full again).
- ``session_epoch`` n > 0 is the n-th **incremental fetch** of ``session_id``: the request
  lists only partitions that are new or whose fetch offset, epochs or max bytes changed,
  plus ``forgotten`` ones. For a consumer the broker reads every partition of the
  session (so a long poll still wakes on data for partitions the request did not list);
  for a follower only the listed ones and those marked ``changed`` since (the broker's
  FetchWatch marks them; the session's FetchClock records the follower's position on
  the idle rest, as the ISR needs). It answers the partitions the request listed and
  those with records, a new high watermark or log start offset, an error, a diverging
  epoch or a preferred read replica.
- ``session_epoch`` -1 is a **sessionless full fetch**, as before sessions existed; with a
  ``session_id`` it also closes that session.

A request naming an unknown session is answered FETCH_SESSION_ID_NOT_FOUND, one with the
wrong epoch INVALID_FETCH_SESSION_EPOCH; the client then starts over with a full fetch.
The epoch makes a lost or repeated answer harmless: the client moves to the next epoch
only once it holds the answer, so an incremental answer ("only what changed since the
last answer") is never computed against an answer the client did not see.

Both sides drop a partition answered with an error from the session (the client lists
it again in full if it still wants it), so a session holds only partitions this broker
serves: its memory is bounded by the broker's partitions, and the cache by
``max.incremental.fetch.session.cache.slots`` sessions (Kafka's default, 1000). When the
cache is full a new consumer session evicts the least recently used consumer session,
but only one idle for ``min_eviction_ms`` (Kafka's 2 minutes); otherwise the new consumer
fetches without a session. With more busy consumers than slots, evicting one in use
made its next fetch a refusal and its full fetch evict the next one, and so on: every
fetch of every consumer a refusal plus a full fetch. A follower's new session evicts
the least recently used consumer session, idle or not; follower sessions (a handful per
broker, and the ones replication depends on) are evicted only to make room for another
follower's. A follower owns at most one session per leader: its new
full fetch replaces its old session (a restarted follower leaves none behind).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rillet.broker.replica_fetch import FetchPartition, FetchPartitionResult
from rillet.broker.replication.types import FetchClock
from rillet.client.wire import errors

INITIAL_EPOCH = 0  # a full fetch opening a session
FINAL_EPOCH = -1  # no session: a full fetch, closing session_id if one is named
NO_SESSION = 0
MAX_EPOCH = (1 << 31) - 1  # epochs wrap to 1 after this (0 and -1 are taken)
FETCH_SESSION_ID_NOT_FOUND = errors.code_of("FETCH_SESSION_ID_NOT_FOUND")
INVALID_FETCH_SESSION_EPOCH = errors.code_of("INVALID_FETCH_SESSION_EPOCH")
NONE = errors.NONE
CONSUMER = -1
MIN_EVICTION_MS = 120_000  # a consumer session idle this long may be evicted (as Kafka)

Key = tuple[str, int]  # (topic, partition)


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """A session partition: what the client last asked, and what we last answered.
    ``seq`` orders it in the session (higher: later)."""

    fetch: FetchPartition
    high_watermark: int = -1  # -1: never answered, so the next answer includes it
    log_start_offset: int = -1
    seq: int = 0


@dataclass(slots=True)
class FetchSession:
    """A follower's session (``watched``) reads only ``changed`` partitions plus the ones
    a request lists: the broker marks a partition changed when anything a fetch of it
    would see moves (FetchWatch, broker/replica.py), and keeps it marked while a read of
    it still has something to do (records to send, a follower not in the ISR); a
    partition whose read found the follower idle at the leader's end is unmarked, and
    ``clock`` stands for its fetches meanwhile (FetchClock)."""

    id: int
    replica_id: int  # CONSUMER, or the follower's broker id (it owns the session)
    epoch: int  # what the next incremental request must carry
    partitions: dict[Key, CachedPartition] = field(default_factory=dict)
    last_used_ms: int = 0
    changed: set[Key] = field(default_factory=set)
    clock: FetchClock = field(default_factory=FetchClock)
    closed: bool = False
    # Closed by its own follower (a full fetch naming it, or its next session), not
    # evicted: its parked fetch is ended at once (ReplicaManager.unwatch).
    replaced: bool = False
    watch: object = None  # the broker's FetchWatch, made on its first fetch
    next_seq: int = 0

    @property
    def watched(self) -> bool:
        return self.replica_id != CONSUMER

    def fetches(self, keys: Iterable[Key]) -> list[FetchPartition]:
        """The session's rows for ``keys`` (those it holds), in session order."""
        cached = self.partitions
        held = [c for c in (cached.get(k) for k in keys) if c is not None]
        held.sort(key=_seq)
        return [c.fetch for c in held]

    def mark(self, key: Key) -> bool:
        """Something a fetch of ``key`` would see changed: the next fetch reads it. False
        when the session no longer holds it (closed, forgotten, dropped on an error)."""
        if self.closed or key not in self.partitions:
            return False
        self.changed.add(key)
        return True

    def note_read(self, results: Iterable[FetchPartitionResult]) -> None:
        """After a fetch's first read: partitions found idle are left unread until marked
        again; the rest (records to send, an error, a follower outside the ISR or behind
        the leader's end) are read again by the next fetch."""
        changed = self.changed
        for r in results:
            key = (r.topic, r.partition)
            if r.idle:
                changed.discard(key)
            else:
                changed.add(key)

    def to_back(self, c: CachedPartition) -> None:
        c.seq = self.next_seq
        self.next_seq += 1


def _seq(c: CachedPartition) -> int:
    return c.seq


class FetchContext:
    """One Fetch's plan: the partitions to read (request order for a sessionless fetch,
    session order otherwise; for a watched session's incremental fetch only those listed
    or changed) and ``answer``, which picks what goes back."""

    __slots__ = ("session", "session_id", "incremental", "partitions")

    def __init__(
        self, session: FetchSession | None, incremental: bool, partitions: list[FetchPartition]
    ) -> None:
        self.session = session
        self.session_id = session.id if session is not None else NO_SESSION
        self.incremental = incremental
        self.partitions = partitions

    @property
    def watched(self) -> FetchSession | None:
        """The session, if it is a watched (follower) one."""
        session = self.session
        return session if session is not None and session.watched else None

    def answer(self, results: Sequence[FetchPartitionResult]) -> list[FetchPartitionResult]:
        """The results to send, given one per ``partitions`` entry in order, and the
        session updated to what the client will have seen."""
        session = self.session
        if session is None:
            return list(results)
        cached = session.partitions
        out: list[FetchPartitionResult] = []
        moved: list[Key] = []
        for r in results:
            key = (r.topic, r.partition)
            c = cached.get(key)
            if r.error_code != NONE:
                cached.pop(key, None)  # the client drops it too and re-adds it in full
                session.changed.discard(key)
                out.append(r)
                continue
            if c is None:  # not possible unless the caller mixed contexts; answer anyway
                out.append(r)
                continue
            changed = r.high_watermark != c.high_watermark or (
                r.log_start_offset != c.log_start_offset
            )
            has_data = r.records is not None
            if (
                not self.incremental
                or changed
                or has_data
                or r.diverging_epoch is not None
                or r.preferred_read_replica >= 0
            ):
                c.high_watermark = r.high_watermark
                c.log_start_offset = r.log_start_offset
                out.append(r)
            if has_data:
                moved.append(key)
        # Partitions that got data go to the back of the session order, so a busy one
        # early in it cannot take the whole response budget every time (as Kafka).
        for key in moved:
            c = cached.pop(key, None)
            if c is not None:
                cached[key] = c
                session.to_back(c)
        return out


class FetchSessionCache:
    """The broker's sessions, at most ``max_slots`` (0 disables sessions)."""

    def __init__(
        self,
        max_slots: int = 1000,
        rng: random.Random | None = None,
        min_eviction_ms: int = MIN_EVICTION_MS,
    ) -> None:
        self.max_slots = max_slots
        self.min_eviction_ms = min_eviction_ms
        self._rng = rng or random.Random()
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()  # LRU first
        self._by_replica: dict[int, int] = {}  # follower id -> its session id
        self._closed: list[FetchSession] = []  # watched sessions removed, not yet taken
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def clear(self) -> None:
        """Drop every session (each client's next incremental fetch is refused, and it
        starts over with a full one)."""
        self.evictions += len(self._sessions)
        for session in list(self._sessions.values()):
            self._remove(session)

    def take_closed(self) -> list[FetchSession]:
        """Watched sessions removed since the last call (closed, replaced, evicted): the
        broker takes their watches off its replicas."""
        closed, self._closed = self._closed, []
        return closed

    def new_context(
        self,
        replica_id: int,
        session_id: int,
        epoch: int,
        listed: Iterable[FetchPartition],
        forgotten: Iterable[Key] = (),
        now_ms: int = 0,
    ) -> FetchContext | int:
        """The context for one Fetch, or the error code to answer it with. ``now_ms``
        (any monotonic clock) only decides which sessions are idle enough to evict."""
        if epoch == FINAL_EPOCH:
            if session_id != NO_SESSION:
                self._close(session_id, replica_id)
            return FetchContext(None, False, list(listed))
        if epoch == INITIAL_EPOCH:
            if session_id != NO_SESSION:
                self._close(session_id, replica_id)
            partitions = {
                (p.topic, p.partition): CachedPartition(p, seq=i) for i, p in enumerate(listed)
            }
            session = self._create(replica_id, partitions, now_ms)
            fetches = [c.fetch for c in partitions.values()]
            return FetchContext(session, False, fetches)
        if epoch < FINAL_EPOCH or session_id == NO_SESSION:
            return INVALID_FETCH_SESSION_EPOCH
        session = self._sessions.get(session_id)
        if session is None or session.replica_id != replica_id:
            return FETCH_SESSION_ID_NOT_FOUND
        if session.epoch != epoch:
            return INVALID_FETCH_SESSION_EPOCH
        session.epoch = next_epoch(epoch)
        session.last_used_ms = now_ms
        self._sessions.move_to_end(session_id)
        cached = session.partitions
        for key in forgotten:
            cached.pop(key, None)
            session.changed.discard(key)
        keys: list[Key] = []
        for p in listed:
            key = (p.topic, p.partition)
            keys.append(key)
            c = cached.get(key)
            if c is None:
                c = cached[key] = CachedPartition(p)
                session.to_back(c)
            else:
                # A listed partition is always answered: its client may have changed
                # more than its offset (a new leader epoch, a re-created topic's new
                # replica) and must not be left without the high watermark it now needs.
                c.fetch = p
                c.high_watermark = c.log_start_offset = -1
        if session.watched:
            return FetchContext(session, True, session.fetches({*keys, *session.changed}))
        return FetchContext(session, True, [c.fetch for c in cached.values()])

    def _create(
        self, replica_id: int, partitions: dict[Key, CachedPartition], now_ms: int
    ) -> FetchSession | None:
        if self.max_slots <= 0:
            return None
        if replica_id != CONSUMER and replica_id in self._by_replica:
            self._close(self._by_replica[replica_id], replica_id)
        if len(self._sessions) >= self.max_slots and not self._evict_for(replica_id, now_ms):
            return None
        session_id = NO_SESSION
        while session_id == NO_SESSION or session_id in self._sessions:
            session_id = self._rng.randint(1, MAX_EPOCH)
        session = FetchSession(
            session_id, replica_id, next_epoch(INITIAL_EPOCH), partitions, now_ms
        )
        session.next_seq = len(partitions)
        self._sessions[session_id] = session
        if replica_id != CONSUMER:
            self._by_replica[replica_id] = session_id
        return session

    def _evict_for(self, replica_id: int, now_ms: int) -> bool:
        """Free a slot: the least recently used consumer session (for a consumer, only
        an idle one), else (for a follower) the least recently used follower session.
        False: a consumer gets no session."""
        victim = next((s for s in self._sessions.values() if s.replica_id == CONSUMER), None)
        if (
            victim is not None
            and replica_id == CONSUMER
            and now_ms - victim.last_used_ms < self.min_eviction_ms
        ):
            return False  # in use: evicting it would only make it evict another
        if victim is None and replica_id != CONSUMER:
            victim = next(iter(self._sessions.values()))
        if victim is None:
            return False
        self._remove(victim)
        self.evictions += 1
        return True

    def _close(self, session_id: int, replica_id: int) -> None:
        session = self._sessions.get(session_id)
        if session is not None and session.replica_id == replica_id:
            session.replaced = True
            self._remove(session)

    def _remove(self, session: FetchSession) -> None:
        del self._sessions[session.id]
        if self._by_replica.get(session.replica_id) == session.id:
            del self._by_replica[session.replica_id]
        session.closed = True
        if session.watched:
            self._closed.append(session)
