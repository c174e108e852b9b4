"""The server side of the wire protocol, shared by brokers and controllers.

``RpcServer(handlers)`` maps API keys to ``async def handler(request) -> Response | None``.
Per connection it decodes frames, checks each header against client/wire/schemas.py and
decodes it into its typed request (``Request.message``, client/wire/messages.py), starts
handlers in arrival order (each as a task, so their first steps run in that order: a
handler that must order side effects does them before its first ``await``), runs them
concurrently and writes responses strictly in arrival order. A handler answers with a
``Response`` holding a typed response message (or a bare header map) and payload parts.

What a peer can do wrong, and what happens (nothing a peer sends may crash the node):

- unknown API or unsupported version -> UNSUPPORTED_VERSION response, keep serving;
- fields that do not fit the schema -> INVALID_REQUEST response, keep serving;
- the handler raises -> UNKNOWN_SERVER_ERROR response (logged), keep serving;
- a frame over ``max_request_bytes``, bytes that are not a frame, or a header without an
  integer ``api``/``correlation_id`` -> close that connection (no way to answer it);
- more than ``max_connections``, or than ``max_connections_per_ip`` from one address ->
  the new connection is closed at once;
- a frame begun but not finished within ``request_read_timeout_ms`` (a slow or stalled
  sender) -> close that connection; nothing in flight for ``idle_ms`` -> close it too;
- more than ``max_in_flight`` requests unanswered on a connection -> stop reading it
  until answers go out (requests already read wait in order, no more are read);
- partly received frames of every connection together past ``max_partial_request_bytes``
  -> a connection whose frame does not fit stops being read until others finish theirs.
- many (or large) requests at once, on one connection or many -> the node starts at most
  ``dispatch_per_turn`` units of them per turn of the event loop (``DispatchTurns``), the
  rest on later turns, in order: timers (heartbeats, Raft) run in between.

Memory at the edge is bounded by what peers have actually sent (the decoder grows a
split frame's buffer as bytes arrive) and by the limits above; docs/protocol.md,
"Limits at the edge", states the bound.

Payload parts may be ``FileRange``s, sent from the file without building Python bytes of
them. uvloop has no ``loop.sendfile``; the two ways left were measured, see
``FILE_SEND_MODE``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rillet.client.wire import messages, schemas
from rillet.client.wire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    RilletError,
    UnknownServerError,
    UnsupportedVersionError,
)
from rillet.client.wire.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    PREFIX,
    SIZE_FIELD,
    Buffer,
    Frame,
    FrameDecoder,
    FrameError,
    decode_header,
    encode_header,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_MAX_CONNECTIONS_PER_IP = 1_000
DEFAULT_IDLE_MS = 600_000  # Kafka's connections.max.idle.ms
# A frame begun must be whole within this: clients time a request out after their
# request.timeout.ms (30 s by default), so a frame still unfinished by then belongs to a
# request its sender has given up on, or to a sender that dribbles bytes on purpose.
DEFAULT_REQUEST_READ_TIMEOUT_MS = 30_000
DEFAULT_MAX_IN_FLIGHT = 100
DEFAULT_MAX_PARTIAL_REQUEST_BYTES = 256 * 1024 * 1024
# A split frame this small needs no reservation from the node-wide budget: control
# traffic (heartbeats, fetch requests, Raft messages) must never wait behind large
# produce requests, or a held acks=all produce could wait for the very fetch that frees it.
UNRESERVED_FRAME_BYTES = 64 * 1024
WRITE_HIGH_WATER_BYTES = 8 * 1024 * 1024  # stop reading a peer that does not read its answers
# Work the whole node starts per turn of the event loop, in units: a request costs one
# unit per started DISPATCH_UNIT_BYTES of its header. A handler's first step runs without
# a break (a Metadata answer is built in one go), its Python work grows with the header's
# items (payload bytes are handled in C), and one read may hold a hundred pipelined
# requests; started together, a hundred Metadata requests naming 20,000 topics each held
# the loop for seconds, and the broker's heartbeats with it (the controller fenced it).
# Timers and other connections get a turn between every eight small requests, or after
# one large one (started alone), instead; a turn costs microseconds, so throughput is kept.
DISPATCH_PER_TURN = 8
DISPATCH_UNIT_BYTES = 4096

# How FileRange payloads reach the socket ("pread" or "sendfile"). Measured on this
# 2-core machine (uvloop server process, client in another process on loopback, 8
# requests in flight, 1 GiB fetched as ranges of a cached 64 MiB file; best of 3 runs,
# tests/test_rpc_bench.py):
#
#   mode      range     throughput   server CPU
#   pread     64 KiB    1210-1280 MiB/s  0.62-0.65 s/GiB
#   sendfile  64 KiB     860-1100 MiB/s  0.66-0.96 s/GiB
#   pread      1 MiB    2090-2290 MiB/s  0.40-0.45 s/GiB
#   sendfile   1 MiB    1620-1690 MiB/s  0.34-0.42 s/GiB
#
# pread + write (one copy, in C) wins on throughput: sendfile must wait for the
# transport's buffer to empty before each file part (a pipeline stall) and then poll a
# dup of the socket on EAGAIN, and it saves little CPU. So pread is the default;
# sendfile stays selectable (and tested) for larger ranges or another loop.
FILE_SEND_MODE = "pread"


@dataclass(frozen=True, slots=True)
class FileRange:
    """``length`` bytes of a file from ``offset``: an open fd (the server dup()s it when
    the handler returns, so the owner may close its own fd at once) or a path."""

    file: int | str | os.PathLike[str]
    offset: int
    length: int


PayloadPart = Buffer | FileRange


@dataclass(frozen=True, slots=True)
class Response:
    # A response class of client/wire/messages.py; a bare header map for request-level
    # errors (and tests that send what no schema allows).
    message: Any
    payload: Sequence[PayloadPart] = ()
    # Called once, when the response's bytes have all left this server for the socket,
    # or when they never will (the connection closed, the answer was dropped): what a
    # handler holds for the payload (memory counted against a budget) may go then.
    on_written: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class Request:
    api: schemas.Api
    version: int
    correlation_id: int
    client_id: str
    fields: dict[str, Any]  # the whole decoded header, defaults filled in
    payload: memoryview
    peer: str
    message: Any = None  # the typed request (client/wire/messages.py), validated
    listener: str = ""  # the name of the listener it arrived on (a broker answers by it)


Handler = Callable[[Request], Awaitable[Response | None]]


@dataclass(slots=True)
class _Pinned:
    """A FileRange with its own fd, valid until the response is written."""

    fd: int
    offset: int
    length: int


@dataclass(slots=True)
class _Slot:
    """One request's place in the connection's response order."""

    correlation_id: int
    task: asyncio.Task[Response | None] | None = None
    response: Response | None = None  # immediate answers (errors) when task is None
    parts: list[Any] = field(default_factory=list)
    writing: bool = False  # its sendfile writer has started (and cleans up after itself)

    def ready(self) -> bool:
        return self.task is None or self.task.done()


def _pin(part: FileRange) -> _Pinned:
    if isinstance(part.file, int):
        fd = os.dup(part.file)
    else:
        fd = os.open(part.file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    return _Pinned(fd, part.offset, part.length)


def _pin_parts(payload: Sequence[PayloadPart]) -> list[Any]:
    pinned: list[Any] = []
    try:
        for p in payload:
            pinned.append(_pin(p) if isinstance(p, FileRange) else p)
    except BaseException:
        _unpin(pinned)
        raise
    return pinned


def _read_parts(payload: Sequence[PayloadPart]) -> list[Any]:
    """The payload with every FileRange read into bytes (one pread each)."""
    out: list[Any] = []
    for p in payload:
        if not isinstance(p, FileRange):
            out.append(p)
        elif isinstance(p.file, int):
            out.append(_pread_exact(_Pinned(p.file, p.offset, p.length)))
        else:
            fd = os.open(p.file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                out.append(_pread_exact(_Pinned(fd, p.offset, p.length)))
            finally:
                os.close(fd)
    return out


def _unpin(parts: list[Any]) -> None:
    for p in parts:
        if type(p) is _Pinned and p.fd >= 0:
            os.close(p.fd)
            p.fd = -1


def _error_response(error: RilletError) -> Response:
    # error_code and error_message only: ErrorResponse's controller hints are NOT_CONTROLLER's
    return Response({"error_code": error.code, "error_message": error.message or str(error)})


def _header_of(message: Any) -> dict[str, Any]:
    """A response's header map: a message's fields, or a bare map's copy."""
    return dict(message) if type(message) is dict else message.to_header()


class PeerWarnings:
    """Warnings that a peer's input causes, rate-limited: ``burst`` at once, then
    ``per_s`` a second. A peer sending garbage in a loop must not fill the node's disk
    with log lines; the lines held back are counted, and the next line logged says how
    many there were."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        per_s: float = 10.0,
        burst: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.per_s, self.burst, self.clock = logger, per_s, burst, clock
        self.tokens = float(burst)
        self.last = clock()
        self.suppressed = 0

    def warning(self, msg: str, *args: object) -> None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.per_s)
        self.last = now
        if self.tokens < 1:
            self.suppressed += 1
            return
        self.tokens -= 1
        if self.suppressed:
            msg, args = msg + " (and %d similar, not logged)", (*args, self.suppressed)
            self.suppressed = 0
        self.logger.warning(msg, *args)


class PartialRequestBudget:
    """The node-wide budget for bytes of partly received request frames.

    A connection whose split frame is larger than ``UNRESERVED_FRAME_BYTES`` reserves the
    frame's announced length before reading more of it, and gives it back once the frame
    is whole (or the connection goes). A reservation that does not fit waits, in arrival
    order, with reading paused. Reserving the whole announced length (not bytes as they
    come) means a frame that got its reservation can always finish: reservations taken
    piece by piece could each hold half the budget and wait for each other forever. A
    frame larger than the whole budget is let in alone, when nothing else is reserved.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reserved = 0
        self.waiters: deque[_ServerProtocol] = deque()

    def fits(self, nbytes: int) -> bool:
        return self.reserved == 0 or self.reserved + nbytes <= self.limit

    def try_reserve(self, nbytes: int) -> bool:
        if self.waiters or not self.fits(nbytes):
            return False
        self.reserved += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.reserved -= nbytes
        self.grant()

    def grant(self) -> None:
        waiters = self.waiters
        while waiters:
            conn = waiters[0]
            nbytes = conn.decoder.pending_frame_bytes
            if not self.fits(nbytes):
                return
            waiters.popleft()
            self.reserved += nbytes
            conn.on_reserved(nbytes)

    def forget(self, conn: _ServerProtocol) -> None:
        try:
            self.waiters.remove(conn)
        except ValueError:
            return
        self.grant()


class DispatchTurns:
    """The node-wide share of requests started per loop turn (``DISPATCH_PER_TURN``).

    A connection takes one unit per request it starts; when none is left, it waits and
    its requests stay in its backlog, unread input with them (reading pauses). The next
    turn (a ``call_soon`` callback, so timers and I/O ran in between) refills the share
    and lets waiting connections go, in the order they began to wait: a connection cut
    short goes to the back, so pipelining connections take turns.
    """

    def __init__(self, per_turn: int) -> None:
        self.per_turn = per_turn
        self.left = per_turn
        self.waiters: deque[_ServerProtocol] = deque()
        self.armed = False

    def take(self, cost: int) -> bool:
        """Take ``cost`` units of this turn's share, or refuse: the request waits for a
        later turn. One costing more than a whole share starts alone in a fresh turn."""
        if cost > self.left:
            if self.left < self.per_turn:
                return False
            cost = self.left
        self.left -= cost
        self.arm()
        return True

    def wait(self, conn: _ServerProtocol) -> None:
        if not conn.waiting_turn:
            conn.waiting_turn = True
            self.waiters.append(conn)
            self.arm()

    def arm(self) -> None:
        if not self.armed:
            self.armed = True
            asyncio.get_running_loop().call_soon(self.next_turn)

    def next_turn(self) -> None:
        self.armed = False
        self.left = self.per_turn
        waiters = self.waiters
        for _ in range(len(waiters)):
            if self.left <= 0:
                break
            conn = waiters.popleft()
            conn.waiting_turn = False
            if not conn.closing:
                conn.flush()  # waits again (at the back) if its backlog outlasts the share
        if waiters:
            self.arm()


class RpcServer:
    """Serve ``handlers`` (``{api_key: handler}``) on one TCP port."""

    def __init__(
        self,
        handlers: dict[int, Handler],
        *,
        max_request_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_ip: int = DEFAULT_MAX_CONNECTIONS_PER_IP,
        max_connections_per_ip_overrides: Mapping[str, int] | None = None,
        idle_ms: int = DEFAULT_IDLE_MS,
        request_read_timeout_ms: int = DEFAULT_REQUEST_READ_TIMEOUT_MS,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_partial_request_bytes: int = DEFAULT_MAX_PARTIAL_REQUEST_BYTES,
        dispatch_per_turn: int = DISPATCH_PER_TURN,
        name: str = "rpc",
        file_send_mode: str = FILE_SEND_MODE,
        validate_responses: bool = False,
    ) -> None:
        if file_send_mode not in ("pread", "sendfile"):
            raise ValueError(f"file_send_mode must be pread or sendfile, not {file_send_mode!r}")
        if min(idle_ms, request_read_timeout_ms, max_in_flight, max_partial_request_bytes) <= 0:
            raise ValueError("timeouts, max_in_flight and the partial-request budget must be > 0")
        for key in handlers:
            schemas.resolve(key)  # KeyError now, not at the first request
        self.handlers: dict[int, Handler] = {schemas.API_VERSIONS.key: self._api_versions}
        self.handlers.update(handlers)
        self.max_request_bytes = max_request_bytes
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.per_ip_overrides = dict(max_connections_per_ip_overrides or {})
        self.idle_s = idle_ms / 1000
        self.read_timeout_s = request_read_timeout_ms / 1000
        self.max_in_flight = max_in_flight
        self.budget = PartialRequestBudget(max_partial_request_bytes)
        self.turns = DispatchTurns(dispatch_per_turn)
        self.name = name
        self.file_send_mode = file_send_mode
        self.validate_responses = validate_responses
        self.connections: set[_ServerProtocol] = set()
        self.per_ip: dict[str, int] = {}
        self.warnings = PeerWarnings(log)
        self._servers: list[asyncio.AbstractServer] = []
        self.host: str | None = None  # the first listener's
        self.port: int | None = None
        self.ports: dict[str, int] = {}  # listener name -> port bound

    async def start(self, host: str = "127.0.0.1", port: int = 0, listener: str = "") -> None:
        """Listen; ``port`` 0 picks an ephemeral port, then available as ``self.port``.
        Called again, listens on one more socket (a named listener: each request says
        which it came in on); every socket shares the connection limits."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _ServerProtocol(self, listener), host, port)
        self._servers.append(server)
        bound_host, bound_port = server.sockets[0].getsockname()[:2]
        if self.port is None:
            self.host, self.port = bound_host, bound_port
        self.ports[listener] = bound_port
        log.info("%s: listening on %s:%d %s", self.name, bound_host, bound_port, listener)

    @property
    def sockets(self) -> list[Any]:
        """Every listening socket."""
        return [sock for server in self._servers for sock in server.sockets]

    async def stop(self) -> None:
        """Stop listening, drop every connection and cancel handlers still running."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for conn in list(self.connections):
            conn.shutdown()
        for server in servers:
            await server.wait_closed()

    async def __aenter__(self) -> RpcServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _api_versions(self, request: Request) -> Response:
        keys = [
            messages.ApiVersionRange(key, api.min_version, api.max_version)
            for key in sorted(self.handlers)
            for api in (schemas.APIS[key],)
        ]
        return Response(messages.ApiVersionsResponse(api_keys=keys))


class _ServerProtocol(asyncio.Protocol):
    """One peer connection: decode, dispatch in order, answer in order."""

    def __init__(self, server: RpcServer, listener: str = "") -> None:
        self.server = server
        self.listener = listener
        self.decoder = FrameDecoder(server.max_request_bytes)
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.peer = "?"
        self.host: str | None = None  # set once counted in server.per_ip
        self.slots: deque[_Slot] = deque()
        # read, not yet dispatched (past max_in_flight or this turn's share), with its cost
        self.backlog: deque[tuple[Frame, int]] = deque()
        self.closing = False
        self.eof = False
        self.writer_busy = False  # an async file send owns the socket right now
        self.writer_task: asyncio.Task[None] | None = None
        self.empty_waiter: asyncio.Future[None] | None = None
        # Response.on_written callbacks waiting for the write buffer to empty.
        self.on_drained: list[Callable[[], None]] = []
        # While they wait: the buffer's smallest size since it last shrank (what was
        # written meanwhile added), and when that was.
        self.drain_size = 0
        self.drain_since = 0.0
        self.writable_fd = -1  # dup of the socket, polled for writability by sendfile
        self.paused: set[str] = set()  # why reading is paused: writing, in-flight, budget
        self.reserved = 0  # bytes of the budget this connection's split frame holds
        self.waiting = False  # in the budget's waiters
        self.waiting_turn = False  # in the dispatch turns' waiters
        self.last_active = 0.0  # loop time of the last byte read or answer written
        self.frame_started = 0.0  # when the split frame now gathered began (or reading resumed)
        self.timer: asyncio.TimerHandle | None = None
        self.timer_when = 0.0

    # --- asyncio callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        server = self.server
        peername = transport.get_extra_info("peername")
        self.peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        host = str(peername[0]) if peername else "?"
        if len(server.connections) >= server.max_connections:
            self.refuse(f"{len(server.connections)} connections open")
            return
        per_ip_limit = server.per_ip_overrides.get(host, server.max_connections_per_ip)
        if server.per_ip.get(host, 0) >= per_ip_limit:
            self.refuse(f"{per_ip_limit} connections open from {host}")
            return
        server.connections.add(self)
        server.per_ip[host] = server.per_ip.get(host, 0) + 1
        self.host = host
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)
        self.last_active = self.loop.time()
        self.arm(server.idle_s)

    def refuse(self, why: str) -> None:
        self.server.warnings.warning("%s: refusing %s: %s", self.server.name, self.peer, why)
        self.closing = True
        assert self.transport is not None
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        decoder = self.decoder
        had_partial = decoder.buffered_bytes > 0
        try:
            frames = decoder.feed(data)
        except FrameError as e:
            self.drop(f"malformed frame: {e}")
            return
        now = self.last_active = self.loop.time()
        if frames and self.reserved:  # the first frame out is the split one it reserved for
            self.server.budget.release(self.reserved)
            self.reserved = 0
        if decoder.buffered_bytes and (frames or not had_partial):
            self.frame_started = now
            if self.timer_when > now + self.server.read_timeout_s:
                self.arm(self.server.read_timeout_s)
        cap, turns = self.server.max_in_flight, self.server.turns
        for frame, header_size in zip(frames, decoder.header_sizes, strict=True):
            if self.closing:
                return
            cost = 1 + header_size // DISPATCH_UNIT_BYTES
            if self.backlog or len(self.slots) >= cap or not turns.take(cost):
                self.backlog.append((frame, cost))
            else:
                self.dispatch(frame)
        if self.closing:
            return
        need = decoder.pending_frame_bytes
        if need > UNRESERVED_FRAME_BYTES and not self.reserved and not self.waiting:
            if self.server.budget.try_reserve(need):
                self.reserved = need
            else:
                self.waiting = True
                self.server.budget.waiters.append(self)
                self.pause("budget")
        if self.backlog or len(self.slots) >= cap:
            self.pause("in-flight")  # the backlog is one read's frames at most
        self.flush()

    def on_reserved(self, nbytes: int) -> None:
        """The budget granted this connection's waiting reservation."""
        self.waiting = False
        self.reserved = nbytes
        self.resume("budget")

    def pause(self, reason: str) -> None:
        if not self.paused and self.transport is not None and not self.closing:
            self.transport.pause_reading()
        self.paused.add(reason)

    def resume(self, reason: str) -> None:
        if reason not in self.paused:
            return
        self.paused.discard(reason)
        if not self.paused and self.transport is not None and not self.closing:
            self.transport.resume_reading()
            # The read timeout holds the peer to its own pace: time we did not read
            # while a frame was split is not held against it.
            self.frame_started = self.loop.time()

    def arm(self, delay: float) -> None:
        when = self.loop.time() + delay
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(when, self.on_timer)
        self.timer_when = when

    def on_timer(self) -> None:
        """The idle and request-read timeouts, checked lazily: one timer per connection,
        re-armed for whichever deadline applies now (activity does not touch it)."""
        self.timer = None
        if self.closing:
            return
        server, now = self.server, self.loop.time()
        if self.on_drained and self.transport is not None:
            # Answers whose ``on_written`` holds a budget shared by every connection: a
            # peer that stopped reading them must not hold it forever. Reading slowly is
            # fine; no progress for the request read timeout is not.
            size = self.transport.get_write_buffer_size()
            if size < self.drain_size:
                self.drain_size, self.drain_since = size, now
            elif now - self.drain_since >= server.read_timeout_s:
                self.drop(
                    f"answers not read for {server.read_timeout_s * 1000:.0f} ms"
                    f" ({size} bytes unsent)"
                )
                return
            self.arm(min(server.read_timeout_s, self.drain_since + server.read_timeout_s - now))
        elif self.paused:  # we hold the reader (or the peer holds our answers): no deadline
            self.arm(server.read_timeout_s)
        elif self.decoder.buffered_bytes:
            deadline = self.frame_started + server.read_timeout_s
            if now < deadline:
                self.arm(deadline - now)
                return
            self.drop(
                f"request not received within {server.read_timeout_s * 1000:.0f} ms"
                f" ({self.decoder.buffered_bytes} of"
                f" {self.decoder.pending_frame_bytes or '?'} bytes)"
            )
        elif self.slots or self.backlog or self.writer_busy:
            self.arm(server.idle_s)
        else:
            deadline = self.last_active + server.idle_s
            if now < deadline:
                self.arm(deadline - now)
                return
            log.debug("%s: closing idle connection from %s", server.name, self.peer)
            self.closing = True
            assert self.transport is not None
            self.transport.close()

    def eof_received(self) -> bool:
        # The peer half-closed: answer what it already sent, then close (flush() does).
        self.eof = True
        self.close_if_done()
        return True

    def close_if_done(self) -> None:
        if (
            self.eof
            and not self.slots
            and not self.backlog
            and not self.writer_busy
            and self.transport is not None
        ):
            self.closing = True
            self.transport.close()  # flushes the answers already written

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        server = self.server
        server.connections.discard(self)
        if self.host is not None:
            left = server.per_ip[self.host] - 1
            if left:
                server.per_ip[self.host] = left
            else:
                del server.per_ip[self.host]
            self.host = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.waiting:
            self.waiting = False
            server.budget.forget(self)
        if self.reserved:
            server.budget.release(self.reserved)
            self.reserved = 0
        self.backlog.clear()
        for slot in self.slots:
            if slot.task is not None:
                slot.task.cancel()
                if slot.task.done() and not slot.task.cancelled() and not slot.task.exception():
                    _written(slot.task.result())  # answered, never to be sent
            _unpin(slot.parts)
        self.slots.clear()
        drained, self.on_drained = self.on_drained, []
        for callback in drained:
            callback()
        if self.empty_waiter is not None and not self.empty_waiter.done():
            self.empty_waiter.cancel()
        if self.writer_task is not None:
            self.writer_task.cancel()  # it closes writable_fd once it has stopped polling
        else:
            self.close_writable_fd()

    def pause_writing(self) -> None:
        # The peer is not reading its answers: stop reading its requests.
        self.pause("writing")

    def resume_writing(self) -> None:
        self.resume("writing")
        transport = self.transport
        if self.on_drained and transport is not None and transport.get_write_buffer_size() == 0:
            drained, self.on_drained = self.on_drained, []
            for callback in drained:
                callback()
            self.restore_write_limits()
        if self.empty_waiter is not None and not self.empty_waiter.done():
            self.empty_waiter.set_result(None)

    def drop(self, reason: str) -> None:
        self.server.warnings.warning(
            "%s: closing connection from %s: %s", self.server.name, self.peer, reason
        )
        self.shutdown()

    def shutdown(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    # --- dispatch --------------------------------------------------------------------

    def dispatch(self, frame: Frame) -> None:
        header, payload = frame
        api_key, correlation_id = header.get("api"), header.get("correlation_id")
        if type(api_key) is not int or type(correlation_id) is not int:
            self.drop("header lacks an integer api or correlation_id")
            return
        slot = _Slot(correlation_id)
        self.slots.append(slot)
        try:
            request = self.parse(api_key, header, payload)
        except RilletError as e:
            slot.response = _error_response(e)
            return
        slot.task = asyncio.get_running_loop().create_task(self.run(request, slot))
        slot.task.add_done_callback(self.on_handler_done)

    def parse(self, api_key: int, header: dict, payload: memoryview) -> Request:
        version, client_id = header.get("version", 0), header.get("client_id", "")
        if type(version) is not int or type(client_id) is not str:
            raise InvalidRequestError("header version must be an int and client_id a str")
        api = schemas.APIS.get(api_key)
        if api is None or api_key not in self.server.handlers:
            raise UnsupportedVersionError(f"API {api_key} is not served by {self.server.name}")
        message = schemas.decode_request(api, version, header)  # validates first
        if len(payload) and not api.request_payload:
            raise InvalidRequestError(f"{api.name} requests carry no payload")
        return Request(
            api,
            version,
            header["correlation_id"],
            client_id,
            header,
            payload,
            self.peer,
            message,
            self.listener,
        )

    async def run(self, request: Request, slot: _Slot) -> Response | None:
        response = await self.server.handlers[request.api.key](request)
        if response is not None:
            try:
                if self.server.validate_responses:
                    # As the peer will read it: nested messages are plain arrays on the wire.
                    header = decode_header(encode_header(_header_of(response.message)))
                    schemas.validate_response(request.api, request.version, header)
                # Take the file ranges in the same step the handler returned in, before
                # anything else runs: the answer may wait behind a slower one (responses go
                # out in order), and a log truncated and rewritten in place meanwhile must
                # not change what it sends. pread: read the bytes now (the one copy it makes
                # anyway); sendfile: pin an fd (safe from close and rename, not a rewrite).
                if self.server.file_send_mode == "pread":
                    slot.parts = _read_parts(response.payload)
                else:
                    slot.parts = _pin_parts(response.payload)
            except BaseException:
                _written(response)  # answered with an error instead
                raise
        return response

    def on_handler_done(self, task: asyncio.Task) -> None:
        if not self.closing:
            self.flush()

    # --- responses -------------------------------------------------------------------

    def flush(self) -> None:
        """Write every answer at the head of the queue that is ready, in order; start
        requests read past the in-flight cap as answers make room."""
        slots, backlog, cap = self.slots, self.backlog, self.server.max_in_flight
        turns = self.server.turns
        while True:
            while backlog and len(slots) < cap and not self.closing:
                if not turns.take(backlog[0][1]):
                    turns.wait(self)  # the rest on a later turn of the loop
                    break
                self.dispatch(backlog.popleft()[0])
            wrote = False
            while slots and not self.writer_busy and not self.closing and slots[0].ready():
                slot = slots.popleft()
                response = self.outcome(slot)
                if response is None:
                    continue
                wrote = True
                if self.server.file_send_mode == "sendfile" and any(
                    type(p) is _Pinned for p in slot.parts
                ):
                    self.writer_busy = True
                    task = asyncio.get_running_loop().create_task(self.write_async(slot, response))
                    task.add_done_callback(functools.partial(self.writer_done, slot, response))
                    self.writer_task = task
                    return
                self.write_now(slot, response)
            if wrote:
                self.last_active = self.loop.time()
            if not (backlog and len(slots) < cap) or self.waiting_turn or self.closing:
                break
        if not backlog and len(slots) < cap:
            self.resume("in-flight")
        self.close_if_done()

    def outcome(self, slot: _Slot) -> Response | None:
        task = slot.task
        if task is None:
            return slot.response
        if task.cancelled():
            return None
        error = task.exception()
        if error is None:
            return task.result()
        _unpin(slot.parts)
        slot.parts = []
        if isinstance(error, RilletError):
            return _error_response(error)  # a handler may raise a wire error on purpose
        log.error("%s: handler failed for %s", self.server.name, self.peer, exc_info=error)
        return _error_response(UnknownServerError(f"{type(error).__name__}: {error}"))

    def frame_head(self, slot: _Slot, response: Response) -> bytes:
        """Prefix and header; the size counts every part, files included."""
        fields = _header_of(response.message)
        fields["correlation_id"] = slot.correlation_id
        header = encode_header(fields)
        payload = sum(p.length if type(p) is _Pinned else _nbytes(p) for p in slot.parts)
        return PREFIX.pack(SIZE_FIELD + len(header) + payload, len(header)) + header

    def head_or_error(self, slot: _Slot, response: Response) -> bytes:
        try:
            return self.frame_head(slot, response)
        except Exception as e:  # the handler returned fields msgpack cannot pack
            log.error("%s: cannot encode response for %s", self.server.name, self.peer, exc_info=e)
            _unpin(slot.parts)
            slot.parts = []
            return self.frame_head(slot, _error_response(UnknownServerError(repr(e))))

    def write_now(self, slot: _Slot, response: Response) -> None:
        """Write a response at once; file ranges are pread (one copy, in C)."""
        assert self.transport is not None
        out: list[Buffer] = [self.head_or_error(slot, response)]
        try:
            for part in slot.parts:
                out.append(_pread_exact(part) if type(part) is _Pinned else part)
        except Exception as e:  # OSError, or a bad range (ValueError) from the handler
            # The frame's size is already promised; a short file cannot be sent in it.
            self.drop(f"cannot read file range for response: {e!r}")
            _written(response)
            return
        finally:
            _unpin(slot.parts)
        self.transport.writelines(out)
        if self.on_drained:  # queued behind what is waiting to drain: not progress
            self.drain_size += sum(_nbytes(part) for part in out)
        del out
        if response.on_written is not None:
            self.when_drained(response.on_written)

    async def write_async(self, slot: _Slot, response: Response) -> None:
        """Write a response holding file ranges with os.sendfile, then resume flushing."""
        slot.writing = True
        assert self.transport is not None
        try:
            self.write_part(self.head_or_error(slot, response))
            for part in slot.parts:
                if type(part) is _Pinned:
                    await self.sendfile(part)
                else:
                    self.write_part(part)
        except (Exception, asyncio.CancelledError) as e:
            if not self.closing:
                self.drop(f"sendfile failed: {e!r}")
        finally:
            _unpin(slot.parts)
            if response.on_written is not None:
                self.when_drained(response.on_written)
            self.writer_stopped()

    def writer_done(self, slot: _Slot, response: Response, task: asyncio.Task[None]) -> None:
        """A writer cancelled before its first step (the connection lost in the turn
        its answer was ready) never runs its ``finally``: release what it would have."""
        if slot.writing:
            return
        _unpin(slot.parts)
        _written(response)
        if self.writer_task is task:
            self.writer_stopped()

    def writer_stopped(self) -> None:
        self.writer_busy = False
        self.writer_task = None
        if self.closing:
            self.close_writable_fd()
        else:
            self.flush()

    def write_part(self, part: Buffer) -> None:
        assert self.transport is not None
        self.transport.write(part)
        if self.on_drained:  # queued behind what is waiting to drain: not progress
            self.drain_size += _nbytes(part)

    async def sendfile(self, part: _Pinned) -> None:
        assert self.transport is not None
        await self.wait_buffer_empty()  # bytes already queued must reach the socket first
        sock_fd = self.transport.get_extra_info("socket").fileno()
        offset, remaining = part.offset, part.length
        while remaining:
            try:
                sent = os.sendfile(sock_fd, part.fd, offset, remaining)
            except BlockingIOError:
                await self.wait_writable(sock_fd)
                continue
            if sent == 0:
                raise OSError(f"file ended {remaining} bytes short of its range")
            offset += sent
            remaining -= sent

    async def wait_buffer_empty(self) -> None:
        assert self.transport is not None
        if self.transport.get_write_buffer_size() == 0:
            return
        # Low-water mark 0: resume_writing fires exactly when the buffer has drained.
        self.empty_waiter = asyncio.get_running_loop().create_future()
        try:
            self.transport.set_write_buffer_limits(high=0, low=0)
            await self.empty_waiter
        finally:
            self.empty_waiter = None
            self.restore_write_limits()

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once every byte written so far has left the transport's
        buffer for the socket (at once when none waits), or when the connection is lost.
        Meanwhile the connection is paused for reading, as over the high-water mark:
        the peer is not taking its answers as fast as they come."""
        assert self.transport is not None
        if self.closing or self.transport.get_write_buffer_size() == 0:
            callback()
            return
        if not self.on_drained:
            self.drain_size = self.transport.get_write_buffer_size()
            self.drain_since = self.loop.time()
            deadline = self.drain_since + self.server.read_timeout_s
            if self.timer is None or self.timer_when > deadline:
                self.arm(self.server.read_timeout_s)
        self.on_drained.append(callback)
        # Low-water mark 0: resume_writing fires exactly when the buffer has drained.
        self.transport.set_write_buffer_limits(high=0, low=0)

    def restore_write_limits(self) -> None:
        """The usual high-water mark, once nothing waits for the buffer to empty."""
        if self.closing or self.on_drained or self.empty_waiter is not None:
            return
        assert self.transport is not None
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)

    async def wait_writable(self, sock_fd: int) -> None:
        # uvloop refuses add_writer on a transport's own fd; a dup of it may be polled.
        loop = asyncio.get_running_loop()
        if self.writable_fd < 0:
            self.writable_fd = os.dup(sock_fd)
        ready = loop.create_future()
        loop.add_writer(self.writable_fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_writer(self.writable_fd)

    def close_writable_fd(self) -> None:
        if self.writable_fd >= 0:
            os.close(self.writable_fd)
            self.writable_fd = -1


def parse_per_ip_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``ip:count,ip:count`` (IPv6 as ``[::1]:n``)."""
    out: dict[str, int] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.isdigit():
            raise InvalidConfigError(
                f"max.connections.per.ip.overrides: expected ip:count, got {item!r}"
            )
        out[host.strip("[]")] = int(count)
    return out


def rpc_limits(config: Mapping[str, Any]) -> dict[str, Any]:
    """RpcServer's limits from a node's config (the keys client/runtime/config.py's
    ``node_keys`` declares), checked: ``RpcServer(handlers, **rpc_limits(config))``."""
    for name, least in (
        ("socket.request.max.bytes", 1024),
        ("max.connections", 1),
        ("max.connections.per.ip", 1),
        ("connections.max.idle.ms", 1),
        ("socket.request.read.timeout.ms", 1),
        ("queued.max.requests.per.connection", 1),
        ("queued.max.request.bytes", 1),
    ):
        if config[name] < least:
            raise InvalidConfigError(f"{name} must be >= {least}, not {config[name]}")
    return {
        "max_request_bytes": config["socket.request.max.bytes"],
        "max_connections": config["max.connections"],
        "max_connections_per_ip": config["max.connections.per.ip"],
        "max_connections_per_ip_overrides": parse_per_ip_overrides(
            config["max.connections.per.ip.overrides"]
        ),
        "idle_ms": config["connections.max.idle.ms"],
        "request_read_timeout_ms": config["socket.request.read.timeout.ms"],
        "max_in_flight": config["queued.max.requests.per.connection"],
        "max_partial_request_bytes": config["queued.max.request.bytes"],
    }


def _written(response: Response | None) -> None:
    """The response went out, or never will: its ``on_written``, if any."""
    if response is not None and response.on_written is not None:
        response.on_written()


def _nbytes(part: Buffer) -> int:
    return part.nbytes if type(part) is memoryview else len(part)


def _pread_exact(part: _Pinned) -> bytes:
    data = os.pread(part.fd, part.length, part.offset)
    if len(data) != part.length:
        raise OSError(f"file range short: {len(data)} of {part.length} bytes at {part.offset}")
    return data
