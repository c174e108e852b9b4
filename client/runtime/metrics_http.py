"""The ``/metrics`` endpoint of a node: Prometheus text exposition over a tiny HTTP/1.x
server on the node's own event loop (docs/metrics.md).

One request per connection, answered and closed: a scraper opens a connection per scrape
anyway, and a server that never keeps a connection has no idle connections to bound.
The request head is bounded in size and time, so a garbage or stalled client costs one
small buffer for a few seconds; it gets a 400 (or nothing, when it stalls) and is closed.
The answer is bounded in time too: the body (MBs on a large node) stays buffered until
the client reads it, so a scraper that never reads would pin it, and a node's shutdown
would wait on it; past ``answer_timeout_s`` the connection is reset and the buffer freed.
At most ``max_connections`` are served at once (a scraper needs one); one more is
answered 503 and closed, so many connections cannot multiply the buffered bodies.

A combined node (broker and controller in one process) serves every registry it is given
from one endpoint: each role keeps its own registry (two nodes in one process, as in the
tests, never share counters) and their families do not overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD_BYTES = 8192
REQUEST_HEAD_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 30.0  # a scraper reads a large node's MBs well within this
MAX_CONNECTIONS = 16
EPHEMERAL = -1  # metrics.port: let the OS pick a port (tests, local clusters)
METRICS_PATH = "/metrics"


class MetricsServer:
    """Serves ``GET /metrics`` (and ``HEAD``) from ``registries``; 404 elsewhere."""

    def __init__(
        self,
        registries: Sequence[CollectorRegistry],
        head_timeout_s: float = REQUEST_HEAD_TIMEOUT_S,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.registries = list(registries)
        self.head_timeout_s = head_timeout_s
        self.answer_timeout_s = answer_timeout_s
        self.max_connections = max_connections
        self._open: set[asyncio.StreamWriter] = set()
        self.answers_abandoned = 0  # answers dropped unread past answer_timeout_s
        self._server: asyncio.Server | None = None
        self.host: str | None = None
        self.port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self, host: str, port: int) -> None:
        """Bind ``host:port`` (``EPHEMERAL`` or 0: any free port)."""
        self._server = await asyncio.start_server(
            self._serve, host, max(port, 0), limit=MAX_REQUEST_HEAD_BYTES
        )
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):  # wait_closed would wait for them
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    def exposition(self) -> bytes:
        return b"".join(generate_latest(r) for r in self.registries)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= self.max_connections:
            # Written into the socket's empty buffer at once; closing does not wait on it.
            writer.write(_head(503, b"too many connections\n", "text/plain"))
            writer.close()
            return
        self._open.add(writer)
        try:
            try:
                async with asyncio.timeout(self.head_timeout_s):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                # Closed early, too long a head, or too slow: nothing worth answering
                # beyond a 400 (which a stalled client may never read).
                await _answer(writer, 400, b"bad request\n")
                return
            status, body, content_type = self._route(head)
            send_body = not head.startswith(b"HEAD ")
            async with asyncio.timeout(self.answer_timeout_s):
                await _answer(writer, status, body, content_type, send_body)
        except TimeoutError:
            self.answers_abandoned += 1
            writer.transport.abort()  # never read: drop the buffered body now
        except (ConnectionError, OSError):
            pass  # the client went away
        except Exception:
            log.exception("metrics endpoint: request failed")
        finally:
            self._open.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _route(self, head: bytes) -> tuple[int, bytes, str]:
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, b"bad request\n", "text/plain"
        method, target, _ = parts
        path = target.split("?", 1)[0]
        if path != METRICS_PATH:
            return 404, b"not found; try /metrics\n", "text/plain"
        if method not in ("GET", "HEAD"):
            return 405, b"method not allowed\n", "text/plain"
        return 200, self.exposition(), CONTENT_TYPE_LATEST


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


def _head(status: int, body: bytes, content_type: str) -> bytes:
    return (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")


async def _answer(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    content_type: str = "text/plain",
    send_body: bool = True,
) -> None:
    """The whole answer; a HEAD request's without the body (its length still told)."""
    writer.write(_head(status, body, content_type) + (body if send_body else b""))
    await writer.drain()


async def serve_metrics(
    config: Mapping[str, Any], host: str, registries: Sequence[CollectorRegistry]
) -> MetricsServer | None:
    """Start the node's endpoint on ``host`` and ``metrics.port`` (0: off, None)."""
    port = config["metrics.port"]
    if port == 0:
        return None
    server = MetricsServer(registries)
    await server.start(host, port)
    log.info("metrics served on http://%s%s", server.address, METRICS_PATH)
    return server
