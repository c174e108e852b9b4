"""`rillet cluster ...` as a user runs it: real subprocesses, a detached cluster managed
by later invocations through its data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

RILLET = [sys.executable, "-m", "rillet.client.cli"]


def rillet(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RILLET, *args], capture_output=True, text=True, timeout=180, check=check
    )


def status(data_dir: Path) -> dict:
    return json.loads(rillet("cluster", "status", "--data-dir", str(data_dir), "--json").stdout)


def states(data_dir: Path) -> dict[int, str]:
    return {n["node_id"]: n["state"] for n in status(data_dir)["nodes"]}


@pytest.fixture
def data_dir(tmp_path: Path):
    d = tmp_path / "cluster"
    yield d
    if (d / "cluster.json").exists():  # always stop what the test started
        rillet("cluster", "down", "--data-dir", str(d), "--kill", check=False)


def test_detached_cluster_is_managed_through_its_data_dir(data_dir: Path) -> None:
    up = rillet(
        "cluster",
        "up",
        "--detach",
        "--json",
        "--ephemeral-ports",
        "--controllers",
        "1",
        "--brokers",
        "2",
        "--data-dir",
        str(data_dir),
    )
    info = json.loads(up.stdout)
    assert len(info["bootstrap"].split(",")) == 2
    assert states(data_dir) == {1: "unfenced", 2: "unfenced", 101: "active controller"}
    pids = {n["node_id"]: n["pid"] for n in status(data_dir)["nodes"]}
    assert all(pids.values())

    again = rillet("cluster", "up", "--detach", "--data-dir", str(data_dir), check=False)
    assert again.returncode == 1 and "already running" in again.stderr

    rillet("cluster", "stop", "2", "--data-dir", str(data_dir))
    assert states(data_dir)[2] == "stopped"
    rillet("cluster", "start", "2", "--data-dir", str(data_dir))
    assert status(data_dir)["nodes"][1]["pid"] not in (None, pids[2])

    rillet("cluster", "down", "--data-dir", str(data_dir))
    assert set(states(data_dir).values()) == {"stopped"}
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_cluster_commands_explain_a_missing_cluster(tmp_path: Path) -> None:
    result = rillet("cluster", "status", "--data-dir", str(tmp_path / "none"), check=False)
    assert result.returncode == 1
    assert "no local cluster" in result.stderr and "Traceback" not in result.stderr


def test_set_gives_each_node_the_keys_its_roles_know(data_dir: Path) -> None:
    # A broker-only key and a controller-only key: each reaches only the nodes that know it
    # (a controller refused to start on the broker key).
    rillet(
        "cluster",
        "up",
        "--detach",
        "--ephemeral-ports",
        "--controllers",
        "1",
        "--brokers",
        "1",
        "--set",
        "log.retention.check.interval.ms=1000",
        "--set",
        "metadata.snapshot.max.records=5000",
        "--data-dir",
        str(data_dir),
    )
    assert states(data_dir) == {1: "unfenced", 101: "active controller"}
    broker = (data_dir / "node-1" / "config.toml").read_text()
    controller = (data_dir / "node-101" / "config.toml").read_text()
    assert "log.retention.check.interval.ms" in broker
    assert "log.retention.check.interval.ms" not in controller
    assert "metadata.snapshot.max.records" in controller
    assert "metadata.snapshot.max.records" not in broker


def test_set_refuses_a_key_no_role_knows_before_starting_anything(data_dir: Path) -> None:
    up = ["cluster", "up", "--detach", "--ephemeral-ports", "--data-dir", str(data_dir)]
    result = rillet(*up, "--set", "log.retention.chek.interval.ms=1000", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "unknown key log.retention.chek.interval.ms" in result.stderr
    assert "did you mean log.retention.check.interval.ms" in result.stderr
    assert not data_dir.exists()  # nothing planned, written or started
