"""Consumer groups: the list (state, members, partitions, total lag; sorted, filtered
and paged on the server from the background lag cache), one group's page (members,
lag per partition, state and epochs, total lag over time), and the lag of the groups
reading one topic as a fragment the topic page loads.

The list and the fragment cost no cluster request: they read ``GroupLagCache``. A
group's own page asks the cluster about that one group (Admin.group_lag), so it shows
the lag as of now; its chart draws the cache's history.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from rillet.client.console.context import ConsoleContext
from rillet.client.console.forms import CLUSTER_ERRORS, error_text, int_param, link, paginate
from rillet.client.console.group_lag import GroupLagCache, GroupRow
from rillet.client.console.live import Fragments

SORTS = {
    "lag": lambda r: (r.lag, r.group_id),
    "group": lambda r: r.group_id,
    "state": lambda r: (r.state, r.group_id),
    "members": lambda r: (r.members if r.members is not None else -1, r.group_id),
    "partitions": lambda r: (r.partitions, r.group_id),
}
MAX_PARTITION_ROWS = 1_000  # of one group's page; the rest is counted


def list_rows(cache: GroupLagCache, ctx: ConsoleContext) -> list[GroupRow]:
    """The groups of the latest snapshot, each with the cache's lag where it has one: a
    group created since the last lag refresh shows without lag, a deleted one goes,
    even while the lag refresh fails."""
    snap = ctx.snapshots.latest
    if snap is None:
        return list(cache.rows.values())
    return [
        cache.rows.get(g.group_id)
        or GroupRow(g.group_id, g.state, g.coordinator, None, 0, 0, computed=False)
        for g in snap.groups
    ]


def routes(ctx: ConsoleContext, fragments: Fragments) -> list[BaseRoute]:
    cache = GroupLagCache(ctx.admin, ctx.snapshots, 2 * ctx.config.refresh_s, ctx.config.history_s)
    ctx.services.append(cache)

    async def groups(request: Request) -> Response:
        qp = request.query_params
        q = qp.get("q", "").strip()
        state = qp.get("state", "")
        sort = qp.get("sort", "lag") if qp.get("sort") in SORTS else "lag"
        desc = qp.get("dir", "desc" if sort == "lag" else "asc") == "desc"
        rows = [
            r
            for r in list_rows(cache, ctx)
            if q.lower() in r.group_id.lower() and (not state or r.state.lower() == state.lower())
        ]
        rows.sort(key=SORTS[sort], reverse=desc)
        paged = paginate(rows, int_param(qp.get("page"), 1, 1, 1 << 31))
        params = {"q": q, "state": state, "sort": sort, "dir": "desc" if desc else "asc"}
        states = sorted({r.state for r in list_rows(cache, ctx)})
        template = "groups/_table.html" if request.headers.get("hx-request") else "groups/list.html"
        return ctx.render(
            request,
            template,
            paged=paged,
            params=params,
            states=states,
            link=link,
            cache=cache,
        )

    async def detail(request: Request) -> Response:
        group = request.path_params["group"]
        values: dict[str, Any] = {"group": group, "lag": None, "error": "", "link": link}
        try:
            lag = await ctx.admin.group_lag(group)
            values["lag"] = lag
            values["rows"] = sorted(
                lag.partitions, key=lambda p: (-(p.lag or 0), p.topic, p.partition)
            )[:MAX_PARTITION_ROWS]
        except CLUSTER_ERRORS as e:
            values["error"] = error_text(e)
        return ctx.render(request, "groups/detail.html", **values)

    async def lag_json(request: Request) -> Response:
        """The group's total lag over time, as uPlot's columns: [[times], [lags]]."""
        points = cache.history.get(request.query_params.get("group", ""), ())
        return JSONResponse([[t for t, _ in points], [lag for _, lag in points]])

    async def by_topic(request: Request) -> Response:
        topic = request.path_params["topic"]
        rows = sorted(
            ((r, r.topics[topic]) for r in cache.rows.values() if topic in r.topics),
            key=lambda rt: (-rt[1].lag, rt[0].group_id),
        )
        return ctx.render(request, "groups/_by_topic.html", topic=topic, rows=rows, cache=cache)

    # Any path under /groups/ is a group id (ids may hold "/" and "."), so the data the
    # pages load lives under a prefix of its own.
    return [
        Route("/groups", groups, name="groups"),
        Route("/groups-data/by-topic/{topic:path}", by_topic),
        Route("/groups-data/lag.json", lag_json),
        Route("/groups/{group:path}", detail),
    ]
