"""Shared pieces of the client CLI commands: common options, running, errors, output.

Expected failures (no broker reachable, an unknown topic, a refused request) print one
readable line to stderr and exit 1; only bugs print a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from rillet.client.wire.errors import RilletError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def default_bootstrap() -> str:
    return os.environ.get("RILLET_BOOTSTRAP") or DEFAULT_BOOTSTRAP


def add_bootstrap(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    parser.add_argument(
        "--bootstrap",
        default=default_bootstrap(),
        metavar="HOST:PORT[,...]",
        help="brokers to start from (env RILLET_BOOTSTRAP, default 127.0.0.1:9092)",
    )
    if json_flag:
        parser.add_argument("--json", action="store_true", help="machine-readable output")


class CliError(Exception):
    """An expected failure worth one line on stderr (exit code 1)."""


def run(main: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    """Run an async command on uvloop; turn expected errors into one readable line."""
    from rillet.client.admin import AdminError
    from rillet.client.producer import DeliveryError

    try:
        import uvloop

        return int(uvloop.run(main()) or 0)
    except (CliError, AdminError, DeliveryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RilletError as e:
        print(f"error: {e.name}: {e}", file=sys.stderr)
        return 1


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def parse_configs(pairs: list[str]) -> dict[str, str]:
    configs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--config expects key=value, got {pair!r}")
        configs[key.strip()] = value.strip()
    return configs
