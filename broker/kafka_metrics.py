"""A broker's metrics under Kafka's names, as the Prometheus JMX exporter's usual Kafka
rules name Kafka's MBeans (docs/metrics.md has the table), so that dashboards and
alerts written for Kafka read a rillet broker unchanged.

``KafkaBrokerStats`` keeps plain numbers, updated once per batch, request or ISR change
(never per record); ``BrokerCollector`` turns them, and gauges it reads from the
replica manager and the group manager, into exposition families at scrape time only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from rillet.client.runtime.summaries import RecentSummary, summary_family

if TYPE_CHECKING:
    from rillet.broker.group.manager import GroupManager
    from rillet.broker.metrics import BrokerMetrics
    from rillet.broker.replica_manager import ReplicaManager
    from rillet.controller.metadata.image import MetadataDelta, MetadataImage

TOPIC_METRICS = "kafka_server_brokertopicmetrics"
REPLICA_MANAGER = "kafka_server_replicamanager"
# KIP-958's remote-tier meters and gauges, by the rillet_broker_ counter they mirror.
REMOTE_COUNTERS = {
    "remotecopybytes": "remote_copy_bytes",
    "remotecopyrequests": "remote_copy_requests",
    "remotecopyerrors": "remote_copy_errors",
    "remotedeleterequests": "remote_delete_requests",
    "remotedeleteerrors": "remote_delete_errors",
    "remotefetchbytes": "remote_fetch_bytes",
    "remotefetchrequests": "remote_fetch_requests",
    "remotefetcherrors": "remote_fetch_errors",
}
REMOTE_GAUGES = {
    "remotecopylagsegments": "remote_copy_lag_segments",
    "remotecopylagbytes": "remote_copy_lag_bytes",
    "remotelogsizebytes": "remote_log_size_bytes",
}


class TopicCounter:
    """One BrokerTopicMetrics meter: per topic, and over all topics (Kafka has both; the
    all-topics total keeps what a deleted topic counted)."""

    __slots__ = ("by_topic", "total")

    def __init__(self) -> None:
        self.by_topic: dict[str, float] = {}
        self.total = 0.0

    def add(self, topic: str, amount: float) -> None:
        self.by_topic[topic] = self.by_topic.get(topic, 0.0) + amount
        self.total += amount

    def family(self, name: str, doc: str) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["topic"])
        family.add_sample(f"{name}_total", {}, self.total)
        for topic, value in self.by_topic.items():
            family.add_metric([topic], value)
        return family


class KafkaBrokerStats:
    def __init__(self) -> None:
        self.bytes_in = TopicCounter()
        self.messages_in = TopicCounter()
        self.bytes_out = TopicCounter()  # to consumers; followers' fetches are replication
        self.replication_bytes_out = TopicCounter()
        self.isr_shrinks = 0
        self.isr_expands = 0
        self.request_time: dict[tuple[str], RecentSummary] = {}

    def record_in(self, topic: str, nbytes: int, messages: int) -> None:
        self.bytes_in.add(topic, nbytes)
        self.messages_in.add(topic, messages)

    def record_out(self, topic: str, nbytes: int, replication: bool) -> None:
        (self.replication_bytes_out if replication else self.bytes_out).add(topic, nbytes)

    def isr_changed(self, before: set[int], after: set[int]) -> None:
        """An ISR change the controller accepted for a partition this broker leads."""
        if after - before:
            self.isr_expands += 1
        if before - after:
            self.isr_shrinks += 1

    def observe_request(self, api: str, ms: float) -> None:
        summary = self.request_time.get((api,))
        if summary is None:
            summary = self.request_time[(api,)] = RecentSummary()
        summary.observe(ms)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's series go, as Kafka removes its topic metrics."""
        for counter in self._topic_counters():
            counter.by_topic.pop(topic, None)

    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Forget the topics a metadata update removed. A delta over the empty image (a
        snapshot load, or the first catch-up) names no deletions, only what exists: then
        every series of a topic the image lacks goes (deleted while this broker was
        behind), in one pass over the series, only on such loads."""
        if delta.image.offset < 0:
            for counter in self._topic_counters():
                for topic in [t for t in counter.by_topic if t not in image.topics_by_name]:
                    del counter.by_topic[topic]
            return
        for name in delta.deleted_topics.values():
            self.forget_topic(name)

    def _topic_counters(self) -> tuple[TopicCounter, ...]:
        return (self.bytes_in, self.messages_in, self.bytes_out, self.replication_bytes_out)


class BrokerCollector:
    """Every Kafka-named family of one broker, computed when scraped."""

    def __init__(
        self,
        stats: KafkaBrokerStats,
        metrics: BrokerMetrics,
        replicas: ReplicaManager,
        groups: Callable[[], GroupManager | None] = lambda: None,
        metadata_age_ms: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.stats = stats
        self.metrics = metrics
        self.replicas = replicas
        self.groups = groups
        self.metadata_age_ms = metadata_age_ms

    def collect(self) -> Iterator[Metric]:
        yield from self._replica_manager()
        yield from self._topic_metrics()
        yield from self._requests()
        yield from self._metadata()
        yield from self._groups()

    def _replica_manager(self) -> Iterator[Metric]:
        partitions = leaders = under_replicated = under_min_isr = 0
        for replica in self.replicas.replicas.values():
            partitions += 1
            if not replica.is_leader:
                continue
            leaders += 1
            isr = len(replica.state.isr)
            under_replicated += isr < len(replica.state.replicas)
            under_min_isr += isr < replica.min_insync_replicas
        for name, doc, value in (
            ("partitioncount", "Partitions with a replica on this broker", partitions),
            ("leadercount", "Partitions this broker leads", leaders),
            ("underreplicatedpartitions", "Led partitions whose ISR < replicas", under_replicated),
            ("underminisrpartitioncount", "Led partitions whose ISR < min ISR", under_min_isr),
        ):
            yield GaugeMetricFamily(f"{REPLICA_MANAGER}_{name}", doc, value=value)
        stats = self.stats
        yield CounterMetricFamily(
            f"{REPLICA_MANAGER}_isrshrinks", "Accepted ISR shrinks", value=stats.isr_shrinks
        )
        yield CounterMetricFamily(
            f"{REPLICA_MANAGER}_isrexpands", "Accepted ISR expansions", value=stats.isr_expands
        )

    def _topic_metrics(self) -> Iterator[Metric]:
        s = self.stats
        yield s.bytes_in.family(f"{TOPIC_METRICS}_bytesin", "Bytes appended by produce")
        yield s.messages_in.family(f"{TOPIC_METRICS}_messagesin", "Records appended")
        yield s.bytes_out.family(f"{TOPIC_METRICS}_bytesout", "Bytes fetched by consumers")
        yield s.replication_bytes_out.family(
            f"{TOPIC_METRICS}_replicationbytesout", "Bytes fetched by follower replicas"
        )
        total = self.metrics.total
        for name, ours in REMOTE_COUNTERS.items():
            yield CounterMetricFamily(f"{TOPIC_METRICS}_{name}", ours, value=total(ours))
        get = self.metrics.registry.get_sample_value
        for name, ours in REMOTE_GAUGES.items():
            value = get(f"rillet_broker_{ours}") or 0.0
            yield GaugeMetricFamily(f"{TOPIC_METRICS}_{name}", ours, value=value)

    def _requests(self) -> Iterator[Metric]:
        idle = self.metrics.rates()["request_handler_idle_percent"] / 100
        yield GaugeMetricFamily(
            "kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent",
            "Share of time the request handlers were idle (0..1, as Kafka reports it)",
            value=idle,
        )
        times = self.stats.request_time
        yield summary_family(
            "kafka_network_requestmetrics_totaltimems",
            "Handler time per request, ms",
            times,
            ["request"],
        )
        requests = CounterMetricFamily(
            "kafka_network_requestmetrics_requests", "Requests handled", labels=["request"]
        )
        for (api,), summary in times.items():
            requests.add_metric([api], summary.count)
        yield requests

    def _metadata(self) -> Iterator[Metric]:
        name = "kafka_server_brokermetadatametrics"
        yield GaugeMetricFamily(
            f"{name}_last_applied_record_offset",
            "Offset of the last metadata record applied",
            value=self.replicas.image.offset,
        )
        age = self.metadata_age_ms()
        yield GaugeMetricFamily(
            f"{name}_last_applied_record_lag_ms",
            "How old the applied metadata may be, at most (ms; -1 before the first fetch)",
            value=-1.0 if age is None else age,
        )

    def _groups(self) -> Iterator[Metric]:
        manager = self.groups()
        counts: dict[str, int] = {}
        if manager is not None:
            for part in manager.partitions.values():
                for group in part.groups.values():
                    state = group.state.value
                    counts[state] = counts.get(state, 0) + 1
        name = "kafka_server_groupcoordinatormetrics"
        total = GaugeMetricFamily(
            f"{name}_group_count", "Groups this broker coordinates", labels=["protocol"]
        )
        total.add_metric(["consumer"], sum(counts.values()))
        yield total
        by_state = GaugeMetricFamily(
            f"{name}_consumer_group_count", "Consumer groups per state", labels=["state"]
        )
        for state, count in sorted(counts.items()):
            by_state.add_metric([state], count)
        yield by_state
