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


def pack_fields(fields: list[str], width: int, sep: str = "  ") -> str:
    """Fields joined by ``sep``, breaking lines only between fields (continuations
    indented), so a narrow terminal never splits "offline: 0" from its number. Fields
    may hold rich markup: widths are measured on the text shown."""
    from rich.text import Text

    lines: list[str] = []
    line, used = "", 0
    for field in fields:
        n = Text.from_markup(field).cell_len
        if line and used + len(sep) + n > width:
            lines.append(line)
            line, used = "  " + field, 2 + n
        elif line:
            line, used = line + sep + field, used + len(sep) + n
        else:
            line, used = field, n
    lines.append(line)
    return "\n".join(lines)


class Fields:
    """A rich renderable: ``pack_fields`` at the width it is given when drawn (a live
    view learns the terminal's width only then)."""

    def __init__(self, fields: list[str], sep: str = "  ") -> None:
        self.fields, self.sep = fields, sep

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        yield Text.from_markup(pack_fields(self.fields, options.max_width, self.sep))
