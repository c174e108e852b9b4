"""Cluster metadata for clients: bootstrap, an immutable snapshot, refresh, connections.

``ClusterMetadata`` is an immutable snapshot of one Metadata response (brokers, topics ->
partitions -> leader and epoch). ``MetadataClient`` owns the current snapshot and one
pipelined connection per broker (requests are multiplexed on it, so a pool of one is
enough: docs/design.md, "Clients"), and refreshes the snapshot:

- on demand (``await refresh()``),
- when a caller saw a retriable error (``request_update()``, then the next refresh),
- when the snapshot is older than ``metadata_max_age_ms``.

Concurrent refreshes are coalesced into one request. Refreshes that reach no broker are
spaced by ``retry_backoff_ms`` growing up to ``retry_backoff_max_ms``; refreshes that find
a partition without a leader (an election in progress) are spaced by the plain
``retry_backoff_ms``, since the answer changes within a controller tick or two.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, R, RequestMessage, parse_address
from rillet.client.wire.errors import (
    NetworkError,
    RequestTimedOutError,
    RilletError,
    UnknownTopicOrPartitionError,
    error_for,
)

log = logging.getLogger(__name__)

NO_LEADER = -1
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def split_bootstrap(bootstrap: str | Iterable[str]) -> list[str]:
    """``"h1:9092,h2:9092"`` or a list of ``host:port`` to a checked list."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses = [a.strip() for a in items if a.strip()]
    if not addresses:
        raise ValueError("bootstrap needs at least one host:port")
    for a in addresses:
        parse_address(a)  # ValueError now rather than at connect time
    return addresses


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error_code: int = 0

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """One Metadata response, immutable. ``topics`` maps name -> partitions by index."""

    cluster_id: str | None = None
    controller_id: int = -1
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, tuple[PartitionInfo, ...]] = field(default_factory=dict)
    topic_errors: dict[str, int] = field(default_factory=dict)
    created_at: float = 0.0  # time.monotonic() of the response
    topic_ids: dict[str, str] = field(default_factory=dict)
    """name -> topic id (KIP-516): consumer-group heartbeats name topics by id."""

    @classmethod
    def from_response(cls, response: m.MetadataResponse, now: float) -> ClusterMetadata:
        brokers = {
            b.node_id: BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers
        }
        topics: dict[str, tuple[PartitionInfo, ...]] = {}
        errors: dict[str, int] = {}
        ids: dict[str, str] = {}
        for t in response.topics:
            if t.error_code:
                errors[t.name] = t.error_code
                continue
            if t.topic_id:
                ids[t.name] = t.topic_id
            infos = sorted(
                (
                    PartitionInfo(
                        t.name,
                        p.partition,
                        p.leader_id,
                        p.leader_epoch,
                        tuple(p.replicas),
                        tuple(p.isr),
                        tuple(p.offline_replicas),
                        p.error_code,
                    )
                    for p in t.partitions
                ),
                key=lambda i: i.partition,
            )
            topics[t.name] = tuple(infos)
        return cls(response.cluster_id, response.controller_id, brokers, topics, errors, now, ids)

    def partitions(self, topic: str) -> tuple[PartitionInfo, ...] | None:
        return self.topics.get(topic)

    def topic_name(self, topic_id: str) -> str | None:
        """The name of the topic with this id, None when this snapshot has none."""
        for name, tid in self.topic_ids.items():
            if tid == topic_id:
                return name
        return None

    def leader_for(self, topic: str, partition: int) -> int:
        """The leader's node id, or NO_LEADER when unknown (no topic, election running)."""
        parts = self.topics.get(topic)
        if parts is None or partition >= len(parts):
            return NO_LEADER
        leader = parts[partition].leader
        return leader if leader in self.brokers else NO_LEADER

    def missing_leaders(self, topics: Iterable[str]) -> bool:
        for t in topics:
            parts = self.topics.get(t)
            if not parts or any(p.leader not in self.brokers for p in parts):
                return True  # no partitions yet counts too: the refresh backs off
        return False


class MetadataClient:
    """Bootstrap, the metadata snapshot, and one connection per broker."""

    def __init__(
        self,
        bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
        *,
        client_id: str = "rillet",
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        metadata_max_age_ms: int = 300_000,
    ) -> None:
        self.bootstrap = split_bootstrap(bootstrap)
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.snapshot = ClusterMetadata()
        self.interests: set[str] = set()  # topics every refresh asks for
        self.all_topics = False  # ask for every topic (admin, subscribe-all)
        self._conns: dict[int | str, Connection] = {}  # node id, or bootstrap address
        self._connecting: dict[int | str, asyncio.Future[Connection]] = {}
        self._refreshing: asyncio.Future[ClusterMetadata] | None = None
        self._stale = True
        self._failures = 0  # consecutive refreshes that reached no broker, for backoff
        self._awaiting_leaders = False  # the last answer lacked a leader or a topic
        self._last_refresh = 0.0
        self._closed = False
        self.listeners: list[Any] = []  # callables(snapshot) run after each refresh

    # --- snapshot ------------------------------------------------------------------

    def request_update(self) -> None:
        """A caller saw a retriable error: the next ``refresh`` asks the cluster again."""
        self._stale = True

    def add_topics(self, topics: Iterable[str]) -> bool:
        """Track more topics; True when one of them was new."""
        before = len(self.interests)
        self.interests.update(topics)
        if len(self.interests) != before:
            self._stale = True
            return True
        return False

    async def refresh(self, *, force: bool = False) -> ClusterMetadata:
        """A fresh snapshot (coalesced with a refresh in flight; spaced by backoff)."""
        if self._refreshing is not None:
            return await asyncio.shield(self._refreshing)
        age_ms = (time.monotonic() - self.snapshot.created_at) * 1000
        if not (force or self._stale or age_ms > self.metadata_max_age_ms):
            return self.snapshot
        loop = asyncio.get_running_loop()
        self._refreshing = fut = loop.create_future()
        try:
            delay = self._backoff_s() - (time.monotonic() - self._last_refresh)
            if delay > 0:
                await asyncio.sleep(delay)
            snapshot = await self._fetch()
        except BaseException as e:
            self._failures += 1
            fut.set_exception(e)
            fut.exception()  # retrieved: the raise below reports it
            raise
        else:
            fut.set_result(snapshot)
            return snapshot
        finally:
            self._last_refresh = time.monotonic()
            self._refreshing = None

    def _backoff_s(self) -> float:
        if self._failures == 0:
            return self.retry_backoff_ms / 1000 if self._awaiting_leaders else 0.0
        ms = min(self.retry_backoff_ms * 2 ** (self._failures - 1), self.retry_backoff_max_ms)
        return ms * random.uniform(0.8, 1.2) / 1000

    async def _fetch(self) -> ClusterMetadata:
        topics = None if self.all_topics else sorted(self.interests)
        self._stale = False
        response = await self.request_any(m.MetadataRequest(topics))
        snapshot = ClusterMetadata.from_response(response, time.monotonic())
        self._apply(snapshot)
        wanted = snapshot.topics.keys() if topics is None else topics
        self._failures = 0
        # An election or a new topic: the answer changes within a controller tick or two,
        # so look again after the plain retry backoff. Escalating here (as for an
        # unreachable cluster) only delays noticing the new leader after a failover.
        self._awaiting_leaders = bool(snapshot.missing_leaders(wanted) or snapshot.topic_errors)
        self._stale = self._stale or self._awaiting_leaders
        return snapshot

    def _apply(self, snapshot: ClusterMetadata) -> None:
        old = self.snapshot
        self.snapshot = snapshot
        for node_id, conn in list(self._conns.items()):
            if isinstance(node_id, int):
                moved = old.brokers.get(node_id) != snapshot.brokers.get(node_id)
                if moved and node_id in old.brokers:
                    self._conns.pop(node_id, None)
                    conn.close()
        for listener in self.listeners:
            listener(snapshot)

    async def wait_for_topics(
        self, topics: Iterable[str], timeout_ms: int, *, leaders: bool = True
    ) -> dict[str, tuple[PartitionInfo, ...]]:
        """Partitions of each topic once every one has a leader (with ``leaders=False``:
        once each topic is known, leaders or not); UnknownTopicOrPartition (or the last
        error) when that does not happen within ``timeout_ms``."""
        topics = list(topics)
        self.add_topics(topics)
        deadline = time.monotonic() + timeout_ms / 1000
        last: Exception | None = None
        while True:
            try:
                snap = await self.refresh()
                known = all(snap.topics.get(t) for t in topics)  # with partitions
                if known and not (leaders and snap.missing_leaders(topics)):
                    return {t: snap.topics[t] for t in topics}
            except RilletError as e:
                if not e.retriable:
                    raise
                last = e
            if time.monotonic() >= deadline:
                break
            self.request_update()
        snap = self.snapshot
        for t in topics:
            if t in snap.topic_errors:
                raise error_for(snap.topic_errors[t], f"topic {t!r}: cannot get metadata")
            if t not in snap.topics:
                raise UnknownTopicOrPartitionError(f"topic {t!r} does not exist")
            if not snap.topics[t]:
                raise UnknownTopicOrPartitionError(f"topic {t!r} has no partitions")
        if last is not None:
            raise last
        raise UnknownTopicOrPartitionError(f"no leader for some partition of {topics}")

    # --- connections ---------------------------------------------------------------

    async def connection(self, node_id: int) -> Connection:
        """The connection to broker ``node_id`` (opened on first use, reopened if closed)."""
        conn = self._conns.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        broker = self.snapshot.brokers.get(node_id)
        if broker is None:
            self.request_update()
            raise NetworkError(f"broker {node_id} is not in the cluster metadata")
        return await self._open(node_id, broker.host, broker.port)

    async def connect_to(self, node_id: int, host: str, port: int) -> Connection:
        """The connection to broker ``node_id`` at an address learnt elsewhere (a
        FindCoordinator answer), shared with ``connection(node_id)``."""
        conn = self._conns.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        return await self._open(node_id, host, port)

    async def _open(self, key: int | str, host: str, port: int) -> Connection:
        pending = self._connecting.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        if self._closed:
            raise NetworkError("client is closed")
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[key] = fut
        try:
            conn = await Connection.open(
                host,
                port,
                client_id=self.client_id,
                connect_timeout_ms=self.connect_timeout_ms,
                request_timeout_ms=self.request_timeout_ms,
            )
        except BaseException as e:
            if isinstance(key, int):
                self.request_update()  # the broker may be gone: learn where leaders moved
            fut.set_exception(e)
            fut.exception()
            raise
        finally:
            self._connecting.pop(key, None)
        if self._closed:
            conn.close()
            raise NetworkError("client is closed")
        self._conns[key] = conn
        fut.set_result(conn)
        return conn

    async def any_connection(self, avoid: Collection[int | str] = ()) -> Connection:
        """A connection to some broker: an open one first, then known brokers in random
        order, then the bootstrap list; a broker keyed in ``avoid`` (one that just
        failed a request) only when no other is reachable."""
        for key, conn in self._conns.items():
            if not conn.closed and key not in avoid:
                return conn
        failures: list[str] = []
        brokers = list(self.snapshot.brokers.values())
        random.shuffle(brokers)
        targets: list[tuple[int | str, str, int]] = [(b.node_id, b.host, b.port) for b in brokers]
        targets += [(a, *parse_address(a)) for a in self.bootstrap]
        targets.sort(key=lambda t: t[0] in avoid)  # stable: the order above otherwise
        for key, host, port in targets:
            try:
                return await self._open(key, host, port)
            except NetworkError as e:
                failures.append(str(e))
        raise NetworkError("no broker reachable: " + "; ".join(failures))

    async def request_any(self, message: RequestMessage[R], *, timeout_ms: int | None = None) -> R:
        """Send a typed request to any broker; one retry on another broker if the
        connection breaks or the request times out (a starting broker holds requests
        until its metadata caught up; Kafka's client also drops a connection on which a
        request timed out). Returns the typed response."""
        failed: set[int | str] = set()
        for attempt in range(2):
            conn = await self.any_connection(avoid=failed)
            try:
                response, _ = await conn.call(message, timeout_ms=timeout_ms)
                return response
            except (NetworkError, RequestTimedOutError):
                conn.close()
                failed.update(k for k, c in self._conns.items() if c is conn)
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self._closed = True
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()


__all__ = [
    "BrokerInfo",
    "ClusterMetadata",
    "DEFAULT_BOOTSTRAP",
    "MetadataClient",
    "NO_LEADER",
    "PartitionInfo",
    "split_bootstrap",
]
