"""An asyncio client connection: pipelined requests matched by correlation id.

Built on Protocol/Transport rather than streams (fewer layers per request). Many
requests may be in flight; each gets a future keyed by its correlation id. A dropped
connection fails every pending request with NetworkError. A response whose top-level
``error_code`` is non-zero is raised as the matching exception from errors.py unless
the caller passes ``raise_errors=False`` (per-partition errors live inside the fields
and are always the caller's to handle).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from rillet.client.wire import messages, schemas
from rillet.client.wire.errors import NetworkError, RequestTimedOutError, RilletError, error_for
from rillet.client.wire.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    Buffer,
    Frame,
    FrameDecoder,
    FrameError,
    Payload,
    encode_frame,
)

log = logging.getLogger(__name__)

R = TypeVar("R", covariant=True)


class RequestAbandoned(Exception):
    """Raised in a request's caller by ``Connection.abandon``: its answer will be dropped."""


class RequestMessage(Protocol[R]):
    """A request class of client/wire/messages.py, answered by an ``R``."""

    def to_header(self) -> dict[str, Any]: ...

    def response_type(self) -> type[R]: ...


DEFAULT_REQUEST_TIMEOUT_MS = 30_000  # Kafka's request.timeout.ms
DEFAULT_CONNECT_TIMEOUT_MS = 10_000
# Kafka's client connections.max.idle.ms: a client retires a connection idle this long
# itself, a minute before servers close idle ones (600000 ms), so a request is never
# sent on a connection the server is closing at that very moment.
DEFAULT_IDLE_MS = 540_000
WRITE_HIGH_WATER_BYTES = 4 * 1024 * 1024  # pause producers once this much is unsent


class _ClientProtocol(asyncio.Protocol):
    """Routes decoded frames to the owning Connection; tracks writability."""

    def __init__(self, conn: Connection, max_frame_bytes: int) -> None:
        self.conn = conn
        self.decoder = FrameDecoder(max_frame_bytes)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except FrameError as e:
            self.conn._fail(NetworkError(f"malformed frame from {self.conn.peer}: {e}"))
            return
        for frame in frames:
            self.conn._on_frame(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc!r}" if exc else ""
        self.conn._fail(NetworkError(f"connection to {self.conn.peer} closed{reason}"))
        if not self.conn._closed.done():
            self.conn._closed.set_result(None)

    def pause_writing(self) -> None:
        self.conn._writable.clear()

    def resume_writing(self) -> None:
        self.conn._writable.set()


class Connection:
    """One TCP connection to a broker or controller. Create with ``await Connection.open``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "rillet",
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        idle_ms: int = DEFAULT_IDLE_MS,
    ) -> None:
        self.host, self.port = host, port
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.idle_s = idle_ms / 1000
        self._loop = asyncio.get_running_loop()
        self._last_used = self._loop.time()
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._next_id = 0
        self._writable = asyncio.Event()
        self._writable.set()
        self._error: RilletError | None = None
        self._closed = self._loop.create_future()

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        client_id: str = "rillet",
        connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        idle_ms: int = DEFAULT_IDLE_MS,
    ) -> Connection:
        conn = cls(
            host, port, client_id=client_id, request_timeout_ms=request_timeout_ms, idle_ms=idle_ms
        )
        loop = conn._loop
        try:
            async with asyncio.timeout(connect_timeout_ms / 1000):
                transport, _ = await loop.create_connection(
                    lambda: _ClientProtocol(conn, max_frame_bytes), host, port
                )
        except (OSError, TimeoutError) as e:
            raise NetworkError(f"cannot connect to {host}:{port}: {e!r}") from e
        conn._transport = transport  # type: ignore[assignment]
        return conn

    @property
    def peer(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def closed(self) -> bool:
        """True once the connection failed or was closed. A connection with nothing in
        flight that has been idle ``idle_ms`` closes itself here, so callers that reopen a
        closed connection (every pool of them does) reopen it before the server's idle
        timeout could cut it under a request."""
        if (
            self._error is None
            and not self._pending
            and self._loop.time() - self._last_used >= self.idle_s
        ):
            self.close()
        return self._error is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def request(
        self,
        api: schemas.Api | int | str,
        fields: dict[str, Any],
        payload: Payload = b"",
        *,
        version: int | None = None,
        timeout_ms: int | None = None,
        raise_errors: bool = True,
    ) -> tuple[dict[str, Any], memoryview]:
        """Send one request and wait for its response ``(header, payload)``."""
        if not self._writable.is_set():
            await self.drain()
        correlation_id = self._send(api, fields, payload, version)
        future: asyncio.Future[Frame] = self._loop.create_future()
        self._pending[correlation_id] = future
        timeout = self.request_timeout_ms if timeout_ms is None else timeout_ms
        timer = self._loop.call_later(timeout / 1000, self._expire, correlation_id, timeout)
        try:
            header, body = await future
        finally:
            timer.cancel()
            self._pending.pop(correlation_id, None)
        code = header.get("error_code", 0)
        if code and raise_errors:
            raise error_for(code, header.get("error_message") or "")
        return header, body

    async def call(
        self,
        message: RequestMessage[R],
        payload: Payload = b"",
        *,
        version: int | None = None,
        timeout_ms: int | None = None,
        raise_errors: bool = True,
    ) -> tuple[R, memoryview]:
        """Send a typed request (client/wire/messages.py) and wait for its typed response
        and payload. With ``raise_errors=False`` a request-level error decodes too: the
        response's fields other than ``error_code``/``error_message`` are then defaults."""
        api = schemas.api_of(message)
        header, body = await self.request(
            api,
            message.to_header(),
            payload,
            version=version,
            timeout_ms=timeout_ms,
            raise_errors=raise_errors,
        )
        used = api.max_version if version is None else version
        return schemas.decode_response(api, used, header), body

    def post(
        self, message: RequestMessage[Any], payload: Payload = b"", *, version: int | None = None
    ) -> int:
        """``send_oneway`` for a typed request (acks=0 produce, Raft messages)."""
        return self._send(schemas.api_of(message), message.to_header(), payload, version)

    def send_oneway(
        self,
        api: schemas.Api | int | str,
        fields: dict[str, Any],
        payload: Payload = b"",
        *,
        version: int | None = None,
    ) -> int:
        """Send a request that gets no response (acks=0 produce); returns its correlation id.

        Does not wait for buffer space: call ``await drain()`` between sends.
        """
        return self._send(api, fields, payload, version)

    async def drain(self) -> None:
        """Wait until the write buffer is below its low-water mark (or raise if closed)."""
        if self._error is not None:
            raise self._error
        if self._writable.is_set():
            return
        waiter = asyncio.ensure_future(self._writable.wait())
        await asyncio.wait([waiter, self._closed], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._error is not None:
            raise self._error

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        """The peer's APIs: ``{api_key: (min_version, max_version)}``."""
        response, _ = await self.call(messages.ApiVersionsRequest())
        return {v.api_key: (v.min_version, v.max_version) for v in response.api_keys}

    def abandon(self) -> None:
        """Stop waiting for every request in flight: each caller gets RequestAbandoned at
        once, and the answers, when they come, are dropped. The connection stays open;
        the peer still answers in order, so a later request's answer comes after theirs."""
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(RequestAbandoned(f"request to {self.peer} abandoned"))

    def close(self) -> None:
        """Close: bytes already written (one-way sends) are flushed first; pending
        requests fail with NetworkError at once."""
        self._fail(NetworkError(f"connection to {self.peer} closed by the client"), abort=False)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    async def aclose(self) -> None:
        self.close()
        await self.wait_closed()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- internals -----------------------------------------------------------------

    def _send(
        self, api: schemas.Api | int | str, fields: dict, payload: Payload, version: int | None
    ) -> int:
        if self._error is not None:
            raise self._error
        spec = schemas.resolve(api)
        self._next_id = correlation_id = (self._next_id + 1) & 0x7FFFFFFF
        header = {
            "api": spec.key,
            "version": spec.max_version if version is None else version,
            "correlation_id": correlation_id,
            "client_id": self.client_id,
            **fields,
        }
        parts = encode_frame(header, payload)
        assert self._transport is not None
        self._last_used = self._loop.time()
        if len(parts) == 1:
            self._transport.write(parts[0])
        else:
            self._transport.writelines(parts)
        return correlation_id

    def _on_frame(self, frame: Frame) -> None:
        self._last_used = self._loop.time()
        header = frame[0]
        correlation_id = header.get("correlation_id")
        future = self._pending.get(correlation_id)  # type: ignore[arg-type]
        if future is not None:
            if not future.done():
                future.set_result(frame)
            return
        # A late answer to a request that timed out or was cancelled, or an error answer
        # to a one-way request: harmless. An id never sent means the stream is confused.
        if type(correlation_id) is int and 0 < correlation_id <= self._next_id:
            log.debug("%s: dropping response to correlation id %d", self.peer, correlation_id)
        else:
            self._fail(NetworkError(f"{self.peer} answered unknown id {correlation_id!r}"))

    def _expire(self, correlation_id: int, timeout_ms: int) -> None:
        future = self._pending.pop(correlation_id, None)
        if future is not None and not future.done():
            future.set_exception(
                RequestTimedOutError(f"no response from {self.peer} within {timeout_ms} ms")
            )

    def _fail(self, error: RilletError, *, abort: bool = True) -> None:
        """Close the transport once and fail everything waiting on this connection."""
        if self._error is not None:
            return
        self._error = error
        self._writable.set()  # wake drain() waiters; they re-check _error
        if self._transport is None:
            self._closed.set_result(None)
        elif abort:
            self._transport.abort()
        else:
            self._transport.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6 host]:port`` to (host, port); ValueError when malformed."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


async def connect_any(addresses: Iterable[str], **kwargs: Any) -> Connection:
    """Connect to the first reachable of ``host:port`` addresses, tried in order.

    ``kwargs`` go to ``Connection.open``. Raises NetworkError listing every failure.
    """
    failures: list[str] = []
    for address in addresses:
        host, port = parse_address(address)
        try:
            return await Connection.open(host, port, **kwargs)
        except NetworkError as e:
            failures.append(str(e))
    raise NetworkError("no bootstrap address reachable: " + "; ".join(failures or ["none given"]))


__all__ = ["Connection", "Buffer", "RequestMessage", "connect_any", "parse_address"]
