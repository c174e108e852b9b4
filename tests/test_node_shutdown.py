"""SIGTERM ends a node even when the nodes it would wait for are gone: a broker's
controlled shutdown gives up after ``controlled.shutdown.timeout.ms`` and the broker
stops anyway, and a second SIGTERM (or SIGINT) cuts any such wait short at once. Real
processes; deadlines are generous waits, not timing assertions."""

from __future__ import annotations

import signal

import pytest
from cluster import ClusterFactory
from helpers import wait_until

from rillet.tools.local_cluster import LocalCluster, pid_alive

pytestmark = pytest.mark.cluster

EXIT_TIMEOUT_S = 60.0


def wait_exited(cluster: LocalCluster, node_id: int) -> str:
    """Wait until the node's process has exited; its log."""
    node = cluster.nodes[node_id]
    wait_until(
        lambda: not pid_alive(node.pid),
        timeout=EXIT_TIMEOUT_S,
        message=lambda: f"node {node_id} to exit; log:\n{cluster.log_tail(node_id)}",
    )
    return cluster.log_tail(node_id, 200)


def test_sigterm_stops_a_broker_whose_controllers_are_gone(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(
        controllers=1, brokers=1, overrides={"controlled.shutdown.timeout.ms": 2000}
    )
    cluster.stop_node(101, kill=True)
    cluster.signal_node(1, signal.SIGTERM)
    log = wait_exited(cluster, 1)
    assert "controlled shutdown timed out" in log
    assert "broker 1 stopped" in log  # and the logs were closed cleanly


def test_a_second_signal_cuts_a_broker_shutdown_short(cluster_factory: ClusterFactory) -> None:
    # The controlled shutdown alone would wait ten minutes for the dead controller.
    cluster = cluster_factory(
        controllers=1, brokers=1, overrides={"controlled.shutdown.timeout.ms": 600_000}
    )
    cluster.stop_node(101, kill=True)
    cluster.signal_node(1, signal.SIGTERM)
    wait_until(
        lambda: "stopping (SIGTERM)" in cluster.log_tail(1),
        message=lambda: f"the broker to start stopping; log:\n{cluster.log_tail(1)}",
    )
    cluster.signal_node(1, signal.SIGINT)
    log = wait_exited(cluster, 1)
    assert "controlled shutdown cut short" in log
    assert "broker 1 stopped" in log  # closing the logs is quick: it still happened
