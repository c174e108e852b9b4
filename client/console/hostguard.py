"""The Host guard: a console bound to a loopback address answers only requests that
name a loopback host.

Without it, DNS rebinding reads the console: a site the operator opens makes its own
name resolve to 127.0.0.1, and its scripts then fetch the console's pages (messages,
groups, configs) as same-origin requests under that name. Every such request carries
the site's name in ``Host``, so refusing non-loopback names closes it for every route,
GET and live streams included. A console bound wider (``--host 0.0.0.0``) is meant to be
reached under other names and takes any.
"""

from __future__ import annotations

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rillet.client.console.forms import host_name, is_loopback


class LoopbackHostOnly:
    """ASGI middleware: 421 for any HTTP request whose Host is not a loopback name."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
            if not is_loopback(host_name(host)):
                refuse = PlainTextResponse(
                    "This console answers only under a loopback name (127.0.0.1, localhost).",
                    status_code=421,
                )
                await refuse(scope, receive, send)
                return
        await self.app(scope, receive, send)
