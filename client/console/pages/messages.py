"""Messages: browse one partition from an offset, a time, the newest or the oldest
record, either way round; search keys and values over a bounded stretch of the log;
produce a test message (not in read-only mode).

Each view costs two ListOffsets (log start and end) and the Fetches of one bounded
window (browse.py); a search scans at most ``SCAN_OFFSETS`` offsets per step and says
exactly which offsets it looked at, with a link that carries on from there.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from rillet.client.admin import EARLIEST, LATEST
from rillet.client.cli.group import parse_datetime
from rillet.client.console import browse
from rillet.client.console.context import ConsoleContext
from rillet.client.console.forms import (
    CLUSTER_ERRORS,
    command,
    error_text,
    int_param,
    link,
    same_origin,
)
from rillet.client.console.live import Fragments
from rillet.client.producer import Producer

SEARCH_CHUNK = 1_000  # offsets per read while searching
MAX_FIELD_BYTES = 64 * 1024  # a test message is small; the form says so


@dataclass(slots=True)
class Query:
    """The Messages page's query string, checked."""

    topic: str = ""
    partition: int = 0
    start_at: str = browse.NEWEST
    offset: int = 0
    ts: str = ""
    order: str = browse.DESC
    fmt: str = browse.TEXT
    q: str = ""
    limit: int = browse.PAGE_LIMIT
    side: str = ""  # which end of the page ``offset`` is; the order's default when ""

    @classmethod
    def parse(cls, params: Any) -> Query:
        def pick(name: str, choices: tuple[str, ...], default: str) -> str:
            v = params.get(name, default)
            return v if v in choices else default

        return cls(
            topic=params.get("topic", "").strip(),
            partition=int_param(params.get("partition"), 0, 0, 1 << 31),
            start_at=pick("from", browse.STARTS, browse.NEWEST),
            offset=int_param(params.get("offset"), 0, 0, 1 << 62),
            ts=params.get("ts", "").strip(),
            order=pick("order", (browse.DESC, browse.ASC), browse.DESC),
            fmt=pick("format", browse.FORMATS, browse.TEXT),
            q=params.get("q", ""),
            limit=int_param(params.get("limit"), browse.PAGE_LIMIT, 1, browse.MAX_LIMIT),
            side=pick("side", browse.SIDES, ""),
        )

    def params(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "from": self.start_at,
            "offset": self.offset if self.start_at == browse.OFFSET else None,
            "ts": self.ts if self.start_at == browse.TIMESTAMP else None,
            "order": self.order,
            "format": self.fmt,
            "q": self.q or None,
            "limit": self.limit if self.limit != browse.PAGE_LIMIT else None,
            "side": self.side if self.start_at == browse.OFFSET and self.side else None,
        }


@dataclass(slots=True)
class View:
    """What the page shows below the form."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    start: int = 0
    end: int = 0
    note: str = ""
    older: str = ""
    newer: str = ""
    searched: str = ""
    more: str = ""
    capped: bool = False


def iso(ms: int) -> str:
    """The time in ISO-8601; past what a datetime holds (year 10000 on), the number."""
    if ms < 0:
        return "-"
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):
        return f"{ms} ms"


def record_row(r: Any, fmt: str) -> dict[str, Any]:
    key, key_hidden = browse.show(r.key, fmt)
    value, value_hidden = browse.show(r.value, fmt)
    return {
        "offset": r.offset,
        "timestamp": iso(r.timestamp),
        "key": key,
        "key_null": r.key is None,
        "key_hidden": key_hidden,
        "value": value,
        "value_null": r.value is None,
        "value_hidden": value_hidden,
        "headers": browse.header_pairs(r.headers),
    }


class TestProducer:
    """One acks=all producer for the page's test messages, started on first use."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._producer: Producer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.close()
            self._producer = None

    async def get(self) -> Producer:
        async with self._lock:
            if self._producer is None:
                producer = Producer(
                    self.bootstrap,
                    acks="all",
                    linger_ms=0,
                    max_block_ms=5_000,
                    delivery_timeout_ms=15_000,
                    request_timeout_ms=5_000,
                    client_id="rillet-console",
                )
                await producer.start()
                self._producer = producer
            return self._producer


KEY_SEPARATORS = ":|=#~^\t"


def produce_command(
    bootstrap: str, topic: str, key: str, value: str, partition: int | None
) -> str | None:
    """The ``rillet produce`` line that sends the same record (headers aside: the CLI
    takes none). The key separator is one character the key does not contain; None
    when the key holds every one of them (the CLI cannot say that key)."""
    words: list[str | int] = ["rillet", "produce", topic, "--acks", "all"]
    if partition is not None:
        words += ["--partition", partition]
    line = value
    if key:
        sep = next((c for c in KEY_SEPARATORS if c not in key), None)
        if sep is None:
            return None
        words += ["--key-separator", sep]
        line = f"{key}{sep}{value}"
    words += ["--bootstrap", bootstrap]
    return f"printf '%s\\n' {command(line)} | {command(*words)}"


def parse_headers(text: str) -> list[tuple[str, bytes]]:
    """``name=value`` per line; blank lines are skipped."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"headers are name=value, one per line; got {line!r}")
        out.append((name.strip(), value.encode()))
    return out


def routes(ctx: ConsoleContext, fragments: Fragments) -> list[BaseRoute]:
    reader = browse.PartitionReader(ctx.config.bootstrap)
    ctx.services.append(reader)
    producer = TestProducer(ctx.config.bootstrap)
    if not ctx.config.read_only:
        ctx.services.append(producer)

    async def bounds(query: Query) -> tuple[int, int]:
        tp = (query.topic, query.partition)
        starts, ends = await asyncio.gather(
            ctx.admin.list_offsets({tp: EARLIEST}), ctx.admin.list_offsets({tp: LATEST})
        )
        return starts[tp], ends[tp]

    async def anchor(query: Query, start: int, end: int, view: View) -> int | None:
        if query.start_at in (browse.NEWEST, browse.OLDEST):
            return browse.anchor_for(query.start_at, query.order, start, end, query.limit)
        if query.start_at == browse.OFFSET:
            return query.offset
        try:
            ms = parse_datetime(query.ts)
        except argparse.ArgumentTypeError as e:
            view.note = str(e).replace("--to-datetime", "the time")
            return None
        tp = (query.topic, query.partition)
        found = (await ctx.admin.list_offsets({tp: ms}))[tp]
        if found < 0:
            view.note = f"No record at or after {iso(ms)}."
            return None
        # Newest first from a time: the page ends at the first record at that time.
        return found

    async def browse_view(query: Query) -> View:
        view = View()
        view.start, view.end = await bounds(query)
        at = await anchor(query, view.start, view.end, view)
        if at is None:
            return view
        if query.q:
            return await search(query, at, view)
        side = browse.side_for(query.order, query.side if query.start_at == browse.OFFSET else "")
        w = browse.window(query.order, at, view.start, view.end, query.limit, side)
        got = await reader.read(query.topic, query.partition, w, browse.PAGE_BYTES, side)
        recs = got.records if query.order == browse.ASC else list(reversed(got.records))
        view.rows = [record_row(r, query.fmt) for r in recs]
        view.capped = got.capped
        if w.empty:
            view.note = f"No records there: the log holds offsets {view.start}..{view.end - 1}."
        # The links carry on from what was read, which a byte cap may have cut short.
        shown = got.covered if not w.empty else w
        base = {**query.params(), "from": browse.OFFSET, "ts": None}
        if shown.lo > view.start:
            offset, older_side = browse.older_page(shown)
            view.older = link("/messages", base, offset=offset, side=older_side)
        if shown.hi < view.end:
            offset, newer_side = browse.newer_page(shown)
            view.newer = link("/messages", base, offset=offset, side=newer_side)
        return view

    async def search(query: Query, at: int, view: View) -> View:
        chunks = browse.scan_chunks(query.order, at, view.start, view.end, SEARCH_CHUNK)
        first = last = None
        found = []
        scan = reader.scan(query.topic, query.partition, query.order, chunks, browse.SCAN_BYTES)
        async for _, got in scan:
            recs = got.records if query.order == browse.ASC else list(reversed(got.records))
            # The offsets this step read (a byte cap may end it early), in the order shown.
            if first is None:
                first = got.lo if query.order == browse.ASC else got.next_offset - 1
            last = got.next_offset - 1 if query.order == browse.ASC else got.lo
            for r in recs:
                if browse.matches(r, query.q):
                    found.append(r)
                    if len(found) == query.limit:
                        last = r.offset
                        break
            view.capped = got.capped
            if len(found) == query.limit:
                break
        view.rows = [record_row(r, query.fmt) for r in found]
        if first is None or last is None:
            view.searched = "Nothing to search there."
            return view
        view.searched = f"Searched offsets {first}..{last}: {len(found)} match(es)."
        carry_on = last + 1 if query.order == browse.ASC else last - 1
        if view.start <= carry_on < view.end:
            view.more = link(
                "/messages",
                query.params(),
                **{"from": browse.OFFSET, "offset": carry_on, "ts": None, "side": None},
            )
        return view

    async def page(request: Request) -> Response:
        query = Query.parse(request.query_params)
        snap = ctx.snapshots.latest
        known = snap.topics_by_name.get(query.topic) if snap else None
        view, error = View(), ""
        if query.topic:
            try:
                view = await browse_view(query)
            except CLUSTER_ERRORS as e:
                error = error_text(e)
        return ctx.render(
            request,
            "messages/page.html",
            query=query,
            view=view,
            error=error,
            params=query.params(),
            link=link,
            formats=browse.FORMATS,
            topic_names=[t.name for t in snap.topics] if snap else [],
            partitions=len(known.partitions) if known else None,
        )

    async def produce(request: Request) -> Response:
        if not same_origin(request, ctx.config.loopback_names):
            return PlainTextResponse("cross-site POST refused", status_code=403)
        form = await request.form()
        topic = str(form.get("topic", "")).strip()
        key = str(form.get("key", ""))
        value = str(form.get("value", ""))
        partition_text = str(form.get("partition", "")).strip()
        values: dict[str, Any] = {"topic": topic, "key": key, "value": value, "error": ""}
        try:
            if not topic:
                raise ValueError("say which topic")
            if len(key.encode()) + len(value.encode()) > MAX_FIELD_BYTES:
                raise ValueError(f"a test message is at most {MAX_FIELD_BYTES} bytes")
            partition = int(partition_text) if partition_text else None
            headers = parse_headers(str(form.get("headers", "")))
            # Everything that can fail is done before the send: an error after it would
            # invite a retry, and so a duplicate.
            cli = produce_command(ctx.config.bootstrap, topic, key, value, partition)
            p = await producer.get()
            meta = await p.send(
                topic,
                value.encode(),
                key.encode() if key else None,
                headers=headers or None,
                partition=partition,
            )
            values.update(
                sent=meta,
                command=cli,
                headers=headers,
                browse=link(
                    "/messages",
                    {"topic": topic, "partition": meta.partition, "from": browse.NEWEST},
                ),
            )
        except CLUSTER_ERRORS as e:
            values["error"] = error_text(e)
        return ctx.render(request, "messages/_produced.html", **values)

    out: list[BaseRoute] = [Route("/messages", page, name="messages")]
    if not ctx.config.read_only:
        out.append(Route("/messages/produce", produce, methods=["POST"]))
    return out
