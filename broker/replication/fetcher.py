"""Follower fetchers (Kafka: ReplicaFetcherManager / ReplicaFetcherThread).

One ``SourceFetcher`` per source (leader) broker: one task, one connection, and each
Fetch covers every partition this broker follows from that leader. The fetcher is a
thin driver; every decision lives in the partition's sans-I/O core:

    req = replica.state.fetch_request()                 # fetch_offset, last_fetched_epoch,
                                                        # current_leader_epoch
    ... one Fetch for all partitions, long poll (replica.fetch.wait.max.ms, min_bytes 1) ...
    effects = replica.driver.on_fetch_response(resp, bytes)
                                          # Truncate / AppendFetched / HW, carried out
                                          # by the partition's driver (driver.py)

What the driver does itself: CRC-check every fetched batch before the core sees it (a
corrupt batch never reaches the log, and the core never advances the HW over it),
back off a partition whose answer was an error (NOT_LEADER_OR_FOLLOWER,
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION: the metadata will
move it, or the leader will catch up with it; OFFSET_OUT_OF_RANGE the core answers with a
truncation), reconnect with backoff, and look the leader's address up in the metadata
image on every connect (a restarted broker may listen on a new port). A partition that
becomes fetchable while a Fetch is parked at the leader (added, or released from its
back-off by new metadata) makes the fetcher abandon that Fetch and fetch in full at once,
at most every 100 ms; a Fetch sent while partitions are backed off waits at most until
the first may fetch again (docs/replication.md, "Fetching a new partition at once").

The remote tier: a partition answered OFFSET_MOVED_TO_TIERED_STORAGE comes back from
its core as a ``ListLeaderLocalStart`` question. Before the next Fetch, one ListOffsets
(EARLIEST_LOCAL_TIMESTAMP, -4) on the same connection asks the leader for each such
partition's local log start; the answer goes back to the core with the remote segments'
leader epochs from the metadata image, and the core starts the log there.

``FetcherManager.sync()`` runs after every metadata change: each partition this broker
follows goes to the fetcher of its leader; a partition that this broker now leads, or
whose leader is -1, goes nowhere; a fetcher left without partitions stops.

Faults (Kafka: AbstractFetcherThread's failedPartitions). An unexpected exception while
building one partition's request or processing its data (a storage invariant, a core
bug) marks that partition **failed**: logged at ERROR with the traceback, removed from
fetching, listed in ``FetcherManager.failed_partitions`` (metric
``rillet_broker_failed_partitions``); the other partitions keep replicating, and the
leader sees the failed one fall out of the ISR (under-replicated). It is fetched again
only under a new leader epoch (or re-created), as Kafka re-adds a partition to a fetcher
on a leadership change. Connection errors back off and reconnect; any other error in
the fetch loop restarts the loop with backoff, so a fetcher never ends except by
``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from rillet.broker.replica_manager import Replica, ReplicaManager, some_partitions
from rillet.broker.replication.partition_state import Role
from rillet.broker.replication.types import (
    BatchInfo,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    ListLeaderLocalStart,
    ReplicationInvariantError,
)
from rillet.client.fetch_session import SESSION_ERRORS, FetchSessionBuilder
from rillet.client.runtime.tasks import on_death_log
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, RequestAbandoned
from rillet.client.wire.errors import RilletError
from rillet.controller.metadata.image import NO_LEADER, TopicPartition
from rillet.controller.metadata.remote_log import remote_log_view

logger = logging.getLogger(__name__)

RECONNECT_BACKOFF_MIN_S = 0.05
RECONNECT_BACKOFF_MAX_S = 1.0
# Brokers follow the metadata log independently, so after a leader change a follower
# often learns of the new leader before the new leader has applied the same record and
# answers UNKNOWN_LEADER_EPOCH or NOT_LEADER_OR_FOLLOWER. That resolves within a metadata
# fetch; the full replica.fetch.backoff.ms (1 s) there held the high watermark, and so
# every acks=all produce, for a second after each failover.
# UNKNOWN_TOPIC_OR_PARTITION is the same race for a new topic: the follower learned of
# it first.
LEADER_CATCH_UP_BACKOFF_S = 0.05
LEADER_CATCHING_UP = frozenset(
    {
        errors.code_of("UNKNOWN_LEADER_EPOCH"),
        errors.code_of("NOT_LEADER_OR_FOLLOWER"),
        errors.code_of("UNKNOWN_TOPIC_OR_PARTITION"),
    }
)
# Abandoning a Fetch out (``SourceFetcher._interrupt``) costs a full fetch; it is worth
# it only when the fetch would wait longer than this, and happens at most once per
# interval (a failover's burst of metadata deltas adds partitions many times a second).
ABANDON_MIN_SAVING_S = LEADER_CATCH_UP_BACKOFF_S
ABANDON_MIN_INTERVAL_S = 0.1
REQUEST_TIMEOUT_SLACK_MS = 10_000  # beyond max_wait: a paused leader must not hang us forever
Sent = dict[TopicPartition, tuple[Replica, FetchRequest]]  # what one Fetch asked, by partition
EARLIEST_LOCAL = -4  # ListOffsets: the leader's local log start
# FetchPartition from a tuple of its fields, in C: one per partition per fetch, where the
# class call (a Python-level __new__) costs ~150 ns more.
_partition: Callable[[tuple[int, ...]], m.FetchPartition] = partial(tuple.__new__, m.FetchPartition)


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    broker_id: int
    max_wait_ms: int = 500  # replica.fetch.wait.max.ms
    partition_max_bytes: int = 1 << 20  # replica.fetch.max.bytes
    response_max_bytes: int = 10 << 20  # replica.fetch.response.max.bytes
    backoff_ms: int = 1000  # replica.fetch.backoff.ms
    listener: str = "BROKER"  # inter.broker.listener.name: where leaders are fetched from

    @classmethod
    def from_broker(cls, config: Any) -> FetcherConfig:
        return cls(
            broker_id=config.node_id,
            max_wait_ms=config["replica.fetch.wait.max.ms"],
            partition_max_bytes=config["replica.fetch.max.bytes"],
            response_max_bytes=config["replica.fetch.response.max.bytes"],
            backoff_ms=config["replica.fetch.backoff.ms"],
            listener=config.inter_broker_listener,
        )


@dataclass(frozen=True, slots=True)
class FailedPartition:
    """A partition the fetcher gave up on, and which incarnation of it."""

    replica: Replica
    leader_epoch: int
    error: str


class FetcherManager:
    """Keeps one SourceFetcher per leader this broker follows partitions from."""

    def __init__(self, replicas: ReplicaManager, config: FetcherConfig) -> None:
        self.replicas = replicas
        self.config = config
        self.fetchers: dict[int, SourceFetcher] = {}
        self.failed: dict[TopicPartition, FailedPartition] = {}
        self._stopped = False

    @property
    def failed_partitions(self) -> set[TopicPartition]:
        return set(self.failed)

    def failed_count(self) -> int:
        return len(self.failed)

    def mark_failed(
        self, tp: TopicPartition, replica: Replica, source: int, error: BaseException
    ) -> None:
        """Stop fetching ``tp`` until its leader epoch changes (Kafka:
        markPartitionFailed). Logged with the traceback: an operator must see why."""
        logger.error(
            "%s: unexpected error processing data from leader %d; partition marked "
            "failed, no longer fetched until its leadership changes",
            replica.log.name,
            source,
            exc_info=error,
        )
        self.failed[tp] = FailedPartition(replica, replica.state.leader_epoch, repr(error))
        for fetcher in self.fetchers.values():
            fetcher.remove(tp)

    def _forget_recovered_failures(self) -> None:
        """A failed partition under a new leader epoch, re-created or gone is retried."""
        for tp, failed in list(self.failed.items()):
            replica = self.replicas.replicas.get(tp)
            if replica is not failed.replica or replica.state.leader_epoch != failed.leader_epoch:
                del self.failed[tp]
                logger.info("%s-%d: no longer failed (leadership changed)", tp.topic, tp.partition)

    def sync(self) -> None:
        """Move partitions between fetchers to match the replicas' current roles."""
        if self._stopped:
            return
        self._forget_recovered_failures()
        wanted: dict[int, set[TopicPartition]] = {}
        for tp, replica in self.replicas.replicas.items():
            leader = source_of(replica)
            if leader is not None and tp not in self.failed:
                wanted.setdefault(leader, set()).add(tp)
        for source in list(self.fetchers):
            if source not in wanted:
                self.fetchers.pop(source).stop()
        for source, tps in wanted.items():
            fetcher = self.fetchers.get(source)
            if fetcher is None:
                fetcher = self.fetchers[source] = SourceFetcher(self, source)
                fetcher.start()
            fetcher.set_partitions(tps)
            fetcher.retry_now()

    def partitions_of(self, source: int) -> set[TopicPartition]:
        fetcher = self.fetchers.get(source)
        return set(fetcher.partitions) if fetcher is not None else set()

    async def stop(self) -> None:
        self._stopped = True
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        for fetcher in fetchers:
            fetcher.stop()
        for fetcher in fetchers:
            await fetcher.wait_stopped()


def source_of(replica: Replica) -> int | None:
    """The broker this replica fetches from, or None (leader, no leader, stopped)."""
    state = replica.state
    if state.role is not Role.FOLLOWER or state.leader_id in (None, NO_LEADER):
        return None
    return state.leader_id


class SourceFetcher:
    """Fetches every partition this broker follows from one leader, on one connection."""

    def __init__(self, manager: FetcherManager, source_id: int) -> None:
        self.manager = manager
        self.source_id = source_id
        self.partitions: dict[TopicPartition, float] = {}  # tp -> loop time it may fetch again
        # The next request's rows, kept from fetch to fetch: only ``_stale`` partitions
        # (answered, added, removed, backed off or back, or marked by their replica:
        # a role or epoch change, a log-start move) are rebuilt, so a fetch costs what
        # changed, not every partition followed from this leader.
        self._rows: dict[TopicPartition, m.FetchPartition] = {}
        self._entries: Sent = {}
        self._stale: set[TopicPartition] = set()
        self._held: set[TopicPartition] = set()  # backed off: left out until their time
        # Partitions of the response being handled that back off, by error code.
        self._backing_off: dict[int, list[TopicPartition]] = {}
        # Partitions whose core asked for the leader's local log start (the remote tier
        # holds their fetch offset): asked before the next Fetch.
        self._local_start_wanted: dict[TopicPartition, tuple[Replica, ListLeaderLocalStart]] = {}
        self._changed = asyncio.Event()
        self._conn: Connection | None = None
        # Bumped whenever partitions become fetchable (added, or released from a
        # back-off): a Fetch built at an older generation may lack some of them.
        self._generation = 0
        # The Fetch out: its connection, the generation it was built at, and the loop
        # time its long poll ends by. ``_interrupt`` may abandon it.
        self._in_flight: Connection | None = None
        self._in_flight_generation = 0
        self._in_flight_until = 0.0
        self._abandoned_at = float("-inf")
        self._abandon_timer: asyncio.TimerHandle | None = None
        # Consecutive catch-up refusals per partition: their back-off doubles.
        self._catch_up_tries: dict[TopicPartition, int] = {}
        # The incremental fetch session with this leader (client/fetch_session.py).
        self.session = FetchSessionBuilder()
        self._task: asyncio.Task[None] | None = None
        self.restarts = 0  # loop restarts after unexpected errors (tests, diagnosis)

    def start(self) -> None:
        name = f"fetcher-{self.manager.config.broker_id}-from-{self.source_id}"
        task = asyncio.get_running_loop().create_task(self._run(), name=name)
        # _run restarts itself and ends only when cancelled; log anything else at once.
        self._task = on_death_log(task, name)

    def set_partitions(self, tps: set[TopicPartition]) -> None:
        added = tps - self.partitions.keys()
        for tp in self.partitions.keys() - tps:
            self.remove(tp)
        for tp in added:
            self.partitions[tp] = 0.0
        self._stale.update(added)
        if added:
            logger.info(
                "fetcher from %d: now %d partition(s), added %s",
                self.source_id,
                len(self.partitions),
                some_partitions(added),
            )
            self._changed.set()
            self._interrupt()

    def _interrupt(self) -> None:
        """Partitions became fetchable that the Fetch out may not carry: stop waiting
        for its answer, which may be parked at the leader for up to
        replica.fetch.wait.max.ms, and fetch them now (``_fetch_loop``). Nothing at the
        leader would end that long poll early: the partitions are not in the session it
        watches. A new topic's first acks=all produce waited for it."""
        self._generation += 1
        self._maybe_abandon()

    def _maybe_abandon(self) -> None:
        conn = self._in_flight
        if conn is None or self._in_flight_generation == self._generation:
            return  # nothing out, or it was built with everything fetchable
        now = asyncio.get_running_loop().time()
        if self._in_flight_until - now <= ABANDON_MIN_SAVING_S:
            return  # its poll ends soon anyway (a back-off already shortened it)
        wait = self._abandoned_at + ABANDON_MIN_INTERVAL_S - now
        if wait > 0:
            if self._abandon_timer is None:
                self._abandon_timer = asyncio.get_running_loop().call_later(
                    wait, self._abandon_later
                )
            return
        self._in_flight = None
        self._abandoned_at = now
        conn.abandon()

    def _abandon_later(self) -> None:
        self._abandon_timer = None
        self._maybe_abandon()

    def remove(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp`` (the next request forgets it)."""
        self._catch_up_tries.pop(tp, None)
        if self.partitions.pop(tp, None) is not None:
            self._stale.add(tp)

    def mark(self, key: tuple[str, int], wake: bool = True) -> bool:
        """A replica this fetcher reads changed (Replica.wake): rebuild its row before the
        next request. False: no longer fetched here (the replica drops the watch)."""
        tp = TopicPartition(*key)
        if tp not in self.partitions:
            return False
        self._stale.add(tp)
        self._changed.set()
        return True

    def stop(self) -> None:
        if self._abandon_timer is not None:
            self._abandon_timer.cancel()
            self._abandon_timer = None
        if self._task is not None:
            self._task.cancel()
        self._close()
        replicas = self.manager.replicas.replicas
        for tp in self.partitions:  # no replica keeps a stopped fetcher alive
            replica = replicas.get(tp)
            if replica is not None:
                replica.watchers.discard(self)
        self.partitions.clear()

    async def wait_stopped(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        """The fetch loop, restarted with backoff after an unexpected error (a malformed
        response, a bug): never silently ended."""
        backoff_s = RECONNECT_BACKOFF_MIN_S
        while True:
            try:
                await self._fetch_loop()
            except Exception:
                self.restarts += 1
                logger.exception(
                    "fetcher from %d: unexpected error; restarting in %.2fs",
                    self.source_id,
                    backoff_s,
                )
            self.session.reset()  # the next fetch is full and opens a new session
            self._stale.update(self.partitions)  # and every row is rebuilt
            self._close()
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, RECONNECT_BACKOFF_MAX_S)

    async def _fetch_loop(self) -> None:
        backoff_s = RECONNECT_BACKOFF_MIN_S
        while True:
            generation = self._generation
            request, sent = self._build_request()
            if request is None:
                await self._wait_for_work()
                continue
            try:
                conn = await self._connect()
                if self._generation != generation:
                    # Partitions became fetchable while we connected. The request was
                    # built but not sent, and building it took its rows' changes out
                    # of the incremental state: the next fetch is full.
                    self.session.reset()
                    continue
                timeout_ms = request.max_wait_ms + REQUEST_TIMEOUT_SLACK_MS
                self._in_flight = conn
                self._in_flight_generation = generation
                now = asyncio.get_running_loop().time()
                self._in_flight_until = now + request.max_wait_ms / 1000
                try:
                    response, payload = await conn.call(
                        request, timeout_ms=timeout_ms, raise_errors=False
                    )
                finally:
                    self._in_flight = None
                if response.error_code and response.error_code not in SESSION_ERRORS:
                    raise errors.error_for(response.error_code, "fetch")
            except RequestAbandoned:
                # Its answer, dropped, may have changed the session at the leader: the
                # next fetch is full, on the same connection. It closes the old session,
                # and the leader then ends that session's parked fetch (ReplicaManager.
                # unwatch), whose answer would otherwise hold up the new one's.
                self.session.reset()
                continue
            except (RilletError, OSError) as e:
                logger.info("fetcher from %d: %s; retrying in %.2fs", self.source_id, e, backoff_s)
                # The request may or may not have been answered: start a new session.
                self.session.reset()
                self._close()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, RECONNECT_BACKOFF_MAX_S)
                continue
            backoff_s = RECONNECT_BACKOFF_MIN_S
            if not self.session.on_response(response):
                # The leader lost our session (evicted, restarted): a full fetch at once,
                # on the same connection.
                logger.info(
                    "fetcher from %d: fetch session answered %s; fetching in full",
                    self.source_id,
                    errors.error_name(response.error_code),
                )
                continue
            self._handle_response(response, payload, sent)
            if self._local_start_wanted:
                await self._list_local_starts(conn)

    async def _list_local_starts(self, conn: Connection) -> None:
        """Ask the leader for the local log start of every partition whose core wants it
        (one ListOffsets -4), and hand each answer to the partition's core. A failed ask
        backs the partition off; its next fetch is answered the same way and asks again."""
        wanted, self._local_start_wanted = self._local_start_wanted, {}
        by_topic: dict[str, list[m.ListOffsetsPartition]] = {}
        for tp, (_, question) in wanted.items():
            row = m.ListOffsetsPartition(tp.partition, question.leader_epoch, EARLIEST_LOCAL)
            by_topic.setdefault(tp.topic, []).append(row)
        request = m.ListOffsetsRequest(
            replica_id=self.manager.config.broker_id,
            topics=[m.ListOffsetsTopic(t, rows) for t, rows in by_topic.items()],
        )
        try:
            response, _ = await conn.call(
                request, timeout_ms=self.manager.config.max_wait_ms + REQUEST_TIMEOUT_SLACK_MS
            )
        except (RilletError, OSError) as e:
            logger.info("fetcher from %d: asking local log starts failed: %s", self.source_id, e)
            for tp in wanted:
                self._back_off(tp)
            self._close()
            return
        answered = {
            TopicPartition(t.topic, r.partition): r for t in response.topics for r in t.partitions
        }
        image = self.manager.replicas.image
        for tp, (replica, question) in wanted.items():
            r = answered.get(tp)
            if self.manager.replicas.replicas.get(tp) is not replica or tp not in self.partitions:
                continue
            self._stale.add(tp)
            if r is None or r.error_code != errors.NONE:
                self._back_off(tp)
                continue
            epochs = remote_log_view(image, replica.topic_id, tp.partition).leader_epochs()
            try:
                replica.driver.on_leader_local_start(question, r.offset, epochs)
            except (ReplicationInvariantError, RilletError, OSError) as e:
                logger.error(
                    "%s: starting at the leader's local log start failed: %r", replica.log.name, e
                )
                self._back_off(tp)
                continue
            logger.info(
                "%s: offset %d is only in the remote tier; log restarted at the leader's "
                "local log start %d",
                replica.log.name,
                question.fetch_offset,
                r.offset,
            )

    async def _wait_for_work(self) -> None:
        """Until partitions are added, or the first backed-off partition may fetch."""
        self._changed.clear()
        loop = asyncio.get_running_loop()
        timeout = None
        if self.partitions:
            timeout = max(0.0, min(self.partitions.values()) - loop.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def _connect(self) -> Connection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._close()
        config = self.manager.config
        address = self.manager.replicas.broker_endpoint(self.source_id, config.listener)
        if address is None:
            raise errors.NetworkError(f"no {config.listener} endpoint known for {self.source_id}")
        self._conn = await Connection.open(*address, client_id=f"replica-{config.broker_id}")
        return self._conn

    def _build_request(self) -> tuple[m.FetchRequest | None, Sent]:
        """The next Fetch and what it covers; None when no partition may fetch now."""
        config = self.manager.config
        now = asyncio.get_running_loop().time()
        for tp in [tp for tp in self._held if self.partitions.get(tp, 0.0) <= now]:
            self._held.discard(tp)
            self._stale.add(tp)
        changed, self._stale = self._stale, set()
        for tp in changed:
            self._refresh(tp, now, config)
        if not self._entries:
            return None, self._entries
        # Only partitions whose row changed go out (an incremental fetch); the leader
        # reads those and the ones that changed on its side, and its session's clock
        # records our position on the idle rest.
        session = self.session.build_changes(self._rows, changed)
        max_wait_ms = config.max_wait_ms
        if self._held:
            # A backed-off partition rejoins when its time comes, not when the long poll
            # that left it out ends.
            times = [t for t in map(self.partitions.get, self._held) if t is not None]
            if times:
                until_ms = math.ceil((min(times) - now) * 1000)
                max_wait_ms = max(0, min(max_wait_ms, until_ms))
        request = m.FetchRequest(
            replica_id=config.broker_id,
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_bytes=config.response_max_bytes,
            topics=session.topics,
            session_id=session.session_id,
            session_epoch=session.session_epoch,
            forgotten=session.forgotten,
        )
        return request, self._entries

    def _refresh(self, tp: TopicPartition, now: float, config: FetcherConfig) -> None:
        """Rebuild one partition's row, or leave it out of the next request."""
        self._entries.pop(tp, None)
        self._rows.pop(tp, None)
        not_before = self.partitions.get(tp)
        replica = self.manager.replicas.replicas.get(tp)
        if not_before is None or replica is None or source_of(replica) != self.source_id:
            return
        replica.watchers.add(self)
        if not_before > now:
            self._held.add(tp)
            return
        try:
            req = replica.state.fetch_request()
        except Exception as e:  # this partition's state is broken, not the others'
            self.manager.mark_failed(tp, replica, self.source_id, e)
            return
        if req is None:
            return
        self._entries[tp] = (replica, req)
        self._rows[tp] = _partition(
            (
                tp.partition,
                req.fetch_offset,
                req.last_fetched_epoch,
                req.current_leader_epoch,
                replica.log.log_start_offset,
                config.partition_max_bytes,
                replica.topic_id,
            )
        )

    def _handle_response(self, response: m.FetchResponse, payload: memoryview, sent: Sent) -> None:
        """Feed every partition's answer to its core and apply the effects, with no
        await in between (the log cannot change under a decision)."""
        position = 0
        self._backing_off = {}
        for t in response.topics:
            for result in t.partitions:
                nbytes = result.nbytes
                data = payload[position : position + nbytes]
                position += nbytes
                tp = TopicPartition(t.topic, result.partition)
                self._stale.add(tp)  # its log, epoch or back-off may move: a new row
                entry = sent.get(tp)
                if entry is not None:
                    self._handle_partition(tp, entry, result, data)
        # One line per error per response: a leader that has not applied a new topic yet
        # refuses all its thousands of partitions, and a line each held the loop for
        # 300-700 ms per response (each is still logged at DEBUG).
        for code, tps in self._backing_off.items():
            logger.info(
                "fetch from %d answered %s for %s; backing off",
                self.source_id,
                errors.error_name(code),
                some_partitions(tps),
            )
        self._backing_off = {}

    def _handle_partition(
        self,
        tp: TopicPartition,
        entry: tuple[Replica, FetchRequest],
        result: m.FetchPartitionResult,
        data: memoryview,
    ) -> None:
        replica, req = entry
        if self.manager.replicas.replicas.get(tp) is not replica or tp not in self.partitions:
            return  # removed, re-created or marked failed while the fetch was out
        try:
            self._process_partition(tp, replica, req, result, data)
        except Exception as e:
            # Unexpected (a storage invariant, a core bug): this partition's log or state
            # may be half-updated, so stop fetching it; the others carry on.
            self.manager.mark_failed(tp, replica, self.source_id, e)

    def _process_partition(
        self,
        tp: TopicPartition,
        replica: Replica,
        req: FetchRequest,
        result: m.FetchPartitionResult,
        data: memoryview,
    ) -> None:
        code = result.error_code
        try:
            response = fetch_response(req, result, data)
        except RilletError as e:
            logger.warning(
                "%s: corrupt fetched data from %d, retrying later: %s",
                replica.log.name,
                self.source_id,
                e,
            )
            self._back_off(tp)
            return
        try:
            effects = replica.driver.on_fetch_response(response, data)
        except (ReplicationInvariantError, RilletError, OSError) as e:
            # Known failure kinds: back off and let a fresh fetch (or new metadata) decide
            # again from what the log now holds. Anything else marks the partition failed
            # (_handle_partition).
            logger.error(
                "%s: applying fetch from %d failed: %r", replica.log.name, self.source_id, e
            )
            self._back_off(tp)
            return
        for effect in effects:
            if isinstance(effect, ListLeaderLocalStart):
                self._local_start_wanted[tp] = (replica, effect)
        if code == errors.NONE:
            if self._catch_up_tries:
                self._catch_up_tries.pop(tp, None)
        elif not effects:
            logger.debug(
                "%s: fetch from %d answered %s; backing off",
                replica.log.name,
                self.source_id,
                errors.error_name(code),
            )
            self._backing_off.setdefault(code, []).append(tp)
            self._back_off(tp, self._catch_up_delay(tp) if code in LEADER_CATCHING_UP else None)

    def _catch_up_delay(self, tp: TopicPartition) -> float:
        """50 ms, doubling with each refusal in a row, up to replica.fetch.backoff.ms: a
        leader catching up on metadata answers within a few tries; a refusal that
        lasts (a stuck leader) must not cost a fetch and a log line every 50 ms."""
        tries = self._catch_up_tries.get(tp, 0)
        self._catch_up_tries[tp] = tries + 1
        cap_s = max(self.manager.config.backoff_ms / 1000, LEADER_CATCH_UP_BACKOFF_S)
        return min(LEADER_CATCH_UP_BACKOFF_S * (1 << min(tries, 16)), cap_s)

    def _back_off(self, tp: TopicPartition, delay_s: float | None = None) -> None:
        if tp in self.partitions:
            if delay_s is None:
                delay_s = self.manager.config.backoff_ms / 1000
            self.partitions[tp] = asyncio.get_running_loop().time() + delay_s
            self._stale.add(tp)
            self._held.add(tp)

    def retry_now(self) -> None:
        """New metadata arrived: backed-off partitions may fetch again at once (a fenced
        epoch or a moved leader is what they were waiting for)."""
        released = False
        for tp in self._held:
            if tp in self.partitions:
                self.partitions[tp] = 0.0
                self._stale.add(tp)
                self._changed.set()
                released = True
        self._held.clear()
        if released:
            self._interrupt()


def fetch_response(
    req: FetchRequest, result: m.FetchPartitionResult, data: memoryview
) -> FetchResponse:
    """The core's view of one partition's Fetch answer: what ``req`` asked, what the
    leader said, and each fetched batch's offsets and epoch. Every batch's length and
    CRC-32C are checked first: corrupt data raises RilletError and never reaches the
    core. (The simulator hands fetched bytes to the driver through this too.)"""
    code, diverging = result.error_code, result.diverging_epoch
    return FetchResponse(
        fetch_offset=req.fetch_offset,
        leader_epoch=req.current_leader_epoch,
        error_code=code,
        high_watermark=result.high_watermark,
        log_start_offset=result.log_start_offset,
        diverging_epoch=EpochEndOffset(*diverging) if diverging else None,
        batches=_checked_batches(data) if code == errors.NONE else (),
    )


def _checked_batches(data: memoryview) -> tuple[BatchInfo, ...]:
    """Each fetched batch's offsets and epoch, after checking length and CRC-32C."""
    return tuple(
        BatchInfo(h.base_offset, h.last_offset, h.partition_leader_epoch)
        for _, h in records.iter_batches(data, validate=True)
    )
