"""`rillet produce TOPIC`: one record per stdin line."""

from __future__ import annotations

import argparse
import asyncio
import sys

from rillet.client.cli.common import CliError, add_bootstrap, print_json, run
from rillet.client.wire import codecs

READ_CHUNK_BYTES = 256 * 1024


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("produce", help="send stdin lines as records")
    parser.add_argument("topic")
    parser.add_argument(
        "--key-separator", metavar="SEP", help="split each line at the first SEP into key and value"
    )
    parser.add_argument("--acks", default="1", choices=["0", "1", "-1", "all"])
    parser.add_argument("--partition", type=int, help="send every record to this partition")
    parser.add_argument("--compression", default="none", choices=list(codecs.BY_NAME))
    parser.add_argument("--linger-ms", type=float, default=5)
    add_bootstrap(parser)
    parser.set_defaults(func=cmd_produce)


def cmd_produce(args: argparse.Namespace) -> int:
    from rillet.client.producer import Producer

    sep = args.key_separator.encode() if args.key_separator else None

    async def main() -> int:
        loop = asyncio.get_running_loop()
        stdin = sys.stdin.buffer
        count = 0
        async with Producer(
            args.bootstrap,
            acks=args.acks,
            compression=args.compression,
            linger_ms=args.linger_ms,
            max_block_ms=5_000,
        ) as producer:
            await _check_topic(producer, args.topic, args.partition)
            produce = producer.produce
            while True:
                # Read in a thread: the loop keeps sending while stdin is slow.
                lines = await loop.run_in_executor(None, stdin.readlines, READ_CHUNK_BYTES)
                if not lines:
                    break
                for line in lines:
                    line = line.rstrip(b"\r\n")
                    key = None
                    if sep is not None:
                        key, found, value = line.partition(sep)
                        if not found:
                            key, value = None, line
                    else:
                        value = line
                    await produce(args.topic, value, key, partition=args.partition)
                count += len(lines)
            await producer.flush()
        if args.json:
            print_json({"topic": args.topic, "records": count})
        else:
            print(f"Sent {count} record(s) to {args.topic}.", file=sys.stderr)
        return 0

    return run(main)


async def _check_topic(producer, topic: str, partition: int | None) -> None:  # noqa: ANN001
    """Fail fast and readably on an unknown topic or partition."""
    n = await producer.partitions_for(topic)
    if partition is not None and not 0 <= partition < n:
        raise CliError(f"topic {topic!r} has {n} partitions; there is no partition {partition}")
