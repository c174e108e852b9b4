"""The live stream: one server-sent-events response per open page.

Pages register named fragments (``Fragments.add``): a function from the latest snapshot
to an HTML string. A page subscribes to the ones it shows with
``sse-connect="/events?f=name1,name2"`` and swaps each in with ``sse-swap="name"``
(htmx's SSE extension). After every snapshot refresh the stream renders the subscribed
fragments once and sends them as events, so the cost of a live page is one render per
refresh, not a poll per element.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from rillet.client.console.snapshot import ClusterSnapshot, SnapshotCache

Fragment = Callable[[ClusterSnapshot], str]


class Fragments:
    def __init__(self) -> None:
        self._by_name: dict[str, Fragment] = {}

    def add(self, name: str, render: Fragment) -> None:
        if name in self._by_name:
            raise ValueError(f"fragment {name!r} registered twice")
        self._by_name[name] = render

    def names(self) -> set[str]:
        return set(self._by_name)

    def render(self, name: str, snapshot: ClusterSnapshot) -> str:
        return self._by_name[name](snapshot)


def sse_event(name: str, html: str) -> str:
    # Each line of the data needs its own "data:" prefix; a blank line ends the event.
    data = "\n".join(f"data: {line}" for line in html.splitlines() or [""])
    return f"event: {name}\n{data}\n\n"


def events_route(fragments: Fragments, snapshots: SnapshotCache) -> Route:
    async def events(request: Request) -> Response:
        wanted = [n for n in request.query_params.get("f", "").split(",") if n]
        unknown = [n for n in wanted if n not in fragments.names()]
        if not wanted or unknown:
            return PlainTextResponse(f"unknown or no fragments: {unknown}", status_code=400)

        async def stream() -> AsyncIterator[str]:
            async for snap in snapshots.changes():
                if await request.is_disconnected():
                    return
                for name in wanted:
                    yield sse_event(name, fragments.render(name, snap))

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return Route("/events", events)
