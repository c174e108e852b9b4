"""``rillet log dump PATH`` and ``rillet log verify PATH`` (like kafka-dump-log).

PATH is a segment file (``00000000000000000000.log``) or a partition directory.
``verify`` exits 1 naming the file and byte position of the first torn or corrupt batch
in any segment, 0 with a summary otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rillet.storage.dump import FileReport, scan_file, segment_files

COLUMNS = (
    "position",
    "base_offset",
    "last_offset",
    "leader_epoch",
    "count",
    "size",
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


def cmd_dump(args: argparse.Namespace) -> int:
    if not args.path.exists():
        print(f"no such file or directory: {args.path}", file=sys.stderr)
        return 2
    reports = [scan_file(p, with_records=args.records) for p in segment_files(args.path)]
    if args.json:
        json.dump([_report_json(r, rows=True) for r in reports], sys.stdout, default=str)
        print()
    else:
        for r in reports:
            _print_table(r, args.records)
    return 1 if any(r.problem for r in reports) else 0


def cmd_verify(args: argparse.Namespace) -> int:
    if not args.path.exists():
        print(f"no such file or directory: {args.path}", file=sys.stderr)
        return 2
    reports = [scan_file(p, keep_rows=False) for p in segment_files(args.path)]
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
        print(
            f"{'FAILED' if bad else 'OK'}: {len(reports)} segment file(s), "
            f"{sum(r.batches for r in reports)} valid batch(es), "
            f"{sum(r.records for r in reports)} record(s), "
            f"{sum(r.bytes for r in reports)} bytes checked"
        )
    return 1 if bad else 0


def _report_json(r: FileReport, *, rows: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "file": str(r.path),
        "batches": r.batches,
        "records": r.records,
        "valid_bytes": r.bytes,
        "problem": r.problem,
    }
    if rows:
        out["batches_detail"] = r.rows
    return out


def _print_table(r: FileReport, with_records: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{r.path}  ({r.batches} batches, {r.records} records)")
    for c in COLUMNS:
        table.add_column(c, justify="right" if c not in ("compression", "crc") else "left")
    for row in r.rows:
        table.add_row(*(str(row.get(c, "")) for c in COLUMNS))
        if with_records:
            for rec in row.get("records", []):
                table.add_row("", str(rec.get("offset", "")), "", "", "", "", str(rec))
    console = Console(width=None if sys.stdout.isatty() else 220)
    console.print(table)
    if r.problem:
        console.print(f"[red]stopped at byte {r.problem['position']}: {r.problem['reason']}")
