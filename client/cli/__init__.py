"""The ``rillet`` command line.

Client-side commands live in client/. Server-side commands (``log``, ``controller``,
``broker``, ``cluster``...) are registered by their own components through the
``rillet.commands`` entry-point group, so this module never imports storage/,
controller/ or broker/ by name and the dependency arrows keep pointing one way.

A command module exposes ``register(subparsers) -> None``: it adds its sub-parser and
sets ``func`` (``func(args) -> int``, the exit code) with ``set_defaults``.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

# Modules under rillet.client.cli that expose register(); each adds its own sub-command.
CLIENT_COMMANDS = [
    "topic",
    "produce",
    "consume",
    "perf",
    "spark",
    "leader",
    "partition",
    "group",
    "console",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rillet", description="rillet: a small Kafka-style streaming log"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in CLIENT_COMMANDS:
        module = __import__(f"rillet.client.cli.{name}", fromlist=["register"])
        module.register(sub)
    for ep in sorted(entry_points(group="rillet.commands"), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `rillet consume ... | head` closes stdout early: not an error.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
