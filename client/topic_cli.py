"""`rillet topic create|list|describe|delete`."""

from __future__ import annotations

import argparse
from typing import Any

from rillet.client.cli_common import add_bootstrap, parse_configs, print_json, run


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("topic", help="create, list, describe and delete topics")
    sub = parser.add_subparsers(dest="topic_command", metavar="ACTION")
    sub.required = True

    create = sub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=-1, help="(broker default)")
    create.add_argument("--replication-factor", type=int, default=-1, help="(broker default)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    add_bootstrap(create)
    create.set_defaults(func=cmd_create)

    lst = sub.add_parser("list", help="list topics")
    add_bootstrap(lst)
    lst.set_defaults(func=cmd_list)

    describe = sub.add_parser("describe", help="leader, replicas and ISR of each partition")
    describe.add_argument("name", nargs="?", help="(every topic)")
    add_bootstrap(describe)
    describe.set_defaults(func=cmd_describe)

    delete = sub.add_parser("delete", help="delete a topic")
    delete.add_argument("name")
    add_bootstrap(delete)
    delete.set_defaults(func=cmd_delete)


def cmd_create(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin, NewTopic

    configs = parse_configs(args.config)

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            topic = NewTopic(args.name, args.partitions, args.replication_factor, configs)
            await admin.create_topics([topic])
        if args.json:
            print_json(
                {
                    "created": args.name,
                    "partitions": args.partitions,
                    "replication_factor": args.replication_factor,
                    "configs": configs,
                }
            )
        else:
            print(f"Created topic {args.name}.")
        return 0

    return run(main)


def cmd_list(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            names = await admin.list_topics()
        if args.json:
            print_json({"topics": names})
        else:
            for name in names:
                print(name)
        return 0

    return run(main)


def cmd_describe(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            topics = await admin.describe_topics([args.name] if args.name else None)
        if args.json:
            print_json({"topics": [t.as_dict() for t in topics]})
        else:
            _print_describe([t.as_dict() for t in topics])
        return 0

    return run(main)


def _print_describe(topics: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for t in topics:
        parts = t["partitions"]
        rf = len(parts[0]["replicas"]) if parts else 0
        under = sum(p["under_replicated"] for p in parts)
        console.print(
            f"[bold]Topic: {t['name']}[/bold]\tPartitionCount: {len(parts)}\t"
            f"ReplicationFactor: {rf}\tUnderReplicated: {under}"
        )
        table = Table(box=None, pad_edge=False)
        for col in ("Partition", "Leader", "Epoch", "Replicas", "Isr", ""):
            table.add_column(col)
        for p in parts:
            leader = str(p["leader"]) if p["leader"] >= 0 else "[red]none[/red]"
            mark = "[yellow]under-replicated[/yellow]" if p["under_replicated"] else ""
            table.add_row(
                str(p["partition"]), leader, str(p["leader_epoch"]),
                ",".join(map(str, p["replicas"])), ",".join(map(str, p["isr"])), mark,
            )  # fmt: skip
        console.print(table)


def cmd_delete(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            await admin.delete_topics([args.name])
        if args.json:
            print_json({"deleted": args.name})
        else:
            print(f"Deleted topic {args.name}.")
        return 0

    return run(main)
