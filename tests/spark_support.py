"""What the Spark cluster test modules share: their skip marker and their cluster."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from cluster import combined_nodes

from rillet.tools.local_cluster import LocalCluster

NEEDS_JAVA = pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs Java 17 (apt-get install openjdk-17-jre-headless)",
)


def module_cluster(factory: pytest.TempPathFactory, name: str) -> Iterator[LocalCluster]:
    """Three combined nodes a module shares (its tests have their own topics), stopped
    when the module is done: ``yield from`` it in a module fixture. A restarted node
    keeps its broker port, so the module's bootstrap stays whole."""
    for cluster in combined_nodes(factory.mktemp(name), 3):
        cluster.keep_broker_ports()
        yield cluster
