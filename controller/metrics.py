"""A controller's metrics under Kafka's names (docs/metrics.md has the table), in the
controller's own registry, computed at scrape time from the Raft node and the committed
image; the only numbers kept between scrapes are two bounded windows of timings.

Cluster-wide counts (offline partitions, fenced brokers, topics...) come from the
active controller only, 0 elsewhere, so that ``sum()`` over the quorum is the cluster's
count, as with Kafka's active-controller metrics. One walk over the partitions of a
committed image is cached until the image changes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from rillet.client.runtime.summaries import RecentSummary, summary_family
from rillet.controller.metadata.image import (
    NO_LEADER,
    NO_LEADER_CHANGE,
    MetadataImage,
    MetadataRecord,
    PartitionChange,
)

if TYPE_CHECKING:
    from rillet.controller.server import ControllerServer

KAFKA_CONTROLLER = "kafka_controller_kafkacontroller"
RAFT = "kafka_server_raftmetrics"


def elects_leaders(records: list[MetadataRecord]) -> bool:
    """Whether an operation's records move some partition's leadership."""
    return any(isinstance(r, PartitionChange) and r.leader != NO_LEADER_CHANGE for r in records)


@dataclass(frozen=True, slots=True)
class ImageCounts:
    topics: int
    partitions: int
    offline: int
    imbalanced: int  # led by another replica than the preferred (first) one
    fenced: int
    active: int


def image_counts(image: MetadataImage) -> ImageCounts:
    partitions = offline = imbalanced = 0
    for _, p in image.iter_partitions():
        partitions += 1
        offline += p.leader == NO_LEADER
        imbalanced += p.leader != NO_LEADER and p.leader != p.preferred_leader
    fenced = sum(1 for b in image.brokers.values() if b.fenced)
    return ImageCounts(
        len(image.topics_by_name),
        partitions,
        offline,
        imbalanced,
        fenced,
        len(image.brokers) - fenced,
    )


class ControllerMetrics:
    """Timings the server records, and the registry that exposes everything."""

    def __init__(self, server: ControllerServer, clock: Callable[[], float] = time.monotonic):
        self.server = server
        self.clock = clock
        self.elections = RecentSummary()  # ms from planning to commit, per operation
        self.commits = RecentSummary()  # ms from proposal to commit, per operation
        self.caught_up_at = clock()  # when the applied offset last reached the commit
        self._counts: tuple[MetadataImage, ImageCounts] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def applied(self) -> None:
        """After each apply (the server's on_applied)."""
        server = self.server
        if server.image.offset >= server.node.commit_index:
            self.caught_up_at = self.clock()

    def counts(self) -> ImageCounts:
        image = self.server.image
        cached = self._counts
        if cached is None or cached[0] is not image:
            cached = self._counts = (image, image_counts(image))
        return cached[1]

    def collect(self) -> Iterator[Metric]:
        server = self.server
        active = server.active
        yield _gauge(
            f"{KAFKA_CONTROLLER}_activecontrollercount",
            "1 on the active controller, 0 on the other quorum members",
            int(active),
        )
        counts = self.counts() if active else ImageCounts(0, 0, 0, 0, 0, 0)
        for name, doc, value in (
            ("offlinepartitionscount", "Partitions without a leader", counts.offline),
            (
                "preferredreplicaimbalancecount",
                "Partitions not led by their preferred replica",
                counts.imbalanced,
            ),
            ("globaltopiccount", "Topics", counts.topics),
            ("globalpartitioncount", "Partitions", counts.partitions),
            ("fencedbrokercount", "Registered brokers that are fenced", counts.fenced),
            ("activebrokercount", "Registered brokers that are unfenced", counts.active),
        ):
            yield _gauge(f"{KAFKA_CONTROLLER}_{name}", doc, value)
        yield summary_family(
            "kafka_controller_controllerstats_leaderelectionrateandtimems",
            "Operations that moved partition leaderships: ms from planning to commit",
            {(): self.elections} if self.elections.count else {},
        )
        yield from self._applied()
        yield from self._raft()

    def _applied(self) -> Iterator[Metric]:
        server = self.server
        applied = server.image.offset
        committed = server.node.commit_index
        lag_ms = 0.0 if applied >= committed else (self.clock() - self.caught_up_at) * 1000
        yield _gauge(
            f"{KAFKA_CONTROLLER}_lastappliedrecordoffset",
            "Offset of the last metadata record applied",
            applied,
        )
        yield _gauge(
            f"{KAFKA_CONTROLLER}_lastcommittedrecordoffset",
            "Offset of the last metadata record known committed",
            committed,
        )
        yield _gauge(
            f"{KAFKA_CONTROLLER}_lastappliedrecordlagms",
            "ms since the applied offset last reached the known commit (0: caught up)",
            lag_ms,
        )

    def _raft(self) -> Iterator[Metric]:
        node = self.server.node
        leader = node.leader_id
        for name, doc, value in (
            ("current_leader", "The quorum leader's id (-1: unknown)", _id(leader)),
            ("current_epoch", "The Raft term (Kafka: epoch)", node.term),
            ("current_vote", "Whom this node voted for in this term (-1: nobody)", _id(node.vote)),
            ("high_watermark", "Commit index", node.commit_index),
            ("log_end_offset", "Last index in the Raft log", node.log.last_index()),
        ):
            yield _gauge(f"{RAFT}_{name}", doc, value)
        state = GaugeMetricFamily(
            f"{RAFT}_current_state", "This node's Raft role", labels=["current_state"]
        )
        state.add_metric([node.role.value], 1)
        yield state
        commits = self.commits
        yield _gauge(
            f"{RAFT}_commit_latency_avg",
            "Mean ms from proposal to commit over recent operations (NaN: none)",
            sum(commits.recent) / len(commits.recent) if commits.recent else math.nan,
        )
        yield _gauge(
            f"{RAFT}_commit_latency_max",
            "Largest ms from proposal to commit over recent operations (NaN: none)",
            max(commits.recent) if commits.recent else math.nan,
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _id(node_id: int | None) -> int:
    return -1 if node_id is None else node_id
