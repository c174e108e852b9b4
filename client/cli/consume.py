"""`rillet consume TOPIC`: print records, one per line."""

from __future__ import annotations

import argparse
import json
import sys

from rillet.client.cli.common import CliError, add_bootstrap, run


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("consume", help="print a topic's records")
    parser.add_argument("topic")
    parser.add_argument("--from-beginning", action="store_true", help="start at the oldest")
    parser.add_argument("--max-messages", type=int, help="exit after this many records")
    parser.add_argument("--partition", type=int, help="read only this partition")
    parser.add_argument("--offset", type=int, help="start offset (needs --partition)")
    parser.add_argument("--timeout-ms", type=int, help="exit when no record arrives for this long")
    parser.add_argument("--print-key", action="store_true", help="print key<TAB>value")
    parser.add_argument(
        "--group",
        help="consume as a member of this consumer group: partitions come from the group, "
        "positions start at its committed offsets (else --from-beginning or the end), and "
        "what was printed is committed as it goes and on exit",
    )
    add_bootstrap(parser)
    parser.set_defaults(func=cmd_consume)


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "replace")


def cmd_consume(args: argparse.Namespace) -> int:
    from rillet.client.consumer import Consumer

    if args.offset is not None and args.partition is None:
        raise SystemExit("error: --offset needs --partition")
    if args.group is not None and args.partition is not None:
        raise SystemExit("error: --group gets its partitions from the group, not --partition")

    async def main() -> int:
        kwargs = {
            "bootstrap": args.bootstrap,
            "from_beginning": args.from_beginning,
            "metadata_wait_ms": 5_000,
        }
        if args.partition is not None:
            consumer = Consumer(assignment=[(args.topic, args.partition)], **kwargs)
        elif args.group is not None:
            # Auto-commit covers the run; close commits what was printed last.
            consumer = Consumer(
                args.topic, group_id=args.group, auto_commit_interval_ms=1_000, **kwargs
            )
        else:
            consumer = Consumer(args.topic, **kwargs)
        async with consumer:
            if args.offset is not None:
                consumer.seek((args.topic, args.partition), args.offset)
            return await _print_records(consumer, args)

    return run(main)


async def _print_records(consumer, args: argparse.Namespace) -> int:  # noqa: ANN001
    remaining = args.max_messages if args.max_messages is not None else 1 << 62
    out = sys.stdout
    while remaining > 0:
        batch = await consumer.getmany(timeout_ms=args.timeout_ms or 1000, max_records=remaining)
        if not batch:
            if args.timeout_ms:
                break
            continue
        for recs in batch.values():
            remaining -= len(recs)
            for r in recs:
                if args.json:
                    out.write(
                        json.dumps(
                            {
                                "topic": r.topic,
                                "partition": r.partition,
                                "offset": r.offset,
                                "timestamp": r.timestamp,
                                "key": _text(r.key),
                                "value": _text(r.value),
                            }
                        )
                        + "\n"
                    )
                elif args.print_key:
                    out.write(f"{_text(r.key)}\t{_text(r.value)}\n")
                else:
                    out.write(f"{_text(r.value)}\n")
        out.flush()
    return 0


__all__ = ["CliError", "register"]
