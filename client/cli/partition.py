"""`rillet partition reassign`: move partition replicas to other brokers (KIP-455), as
kafka-reassign-partitions.sh does.

    rillet partition reassign --topic T --partition P --replicas 1,2,4      # start
    rillet partition reassign --plan plan.json                             # start many
    rillet partition reassign --status (--topic T --partition P --replicas 1,2,4 | --plan F)
    rillet partition reassign --cancel (--topic T --partition P | --plan F)

The plan file is Kafka's reassignment JSON:
``{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2, 4]}]}``
(``-`` reads it from stdin). The controller adds the new replicas at once; they copy the
log from the leader and join the ISR, and then the old replicas are dropped (and delete
their logs). Starting prints the current assignment in the same format, to roll back with.
``--status`` works from the plan (there is no ListPartitionReassignments API yet), as
Kafka's ``--verify`` does; ``--wait`` keeps polling until every partition is complete.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rillet.client.cli.common import CliError, add_bootstrap, print_json, run

if TYPE_CHECKING:
    from rillet.client.admin import Admin, ReassignmentStatus

Plan = dict[tuple[str, int], list[int]]
STATUS_POLL_S = 0.2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("partition", help="partition replica reassignment")
    sub = parser.add_subparsers(dest="partition_command", metavar="ACTION")
    sub.required = True

    r = sub.add_parser("reassign", help="move replicas to other brokers, or follow/cancel that")
    r.add_argument("--topic")
    r.add_argument("--partition", type=int)
    r.add_argument("--replicas", metavar="B1,B2,...", help="target broker ids, preferred first")
    r.add_argument(
        "--plan",
        "--reassignment-json-file",
        dest="plan",
        metavar="FILE",
        help="Kafka's reassignment JSON ({'partitions': [{topic, partition, replicas}]}); "
        "- reads stdin",
    )
    mode = r.add_mutually_exclusive_group()
    mode.add_argument(
        "--status",
        "--verify",
        dest="status",
        action="store_true",
        help="where each partition of the plan stands",
    )
    mode.add_argument("--cancel", action="store_true", help="cancel the running reassignments")
    r.add_argument("--wait", action="store_true", help="poll until every partition is complete")
    r.add_argument("--timeout-ms", type=int, default=120_000, help="bound of --wait (120000)")
    add_bootstrap(r)
    r.set_defaults(func=cmd_reassign)


# --- plans ---------------------------------------------------------------------------------


def parse_replicas(text: str) -> list[int]:
    try:
        replicas = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise CliError(f"--replicas expects broker ids like 1,2,4, got {text!r}") from None
    if not replicas:
        raise CliError("--replicas is empty")
    return replicas


def parse_plan(data: Any) -> Plan:
    """Kafka's reassignment JSON (a decoded object) to {(topic, partition): replicas}."""
    if not isinstance(data, dict) or not isinstance(data.get("partitions"), list):
        raise CliError('a plan is {"version": 1, "partitions": [...]}')
    plan: Plan = {}
    for item in data["partitions"]:
        try:
            topic, partition = str(item["topic"]), int(item["partition"])
            replicas = [int(b) for b in item.get("replicas") or []]
        except (TypeError, KeyError, ValueError):
            raise CliError(f"bad plan entry {item!r}: wants topic, partition, replicas") from None
        if (topic, partition) in plan:
            raise CliError(f"{topic}-{partition} appears twice in the plan")
        plan[(topic, partition)] = replicas
    if not plan:
        raise CliError("the plan lists no partitions")
    return plan


def plan_json(plan: Mapping[tuple[str, int], Sequence[int]]) -> dict[str, Any]:
    return {
        "version": 1,
        "partitions": [
            {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(plan.items())
        ],
    }


def _load_plan_file(path: str) -> Plan:
    try:
        text = sys.stdin.read() if path == "-" else open(path).read()  # noqa: SIM115
        return parse_plan(json.loads(text))
    except OSError as e:
        raise CliError(f"cannot read plan {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise CliError(f"plan {path} is not JSON: {e}") from None


def plan_from_args(args: argparse.Namespace, *, need_replicas: bool) -> Plan:
    if args.plan:
        if args.topic or args.partition is not None or args.replicas:
            raise CliError("give either --plan or --topic/--partition/--replicas")
        plan = _load_plan_file(args.plan)
        if need_replicas and any(not r for r in plan.values()):
            raise CliError("every plan entry needs replicas")
        return plan
    if not args.topic or args.partition is None:
        raise CliError("--topic and --partition (or --plan) are required")
    if need_replicas and not args.replicas:
        raise CliError("--replicas is required")
    replicas = parse_replicas(args.replicas) if args.replicas else []
    return {(args.topic, args.partition): replicas}


# --- the command -----------------------------------------------------------------------------


def cmd_reassign(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        plan = plan_from_args(args, need_replicas=not args.cancel)
        async with Admin(args.bootstrap) as admin:
            if args.cancel:
                await admin.alter_partition_reassignments(dict.fromkeys(plan))
                return _report_cancel(args, plan)
            if args.status:
                return _report_status(args, await _status(admin, plan, args))
            previous = await _current_assignment(admin, plan)
            await admin.alter_partition_reassignments(plan)
            statuses = await _status(admin, plan, args) if args.wait else None
        _report_started(args, plan, previous, statuses)
        return 0

    return run(main)


async def _current_assignment(admin: Admin, plan: Plan) -> Plan:
    topics = await admin.describe_topics(sorted({t for t, _ in plan}))
    replicas = {(t.name, p.partition): list(p.replicas) for t in topics for p in t.partitions}
    missing = [f"{t}-{p}" for t, p in plan if (t, p) not in replicas]
    if missing:
        raise CliError(f"unknown partitions: {', '.join(missing)}")
    return {key: replicas[key] for key in plan}


async def _status(admin: Admin, plan: Plan, args: argparse.Namespace) -> list[ReassignmentStatus]:
    """The plan's status now, or (``--wait``) once every partition is complete."""
    from rillet.client.admin import REASSIGNMENT_COMPLETE

    deadline = time.monotonic() + args.timeout_ms / 1000
    while True:
        statuses = await admin.list_partition_reassignments(plan)
        done = all(s.state == REASSIGNMENT_COMPLETE for s in statuses)
        if done or not args.wait:
            return statuses
        if time.monotonic() >= deadline:
            raise CliError(
                f"not complete after {args.timeout_ms} ms: "
                + "; ".join(_status_line(s) for s in statuses if s.state != REASSIGNMENT_COMPLETE)
            )
        await asyncio.sleep(STATUS_POLL_S)


def _status_line(s: ReassignmentStatus) -> str:
    def ids(bs: Sequence[int]) -> str:
        return ",".join(map(str, bs)) or "-"

    head = f"{s.topic}-{s.partition}: {s.state.replace('_', ' ')}"
    if s.state == "complete":
        return f"{head} (replicas {ids(s.replicas)}, leader {s.leader})"
    if s.state == "in_progress":
        return (
            f"{head} (replicas {ids(s.replicas)}, isr {ids(s.isr)}; adding {ids(s.adding)},"
            f" removing {ids(s.removing)})"
        )
    return f"{head} (replicas {ids(s.replicas)}, target {ids(s.target)} not started)"


def _report_status(args: argparse.Namespace, statuses: list[ReassignmentStatus]) -> int:
    complete = all(s.state == "complete" for s in statuses)
    if args.json:
        print_json({"complete": complete, "partitions": [s.as_dict() for s in statuses]})
    else:
        for s in statuses:
            print(_status_line(s))
    return 0


def _report_started(
    args: argparse.Namespace,
    plan: Plan,
    previous: Plan,
    statuses: list[ReassignmentStatus] | None,
) -> None:
    if args.json:
        out: dict[str, Any] = {"started": plan_json(plan), "previous": plan_json(previous)}
        if statuses is not None:
            out["partitions"] = [s.as_dict() for s in statuses]
        print_json(out)
        return
    print("Current partition replica assignment (save it to roll back):")
    print(json.dumps(plan_json(previous)))
    print(
        f"Started the reassignment of {len(plan)} partition(s): "
        + ", ".join(f"{t}-{p}" for t, p in sorted(plan))
    )
    for s in statuses or ():
        print(_status_line(s))


def _report_cancel(args: argparse.Namespace, plan: Plan) -> int:
    names = [f"{t}-{p}" for t, p in sorted(plan)]
    if args.json:
        print_json({"cancelled": names})
    else:
        print("Cancelled the reassignment of " + ", ".join(names))
    return 0
