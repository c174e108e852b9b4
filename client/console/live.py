"""The live stream: one server-sent-events response per open page.

Pages register named fragments (``Fragments.add``): a function from the latest snapshot
to an HTML string. A page subscribes to the ones it shows with
``sse-connect="/events?f=name1,name2"`` and swaps each in with ``sse-swap="name"``
(htmx's SSE extension). After every snapshot refresh the stream renders the subscribed
fragments and sends them as events, so the cost of a live page is one render per
refresh, not a poll per element. A fragment is rendered once per snapshot however many
streams want it, and a stream names each fragment once, at most ``MAX_FRAGMENTS``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from rillet.client.console.snapshot import ClusterSnapshot, SnapshotCache

Fragment = Callable[[ClusterSnapshot], str]
MAX_FRAGMENTS = 32
"""More names than any page shows: a longer list is refused, not rendered."""


class Fragments:
    def __init__(self) -> None:
        self._by_name: dict[str, Fragment] = {}
        # The last snapshot rendered and what each fragment gave for it.
        self._for: ClusterSnapshot | None = None
        self._rendered: dict[str, str] = {}

    def add(self, name: str, render: Fragment) -> None:
        if name in self._by_name:
            raise ValueError(f"fragment {name!r} registered twice")
        self._by_name[name] = render

    def names(self) -> set[str]:
        return set(self._by_name)

    def render(self, name: str, snapshot: ClusterSnapshot) -> str:
        """The fragment for ``snapshot``, rendered once for every stream that asks."""
        if snapshot is not self._for:
            self._for, self._rendered = snapshot, {}
        html = self._rendered.get(name)
        if html is None:
            html = self._rendered[name] = self._by_name[name](snapshot)
        return html

    def wanted(self, names: str) -> list[str]:
        """The comma-separated names a stream asks for, each once, in order; ValueError
        for none, too many or an unknown one."""
        wanted = list(dict.fromkeys(n for n in names.split(",") if n))
        if not wanted:
            raise ValueError("no fragments named")
        if len(wanted) > MAX_FRAGMENTS:
            raise ValueError(f"at most {MAX_FRAGMENTS} fragments per stream")
        unknown = [n for n in wanted if n not in self._by_name]
        if unknown:
            raise ValueError(f"unknown fragments: {unknown[:5]}")
        return wanted


def sse_event(name: str, html: str) -> str:
    # Each line of the data needs its own "data:" prefix; a blank line ends the event.
    data = "\n".join(f"data: {line}" for line in html.splitlines() or [""])
    return f"event: {name}\n{data}\n\n"


def events_route(fragments: Fragments, snapshots: SnapshotCache) -> Route:
    async def events(request: Request) -> Response:
        try:
            wanted = fragments.wanted(request.query_params.get("f", ""))
        except ValueError as e:
            return PlainTextResponse(str(e), status_code=400)

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
