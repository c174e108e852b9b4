"""The shared cluster fixture: real controller and broker processes on loopback.

Every cluster gets ephemeral ports and its own temporary directory, and is always
stopped, even when the test fails (then the tail of each node's log is printed, which
is usually all one needs to see why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rillet.tools.local_cluster import LocalCluster

ClusterFactory = Callable[..., LocalCluster]


def combined_nodes(path: Path, nodes: int, **options: Any) -> Iterator[LocalCluster]:
    """A started cluster of combined nodes (broker and controller voter each), stopped
    when the caller is done: for module-scoped fixtures (``yield from``)."""
    c = LocalCluster(
        path, controllers=nodes, brokers=nodes, combined=True, ephemeral_ports=True, **options
    )
    try:
        c.start()
        c.wait_ready()
        yield c
    finally:
        c.stop(kill=True, timeout_s=20)


@pytest.fixture
def cluster_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ClusterFactory]:
    made: list[LocalCluster] = []

    def make(
        controllers: int = 3,
        brokers: int = 3,
        *,
        combined: bool = False,
        overrides: dict[str, Any] | None = None,
        wait: bool = True,
        **kwargs: Any,
    ) -> LocalCluster:
        cluster = LocalCluster(
            tmp_path / f"cluster-{len(made)}",
            controllers=controllers,
            brokers=brokers,
            combined=combined,
            ephemeral_ports=True,
            overrides=overrides,
            **kwargs,
        )
        made.append(cluster)
        cluster.start()
        if wait:
            cluster.wait_ready()
        return cluster

    yield make
    failed = getattr(request.node, "rep_call", None)
    for cluster in made:
        if failed is not None and failed.failed:
            for node_id in sorted(cluster.nodes):
                print(f"\n--- node {node_id} log tail ---\n{cluster.log_tail(node_id)}")
            if cluster.s3 is not None and cluster.s3.embedded:
                print(f"\n--- S3 server log tail ---\n{cluster.s3_log_tail()}")
        cluster.stop(kill=True, timeout_s=20)


@pytest.fixture
def cluster(cluster_factory: ClusterFactory) -> LocalCluster:
    """3 controllers and 3 brokers, registered and unfenced."""
    return cluster_factory()
