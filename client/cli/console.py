"""``rillet console``: serve the web console for a cluster (docs/console.md)."""

from __future__ import annotations

import argparse
import sys

from rillet.client.cli.common import add_bootstrap, run


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("console", help="serve the web console (default :8080)")
    add_bootstrap(parser, json_flag=False)
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; the console "
        "has no login, so bind wider only behind something that authenticates)",
    )
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--loopback-names-only",
        action="store_true",
        help="answer only requests that name a loopback host (127.0.0.1, localhost), as a "
        "console bound to loopback does, when bound wider: in a container published on "
        "the host's loopback",
    )
    parser.add_argument(
        "--read-only", action="store_true", help="hide every action: browse and watch only"
    )
    parser.add_argument(
        "--refresh", type=float, default=2.0, metavar="SECONDS", help="snapshot interval"
    )
    parser.add_argument(
        "--metrics",
        default="",
        metavar="ID=HOST:PORT[,...]",
        help="each broker's Prometheus endpoint, for bytes out per broker (optional)",
    )
    parser.set_defaults(func=cmd_console)


def cmd_console(args: argparse.Namespace) -> int:
    from rillet.client.console.app import serve
    from rillet.client.console.context import ConsoleConfig
    from rillet.client.console.metrics import parse_targets

    if args.refresh <= 0:
        print("error: --refresh must be positive", file=sys.stderr)
        return 1
    try:
        metrics = parse_targets(args.metrics)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    config = ConsoleConfig(
        bootstrap=args.bootstrap,
        host=args.host,
        port=args.port,
        read_only=args.read_only,
        loopback_names_only=args.loopback_names_only,
        refresh_s=args.refresh,
        metrics=metrics,
    )

    def ready(url: str) -> None:
        # Tests and scripts read this line for the bound address (with --port 0).
        print(f"console: serving {url} for {args.bootstrap}", flush=True)

    async def main() -> int:
        from rillet.client.runtime.shutdown import StopRequests

        # Started by a foreground `rillet cluster up`, the console stops with it, as the
        # nodes do (RILLET_OWNER); uvicorn itself handles SIGTERM and Ctrl-C.
        stops = StopRequests("console")
        stops.install()
        try:
            await serve(config, ready, stops.requested)
        except OSError as e:
            print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
            return 1
        return 0

    return run(main)
