"""The console's ASGI application (Starlette) and the server that runs it (uvicorn on
uvloop, the event loop every other rillet process uses)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from rillet.client.admin import Admin
from rillet.client.console.context import HERE, ConsoleConfig, ConsoleContext
from rillet.client.console.hostguard import LoopbackHostOnly
from rillet.client.console.live import Fragments, events_route
from rillet.client.console.pages import actions, groups, messages, overview, topics
from rillet.client.console.snapshot import SnapshotCache
from rillet.client.wire.errors import RilletError

log = logging.getLogger(__name__)

# Each page module exposes routes(ctx, fragments) -> list of routes; actions come last
# and add nothing in read-only mode.
PAGES: tuple[Callable[[ConsoleContext, Fragments], list[BaseRoute]], ...] = (
    overview.routes,
    topics.routes,
    messages.routes,
    groups.routes,
    actions.routes,
)
# A refresh must finish well inside a few seconds; the Admin's own default (30 s) would
# leave the page frozen on an old snapshot for that long when a broker hangs.
ADMIN_TIMEOUT_MS = 5_000


def create_app(config: ConsoleConfig, admin: Admin | None = None) -> Starlette:
    admin = admin or Admin(
        config.bootstrap,
        timeout_ms=ADMIN_TIMEOUT_MS,
        request_timeout_ms=ADMIN_TIMEOUT_MS,
        client_id="rillet-console",
    )
    snapshots = SnapshotCache(
        admin,
        config.refresh_s,
        config.history_s,
        logs_every_s=config.logs_s,
        metrics=config.metrics,
    )
    ctx = ConsoleContext(config, admin, snapshots)
    fragments = Fragments()
    routes: list[BaseRoute] = []
    for page in PAGES:
        routes.extend(page(ctx, fragments))
    routes.append(events_route(fragments, snapshots))
    routes.append(Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await admin.start()
        except (RilletError, OSError) as e:
            # Serve anyway: the pages say the cluster does not answer, and the snapshot
            # loop keeps asking until it does.
            log.warning("console: no broker of %s answers yet: %s", config.bootstrap, e)
        await snapshots.start()
        for service in ctx.services:
            await service.start()
        try:
            yield
        finally:
            for service in reversed(ctx.services):
                await service.stop()
            await snapshots.stop()
            await admin.close()

    # Bound to loopback, only loopback names may ask (hostguard.py: DNS rebinding).
    guard = [Middleware(LoopbackHostOnly)] if config.loopback_names else []
    app = Starlette(routes=routes, lifespan=lifespan, middleware=guard)
    app.state.ctx = ctx
    return app


def bind(host: str, port: int) -> socket.socket:
    """Bind before serving so port 0 gives an ephemeral port the caller can print."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


async def serve(
    config: ConsoleConfig,
    on_ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until cancelled, interrupted or ``stop`` is set; ``on_ready(url)`` once
    listening."""
    sock = bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            loop="none",
            lifespan="on",
            log_level="warning",
            access_log=False,
            # Open live streams (one per browser tab) never end on their own: without a
            # bound, a stop would wait for every tab to close.
            timeout_graceful_shutdown=2,
        )
    )
    server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
    shown = f"[{host}]" if ":" in host else host

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        if on_ready is not None:
            on_ready(f"http://{shown}:{port}")

    async def stop_when_asked() -> None:
        if stop is not None:
            await stop.wait()
            server.should_exit = True

    helpers = [asyncio.create_task(announce()), asyncio.create_task(stop_when_asked())]
    try:
        await server.serve(sockets=[sock])
    finally:
        for task in helpers:
            task.cancel()
        sock.close()
