"""``Replica``: one partition on this broker — its log, its replication core, the
``PartitionDriver`` that runs the core, and the fetches and acks=all produces waiting on
it — plus ``LogStorage``, the storage.Log side of the driver.

A Replica is the broker's ``ReplicaNetwork`` for its own partition (what the driver
calls to get things out of the partition): it wakes parked fetches, resolves acks=all
futures, and hands AlterPartition proposals to the ReplicaManager, which owns the
controller channel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from rillet.broker.replication.driver import Clock, PartitionDriver
from rillet.broker.replication.partition_state import PartitionState
from rillet.broker.replication.types import AppendFetched, ProposeAlterPartition
from rillet.client.wire.records import validate_produced
from rillet.storage import Log


class LogStorage:
    """storage.Log as the driver's ``ReplicaStorage``."""

    __slots__ = ("log",)

    def __init__(self, log: Log) -> None:
        self.log = log

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        self.log.epochs.assign(epoch, start_offset)

    def set_high_watermark(self, high_watermark: int) -> None:
        self.log.high_watermark = high_watermark  # bounds retention and compaction

    def append_as_leader(self, data: Any, leader_epoch: int) -> tuple[int, int]:
        # Every batch checked before any is written: a partition's batches in a produce
        # are all or nothing, and nothing a consumer (or the cleaner) cannot read is
        # stored. Followers store the leader's bytes without this (append_fetched).
        config = self.log.config
        validate_produced(data, compacted=config.compact, max_size=config.max_message_bytes)
        return self.log.append(data, leader_epoch)

    def append_fetched(self, effect: AppendFetched, fetched: Any) -> None:
        # The bytes carry their own offsets, checked by the log against its end.
        self.log.append_as_follower(fetched)

    def truncate_to(self, offset: int) -> None:
        self.log.truncate_to(offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.log.truncate_fully_and_start_at(offset)

    def increment_log_start_offset(self, offset: int) -> None:
        self.log.increment_log_start_offset(offset)


class Watcher(Protocol):
    """Told when a replica changes (``Replica.wake``): a leader's follower fetch session
    (FetchWatch), a follower's fetcher (broker/replication/fetcher.py)."""

    def mark(self, key: tuple[str, int], wake: bool = True) -> bool:
        """Note that partition ``key`` changed; False: no longer interested. ``wake``
        False: a change a parked follower fetch cannot answer at once (a HW move)."""
        ...


class FetchWatch:
    """A follower fetch session's watch on the replicas it reads. Whatever wakes a
    replica's parked fetches (an append, a HW or log-start move, a role or ISR change,
    removal) marks the partition changed in the session, so the session's next fetch
    reads it, and wakes the session's parked fetch (not for a HW move alone:
    ``Replica.high_watermark_updated``). Partitions nothing marked are left
    unread: per fetch the leader reads what changed and what the follower listed, not
    the whole session."""

    __slots__ = ("session", "waiter")

    def __init__(self, session: Watcher) -> None:  # a FetchSession (broker/fetch_session.py)
        self.session = session
        self.waiter: asyncio.Future[None] | None = None  # the session's parked fetch

    def mark(self, key: tuple[str, int], wake: bool = True) -> bool:
        """False: the session no longer holds ``key`` (closed, forgotten, answered with
        an error); the replica drops the watch."""
        if not self.session.mark(key):
            return False
        waiter = self.waiter
        if wake and waiter is not None and not waiter.done():
            waiter.set_result(None)
        return True


class Replica:
    """One partition on this broker."""

    __slots__ = (
        "topic",
        "partition",
        "topic_id",
        "log",
        "state",
        "driver",
        "min_insync_replicas",
        "waiters",
        "hw_waiters",
        "watchers",
        "produce_waiters",
        "_send_alter",
        "_key",
        "_ticking",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        topic_id: str,
        log: Log,
        state: PartitionState,
        min_insync_replicas: int,
        clock: Clock,
        send_alter: Callable[[Replica, ProposeAlterPartition], None],
        ticking: dict[Replica, None] | None = None,
    ) -> None:
        """``ticking``: the owner's replicas to tick (``activate``); None: the owner ticks
        every replica itself."""
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.log = log
        self.state = state
        self.min_insync_replicas = min_insync_replicas
        self.waiters: list[asyncio.Future[None]] = []  # parked (long-poll) fetches
        # Parked waits for what lies below the HW (consumers' fetches, the group
        # coordinator's commits): an append that leaves the HW where it was cannot end them.
        self.hw_waiters: list[asyncio.Future[None]] = []
        self.watchers: set[Watcher] = set()  # fetch sessions and fetchers reading it
        self._key = (topic, partition)
        self.produce_waiters: dict[Hashable, asyncio.Future[int]] = {}  # acks=all
        self._send_alter = send_alter
        self._ticking = ticking
        self.driver = PartitionDriver(state, LogStorage(log), self, clock)
        log.start_listener = self.wake

    @property
    def is_leader(self) -> bool:
        return self.state.is_leader

    def activate(self) -> None:
        """Something reached the core: tick it until ``needs_tick`` says it is idle."""
        if self._ticking is not None:
            self._ticking[self] = None

    def wake(self, sessions: bool = True, hw_waiters: bool = True) -> None:
        """Wake every fetch waiting on this partition (new data, HW or log-start move,
        role or ISR change, removal) and mark it changed in the sessions watching it.
        ``sessions`` False: mark the follower sessions without waking their parked
        fetches (a HW move: ``high_watermark_updated``); ``hw_waiters`` False: leave the
        waits for the HW (an append: ``log_appended``)."""
        self.activate()
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)
        if hw_waiters and self.hw_waiters:
            waiters, self.hw_waiters = self.hw_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        if self.watchers:
            key = self._key
            for watch in [w for w in self.watchers if not w.mark(key, sessions)]:
                self.watchers.discard(watch)

    # -- ReplicaNetwork ------------------------------------------------------------------

    def send_alter_partition(self, proposal: ProposeAlterPartition) -> None:
        self._send_alter(self, proposal)

    def complete_produce(self, produce_id: Hashable, error_code: int) -> None:
        future = self.produce_waiters.pop(produce_id, None)
        if future is not None and not future.done():
            future.set_result(error_code)

    def high_watermark_updated(self, high_watermark: int) -> None:
        # A follower reads to the log end, so a HW move gives its parked fetch nothing to
        # answer: woken, it read again and parked again (a wasted pass on every acks=all
        # produce). Its session is marked, so its next fetch carries the new HW. Consumers
        # read to the HW: their fetches (``hw_waiters``) are woken.
        self.wake(sessions=False)

    def log_appended(self) -> None:
        # Records above the HW are nothing to a consumer yet: with acks=all the HW moves
        # later, when the followers have them (and with a leader-only ISR the append's
        # own HW move, applied before this, has woken them).
        self.wake(hw_waiters=False)
