"""``rillet log dump PATH``, ``rillet log verify PATH`` (like kafka-dump-log) and
``rillet log convert DIR``.

PATH is a segment file (``00000000000000000000.log``) or a partition directory.
``verify`` exits 1 naming the file and byte position of the first torn or corrupt batch
(length, CRC, or records that do not decode) in any segment, 0 with a summary otherwise;
batches in the legacy format are counted, not failed. ``convert`` rewrites them as v2
(``storage/convert.py``); DIR is a data dir or a partition dir.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rillet.client.cli.common import Fields
from rillet.storage.dump import FileReport, scan_file, segment_files

COLUMNS = (
    "position",
    "base_offset",
    "last_offset",
    "leader_epoch",
    "count",
    "size",
    "format",
    "base_timestamp",
    "max_timestamp",
    "compression",
    "crc",
    "crc_valid",
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("log", help="inspect segment files on disk")
    sub = parser.add_subparsers(dest="log_command", metavar="ACTION")
    sub.required = True
    dump = sub.add_parser("dump", help="print every batch of a segment file or partition dir")
    dump.add_argument("path", type=Path)
    dump.add_argument("--json", action="store_true", help="one JSON document on stdout")
    dump.add_argument("--records", action="store_true", help="include each record")
    dump.set_defaults(func=cmd_dump)
    verify = sub.add_parser("verify", help="check every batch's length and CRC")
    verify.add_argument("path", type=Path)
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=cmd_verify)
    convert = sub.add_parser("convert", help="rewrite legacy-format batches as v2 (broker stopped)")
    convert.add_argument("path", type=Path, help="a broker data dir or one partition dir")
    convert.add_argument("--dry-run", action="store_true", help="report, write nothing")
    convert.add_argument("--json", action="store_true")
    convert.set_defaults(func=cmd_convert)


def cmd_dump(args: argparse.Namespace) -> int:
    if not args.path.exists():
        print(f"no such file or directory: {args.path}", file=sys.stderr)
        return 2
    reports = [scan_file(p, with_records=args.records) for p in segment_files(args.path)]
    if args.json:
        json.dump([_report_json(r, rows=True) for r in reports], sys.stdout, default=str)
        print()
    else:
        console = _console()
        for r in reports:
            print_report(r, args.records, console)
    return 1 if any(r.problem for r in reports) else 0


def cmd_verify(args: argparse.Namespace) -> int:
    if not args.path.exists():
        print(f"no such file or directory: {args.path}", file=sys.stderr)
        return 2
    reports = [scan_file(p, keep_rows=False, decode=True) for p in segment_files(args.path)]
    bad = [r.problem for r in reports if r.problem]
    if args.json:
        json.dump(
            {
                "ok": not bad,
                "problems": bad,
                "files": [_report_json(r, rows=False) for r in reports],
            },
            sys.stdout,
        )
        print()
    else:
        for p in bad:
            print(f"CORRUPT {p['file']} at byte {p['position']}: {p['reason']}")
        print_verify_summary(reports, bad, _console())
        legacy = sum(r.legacy for r in reports)
        if legacy:
            print(
                f"{legacy} batch(es) in the legacy format (readable; "
                "`rillet log convert` rewrites them as v2)"
            )
    return 1 if bad else 0


def cmd_convert(args: argparse.Namespace) -> int:
    from rillet.storage.convert import ConvertError, convert

    if not args.path.is_dir():
        print(f"no such directory: {args.path}", file=sys.stderr)
        return 2
    try:
        results = convert(args.path, dry_run=args.dry_run)
    except ConvertError as e:
        print(f"convert: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(
            {"dry_run": args.dry_run, "logs": [asdict(r) for r in results]},
            sys.stdout,
            default=str,
        )
        print()
        return 0
    verb = "would convert" if args.dry_run else "converted"
    for r in results:
        if not r.segments:
            print(f"{r.path}: no legacy batches")
            continue
        print(
            f"{r.path}: {verb} {r.batches} batch(es), {r.records} record(s) in "
            f"{r.segments} segment(s), {r.bytes_before} -> {r.bytes_after} bytes"
        )
    return 0


def print_verify_summary(reports: list[FileReport], bad: list, console: Any) -> None:
    # Broken between its figures only: one line of them wrapped on an 80-column terminal.
    fields = [
        f"{'FAILED' if bad else 'OK'}: {len(reports)} segment file(s),",
        f"{sum(r.batches for r in reports)} valid batch(es),",
        f"{sum(r.records for r in reports)} record(s),",
        f"{sum(r.bytes for r in reports)} bytes checked",
    ]
    console.print(Fields(fields, sep=" "))


def _report_json(r: FileReport, *, rows: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "file": str(r.path),
        "batches": r.batches,
        "records": r.records,
        "valid_bytes": r.bytes,
        "legacy_batches": r.legacy,
        "problem": r.problem,
    }
    if rows:
        out["batches_detail"] = r.rows
    return out


# Columns a narrow terminal hides first (--json always has every field).
NARROW_DROP_ORDER = (
    "base_timestamp",
    "crc",
    "compression",
    "max_timestamp",
    "leader_epoch",
    "format",
)
# Shorter headings than the JSON keys, so the table fits 80 columns with most of them.
HEADINGS = {
    "base_offset": "offset",
    "last_offset": "last",
    "leader_epoch": "epoch",
    "size": "bytes",
    "base_timestamp": "first_ts",
    "max_timestamp": "max_ts",
    "compression": "codec",
    "format": "fmt",
    "crc_valid": "valid",
}


def _console() -> Any:
    from rich.console import Console

    # A pipe or file gets every column; a terminal gets what fits its width.
    return Console(width=None if sys.stdout.isatty() else 220)


def print_report(r: FileReport, with_records: bool, console: Any = None) -> None:
    console = console or _console()
    if with_records:
        _print_records(r, console)
        return
    columns = list(COLUMNS)
    hidden: list[str] = []
    table = _batch_table(r, columns)
    unbounded = console.options.update_width(1 << 16)  # a measure is capped at the width
    for name in NARROW_DROP_ORDER:
        if console.measure(table, options=unbounded).maximum <= console.width:
            break
        columns.remove(name)
        hidden.append(name)
        table = _batch_table(r, columns)
    console.print(Fields([str(r.path), f"({r.batches} batches, {r.records} records)"]))
    console.print(table)
    if hidden:
        console.print(f"[dim]not shown at this width: {', '.join(hidden)} (--json has them)[/]")
    _print_problem(r, console)


def _batch_table(r: FileReport, columns: list[str]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for c in columns:
        justify = "left" if c in ("compression", "crc", "crc_valid") else "right"
        table.add_column(HEADINGS.get(c, c), justify=justify, no_wrap=True)
    for row in r.rows:
        table.add_row(*(str(row.get(c, "")) for c in columns))
    return table


def _print_records(r: FileReport, console: Any) -> None:
    """Every batch as one line and its records under it, written as they come: a rich
    table of a segment's hundreds of thousands of records took minutes to lay out."""
    out = console.file
    out.write(f"{r.path}  ({r.batches} batches, {r.records} records)\n")
    for row in r.rows:
        batch = "  ".join(f"{HEADINGS.get(c, c)}: {row[c]}" for c in COLUMNS if c in row)
        out.write(f"{batch}\n")
        for rec in row.get("records", ()):
            out.write("| " + "  ".join(f"{k}: {v}" for k, v in rec.items()) + "\n")
    out.flush()
    _print_problem(r, console)


def _print_problem(r: FileReport, console: Any) -> None:
    if r.problem:
        console.print(f"[red]stopped at byte {r.problem['position']}: {r.problem['reason']}")
