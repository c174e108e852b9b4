"""What the Spark cluster test modules share: their skip marker and their cluster."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from cluster import combined_nodes

NEEDS_JAVA = pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs Java 17 (apt-get install openjdk-17-jre-headless)",
)


def module_cluster(factory: pytest.TempPathFactory, name: str) -> Iterator[str]:
    """The bootstrap of three combined nodes a module shares (its tests have their own
    topics), stopped when the module is done: ``yield from`` it in a module fixture."""
    for cluster in combined_nodes(factory.mktemp(name), 3):
        yield cluster.bootstrap
