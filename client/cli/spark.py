"""`rillet spark load|verify`: a Spark producer load test and its Jepsen-style checker.

The record format and the checks are described in client/spark/jobs.py and
docs/spark.md. pyspark is imported only when a command runs, so ``rillet`` works
without the ``spark`` extra and says what to install when it is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from rillet.client.cli.common import CliError, add_bootstrap, print_json

MB = 1024 * 1024
# verify's exit codes: 0 pass, 1 error, 2 violations found, 3 the load's shape (records
# and tasks) is unknown or contradicted: verify refuses rather than guess it.
EXIT_VIOLATIONS = 2
EXIT_SHAPE_UNKNOWN = 3
# verify --stream stopped (--timeout, Ctrl-C) before it had surely read every
# acknowledged record, with no other violation: no verdict.
EXIT_INCONCLUSIVE = 4


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("spark", help="Spark load test and verification jobs")
    sub = parser.add_subparsers(dest="spark_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("load", help="produce generated records from Spark tasks")
    p.add_argument("--topic", required=True)
    p.add_argument("--records", type=int, help="records in total (a batch load)")
    p.add_argument("--record-size", type=int, default=100, help="bytes per value (>= 20)")
    p.add_argument("--tasks", type=int, default=4, help="Spark tasks producing in parallel")
    p.add_argument("--acks", default="all", choices=["0", "1", "-1", "all"])
    p.add_argument("--partitions", type=int, help="create the topic if missing, with this many")
    p.add_argument("--replication-factor", type=int, default=-1, help="with --partitions")
    p.add_argument("--manifest", metavar="PATH", help="write what was acknowledged here (JSON)")
    p.add_argument(
        "--strict-order",
        action="store_true",
        help="one request in flight per partition, so producer retries cannot reorder records",
    )
    st = p.add_argument_group("streaming load (instead of --records)")
    st.add_argument(
        "--stream",
        action="store_true",
        help="a Spark streaming query at a steady rate: --rate records/s for --duration s",
    )
    st.add_argument("--rate", type=int, help="records per second, over all tasks")
    st.add_argument("--duration", type=float, help="seconds of load (records = rate x duration)")
    st.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="Spark checkpoint directory (local); run again with it to resume a stopped load",
    )
    _add_interval(st)
    _add_spark_options(p)
    p.set_defaults(func=cmd_load)

    v = sub.add_parser("verify", help="read a loaded topic back and check every record")
    v.add_argument("--topic", required=True)
    v.add_argument(
        "--records", type=int, help="records the load job sent (default: its manifest's)"
    )
    v.add_argument(
        "--tasks", type=int, help="producer tasks of the load job (default: its manifest's)"
    )
    v.add_argument(
        "--manifest",
        metavar="PATH",
        help="the load job's --manifest file (by default verify reads the manifest the "
        "load job writes into the topic)",
    )
    vs = v.add_argument_group("streaming verification")
    vs.add_argument(
        "--stream",
        action="store_true",
        help="read the topic as it is written, report live, and finish once the load's "
        "manifest and every record acknowledged before it were read",
    )
    vs.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="with --stream: give the verdict after this long even without a manifest",
    )
    _add_interval(vs)
    _add_spark_options(v)
    v.set_defaults(func=cmd_verify)


def _add_interval(p: Any) -> None:
    p.add_argument(
        "--interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --stream: print progress this often (default 5, to stderr)",
    )


def _add_spark_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    p.add_argument("--conf", action="append", metavar="KEY=VALUE", help="a Spark setting")
    add_bootstrap(p)


def _jobs() -> Any:
    """The spark_jobs module; a missing extra is one line saying what to install."""
    try:
        from rillet.client.spark import jobs as spark_jobs
    except ImportError as e:
        raise CliError(str(e)) from e
    return spark_jobs


def _session(args: argparse.Namespace, app: str) -> Any:
    """(spark_jobs module, SparkSession); a missing extra is one line saying what to
    install, before anything else happens."""
    spark_jobs = _jobs()
    return spark_jobs, spark_jobs.spark_session(
        args.master, spark_jobs.parse_conf(args.conf), app_name=app
    )


def _ensure_topic(args: argparse.Namespace) -> None:
    """Create the topic (--partitions), or check it exists: before Spark starts, so a
    missing topic costs a second, not a Spark start-up and a failed job."""
    from rillet.client.admin import AdminError, NewTopic
    from rillet.client.sync import SyncAdmin
    from rillet.client.wire.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError

    with SyncAdmin(args.bootstrap) as admin:
        if args.partitions is None:
            try:
                admin.describe_topics([args.topic])
            except AdminError as e:
                if all(isinstance(err, UnknownTopicOrPartitionError) for err in e.errors.values()):
                    raise CliError(
                        f"topic {args.topic!r} does not exist: add --partitions N "
                        "[--replication-factor R] to create it"
                    ) from None
                raise
            return
        try:
            admin.create_topics([NewTopic(args.topic, args.partitions, args.replication_factor)])
        except AdminError as e:
            if not all(isinstance(err, TopicAlreadyExistsError) for err in e.errors.values()):
                raise


def cmd_load(args: argparse.Namespace) -> int:
    return _guard(lambda: _load(args))


def _check_load_args(args: argparse.Namespace) -> None:
    if args.stream:
        if args.records is not None:
            raise CliError("--stream takes --rate and --duration, not --records")
        if not args.rate or args.rate <= 0 or not args.duration or args.duration <= 0:
            raise CliError("--stream needs --rate R (records/s) and --duration D (seconds) > 0")
    elif args.records is None:
        raise CliError("give --records N, or --stream --rate R --duration D")
    elif args.rate is not None or args.duration is not None or args.checkpoint:
        raise CliError("--rate, --duration and --checkpoint go with --stream")


def _load(args: argparse.Namespace) -> int:
    _check_load_args(args)
    _jobs()
    _ensure_topic(args)
    if args.stream:
        return _stream_load(args)
    jobs, spark = _session(args, "rillet-spark-load")
    acks = "all" if args.acks in ("all", "-1") else args.acks
    try:
        result = jobs.run_load(
            spark,
            args.bootstrap,
            args.topic,
            args.records,
            args.tasks,
            args.record_size,
            acks=acks,
            manifest=args.manifest,
            writer_options=_writer_options(args),
        )
    except jobs.LoadManifestError as e:
        raise CliError(str(e)) from e
    if args.json:
        print_json(result.to_json())
    else:
        print_load(result)
    return 0


def _stream_load(args: argparse.Namespace) -> int:
    from rillet.client.spark import streaming

    _, spark = _session(args, "rillet-spark-load-stream")
    result = streaming.run_stream_load(
        spark,
        args.bootstrap,
        args.topic,
        rate=args.rate,
        duration_s=args.duration,
        tasks=args.tasks,
        record_size=args.record_size,
        acks="all" if args.acks in ("all", "-1") else args.acks,
        checkpoint=args.checkpoint,
        writer_options=_writer_options(args),
        progress=_print_load_progress,
        interval_s=args.interval,
    )
    if args.json:
        print_json(result.to_json())
    else:
        print_stream_load(result)
    return 0 if result.status == "committed" else 1


def _print_load_progress(p: dict[str, Any]) -> None:
    print(
        f"{p['elapsed_s']:>7.1f} s  acknowledged {p['acknowledged']:,} of {p['records']:,}"
        f"  {p['records_per_s']:,.0f} records/s  batches {p['batches']}"
        f"  aborted {p['aborted_batches']}",
        file=sys.stderr,
        flush=True,
    )


def print_stream_load(r: Any) -> None:
    print(
        f"spark load --stream -> {r.topic}: {r.acknowledged:,} of {r.records:,} records "
        f"acknowledged ({r.tasks} tasks, acks={r.acks}, asked {r.rate:,}/s for "
        f"{r.duration_s:g} s)"
    )
    print(
        f"  held {r.records_per_s:,.0f} records/s over {r.produce_s:.1f} s in {r.batches} "
        f"micro-batches, {r.aborted_batches} aborted; {r.elapsed_s:.1f} s in all"
    )
    print(f"Every record acknowledged: {'yes' if r.status == 'committed' else 'no'}")
    if r.error:
        print(f"error: {r.error}", file=sys.stderr)


def _writer_options(args: argparse.Namespace) -> dict[str, str]:
    return {"maxInFlightPerPartition": "1"} if args.strict_order else {}


def print_load(r: Any, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"spark load -> {r.topic} ({r.tasks} tasks, acks={r.acks})")
    for col in ("task", "records", "MB", "seconds", "records/s", "MB/s"):
        table.add_column(col, justify="right")
    for t in r.per_task:
        table.add_row(
            str(t["task"]),
            f"{t['records']:,}",
            f"{t['bytes'] / MB:.1f}",
            f"{t['seconds']:.2f}",
            f"{t['records_per_s']:,.0f}",
            f"{t['mb_per_s']:.2f}",
        )
    table.add_row(
        "all",
        f"{r.records:,}",
        f"{r.records * r.record_size / MB:.1f}",
        f"{r.produce_s:.2f}",
        f"{r.records_per_s:,.0f}",
        f"{r.mb_per_s:.2f}",
        style="bold",
    )
    console = console or Console()
    console.print(table)
    # Two short lines: one sentence of both wrapped on an 80-column terminal.
    console.print(f"Spark job: {r.elapsed_s:.1f} s in all, scheduling and worker start included")
    console.print(f"Every record acknowledged: {'yes' if r.status == 'committed' else 'no'}")


def cmd_verify(args: argparse.Namespace) -> int:
    return _guard(lambda: _verify(args))


def _verify(args: argparse.Namespace) -> int:
    records, tasks, acked = args.records, args.tasks, None
    if args.manifest:
        manifest = json.loads(Path(args.manifest).read_text())
        records = records or manifest["records"]
        tasks = tasks or manifest["tasks"]
    if args.stream and args.manifest:
        raise CliError("--stream reads the load's manifest from the topic: drop --manifest")
    if args.timeout is not None and not args.stream:
        raise CliError("--timeout goes with --stream")
    jobs, spark = _session(args, "rillet-spark-verify")
    if args.manifest:
        acked = jobs.acked_from_manifest(manifest)
    try:
        if args.stream:
            from rillet.client.spark import streaming

            report = streaming.run_stream_verify(
                spark,
                args.bootstrap,
                args.topic,
                records,
                tasks,
                progress=_print_verify_progress,
                interval_s=args.interval,
                timeout_s=args.timeout,
            )
        else:
            report = jobs.run_verify(spark, args.bootstrap, args.topic, records, tasks, acked=acked)
    except jobs.LoadShapeError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_SHAPE_UNKNOWN
    if args.json:
        print_json(report.to_json())
    else:
        print(format_report(report))
    return {"PASS": 0, "FAIL": EXIT_VIOLATIONS, "INCONCLUSIVE": EXIT_INCONCLUSIVE}[report.verdict]


def _print_verify_progress(p: dict[str, Any]) -> None:
    print(
        f"{p['elapsed_s']:>7.1f} s  read {p['read']:,} ({p['contiguous']:,} contiguous from "
        f"seq 0 over {p['tasks']} tasks)  gaps {p['gaps']:,}  duplicates {p['duplicates']:,}"
        f"  reordered {p['reordered']:,}  corrupt {p['corrupt']:,}",
        file=sys.stderr,
        flush=True,
    )


VIOLATIONS = [
    ("lost", "lost", "acknowledged records missing"),
    ("duplicates", "duplicate", "extra copies of a record"),
    ("reordered", "reordered", "records before a lower sequence of their task"),
    ("corrupt", "corrupt", "values failing magic, length, checksum or payload"),
    ("phantom", "phantom", "well-formed records that were never sent"),
]


def format_report(r: Any) -> str:
    """The verifier's report for people: counts, then examples of each violation."""
    lines = [
        f"verify {r.topic}: read {r.read:,} records; expected {r.expected:,}, "
        f"{r.acknowledged:,} acknowledged",
    ]
    for attr, kind, meaning in VIOLATIONS:
        count = getattr(r, attr)
        allowed = attr == "duplicates" and r.duplicates_allowed
        mark = "ok  " if count == 0 else "note" if allowed else "FAIL"
        lines.append(f"  {mark} {attr:<10} {count:>8,}  {meaning}")
        for ex in r.examples.get(kind, []):
            lines.append(f"         e.g. {_example(ex)}")
    if r.unacknowledged_missing:
        lines.append(
            f"  note: {r.unacknowledged_missing:,} never-acknowledged records are "
            "missing (allowed: their task failed)"
        )
    if r.duplicates and r.duplicates_allowed:
        lines.append(
            "  note: duplicates pass: the load was streamed, and a streamed load is "
            "at-least-once (a re-run micro-batch is sent again)"
        )
    lines.extend(f"  note: {n}" for n in r.notes)
    lines.append(
        {
            "PASS": "PASS",
            "FAIL": "FAIL: the log lost, duplicated, reordered or corrupted data",
            "INCONCLUSIVE": "INCONCLUSIVE: stopped before every acknowledged record was read",
        }[r.verdict]
    )
    return "\n".join(lines)


def _example(ex: dict[str, Any]) -> str:
    parts = []
    if "task" in ex:
        parts.append(f"task {ex['task']} seq {ex['seq']}")
    if "partition" in ex:
        parts.append(f"at partition {ex['partition']} offset {ex['offset']}")
    if "after_seq" in ex:
        parts.append(f"after seq {ex['after_seq']} of the same task")
    if "at" in ex:
        parts.append(f"{ex['copies']} copies at {', '.join(ex['at'])}")
    return ", ".join(parts)


def _guard(body: Any) -> int:
    """Expected failures (no pyspark, no broker, a failed Spark job) as one line."""
    from rillet.client.admin import AdminError
    from rillet.client.wire.errors import RilletError

    try:
        return int(body())
    except (CliError, AdminError, RilletError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # Spark's own errors (a failed job) are long: keep the gist
        if type(e).__module__.startswith(("pyspark", "py4j")):
            print(f"error: the Spark job failed: {spark_error_cause(str(e))}", file=sys.stderr)
            return 1
        raise


def spark_error_cause(text: str) -> str:
    """The root cause in a Spark error: the last ``SomeError: message`` line of the
    Python traceback it carries (Spark wraps it in pages of JVM stack), else line one."""
    causes = [m.group(0) for m in re.finditer(r"^[\w.]*(?:Error|Exception): .*$", text, re.M)]
    return causes[-1].strip() if causes else text.strip().splitlines()[0]
