"""Before and after in one run: the same benchmarks against an older commit and this tree.

A change's speed is only comparable with figures taken on the same machine in the same
hour (a shared VM's speed drifts by tens of percent over a day), so this runs each
benchmark script of THIS tree twice per round, once importing the older commit's rillet
and once this tree's, alternating, and prints one JSON object: every run's figures and,
per metric, the median of each side and their ratio (after / before).

The older commit is checked out with ``git worktree add --detach`` under ``--work`` and
installed into its own venv (once; later runs reuse it). Its nodes and CLI run from that
venv, so a cluster benchmark measures the older brokers and clients end to end.

    python benchmarks/before_after.py --base 41e3efa~1 --rounds 3
    python benchmarks/before_after.py --base v0.1 --only storage --only cluster

Which benchmarks: ``storage`` (storage_bench.py: append, read, recovery), ``cluster``
(cluster_bench.py: perf produce per record and bulk, perf consume, brokers' CPU) and
``codec`` (codec_bench.py, when present: per-record build and decode costs); with
``--only spark`` also ``spark`` (spark_bench.py: spark load against perf produce), with
``--only e2e`` also ``e2e`` (cluster_bench.py's end-to-end latency at fixed rates).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent

# Benchmark name -> (script, arguments, the metrics compared, as JSON paths).
BENCHMARKS: dict[str, tuple[str, list[str], list[str]]] = {
    "storage": (
        "storage_bench.py",
        ["--trials", "5", "--roll-trials", "2"],
        [
            "append_mb_s",
            "append_vs_raw_ratio",
            "read_mb_s",
            "recovery_scan_mb_s",
        ],
    ),
    "cluster": (
        "cluster_bench.py",
        [
            "--num-records",
            "1000000",
            "--skip",
            "replication",
            "--skip",
            "e2e",
            "--skip",
            "failover",
        ],
        [
            "produce.records_per_s",
            "produce.brokers_cpu_s",
            "produce_bulk.records_per_s",
            "consume.records_per_s",
        ],
    ),
    "codec": ("codec_bench.py", [], []),
    # Only with --only e2e: end-to-end latency at two fixed rates, about a half and a
    # quarter of this machine's RF=3 acks=all maximum (a share of a maximum measured in
    # each run would give the two sides different loads).
    "e2e": (
        "cluster_bench.py",
        [
            *("--skip", "throughput", "--skip", "bulk", "--skip", "replication"),
            *("--skip", "failover", "--e2e-linger-ms", "5"),
            *("--e2e-rate", "450000", "250000"),
        ],
        [
            f"end_to_end.{i}.{metric}"
            for i in (0, 1)
            for metric in (
                "latency_ms.p50",
                "latency_ms.p99",
                "cpu_s.brokers",
                "broker_requests_per_s.Produce",
                "broker_requests_per_s.Fetch",
            )
        ],
    ),
    # Only with --only spark (needs Java and the spark extra in both trees).
    "spark": (
        "spark_bench.py",
        ["--tasks", "2", "4"],
        [
            f"{n}_tasks.{metric}"
            for n in (2, 4)
            for metric in (
                "perf_produce.records_per_s",
                "spark_load.records_per_s",
                "ratio_to_perf_produce",
                "spark_load.cpu_s_per_million_records.jvm",
                "spark_load.cpu_s_per_million_records.python_workers",
                "spark_load.cpu_s_per_million_records.brokers",
            )
        ],
    ),
}
OPT_IN = {"spark", "e2e"}


def sh(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def base_tree(ref: str, work: Path) -> tuple[str, Path]:
    """(commit, python) of ``ref`` checked out and installed under ``work``."""
    commit = sh("git", "rev-parse", ref, cwd=ROOT).strip()
    tree = work / f"rillet-{commit[:12]}"
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        if not tree.exists():
            sh("git", "worktree", "add", "--detach", tree, commit, cwd=ROOT)
        sh(sys.executable, "-m", "venv", tree / ".venv")
        sh(python, "-m", "pip", "install", "-q", "-e", f"{tree}[dev,spark]", cwd=tree)
    return commit, python


def dig(result: dict[str, Any], path: str) -> float | None:
    value: Any = result
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]  # a list's item by its index
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return value if isinstance(value, int | float) else None


def run_one(python: Path, script: str, args: list[str]) -> dict[str, Any]:
    # The script is this tree's; what it imports (and the nodes it starts) is python's
    # rillet. The working directory is neutral so neither tree shadows the other.
    env = {**os.environ, "PYTHONPATH": ""}
    out = sh(python, HERE / script, *args, cwd=Path("/tmp"), env=env)
    start = out.index("{")
    return json.loads(out[start:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the older commit (any git ref)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), default=[])
    parser.add_argument("--work", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    commit, base_python = base_tree(args.base, args.work)
    sides = {"before": base_python, "after": Path(sys.executable)}
    names = args.only or [
        n for n in BENCHMARKS if n not in OPT_IN and (HERE / BENCHMARKS[n][0]).exists()
    ]
    report: dict[str, Any] = {"base": commit, "rounds": args.rounds, "benchmarks": {}}
    for name in names:
        script, script_args, metrics = BENCHMARKS[name]
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            # Alternate which side goes first, so a drift within a round favours neither.
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for side in order:
                t0 = time.monotonic()
                runs[side].append(run_one(sides[side], script, script_args))
                print(
                    f"{name} round {r + 1} {side}: {time.monotonic() - t0:.0f} s", file=sys.stderr
                )
        summary: dict[str, Any] = {}
        for metric in metrics:
            b = [v for v in (dig(x, metric) for x in runs["before"]) if v is not None]
            a = [v for v in (dig(x, metric) for x in runs["after"]) if v is not None]
            if a and b:
                mb, ma = statistics.median(b), statistics.median(a)
                summary[metric] = {
                    "before": mb,
                    "after": ma,
                    "ratio": round(ma / mb, 3) if mb else None,
                }
        report["benchmarks"][name] = {"summary": summary, "runs": runs}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
