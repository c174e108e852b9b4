"""Leadership and reassignment with real processes (1 controller + 3 brokers, short
timings): leadership returns to the preferred replica after a broker restarts, by
`rillet leader elect --preferred` and by the controller's automatic rebalance; `topic
describe` and `cluster status` count under-replicated partitions while a broker is down;
`rillet partition reassign` moves a partition to a broker that joined later, whose log
then holds every record while the dropped replica deletes its log (and, while that broker
is down, shows the move in progress and cancels it)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli, wait_until

from rillet.client.admin import NewTopic
from rillet.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from rillet.tools.local_cluster import LocalCluster, pid_alive

pytestmark = pytest.mark.cluster

BROKERS = (1, 2, 3)
CONTROLLER = 101
BROKER_SETTINGS = {
    "replica.lag.time.max.ms": 1000,
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 100,
    "broker.heartbeat.interval.ms": 250,
    "controlled.shutdown.timeout.ms": 10_000,
}
CONTROLLER_SETTINGS = {"broker.session.timeout.ms": 2500, "broker.heartbeat.interval.ms": 250}


def leadership_cluster(cluster_factory: Any, **controller: Any) -> LocalCluster:
    overrides: dict[int, dict[str, Any]] = {b: dict(BROKER_SETTINGS) for b in BROKERS}
    overrides[CONTROLLER] = {**CONTROLLER_SETTINGS, **controller}
    return cluster_factory(controllers=1, brokers=3, node_overrides=overrides)


def rillet(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    return run_cli(cluster.bootstrap, *args, ok=ok)


def rillet_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    return json.loads(rillet(cluster, *args, "--json").stdout)


def cluster_status(cluster: LocalCluster) -> dict[str, Any]:
    return rillet_json(cluster, "cluster", "status", "--data-dir", str(cluster.data_dir))


def partitions(cluster: LocalCluster, topic: str) -> list[Any]:
    with SyncAdmin(cluster.bootstrap, timeout_ms=10_000) as admin:
        return list(admin.describe_topics([topic])[0].partitions)


def all_in_sync(cluster: LocalCluster, topic: str) -> bool:
    return all(p.leader >= 0 and len(p.isr) == len(p.replicas) for p in partitions(cluster, topic))


def preferred_lead(cluster: LocalCluster, topic: str) -> bool:
    return all(p.leader == p.replicas[0] for p in partitions(cluster, topic))


def create_and_fill(
    cluster: LocalCluster,
    topic: str,
    count: int,
    n: int,
    assignments: dict[int, list[int]] | None = None,
) -> list[bytes]:
    with SyncAdmin(cluster.bootstrap) as admin:
        rf = -1 if assignments else 3
        admin.create_topics(
            [NewTopic(topic, count if not assignments else -1, rf, assignments=assignments)]
        )
    wait_until(lambda: all_in_sync(cluster, topic), message=f"{topic}: full ISRs")
    values = [f"{topic}-{i}".encode() for i in range(n)]
    with SyncProducer(bootstrap=cluster.bootstrap, acks="all") as producer:
        producer.send_many(topic, values)
        producer.flush()
    return values


def read_all(cluster: LocalCluster, topic: str, expected: int) -> list[bytes]:
    got: list[bytes] = []
    with SyncConsumer(topic, bootstrap=cluster.bootstrap, from_beginning=True) as consumer:
        wait_until(
            lambda: (
                got.extend(r.value for rs in consumer.poll(200).values() for r in rs)
                or len(got) >= expected
            ),
            message=f"{expected} records of {topic}",
        )
    return got


def restart_preferred_leader(cluster: LocalCluster, topic: str) -> int:
    """SIGTERM the preferred leader of partition 0 and start it again once leadership
    moved away; returns its id."""
    victim = partitions(cluster, topic)[0].replicas[0]
    cluster.stop_node(victim)
    wait_until(
        lambda: all(p.leader != victim for p in partitions(cluster, topic)),
        message=f"leadership off broker {victim}",
    )
    wait_until(lambda: not all_in_sync(cluster, topic), message="a shrunk ISR")
    cluster.start_node(victim)
    return victim


def test_manual_preferred_election_and_under_replicated_counts(cluster_factory) -> None:  # noqa: ANN001
    cluster = leadership_cluster(cluster_factory, **{"auto.leader.rebalance.enable": False})
    values = create_and_fill(cluster, "t", 3, 300)
    victim = partitions(cluster, "t")[0].replicas[0]
    cluster.stop_node(victim)
    wait_until(
        lambda: all(p.leader != victim for p in partitions(cluster, "t")),
        message=f"leadership off broker {victim}",
    )

    # While a broker is down every partition (RF 3 over 3 brokers) is under-replicated.
    def counts() -> tuple[int, int]:
        described = rillet_json(cluster, "topic", "describe", "t")
        return described["under_replicated_partitions"], cluster_status(cluster)["partitions"][
            "under_replicated"
        ]

    wait_until(lambda: counts() == (3, 3), message="3 under-replicated partitions")
    only = rillet_json(cluster, "topic", "describe", "--under-replicated-partitions")
    assert [len(t["partitions"]) for t in only["topics"]] == [3]
    status = cluster_status(cluster)
    assert status["controller_id"] == CONTROLLER and status["partitions"]["offline"] == 0
    assert any(n["state"] == "active controller" for n in status["nodes"])

    cluster.start_node(victim)
    wait_until(lambda: all_in_sync(cluster, "t"), message=f"broker {victim} back in the ISRs")
    wait_until(lambda: counts() == (0, 0), message="no under-replicated partition")
    only = rillet_json(cluster, "topic", "describe", "--under-replicated-partitions")
    assert only["topics"] == []
    # Auto-rebalance is off: the returning broker leads nothing until asked.
    assert all(p.leader != victim for p in partitions(cluster, "t"))

    out = rillet_json(cluster, "leader", "elect", "--preferred")
    assert out["failed"] == [] and "t-0" in out["elected"]
    assert preferred_lead(cluster, "t")
    again = rillet_json(cluster, "leader", "elect", "--preferred", "t", "--partition", "0")
    assert again == {"elected": [], "not_needed": ["t-0"], "failed": []}
    assert sorted(read_all(cluster, "t", len(values))) == sorted(values)


def test_automatic_rebalance_returns_leadership(cluster_factory) -> None:  # noqa: ANN001
    cluster = leadership_cluster(cluster_factory, **{"leader.imbalance.check.interval.ms": 300})
    create_and_fill(cluster, "auto", 3, 50)
    victim = restart_preferred_leader(cluster, "auto")
    # No election is asked for: the controller's tick finds broker `victim` leading none
    # of its preferred partitions (100% > 10%) once it is back in their ISRs.
    wait_until(
        lambda: preferred_lead(cluster, "auto"),
        message=f"broker {victim} leading its preferred partitions again",
    )


def test_reassign_to_a_broker_that_joined_later(cluster_factory, tmp_path: Path) -> None:  # noqa: ANN001
    cluster = leadership_cluster(cluster_factory)
    values = create_and_fill(cluster, "moves", 1, 500, assignments={0: [1, 2]})
    new = cluster.add_broker()
    assert new.node_id == 4 and pid_alive(new.pid)
    cluster.wait_ready()

    # With broker 4 down the move cannot finish: --status shows it running, --cancel
    # puts the original replicas back.
    cluster.stop_node(4)
    args = ("--topic", "moves", "--partition", "0")
    rillet(cluster, "partition", "reassign", *args, "--replicas", "4,2")
    status = rillet_json(cluster, "partition", "reassign", "--status", *args, "--replicas", "4,2")
    running = status["partitions"][0]
    assert not status["complete"] and running["state"] == "in_progress"
    assert (running["replicas"], running["adding"], running["removing"]) == ([4, 2, 1], [4], [1])
    rillet(cluster, "partition", "reassign", "--cancel", *args)
    # As in Kafka, cancelling drops the adding replicas from the list: the original set,
    # in the order it had inside the reassignment.
    wait_until(lambda: partitions(cluster, "moves")[0].replicas == (2, 1), message="cancelled")
    cluster.start_node(4)
    cluster.wait_ready()

    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": "moves", "partition": 0, "replicas": [4, 2]}]}
        )
    )
    started = rillet_json(cluster, "partition", "reassign", "--plan", str(plan), "--wait")
    assert started["previous"]["partitions"][0]["replicas"] == [2, 1]
    assert started["partitions"][0]["state"] == "complete"
    status = rillet_json(
        cluster,
        "partition",
        "reassign",
        "--status",
        "--topic",
        "moves",
        "--partition",
        "0",
        "--replicas",
        "4,2",
    )
    assert status["complete"] and status["partitions"][0]["replicas"] == [4, 2]

    # The dropped replica deletes its log; the new one holds it.
    old_log = cluster.node_dir(1) / "logs" / "moves-0"
    wait_until(lambda: not old_log.exists(), message=f"{old_log} deleted")
    assert (cluster.node_dir(4) / "logs" / "moves-0").is_dir()

    # Broker 4 leads (its preferred partition) and serves every record written before it
    # joined, plus new ones.
    rillet(cluster, "leader", "elect", "--preferred", "moves")
    wait_until(lambda: partitions(cluster, "moves")[0].leader == 4, message="broker 4 leads")
    with SyncProducer(bootstrap=cluster.bootstrap, acks="all") as producer:
        producer.send_many("moves", [b"after"])
        producer.flush()
    assert read_all(cluster, "moves", len(values) + 1) == [*values, b"after"]


def test_isr_expansions_of_many_partitions_are_batched(cluster_factory) -> None:  # noqa: ANN001
    """A broker that comes back rejoins the ISR of each of its 60 partitions through
    AlterPartition requests of its leaders, many partitions per request (each request
    logged once, with its counts), not one request and log line per partition."""
    cluster = leadership_cluster(cluster_factory, **{"auto.leader.rebalance.enable": False})
    with SyncAdmin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("many", 60, 3)])
    wait_until(lambda: all_in_sync(cluster, "many"), message="many: full ISRs")
    victim = 3
    cluster.stop_node(victim)
    wait_until(
        lambda: all(victim not in p.isr for p in partitions(cluster, "many")),
        message=f"broker {victim} out of every ISR",
    )
    node_logs = {b: cluster.node_dir(b) / "node.log" for b in BROKERS if b != victim}
    offsets = {b: path.stat().st_size for b, path in node_logs.items()}
    cluster.start_node(victim)
    wait_until(lambda: all_in_sync(cluster, "many"), message=f"broker {victim} back in the ISRs")

    requests, accepted = 0, 0
    for b, path in node_logs.items():
        with open(path, "rb") as f:
            f.seek(offsets[b])
            text = f.read().decode(errors="replace")
        assert "proposing ISR" not in text
        for match in re.finditer(r"AlterPartition: (\d+) partitions: (\d+) accepted", text):
            requests += 1
            accepted += int(match.group(2))
    assert accepted >= 60  # every partition's expansion went through a logged request
    assert requests < accepted
