"""``rillet broker --config FILE [--set key=value ...]``: run a broker node.

``process.roles`` defaults to ``broker``. With ``broker,controller`` (combined mode) the
process runs a ``ControllerServer`` and a ``BrokerServer`` in one uvloop event loop, with
the two config tables merged (``combined_config_table``). Once every listener is bound
the node prints the readiness line of the node contract (docs/architecture.md) on stdout.

SIGTERM or SIGINT is a controlled shutdown: the broker asks the controller to move its
leaderships away and waits (``controlled.shutdown.timeout.ms``, then it stops anyway:
the controllers may be gone), closes its logs with clean-shutdown markers, and in
combined mode the controller then hands Raft leadership over and stops. A second
signal cuts the waiting short and exits within a few seconds; the exit of the owner
named in ``RILLET_OWNER`` stops the node without the controlled shutdown
(client/runtime/shutdown.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from rillet.broker.config import BrokerConfig, broker_config_table, combined_config_table
from rillet.client.runtime.config import Config
from rillet.client.runtime.limits import raise_open_files_limit
from rillet.client.runtime.metrics_http import serve_metrics
from rillet.client.runtime.shutdown import StopRequests, run_then_exit
from rillet.client.wire.errors import InvalidConfigError

log = logging.getLogger("rillet.broker")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("broker", help="run a broker node (or a combined node)")
    parser.add_argument("--config", help="TOML config file")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (repeatable)",
    )
    parser.set_defaults(func=cmd_broker)


def load_config(path: str | None, overrides: list[str]) -> Config:
    """Broker keys, or broker + controller keys when the roles (from the file or the
    overrides) include controller: the roles decide which table to check keys against."""
    probe = broker_config_table()
    roles = _roles(probe, path, overrides)
    table = combined_config_table() if "controller" in roles else probe
    return table.load(path, overrides)


def _roles(table: Any, path: str | None, overrides: list[str]) -> set[str]:
    roles = table.keys["process.roles"].default
    if path is not None:
        import tomllib

        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidConfigError(f"{path}: {e}") from None
        roles = raw.get("process.roles", raw.get("process", {}).get("roles", roles))
    for item in overrides:
        name, _, value = item.partition("=")
        if name.strip() == "process.roles":
            roles = value.strip()
    return {r.strip() for r in str(roles).split(",") if r.strip()}


def cmd_broker(args: argparse.Namespace) -> int:
    from rillet.controller.cli import setup_logging

    try:
        config = load_config(args.config, args.set)
        broker_config = BrokerConfig.from_config(config)
    except InvalidConfigError as e:
        print(f"rillet broker: {e}", file=sys.stderr)
        return 2
    if "broker" not in broker_config.roles:
        print("rillet broker: process.roles must include broker", file=sys.stderr)
        return 2
    setup_logging(config["log.level"])
    raise_open_files_limit()
    import uvloop

    # The stop has closed (and fsynced) every log: a remote-tier thread still blocked
    # in a call to a hung S3 must not keep the process alive (exit_process says why),
    # however the run ended.
    return run_then_exit("broker", lambda: uvloop.run(run_node(config, broker_config)))


async def run_node(config: Config, broker_config: BrokerConfig) -> int:
    """Run the broker (and the controller in combined mode) until a stop request
    (client/runtime/shutdown.py: a signal, or the owner's exit)."""
    from rillet.broker.server import BrokerServer
    from rillet.controller.cli import print_ready

    # Before anything starts: a signal during start-up is a stop request too, and a
    # second one bounds the process's life even if start-up never finishes.
    requests = StopRequests(f"node {broker_config.node_id}")
    requests.install()
    controller = None
    if "controller" in broker_config.roles:
        from rillet.controller.server import ControllerServer

        controller = ControllerServer(config)
        await controller.start()
    broker = BrokerServer(broker_config)
    try:
        await broker.start()
    except BaseException:
        await broker.stop(controlled=False)
        if controller is not None:
            await controller.stop(transfer_leadership=False)
        raise
    listeners = dict(broker.listeners)
    registries = [broker.registry]
    if controller is not None:
        listeners.update(controller.listeners)
        registries.append(controller.metrics.registry)  # one endpoint serves both roles
    try:
        metrics = await serve_metrics(config, broker.host, registries)
    except OSError:
        await broker.stop(controlled=False)
        if controller is not None:
            await controller.stop(transfer_leadership=False)
        raise
    print_ready(broker.node_id, listeners, metrics)
    waits = [asyncio.ensure_future(requests.requested.wait())]
    if controller is not None and controller.failure is not None:
        waits.append(controller.failure)  # type: ignore[arg-type]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    failed = (
        controller is not None and controller.failure is not None and (controller.failure.done())
    )
    waits[0].cancel()
    if metrics is not None:
        await metrics.stop()
    log.info("node %d: stopping (%s)", broker.node_id, "controller failed" if failed else "signal")
    controlled = not failed and requests.controlled
    await broker.stop(controlled=controlled, cut_short=requests.urgent)
    if controller is not None:
        await controller.stop(transfer_leadership=controlled, cut_short=requests.urgent)
    return 1 if failed else 0
