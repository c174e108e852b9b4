"""`rillet cluster ...` as a user runs it: real subprocesses, a detached cluster managed
by later invocations through its data dir, and `rillet cluster up` in the foreground with
other commands acting on the same cluster from "another terminal": whatever the sequence
of up / stop / start / down, Ctrl-C (through a real pseudo-terminal) or kill -9 of the
foreground, no node process of the cluster is left running untracked."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
from helpers import ServerProcess, start_server_process, wait_until

from rillet.tools import cluster_cli, local_cluster, local_s3
from rillet.tools.local_cluster import ClusterError, LocalCluster, write_config

pytestmark = pytest.mark.cluster

RILLET = [sys.executable, "-m", "rillet.client.cli"]
UP_TIMEOUT_S = 120.0  # generous: two busy cores


def rillet(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RILLET, *args], capture_output=True, text=True, timeout=180, check=check
    )


def status(data_dir: Path) -> dict:
    """The --json status, whatever the health (exit 1: unhealthy, 2: no broker answers,
    as when every node is stopped)."""
    proc = rillet("cluster", "status", "--data-dir", str(data_dir), "--json", check=False)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return json.loads(proc.stdout)


def states(data_dir: Path) -> dict[int, str]:
    return {n["node_id"]: n["state"] for n in status(data_dir)["nodes"]}


def cluster_processes(data_dir: Path) -> list[int]:
    """Running processes (not zombies) with the cluster's data dir in their command line:
    its nodes, and any rillet command acting on it."""
    needle = os.fsencode(str(data_dir.resolve()))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and not zombie(int(entry)):
            found.append(int(entry))
    return found


def zombie(pid: int) -> bool:
    """Exited, not yet reaped by whoever adopted it (or gone already)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


@pytest.fixture
def data_dir(tmp_path: Path):
    d = tmp_path / "cluster"
    yield d
    if (d / "cluster.json").exists():  # always stop what the test started
        rillet("cluster", "down", "--data-dir", str(d), "--kill", check=False)
    for pid in cluster_processes(d):  # and what escaped it: the test fails anyway
        os.kill(pid, signal.SIGKILL)


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

    down = rillet("cluster", "down", "--data-dir", str(data_dir))
    assert "stopping the cluster: brokers first" in down.stderr  # before the wait
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


def states_and_pids(data_dir: Path) -> dict[int, tuple[str, int | None]]:
    return {n["node_id"]: (n["state"], n["pid"]) for n in status(data_dir)["nodes"]}


class Foreground:
    """`rillet cluster up` run as a user runs it: in the foreground of a terminal (a
    real pseudo-terminal, so Ctrl-C is the terminal's SIGINT to its foreground group)."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        argv = [*RILLET, "cluster", "up", "--ephemeral-ports", "--data-dir", str(data_dir)]
        pid, fd = pty.fork()
        if pid == 0:  # the child: a 40x120 terminal, then exec
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            os.execv(sys.executable, [*argv, *args])
        self.pid, self.fd = pid, fd
        self.output = bytearray()
        self.returncode: int | None = None
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        # Read all the time: a full terminal buffer would block the command.
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO once the child is gone
                return
            if not chunk:
                return
            self.output += chunk

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def wait_up(self) -> None:
        wait_until(
            lambda: "rillet cluster is up" in self.text or self.poll() is not None,
            timeout=UP_TIMEOUT_S,
            message=lambda: f"the cluster to come up; output:\n{self.text[-3000:]}",
        )
        assert self.poll() is None, self.text

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float = UP_TIMEOUT_S) -> int:
        wait_until(
            lambda: self.poll() is not None,
            timeout=timeout,
            message=lambda: f"`cluster up` to exit; output:\n{self.text[-3000:]}",
        )
        assert self.returncode is not None
        return self.returncode

    def close(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait()
        os.close(self.fd)


def test_ctrl_c_stops_a_node_restarted_from_another_terminal(data_dir: Path) -> None:
    """The issue's sequence: node 2 killed and started again by other commands while
    `cluster up` runs; Ctrl-C on `cluster up` must stop it too (it re-reads the state)."""
    up = Foreground(data_dir, "--controllers", "1", "--brokers", "2")
    try:
        up.wait_up()
        d = str(data_dir)
        first = states_and_pids(data_dir)[2][1]
        rillet("cluster", "stop", "2", "--kill", "--data-dir", d)
        rillet("cluster", "start", "2", "--data-dir", d)
        restarted = states_and_pids(data_dir)[2]
        assert restarted[1] not in (None, first)
        up.ctrl_c()
        assert up.wait() == 0, up.text
        assert "stopped." in up.text
    finally:
        up.close()
    assert cluster_processes(data_dir) == []
    assert states_and_pids(data_dir) == {
        1: ("stopped", None),
        2: ("stopped", None),
        101: ("stopped", None),
    }
    down = rillet("cluster", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0


def test_nodes_stop_when_the_foreground_command_is_killed(data_dir: Path) -> None:
    """kill -9 of `cluster up` (or its terminal gone) leaves no node running, including
    one started by `cluster start` from another terminal; the same cluster then comes up
    again, and `cluster down` from another terminal stops it and ends `cluster up`."""
    d = str(data_dir)
    up = Foreground(data_dir, "--controllers", "1", "--brokers", "1")
    try:
        up.wait_up()
        rillet("cluster", "stop", "1", "--data-dir", d)
        rillet("cluster", "start", "1", "--data-dir", d)
        os.kill(up.pid, signal.SIGKILL)
        up.wait()
    finally:
        up.close()
    wait_until(
        lambda: cluster_processes(data_dir) == [],
        timeout=UP_TIMEOUT_S,
        message=lambda: f"the nodes to exit; still running: {cluster_processes(data_dir)}",
    )
    assert {state for state, _ in states_and_pids(data_dir).values()} == {"stopped"}

    again = Foreground(data_dir)  # the same cluster, from its cluster.json
    try:
        again.wait_up()
        rillet("cluster", "down", "--data-dir", d)
        assert again.wait() == 0, again.text
        assert "stopped (or taken over) by another" in again.text
    finally:
        again.close()
    assert cluster_processes(data_dir) == []


def waiting_for_a_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked on a file lock (/proc/locks lists waiters with
    an arrow)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and str(pid) in fields:
            return True
    return False


def test_cluster_commands_wait_for_each_other(data_dir: Path) -> None:
    """Every command that changes cluster.json holds its lock: a `cluster start` while
    another command holds it waits, then acts on what that one wrote."""
    d = str(data_dir)
    rillet(
        "cluster", "up", "--detach", "--ephemeral-ports", "--controllers", "1",
        "--brokers", "1", "--data-dir", d,
    )  # fmt: skip
    rillet("cluster", "stop", "1", "--data-dir", d)
    fd = os.open(data_dir / "cluster.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        start = subprocess.Popen(
            [*RILLET, "cluster", "start", "1", "--data-dir", d],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: waiting_for_a_lock(start.pid), message="`cluster start` to wait")
        assert states_and_pids(data_dir)[1] == ("stopped", None)  # nothing started meanwhile
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    _, err = start.communicate(timeout=UP_TIMEOUT_S)
    assert start.returncode == 0, err
    assert states_and_pids(data_dir)[1][0] != "stopped"


def test_cluster_up_on_a_port_in_use_says_so_and_starts_nothing(data_dir: Path) -> None:
    import socket

    from rillet.tools.local_cluster import LocalCluster

    planned = LocalCluster(data_dir, controllers=1, brokers=1, ephemeral_ports=True)
    planned.save()  # `cluster up` restarts this layout: controller 101 on a fixed port
    port = planned.nodes[101].controller_port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        up = rillet("cluster", "up", "--detach", "--data-dir", str(data_dir), check=False)
    assert up.returncode == 1 and "Traceback" not in up.stderr, up.stderr
    assert f"port(s) {port} already in use" in up.stderr, up.stderr
    assert not (data_dir / "node-101").exists()  # no node was started


def test_stopping_the_cluster_spares_a_process_that_only_names_a_node_config(
    tmp_path: Path,
) -> None:
    """The /proc scan for nodes that went unrecorded matches a node's command line, not
    any process naming its config file (`less node-1/config.toml` was SIGTERMed)."""
    cluster = LocalCluster(tmp_path / "c", controllers=1, brokers=1)
    with cluster.locked():
        config = cluster.node_dir(1) / "config.toml"
        config.parent.mkdir(parents=True)
        write_config(config, cluster.config_for(cluster.nodes[1]))
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    viewer = subprocess.Popen([*sleep, str(config)])
    stray = subprocess.Popen([*sleep, "-m", "rillet.client.cli", "broker", "--config", str(config)])
    try:
        wait_until(lambda: str(config).encode() in Path(f"/proc/{stray.pid}/cmdline").read_bytes())
        assert cluster._strays() == {stray.pid: 1}
        cluster.stop(timeout_s=30)
        assert stray.wait(timeout=30) is not None  # the stray node was stopped
        assert viewer.poll() is None  # the viewer runs on
    finally:
        for proc in (viewer, stray):
            proc.kill()
            proc.wait()


def test_a_node_that_exits_before_its_start_time_is_read_is_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node recorded without its start time stands for whatever process gets its pid
    next: `cluster down` would signal that one. A start time that cannot be read means
    the node already exited (or is a zombie): it is recorded as not running."""
    cluster = LocalCluster(tmp_path / "c", controllers=1, brokers=1, python="/bin/false")
    monkeypatch.setattr(local_cluster, "process_start_time", lambda pid: None)
    with pytest.raises(ClusterError, match="exited during start-up"):
        cluster.start_node(101, timeout_s=30)
    state = json.loads((tmp_path / "c" / "cluster.json").read_text())
    recorded = {n["node_id"]: n["pid"] for n in state["nodes"]}
    assert recorded[101] is None


def s3_client(endpoint: str):  # noqa: ANN201 - a boto3 S3 client
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def s3_servers(data_dir: Path) -> list[int]:
    """Running embedded S3 servers of the cluster in ``data_dir``."""
    return [
        pid
        for pid in cluster_processes(data_dir)
        if b"rillet.tools.local_s3" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def test_cluster_up_runs_an_s3_server_that_brokers_tier_to_and_down_stops_it(
    data_dir: Path,
) -> None:
    """The embedded remote tier: one S3 server process beside the nodes, every broker
    configured for it (controllers know no such key), stopped by `cluster down`; the
    objects it holds are back after `cluster down` and `cluster up` (brokers name them
    in the metadata log, which survives too), even after `cluster down --kill`."""
    d = str(data_dir)
    up = ["cluster", "up", "--detach", "--json", "--ephemeral-ports", "--data-dir", d]
    info = json.loads(rillet(*up, "--controllers", "1", "--brokers", "2").stdout)
    s3 = info["s3"]
    assert s3["embedded"] and s3["state"] == "running"
    assert s3_servers(data_dir) == [s3["pid"]]
    assert status(data_dir)["s3"] == s3
    for broker in (1, 2):
        config = (data_dir / f"node-{broker}" / "config.toml").read_text()
        assert '"remote.log.storage.system.enable" = true' in config
        assert f'"remote.log.storage.s3.endpoint.url" = "{s3["endpoint"]}"' in config
        environ = Path(f"/proc/{status(data_dir)['nodes'][broker - 1]['pid']}/environ")
        assert b"AWS_ACCESS_KEY_ID=testing\0" in environ.read_bytes()
    assert "remote.log" not in (data_dir / "node-101" / "config.toml").read_text()

    client = s3_client(s3["endpoint"])
    client.create_bucket(Bucket="kept")
    client.put_object(Bucket="kept", Key="a/0.log", Body=b"segment", Metadata={"crc": "1"})
    rillet("cluster", "down", "--data-dir", d)
    assert cluster_processes(data_dir) == []
    assert status(data_dir)["s3"]["state"] == "stopped"

    again = json.loads(rillet(*up).stdout)
    assert again["s3"]["endpoint"] == s3["endpoint"]  # the brokers' endpoint is fixed
    client = s3_client(s3["endpoint"])
    got = client.get_object(Bucket="kept", Key="a/0.log")
    assert got["Body"].read() == b"segment" and got["Metadata"] == {"crc": "1"}
    # --kill crashes the nodes; the S3 server's objects are on disk.
    client.put_object(Bucket="kept", Key="a/1.log", Body=b"more")
    rillet("cluster", "down", "--kill", "--data-dir", d)
    assert cluster_processes(data_dir) == []
    stored = local_s3.stored_objects(data_dir / "s3")
    assert sorted(entry["key"] for entry, _ in stored) == ["a/0.log", "a/1.log"]


def test_cluster_up_with_no_s3_starts_no_s3_server(data_dir: Path) -> None:
    d = str(data_dir)
    up = ["cluster", "up", "--detach", "--json", "--ephemeral-ports", "--data-dir", d]
    info = json.loads(rillet(*up, "--controllers", "1", "--brokers", "1", "--no-s3").stdout)
    assert info["s3"] is None
    assert s3_servers(data_dir) == [] and not (data_dir / "s3").exists()
    assert "remote.log" not in (data_dir / "node-1" / "config.toml").read_text()
    text = rillet("cluster", "status", "--data-dir", d).stdout
    assert "remote tier: off" in text


def up_args(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cluster_cli.register(parser.add_subparsers())
    return parser.parse_args(["cluster", "up", *args])


def test_an_s3_endpoint_is_given_to_the_brokers_and_starts_no_server(tmp_path: Path) -> None:
    args = up_args("--s3-endpoint", "http://minio:9000", "--s3-bucket", "b1", "--s3-region", "r")
    tier = cluster_cli._s3_for_up(args)
    assert tier is not None and not tier.embedded
    cluster = LocalCluster(tmp_path / "c", controllers=1, brokers=1, s3=tier)
    config = cluster.config_for(cluster.nodes[1])
    assert config["remote.log.storage.s3.endpoint.url"] == "http://minio:9000"
    assert config["remote.log.storage.s3.bucket"] == "b1"
    assert config["remote.log.storage.s3.region"] == "r"
    assert config["remote.log.storage.system.enable"] is True
    # The user's own settings win over the tool's.
    cluster.overrides["remote.log.storage.s3.bucket"] = "b2"
    assert cluster.config_for(cluster.nodes[1])["remote.log.storage.s3.bucket"] == "b2"
    assert cluster.s3_status()["state"] == "external"  # type: ignore[index]
    cluster.start_node(101, timeout_s=60)
    try:
        assert cluster._s3_strays() == [] and not (tmp_path / "c" / "s3").exists()
    finally:
        cluster.stop(kill=True)


def test_without_moto_cluster_up_says_how_to_get_it_and_runs_with_no_tier(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(local_s3, "moto_server_available", lambda: False)
    assert cluster_cli._s3_for_up(up_args()) is None
    assert "pip install 'rillet[s3]'" in capsys.readouterr().err
    assert cluster_cli._s3_for_up(up_args("--s3-endpoint", "http://s3:9000")) is not None


def start_local_s3(data_dir: Path) -> ServerProcess:
    """The embedded S3 server on its own (no cluster), on an ephemeral port."""
    return start_server_process(
        local_s3.command(sys.executable, 0, data_dir),
        port_pattern=r'"S3": "http://127\.0\.0\.1:(\d+)"',
        timeout=60,
    )


def test_the_embedded_s3_server_keeps_what_it_acknowledged_through_a_kill_9(
    tmp_path: Path,
) -> None:
    """Every change S3 answered 200 is on disk before the answer: a SIGKILL right after
    loses none of it (brokers delete their local copies once a PUT is answered)."""
    d = tmp_path / "s3"
    server = start_local_s3(d)
    try:
        client = s3_client(f"http://127.0.0.1:{server.port}")
        client.create_bucket(Bucket="tier")
        client.put_object(Bucket="tier", Key="t/0/a.log", Body=b"segment", Metadata={"c": "1"})
        client.put_object(Bucket="tier", Key="t/0/b.log", Body=b"gone soon")
        client.put_object(Bucket="tier", Key="t/0/c.log", Body=b"gone too")
        client.put_object(Bucket="tier", Key="t/0/a.log", Body=b"rewritten", Metadata={"c": "2"})
        client.delete_object(Bucket="tier", Key="t/0/b.log")
        client.delete_objects(Bucket="tier", Delete={"Objects": [{"Key": "t/0/c.log"}]})
        server.proc.kill()
        server.proc.wait()
        server = start_local_s3(d)
        client = s3_client(f"http://127.0.0.1:{server.port}")
        listed = client.list_objects_v2(Bucket="tier").get("Contents", [])
        assert [o["Key"] for o in listed] == ["t/0/a.log"]
        got = client.get_object(Bucket="tier", Key="t/0/a.log")
        assert got["Body"].read() == b"rewritten" and got["Metadata"] == {"c": "2"}
    finally:
        server.stop()


def test_closing_the_embedded_s3_gate_does_not_wait_forever_for_a_stuck_request() -> None:
    """A request stuck inside moto (a client that stalls its body) must not hold the
    server's stop forever: the wait is bounded, and the request is refused afterwards."""
    inside, release = threading.Event(), threading.Event()

    def app(environ: dict, start_response: object) -> list[bytes]:
        inside.set()
        release.wait()
        return [b""]

    gate = local_s3._Gate(app)
    stuck = threading.Thread(target=gate, args=({}, lambda *a: None), daemon=True)
    stuck.start()
    try:
        assert inside.wait(30)
        assert gate.close(timeout_s=0.05) is False  # gave up waiting: still inside
        answers: list[str] = []
        gate({}, lambda status, headers: answers.append(status))
        assert answers == ["503 Service Unavailable"]
    finally:
        release.set()
        stuck.join(30)


def test_the_embedded_s3_server_takes_an_earlier_versions_snapshot_into_its_store(
    tmp_path: Path,
) -> None:
    """Earlier versions wrote the objects at a clean stop only, as one snapshot: a data
    directory from them keeps its objects."""
    d = tmp_path / "s3"
    (d / "snapshot").mkdir(parents=True)
    (d / "snapshot" / "0").write_bytes(b"old segment")
    entry = {"bucket": "tier", "key": "t/0.log", "file": "0", "metadata": {"c": "1"}}
    index = {"buckets": ["tier"], "objects": [{**entry, "content_type": None}]}
    (d / "snapshot" / "objects.json").write_text(json.dumps(index))
    server = start_local_s3(d)
    try:
        assert not (d / "snapshot").exists()
        assert [e["key"] for e, _ in local_s3.stored_objects(d)] == ["t/0.log"]
        got = s3_client(f"http://127.0.0.1:{server.port}").get_object(Bucket="tier", Key="t/0.log")
        assert got["Body"].read() == b"old segment" and got["Metadata"] == {"c": "1"}
    finally:
        server.stop()
