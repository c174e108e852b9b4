"""Every node's /metrics endpoint, scraped over HTTP from real node processes: Kafka's
names report what happens to the cluster (a killed follower, a killed active
controller), and a combined node serves both roles' families from one endpoint.

One module-scoped cluster of 3 controllers and 3 brokers serves the first tests; the
last one kills the active controller (and starts it again), so it runs last.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_until
from prometheus_client.parser import text_string_to_metric_families

from rillet.client.admin import NewTopic
from rillet.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
RM = "kafka_server_replicamanager"
ACTIVE = "kafka_controller_kafkacontroller_activecontrollercount"
# A killed follower leaves the ISR after this long without fetching (default 30 s).
LAG_MS = 2_000


def scrape(node: LocalCluster | str, node_id: int | None = None) -> Samples:
    """Every sample of one node's endpoint, by (name, labels)."""
    address = node if isinstance(node, str) else node.nodes[node_id].metrics  # type: ignore[index]
    assert address, f"node {node_id} reported no metrics address"
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("metrics") / "cluster",
        controllers=3,
        brokers=3,
        ephemeral_ports=True,
        overrides={"replica.lag.time.max.ms": LAG_MS},
    )
    try:
        c.start()
        c.wait_ready()
        yield c
    except BaseException:
        for node_id in sorted(c.nodes):
            print(f"\n--- node {node_id} log tail ---\n{c.log_tail(node_id)}")
        raise
    finally:
        c.stop(kill=True, timeout_s=20)


def full_isr(cluster: LocalCluster, topic: str) -> bool:
    with SyncAdmin(cluster.bootstrap, timeout_ms=10_000) as admin:
        (described,) = admin.describe_topics([topic])
    return all(p.leader >= 0 and len(p.isr) == len(p.replicas) for p in described.partitions)


def test_every_node_serves_metrics_and_status_lists_the_endpoint(cluster: LocalCluster) -> None:
    rows = cluster.status()
    assert all(
        r["metrics"] == f"http://{cluster.nodes[r['node_id']].metrics}/metrics" for r in rows
    )
    for node_id, node in cluster.nodes.items():
        samples = scrape(cluster, node_id)
        kafka_broker = value(samples, f"{RM}_partitioncount") is not None
        assert kafka_broker == node.is_broker
        assert (value(samples, ACTIVE) is not None) == node.is_controller
    with urllib.request.urlopen(f"http://{cluster.nodes[1].metrics}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://{cluster.nodes[1].metrics}/status", timeout=10)
    assert missing.value.code == 404


def test_bytes_and_messages_per_topic_and_a_dead_follower(cluster: LocalCluster) -> None:
    """Broker 1 leads the partition: produce and fetch count on it per topic and over all
    topics; a follower killed with SIGKILL makes the partition under-replicated there,
    and its return makes it whole again (by an ISR expansion, which counts)."""
    topic = "urp"
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, -1, -1, assignments={0: [1, 2, 3]})])
    wait_until(lambda: full_isr(cluster, topic), message="a full ISR")
    values = [f"v{i}".encode() for i in range(50)]
    with SyncProducer(bootstrap=cluster.bootstrap, acks="all") as producer:
        producer.send_many(topic, values)
        producer.flush()
    got: list[bytes] = []
    with SyncConsumer(topic, bootstrap=cluster.bootstrap, from_beginning=True) as consumer:
        wait_until(
            lambda: (
                got.extend(r.value for rs in consumer.poll(200).values() for r in rs)
                or len(got) >= len(values)
            ),
            message="every record read back",
        )
    tm = "kafka_server_brokertopicmetrics"
    leader = scrape(cluster, 1)
    assert value(leader, f"{tm}_messagesin_total", topic=topic) == len(values)
    assert value(leader, f"{tm}_bytesin_total", topic=topic) > 0  # type: ignore[operator]
    assert value(leader, f"{tm}_bytesout_total", topic=topic) > 0  # type: ignore[operator]
    assert value(leader, f"{tm}_replicationbytesout_total", topic=topic) > 0  # type: ignore[operator]
    for name in ("messagesin", "bytesin", "bytesout"):  # the all-topics series
        assert value(leader, f"{tm}_{name}_total") >= value(
            leader, f"{tm}_{name}_total", topic=topic
        )  # type: ignore[operator]
    assert value(leader, f"{RM}_leadercount") >= 1  # type: ignore[operator]
    assert value(leader, f"{RM}_underreplicatedpartitions") == 0
    for request in ("Produce", "FetchConsumer", "FetchFollower"):  # Kafka splits Fetch
        count = value(leader, "kafka_network_requestmetrics_totaltimems_count", request=request)
        assert count is not None and count >= 1, request
    # Whichever shrinks the ISR first (the leader's AlterPartition after the lag time or
    # the controller fencing the dead broker) is racy; the expansion is the leader's own.
    expands = value(leader, f"{RM}_isrexpands_total")
    assert expands is not None and value(leader, f"{RM}_isrshrinks_total") is not None

    cluster.stop_node(3, kill=True)
    wait_until(
        lambda: scrape(cluster, 1)[(f"{RM}_underreplicatedpartitions", frozenset())] > 0,
        timeout=60,
        message="the leader to report the partition under-replicated",
    )
    cluster.start_node(3)
    wait_until(
        lambda: (
            (s := scrape(cluster, 1))[(f"{RM}_underreplicatedpartitions", frozenset())] == 0
            and s[(f"{RM}_isrexpands_total", frozenset())] > expands
        ),
        timeout=60,
        message="the partition whole again",
    )


def active_controllers(cluster: LocalCluster) -> dict[int, float]:
    return {
        n.node_id: scrape(cluster, n.node_id)[(ACTIVE, frozenset())]
        for n in cluster.controllers()
        if cluster.is_running(n)
    }


def one_active(cluster: LocalCluster, expected_nodes: int) -> int | None:
    counts = active_controllers(cluster)
    if len(counts) != expected_nodes or sum(counts.values()) != 1:
        return None
    return next(n for n, c in counts.items() if c == 1)


def test_exactly_one_active_controller_before_and_after_it_is_killed(
    cluster: LocalCluster,
) -> None:
    active = wait_until(lambda: one_active(cluster, 3), message="one active controller")
    samples = scrape(cluster, active)
    assert value(samples, "kafka_controller_kafkacontroller_activebrokercount") == 3
    assert value(samples, "kafka_server_raftmetrics_current_leader") == active
    assert value(samples, "kafka_server_raftmetrics_current_state", current_state="leader") == 1
    assert value(samples, "kafka_controller_kafkacontroller_globaltopiccount") >= 1  # type: ignore[operator]
    assert value(samples, "kafka_controller_kafkacontroller_lastappliedrecordoffset") > 0  # type: ignore[operator]
    cluster.stop_node(active, kill=True)
    successor = wait_until(
        lambda: one_active(cluster, 2), timeout=60, message="a new active controller"
    )
    assert successor != active
    cluster.start_node(active)
    wait_until(lambda: one_active(cluster, 3), timeout=60, message="three controllers again")


def test_a_combined_node_serves_both_roles_from_one_endpoint(tmp_path: Path) -> None:
    combined = LocalCluster(
        tmp_path / "combined", controllers=1, brokers=1, combined=True, ephemeral_ports=True
    )
    try:
        combined.start()
        combined.wait_ready()
        samples = scrape(combined, 1)
        assert value(samples, ACTIVE) == 1
        assert value(samples, f"{RM}_partitioncount") is not None
        assert value(samples, "kafka_server_raftmetrics_current_leader") == 1
        assert value(samples, "kafka_server_brokermetadatametrics_last_applied_record_offset") > 0  # type: ignore[operator]
        assert value(samples, "rillet_broker_bytes_in_total") is not None
    finally:
        combined.stop(kill=True, timeout_s=20)
