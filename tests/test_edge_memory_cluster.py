"""A real broker process keeps its memory when peers announce huge frames and send nothing
more (docs/protocol.md, "Limits at the edge"): a bound on memory is behaviour, so it is
asserted; the bound is generous against RSS noise and far below what the bug cost.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest

from rillet.client.wire.connection import parse_address
from rillet.client.wire.framing import FrameDecoder, encode_frame_bytes

pytestmark = pytest.mark.cluster

CONNECTIONS = 8
ANNOUNCED = 100 * 1024 * 1024  # socket.request.max.bytes: the largest frame allowed
RSS_GROWTH_BOUND = 32 * 1024 * 1024  # the bug grew it by CONNECTIONS * ANNOUNCED (800 MiB)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


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
    assert broker.pid is not None
    address = parse_address(cluster.broker_address(broker.node_id))
    round_trip(address)
    before = rss_bytes(broker.pid)
    socks = [socket.create_connection(address, timeout=30) for _ in range(CONNECTIONS)]
    try:
        for sock in socks:
            sock.sendall(struct.pack(">I", ANNOUNCED))
        round_trip(address)
        grown = rss_bytes(broker.pid) - before
        assert grown < RSS_GROWTH_BOUND, f"RSS grew {grown >> 20} MiB"
    finally:
        for sock in socks:
            sock.close()
    round_trip(address)
