"""`rillet cluster up` starts the web console beside the nodes: its URL is printed, it
serves the cluster, and it stops with the cluster (`cluster down`, or the foreground
command's exit however it exits), as the nodes and the S3 server do."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest
from helpers import wait_until
from test_cluster_cli import (  # noqa: F401
    UP_TIMEOUT_S,
    Foreground,
    data_dir,
    rillet,
    status,
    up_args,
)

from rillet.tools import cluster_cli
from rillet.tools.local_cluster import LocalCluster, process_is

pytestmark = pytest.mark.cluster

SMALL = ("--controllers", "1", "--brokers", "1", "--no-s3")


def console_state(d: Path) -> dict | None:
    return json.loads((d / "cluster.json").read_text()).get("console")


def page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def test_cluster_up_serves_the_console_and_down_stops_it(data_dir: Path) -> None:  # noqa: F811
    d = str(data_dir)
    up = ["cluster", "up", "--detach", "--json", "--ephemeral-ports", "--data-dir", d, *SMALL]
    info = json.loads(rillet(*up).stdout)
    url = info["console"]
    assert url.startswith("http://127.0.0.1:")
    assert 'data-broker="1"' in page(url + "/")
    state = console_state(data_dir)
    assert state is not None and state["url"] == url
    pid, start_time = state["pid"], state["start_time"]
    assert process_is(pid, start_time)
    # It reads the broker's /metrics (bytes out), at the address the broker reported.
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    broker = next(n for n in status(data_dir)["nodes"] if n["node_id"] == 1)
    assert argv[argv.index(b"--metrics") + 1].decode() == "1=" + broker["metrics"].removeprefix(
        "http://"
    ).removesuffix("/metrics")

    rillet("cluster", "down", "--data-dir", d)
    assert not process_is(pid, start_time)
    assert console_state(data_dir) is None


def test_no_console_starts_none(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", controllers=1, brokers=1)  # never started
    assert cluster_cli._start_console(up_args("--no-console"), cluster) is None
    assert cluster.console is None and not (tmp_path / "cluster").exists()


def test_the_console_stops_when_the_foreground_command_is_killed(data_dir: Path) -> None:  # noqa: F811
    up = Foreground(data_dir, *SMALL)
    try:
        up.wait_up()
        assert "console: http://127.0.0.1:" in up.text
        state = console_state(data_dir)
        assert state is not None and process_is(state["pid"], state["start_time"])
        os.kill(up.pid, signal.SIGKILL)
        up.wait()
    finally:
        up.close()
    wait_until(
        lambda: not process_is(state["pid"], state["start_time"]),
        timeout=UP_TIMEOUT_S,
        message="the console to exit with its owner",
    )
