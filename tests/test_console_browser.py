"""The console in a real headless Chromium against a real 3-broker cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import artifacts_dir, start_console
from helpers import ServerProcess

from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def console_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        Path(tmp_path_factory.mktemp("console")) / "cluster",
        controllers=3,
        brokers=3,
        ephemeral_ports=True,
    )
    try:
        cluster.start()
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop(kill=True, timeout_s=20)


@pytest.fixture(scope="module")
def console(console_cluster: LocalCluster) -> Iterator[str]:
    server: ServerProcess = start_console(console_cluster.bootstrap)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def test_overview_lists_the_three_brokers(console: str, page: Any) -> None:
    page.goto(console + "/")
    rows = page.locator("table.brokers tbody tr")
    rows.first.wait_for()
    assert rows.count() == 3
    page.screenshot(path=str(artifacts_dir() / "overview.png"), full_page=True)
