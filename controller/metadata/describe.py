"""Read-only views of a `MetadataImage`: what Metadata, DescribeCluster and
DescribeTopics answers list. Brokers and controllers both answer those APIs from their
own image, so these live beside the image, not in the QuorumController.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rillet.client.wire import messages as m
from rillet.client.wire.errors import code_of
from rillet.controller.metadata.image import NO_LEADER, RESOURCE_BROKER, MetadataImage

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = code_of("UNKNOWN_TOPIC_OR_PARTITION")
OFFSETS_TOPIC = "__consumer_offsets"
"""Kafka's internal topic of consumer groups' offsets and state (docs/groups.md)."""
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})
"""Topics Metadata marks internal: only brokers write them."""
CLUSTER_ID_KEY = ("", "cluster.id")  # (resource name, key) under RESOURCE_BROKER


def cluster_id_of(image: MetadataImage) -> str | None:
    """The cluster id the first active controller wrote into the metadata log."""
    return image.configs.get((RESOURCE_BROKER, CLUSTER_ID_KEY[0]), {}).get(CLUSTER_ID_KEY[1])


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    broker_id: int
    host: str
    port: int
    rack: str | None
    fenced: bool


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerDescription, ...]


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    error_code: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    error_code: int
    topic_id: str = ""
    partitions: tuple[PartitionMetadata, ...] = ()


def describe_cluster(
    image: MetadataImage,
    cluster_id: str,
    controller_id: int,
    listener: str | None = None,
    include_fenced: bool = False,
) -> ClusterDescription:
    """Brokers as clients see them: unfenced ones only, unless asked otherwise."""
    out = []
    for b in sorted(image.brokers):
        reg = image.brokers[b]
        ep = reg.endpoint(listener)
        if ep is None or (reg.fenced and not include_fenced):
            continue
        out.append(BrokerDescription(b, ep.host, ep.port, reg.rack, reg.fenced))
    return ClusterDescription(cluster_id, controller_id, tuple(out))


def describe_topics(
    image: MetadataImage, names: Sequence[str] | None = None
) -> list[TopicMetadata]:
    """What a Metadata response lists per topic, read straight off the image: each topic
    once, as Kafka answers (a name repeated 20,000 times is one topic, not 20,000)."""
    wanted = sorted(image.topics_by_name) if names is None else dict.fromkeys(names)
    out: list[TopicMetadata] = []
    for name in wanted:
        t = image.topic(name)
        if t is None:
            out.append(TopicMetadata(name, UNKNOWN_TOPIC_OR_PARTITION))
            continue
        parts = []
        for i in sorted(t.partitions):
            p = t.partitions[i]
            offline = tuple(r for r in p.replicas if not image.is_unfenced(r))
            code = NONE if p.leader != NO_LEADER else code_of("LEADER_NOT_AVAILABLE")
            parts.append(
                PartitionMetadata(i, code, p.leader, p.leader_epoch, p.replicas, p.isr, offline)
            )
        out.append(TopicMetadata(name, NONE, t.topic_id, tuple(parts)))
    return out


def metadata_topic(t: TopicMetadata, error_code: int | None = None) -> m.MetadataTopic:
    """One topic of a Metadata response (``error_code`` overrides the topic's own)."""
    partitions = [
        m.MetadataPartition(
            error_code=p.error_code,
            partition=p.partition,
            leader_id=p.leader,
            leader_epoch=p.leader_epoch,
            replicas=list(p.replicas),
            isr=list(p.isr),
            offline_replicas=list(p.offline_replicas),
        )
        for p in t.partitions
    ]
    code = t.error_code if error_code is None else error_code
    internal = t.name in INTERNAL_TOPICS
    return m.MetadataTopic(code, t.name, internal, partitions, t.topic_id)


def metadata_brokers(desc: ClusterDescription) -> list[m.MetadataBroker]:
    return [m.MetadataBroker(b.broker_id, b.host, b.port, b.rack) for b in desc.brokers]


def describe_cluster_brokers(desc: ClusterDescription) -> list[m.DescribeClusterBroker]:
    return [
        m.DescribeClusterBroker(b.broker_id, b.host, b.port, b.rack, b.fenced) for b in desc.brokers
    ]
