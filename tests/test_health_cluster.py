"""`rillet cluster status` on a real cluster (3 controllers, 3 brokers, short timings) as
it walks through the states: healthy (exit 0); a broker down, partitions under-replicated
but at min ISR (degraded, exit 0); a second broker down, under min ISR (exit 1); brokers
back (exit 0); the controller quorum without a majority (exit 1, "no active
controller"); and a cluster nobody answers for (exit 2)."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from helpers import run_cli, wait_until

from rillet.client.admin import NewTopic
from rillet.client.sync import SyncAdmin
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

BROKER_SETTINGS = {
    "replica.lag.time.max.ms": 1000,
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 100,
    "broker.heartbeat.interval.ms": 250,
}
CONTROLLER_SETTINGS = {"broker.session.timeout.ms": 2500, "broker.heartbeat.interval.ms": 250}
STATE_TIMEOUT_S = 60.0


def status(cluster: LocalCluster, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = run_cli(
        cluster.bootstrap, "cluster", "status", "--data-dir", str(cluster.data_dir),
        "--json", *extra, ok=False,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def reaches(cluster: LocalCluster, code: int, **counts: int) -> dict[str, Any]:
    """Wait until status exits ``code`` with these health counts; the last answer."""
    seen: list[Any] = []

    def check() -> bool:
        got, out = status(cluster)
        seen[:] = [got, out]
        health = out["health"] or {}
        return got == code and all(health.get(k) == v for k, v in counts.items())

    wait_until(check, timeout=STATE_TIMEOUT_S, message=lambda: f"exit {code} {counts}: {seen}")
    return seen[1]


def test_status_walks_through_health_states(cluster_factory) -> None:  # noqa: ANN001
    overrides: dict[int, dict[str, Any]] = {b: dict(BROKER_SETTINGS) for b in (1, 2, 3)}
    for c in (101, 102, 103):
        overrides[c] = dict(CONTROLLER_SETTINGS)
    cluster: LocalCluster = cluster_factory(controllers=3, brokers=3, node_overrides=overrides)
    with SyncAdmin(cluster.bootstrap, timeout_ms=30_000) as admin:
        admin.create_topics([NewTopic("h", 3, 3, {"min.insync.replicas": "2"})])
        (entry,) = admin.describe_configs(["h"], keys=["min.insync.replicas"])["h"].values()
        assert (entry.value, entry.source) == ("2", "TOPIC_CONFIG")
        assert len(admin.describe_quorum().voters) == 3

    out = reaches(cluster, 0, partitions=3, under_replicated=0)
    assert out["healthy"] is True and out["status"] == "healthy"
    health = out["health"]
    assert health["quorum"]["leader_id"] in (101, 102, 103)
    assert sorted(v["id"] for v in health["quorum"]["voters"]) == [101, 102, 103]
    assert sum(b["leaders"] for b in health["brokers"]) == 3
    assert [b["partitions"] for b in health["brokers"]] == [3, 3, 3]
    assert [n["node_id"] for n in out["nodes"]] == [1, 2, 3, 101, 102, 103]
    text = run_cli(cluster.bootstrap, "cluster", "status", "--data-dir", str(cluster.data_dir))
    assert "HEALTHY" in text.stdout and "controller quorum" in text.stdout

    cluster.stop_node(3, kill=True)
    out = reaches(cluster, 0, under_replicated=3, under_min_isr=0)
    assert out["status"] == "degraded" and out["healthy"] is True
    assert {p["problem"] for p in out["health"]["problem_partitions"]} == {"under-replicated"}

    cluster.stop_node(2, kill=True)
    out = reaches(cluster, 1, under_min_isr=3, offline=0)
    assert out["healthy"] is False
    assert "3 partition(s) under min ISR" in out["health"]["problems"]
    # --bootstrap: the same verdict for any cluster, without the process table.
    code, alone = status(cluster, "--bootstrap", cluster.nodes[1].listeners["BROKER"])
    assert code == 1 and "nodes" not in alone and alone["health"]["under_min_isr"] == 3
    data_dir = str(cluster.data_dir)
    text = run_cli(cluster.bootstrap, "cluster", "status", "--data-dir", data_dir, ok=False)
    assert text.returncode == 1 and "UNHEALTHY" in text.stdout and "under-min-isr" in text.stdout

    cluster.start_node(2)
    cluster.start_node(3)
    back = reaches(cluster, 0, under_replicated=0, under_min_isr=0)

    # Two of three controllers gone: no majority, so no active controller.
    leader = back["health"]["quorum"]["leader_id"]
    for node in [leader, *(c for c in (101, 102, 103) if c != leader)][:2]:
        cluster.stop_node(node, kill=True)
    out = reaches(cluster, 1)
    assert "no active controller" in out["health"]["problems"]
    assert out["health"]["quorum"] is None and out["controller_id"] == -1


def test_an_unreachable_cluster_exits_2() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nobody = f"127.0.0.1:{port}"
    proc = run_cli(nobody, "cluster", "status", "--bootstrap", nobody, "--json", ok=False)
    assert proc.returncode == 2, proc.stderr
    out = json.loads(proc.stdout)
    assert out["healthy"] is False and out["status"] == "unreachable" and out["health"] is None
    assert "cannot reach the cluster" in proc.stderr and "Traceback" not in proc.stderr
    human = run_cli(nobody, "cluster", "status", "--bootstrap", nobody, ok=False)
    assert human.returncode == 2 and "cannot reach the cluster" in human.stderr
