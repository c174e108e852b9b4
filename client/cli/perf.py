"""`rillet perf produce|consume`: throughput and latency, like Kafka's perf-test tools.

perf produce sends ``--num-records`` records of ``--record-size`` bytes, one
``produce()`` call per record (``--bulk`` uses ``send_many``). Latency is per batch,
from the moment the batch was opened to its acknowledgement, weighted by the records in
it: an upper bound for each of its records (the first one waited longest). perf consume
reads ``--num-records`` from the beginning of the topic. Both report records/s, MB/s
and the client's peak RSS, as a table or ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from typing import Any

from rillet.client.cli.common import add_bootstrap, print_json, run
from rillet.client.wire import codecs

MB = 1024 * 1024


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("perf", help="producer and consumer performance tests")
    sub = parser.add_subparsers(dest="perf_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("produce", help="measure producer throughput and latency")
    p.add_argument("--topic", required=True)
    p.add_argument("--num-records", type=int, required=True)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--acks", default="1", choices=["0", "1", "-1", "all"])
    p.add_argument("--throughput", type=float, default=-1, help="records/s cap (-1: none)")
    p.add_argument("--batch-size", type=int, default=64 * 1024)
    p.add_argument("--linger-ms", type=float, default=5)
    p.add_argument("--max-in-flight", type=int, default=16)
    p.add_argument("--compression", default="none", choices=list(codecs.BY_NAME))
    p.add_argument("--bulk", action="store_true", help="send_many in lists of 10,000")
    add_bootstrap(p)
    p.set_defaults(func=cmd_perf_produce)

    c = sub.add_parser("consume", help="measure consumer throughput")
    c.add_argument("--topic", required=True)
    c.add_argument("--num-records", type=int, required=True)
    c.add_argument("--max-partition-fetch-bytes", type=int, default=1024 * 1024)
    c.add_argument("--timeout-ms", type=int, default=30_000, help="give up when idle this long")
    add_bootstrap(c)
    c.set_defaults(func=cmd_perf_consume)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def weighted_percentiles(samples: list[tuple[float, int]], qs: list[float]) -> list[float]:
    """Percentiles of values each weighted by a count (batch latency x its records)."""
    if not samples:
        return [0.0 for _ in qs]
    ordered = sorted(samples)
    total = sum(n for _, n in ordered)
    out: list[float] = []
    for q in qs:
        target, seen = q * total, 0
        for value, n in ordered:
            seen += n
            if seen >= target:
                out.append(value)
                break
    return out


def cmd_perf_produce(args: argparse.Namespace) -> int:
    return run(lambda: _perf_produce(args))


async def _perf_produce(args: argparse.Namespace) -> int:
    from rillet.client.producer import Producer

    value = os.urandom(args.record_size)
    latencies: list[tuple[float, int]] = []
    producer = Producer(
        args.bootstrap,
        acks=args.acks,
        batch_size=args.batch_size,
        linger_ms=args.linger_ms,
        max_in_flight=args.max_in_flight,
        compression=args.compression,
        max_block_ms=10_000,
    )
    producer.on_batch_done = lambda n, s: latencies.append((s, n))
    async with producer:
        await producer.partitions_for(args.topic)
        # Wall-clock bounds too, so concurrent runs can be added up over their common span.
        started_at, start = time.time(), time.perf_counter()
        await _produce_loop(producer, args, value)
        await producer.flush()
        elapsed = time.perf_counter() - start
    p50, p99, pmax = weighted_percentiles(latencies, [0.5, 0.99, 1.0])
    report = {
        "records": args.num_records,
        "record_size": args.record_size,
        "acks": args.acks,
        "batch_size": args.batch_size,
        "seconds": round(elapsed, 3),
        "started_at": round(started_at, 3),
        "finished_at": round(started_at + elapsed, 3),
        "records_per_s": round(args.num_records / elapsed),
        "mb_per_s": round(args.num_records * args.record_size / elapsed / MB, 2),
        "latency_ms": {
            "p50": round(p50 * 1000, 2),
            "p99": round(p99 * 1000, 2),
            "max": round(pmax * 1000, 2),
        },
        "requests": producer.stats["requests"],
        "batches": producer.stats["batches"],
        "retries": producer.stats["retries"],
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    _report(args, "perf produce", report)
    return 0


async def _produce_loop(producer: Any, args: argparse.Namespace, value: bytes) -> None:
    topic, n = args.topic, args.num_records
    rate = args.throughput if args.throughput > 0 else None
    start = time.perf_counter()
    if args.bulk:
        chunk = [value] * 10_000
        for i in range(0, n, 10_000):
            await producer.send_many(topic, chunk[: min(10_000, n - i)])
            if rate:
                await _pace(start, i + 10_000, rate)
        return
    produce = producer.produce
    step = 1000 if rate else n
    for i in range(0, n, step):
        for _ in range(min(step, n - i)):
            await produce(topic, value)
        if rate:
            await _pace(start, i + step, rate)


async def _pace(start: float, sent: int, rate: float) -> None:
    ahead = sent / rate - (time.perf_counter() - start)
    if ahead > 0:
        await asyncio.sleep(ahead)


def cmd_perf_consume(args: argparse.Namespace) -> int:
    return run(lambda: _perf_consume(args))


async def _perf_consume(args: argparse.Namespace) -> int:
    from rillet.client.cli.common import CliError
    from rillet.client.consumer import Consumer

    consumer = Consumer(
        args.topic,
        bootstrap=args.bootstrap,
        from_beginning=True,
        max_partition_fetch_bytes=args.max_partition_fetch_bytes,
    )
    count = 0
    async with consumer:
        start = last = time.perf_counter()
        while count < args.num_records:
            batch = await consumer.getmany(timeout_ms=500)
            now = time.perf_counter()
            if not batch:
                if (now - last) * 1000 > args.timeout_ms:
                    raise CliError(f"only {count} of {args.num_records} records arrived")
                continue
            last = now
            for recs in batch.values():
                count += len(recs)
        elapsed = time.perf_counter() - start
        stats = consumer.stats
    report = {
        "records": count,
        "seconds": round(elapsed, 3),
        "records_per_s": round(count / elapsed),
        "mb_per_s": round(stats["bytes"] / elapsed / MB, 2),
        "fetches": stats["fetches"],
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    _report(args, "perf consume", report)
    return 0


def _report(args: argparse.Namespace, title: str, report: dict[str, Any]) -> None:
    if args.json:
        print_json(report)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, val in report.items():
        if isinstance(val, dict):
            val = "  ".join(f"{k} {v}" for k, v in val.items())
        table.add_row(key, f"{val:,}" if isinstance(val, int) else str(val))
    Console(file=sys.stdout).print(table)
