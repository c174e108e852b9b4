"""Limits at the network edge (docs/protocol.md, "Limits at the edge"), on an RpcServer in
this process: idle and request-read timeouts, the per-connection in-flight cap, the
per-address connection cap and the node-wide budget for partly received requests.
Each test fails without the limit it names.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import wait_until_async

from rillet.client.runtime.config import node_keys
from rillet.client.runtime.rpc_server import (
    DISPATCH_PER_TURN,
    DISPATCH_UNIT_BYTES,
    PeerWarnings,
    Request,
    Response,
    RpcServer,
    parse_per_ip_overrides,
    rpc_limits,
)
from rillet.client.wire import messages, schemas
from rillet.client.wire.connection import Connection
from rillet.client.wire.errors import InvalidConfigError, NetworkError
from rillet.client.wire.framing import FrameDecoder, encode_frame_bytes


async def _versions_ok(conn: Connection) -> bool:
    return (await conn.api_versions())[18] == (0, 0)


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read() == b""
    except ConnectionError:
        return True


@pytest.fixture
async def idle_server() -> AsyncIterator[RpcServer]:
    release = asyncio.Event()

    async def held(request: Request) -> Response:
        await release.wait()
        return Response(messages.ListOffsetsResponse([]))

    srv = RpcServer({schemas.LIST_OFFSETS.key: held}, idle_ms=100, request_read_timeout_ms=100)
    srv.release = release  # type: ignore[attr-defined]
    await srv.start()
    yield srv
    release.set()
    await srv.stop()


async def test_idle_connection_is_closed_but_not_one_with_a_request_in_flight(
    idle_server: RpcServer,
) -> None:
    idle = await Connection.open("127.0.0.1", idle_server.port, idle_ms=60_000)
    busy = await Connection.open("127.0.0.1", idle_server.port, idle_ms=60_000)
    assert await _versions_ok(idle)
    pending = asyncio.ensure_future(busy.request("ListOffsets", {"topics": []}))
    await wait_until_async(lambda: idle.closed)  # the server closed it: idle for 100 ms
    assert not busy.closed and not pending.done()  # its request outlives many idle periods
    idle_server.release.set()  # type: ignore[attr-defined]
    header, _ = await pending
    assert header["topics"] == []
    await wait_until_async(lambda: busy.closed)  # and once answered, it is idle too


async def test_a_frame_begun_and_not_finished_is_cut_at_the_read_timeout(
    idle_server: RpcServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", idle_server.port)
    writer.write(struct.pack(">I", 1000) + b"\x00\x00")  # a frame of 1000 bytes, 6 sent
    closed = asyncio.ensure_future(_closed_by_server(reader))
    await wait_until_async(closed.done)
    assert closed.result()
    writer.close()


async def test_a_frame_sent_one_byte_at_a_time_is_cut_at_the_read_timeout() -> None:
    # Idle far away: only the read timeout can end this slowloris, who sends a byte at
    # every poll and so is never idle.
    async with RpcServer({}, idle_ms=600_000, request_read_timeout_ms=200) as srv:
        await srv.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        frame = iter(struct.pack(">I", 1 << 20) + bytes(1 << 20))
        closed = asyncio.ensure_future(_closed_by_server(reader))

        def drip() -> bool:
            if not closed.done():
                writer.write(bytes([next(frame)]))
            return closed.done()

        await wait_until_async(drip, interval=0.01)
        assert closed.result()
        writer.close()


async def test_client_retires_its_idle_connection_before_the_server_would() -> None:
    async with RpcServer({}, idle_ms=600_000) as srv:
        await srv.start()
        conn = await Connection.open("127.0.0.1", srv.port, idle_ms=50)
        assert await _versions_ok(conn)
        await wait_until_async(lambda: conn.closed)  # idle 50 ms: closed by the client
        await conn.wait_closed()


async def test_in_flight_cap_stops_reading_the_connection() -> None:
    release = asyncio.Event()
    running = 0
    most = 0

    async def held(request: Request) -> Response:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        return Response(messages.ListOffsetsResponse([]))

    async with RpcServer({schemas.LIST_OFFSETS.key: held}, max_in_flight=4) as srv:
        await srv.start()
        conn = await Connection.open("127.0.0.1", srv.port)
        requests = [
            asyncio.ensure_future(conn.request("ListOffsets", {"topics": []})) for _ in range(20)
        ]
        (peer,) = srv.connections

        # Four started; the rest wait unread, or read in the same chunk and undispatched.
        await wait_until_async(lambda: running == 4 and "in-flight" in peer.paused)
        assert len(peer.backlog) <= 16
        release.set()
        answers = await asyncio.gather(*requests)
        assert [h["correlation_id"] for h, _ in answers] == list(range(1, 21))
        assert most == 4
        assert not peer.paused  # reading again once answers made room
        assert await _versions_ok(conn)
        await conn.aclose()


async def test_requests_started_per_loop_turn_are_bounded_node_wide() -> None:
    # A handler's first step runs without a break, so one read holding a hundred pipelined
    # requests would start a hundred handlers in one turn of the loop, and timers
    # (heartbeats, Raft) wait behind all of them. A ticker task that yields every turn
    # numbers the turns; however many connections pipeline at once, each turn starts at
    # most the node's share of work (a request weighs 1 + its header's size in
    # DISPATCH_UNIT_BYTES), or one request larger than that alone, and answers still come
    # in order.
    turn = 0
    started: dict[int, list[int]] = {}  # turn -> the weights of the requests started in it

    async def ticker() -> None:
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)

    async def handler(request: Request) -> Response:
        weight = 1 + len(request.client_id) // DISPATCH_UNIT_BYTES
        started.setdefault(turn, []).append(weight)
        return Response(messages.ListOffsetsResponse([]))

    client_ids = ["small", "x" * (3 * DISPATCH_UNIT_BYTES), "x" * (3 * DISPATCH_PER_TURN << 12)]
    frames = b"".join(
        encode_frame_bytes(
            {"api": 2, "version": 0, "correlation_id": i, "client_id": client_ids[i % 5 % 3]}
            | {"topics": []}
        )
        for i in range(60)
    )
    tick = asyncio.ensure_future(ticker())
    async with RpcServer({schemas.LIST_OFFSETS.key: handler}) as srv:
        await srv.start()
        peers = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(3)]
        for _, writer in peers:
            writer.write(frames)
            writer.write_eof()
        for reader, writer in peers:
            answers = await _read_all_frames(reader)
            assert [h["correlation_id"] for h in answers] == list(range(60))
            writer.close()
    tick.cancel()
    assert sum(len(weights) for weights in started.values()) == 180
    for weights in started.values():
        assert sum(weights) <= DISPATCH_PER_TURN or len(weights) == 1, weights


async def _read_all_frames(reader: asyncio.StreamReader) -> list[dict[str, Any]]:
    decoder = FrameDecoder()
    out: list[dict[str, Any]] = []
    while chunk := await reader.read(1 << 16):
        out += [header for header, _ in decoder.feed(chunk)]
    return out


async def test_connections_per_address_are_capped_with_overrides() -> None:
    async with RpcServer({}, max_connections_per_ip=2) as srv:
        await srv.start()
        kept = [await Connection.open("127.0.0.1", srv.port) for _ in range(2)]
        await wait_until_async(lambda: len(srv.connections) == 2)
        extra = await Connection.open("127.0.0.1", srv.port)
        with pytest.raises(NetworkError):
            await extra.request("ApiVersions", {})
        for c in kept:
            assert await _versions_ok(c)
            await c.aclose()
        await wait_until_async(lambda: not srv.per_ip)  # closed ones no longer count
        again = await Connection.open("127.0.0.1", srv.port)
        assert await _versions_ok(again)
        await again.aclose()
    overrides = {"127.0.0.1": 3}
    async with RpcServer(
        {}, max_connections_per_ip=1, max_connections_per_ip_overrides=overrides
    ) as srv:
        await srv.start()
        three = [await Connection.open("127.0.0.1", srv.port) for _ in range(3)]
        for c in three:
            assert await _versions_ok(c)
            await c.aclose()


async def test_partial_requests_share_one_node_wide_budget() -> None:
    sizes: list[int] = []

    async def produce(request: Request) -> Response:
        sizes.append(len(request.payload))
        return Response(messages.ProduceResponse([]))

    frame_bytes = 4 << 20
    async with RpcServer(
        {schemas.PRODUCE.key: produce},
        max_request_bytes=8 << 20,
        max_partial_request_bytes=1 << 20,  # smaller than one frame: one at a time
    ) as srv:
        await srv.start()
        header = {"api": 0, "version": 0, "correlation_id": 1, "acks": 1, "timeout_ms": 1000}
        frame = encode_frame_bytes({**header, "topics": []}, bytes(frame_bytes))
        streams = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(5)]
        for _, writer in streams:
            writer.write(frame[: 2 << 20])  # half of each frame
        await wait_until_async(lambda: len(srv.budget.waiters) == 4)
        (holder,) = [c for c in srv.connections if c.reserved]
        assert srv.budget.reserved == holder.reserved == len(frame)
        for waiter in srv.budget.waiters:  # read until it asked, then paused
            assert "budget" in waiter.paused
            assert waiter.decoder.buffered_bytes < 1 << 20
        for _, writer in streams:
            writer.write(frame[2 << 20 :])
        for reader, _ in streams:  # one frame after another gets the budget and finishes
            prefix = await reader.readexactly(8)
            await reader.readexactly(struct.unpack(">II", prefix)[0] - 4)
        assert len(sizes) == 5 and srv.budget.reserved == 0
        for _, writer in streams:
            writer.close()


def test_config_keys_map_to_server_limits() -> None:
    config = node_keys("broker").load(
        overrides=[
            "max.connections.per.ip=7",
            "max.connections.per.ip.overrides=10.0.0.1:9,[::1]:3",
            "connections.max.idle.ms=1000",
            "socket.request.read.timeout.ms=2000",
            "queued.max.requests.per.connection=5",
            "queued.max.request.bytes=123456",
        ]
    )
    limits: dict[str, Any] = rpc_limits(config)
    assert limits["max_connections_per_ip"] == 7
    assert limits["max_connections_per_ip_overrides"] == {"10.0.0.1": 9, "::1": 3}
    assert (limits["idle_ms"], limits["request_read_timeout_ms"]) == (1000, 2000)
    assert (limits["max_in_flight"], limits["max_partial_request_bytes"]) == (5, 123456)
    with pytest.raises(InvalidConfigError):
        parse_per_ip_overrides("10.0.0.1")
    with pytest.raises(InvalidConfigError):
        rpc_limits(node_keys("broker").load(overrides=["queued.max.requests.per.connection=0"]))


def test_warnings_a_peer_causes_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    warnings = PeerWarnings(logging.getLogger("peer-test"), per_s=2, burst=3, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="peer-test"):
        for i in range(1000):  # a peer sending garbage in a loop
            warnings.warning("bad frame %d", i)
        assert [r.getMessage() for r in caplog.records] == [f"bad frame {i}" for i in range(3)]
        now[0] = 1.0  # two more may pass; the first says what was held back
        warnings.warning("bad frame %d", 1000)
        assert caplog.records[-1].getMessage() == "bad frame 1000 (and 997 similar, not logged)"
