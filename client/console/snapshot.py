"""The console's cached view of the cluster, taken in the background every few seconds.

List pages and the live stream read the latest ``ClusterSnapshot`` instead of asking the
cluster per request: one refresh costs a handful of Admin requests whatever the number
of browsers open, and a page of a 10,000-partition cluster is a slice of lists already
built. A refresh that fails keeps the previous snapshot (marked stale by its age) and is
retried at the next tick, so a broker going away never blanks the page that shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field, replace

from rillet.client.admin import (
    Admin,
    ClusterDescription,
    GroupListing,
    QuorumDescription,
    TopicDescription,
)
from rillet.client.console.metrics import BytesOutMeter
from rillet.client.console.rows import (
    BrokerRow,
    LogStats,
    TopicRow,
    broker_rows,
    log_stats,
    topic_rows,
)
from rillet.client.health import ClusterHealth, assess, describe_min_isr
from rillet.client.metadata import BrokerInfo
from rillet.client.wire.errors import RilletError

log = logging.getLogger(__name__)

# A broker's port that does not accept a connection within this is "unreachable".
PROBE_TIMEOUT_S = 1.0
# Without an active controller DescribeQuorum waits; the rest of the view must not.
QUORUM_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    taken_at: float  # time.time()
    cluster: ClusterDescription
    topics: tuple[TopicDescription, ...]  # sorted by name
    groups: tuple[GroupListing, ...] = ()
    # Counted once per snapshot, over every partition.
    partitions: int = 0
    under_replicated: int = 0
    offline: int = 0
    under_min_isr: int = 0
    # The error of the last refresh if it failed (this snapshot is then an older one).
    error: str = ""
    topics_by_name: dict[str, TopicDescription] = field(default_factory=dict)
    # Built once per snapshot for the overview and topics pages (rows.py).
    brokers: tuple[BrokerRow, ...] = ()
    topic_rows: tuple[TopicRow, ...] = ()
    # The latest log sample (sizes, rates; refreshed on a slower cadence), if any yet.
    logs: LogStats | None = None
    # Why the group listing is older than this snapshot ("" when it is current).
    groups_error: str = ""
    # The assessment (client/health.py) the counts come from; its quorum is None when no
    # active controller answered DescribeQuorum.
    health: ClusterHealth | None = None

    @property
    def quorum(self) -> QuorumDescription | None:
        return self.health.quorum if self.health is not None else None

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.taken_at)

    @property
    def bad_brokers(self) -> int:
        return sum(b.bad for b in self.brokers)


@dataclass(frozen=True, slots=True)
class HealthSample:
    """One point of the overview chart."""

    at: float
    under_replicated: int
    offline: int
    under_min_isr: int = 0


async def describe_quorum(admin: Admin) -> QuorumDescription | None:
    try:
        # No retry: without an active controller the answer is "none" this refresh.
        return await asyncio.wait_for(admin.describe_quorum(retry=False), QUORUM_TIMEOUT_S)
    except (TimeoutError, RilletError, OSError):
        return None


async def probe(brokers: Iterable[BrokerInfo], timeout_s: float = PROBE_TIMEOUT_S) -> set[int]:
    """The brokers whose port does not accept a TCP connection within ``timeout_s``: a
    killed broker refuses at once, long before the controller fences it."""

    async def down(b: BrokerInfo) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(b.host, b.port), timeout_s)
        except (OSError, TimeoutError):
            return True
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return False

    listed = list(brokers)
    answers = await asyncio.gather(*(down(b) for b in listed))
    return {b.node_id for b, d in zip(listed, answers, strict=True) if d}


async def take_snapshot(
    admin: Admin,
    previous: ClusterSnapshot | None = None,
    *,
    seen: Mapping[int, BrokerInfo] | None = None,
    logs: LogStats | None = None,
    bytes_out: Mapping[int, float] | None = None,
    min_isr: Mapping[str, int] | None = None,
) -> ClusterSnapshot:
    """One fast refresh: DescribeCluster, Metadata, ListGroups and DescribeQuorum at
    once, then a connection probe of each broker. ``seen``: brokers listed before (one
    missing now shows as such); ``min_isr``: each topic's min.insync.replicas as last
    read (1 for a topic not read yet). A failing ListGroups (a broker down answers
    nothing) keeps the previous listing rather than failing the whole view."""
    cluster, topics, groups, quorum = await asyncio.gather(
        admin.describe_cluster(),
        admin.describe_topics(),
        admin.list_groups(),
        describe_quorum(admin),
        return_exceptions=True,
    )
    for answer in (cluster, topics):
        if isinstance(answer, BaseException):
            raise answer
    assert isinstance(cluster, ClusterDescription) and isinstance(topics, list)
    groups_error = ""
    if isinstance(groups, BaseException):
        if not isinstance(groups, Exception):
            raise groups
        groups_error = str(groups) or type(groups).__name__
        listed: tuple[GroupListing, ...] = previous.groups if previous is not None else ()
    else:
        listed = tuple(sorted(groups, key=lambda g: g.group_id))
    ordered = tuple(sorted(topics, key=lambda t: t.name))
    health = assess(
        cluster,
        quorum if isinstance(quorum, QuorumDescription) else None,
        ordered,
        min_isr or {},
    )
    unreachable = await probe(cluster.brokers)
    now_ids = {b.node_id for b in cluster.brokers}
    missing = [b for i, b in (seen or {}).items() if i not in now_ids]
    return ClusterSnapshot(
        taken_at=time.time(),
        cluster=cluster,
        topics=ordered,
        groups=listed,
        partitions=health.partitions,
        under_replicated=health.under_replicated,
        offline=health.offline,
        under_min_isr=health.under_min_isr,
        topics_by_name={t.name: t for t in ordered},
        brokers=broker_rows(
            health,
            unreachable=unreachable,
            missing=missing,
            logs=logs,
            bytes_out=bytes_out,
        ),
        topic_rows=topic_rows(ordered, logs),
        logs=logs,
        groups_error=groups_error,
        health=health,
    )


class SnapshotCache:
    """Refreshes a ``ClusterSnapshot`` every ``refresh_s``; keeps a bounded history of
    health samples for the charts; wakes live-stream subscribers after each refresh.

    The expensive part, a DescribeLogDirs to every leader for sizes and offsets, runs on
    its own slower loop (every ``logs_every_s``) so a slow or hung broker never delays
    the health view; each fast refresh uses the latest log sample there is."""

    def __init__(
        self,
        admin: Admin,
        refresh_s: float = 2.0,
        history_s: float = 600.0,
        *,
        logs_every_s: float | None = None,
        metrics: Mapping[int, str] | None = None,
    ) -> None:
        self.admin = admin
        self.refresh_s = refresh_s
        self.logs_every_s = logs_every_s if logs_every_s is not None else max(5.0, refresh_s)
        self.latest: ClusterSnapshot | None = None
        self.logs: LogStats | None = None
        self.history: deque[HealthSample] = deque(maxlen=max(1, int(history_s / refresh_s)))
        # How long the last refreshes took, for the footer and the benchmark.
        self.refresh_took_s = 0.0
        self.logs_took_s = 0.0
        # Why the last refresh failed ("" when it did not), shown while there is no
        # snapshot at all (the cluster has not answered since the console started).
        self.error = ""
        self._seen: dict[int, BrokerInfo] = {}
        self._min_isr: dict[str, int] = {}
        self._bytes_out = BytesOutMeter(metrics or {})
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.refresh()
        self._tasks = [
            asyncio.create_task(self._loop(), name="console-snapshots"),
            asyncio.create_task(self._logs_loop(), name="console-logs"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def refresh(self) -> ClusterSnapshot | None:
        t0 = time.monotonic()
        try:
            snap = await take_snapshot(
                self.admin,
                self.latest,
                seen=self._seen,
                logs=self.logs,
                bytes_out=self._bytes_out.rates,
                min_isr=self._min_isr,
            )
        except Exception as e:  # noqa: BLE001 - any failure keeps the last good view
            log.warning("console snapshot failed: %s", e)
            self.error = str(e) or type(e).__name__
            if self.latest is None:
                return None
            snap = replace(self.latest, error=self.error)
        else:
            self.error = ""
            self._seen.update((b.node_id, b) for b in snap.cluster.brokers)
            self.history.append(
                HealthSample(snap.taken_at, snap.under_replicated, snap.offline, snap.under_min_isr)
            )
        self.refresh_took_s = time.monotonic() - t0
        self.latest = snap
        # Wake every waiting subscriber, then arm a fresh event for the next refresh.
        self._changed.set()
        self._changed = asyncio.Event()
        return snap

    async def refresh_logs(self) -> LogStats | None:
        """One DescribeLogDirs pass over the latest snapshot's partitions, each topic's
        min.insync.replicas (DescribeConfigs, batched), and a scrape of the brokers'
        metrics endpoints when given."""
        snap = self.latest
        if snap is None:
            return None
        t0 = time.monotonic()
        try:
            logs, min_isr, _ = await asyncio.gather(
                self.admin.describe_logs(snap.topics),
                describe_min_isr(self.admin, [t.name for t in snap.topics]),
                self._bytes_out.scrape(),
            )
        except Exception as e:  # noqa: BLE001 - sizes stay as last seen
            log.warning("console log sizes failed: %s", e)
            return self.logs
        self._min_isr = min_isr
        self.logs = log_stats(snap.topics, logs, time.time(), self.logs)
        self.logs_took_s = time.monotonic() - t0
        return self.logs

    async def changes(self) -> AsyncIterator[ClusterSnapshot]:
        """Yield the latest snapshot now and after every refresh (for the live stream)."""
        if self.latest is not None:
            yield self.latest
        while True:
            await self._changed.wait()
            if self.latest is not None:
                yield self.latest

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def _logs_loop(self) -> None:
        while True:
            await self.refresh_logs()
            await asyncio.sleep(self.logs_every_s)
