"""`rillet leader elect --preferred [TOPIC] [--partition P]`: move leadership back to each
partition's preferred replica (its first replica), as kafka-leader-election.sh does.

The controller moves a partition only when its preferred replica is live and in the ISR;
the answer says per partition: elected, already the leader (ELECTION_NOT_NEEDED), or not
possible now (PREFERRED_LEADER_NOT_AVAILABLE). The exit code is 1 when any partition could
not be elected, so scripts can retry.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rillet.client.cli.common import CliError, add_bootstrap, print_json, run

if TYPE_CHECKING:
    from rillet.client.admin import PartitionResult


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("leader", help="leader elections")
    sub = parser.add_subparsers(dest="leader_command", metavar="ACTION")
    sub.required = True

    elect = sub.add_parser(
        "elect", help="move leadership to the preferred replicas (every topic by default)"
    )
    elect.add_argument(
        "--preferred",
        action="store_true",
        help="preferred-leader election (the only kind rillet runs; required)",
    )
    elect.add_argument("topic", nargs="?", help="(every topic)")
    elect.add_argument(
        "--partition",
        type=int,
        action="append",
        metavar="P",
        help="only report these partitions of TOPIC (repeatable); the request names the "
        "topic, so its other partitions off their preferred leader move too",
    )
    add_bootstrap(elect)
    elect.set_defaults(func=cmd_elect)


def cmd_elect(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        if not args.preferred:
            raise CliError("say --preferred (unclean elections are not offered)")
        if args.partition and not args.topic:
            raise CliError("--partition needs a TOPIC")
        partitions = [(args.topic, p) for p in args.partition] if args.partition else None
        topics = [args.topic] if args.topic else None
        async with Admin(args.bootstrap) as admin:
            results = await admin.elect_leaders(topics, partitions)
        summary = summarize_election(results)
        if args.json:
            print_json(summary)
        else:
            print_summary(summary)
        return 1 if summary["failed"] else 0

    return run(main)


def summarize_election(results: list[PartitionResult]) -> dict[str, Any]:
    """Kafka's three outcomes: elected now, already led by the preferred replica, failed."""
    elected, not_needed, failed = [], [], []
    for r in results:
        name = f"{r.topic}-{r.partition}"
        if r.error is None:
            elected.append(name)
        elif r.error_name == "ELECTION_NOT_NEEDED":
            not_needed.append(name)
        else:
            failed.append(r.as_dict())
    return {"elected": elected, "not_needed": not_needed, "failed": failed}


# Names a human summary lists per outcome; --json lists every one.
SHOWN_NAMES = 10


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN_NAMES])
    rest = len(names) - SHOWN_NAMES
    return f"{shown} and {rest:,} more (--json lists them)" if rest > 0 else shown


def print_summary(summary: dict[str, Any], console: Any = None) -> None:
    """Kafka's outcomes, with a count and at most SHOWN_NAMES names each: a cluster-wide
    election of 10,000 partitions printed one line of 10,000 names."""
    from rich.console import Console

    console = console or Console(highlight=False)

    def say(text: str) -> None:
        console.print(text, markup=False)

    elected, not_needed = summary["elected"], summary["not_needed"]
    if elected:
        say(f"Preferred leader elected for {len(elected):,} partition(s): {_names(elected)}")
    if not_needed:
        say(
            f"Preferred leader already leads {len(not_needed):,} partition(s): {_names(not_needed)}"
        )
    for f in summary["failed"]:
        where = f["topic"] if f["partition"] < 0 else f"{f['topic']}-{f['partition']}"
        say(f"Election failed for {where}: {f['error']}: {f['message']}")
    if not any(summary.values()):
        say("No partitions.")
