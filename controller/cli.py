"""``rillet controller --config FILE [--set key=value ...]``: run a controller node.

Loads ``controller_config_table()`` (every key documented in docs/controller.md), runs
``ControllerServer`` on uvloop, prints the readiness line of the node contract
(docs/architecture.md) once listening, and stops cleanly on SIGTERM/SIGINT: a leading
controller first hands leadership to the most caught-up voter (TimeoutNow, bounded by
``controlled.shutdown.timeout.ms``), so the quorum does not wait out an election
timeout. A second signal cuts that short (client/runtime/shutdown.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from rillet.client.runtime.limits import raise_open_files_limit
from rillet.client.runtime.metrics_http import MetricsServer, serve_metrics
from rillet.client.runtime.shutdown import StopRequests, run_then_exit
from rillet.client.wire.errors import InvalidConfigError
from rillet.controller.config import controller_config_table

log = logging.getLogger("rillet.controller")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("controller", help="run a controller quorum node")
    parser.add_argument("--config", help="TOML config file")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (repeatable)",
    )
    parser.set_defaults(func=cmd_controller)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def print_ready(
    node_id: int, listeners: Mapping[str, str], metrics: MetricsServer | None = None
) -> None:
    """The node contract's readiness line: one JSON object on stdout, flushed; with the
    metrics endpoint's host:port under ``metrics`` when it is on."""
    line: dict[str, Any] = {
        "event": "listening",
        "node_id": node_id,
        "listeners": dict(listeners),
        "pid": os.getpid(),
    }
    if metrics is not None:
        line["metrics"] = metrics.address
    print(json.dumps(line), flush=True)


def cmd_controller(args: argparse.Namespace) -> int:
    try:
        config = controller_config_table().load(args.config, args.set)
    except InvalidConfigError as e:
        print(f"rillet controller: {e}", file=sys.stderr)
        return 2
    if "controller" not in config["process.roles"].split(","):
        print("rillet controller: process.roles must include controller", file=sys.stderr)
        return 2
    setup_logging(config["log.level"])
    raise_open_files_limit()
    import uvloop

    # As a broker does (broker/cli.py): the stop closed the Raft store; no thread left
    # behind may hold the process.
    return run_then_exit("controller", lambda: uvloop.run(run_controller(config)))


async def run_controller(config: Mapping[str, Any]) -> int:
    from rillet.controller.server import ControllerServer

    server = ControllerServer(config)
    requests = StopRequests(f"controller {server.node_id}")
    requests.install()  # before start-up: see broker/cli.py
    await server.start()
    try:
        metrics = await serve_metrics(config, server.bind_address[0], [server.metrics.registry])
    except OSError:
        await server.stop(transfer_leadership=False)
        raise
    print_ready(server.node_id, server.listeners, metrics)
    assert server.failure is not None
    stopping = asyncio.ensure_future(requests.requested.wait())
    await asyncio.wait([stopping, server.failure], return_when=asyncio.FIRST_COMPLETED)
    if metrics is not None:
        await metrics.stop()
    if server.failure.done():
        log.critical("controller %d failed: %r", server.node_id, server.failure.result())
        await server.stop(transfer_leadership=False)
        return 1
    stopping.cancel()
    log.info("controller %d: stopping on request", server.node_id)
    await server.stop(transfer_leadership=requests.controlled, cut_short=requests.urgent)
    return 0
