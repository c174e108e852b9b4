"""`rillet group list|describe|reset-offsets|delete|delete-offsets`, as Kafka's
kafka-consumer-groups.

Offsets are reset only for a group without members: a running consumer would go on
from its own position and overwrite the reset with its next commit (docs/groups.md).
reset-offsets is a dry run unless ``--execute``; new offsets are clamped to each
partition's [log start, log end], as Kafka does, since a position outside the log is
only an out-of-range error waiting for the consumer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rillet.client.cli.common import CliError, add_bootstrap, print_json, run

if TYPE_CHECKING:
    from rillet.client.admin import Admin, GroupDescription, GroupLag

TopicSpec = tuple[str, tuple[int, ...] | None]
"""A --topic argument: a topic and its partitions (None: all of them)."""

EARLIEST, LATEST, OFFSET, DATETIME, SHIFT, CURRENT = (
    "to-earliest",
    "to-latest",
    "to-offset",
    "to-datetime",
    "shift-by",
    "to-current",
)
MODES = (EARLIEST, LATEST, OFFSET, DATETIME, SHIFT, CURRENT)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "group", help="list, describe, reset offsets of and delete consumer groups"
    )
    sub = parser.add_subparsers(dest="group_command", metavar="ACTION")
    sub.required = True

    lst = sub.add_parser("list", help="list groups and their states")
    lst.add_argument(
        "--state",
        action="append",
        default=None,
        metavar="STATE",
        help="only groups in this state (e.g. Stable, Empty; any case; repeatable)",
    )
    add_bootstrap(lst)
    lst.set_defaults(func=cmd_list)

    describe = sub.add_parser(
        "describe", help="offsets, lag and owner per partition; members; state"
    )
    describe.add_argument("groups", nargs="+", metavar="GROUP")
    view = describe.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="only the members")
    view.add_argument("--state", action="store_true", help="only the group's state")
    add_bootstrap(describe)
    describe.set_defaults(func=cmd_describe)

    reset = sub.add_parser(
        "reset-offsets",
        help="set a group's committed offsets (dry run unless --execute)",
        description="Set an inactive group's committed offsets. Prints the current and "
        "new offset of each partition; writes them only with --execute. New offsets "
        "are clamped to the partition's log start and log end.",
    )
    reset.add_argument("group")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--topic",
        action="append",
        type=parse_topic,
        metavar="TOPIC[:P,P...]",
        help="a topic, or some of its partitions (repeatable)",
    )
    which.add_argument(
        "--all-topics",
        action="store_true",
        help="every partition the group has committed offsets for",
    )
    mode = reset.add_mutually_exclusive_group(required=True)
    mode.add_argument("--to-earliest", action="store_true", help="the log start")
    mode.add_argument("--to-latest", action="store_true", help="the log end")
    mode.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    mode.add_argument(
        "--to-datetime",
        type=parse_datetime,
        metavar="ISO-8601",
        help="the first record at or after this time (e.g. 2026-01-31T12:00:00Z; "
        "no zone: local time); the log end when there is none",
    )
    mode.add_argument(
        "--shift-by", type=int, metavar="N", help="the committed offset plus N (may be < 0)"
    )
    mode.add_argument(
        "--to-current",
        action="store_true",
        help="the committed offset (the log end where none), clamped into the log",
    )
    run_mode = reset.add_mutually_exclusive_group()
    run_mode.add_argument("--execute", action="store_true", help="write the new offsets")
    run_mode.add_argument("--dry-run", action="store_true", help="only show them (default)")
    add_bootstrap(reset)
    reset.set_defaults(func=cmd_reset)

    delete = sub.add_parser("delete", help="delete groups without members, with their offsets")
    delete.add_argument("groups", nargs="+", metavar="GROUP")
    add_bootstrap(delete)
    delete.set_defaults(func=cmd_delete)

    delete_offsets = sub.add_parser(
        "delete-offsets", help="delete a group's committed offsets of topics it does not read"
    )
    delete_offsets.add_argument("group")
    delete_offsets.add_argument(
        "--topic",
        action="append",
        required=True,
        type=parse_topic,
        metavar="TOPIC[:P,P...]",
        help="a topic, or some of its partitions (repeatable)",
    )
    add_bootstrap(delete_offsets)
    delete_offsets.set_defaults(func=cmd_delete_offsets)


# --- pure parts: arguments, offset resolution, tables -------------------------------


def parse_topic(text: str) -> TopicSpec:
    """``T`` (every partition) or ``T:0,2`` (those partitions)."""
    name, sep, parts = text.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"--topic needs a topic name, got {text!r}")
    if not sep:
        return name, None
    try:
        partitions = tuple(sorted({int(p) for p in parts.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--topic expects TOPIC or TOPIC:P,P... with partition numbers, got {text!r}"
        ) from None
    if any(p < 0 for p in partitions):
        raise argparse.ArgumentTypeError(f"partitions are >= 0, got {text!r}")
    return name, partitions


def parse_datetime(text: str) -> int:
    """ISO-8601 to ms since the epoch; without a zone it is local time, as in Kafka."""
    try:
        moment = datetime.fromisoformat(text)
        seconds = moment.timestamp()
    except (ValueError, OverflowError, OSError):  # OverflowError: a local time too far out
        raise argparse.ArgumentTypeError(
            f"--to-datetime expects ISO-8601 (e.g. 2026-01-31T12:00:00Z), got {text!r}"
        ) from None
    ms = int(seconds * 1000)
    # ListOffsets reads -1 as latest and -2 as earliest: a time before 1970 is no time.
    if ms < 0:
        raise argparse.ArgumentTypeError(f"--to-datetime must be 1970 or later, got {text!r}")
    return ms


@dataclass(frozen=True, slots=True)
class ResetMode:
    kind: str
    value: int = 0
    """N for to-offset and shift-by, the time in ms for to-datetime."""


def reset_mode(args: argparse.Namespace) -> ResetMode:
    """The one mode the (mutually exclusive, required) options chose."""
    if args.to_earliest:
        return ResetMode(EARLIEST)
    if args.to_latest:
        return ResetMode(LATEST)
    if args.to_offset is not None:
        return ResetMode(OFFSET, args.to_offset)
    if args.to_datetime is not None:
        return ResetMode(DATETIME, args.to_datetime)
    if args.shift_by is not None:
        return ResetMode(SHIFT, args.shift_by)
    if args.to_current:
        return ResetMode(CURRENT)
    raise CliError("choose one of --" + ", --".join(MODES))


def requested_offset(
    mode: ResetMode, *, current: int | None, start: int, end: int, at_time: int | None = None
) -> int:
    """Where ``mode`` points before clamping. ``at_time`` is the offset ListOffsets found
    for the time (-1 or None: no record at or after it, so the log end)."""
    if mode.kind == EARLIEST:
        return start
    if mode.kind == LATEST:
        return end
    if mode.kind == OFFSET:
        return mode.value
    if mode.kind == DATETIME:
        return end if at_time is None or at_time < 0 else at_time
    if mode.kind == SHIFT:
        if current is None:
            raise CliError("--shift-by needs a committed offset")
        return current + mode.value
    if mode.kind == CURRENT:
        return end if current is None else current
    raise ValueError(f"unknown reset mode {mode.kind!r}")


def clamp(offset: int, start: int, end: int) -> int:
    """Into [log start, log end]: outside it a consumer would only hit out-of-range."""
    return max(start, min(offset, end))


@dataclass(frozen=True, slots=True)
class ResetRow:
    topic: str
    partition: int
    current_offset: int | None
    requested_offset: int
    new_offset: int
    log_start_offset: int
    log_end_offset: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "current_offset": self.current_offset,
            "new_offset": self.new_offset,
            "log_start_offset": self.log_start_offset,
            "log_end_offset": self.log_end_offset,
            "clamped": self.new_offset != self.requested_offset,
        }


def plan_reset(
    mode: ResetMode,
    partitions: Iterable[tuple[str, int]],
    *,
    committed: Mapping[tuple[str, int], int],
    starts: Mapping[tuple[str, int], int],
    ends: Mapping[tuple[str, int], int],
    at_time: Mapping[tuple[str, int], int] | None = None,
) -> list[ResetRow]:
    """The new offset of each partition; a shift of a partition without a commit is an
    error naming it (there is nothing to shift from)."""
    rows = []
    for tp in sorted(set(partitions)):
        current = committed.get(tp)
        start, end = starts[tp], ends[tp]
        if mode.kind == SHIFT and current is None:
            raise CliError(f"cannot shift {tp[0]}-{tp[1]}: the group has no committed offset")
        wanted = requested_offset(
            mode,
            current=current,
            start=start,
            end=end,
            at_time=None if at_time is None else at_time.get(tp),
        )
        rows.append(ResetRow(*tp, current, wanted, clamp(wanted, start, end), start, end))
    return rows


def expand_topics(
    specs: Sequence[TopicSpec], partition_counts: Mapping[str, int]
) -> list[tuple[str, int]]:
    """--topic arguments to partitions; a partition the topic does not have is an
    error (a topic missing from ``partition_counts`` was checked by the caller)."""
    out: set[tuple[str, int]] = set()
    for name, partitions in specs:
        count = partition_counts[name]
        for p in range(count) if partitions is None else partitions:
            if p >= count:
                raise CliError(f"topic {name!r} has no partition {p} (it has {count})")
            out.add((name, p))
    return sorted(out)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns two spaces apart; None or empty shows as '-', as Kafka's
    tool does, so every row has every column."""
    cells = [list(headers)] + [["-" if c is None or c == "" else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def _partitions_text(parts: Mapping[str, Sequence[int]]) -> str:
    return ",".join(f"{t}:{'/'.join(map(str, ps))}" for t, ps in sorted(parts.items()) if ps) or "-"


def offsets_table(lag: GroupLag) -> str:
    rows = [
        (
            lag.group.group_id,
            p.topic,
            p.partition,
            p.committed_offset,
            p.log_end_offset,
            p.lag,
            p.member.member_id if p.member else None,
            p.member.client_host if p.member else None,
            p.member.client_id if p.member else None,
        )
        for p in lag.partitions
    ]
    headers = (
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "MEMBER-ID",
        "HOST",
        "CLIENT-ID",
    )
    return format_table(headers, rows)


def members_table(desc: GroupDescription) -> str:
    if not desc.members:
        return f"Consumer group '{desc.group_id}' has no active members."
    rows = [
        (
            desc.group_id,
            mb.member_id,
            mb.instance_id,
            mb.client_host,
            mb.client_id,
            mb.rack,
            mb.member_epoch,
            sum(len(ps) for ps in mb.assignment.values()),
            _partitions_text(mb.assignment),
            _partitions_text(mb.target),
        )
        for mb in desc.members
    ]
    headers = (
        "GROUP",
        "MEMBER-ID",
        "INSTANCE-ID",
        "HOST",
        "CLIENT-ID",
        "RACK",
        "EPOCH",
        "#PARTITIONS",
        "ASSIGNMENT",
        "TARGET",
    )
    return format_table(headers, rows)


def state_table(desc: GroupDescription) -> str:
    row = (
        desc.group_id,
        desc.coordinator,
        desc.assignor or None,
        desc.state,
        desc.group_epoch,
        desc.assignment_epoch,
        len(desc.members),
    )
    headers = (
        "GROUP",
        "COORDINATOR",
        "ASSIGNOR",
        "STATE",
        "GROUP-EPOCH",
        "ASSIGNMENT-EPOCH",
        "#MEMBERS",
    )
    return format_table(headers, [row])


# --- commands -----------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            groups = await admin.list_groups(args.state)
        if args.json:
            print_json({"groups": [g.as_dict() for g in groups]})
        else:
            rows = [(g.group_id, g.state, g.type, g.coordinator) for g in groups]
            print(format_table(("GROUP", "STATE", "TYPE", "COORDINATOR"), rows))
        return 0

    return run(main)


def cmd_describe(args: argparse.Namespace) -> int:
    import asyncio

    from rillet.client.admin import Admin, AdminError, GroupLag

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            if args.members or args.state:
                calls = [admin.describe_groups([g]) for g in args.groups]
            else:
                calls = [admin.group_lag(g) for g in args.groups]
            answers = await asyncio.gather(*calls, return_exceptions=True)
        failed = [a for a in answers if isinstance(a, BaseException)]
        if any(not isinstance(a, AdminError) for a in failed):
            raise next(a for a in failed if not isinstance(a, AdminError))
        found: list[Any] = [
            a if isinstance(a, GroupLag) else a[0]
            for a in answers
            if not isinstance(a, BaseException)
        ]
        if args.json:
            print_json({"groups": [d.as_dict() for d in found]})
        else:
            blocks = []
            for d in found:
                if isinstance(d, GroupLag):
                    blocks += [offsets_table(d), members_table(d.group), state_table(d.group)]
                elif args.members:
                    blocks.append(members_table(d))
                else:
                    blocks.append(state_table(d))
            if blocks:
                print("\n\n".join(blocks))
        for e in failed:
            print(f"error: {e}", file=sys.stderr)
        return 1 if failed else 0

    return run(main)


async def _refuse_if_active(admin: Admin, group: str) -> None:
    """An offset change on a group with members is refused before anything is read:
    its consumers would carry on from their own positions and overwrite it. A group
    the coordinator does not know has no members (its offsets may still be set)."""
    from rillet.client.admin import ACTIVE_MEMBERS, AdminError
    from rillet.client.wire.errors import GroupIdNotFoundError

    try:
        (desc,) = await admin.describe_groups([group])
    except AdminError as e:
        if isinstance(e.errors.get(group), GroupIdNotFoundError):
            return
        raise
    if desc.members:
        raise CliError(
            f"group {group!r} {ACTIVE_MEMBERS} ({len(desc.members)} member(s), state {desc.state})"
        )


async def _topic_partitions(admin: Admin, specs: Sequence[TopicSpec]) -> list[tuple[str, int]]:
    names = sorted({name for name, _ in specs})
    topics = await admin.describe_topics(names)  # AdminError names unknown topics
    return expand_topics(specs, {t.name: len(t.partitions) for t in topics})


async def plan_group_reset(
    admin: Admin, group: str, topics: Sequence[TopicSpec] | None, mode: ResetMode
) -> list[ResetRow]:
    """The new offset of each partition of ``topics`` (None: every partition the group
    committed), refused for a group with members; nothing is written. The console's
    reset action plans with this too, so both show the same plan."""
    from rillet.client.admin import EARLIEST as LIST_EARLIEST
    from rillet.client.admin import LATEST as LIST_LATEST

    await _refuse_if_active(admin, group)
    committed = {tp: c.offset for tp, c in (await admin.list_group_offsets(group)).items()}
    if topics is None:
        partitions = sorted(committed)
        if not partitions:
            raise CliError(f"group {group!r} has no committed offsets to reset")
    else:
        partitions = await _topic_partitions(admin, topics)
    starts = await admin.list_offsets(dict.fromkeys(partitions, LIST_EARLIEST))
    ends = await admin.list_offsets(dict.fromkeys(partitions, LIST_LATEST))
    at_time = None
    if mode.kind == DATETIME:
        at_time = await admin.list_offsets(dict.fromkeys(partitions, mode.value))
    return plan_reset(
        mode, partitions, committed=committed, starts=starts, ends=ends, at_time=at_time
    )


def cmd_reset(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    mode = reset_mode(args)

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            topics = None if args.all_topics else args.topic
            rows = await plan_group_reset(admin, args.group, topics, mode)
            if args.execute:
                await admin.alter_group_offsets(
                    args.group, {(r.topic, r.partition): r.new_offset for r in rows}
                )
        if args.json:
            print_json(
                {
                    "group": args.group,
                    "mode": mode.kind,
                    "executed": bool(args.execute),
                    "partitions": [r.as_dict() for r in rows],
                }
            )
            return 0
        for r in rows:
            if r.new_offset != r.requested_offset:
                edge = "log start" if r.requested_offset < r.log_start_offset else "log end"
                print(
                    f"note: {r.topic}-{r.partition}: offset {r.requested_offset} is outside "
                    f"the log; using the {edge}, {r.new_offset}",
                    file=sys.stderr,
                )
        table = [(args.group, r.topic, r.partition, r.current_offset, r.new_offset) for r in rows]
        print(format_table(("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"), table))
        if args.execute:
            print(f"Wrote the new offsets of group {args.group}.")
        else:
            print("Dry run: nothing was written. Add --execute to write these offsets.")
        return 0

    return run(main)


def cmd_delete(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            results = await admin.delete_groups(args.groups)
        if args.json:
            print_json({"results": [r.as_dict() for r in results]})
        else:
            for r in results:
                if r.ok:
                    print(f"Deleted group {r.group_id}.")
        for r in results:
            if r.error is not None:
                print(f"error: {r.error.name}: {r.error}", file=sys.stderr)
        return 0 if all(r.ok for r in results) else 1

    return run(main)


def cmd_delete_offsets(args: argparse.Namespace) -> int:
    from rillet.client.admin import Admin

    async def main() -> int:
        async with Admin(args.bootstrap) as admin:
            partitions = await _topic_partitions(admin, args.topic)
            await admin.delete_group_offsets(args.group, partitions)
        if args.json:
            print_json(
                {
                    "group": args.group,
                    "deleted": [{"topic": t, "partition": p} for t, p in partitions],
                }
            )
        else:
            names = ", ".join(f"{t}-{p}" for t, p in partitions)
            print(f"Deleted the committed offsets of group {args.group} for {names}.")
        return 0

    return run(main)
