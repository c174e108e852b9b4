"""What the overview and topics pages list, computed once per snapshot (sans I/O).

Everything here is a pure function of what the Admin described: the broker rows with
their state, the topic rows with sizes and rates, and the paging, sorting and filtering
the list pages apply per request. One pass over the partitions per refresh; a request
then sorts and slices rows already built (1,000 topics: well under a millisecond).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rillet.client.admin import TopicDescription
from rillet.client.health import BrokerHealth, ClusterHealth
from rillet.client.metadata import BrokerInfo
from rillet.client.wire.messages import DescribeLogDirsPartition

T = TypeVar("T")
PartitionKey = tuple[str, int]

UP = "up"
FENCED = "fenced"
# Registered but its port refuses or does not answer a connection: killed, or its host
# is gone. The controller fences it only after broker.session.timeout.ms, so this shows
# a dead broker seconds earlier than the metadata does.
UNREACHABLE = "unreachable"
# Seen in an earlier snapshot, absent from DescribeCluster now (unregistered).
MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Rates:
    """Per second, between two log samples (``LogStats``)."""

    bytes_in: float = 0.0
    records_in: float = 0.0


@dataclass(frozen=True, slots=True)
class TopicSize:
    local: int = 0  # bytes on the leaders' local disks
    remote: int = 0  # bytes in the remote tier
    tiered: bool = False  # remote.storage.enable on the topic (as a leader reports it)
    known: int = 0  # partitions whose leader answered (the rest are not counted)


@dataclass(frozen=True, slots=True)
class LogStats:
    """One DescribeLogDirs pass over every partition's leader, and the rates derived from
    the pass before it."""

    taken_at: float  # time.time()
    partitions: Mapping[PartitionKey, DescribeLogDirsPartition]
    topic_sizes: Mapping[str, TopicSize]
    topic_rates: Mapping[str, Rates]
    broker_rates: Mapping[int, Rates]
    interval_s: float = 0.0  # since the pass the rates compare with (0: no rates yet)


def log_stats(
    topics: Iterable[TopicDescription],
    logs: Mapping[PartitionKey, DescribeLogDirsPartition],
    taken_at: float,
    previous: LogStats | None,
) -> LogStats:
    """Sizes per topic and rates per topic and per leader broker.

    records-in/s is the growth of each partition's log end offset; bytes-in/s the growth
    of its local size plus its remote size (clamped at zero: a retention deletion in the
    interval hides what was appended meanwhile). A partition is counted on its current
    leader; one missing from either pass is left out."""
    sizes: dict[str, TopicSize] = {}
    topic_rates: dict[str, Rates] = {}
    broker_rates: dict[int, Rates] = {}
    interval = taken_at - previous.taken_at if previous is not None else 0.0
    before = previous.partitions if previous is not None and interval > 0 else {}
    for t in topics:
        local = remote = known = 0
        tiered = False
        t_bytes = t_records = 0.0
        for p in t.partitions:
            now = logs.get((t.name, p.partition))
            if now is None:
                continue
            known += 1
            local += now.size_bytes
            remote += max(now.remote_size_bytes, 0)
            tiered = tiered or now.remote_storage
            then = before.get((t.name, p.partition))
            if then is None:
                continue
            grown = (
                now.size_bytes + now.remote_size_bytes - then.size_bytes - then.remote_size_bytes
            )
            d_bytes = max(grown, 0) / interval
            d_records = max(now.log_end_offset - then.log_end_offset, 0) / interval
            t_bytes += d_bytes
            t_records += d_records
            if p.leader >= 0:
                r = broker_rates.get(p.leader, Rates())
                broker_rates[p.leader] = Rates(r.bytes_in + d_bytes, r.records_in + d_records)
        sizes[t.name] = TopicSize(local, remote, tiered, known)
        if before:
            topic_rates[t.name] = Rates(t_bytes, t_records)
    return LogStats(taken_at, logs, sizes, topic_rates, broker_rates, interval if before else 0.0)


@dataclass(frozen=True, slots=True)
class BrokerRow:
    id: int
    address: str
    rack: str
    state: str  # UP, FENCED, UNREACHABLE or MISSING
    leaders: int
    partitions: int  # replicas it hosts
    under_replicated: int  # under-replicated partitions it leads
    bytes_in: float | None  # per second; None until two log samples exist
    records_in: float | None
    bytes_out: float | None  # per second from its metrics endpoint; None: not known

    @property
    def bad(self) -> bool:
        return self.state != UP


def broker_rows(
    health: ClusterHealth,
    *,
    unreachable: Iterable[int] = (),
    missing: Iterable[BrokerInfo] = (),
    logs: LogStats | None = None,
    bytes_out: Mapping[int, float] | None = None,
) -> tuple[BrokerRow, ...]:
    """One row per registered broker (its counts from the health assessment), then the
    ones seen before and missing now."""
    down = set(unreachable)
    rates = logs.broker_rates if logs is not None and logs.interval_s > 0 else None
    out = bytes_out or {}

    def row(b: BrokerHealth, state: str) -> BrokerRow:
        r = rates.get(b.id, Rates()) if rates is not None else None
        return BrokerRow(
            b.id,
            f"{b.host}:{b.port}",
            b.rack or "-",
            state,
            b.leaders,
            b.partitions,
            b.under_replicated,
            r.bytes_in if r is not None else None,
            r.records_in if r is not None else None,
            out.get(b.id),
        )

    rows = [
        row(b, UNREACHABLE if b.id in down else FENCED if b.fenced else UP) for b in health.brokers
    ]
    listed = {b.id for b in health.brokers}
    gone = sorted((b for b in missing if b.node_id not in listed), key=lambda b: b.node_id)
    rows += [
        row(BrokerHealth(b.node_id, b.host, b.port, b.rack, False, 0, 0, 0), MISSING) for b in gone
    ]
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    partitions: int
    replication_factor: int
    under_replicated: int
    offline: int
    size_local: int | None  # None: no leader answered DescribeLogDirs yet
    size_remote: int | None  # None: not a tiered topic (or not known)
    bytes_in: float | None
    records_in: float | None

    @property
    def internal(self) -> bool:
        # Kafka's convention: __consumer_offsets, __transaction_state...
        return self.name.startswith("__")


def topic_rows(topics: Iterable[TopicDescription], logs: LogStats | None) -> tuple[TopicRow, ...]:
    rows = []
    for t in topics:
        urp = offline = 0
        for p in t.partitions:
            urp += p.under_replicated
            offline += p.leader < 0
        size = logs.topic_sizes.get(t.name) if logs is not None else None
        rate = logs.topic_rates.get(t.name) if logs is not None else None
        known = size is not None and size.known > 0
        rows.append(
            TopicRow(
                t.name,
                len(t.partitions),
                t.replication_factor,
                urp,
                offline,
                size.local if known and size is not None else None,
                size.remote if known and size is not None and size.tiered else None,
                rate.bytes_in if rate is not None else None,
                rate.records_in if rate is not None else None,
            )
        )
    return tuple(rows)


# --- paging, sorting, filtering (per request, over rows already built) -------------


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    rows: Sequence[T]
    page: int  # 1-based, clamped to the pages there are
    pages: int
    total: int  # rows after filtering
    size: int
    query: Mapping[str, str] = field(default_factory=dict)  # the view's other parameters

    @property
    def first(self) -> int:
        """1-based index of the first row shown (0 when none)."""
        return (self.page - 1) * self.size + 1 if self.total else 0

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.total else 0

    def link(self, **changes: Any) -> str:
        """The query string of this view with ``changes`` (e.g. ``page=3``)."""
        from urllib.parse import urlencode

        merged = {**self.query, "page": str(self.page), **{k: str(v) for k, v in changes.items()}}
        return "?" + urlencode({k: v for k, v in merged.items() if v not in ("", "None")})


def paginate(rows: Sequence[T], page: int, size: int, query: Mapping[str, str]) -> Page[T]:
    pages = max(1, math.ceil(len(rows) / size))
    page = min(max(1, page), pages)
    start = (page - 1) * size
    return Page(rows[start : start + size], page, pages, len(rows), size, query)


def sort_rows(rows: Iterable[T], key: Callable[[T], Any], descending: bool) -> list[T]:
    """Sort with unknown values (None) last in either direction."""
    rows = list(rows)
    known = [r for r in rows if key(r) is not None]
    unknown = [r for r in rows if key(r) is None]
    return sorted(known, key=key, reverse=descending) + unknown


def int_param(raw: str | None, default: int, low: int = 1, high: int = 1_000_000) -> int:
    try:
        value = int(raw) if raw not in (None, "") else default
    except ValueError:
        return default
    return min(max(value, low), high)
