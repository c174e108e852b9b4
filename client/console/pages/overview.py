"""Overview: the brokers, the cluster-wide health counts and their chart, live."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rillet.client.console.context import ConsoleContext
from rillet.client.console.live import Fragments
from rillet.client.console.snapshot import ClusterSnapshot


def routes(ctx: ConsoleContext, fragments: Fragments) -> list[BaseRoute]:
    brokers = ctx.templates.get_template("overview/_brokers.html")
    counts = ctx.templates.get_template("overview/_counts.html")
    ctx.templates.env.globals["broker_rows"] = broker_rows
    fragments.add("overview-brokers", lambda s: brokers.render(snapshot=s))
    fragments.add("overview-counts", lambda s: counts.render(snapshot=s))

    async def page(request: Request) -> Response:
        return ctx.render(request, "overview/page.html")

    return [Route("/", page, name="overview")]


def broker_rows(snapshot: ClusterSnapshot) -> list[dict[str, object]]:
    """One row per registered broker: fenced or not, leaders and partitions it holds."""
    leaders: dict[int, int] = {}
    replicas: dict[int, int] = {}
    for t in snapshot.topics:
        for p in t.partitions:
            leaders[p.leader] = leaders.get(p.leader, 0) + 1
            for r in p.replicas:
                replicas[r] = replicas.get(r, 0) + 1
    fenced = set(snapshot.cluster.fenced)
    return [
        {
            "id": b.node_id,
            "address": b.address,
            "rack": b.rack or "-",
            "fenced": b.node_id in fenced,
            "leaders": leaders.get(b.node_id, 0),
            "partitions": replicas.get(b.node_id, 0),
        }
        for b in snapshot.cluster.brokers
    ]
