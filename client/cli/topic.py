"""`rillet topic create|list|describe|delete|alter|configs`."""

from __future__ import annotations

import argparse
from typing import Any

from rillet.client.cli.common import (
    CliError,
    Fields,
    add_bootstrap,
    parse_configs,
    print_json,
    run,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("topic", help="create, list, describe and delete topics")
    sub = parser.add_subparsers(dest="topic_command", metavar="ACTION")
    sub.required = True

    create = sub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=-1, help="(broker default)")
    create.add_argument("--replication-factor", type=int, default=-1, help="(broker default)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    create.add_argument(
        "--if-not-exists",
        action="store_true",
        help="succeed when the topic exists already (its shape and configs are not compared)",
    )
    add_bootstrap(create)
    create.set_defaults(func=cmd_create)

    lst = sub.add_parser("list", help="list topics")
    add_bootstrap(lst)
    lst.set_defaults(func=cmd_list)

    describe = sub.add_parser("describe", help="leader, replicas and ISR of each partition")
    describe.add_argument("name", nargs="?", help="(every topic)")
    describe.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions whose ISR is smaller than their replica set",
    )
    describe.add_argument(
        "--unavailable-partitions",
        action="store_true",
        help="only offline partitions (no leader)",
    )
    add_bootstrap(describe)
    describe.set_defaults(func=cmd_describe)

    delete = sub.add_parser("delete", help="delete a topic")
    delete.add_argument("name")
    add_bootstrap(delete)
    delete.set_defaults(func=cmd_delete)

    alter = sub.add_parser(
        "alter",
        help="set or delete a topic's configs",
        description="Change a topic's configs through the active controller; every broker "
        "applies them. --delete puts a key back to its default. All the changes of one "
        "call apply together, or none does.",
    )
    alter.add_argument("name")
    alter.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", dest="set_configs"
    )
    alter.add_argument(
        "--delete", action="append", default=[], metavar="KEY", dest="delete_configs"
    )
    alter.add_argument(
        "--dry-run", action="store_true", help="validate only: check and change nothing"
    )
    add_bootstrap(alter)
    alter.set_defaults(func=cmd_alter)

    configs = sub.add_parser("configs", help="every config of a topic, with its source")
    configs.add_argument("name")
    add_bootstrap(configs)
    configs.set_defaults(func=cmd_configs)


def cmd_create(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin, AdminError, NewTopic
    from rillet.client.wire.errors import TopicAlreadyExistsError

    configs = parse_configs(args.config)

    async def main() -> int:
        created = True
        async with Admin(args.bootstrap) as admin:
            topic = NewTopic(args.name, args.partitions, args.replication_factor, configs)
            try:
                await admin.create_topics([topic])
            except AdminError as e:
                exists = isinstance(e.errors.get(args.name), TopicAlreadyExistsError)
                if not (args.if_not_exists and exists):
                    raise
                created = False
        if not created:
            if args.json:
                print_json({"exists": args.name})
            else:
                print(f"Topic {args.name} exists already.")
        elif args.json:
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
            logs = await admin.describe_logs(topics)
            configs = await admin.describe_configs(t.name for t in topics)
        described = [t.as_dict() for t in topics]
        add_logs(described, logs)
        for t in described:
            t["configs"] = {k: e.as_dict() for k, e in configs.get(t["name"], {}).items()}
        counts = partition_counts(described)
        shown = filter_partitions(
            described, args.under_replicated_partitions, args.unavailable_partitions
        )
        if args.json:
            print_json({"topics": shown, **counts})
        else:
            # A filtered listing gets no per-topic counts: they would count the filter.
            filtered = args.under_replicated_partitions or args.unavailable_partitions
            print_describe(shown, headers=not filtered)
        return 0

    return run(main)


LOG_FIELDS = (
    "log_start_offset",
    "local_log_start_offset",
    "log_end_offset",
    "size_bytes",
    "remote_log_start_offset",
    "remote_size_bytes",
    "remote_segments",
    "copy_lag_bytes",
    "copy_lag_segments",
    "remote_storage",
)


def add_logs(topics: list[dict[str, Any]], logs: dict[tuple[str, int], Any]) -> None:
    """Each partition's log figures from its leader (None where the leader did not
    answer): both tiers' log starts, sizes and the copy lag."""
    for t in topics:
        for p in t["partitions"]:
            log = logs.get((t["name"], p["partition"]))
            for name in LOG_FIELDS:
                p[name] = getattr(log, name) if log is not None else None


def partition_counts(topics: list[dict[str, Any]]) -> dict[str, int]:
    """Cluster-wide health figures over described topics (before any filter)."""
    parts = [p for t in topics for p in t["partitions"]]
    return {
        "partition_count": len(parts),
        "under_replicated_partitions": sum(p["under_replicated"] for p in parts),
        "offline_partitions": sum(p["offline"] for p in parts),
    }


def filter_partitions(
    topics: list[dict[str, Any]], under_replicated: bool, unavailable: bool
) -> list[dict[str, Any]]:
    """kafka-topics' --under-replicated-partitions / --unavailable-partitions: keep the
    partitions matching either flag, and only topics that keep some (no flag: all)."""
    if not (under_replicated or unavailable):
        return topics

    def wanted(p: dict[str, Any]) -> bool:
        return (under_replicated and p["under_replicated"]) or (unavailable and p["offline"])

    out = []
    for t in topics:
        kept = [p for p in t["partitions"] if wanted(p)]
        if kept:
            out.append({**t, "partitions": kept})
    return out


def _topic_header(t: dict[str, Any]) -> list[str]:
    """The per-topic summary as fields (kept whole when the line must wrap). Short names
    (`cluster status` uses the same words), so it fits an 80-column terminal."""
    parts = t["partitions"]
    rf = len(parts[0]["replicas"]) if parts else 0
    under = sum(p["under_replicated"] for p in parts)
    offline = sum(p["offline"] for p in parts)
    return [
        f"[bold]Topic: {t['name']}[/bold]",
        f"partitions: {len(parts)}",
        f"RF: {rf}",
        f"under-replicated: {under}",
        f"offline: {offline}",
    ]


def print_describe(
    topics: list[dict[str, Any]], *, headers: bool = True, console: Any = None
) -> None:
    from rich.console import Console

    console = console or Console()
    for t in topics:
        fields = _topic_header(t) if headers else [f"[bold]Topic: {t['name']}[/bold]"]
        console.print(Fields(fields))
        own = [f"{k}={c['value']}" for k, c in t.get("configs", {}).items() if not c["is_default"]]
        if headers and own:
            console.print(Fields(["Configs:", *own]), markup=False)
        console.print(partition_table(t["partitions"]), soft_wrap=True)
        if any(_tiered(p) for p in t["partitions"]):
            console.print(tier_table(t["partitions"]), soft_wrap=True)


PARTITION_COLUMNS = ("Partition", "Leader", "Epoch", "Replicas", "Isr")


def partition_table(parts: list[dict[str, Any]]) -> Any:
    """The partition table as one rich Text of aligned lines, laid out by hand: a rich
    Table took 9 s to lay out a topic of 10,000 partitions."""
    from rich.text import Text

    rows = [
        [
            str(p["partition"]),
            str(p["leader"]) if p["leader"] >= 0 else "none",
            str(p["leader_epoch"]),
            ",".join(map(str, p["replicas"])),
            ",".join(map(str, p["isr"])),
        ]
        for p in parts
    ]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(PARTITION_COLUMNS)]
    head = "  ".join(h.ljust(w) for h, w in zip(PARTITION_COLUMNS, widths, strict=True))
    text = Text(head.rstrip())
    last = len(widths) - 1
    for p, cells in zip(parts, rows, strict=True):
        marks = [("offline", "red")] if p["offline"] else []
        if p["under_replicated"]:
            marks.append(("under-replicated", "yellow"))
        text.append("\n")
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            padded = cell if i == last and not marks else cell.ljust(width)
            text.append(
                ("  " if i else "") + padded, style="red" if i == 1 and cell == "none" else ""
            )
        for mark, style in marks:
            text.append("  ")
            text.append(mark, style=style)
    return text


def _tiered(p: dict[str, Any]) -> bool:
    """The partition's topic tiers, or the remote tier holds some of it."""
    remote = p.get("remote_log_start_offset")
    return bool(p.get("remote_storage")) or (remote is not None and remote >= 0)


TIER_COLUMNS = ("Partition", "LocalStart", "RemoteStart", "RemoteSize", "CopyLag")


def tier_table(parts: list[dict[str, Any]]) -> Any:
    """A tiered topic's second table: per partition the local and remote log starts,
    the remote size, and the copy lag (closed segments not yet remote, and their size);
    ? where the leader did not answer, - where nothing is remote yet."""
    from rich.text import Text

    def cell(p: dict[str, Any], name: str) -> str:
        value = p.get(name)
        return "?" if value is None else str(value)

    rows = []
    for p in parts:
        known = p.get("local_log_start_offset") is not None
        remote = p.get("remote_log_start_offset")
        rows.append(
            [
                str(p["partition"]),
                cell(p, "local_log_start_offset"),
                "?" if remote is None else "-" if remote < 0 else str(remote),
                human_bytes(p["remote_size_bytes"]) if known else "?",
                f"{p['copy_lag_segments']} ({human_bytes(p['copy_lag_bytes'])})" if known else "?",
            ]
        )
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(TIER_COLUMNS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(TIER_COLUMNS, widths, strict=True)).rstrip()]
    for cells in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    return Text("\n".join(lines))


def human_bytes(n: int) -> str:
    """1023 B, 1.5 KiB, 64.0 MiB..."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


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


def cmd_alter(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        changes: dict[str, str | None] = dict(parse_configs(args.set_configs))
        for key in args.delete_configs:
            if key in changes:
                raise CliError(f"{key} is both set and deleted")
            changes[key] = None
        if not changes:
            raise CliError("nothing to change: give --set KEY=VALUE or --delete KEY")
        async with Admin(args.bootstrap) as admin:
            await admin.incremental_alter_configs({args.name: changes}, validate_only=args.dry_run)
        if args.json:
            print_json({"topic": args.name, "changes": changes, "dry_run": args.dry_run})
        else:
            done = "Validated (nothing changed)" if args.dry_run else "Altered"
            listed = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in changes.items())
            print(f"{done} configs of topic {args.name}: {listed}.")
        return 0

    return run(main)


def cmd_configs(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            configs = (await admin.describe_configs([args.name]))[args.name]
        if args.json:
            print_json(
                {"topic": args.name, "configs": {k: e.as_dict() for k, e in configs.items()}}
            )
            return 0
        from rich.console import Console
        from rich.table import Table

        table = Table("Config", "Value", "Source", box=None, title=f"Topic: {args.name}")
        for name, e in sorted(configs.items()):
            table.add_row(name, e.value or "", e.source, style="" if e.is_default else "bold")
        Console().print(table)
        return 0

    return run(main)
