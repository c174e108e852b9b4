"""A real broker and a real controller keep their memory when peers announce huge frames
and send nothing more (docs/protocol.md, "Limits at the edge"): a bound on memory is
behaviour, so it is asserted; the bound is generous against RSS noise and far below what
the bug cost.
"""

from __future__ import annotations

import socket
import struct

import pytest
from helpers import rss_bytes

from rillet.client.wire.connection import parse_address
from rillet.client.wire.framing import FrameDecoder, encode_frame_bytes

pytestmark = pytest.mark.cluster

CONNECTIONS = 8
ANNOUNCED = 100 * 1024 * 1024  # socket.request.max.bytes: the largest frame allowed
RSS_GROWTH_BOUND = 32 * 1024 * 1024  # the bug grew it by CONNECTIONS * ANNOUNCED (800 MiB)


def round_trip(address: tuple[str, int]) -> None:
    """One ApiVersions answered on a new connection: the node has read what came before."""
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(encode_frame_bytes({"api": 18, "version": 0, "correlation_id": 1}))
        decoder, frames = FrameDecoder(), []
        while not frames:
            chunk = sock.recv(65536)
            assert chunk, "the node closed a well-formed ApiVersions"
            frames = decoder.feed(chunk)
        assert frames[0][0]["error_code"] == 0


def test_four_byte_lengths_of_100_mib_do_not_cost_100_mib(cluster_factory) -> None:
    cluster = cluster_factory(controllers=1, brokers=1)
    (broker,) = cluster.brokers()
    (controller,) = cluster.controllers()
    nodes = {
        "broker": (broker.pid, parse_address(cluster.broker_address(broker.node_id))),
        "controller": (controller.pid, ("127.0.0.1", controller.controller_port)),
    }
    for name, (pid, address) in nodes.items():
        assert pid is not None
        round_trip(address)
        before = rss_bytes(pid)
        socks = [socket.create_connection(address, timeout=30) for _ in range(CONNECTIONS)]
        try:
            for sock in socks:
                sock.sendall(struct.pack(">I", ANNOUNCED))
            round_trip(address)
            grown = rss_bytes(pid) - before
            assert grown < RSS_GROWTH_BOUND, f"{name}: RSS grew {grown >> 20} MiB"
        finally:
            for sock in socks:
                sock.close()
        round_trip(address)
