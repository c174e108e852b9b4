"""Every group's lag, computed in the background for the groups pages.

Showing a lag column for 1,000 groups must not cost 1,000 round trips per page view, so
a ``GroupLagCache`` refreshes all of them together, on a slower cadence than the
cluster snapshot, and pages read the result:

- the groups come from the latest cluster snapshot (ListGroups to every broker);
- one ConsumerGroupDescribe and one OffsetFetch per coordinator name all its groups
  (``Admin.describe_groups`` and ``Admin.list_offsets_of_groups``: one FindCoordinator
  for every group, groups whose coordinator moved are asked again);
- the log end offsets of every partition involved come from one ListOffsets per leader;
  a partition without a leader has an unknown log end, and only it: the others' lag
  is still computed, and the row counts the partitions it could not.

``summarize`` turns those answers into rows without I/O. Each refresh also appends one
total-lag sample per group to a bounded history, which the group page draws.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rillet.client.admin import (
    LATEST,
    Admin,
    AdminError,
    GroupDescription,
    GroupListing,
    TopicPartitionKey,
)
from rillet.client.console.snapshot import SnapshotCache
from rillet.client.wire.errors import RilletError

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 3.0


@dataclass(frozen=True, slots=True)
class TopicLag:
    partitions: int
    lag: int
    unknown: int = 0  # committed partitions whose log end could not be had


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One group as the list shows it. ``members`` is None when the describe failed;
    ``lag`` counts only partitions with a commit and a known log end, ``unknown`` the
    committed ones whose log end is not known; ``computed`` is False for a group listed
    since the last lag refresh (no lag yet)."""

    group_id: str
    state: str
    coordinator: int
    members: int | None
    partitions: int
    lag: int
    topics: Mapping[str, TopicLag] = field(default_factory=dict)
    unknown: int = 0
    computed: bool = True


def summarize(
    listings: Iterable[GroupListing],
    described: Mapping[str, GroupDescription],
    committed: Mapping[str, Mapping[TopicPartitionKey, int]],
    ends: Mapping[TopicPartitionKey, int],
    partition_counts: Mapping[str, int],
) -> dict[str, GroupRow]:
    """A row per listed group: the partitions it committed or its members subscribe
    to, and its lag in each topic (a negative lag, a commit past the log end, counts
    as none, as ``GroupLag.total_lag`` does)."""
    rows = {}
    for g in listings:
        desc = described.get(g.group_id)
        offsets = committed.get(g.group_id, {})
        keys = set(offsets)
        if desc is not None:
            for mb in desc.members:
                for t in mb.subscribed_topics:
                    keys.update((t, p) for p in range(partition_counts.get(t, 0)))
        per_topic: dict[str, list[int]] = {}
        for t, p in keys:
            c, e = offsets.get((t, p)), ends.get((t, p))
            lag = max(e - c, 0) if c is not None and e is not None else 0
            acc = per_topic.setdefault(t, [0, 0, 0])
            acc[0] += 1
            acc[1] += lag
            acc[2] += c is not None and e is None
        topics = {t: TopicLag(*acc) for t, acc in sorted(per_topic.items())}
        rows[g.group_id] = GroupRow(
            g.group_id,
            desc.state if desc is not None else g.state,
            desc.coordinator if desc is not None else g.coordinator,
            len(desc.members) if desc is not None else None,
            len(keys),
            sum(t.lag for t in topics.values()),
            topics,
            sum(t.unknown for t in topics.values()),
        )
    return rows


class GroupLagCache:
    """Refreshes every group's lag every ``interval_s`` (a console service)."""

    def __init__(
        self, admin: Admin, snapshots: SnapshotCache, interval_s: float, history_s: float
    ) -> None:
        self.admin = admin
        self.snapshots = snapshots
        self.interval_s = max(MIN_INTERVAL_S, interval_s)
        self.rows: dict[str, GroupRow] = {}
        self.taken_at = 0.0
        self.error = ""
        self.history: dict[str, deque[tuple[float, int]]] = {}
        self._keep = max(2, int(history_s / self.interval_s))
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="console-group-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as e:  # noqa: BLE001 - keep the last rows, say why
                log.warning("console group lag refresh failed: %s", e)
                self.error = str(e) or type(e).__name__
            await asyncio.sleep(self.interval_s)

    async def refresh(self) -> None:
        snap = self.snapshots.latest
        if snap is None:
            return
        ids = [g.group_id for g in snap.groups]
        counts = {t.name: len(t.partitions) for t in snap.topics}
        described, committed = await asyncio.gather(self._describe(ids), self._committed(ids))
        wanted: set[TopicPartitionKey] = set()
        for offsets in committed.values():
            wanted.update(offsets)
        for desc in described.values():
            for mb in desc.members:
                for t in mb.subscribed_topics:
                    wanted.update((t, p) for p in range(counts.get(t, 0)))
        # A commit of a deleted topic (or partition) has no log end to ask for.
        known = sorted(k for k in wanted if k[1] < counts.get(k[0], 0))
        ends = await self._log_ends(known)
        rows = summarize(snap.groups, described, committed, ends, counts)
        now = time.time()
        for g, row in rows.items():
            self.history.setdefault(g, deque(maxlen=self._keep)).append((now, row.lag))
        for g in set(self.history) - set(rows):
            del self.history[g]
        self.rows, self.taken_at, self.error = rows, now, ""

    async def _describe(self, ids: list[str]) -> dict[str, GroupDescription]:
        """Every group's description; a group gone since the listing is left out (one
        more request for the others)."""
        for _ in range(2):
            try:
                found = await self.admin.describe_groups(ids) if ids else []
            except AdminError as e:
                ids = [g for g in ids if g not in e.errors]
                continue
            return {d.group_id: d for d in found}
        return {}

    async def _log_ends(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The log end of every partition that has one now: a partition without a
        leader is left out (its lag is unknown), as is a topic deleted since the
        snapshot (then the others are asked again)."""
        for _ in range(2):
            if not keys:
                return {}
            try:
                return await self.admin.list_offsets(dict.fromkeys(keys, LATEST))
            except AdminError as e:
                if e.found:
                    return dict(e.found)
                gone = set(e.errors)
                keys = [k for k in keys if k[0] not in gone and f"{k[0]}-{k[1]}" not in gone]
        return {}

    async def _committed(self, ids: list[str]) -> dict[str, dict[TopicPartitionKey, int]]:
        answers = await self.admin.list_offsets_of_groups(ids)
        return {
            g: {tp: c.offset for tp, c in offsets.items()}
            for g, offsets in answers.items()
            if not isinstance(offsets, RilletError)
        }
