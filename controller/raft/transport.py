"""Raft messages between voters over the RPC layer, as one-way frames.

Choice: every message of the Raft core (`RaftNode`'s `Message`) travels as one
`RaftMessage` request (API 1004) whose payload is ``msgpack(message.to_dict())`` and
which is never answered; the core's replies are messages of their own, sent back the
same way on the replier's own connection. The core is asynchronous already (etcd-style:
a vote or an append acknowledgement is produced by a later `Ready`, after an fsync), so
request/response pairing would add waiting and matching without removing any case: a
message may be lost, delayed or duplicated anyway, and the core repairs that with
heartbeats and retries. Unknown or malformed payloads are dropped (remote fault).

One outbound connection per peer, owned by one task: it connects (backoff from
`BACKOFF_MIN_MS` doubling to `BACKOFF_MAX_MS`), writes queued messages, and reconnects
after any failure. The queue is bounded (`MAX_QUEUED`): when a peer is down, the oldest
messages go first; Raft re-sends whatever still matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Mapping

import msgpack

from rillet.client.runtime.rpc_server import PeerWarnings, Request
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection
from rillet.client.wire.errors import NetworkError, RilletError
from rillet.controller.raft.core import Message, message_from_dict
from rillet.controller.raft.driver import monotonic_ms

log = logging.getLogger(__name__)

BACKOFF_MIN_MS = 50
BACKOFF_MAX_MS = 1000
# A connection that lasted this long resets the backoff; one a peer accepts and closes
# at once (over its connection limit, a stranger on a reused port) does not. Short: a
# peer restarted less than a second ago and killed again must be noticed as fast as any
# (at 1 s, measured: a grown backoff delayed the report by 750 ms and the failover by a
# whole election timeout in 4 of 10 trials).
HEALTHY_CONNECTION_MS = 100
MAX_QUEUED = 512


def encode_message(msg: Message) -> bytes:
    return msgpack.packb(msg.to_dict(), use_bin_type=True)


def decode_message(payload: bytes | memoryview) -> Message:
    """Raises ValueError on anything that is not a message of the core."""
    try:
        raw = msgpack.unpackb(payload, raw=False)
    except (ValueError, msgpack.ExtraData, TypeError) as e:
        raise ValueError(f"undecodable raft message: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError("a raft message is a msgpack map")
    _check_types(raw)
    try:
        return message_from_dict(raw)
    except (TypeError, KeyError) as e:
        raise ValueError(f"malformed raft message: {e!r}") from e


def _check_types(raw: dict) -> None:
    """The core trusts its inputs' types; a peer's bytes must earn that trust here."""
    for name, value in raw.items():
        if name == "type":
            continue
        if name == "data":
            ok = type(value) is bytes
        elif name == "entries":
            ok = type(value) is list and all(
                type(e) is list
                and len(e) == 4
                and type(e[0]) is int
                and type(e[1]) is int
                and type(e[2]) is int
                and type(e[3]) is bytes
                for e in value
            )
        else:
            ok = type(value) in (int, bool)
        if not ok:
            raise ValueError(f"raft message field {name!r} has a bad value")


class _Peer:
    """The outbound side towards one voter."""

    def __init__(self, transport: RaftTransport, node_id: int, address: tuple[str, int]):
        self.transport = transport
        self.node_id = node_id
        self.host, self.port = address
        self.queue: deque[bytes] = deque(maxlen=MAX_QUEUED)
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.conn: Connection | None = None
        self.backoff_ms = BACKOFF_MIN_MS  # before the next reconnect

    def send(self, payload: bytes) -> None:
        self.queue.append(payload)
        self.wake.set()

    async def run(self) -> None:
        while True:
            attempt_ms = self.transport.clock()
            connected_ms: int | None = None
            try:
                self.conn = await Connection.open(
                    self.host,
                    self.port,
                    client_id=f"raft-{self.transport.node_id}",
                    connect_timeout_ms=self.transport.timeout_ms,
                )
                connected_ms = self.transport.clock()
                log.debug("raft transport: connected to voter %d", self.node_id)
                await self.pump(self.conn)
            except (RilletError, OSError) as e:
                log.debug(
                    "raft transport: voter %d at %s:%d: %s", self.node_id, self.host, self.port, e
                )
                if _refused(e):  # nothing listens there: the voter's process is gone
                    self.transport.on_unreachable(self.node_id, attempt_ms)
            except Exception:
                # Policy restart: a bug here must not silently cut us off from one voter.
                log.exception(
                    "raft transport: sending to voter %d failed; reconnecting", self.node_id
                )
            finally:
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
            lived_ms = -1 if connected_ms is None else self.transport.clock() - connected_ms
            if lived_ms >= HEALTHY_CONNECTION_MS:
                self.backoff_ms = BACKOFF_MIN_MS  # it worked a while: the peer was back
            await self.back_off(self.backoff_ms)
            self.backoff_ms = min(BACKOFF_MAX_MS, self.backoff_ms * 2)

    async def back_off(self, backoff_ms: int) -> None:
        """Wait ``backoff_ms``, but retry early (after the minimum) when a new message is
        queued: a peer that restarted must get the next vote request at once, not after
        a second of backoff (measured: that added ~0.3 s to the median failover)."""
        await asyncio.sleep(BACKOFF_MIN_MS / 1000)
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), (backoff_ms - BACKOFF_MIN_MS) / 1000)

    async def pump(self, conn: Connection) -> None:
        closed = asyncio.ensure_future(conn.wait_closed())
        try:
            await self._pump(conn, closed)
        finally:
            closed.cancel()

    async def _pump(self, conn: Connection, closed: asyncio.Future[None]) -> None:
        while True:
            while not self.queue:
                self.wake.clear()
                woken = asyncio.ensure_future(self.wake.wait())
                # Also wake when the peer closes the connection with nothing to send (a
                # follower sends only in reply): reconnecting at once is how a dead
                # leader is noticed (refused) without waiting out the election timeout.
                try:
                    await asyncio.wait([woken, closed], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                if closed.done():
                    raise NetworkError(f"connection to voter {self.node_id} closed")
            if conn.closed:  # noticed only now: the peer restarted while we had nothing
                raise NetworkError(f"connection to voter {self.node_id} closed")
            header = m.RaftMessageRequest(
                src=self.transport.node_id, dst=self.node_id, cluster_id=self.transport.cluster_id
            )
            while self.queue:
                # Pop only once written: a message that meets a dead connection stays queued
                # for the next one (losing it cost a whole election timeout: a pre-vote
                # answer to a restarted voter went nowhere).
                conn.post(header, self.queue[0])
                self.queue.popleft()
            async with asyncio.timeout(self.transport.timeout_ms / 1000):
                await conn.drain()


def _refused(error: BaseException) -> bool:
    """A connect that found no listener (the error or the one it wraps)."""
    return isinstance(error, ConnectionRefusedError) or isinstance(
        error.__cause__, ConnectionRefusedError
    )


class RaftTransport:
    """Sends the core's messages to peers; hands received ones to ``on_message``, and
    tells ``on_unreachable`` of a voter whose address refuses connections."""

    def __init__(
        self,
        node_id: int,
        peers: Mapping[int, tuple[str, int]],
        on_message: Callable[[Message], None],
        *,
        timeout_ms: int = 2000,
        on_unreachable: Callable[[int, int], None] = lambda node_id, since_ms: None,
        clock: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.node_id = node_id
        self.on_message = on_message
        self.on_unreachable = on_unreachable  # (voter, when the refused connect started)
        self.clock = clock
        self.timeout_ms = timeout_ms
        self.cluster_id: str | None = None  # set once known; mismatching senders are dropped
        self.peers = {n: _Peer(self, n, a) for n, a in peers.items() if n != node_id}
        self.dropped = 0
        self.warnings = PeerWarnings(log)  # what peers send wrong, rate-limited

    def start(self) -> None:
        for peer in self.peers.values():
            peer.task = asyncio.get_running_loop().create_task(peer.run())

    async def stop(self) -> None:
        tasks = [p.task for p in self.peers.values() if p.task is not None]
        for peer in self.peers.values():
            if peer.task is not None:
                peer.task.cancel()
            if peer.conn is not None:
                peer.conn.close()
        await asyncio.gather(*tasks, return_exceptions=True)

    def send(self, msg: Message) -> None:
        peer = self.peers.get(msg.dst)
        if peer is None:
            log.warning("raft transport: no address for voter %d", msg.dst)
            return
        peer.send(encode_message(msg))

    async def handle(self, request: Request) -> None:
        """RpcServer handler for RaftMessage: step the message in, answer nothing."""
        header: m.RaftMessageRequest = request.message
        sender_cluster = header.cluster_id
        if header.dst != self.node_id or (
            sender_cluster and self.cluster_id and sender_cluster != self.cluster_id
        ):
            self.dropped += 1
            self.warnings.warning(
                "raft transport: dropping a message for %s of cluster %s from %s",
                header.dst,
                sender_cluster,
                request.peer,
            )
            return None
        try:
            msg = decode_message(request.payload)
        except ValueError as e:
            self.dropped += 1
            self.warnings.warning("raft transport: bad message from %s: %s", request.peer, e)
            return None
        if msg.src != header.src or msg.dst != self.node_id:
            self.dropped += 1
            return None
        self.on_message(msg)
        return None
