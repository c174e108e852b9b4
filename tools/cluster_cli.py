"""`rillet cluster up|down|status|stop|start`: run a local cluster of node processes."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rillet.client.cli.common import Fields
from rillet.client.cli.health import EXIT_CODES_HELP, exit_code, fetch_health, health_view
from rillet.tools import local_s3
from rillet.tools.local_cluster import (
    DEFAULT_CONSOLE_PORT,
    DEFAULT_S3_BUCKET,
    DEFAULT_S3_PORT,
    DEFAULT_S3_REGION,
    ClusterError,
    LocalCluster,
    S3Tier,
    free_port,
    parse_settings,
)

if TYPE_CHECKING:  # the health code is imported by `cluster status` alone
    from rillet.client.health import ClusterHealth

DEFAULT_DATA_DIR = "rillet-data"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cluster", help="run a local cluster on 127.0.0.1")
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True

    up = sub.add_parser("up", help="start a local cluster and wait until it serves")
    _data_dir(up)
    up.add_argument("--controllers", type=int, default=3, help="controller quorum size (3)")
    up.add_argument("--brokers", type=int, default=3, help="number of brokers (3)")
    up.add_argument("--combined", action="store_true", help="each node runs both roles")
    up.add_argument("--detach", action="store_true", help="return once the cluster serves")
    up.add_argument("--rack", action="append", default=[], help="racks, assigned round robin")
    up.add_argument(
        "--ephemeral-ports",
        action="store_true",
        help="let the OS pick every port (several clusters side by side, tests)",
    )
    up.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config for every node whose roles know KEY (repeatable)",
    )
    tier = up.add_argument_group(
        "remote tier",
        "By default an embedded S3 server (moto) runs beside the cluster and every broker "
        "tiers to it; topics opt in with remote.storage.enable=true (docs/tiered.md).",
    )
    tier.add_argument("--no-s3", action="store_true", help="no remote tier, no S3 server")
    tier.add_argument(
        "--s3-endpoint",
        metavar="URL",
        help="tier to this S3 endpoint instead (AWS, MinIO...; credentials from boto3's "
        "usual chain: environment, ~/.aws, instance role); starts no S3 server",
    )
    tier.add_argument("--s3-bucket", help=f"bucket of remote segments ({DEFAULT_S3_BUCKET})")
    tier.add_argument("--s3-region", help=f"region of --s3-endpoint ({DEFAULT_S3_REGION})")
    tier.add_argument(
        "--s3-port",
        type=int,
        help=f"port of the embedded S3 server ({DEFAULT_S3_PORT}; any with --ephemeral-ports)",
    )
    web = up.add_argument_group(
        "web console", "`rillet console` for the cluster (docs/console.md)."
    )
    web.add_argument(
        "--console-port",
        type=int,
        default=None,
        help=f"its port on 127.0.0.1 (default {DEFAULT_CONSOLE_PORT}; any free one with "
        "--ephemeral-ports)",
    )
    web.add_argument("--no-console", action="store_true", help="start no console")
    up.add_argument("--json", action="store_true", help="machine-readable output")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop every node of a local cluster")
    _data_dir(down)
    down.add_argument(
        "--kill",
        action="store_true",
        help="SIGKILL the nodes instead of SIGTERM (the S3 server still stops cleanly)",
    )
    down.set_defaults(func=cmd_down)

    status = sub.add_parser(
        "status",
        help="the cluster's health, and every local node's roles, address, state, pid, metrics",
        description="The local cluster's processes (from --data-dir), then the health of "
        "the cluster: controller quorum, brokers with their leaders, partitions and "
        "under-replicated partitions, counts, problem partitions. With --bootstrap, the "
        "health of any cluster (no process table).",
        epilog=EXIT_CODES_HELP,
    )
    _data_dir(status)
    status.add_argument(
        "--bootstrap",
        metavar="HOST:PORT[,...]",
        help="check this cluster's brokers instead of the local cluster's",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    stop = sub.add_parser("stop", help="stop one node (SIGTERM: controlled shutdown)")
    stop.add_argument("node_id", type=int)
    stop.add_argument("--kill", action="store_true", help="SIGKILL: a crash, not a shutdown")
    _data_dir(stop)
    stop.set_defaults(func=cmd_stop)

    start = sub.add_parser("start", help="start one stopped node again")
    start.add_argument("node_id", type=int)
    _data_dir(start)
    start.set_defaults(func=cmd_start)


def _data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("RILLET_DATA_DIR", DEFAULT_DATA_DIR),
        help=f"where the cluster keeps its state (default ./{DEFAULT_DATA_DIR})",
    )


def _fail(message: str) -> int:
    print(f"rillet cluster: {message}", file=sys.stderr)
    return 1


def cmd_up(args: argparse.Namespace) -> int:
    if not args.detach:
        # This command owns the nodes it starts: a closed terminal (SIGHUP) or a SIGTERM
        # stops them as Ctrl-C does; should it die anyway, they stop on their own.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
    cluster: LocalCluster | None = None
    try:
        cluster = _cluster_for_up(args)
        _check_ports_free(cluster)
        _say(args, f"starting {len(cluster.nodes)} nodes in {cluster.data_dir} ...")
        _say(args, f"remote tier: {_s3_line(cluster)}")
        cluster.start(owned=not args.detach)
        described = cluster.wait_ready()
        console = _start_console(args, cluster)
    except ClusterError as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        if cluster is None:
            return 130
        return _stop_cluster(cluster, print)
    if args.json:
        print(
            json.dumps(
                {
                    "bootstrap": cluster.bootstrap,
                    "nodes": cluster.status(),
                    "cluster_id": described.cluster_id,
                    "s3": cluster.s3_status(),
                    "console": console,
                }
            )
        )
    else:
        print(f"rillet cluster is up. bootstrap: {cluster.bootstrap}", flush=True)
        print(f"  export RILLET_BOOTSTRAP={cluster.bootstrap}", flush=True)
        print(f"  remote tier: {_s3_line(cluster)}", flush=True)
        if console:
            print(f"  console: {console}", flush=True)
    if args.detach:
        if not args.json:
            print(f"  stop it with: rillet cluster down --data-dir {args.data_dir}")
        return 0
    return _run_foreground(cluster)


def _start_console(args: argparse.Namespace, cluster: LocalCluster) -> str | None:
    """The console's URL, or None when not wanted or it could not start: the cluster
    serves without it, and the reason is said."""
    if args.no_console:
        return None
    port = args.console_port
    if port is None:
        port = 0 if args.ephemeral_ports else DEFAULT_CONSOLE_PORT
    try:
        return cluster.start_console(port, extra=_metrics_flag(cluster))
    except ClusterError as e:
        _say(args, f"warning: no web console: {e}")
        return None


def _metrics_flag(cluster: LocalCluster) -> list[str]:
    """``--metrics`` naming each broker's /metrics (bytes out per broker on the console's
    overview), for the brokers that serve one."""
    pairs = [f"{n.node_id}={n.metrics}" for n in cluster.brokers() if n.metrics]
    return ["--metrics", ",".join(pairs)] if pairs else []


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _cluster_for_up(args: argparse.Namespace) -> LocalCluster:
    state = Path(args.data_dir) / "cluster.json"
    if state.exists():
        # Same layout again: data survives `down` then `up`.
        cluster = LocalCluster.load(args.data_dir)
        running = cluster.running_nodes()
        if running:
            raise ClusterError(
                f"a cluster is already running in {args.data_dir} (nodes {running}); "
                "`rillet cluster status` shows it, `rillet cluster down` stops it"
            )
        if args.set:
            cluster.overrides.update(parse_settings(args.set))
        if args.no_s3 or args.s3_endpoint or args.s3_port:  # else: as it was
            cluster.s3 = _s3_for_up(args)
        elif cluster.s3 is not None and cluster.s3.embedded and not _moto_or_warn():
            cluster.s3 = None
        return cluster
    return LocalCluster(
        args.data_dir,
        controllers=args.controllers,
        brokers=args.brokers,
        combined=args.combined,
        ephemeral_ports=args.ephemeral_ports,
        overrides=parse_settings(args.set),
        racks=args.rack or None,
        s3=_s3_for_up(args),
    )


def _s3_for_up(args: argparse.Namespace) -> S3Tier | None:
    """The remote tier `cluster up` gives the brokers: none, the endpoint given, or an
    embedded S3 server (when moto is installed: without it the cluster starts anyway,
    with no tier, and says how to get it)."""
    bucket = args.s3_bucket or DEFAULT_S3_BUCKET
    if args.no_s3:
        return None
    if args.s3_endpoint:
        return S3Tier(args.s3_endpoint, bucket, args.s3_region or DEFAULT_S3_REGION)
    if not _moto_or_warn():
        return None
    port = args.s3_port or (free_port() if args.ephemeral_ports else DEFAULT_S3_PORT)
    return S3Tier.embedded_on(port, bucket)


def _moto_or_warn() -> bool:
    if local_s3.moto_server_available():
        return True
    print(
        "rillet cluster: moto's S3 server is not installed, so the cluster starts without "
        f"its remote tier. To get it: {local_s3.INSTALL_HINT}; or point the brokers at an "
        "S3 endpoint with --s3-endpoint URL.",
        file=sys.stderr,
    )
    return False


def _s3_line(cluster: LocalCluster) -> str:
    s3 = cluster.s3
    if s3 is None:
        return "off (no S3)"
    where = "embedded S3 server" if s3.embedded else "external S3"
    return f"{where} {s3.endpoint}, bucket {s3.bucket} (topics opt in: remote.storage.enable=true)"


def ports_in_use(cluster: LocalCluster) -> list[int]:
    """The fixed ports of the cluster's nodes that something else listens on now."""
    ports = [
        port
        for n in cluster.nodes.values()
        for port in (n.controller_port, n.broker_port)
        if port  # 0 or None: the OS picks one
    ]
    if cluster.s3 is not None and cluster.s3.port:
        ports.append(cluster.s3.port)
    busy = []
    for port in ports:
        with socket.socket() as s:
            # As the nodes bind (asyncio sets it): a port only in TIME_WAIT after the
            # last `cluster down` is free to them.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def _check_ports_free(cluster: LocalCluster) -> None:
    # Before any node starts: a node that cannot bind dies with a traceback in its log.
    busy = ports_in_use(cluster)
    if busy:
        raise ClusterError(
            f"127.0.0.1 port(s) {', '.join(map(str, busy))} already in use: another local "
            "cluster? `rillet cluster status --data-dir DIR` shows one and `rillet cluster "
            "down --data-dir DIR` stops it; a new cluster with --ephemeral-ports runs beside it"
        )


def _say(args: argparse.Namespace, text: str) -> None:
    if not getattr(args, "json", False):
        print(text, file=sys.stderr)


def _run_foreground(cluster: LocalCluster) -> int:
    """Show a live status table until Ctrl-C (or SIGTERM, SIGHUP), then stop every node;
    or until another command stops the cluster (`cluster down`) or takes it over."""
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)

    def say(text: str) -> None:
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            console.print(text, highlight=False)

    say("[dim]Ctrl-C stops the cluster.[/dim]")
    me = os.getpid()
    try:
        with Live(_live_view(cluster), console=console, refresh_per_second=1) as live:
            while True:
                time.sleep(1.0)
                cluster.refresh()  # other commands may have stopped or started nodes
                if not cluster.owned_by(me):
                    break
                live.update(_live_view(cluster))
    except KeyboardInterrupt:
        return _stop_cluster(cluster, say)
    say("the cluster was stopped (or taken over) by another rillet cluster command")
    return 0


def _stop_cluster(cluster: LocalCluster, say: Callable[[str], None]) -> int:
    say("stopping the cluster (controlled shutdown; Ctrl-C again to leave at once) ...")
    try:
        cluster.stop()
    except KeyboardInterrupt:
        # Every node this command owns watches it, and stops at once when it exits.
        say("leaving now: the nodes stop on their own as this command exits")
        return 130
    say("stopped.")
    return 0


def _live_view(cluster: LocalCluster):  # noqa: ANN202 - a rich renderable
    return status_view(cluster.status(), cluster.partition_health(1.0), cluster.s3_status())


def status_view(  # noqa: ANN201 - a rich renderable
    rows: list[dict[str, Any]], health: dict[str, Any] | None, s3: dict[str, Any] | None = None
):
    """The node table with the health line under it, left-aligned as `cluster status`
    prints it: as the table's centred caption it wrapped on an 80-column terminal; then
    the remote tier's line."""
    from rich.console import Group

    return Group(_table(rows), _health_line(health), _s3_status_line(s3))


def _s3_status_line(s3: dict[str, Any] | None) -> Fields:
    if s3 is None:
        return Fields(["remote tier: off"])
    if not s3["embedded"]:
        return Fields([f"remote tier: S3 {s3['endpoint']}", f"bucket: {s3['bucket']}"], sep="   ")
    style = "green" if s3["state"] == "running" else "red"
    pid = f" (pid {s3['pid']})" if s3["pid"] else ""
    return Fields(
        [
            f"remote tier: embedded S3 {s3['endpoint']}",
            f"bucket: {s3['bucket']}",
            f"[{style}]{s3['state']}[/{style}]{pid}",
        ],
        sep="   ",
    )


def _table(rows: list[dict[str, Any]]):  # noqa: ANN202 - a rich Table
    from rich.table import Table

    table = Table(title="rillet local cluster")
    for col in ("node", "roles", "address", "state", "pid", "metrics"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        style = "green" if r["state"].startswith(("unfenced", "running", "active")) else "yellow"
        if r["state"] == "stopped":
            style = "red"
        table.add_row(
            str(r["node_id"]),
            ",".join(r["roles"]),
            r["address"],
            f"[{style}]{r['state']}[/{style}]",
            str(r["pid"] or "-"),
            _metrics_port(r.get("metrics")),
        )
    return table


def _metrics_port(url: str | None) -> str:
    """``:9401`` of ``http://127.0.0.1:9401/metrics`` (the table's width allows no more;
    the host is the node's address's, --json gives the whole URL)."""
    if not url:
        return "-"
    return ":" + url.rpartition(":")[2].partition("/")[0]


def cmd_down(args: argparse.Namespace) -> int:
    try:
        cluster = LocalCluster.load(args.data_dir)
    except ClusterError as e:
        return _fail(str(e))
    if not args.kill:
        # Silent, this wait looked like a hang: with 10,000 partitions it takes ~40 s.
        print(
            "stopping the cluster: brokers first, each moving its leaderships away "
            "(longer with many partitions), then the controllers ...",
            file=sys.stderr,
        )
    cluster.stop(kill=args.kill)
    print(f"stopped the cluster in {cluster.data_dir}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console, Group

    rows: list[dict[str, Any]] | None = None
    s3: dict[str, Any] | None = None
    bootstrap = args.bootstrap
    if not bootstrap:
        try:
            cluster = LocalCluster.load(args.data_dir)
        except ClusterError as e:
            return _fail(str(e))
        rows, s3, bootstrap = cluster.status(), cluster.s3_status(), cluster.bootstrap
    health, error = fetch_health(bootstrap)
    if args.json:
        out: dict[str, Any] = {"bootstrap": bootstrap}
        if rows is not None:
            out |= {"nodes": rows, "s3": s3}
        out |= {
            "healthy": health is not None and health.healthy,
            "status": health.status if health else "unreachable",
            "error": error,
            "controller_id": health.controller_id if health else -1,
            "partitions": _health_counts(health),
            "health": health.as_dict() if health else None,
        }
        print(json.dumps(out))
    else:
        console = Console()
        if rows is not None:
            console.print(Group(_table(rows), _s3_status_line(s3)))
        if health is not None:
            console.print(health_view(health))
    if error:
        print(f"rillet cluster: {error}", file=sys.stderr)
    return exit_code(health)


def _health_counts(health: ClusterHealth | None) -> dict[str, int] | None:
    if health is None:
        return None  # no broker answered: unknown, not zero
    return {
        "partitions": health.partitions,
        "under_replicated": health.under_replicated,
        "offline": health.offline,
        "under_min_isr": health.under_min_isr,
    }


def _health_line(health: dict[str, Any] | None) -> Fields:
    if health is None:
        return Fields(["[red]no broker answered: partition state unknown[/red]"])
    controller = health["controller_id"] if health["controller_id"] >= 0 else "unknown"
    under, offline = health["under_replicated"], health["offline"]
    return Fields(
        [
            f"active controller: {controller}",
            f"partitions: {health['partitions']}",
            f"under-replicated: [{'yellow' if under else 'green'}]{under}[/]",
            f"offline: [{'red' if offline else 'green'}]{offline}[/]",
        ],
        sep="   ",
    )


def cmd_stop(args: argparse.Namespace) -> int:
    try:
        cluster = LocalCluster.load(args.data_dir)
        cluster.stop_node(args.node_id, kill=args.kill)
    except ClusterError as e:
        return _fail(str(e))
    print(f"node {args.node_id} {'killed' if args.kill else 'stopped'}")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    try:
        cluster = LocalCluster.load(args.data_dir)
        node = cluster.start_node(args.node_id)
    except ClusterError as e:
        return _fail(str(e))
    print(f"node {args.node_id} started (pid {node.pid})")
    return 0
