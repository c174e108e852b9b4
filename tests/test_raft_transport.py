"""The Raft transport's report of a voter whose process is gone, on real sockets.

A refused connection (nothing listens at the voter's address) is reported to
``on_unreachable``; a peer that closes an idle connection is noticed without anything
to send, so its death is reported within a reconnect, not at the next message.
"""

from __future__ import annotations

import asyncio

from helpers import wait_until_async

from rillet.controller.raft.transport import (
    BACKOFF_MIN_MS,
    HEALTHY_CONNECTION_MS,
    RaftTransport,
)
from rillet.tools.local_cluster import free_port


def reporting_transport(port: int, reported: list[int]) -> RaftTransport:
    """Node 1's transport to voter 2 at ``port``, appending each unreachable report."""
    return RaftTransport(
        1,
        {2: ("127.0.0.1", port)},
        lambda msg: None,
        on_unreachable=lambda node, since_ms: reported.append(node),
    )


async def test_a_voter_with_nothing_listening_is_reported() -> None:
    reported: list[int] = []
    port = free_port()  # closed again: connecting there is refused
    transport = reporting_transport(port, reported)
    transport.start()
    try:
        await wait_until_async(lambda: len(reported) >= 2, timeout=10)  # while it stays down
        assert set(reported) == {2}
    finally:
        await transport.stop()


async def test_a_peer_closing_an_idle_connection_is_noticed_and_reported() -> None:
    reported: list[int] = []
    accepted: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = reporting_transport(port, reported)
    transport.start()
    try:
        await wait_until_async(lambda: bool(accepted), timeout=10)
        assert reported == []  # connected, nothing to send: nothing to report
        server.close()  # the voter's process dies: its listener and connections close
        for writer in accepted:
            writer.close()
        await server.wait_closed()
        await wait_until_async(lambda: reported, timeout=10)
        assert set(reported) == {2}
    finally:
        await transport.stop()


async def test_a_connection_that_worked_resets_the_backoff_and_a_flapping_one_does_not() -> None:
    # A voter down a while (refused: the backoff grows), back (connected), then killed:
    # its death is reported after the minimum backoff, not the grown one (a grown one
    # cost a whole election timeout when a restarted leader was killed again). A peer
    # that accepts and closes at once keeps the backoff growing instead.
    reported: list[int] = []
    port = free_port()
    transport = reporting_transport(port, reported)
    peer = transport.peers[2]
    transport.start()
    accepted: list[asyncio.StreamWriter] = []

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        writer.close()

    try:
        await wait_until_async(lambda: peer.backoff_ms >= 400, timeout=20)  # refused a while
        server = await asyncio.start_server(keep, "127.0.0.1", port, reuse_address=True)
        await wait_until_async(lambda: bool(accepted), timeout=20)
        since = transport.clock()
        await wait_until_async(lambda: transport.clock() - since > HEALTHY_CONNECTION_MS)
        server.close()
        for writer in accepted:
            writer.close()
        await server.wait_closed()
        before = len(reported)
        await wait_until_async(lambda: len(reported) > before, timeout=10)
        assert peer.backoff_ms <= 2 * BACKOFF_MIN_MS  # reset, then doubled once

        accepted.clear()
        server = await asyncio.start_server(drop, "127.0.0.1", port, reuse_address=True)
        await wait_until_async(lambda: len(accepted) >= 4, timeout=20)
        assert peer.backoff_ms >= 8 * BACKOFF_MIN_MS  # still growing: no reset
        server.close()
        await server.wait_closed()
    finally:
        await transport.stop()
