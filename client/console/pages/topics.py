"""Topics: the list (paged, sorted and filtered on the server, from the snapshot) and one
topic's detail (its partitions, log offsets, configs, and the groups reading it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rillet.client.admin import EARLIEST, LATEST, AdminError
from rillet.client.console import format
from rillet.client.console.context import ConsoleContext
from rillet.client.console.live import Fragments
from rillet.client.console.rows import TopicRow, int_param, paginate, sort_rows
from rillet.client.metadata import PartitionInfo
from rillet.client.wire.errors import RilletError

PAGE_SIZE = 50
PARTITIONS_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
# Sortable columns: query value -> the row's field.
SORTS: dict[str, Callable[[TopicRow], Any]] = {
    "name": lambda r: r.name,
    "partitions": lambda r: r.partitions,
    "rf": lambda r: r.replication_factor,
    "urp": lambda r: r.under_replicated,
    "size": lambda r: r.size_local,
    "remote": lambda r: r.size_remote,
    "bytes_in": lambda r: r.bytes_in,
    "records_in": lambda r: r.records_in,
}
COLUMNS = (
    ("name", "name"),
    ("partitions", "partitions"),
    ("rf", "RF"),
    ("urp", "URP"),
    ("size", "size (local)"),
    ("remote", "size (remote)"),
    ("bytes_in", "bytes in"),
    ("records_in", "records in"),
)
# A round trip per request for one topic's offsets must not hang the page.
OFFSETS_TIMEOUT_S = 5.0


def routes(ctx: ConsoleContext, fragments: Fragments) -> list[BaseRoute]:
    format.register(ctx.templates.env)

    async def topics(request: Request) -> Response:
        q = request.query_params
        query = {
            "q": q.get("q", "").strip(),
            "sort": q.get("sort", "name") if q.get("sort") in SORTS else "name",
            "dir": "desc" if q.get("dir") == "desc" else "asc",
            "internal": "1" if q.get("internal") == "1" else "",
            "size": str(int_param(q.get("size"), PAGE_SIZE, 1, MAX_PAGE_SIZE)),
        }
        snap = ctx.snapshots.latest
        rows = list(snap.topic_rows) if snap is not None else []
        if not query["internal"]:
            rows = [r for r in rows if not r.internal]
        if query["q"]:
            needle = query["q"].lower()
            rows = [r for r in rows if needle in r.name.lower()]
        rows = sort_rows(rows, SORTS[query["sort"]], query["dir"] == "desc")
        page = paginate(rows, int_param(q.get("page"), 1), int(query["size"]), query)
        # htmx asks for the table alone (filter, sort, paging); a browser for the page.
        # (A history restore asks with htmx's header too but wants the whole page.)
        partial = (
            "hx-request" in request.headers and "hx-history-restore-request" not in request.headers
        )
        template = "topics/_table.html" if partial else "topics/list.html"
        return ctx.render(
            request, template, page=page, query=query, columns=COLUMNS, partial=partial
        )

    async def topic(request: Request) -> Response:
        name = request.path_params["name"]
        snap = ctx.snapshots.latest
        desc = snap.topics_by_name.get(name) if snap is not None else None
        error = ""
        if desc is None:  # created after the snapshot, or not there at all
            try:
                (desc,) = await ctx.admin.describe_topics([name])
            except (AdminError, RilletError, OSError) as e:
                return ctx.render(
                    request, "topics/missing.html", status_code=404, name=name, error=str(e)
                )
        page = paginate(
            desc.partitions,
            int_param(request.query_params.get("page"), 1),
            PARTITIONS_PAGE_SIZE,
            {},
        )
        offsets: dict[tuple[int, int], int] = {}
        try:
            offsets = await asyncio.wait_for(
                partition_offsets(ctx, desc.name, page.rows), OFFSETS_TIMEOUT_S
            )
        except (AdminError, RilletError, OSError, TimeoutError) as e:
            error = f"log offsets unavailable: {e or type(e).__name__}"
        logs = ctx.snapshots.logs
        row = next((r for r in snap.topic_rows if r.name == name), None) if snap else None
        configs, configs_error = await topic_configs(ctx, name)  # one small round trip
        return ctx.render(
            request,
            "topics/detail.html",
            name=name,
            desc=desc,
            page=page,
            offsets=offsets,
            logs=logs.partitions if logs is not None else {},
            row=row,
            error=error,
            configs=configs,
            configs_error=configs_error,
            EARLIEST=EARLIEST,
            LATEST=LATEST,
        )

    return [
        Route("/topics", topics, name="topics"),
        Route("/topics/{name}", topic, name="topic"),
    ]


async def partition_offsets(
    ctx: ConsoleContext, topic: str, partitions: Sequence[PartitionInfo]
) -> dict[tuple[int, int], int]:
    """(partition, EARLIEST|LATEST) -> offset for the partitions shown, in one ListOffsets
    per leader for each end. A partition without a leader is left out."""
    led = [p.partition for p in partitions if p.leader >= 0]
    if not led:
        return {}
    earliest, latest = await asyncio.gather(
        ctx.admin.list_offsets({(topic, p): EARLIEST for p in led}),
        ctx.admin.list_offsets({(topic, p): LATEST for p in led}),
    )
    out = {(p, EARLIEST): o for (_, p), o in earliest.items()}
    out.update({(p, LATEST): o for (_, p), o in latest.items()})
    return out


async def topic_configs(ctx: ConsoleContext, name: str) -> tuple[list[Any], str]:
    """The topic's configs, non-defaults first (DescribeConfigs), or why there are none."""
    try:
        entries = (await ctx.admin.describe_configs([name])).get(name, {})
    except (AdminError, RilletError, OSError) as e:
        return [], str(e) or type(e).__name__
    return sorted(entries.values(), key=lambda c: (c.is_default, c.name)), ""
