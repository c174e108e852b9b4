"""Console fixtures: a ``rillet console`` process and Debian's Chromium driven by
Playwright (its Python package drives the system browser; it downloads none).

Without Chromium the browser tests skip and say how to install it; `.ci/run` installs
it so CI always runs them. Screenshots go to ``RILLET_ARTIFACTS`` (default
test-artifacts/ at the repository root), kept after the run as test artifacts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ServerProcess, start_server_process

REPO = Path(__file__).resolve().parent.parent
INSTALL_HINT = "apt-get update && apt-get install -y chromium"
# Flags for a root, headless, offline machine: no sandbox (root), and nothing that
# reaches for Google's hosts (this machine's closed network refuses them, slowly).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def artifacts_dir() -> Path:
    path = Path(os.environ.get("RILLET_ARTIFACTS", REPO / "test-artifacts")) / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_console(bootstrap: str, *extra: str) -> ServerProcess:
    """``rillet console`` on an ephemeral port; the caller stops it."""
    return start_server_process(
        [sys.executable, "-m", "rillet.client.cli", "console", "--bootstrap", bootstrap]
        + ["--port", "0", "--refresh", "1", *extra],
        port_pattern=r"console: serving http://127\.0\.0\.1:(\d+)",
        timeout=60,
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium_path()
    if path is None:
        pytest.skip(f"Chromium not installed; install it with: {INSTALL_HINT}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    p = context.new_page()
    try:
        yield p
    finally:
        context.close()


@contextlib.contextmanager
def console_cluster(data_dir: Path, controllers: int = 3, brokers: int = 3) -> Iterator[Any]:
    """A cluster on ephemeral ports for a console test module (3 controllers and 3
    brokers unless told), stopped (killed) on the way out whatever happened."""
    from rillet.tools.local_cluster import LocalCluster

    cluster = LocalCluster(data_dir, controllers=controllers, brokers=brokers, ephemeral_ports=True)
    try:
        cluster.start()
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop(kill=True, timeout_s=20)


@contextlib.contextmanager
def running_console(bootstrap: str, *extra: str) -> Iterator[str]:
    """``start_console`` as a context: yields the console's base URL, stops it after."""
    server = start_console(bootstrap, *extra)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()
