"""Cluster health at a glance: what `rillet cluster status` and the console's overview show.

Two parts, kept apart so the verdict can be tested without a cluster:

- ``assess(cluster, quorum, topics, min_isr)``: a pure function over what the Admin
  described, one pass over the partitions (10,000 partitions take milliseconds), giving
  a ``ClusterHealth``.
- ``gather_health(admin)``: asks for those descriptions (DescribeCluster, DescribeQuorum,
  Metadata, and DescribeConfigs for ``min.insync.replicas``, batched) and assesses them.

The verdict follows what operators of Kafka page on:

- unhealthy (``healthy`` False, each reason in ``problems``): no active controller (no
  metadata change can be made: no leader election, no ISR change, no topic change),
  offline partitions (no leader: unavailable), or partitions under min ISR (acks=all
  producers are refused);
- degraded (healthy, reasons in ``warnings``): under-replicated partitions that still
  meet min ISR, fenced brokers. Data is served; redundancy is reduced.

The API (``gather_health``, ``assess``, ``ClusterHealth`` and its parts, ``as_dict``) is
stable: the web console builds its overview page on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rillet.client.admin import (
    Admin,
    AdminError,
    ClusterDescription,
    QuorumDescription,
    TopicDescription,
)
from rillet.client.wire.errors import RilletError

OFFLINE = "offline"
UNDER_MIN_ISR = "under-min-isr"
UNDER_REPLICATED = "under-replicated"
PROBLEM_LIMIT = 100  # problem partitions listed; the counts cover them all
# A broker gives up looking for the active controller after 5 s (a failover takes a
# second or two); this bounds the wait should it not answer at all.
QUORUM_TIMEOUT_S = 10.0
MIN_ISR = "min.insync.replicas"


@dataclass(frozen=True, slots=True)
class BrokerHealth:
    id: int
    host: str
    port: int
    rack: str | None
    fenced: bool
    leaders: int  # partitions it leads
    partitions: int  # replicas it hosts
    under_replicated: int  # under-replicated partitions it leads

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "port": self.port,
            "rack": self.rack,
            "fenced": self.fenced,
            "leaders": self.leaders,
            "partitions": self.partitions,
            "under_replicated": self.under_replicated,
        }


@dataclass(frozen=True, slots=True)
class PartitionProblem:
    topic: str
    partition: int
    problem: str  # OFFLINE, UNDER_MIN_ISR or UNDER_REPLICATED (the worst it has)
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_isr: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "problem": self.problem,
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "min_isr": self.min_isr,
        }


@dataclass(frozen=True, slots=True)
class ClusterHealth:
    """The cluster as described, and the verdict (module docstring).

    ``quorum`` is None when no active controller answered. ``problem_partitions`` lists at
    most a limit of them, worst first (offline, then under min ISR, then under-replicated);
    ``problem_partitions_total`` counts them all."""

    cluster_id: str
    controller_id: int  # -1: none known
    brokers: tuple[BrokerHealth, ...]
    quorum: QuorumDescription | None
    topics: int
    partitions: int
    offline: int
    under_replicated: int  # these two count only partitions with a leader
    under_min_isr: int
    problem_partitions: tuple[PartitionProblem, ...]
    problem_partitions_total: int
    healthy: bool
    problems: tuple[str, ...]  # why it is unhealthy
    warnings: tuple[str, ...]  # why it is degraded

    @property
    def status(self) -> str:
        """``healthy``, ``degraded`` or ``unhealthy``."""
        if not self.healthy:
            return "unhealthy"
        return "degraded" if self.warnings else "healthy"

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "status": self.status,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "cluster_id": self.cluster_id,
            "controller_id": self.controller_id,
            "quorum": None if self.quorum is None else self.quorum.as_dict(),
            "brokers": [b.as_dict() for b in self.brokers],
            "topics": self.topics,
            "partitions": self.partitions,
            "offline": self.offline,
            "under_replicated": self.under_replicated,
            "under_min_isr": self.under_min_isr,
            "problem_partitions": [p.as_dict() for p in self.problem_partitions],
            "problem_partitions_total": self.problem_partitions_total,
        }


def assess(
    cluster: ClusterDescription,
    quorum: QuorumDescription | None,
    topics: Sequence[TopicDescription],
    min_isr: Mapping[str, int],
    *,
    limit: int = PROBLEM_LIMIT,
) -> ClusterHealth:
    """The health of a described cluster, in one pass over its partitions. ``min_isr``
    maps a topic to its min.insync.replicas (1 for a topic it lacks)."""
    fenced = set(cluster.fenced)
    leaders: dict[int, int] = {}
    hosted: dict[int, int] = {}
    led_urp: dict[int, int] = {}
    found: dict[str, list[PartitionProblem]] = {
        OFFLINE: [],
        UNDER_MIN_ISR: [],
        UNDER_REPLICATED: [],
    }
    counts = {OFFLINE: 0, UNDER_MIN_ISR: 0, UNDER_REPLICATED: 0}
    total = 0
    partitions = 0
    for t in topics:
        floor = min_isr.get(t.name, 1)
        for p in t.partitions:
            partitions += 1
            for r in p.replicas:
                hosted[r] = hosted.get(r, 0) + 1
            # An offline partition counts only as offline: its ISR is moot without a leader.
            offline = p.leader < 0
            under_min = not offline and len(p.isr) < floor
            under = not offline and len(p.isr) < len(p.replicas)
            if not offline:
                leaders[p.leader] = leaders.get(p.leader, 0) + 1
                if under:
                    led_urp[p.leader] = led_urp.get(p.leader, 0) + 1
            counts[OFFLINE] += offline
            counts[UNDER_MIN_ISR] += under_min
            counts[UNDER_REPLICATED] += under
            worst = OFFLINE if offline else UNDER_MIN_ISR if under_min else None
            worst = worst or (UNDER_REPLICATED if under else None)
            if worst is None:
                continue
            total += 1
            if len(found[worst]) < limit:
                found[worst].append(
                    PartitionProblem(t.name, p.partition, worst, p.leader, p.replicas, p.isr, floor)
                )
    listed = (found[OFFLINE] + found[UNDER_MIN_ISR] + found[UNDER_REPLICATED])[:limit]
    brokers = tuple(
        BrokerHealth(
            b.node_id,
            b.host,
            b.port,
            b.rack,
            b.node_id in fenced,
            leaders.get(b.node_id, 0),
            hosted.get(b.node_id, 0),
            led_urp.get(b.node_id, 0),
        )
        for b in sorted(cluster.brokers, key=lambda b: b.node_id)
    )
    problems = []
    if quorum is None or quorum.leader_id < 0:
        problems.append("no active controller")
    if counts[OFFLINE]:
        problems.append(f"{counts[OFFLINE]} offline partition(s)")
    if counts[UNDER_MIN_ISR]:
        problems.append(f"{counts[UNDER_MIN_ISR]} partition(s) under min ISR")
    warnings = []
    if counts[UNDER_REPLICATED]:
        warnings.append(f"{counts[UNDER_REPLICATED]} under-replicated partition(s)")
    if fenced:
        warnings.append(f"fenced broker(s): {', '.join(map(str, sorted(fenced)))}")
    return ClusterHealth(
        cluster_id=cluster.cluster_id,
        controller_id=quorum.leader_id if quorum is not None else -1,
        brokers=brokers,
        quorum=quorum,
        topics=len(topics),
        partitions=partitions,
        offline=counts[OFFLINE],
        under_replicated=counts[UNDER_REPLICATED],
        under_min_isr=counts[UNDER_MIN_ISR],
        problem_partitions=tuple(listed),
        problem_partitions_total=total,
        healthy=not problems,
        problems=tuple(problems),
        warnings=tuple(warnings),
    )


async def gather_health(
    admin: Admin,
    *,
    limit: int = PROBLEM_LIMIT,
    quorum_timeout_s: float = QUORUM_TIMEOUT_S,
) -> ClusterHealth:
    """Describe the cluster through ``admin`` and assess it. Brokers answer from their
    metadata even without an active controller; DescribeQuorum then finds none within
    ``quorum_timeout_s`` and the verdict says so. Errors reaching the brokers
    themselves (NetworkError...) propagate: the caller tells "unreachable" apart."""
    cluster, topics = await asyncio.gather(admin.describe_cluster(), admin.describe_topics())
    min_isr = await describe_min_isr(admin, [t.name for t in topics])
    # Last and asked once: a broker answers a connection's requests in order, and
    # without an active controller this one takes seconds to fail.
    quorum = await _quorum(admin, quorum_timeout_s)
    return assess(cluster, quorum, topics, min_isr, limit=limit)


async def _quorum(admin: Admin, timeout_s: float) -> QuorumDescription | None:
    try:
        return await asyncio.wait_for(admin.describe_quorum(retry=False), timeout_s)
    except (TimeoutError, RilletError):
        return None


async def describe_min_isr(admin: Admin, names: Iterable[str]) -> dict[str, int]:
    """Each topic's min.insync.replicas as its brokers apply it (DescribeConfigs of that
    key alone, batched; a topic deleted meanwhile is left out)."""
    try:
        configs = await admin.describe_configs(names, keys=[MIN_ISR])
    except AdminError as e:
        configs = e.found
    out: dict[str, int] = {}
    for name, entries in configs.items():
        entry = entries.get(MIN_ISR)
        if entry is not None and entry.value is not None:
            out[name] = int(entry.value)
    return out
