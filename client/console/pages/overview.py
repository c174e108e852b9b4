"""Overview: the brokers, the cluster-wide health counts and their chart, live.

The tables and counts are fragments of the live stream (live.py): re-rendered once per
snapshot and pushed to every open overview. The chart polls a small JSON endpoint with
the snapshot history (``/overview/history.json``) and redraws itself."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from rillet.client.console import format
from rillet.client.console.context import ConsoleContext
from rillet.client.console.live import Fragments
from rillet.client.console.snapshot import SnapshotCache


def routes(ctx: ConsoleContext, fragments: Fragments) -> list[BaseRoute]:
    format.register(ctx.templates.env)
    brokers = ctx.templates.get_template("overview/_brokers.html")
    counts = ctx.templates.get_template("overview/_counts.html")
    fragments.add("overview-brokers", lambda s: brokers.render(snapshot=s))
    fragments.add("overview-counts", lambda s: counts.render(snapshot=s))
    quorum = ctx.templates.get_template("overview/_quorum.html")
    fragments.add("overview-quorum", lambda s: quorum.render(snapshot=s))

    async def page(request: Request) -> Response:
        return ctx.render(request, "overview/page.html", refresh_s=ctx.config.refresh_s)

    async def history(request: Request) -> Response:
        return JSONResponse(history_columns(ctx.snapshots))

    return [
        Route("/", page, name="overview"),
        Route("/overview/history.json", history, name="overview-history"),
    ]


def history_columns(snapshots: SnapshotCache) -> dict[str, list[float] | float]:
    """The chart's data as uPlot takes it: one list per series, x in seconds; and how
    long the last refreshes took (the benchmark reads them)."""
    samples = list(snapshots.history)
    return {
        "refresh_took_s": round(snapshots.refresh_took_s, 4),
        "logs_took_s": round(snapshots.logs_took_s, 4),
        "t": [round(s.at, 3) for s in samples],
        "under_replicated": [s.under_replicated for s in samples],
        "offline": [s.offline for s in samples],
        "under_min_isr": [s.under_min_isr for s in samples],
    }
