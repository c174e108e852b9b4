"""A local multi-process cluster: the engine behind `rillet cluster ...` and the tests.

Each node is a real OS process started from a generated TOML config (the contract in
docs/architecture.md). A node prints one JSON readiness line on stdout once its
listeners are bound; we read it from the node's stdout file, which also works when the
cluster was started by another invocation (`cluster up --detach`, then `cluster down`).

Layout under ``data_dir``::

    cluster.json            nodes, roles, pids, listeners (the state other commands read)
    node-<id>/config.toml   the node's config
    node-<id>/stdout.log    readiness lines (appended on every start)
    node-<id>/node.log      the node's log (stderr)
    node-<id>/metadata/     a controller's Raft log        node-<id>/logs/  a broker's logs
    s3/                     the embedded S3 server: stdout.log, s3.log, its objects
                            (objects/, written through: tools/local_s3.py), when the
                            cluster runs one
    console/                the web console `cluster up` starts: stdout.log, console.log

Node ids: in separated mode brokers are 1..B and controllers 101..100+C; in combined
mode nodes 1..N run both roles. Default ports (non-ephemeral): broker i listens on
9092+2(i-1) and controller j on 9093+2(j-1), so 127.0.0.1:9092 is the bootstrap and
the even/odd split never collides. The embedded S3 server listens on 9080 (below them all).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rillet.broker.config import BROKER_LISTENER, broker_config_table, combined_config_table
from rillet.client.runtime.config import ConfigTable
from rillet.client.runtime.metrics_http import EPHEMERAL
from rillet.client.runtime.shutdown import OWNER_ENV, owner_value, process_start_time
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, R, RequestMessage, parse_address
from rillet.client.wire.errors import InvalidConfigError
from rillet.controller.config import controller_config_table
from rillet.tools import local_s3

T = TypeVar("T")

STATE_FILE = "cluster.json"
LOCK_FILE = "cluster.lock"
HAVE_PROC = os.path.exists("/proc/self/stat")
ZOMBIE_REAP_WAIT_S = 5.0
CONTROLLER_ID_BASE = 100
DEFAULT_BROKER_PORT = 9092
# Node i's /metrics (non-ephemeral): 9400 + node id, so brokers get 9401.. and
# controllers (ids 101..) 9501..
METRICS_PORT_BASE = 9400
DEFAULT_S3_PORT = 9080
DEFAULT_S3_BUCKET = "rillet-tier"
DEFAULT_S3_REGION = "us-east-1"
S3_DIR = "s3"
CONSOLE_DIR = "console"
DEFAULT_CONSOLE_PORT = 8080
CONSOLE_READY = re.compile(r"console: serving (http://\S+)")


class ClusterError(Exception):
    """The local cluster could not do what was asked; the message says why."""


@dataclass
class Node:
    node_id: int
    roles: list[str]
    controller_port: int | None  # fixed: voters must know it before anything starts
    broker_port: int | None  # 0 = ephemeral; the broker registers what it bound
    rack: str | None = None
    pid: int | None = None
    start_time: int | None = None  # of the process ``pid``: a recycled pid is not the node
    listeners: dict[str, str] = field(default_factory=dict)  # from the readiness line
    metrics_port: int = 0  # metrics.port: EPHEMERAL, or fixed (0: off, older clusters)
    metrics: str | None = None  # host:port of /metrics, from the readiness line
    stdout_offset: int = 0  # where this start's readiness line will appear in stdout.log

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles


@dataclass
class S3Tier:
    """The remote tier every broker of the cluster uses: the embedded S3 server (moto, one
    more process of the cluster on ``port``) or an external endpoint (the cluster starts
    nothing; boto3 finds credentials in the environment, as it would anywhere)."""

    endpoint: str
    bucket: str = DEFAULT_S3_BUCKET
    region: str = DEFAULT_S3_REGION
    port: int | None = None  # set: embedded, served on this fixed port
    pid: int | None = None
    start_time: int | None = None
    stdout_offset: int = 0

    @classmethod
    def embedded_on(cls, port: int, bucket: str = DEFAULT_S3_BUCKET) -> S3Tier:
        # Fixed for the cluster's life: brokers keep the endpoint, across S3 restarts too.
        return cls(f"http://127.0.0.1:{port}", bucket, DEFAULT_S3_REGION, port)

    @property
    def embedded(self) -> bool:
        return self.port is not None

    def broker_config(self) -> dict[str, Any]:
        return {
            "remote.log.storage.system.enable": True,
            "remote.log.storage.s3.endpoint.url": self.endpoint,
            "remote.log.storage.s3.bucket": self.bucket,
            "remote.log.storage.s3.region": self.region,
        }


def metrics_port(node_id: int, ephemeral: bool) -> int:
    return EPHEMERAL if ephemeral else METRICS_PORT_BASE + node_id


@dataclass
class ConsoleProcess:
    """The web console `cluster up` runs beside the nodes (``rillet console``): one more
    process of the cluster, recorded, owned and stopped as the S3 server is."""

    port: int  # asked for (0: the OS picks); ``url`` has the one bound
    host: str = "127.0.0.1"
    pid: int | None = None
    start_time: int | None = None
    url: str | None = None
    stdout_offset: int = 0


def free_port() -> int:
    """A port the OS considers free right now (a tiny race, acceptable for loopback tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def process_is(pid: int | None, start_time: int | None) -> bool:
    """Whether ``pid`` is running and is the process that started at ``start_time``
    (clock ticks since boot; None: not recorded). A zombie counts as gone: a node started
    by a command that has exited is reaped by whoever adopted it, maybe never."""
    if not pid_alive(pid):
        return False
    if not HAVE_PROC:
        return True
    started = process_start_time(pid)  # type: ignore[arg-type]
    return started is not None and start_time in (None, started)


def _run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even inside a running event loop."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, factory()).result()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def role_table(roles: Iterable[str]) -> ConfigTable:
    """The config keys a node with ``roles`` accepts (it refuses any other key)."""
    roles = set(roles)
    if {"broker", "controller"} <= roles:
        return combined_config_table()
    return broker_config_table() if "broker" in roles else controller_config_table()


# Keys the tool writes into each node's config itself: the same value on every node
# would break the cluster (one log directory for all brokers, one node id...).
MANAGED_KEYS = frozenset(
    {
        "node.id",
        "process.roles",
        "listeners",
        "controller.quorum.voters",
        "metadata.log.dir",
        "log.dirs",
        "broker.rack",
    }
)


def parse_settings(items: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items meant for every node, typed by the key that any role declares.
    A key no role knows, or one the tool sets per node, is refused here, before any node
    starts; each node later gets only the keys its own roles know (``config_for``)."""
    table = role_table(["broker", "controller"])  # every key of either role
    out: dict[str, Any] = {}
    for item in items:
        try:
            name, value = table.parse_override(item)
        except InvalidConfigError as e:
            raise ClusterError(str(e)) from None
        if name in MANAGED_KEYS:
            raise ClusterError(f"--set {name}: the local cluster sets it for each node itself")
        out[name] = value
    return out


def write_config(path: Path, values: dict[str, Any]) -> None:
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in values.items() if v is not None]
    path.write_text("\n".join(lines) + "\n")


class LocalCluster:
    """Start, stop and inspect a cluster of node processes on 127.0.0.1."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        controllers: int = 3,
        brokers: int = 3,
        combined: bool = False,
        ephemeral_ports: bool = False,
        overrides: dict[str, Any] | None = None,
        node_overrides: dict[int, dict[str, Any]] | None = None,
        racks: Iterable[str | None] | None = None,
        python: str = sys.executable,
        s3: S3Tier | bool | None = None,
        listeners: Sequence[str] = (BROKER_LISTENER,),
    ) -> None:
        """``s3``: the remote tier of every broker. True: an embedded S3 server on
        DEFAULT_S3_PORT (an ephemeral one with ``ephemeral_ports``); an S3Tier as given;
        None or False: no remote tier. ``listeners``: the names of every broker's
        listeners; the first binds the broker's port and is the one this tool talks to,
        the others bind ephemeral ports (advertised.listeners and
        inter.broker.listener.name go in ``overrides``)."""
        self.data_dir = Path(data_dir).resolve()
        self.listener_names = [name.upper() for name in listeners]
        if not self.listener_names or len(set(self.listener_names)) < len(listeners):
            raise ClusterError(f"listeners: distinct names wanted, not {list(listeners)}")
        self.overrides = dict(overrides or {})
        unknown = sorted(set(self.overrides) - set(role_table(["broker", "controller"]).keys))
        if unknown:  # filtered per role below, so it would be dropped silently
            raise ClusterError(f"overrides: no broker or controller knows {', '.join(unknown)}")
        self.node_overrides = {k: dict(v) for k, v in (node_overrides or {}).items()}
        self.python = python
        if s3 is True:
            s3 = S3Tier.embedded_on(free_port() if ephemeral_ports else DEFAULT_S3_PORT)
        self.s3: S3Tier | None = s3 or None
        self.console: ConsoleProcess | None = None
        self.nodes: dict[int, Node] = {}
        # The foreground `cluster up` whose exit stops the nodes: {"pid", "start_time"}.
        self.owner: dict[str, int | None] | None = None
        self._synced = False  # cluster.json is this cluster's (loaded or saved by us)
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        if controllers or brokers or combined:
            self._plan(controllers, brokers, combined, ephemeral_ports, list(racks or []))

    # --- planning --------------------------------------------------------------

    def _plan(
        self, controllers: int, brokers: int, combined: bool, ephemeral: bool, racks: list
    ) -> None:
        if controllers < 1 or brokers < (0 if combined else 1):
            raise ClusterError("a cluster needs at least one controller and one broker")
        if controllers % 2 == 0:
            raise ClusterError(f"{controllers} controllers: a Raft quorum wants an odd number")

        def port(base: int, i: int) -> int:
            return free_port() if ephemeral else base + 2 * i

        def metrics(node: Node) -> Node:
            node.metrics_port = metrics_port(node.node_id, ephemeral)
            return node

        if combined:
            count = max(controllers, brokers)
            for i in range(count):
                is_voter = i < controllers
                roles = ["broker", "controller"] if is_voter else ["broker"]
                cport = port(DEFAULT_BROKER_PORT + 1, i) if is_voter else None
                bport = 0 if ephemeral else DEFAULT_BROKER_PORT + 2 * i
                self._add(metrics(Node(i + 1, roles, cport, bport, _rack(racks, i))))
            return
        for i in range(brokers):
            bport = 0 if ephemeral else DEFAULT_BROKER_PORT + 2 * i
            self._add(metrics(Node(i + 1, ["broker"], None, bport, _rack(racks, i))))
        for j in range(controllers):
            cid = CONTROLLER_ID_BASE + j + 1
            cport = port(DEFAULT_BROKER_PORT + 1, j)
            self._add(metrics(Node(cid, ["controller"], cport, None)))

    def _add(self, node: Node) -> None:
        self.nodes[node.node_id] = node

    @property
    def voters(self) -> str:
        return ",".join(
            f"{n.node_id}@127.0.0.1:{n.controller_port}"
            for n in self.nodes.values()
            if n.is_controller
        )

    def node_dir(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}"

    def config_for(self, node: Node) -> dict[str, Any]:
        listeners = []
        if node.is_controller:
            listeners.append(f"CONTROLLER://127.0.0.1:{node.controller_port}")
        if node.is_broker:
            listeners.append(f"{self.listener_names[0]}://127.0.0.1:{node.broker_port}")
            listeners += [f"{name}://127.0.0.1:0" for name in self.listener_names[1:]]
        d = self.node_dir(node.node_id)
        values: dict[str, Any] = {
            "node.id": node.node_id,
            "process.roles": ",".join(node.roles),
            "listeners": ",".join(listeners),
            "controller.quorum.voters": self.voters,
            # Every node serves /metrics (an override such as metrics.port=0 wins).
            "metrics.port": node.metrics_port,
        }
        if node.is_controller:
            values["metadata.log.dir"] = str(d / "metadata")
        if node.is_broker:
            values["log.dirs"] = str(d / "logs")
            values["broker.rack"] = node.rack
            if self.s3 is not None:
                values.update(self.s3.broker_config())
        # Cluster-wide overrides reach only the nodes whose roles know the key (a broker
        # key would make a controller refuse to start); per-node ones are given as asked.
        known = role_table(node.roles).keys
        values.update({k: v for k, v in self.overrides.items() if k in known})
        values.update(self.node_overrides.get(node.node_id, {}))
        return {k: v for k, v in values.items() if v is not None}

    # --- state file ---------------------------------------------------------------
    #
    # Several commands act on one cluster at once (a foreground `cluster up` and a
    # `cluster start 2` from another terminal), so every change holds the lock on
    # cluster.lock, re-reads what the others changed (``refresh``), acts and writes.

    def save(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "nodes": [asdict(n) for n in self.nodes.values()],
            "overrides": self.overrides,
            "node_overrides": {str(k): v for k, v in self.node_overrides.items()},
            "listeners": self.listener_names,
            "python": self.python,
            "owner": self.owner,
            "s3": asdict(self.s3) if self.s3 is not None else None,
            "console": asdict(self.console) if self.console is not None else None,
        }
        tmp = self.data_dir / (STATE_FILE + f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.data_dir / STATE_FILE)
        self._synced = True

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cluster's lock (re-entrant): re-read the state, act, write it."""
        with self._thread_lock:
            if self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, or we die
                self._lock_depth = 1
                try:
                    self.refresh()
                    yield
                finally:
                    self._lock_depth = 0
                    if self._synced:  # never over another cluster's state: see start()
                        self.save()
            finally:
                os.close(fd)

    def refresh(self) -> None:
        """Take from cluster.json what other commands change: each node's process (pid,
        start time, listeners) and the owner. The plan and the overrides stay as this
        object has them. A new plan ignores a file it has not written yet."""
        path = self.data_dir / STATE_FILE
        if not self._synced or not path.exists():
            return
        state = json.loads(path.read_text())
        self.owner = state.get("owner")
        for raw in state["nodes"]:
            node = self.nodes.get(raw["node_id"])
            if node is None:  # added by another command
                self._add(Node(**raw))
                continue
            node.pid, node.start_time = raw.get("pid"), raw.get("start_time")
            node.listeners = dict(raw.get("listeners") or {})
            node.metrics = raw.get("metrics")
            node.stdout_offset = raw.get("stdout_offset", 0)
        raw_s3 = state.get("s3")
        if self.s3 is not None and raw_s3 is not None:
            self.s3.pid, self.s3.start_time = raw_s3.get("pid"), raw_s3.get("start_time")
            self.s3.stdout_offset = raw_s3.get("stdout_offset", 0)
        raw_console = state.get("console")
        self.console = ConsoleProcess(**raw_console) if raw_console else None

    # --- ownership ------------------------------------------------------------------
    #
    # A node started while a foreground `cluster up` owns the cluster (by that command,
    # or by `cluster start` from another terminal) watches that process and stops when
    # it exits, however it exits (client/runtime/shutdown.py); a node started with no
    # owner (`cluster up --detach`, the library) runs until stopped.

    def owned_by(self, pid: int) -> bool:
        owner = self.owner
        return (
            owner is not None
            and owner.get("pid") == pid
            and process_is(pid, owner.get("start_time"))
        )

    def _live_owner(self) -> dict[str, int | None] | None:
        owner = self.owner
        if owner is None or not process_is(owner.get("pid"), owner.get("start_time")):
            return None
        return owner

    @classmethod
    def load(cls, data_dir: str | Path) -> LocalCluster:
        path = Path(data_dir) / STATE_FILE
        if not path.exists():
            raise ClusterError(f"no local cluster in {data_dir} (no {STATE_FILE})")
        state = json.loads(path.read_text())
        cluster = cls(
            data_dir,
            controllers=0,
            brokers=0,
            overrides=state.get("overrides"),
            node_overrides={int(k): v for k, v in state.get("node_overrides", {}).items()},
            python=state.get("python", sys.executable),
            s3=S3Tier(**state["s3"]) if state.get("s3") else None,
            listeners=state.get("listeners") or (BROKER_LISTENER,),
        )
        for raw in state["nodes"]:
            cluster._add(Node(**raw))
        cluster.owner = state.get("owner")
        if state.get("console"):
            cluster.console = ConsoleProcess(**state["console"])
        cluster._synced = True
        return cluster

    # --- processes --------------------------------------------------------------

    def start(self, timeout_s: float = 60.0, *, owned: bool = False) -> None:
        """Start every node (controllers first) and wait for each readiness line. With
        ``owned``, this process owns the cluster: its exit stops every node."""
        with self.locked():
            self._refuse_running()
            pid = os.getpid()
            self.owner = {"pid": pid, "start_time": process_start_time(pid)} if owned else None
            order = sorted(self.nodes.values(), key=lambda n: (not n.is_controller, n.node_id))
            try:
                if self.s3 is not None and self.s3.embedded:
                    # First: a broker's first upload should find it serving.
                    self._spawn_s3()
                    self._await_s3(timeout_s)
                for node in order:
                    self._spawn(node)
                for node in order:
                    self._await_listening(node, timeout_s)
            except BaseException:
                self.stop(kill=True)
                raise

    def _refuse_running(self) -> None:
        running = self.running_nodes()
        path = self.data_dir / STATE_FILE
        if not self._synced and path.exists():  # a new plan over an older cluster's state
            running += LocalCluster.load(self.data_dir).running_nodes()
        if running:
            raise ClusterError(f"nodes {sorted(set(running))} of this cluster are already running")
        if self.s3_running():
            raise ClusterError("the S3 server of this cluster is already running")

    def running_nodes(self) -> list[int]:
        """Nodes whose recorded process runs, and those running unrecorded (``_strays``)."""
        alive = [n.node_id for n in self.nodes.values() if self.is_running(n)]
        return sorted(set(alive) | set(self._strays().values()))

    def is_running(self, node: Node) -> bool:
        return process_is(node.pid, node.start_time)

    def start_node(self, node_id: int, timeout_s: float = 60.0) -> Node:
        with self.locked():
            node = self._node(node_id)
            if self.is_running(node) or node_id in self._strays().values():
                raise ClusterError(f"node {node_id} is already running (pid {node.pid})")
            self._spawn(node)
            self._await_listening(node, timeout_s)
        return node

    def add_broker(
        self,
        *,
        rack: str | None = None,
        overrides: dict[str, Any] | None = None,
        start: bool = True,
        timeout_s: float = 60.0,
    ) -> Node:
        """Plan (and by default start) one more broker: the next free broker id, a port
        like its peers' (ephemeral when theirs are), and per-node overrides copied from
        the lowest-numbered broker unless given, so it runs with the same settings. The
        caller waits for it to be unfenced (``wait_ready``) before assigning it replicas."""
        peers = self.brokers()
        if not peers:
            raise ClusterError("no broker to model the new one on")
        taken = set(self.nodes)
        node_id = max(n.node_id for n in peers) + 1
        while node_id in taken:
            node_id += 1
        model = min(peers, key=lambda n: n.node_id)
        ephemeral = model.broker_port == 0
        port = 0 if ephemeral else DEFAULT_BROKER_PORT + 2 * (node_id - 1)
        node = Node(node_id, ["broker"], None, port, rack)
        node.metrics_port = metrics_port(node_id, ephemeral)
        chosen = overrides if overrides is not None else self.node_overrides.get(model.node_id)
        with self.locked():
            self._add(node)
            if chosen:
                self.node_overrides[node_id] = dict(chosen)
        if start:
            self.start_node(node_id, timeout_s)
        return node

    def _node(self, node_id: int) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise ClusterError(f"no node {node_id}; nodes are {sorted(self.nodes)}") from None

    def _spawn(self, node: Node) -> None:
        d = self.node_dir(node.node_id)
        d.mkdir(parents=True, exist_ok=True)
        config = d / "config.toml"
        write_config(config, self.config_for(node))
        command = "broker" if node.is_broker else "controller"
        stdout_path = d / "stdout.log"
        node.listeners, node.metrics = {}, None
        node.stdout_offset = _size(stdout_path)
        env = self._child_env()
        if node.is_broker and self.s3 is not None and self.s3.embedded:
            for name in local_s3.MASKED_ENV:
                env.pop(name, None)
            env.update(local_s3.embedded_env(self.s3.region))
        argv = [self.python, "-m", "rillet.client.cli", command, "--config", str(config)]
        node.pid, node.start_time = _popen(argv, d, stdout_path, d / "node.log", env)
        self.save()  # recorded at once: `cluster down` must find it whatever happens next

    def _child_env(self) -> dict[str, str]:
        """The environment of a process of the cluster: ours, plus the owner to watch."""
        env = dict(os.environ)
        env.pop(OWNER_ENV, None)
        owner = self._live_owner()
        self.owner = owner  # an owner that died is no owner
        if owner is not None:
            env[OWNER_ENV] = owner_value(owner["pid"], owner.get("start_time"))  # type: ignore[arg-type]
        return env

    def _await_listening(self, node: Node, timeout_s: float) -> None:
        ready = self._await_ready(
            f"node {node.node_id}",
            self.node_dir(node.node_id) / "stdout.log",
            node.stdout_offset,
            lambda: self.is_running(node),
            lambda: self.log_tail(node.node_id),
            timeout_s,
        )
        node.listeners = dict(ready.get("listeners", {}))
        node.metrics = ready.get("metrics")

    def _await_ready(
        self,
        what: str,
        path: Path,
        offset: int,
        running: Callable[[], bool],
        tail: Callable[[], str],
        timeout_s: float,
    ) -> dict[str, Any]:
        """The readiness line a process prints on stdout once bound (its listeners...)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in _read_from(path, offset):
                event = _parse_event(line)
                if event and event.get("event") == "listening":
                    return event
            if not running():
                raise ClusterError(f"{what} exited during start-up; its log ends with:\n" + tail())
            time.sleep(0.05)
        raise ClusterError(
            f"{what} did not report listening within {timeout_s:.0f}s; log:\n" + tail()
        )

    def log_tail(self, node_id: int, lines: int = 30) -> str:
        return _tail(self.node_dir(node_id) / "node.log", lines)

    # --- the embedded S3 server ---------------------------------------------------
    #
    # One more process of the cluster (tools/local_s3.py), started before the nodes and
    # stopped after them, owned, recorded and found again (``_s3_strays``) as a node is.

    @property
    def s3_dir(self) -> Path:
        return self.data_dir / S3_DIR

    def _embedded_s3(self) -> S3Tier:
        if self.s3 is None or not self.s3.embedded:
            raise ClusterError("this cluster runs no embedded S3 server")
        return self.s3

    def _spawn_s3(self) -> None:
        s3 = self._embedded_s3()
        d = self.s3_dir
        d.mkdir(parents=True, exist_ok=True)
        stdout_path = d / "stdout.log"
        s3.stdout_offset = _size(stdout_path)
        argv = local_s3.command(self.python, s3.port, d)  # type: ignore[arg-type]
        s3.pid, s3.start_time = _popen(argv, d, stdout_path, d / "s3.log", self._child_env())
        self.save()

    def _await_s3(self, timeout_s: float) -> None:
        s3 = self._embedded_s3()
        self._await_ready(
            "the S3 server",
            self.s3_dir / "stdout.log",
            s3.stdout_offset,
            self.s3_running,
            self.s3_log_tail,
            timeout_s,
        )

    def s3_log_tail(self, lines: int = 30) -> str:
        return _tail(self.s3_dir / "s3.log", lines)

    def s3_running(self) -> bool:
        return self.s3 is not None and process_is(self.s3.pid, self.s3.start_time)

    def start_s3(self, timeout_s: float = 60.0) -> None:
        """Start the embedded S3 server again (its objects come back from disk)."""
        with self.locked():
            if self.s3_running() or self._s3_strays():
                raise ClusterError("the S3 server is already running")
            self._spawn_s3()
            self._await_s3(timeout_s)

    def stop_s3(self, *, kill: bool = False, timeout_s: float = 60.0) -> None:
        """SIGTERM: it stops serving. ``kill``: SIGKILL. Either way every change it
        answered is on disk already (it writes each through before answering)."""
        with self.locked():
            s3 = self._embedded_s3()
            pids = set(self._s3_strays())
            if self.s3_running():
                pids.add(s3.pid)  # type: ignore[arg-type]
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGCONT)
            _terminate(sorted(pids), kill=kill, timeout_s=timeout_s)
            s3.pid = s3.start_time = None

    def pause_s3(self) -> None:
        """SIGSTOP: connections are accepted (the kernel's backlog) and never answered,
        as from an S3 that hangs."""
        self._signal_s3(signal.SIGSTOP)

    def resume_s3(self) -> None:
        self._signal_s3(signal.SIGCONT)

    def _signal_s3(self, sig: signal.Signals) -> None:
        s3 = self._embedded_s3()
        if not self.s3_running():
            raise ClusterError("the S3 server is not running")
        os.kill(s3.pid, sig)  # type: ignore[arg-type]

    def _s3_strays(self) -> list[int]:
        """Processes serving this cluster's S3 directory that are not the recorded one."""
        if self.s3 is None or not self.s3.embedded:
            return []
        recorded = self.s3.pid if self.s3_running() else None
        wanted = os.fsencode(self.s3_dir)

        def serves(args: list[bytes]) -> bool:
            return os.fsencode(local_s3.MODULE) in args and _flag(args, b"--data-dir") == wanted

        return [pid for pid, _ in _processes(serves) if pid != recorded]

    def signal_node(self, node_id: int, sig: signal.Signals) -> None:
        node = self._node(node_id)
        if not self.is_running(node):
            raise ClusterError(f"node {node_id} is not running")
        os.kill(node.pid, sig)  # type: ignore[arg-type]

    def stop_node(self, node_id: int, *, kill: bool = False, timeout_s: float = 60.0) -> None:
        """SIGTERM (a controlled shutdown) and wait; SIGKILL with ``kill`` or at the deadline."""
        with self.locked():
            node = self._node(node_id)
            pids = {p for p, i in self._strays().items() if i == node_id}
            if self.is_running(node):
                pids.add(node.pid)  # type: ignore[arg-type]
            _terminate(sorted(pids), kill=kill, timeout_s=timeout_s)
            node.pid = node.start_time = None

    def pause_node(self, node_id: int) -> None:
        self.signal_node(node_id, signal.SIGSTOP)

    def resume_node(self, node_id: int) -> None:
        self.signal_node(node_id, signal.SIGCONT)

    def stop(self, *, kill: bool = False, timeout_s: float = 60.0) -> None:
        """Stop brokers first (they hand leadership back to the controllers), then
        controllers, then the embedded S3 server: every node whose recorded process runs,
        and any process running a node config of this cluster that went unrecorded. The
        cluster then has no owner."""
        with self.locked():
            self.stop_console(timeout_s=timeout_s)  # first: it would only log errors
            strays = self._strays()
            stopped: list[int] = []
            for group in (self.brokers(), self.controllers()):
                ids = {n.node_id for n in group}
                pids = {p for p, i in strays.items() if i in ids}
                pids |= {n.pid for n in group if n.pid and self.is_running(n)}  # type: ignore[misc]
                for p in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGCONT)  # a paused node cannot handle SIGTERM
                # Exited is enough to go on to the next group; the reaping of nodes another
                # command started (up to a second or more each here) is waited for once.
                _terminate(sorted(pids), kill=kill, timeout_s=timeout_s, reap=False)
                stopped += pids
                for n in group:
                    n.pid = n.start_time = None
            _await_reaped(stopped)
            if self.s3 is not None and self.s3.embedded:
                # Last: brokers upload until then. Never killed: ``kill`` is a crash of
                # the nodes, not of S3 (killed, it would lose nothing it answered, but
                # its log would show a crash that did not happen).
                self.stop_s3(timeout_s=timeout_s)
            self.owner = None

    def _strays(self) -> dict[int, int]:
        """Processes (pid -> node id) running a node config of this cluster that are not
        the recorded process of that node: a command killed between starting a node and
        recording it, or a state file overwritten by an older tool. Linux (/proc) only."""
        configs = {os.fsencode(self.node_dir(i) / "config.toml"): i for i in self.nodes}
        recorded = {n.pid for n in self.nodes.values() if n.pid}
        found: dict[int, int] = {}
        for pid, args in _processes(lambda args: _node_config_of(args, configs) is not None):
            if pid not in recorded:
                found[pid] = _node_config_of(args, configs)  # type: ignore[assignment]
        return found

    def brokers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.is_broker]

    def controllers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.is_controller and not n.is_broker]

    # --- addresses and probes -----------------------------------------------------

    def keep_broker_ports(self) -> None:
        """From now on, a restarted broker binds the port it bound first, as a broker
        with a configured port does: a bootstrap list taken once (a client process
        outliving a restart) stays good. Ephemeral ports otherwise change per start."""
        with self.locked():
            for node in self.brokers():
                if node.broker_port == 0 and self.broker_listener in node.listeners:
                    node.broker_port = parse_address(node.listeners[self.broker_listener])[1]

    def broker_address(self, node_id: int) -> str:
        node = self._node(node_id)
        if self.broker_listener not in node.listeners:
            raise ClusterError(f"node {node_id} has no known broker listener (not started?)")
        return node.listeners[self.broker_listener]

    @property
    def broker_listener(self) -> str:
        """The listener this tool (and ``bootstrap``) reaches the brokers on."""
        return self.listener_names[0]

    @property
    def bootstrap(self) -> str:
        name = self.broker_listener
        return ",".join(n.listeners[name] for n in self.brokers() if name in n.listeners)

    def describe(self, timeout_s: float = 5.0) -> m.DescribeClusterResponse | None:
        """DescribeCluster from the first live broker that answers, or None."""
        return _run_sync(lambda: self.describe_async(timeout_s))

    async def describe_async(self, timeout_s: float = 5.0) -> m.DescribeClusterResponse | None:
        return await self._ask_any_broker(m.DescribeClusterRequest(), timeout_s)

    def wait_ready(self, timeout_s: float = 90.0) -> m.DescribeClusterResponse:
        """Wait until every running broker is registered and unfenced."""
        return _run_sync(lambda: self.wait_ready_async(timeout_s))

    async def wait_ready_async(self, timeout_s: float = 90.0) -> m.DescribeClusterResponse:
        expected = {n.node_id for n in self.brokers() if self.is_running(n)}
        deadline = time.monotonic() + timeout_s
        last: m.DescribeClusterResponse | None = None
        while time.monotonic() < deadline:
            last = await self.describe_async()
            if last is not None:
                unfenced = {b.broker_id for b in last.brokers if not b.is_fenced}
                if expected <= unfenced and last.controller_id >= 0:
                    return last
            await asyncio.sleep(0.1)
        raise ClusterError(
            f"brokers {sorted(expected)} not all registered and unfenced after "
            f"{timeout_s:.0f}s; last DescribeCluster: {last}"
        )

    def partition_health(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """Partition counts from a live broker's metadata: total, under-replicated (ISR
        smaller than the replicas) and offline (no leader), plus the active controller
        as that broker knows it. None when no broker answers."""
        return _run_sync(lambda: self.partition_health_async(timeout_s))

    async def partition_health_async(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        response = await self._ask_any_broker(m.MetadataRequest(topics=None), timeout_s)
        if response is None:
            return None
        return summarize_partitions(response)

    async def _ask_any_broker(self, message: RequestMessage[R], timeout_s: float) -> R | None:
        for node in self.brokers():
            if not self.is_running(node) or self.broker_listener not in node.listeners:
                continue
            host, port = parse_address(node.listeners[self.broker_listener])
            timeout_ms = int(timeout_s * 1000)
            try:
                async with await Connection.open(
                    host, port, client_id="rillet-cluster", connect_timeout_ms=timeout_ms
                ) as conn:
                    response, _ = await conn.call(message, timeout_ms=timeout_ms)
                    return response
            except Exception:  # noqa: BLE001 - any broker may be down; try the next
                continue
        return None

    def status(self) -> list[dict[str, Any]]:
        """Every node with its process state and, for brokers, its fencing state."""
        described = self.describe(timeout_s=2.0)
        fenced: dict[int, bool] = {}
        controller_id = -1
        if described:
            controller_id = described.controller_id
            fenced = {b.broker_id: b.is_fenced for b in described.brokers}
        rows = []
        for n in sorted(self.nodes.values(), key=lambda n: n.node_id):
            alive = self.is_running(n)
            state = "stopped"
            if alive:
                state = "running"
                if n.is_broker:
                    state = {True: "fenced", False: "unfenced"}.get(
                        fenced.get(n.node_id), "registering"
                    )
                if n.is_controller and n.node_id == controller_id:
                    active = "active controller"
                    state = f"{state}, {active}" if n.is_broker else active
            rows.append(
                {
                    "node_id": n.node_id,
                    "roles": n.roles,
                    "address": ", ".join(v for _, v in sorted(n.listeners.items())),
                    "listeners": dict(n.listeners),
                    "metrics": f"http://{n.metrics}/metrics" if alive and n.metrics else None,
                    "state": state,
                    "pid": n.pid if alive else None,
                    "rack": n.rack,
                }
            )
        return rows

    def s3_status(self) -> dict[str, Any] | None:
        """The remote tier the brokers use (None: off) and, if embedded, its process."""
        if self.s3 is None:
            return None
        running = self.s3_running()
        return {
            "endpoint": self.s3.endpoint,
            "bucket": self.s3.bucket,
            "region": self.s3.region,
            "embedded": self.s3.embedded,
            "state": ("running" if running else "stopped") if self.s3.embedded else "external",
            "pid": self.s3.pid if running else None,
        }

    # --- the web console ------------------------------------------------------------

    @property
    def console_dir(self) -> Path:
        return self.data_dir / CONSOLE_DIR

    def console_running(self) -> bool:
        return self.console is not None and process_is(self.console.pid, self.console.start_time)

    def start_console(
        self,
        port: int = DEFAULT_CONSOLE_PORT,
        *,
        extra: Iterable[str] = (),
        timeout_s: float = 60.0,
    ) -> str:
        """Start ``rillet console`` for this cluster on 127.0.0.1:``port`` (0: any) and
        return its URL once it serves. It watches the owner as the nodes do."""
        with self.locked():
            if self.console_running():
                raise ClusterError(f"the console already runs: {self.console.url}")  # type: ignore[union-attr]
            d = self.console_dir
            d.mkdir(parents=True, exist_ok=True)
            stdout_path = d / "stdout.log"
            console = ConsoleProcess(port, stdout_offset=_size(stdout_path))
            argv = [self.python, "-m", "rillet.client.cli", "console", "--bootstrap"]
            argv += [self.bootstrap, "--host", console.host, "--port", str(port), *extra]
            console.pid, console.start_time = _popen(
                argv, d, stdout_path, d / "console.log", self._child_env()
            )
            self.console = console
            self.save()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for line in _read_from(stdout_path, console.stdout_offset):
                    found = CONSOLE_READY.search(line)
                    if found:
                        console.url = found.group(1)
                        return console.url
                if not self.console_running():
                    raise ClusterError(
                        "the console exited during start-up; its log ends with:\n"
                        + _tail(d / "console.log")
                    )
                time.sleep(0.05)
            self.stop_console(kill=True)
            raise ClusterError(f"the console did not serve within {timeout_s:.0f}s")

    def stop_console(self, *, kill: bool = False, timeout_s: float = 60.0) -> None:
        with self.locked():
            if self.console is None:
                return
            if self.console_running():
                _terminate([self.console.pid], kill=kill, timeout_s=timeout_s)  # type: ignore[list-item]
            self.console = None

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_CHILDREN: dict[int, subprocess.Popen] = {}


def summarize_partitions(metadata: m.MetadataResponse) -> dict[str, Any]:
    """Counts over a Metadata response's partitions."""
    total = under = offline = 0
    for t in metadata.topics:
        for p in t.partitions:
            total += 1
            under += len(p.isr) < len(p.replicas)
            offline += p.leader_id < 0
    return {
        "controller_id": metadata.controller_id,
        "partitions": total,
        "under_replicated": under,
        "offline": offline,
    }


def _popen(
    argv: list[str], cwd: Path, stdout_path: Path, log_path: Path, env: dict[str, str]
) -> tuple[int | None, int | None]:
    """Start a process of the cluster; (pid, start time), or (None, None) if it is gone
    already."""
    with open(stdout_path, "ab") as out, open(log_path, "ab") as err:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            # Ctrl-C in the terminal reaches only the owner, which stops brokers
            # before controllers; a node outlives `cluster up --detach`.
            start_new_session=True,
        )
    # Keep a handle so the child can be reaped (no zombies) while we run.
    _CHILDREN[proc.pid] = proc
    started = process_start_time(proc.pid)
    if started is None and HAVE_PROC:
        # Exited already (a zombie has no start time): a pid recorded without one
        # would stand for whatever process gets that pid next.
        proc.poll()  # reap it
        return None, None
    return proc.pid, started


def _processes(match: Callable[[list[bytes]], bool]) -> list[tuple[int, list[bytes]]]:
    """Running processes (pid, command line) whose command line ``match`` accepts, but
    this one. Linux (/proc) only: elsewhere none."""
    if not HAVE_PROC:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if match(args) and process_start_time(int(entry)) is not None:
            found.append((int(entry), args))
    return found


def _flag(args: list[bytes], flag: bytes) -> bytes | None:
    for name, value in zip(args, args[1:], strict=False):
        if name == flag:
            return value
    return None


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _node_config_of(args: list[bytes], configs: dict[bytes, int]) -> int | None:
    """The node whose config a command line runs as a node (``_spawn``'s command:
    ``-m rillet.client.cli <role> --config <path>``), or None: a process that only names
    the file (an editor, ``less``) is not a node, and stopping the cluster spares it."""
    if b"rillet.client.cli" not in args:
        return None
    return configs.get(_flag(args, b"--config"))  # type: ignore[arg-type]


def _rack(racks: list, i: int) -> str | None:
    return racks[i % len(racks)] if racks else None


def _read_from(path: Path, offset: int) -> list[str]:
    if not path.exists():
        return []
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()


def _parse_event(line: str) -> dict[str, Any] | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _terminate(pids: list[int], *, kill: bool, timeout_s: float, reap: bool = True) -> None:
    """Signal ``pids`` (each verified as a node of ours by the caller) and wait for them;
    SIGKILL whatever still runs at the deadline. ``reap`` False: the caller waits for the
    reaping (``_await_reaped``)."""
    if not pids:
        return
    started = {pid: process_start_time(pid) for pid in pids}

    def running(pid: int) -> bool:
        return process_is(pid, started[pid])

    sig = signal.SIGKILL if kill else signal.SIGTERM
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.05)
    killed = [pid for pid in pids if running(pid)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # Gone, not just signalled: the next group (controllers) must not start stopping
    # while a broker still runs.
    dead_by = time.monotonic() + ZOMBIE_REAP_WAIT_S
    while killed and time.monotonic() < dead_by and any(running(p) for p in killed):
        time.sleep(0.01)
    if reap:
        _await_reaped(pids)


def _await_reaped(pids: list[int]) -> None:
    """A node another command started is not our child: once it exits, whoever adopted it
    reaps it. Wait a little for that, so that no pid of the cluster is left when we
    return, but not for a reaper that never comes."""
    reaped_by = time.monotonic() + ZOMBIE_REAP_WAIT_S
    while time.monotonic() < reaped_by and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        proc = _CHILDREN.pop(pid, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
