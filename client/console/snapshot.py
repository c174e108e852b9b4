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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from rillet.client.admin import Admin, ClusterDescription, GroupListing, TopicDescription

log = logging.getLogger(__name__)


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
    # The error of the last refresh if it failed (this snapshot is then an older one).
    error: str = ""
    topics_by_name: dict[str, TopicDescription] = field(default_factory=dict)

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.taken_at)


@dataclass(frozen=True, slots=True)
class HealthSample:
    """One point of the overview chart."""

    at: float
    under_replicated: int
    offline: int


async def take_snapshot(admin: Admin) -> ClusterSnapshot:
    cluster, topics, groups = await asyncio.gather(
        admin.describe_cluster(), admin.describe_topics(), admin.list_groups()
    )
    ordered = tuple(sorted(topics, key=lambda t: t.name))
    partitions = urp = offline = 0
    for t in ordered:
        for p in t.partitions:
            partitions += 1
            urp += p.under_replicated
            offline += p.leader < 0
    return ClusterSnapshot(
        taken_at=time.time(),
        cluster=cluster,
        topics=ordered,
        groups=tuple(sorted(groups, key=lambda g: g.group_id)),
        partitions=partitions,
        under_replicated=urp,
        offline=offline,
        topics_by_name={t.name: t for t in ordered},
    )


class SnapshotCache:
    """Refreshes a ``ClusterSnapshot`` every ``refresh_s``; keeps a bounded history of
    health samples for the charts; wakes live-stream subscribers after each refresh."""

    def __init__(self, admin: Admin, refresh_s: float = 2.0, history_s: float = 600.0) -> None:
        self.admin = admin
        self.refresh_s = refresh_s
        self.latest: ClusterSnapshot | None = None
        self.history: deque[HealthSample] = deque(maxlen=max(1, int(history_s / refresh_s)))
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="console-snapshots")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def refresh(self) -> ClusterSnapshot | None:
        try:
            snap = await take_snapshot(self.admin)
        except Exception as e:  # noqa: BLE001 - any failure keeps the last good view
            log.warning("console snapshot failed: %s", e)
            if self.latest is not None:
                snap = _with_error(self.latest, str(e) or type(e).__name__)
            else:
                return None
        else:
            self.history.append(HealthSample(snap.taken_at, snap.under_replicated, snap.offline))
        self.latest = snap
        # Wake every waiting subscriber, then arm a fresh event for the next refresh.
        self._changed.set()
        self._changed = asyncio.Event()
        return snap

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


def _with_error(snap: ClusterSnapshot, error: str) -> ClusterSnapshot:
    return ClusterSnapshot(
        taken_at=snap.taken_at,
        cluster=snap.cluster,
        topics=snap.topics,
        groups=snap.groups,
        partitions=snap.partitions,
        under_replicated=snap.under_replicated,
        offline=snap.offline,
        error=error,
        topics_by_name=snap.topics_by_name,
    )
