"""The health view of `rillet cluster status`: fetching it, its exit code, its rich view.

Exit codes (the same for the text and the JSON output):

- 0: healthy, or degraded (under-replicated partitions that still meet min ISR, fenced
  brokers): every partition is served and accepts acks=all writes;
- 1: unhealthy: no active controller, offline partitions, or partitions under
  min.insync.replicas;
- 2: the cluster could not be reached (no broker answered), so nothing is known.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: every `rillet` command imports this module
    from rillet.client.health import ClusterHealth

EXIT_OK, EXIT_UNHEALTHY, EXIT_UNREACHABLE = 0, 1, 2
EXIT_CODES_HELP = (
    "exit codes: 0 healthy or degraded (under-replicated partitions still meeting min "
    "ISR, fenced brokers); 1 unhealthy (no active controller, offline partitions, or "
    "partitions under min.insync.replicas); 2 the cluster could not be reached"
)
STATUS_TIMEOUT_MS = 15_000
STYLES = {"healthy": "green", "degraded": "yellow", "unhealthy": "red"}


def fetch_health(
    bootstrap: str, timeout_ms: int = STATUS_TIMEOUT_MS
) -> tuple[ClusterHealth | None, str | None]:
    """(health, None), or (None, why the cluster could not be reached)."""
    from rillet.client.admin import Admin, AdminError
    from rillet.client.health import gather_health
    from rillet.client.wire.errors import RilletError

    async def main() -> ClusterHealth:
        async with Admin(bootstrap, timeout_ms=timeout_ms) as admin:
            return await gather_health(admin)

    try:
        import uvloop

        return uvloop.run(main()), None
    except (TimeoutError, RilletError, AdminError, OSError) as e:
        name = getattr(e, "name", type(e).__name__)
        return None, f"cannot reach the cluster at {bootstrap}: {name}: {e}"


def exit_code(health: ClusterHealth | None) -> int:
    if health is None:
        return EXIT_UNREACHABLE
    return EXIT_OK if health.healthy else EXIT_UNHEALTHY


def health_view(health: ClusterHealth, now_ms: int | None = None) -> Any:
    """Verdict, controller quorum, brokers, counts and problem partitions, as one rich
    renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from rillet.client.cli.common import Fields

    style = STYLES[health.status]
    parts: list[Any] = [
        Text.from_markup(f"cluster {health.cluster_id}: [bold {style}]{health.status.upper()}[/]")
    ]
    for line in health.problems:
        parts.append(Text.from_markup(f"  [red]x {line}[/red]"))
    for line in health.warnings:
        parts.append(Text.from_markup(f"  [yellow]! {line}[/yellow]"))

    quorum = Table(title="controller quorum", title_justify="left")
    for col in ("voter", "role", "log end", "lag", "last fetch"):
        quorum.add_column(col, no_wrap=True)
    if health.quorum is None:
        quorum.add_row("-", "[red]no active controller[/red]", "-", "-", "-")
    else:
        q = health.quorum
        for v in q.voters:
            role = "leader" if v.id == q.leader_id else "follower"
            lag_style = "green" if v.lag == 0 else "yellow"
            quorum.add_row(
                str(v.id),
                role,
                str(v.log_end_offset),
                f"[{lag_style}]{v.lag}[/]",
                "-" if role == "leader" else _ago(v.last_fetch_timestamp, now_ms),
            )
        quorum.caption = f"epoch {q.leader_epoch}, high watermark {q.high_watermark}"
    brokers = Table(title="brokers", title_justify="left")
    for col in ("broker", "address", "rack", "state", "leaders", "partitions", "URP"):
        brokers.add_column(col, no_wrap=True)
    for b in health.brokers:
        state = "[yellow]fenced[/yellow]" if b.fenced else "[green]unfenced[/green]"
        urp = f"[yellow]{b.under_replicated}[/yellow]" if b.under_replicated else "0"
        brokers.add_row(
            str(b.id), f"{b.host}:{b.port}", b.rack or "-", state, str(b.leaders),
            str(b.partitions), urp,
        )  # fmt: skip
    parts += [quorum, brokers]

    def count(label: str, n: int, bad: str) -> str:
        return f"{label}: [{bad if n else 'green'}]{n}[/]"

    parts.append(
        Fields(
            [
                f"topics: {health.topics}",
                f"partitions: {health.partitions}",
                count("offline", health.offline, "red"),
                count("under-min-ISR", health.under_min_isr, "red"),
                count("under-replicated", health.under_replicated, "yellow"),
            ],
            sep="   ",
        )
    )
    if health.problem_partitions:
        table = Table(title="problem partitions", title_justify="left")
        for col in ("topic", "partition", "problem", "leader", "replicas", "isr", "min ISR"):
            table.add_column(col, no_wrap=True)
        for p in health.problem_partitions:
            pstyle = "yellow" if p.problem == "under-replicated" else "red"
            table.add_row(
                p.topic, str(p.partition), f"[{pstyle}]{p.problem}[/]",
                str(p.leader) if p.leader >= 0 else "[red]none[/red]",
                ",".join(map(str, p.replicas)), ",".join(map(str, p.isr)), str(p.min_isr),
            )  # fmt: skip
        more = health.problem_partitions_total - len(health.problem_partitions)
        if more:
            table.caption = f"... and {more} more"
        parts.append(table)
    return Group(*parts)


def _ago(timestamp_ms: int, now_ms: int | None) -> str:
    if timestamp_ms < 0:
        return "never"
    if now_ms is None:
        import time

        now_ms = int(time.time() * 1000)
    return f"{max(now_ms - timestamp_ms, 0) / 1000:.1f} s ago"
