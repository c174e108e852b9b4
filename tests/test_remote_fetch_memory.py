"""Memory of fetches, on an in-process broker over sockets. The broker caps what one
fetch may be answered with (``fetch.max.bytes``), whatever the client asks. A remote read's bytes
are Python bytes (a local read's are a file range), so they stay counted against the
remote reader's in-flight bound until the response holding them has been written to
the socket, or its connection is gone. Many consumers asking for all they can get
(max_bytes 2^31-1) at once, none reading its answers yet, so their answers pile up in
the broker: what it holds of them stays under the bound, and every consumer still gets
its data (at least one batch), its fetch retried after a REQUEST_TIMED_OUT while the
others held the bound."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

from helpers import wait_until_async
from test_broker_inproc import batch, broker_config, fetch, produce
from test_replication_fetcher_faults import Link, SharedMetadata

from rillet.broker.server import BrokerServer
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import errors, schemas
from rillet.client.wire.connection import Connection, _ClientProtocol
from rillet.client.wire.framing import DEFAULT_MAX_FRAME_BYTES
from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    Partition,
    RemoteSegment,
    Topic,
    TopicPartition,
)
from rillet.storage.remote.copier import upload_segment
from rillet.storage.remote.layout import segment_keys
from rillet.storage.remote.reader import RemoteReader
from rillet.storage.remote.store import MemoryObjectStore

TOPIC = "cold"
TP = TopicPartition(TOPIC, 0)
CHUNK = 4096
BATCHES = 64
VALUE = b"v" * 8000  # a segment is about 512 KiB
CONSUMERS = 12
BOUND = 1100 * 1024  # the reader's in-flight bound: two segment reads at once
HUGE = (1 << 31) - 1
# Kernel socket buffers this small (fixed before connecting, so they do not grow) keep
# an answer its consumer does not read waiting in the broker, where it is counted.
SMALL_SOCKET_BUFFER = 4096


class Tier:
    """The remote log manager as the fetch path sees it: a reader over memory."""

    def __init__(self) -> None:
        self.store = MemoryObjectStore()
        self.reader = RemoteReader(
            self.store,
            1 << 20,
            CHUNK,
            threads=4,
            prefetch_chunks=0,
            read_bytes_in_flight=BOUND,
        )

    def on_metadata(self, *args: object) -> None:
        pass

    async def close(self) -> None:
        self.reader.close()


def unsent_bytes(server: BrokerServer) -> int:
    """Answer bytes the broker holds that the kernel has not taken yet."""
    assert server.rpc is not None
    return sum(
        c.transport.get_write_buffer_size()
        for c in server.rpc.connections
        if c.transport is not None
    )


async def slow_consumer(port: int) -> Connection:
    """A connection whose answers stay unread until ``_transport.resume_reading()``."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_SOCKET_BUFFER)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    conn = Connection("127.0.0.1", port)
    transport, _ = await loop.create_connection(
        lambda: _ClientProtocol(conn, DEFAULT_MAX_FRAME_BYTES), sock=sock
    )
    conn._transport = transport  # type: ignore[assignment]
    transport.pause_reading()
    return conn


def count_answers(server: BrokerServer) -> list[int]:
    """A list that gets one item per Fetch the broker has answered from now on."""
    assert server.rpc is not None
    handlers = server.rpc.handlers
    handler = handlers[schemas.FETCH.key]
    answered: list[int] = []

    async def counted(request: Request) -> Response | None:
        response = await handler(request)
        answered.append(request.correlation_id)
        return response

    handlers[schemas.FETCH.key] = counted
    return answered


async def test_remote_answers_not_yet_written_stay_within_the_bound(tmp_path: Path) -> None:
    shared = SharedMetadata()
    config = broker_config(tmp_path / "logs", "remote.fetch.max.wait.ms=300")
    server = BrokerServer(config, link=Link(shared, 1))  # type: ignore[arg-type]
    await server.start()
    conns: list[Connection] = []
    tier = Tier()
    try:
        assert server.replicas is not None and server.rpc is not None
        server.replicas.remote = tier  # type: ignore[assignment]
        topic_id = uuid.uuid4().hex
        await shared.commit([Topic(TOPIC, topic_id), Partition(topic_id, 0, (1,), (1,), 1, 0, 0)])
        async with await Connection.open("127.0.0.1", server.port) as conn:
            log = server.replicas.replicas[TP].log
            for seg in range(3):
                if seg:
                    log.roll()
                for n in range(BATCHES):
                    data = batch(b"%d-%d-" % (seg, n) + VALUE)
                    assert (await produce(conn, TOPIC, 0, data))[1] == 0
        await log.wait_background()
        segments = list(log.segments)
        expected = log.read_bytes(0, HUGE, log.high_watermark)  # all of segment 0
        recs = []
        for i, seg in enumerate(segments[:2]):
            seg_id = f"s{i}"
            keys = segment_keys(TOPIC, topic_id, 0, seg.base_offset, seg_id)
            manifest = upload_segment(tier.store, keys, seg, [(0, 0)], seg_id, CHUNK)
            end = segments[i + 1].base_offset - 1
            recs.append(
                RemoteSegment(
                    topic_id,
                    0,
                    seg_id,
                    seg.base_offset,
                    end,
                    ((0, 0),),
                    SEGMENT_COPY_FINISHED,
                    manifest.size_bytes,
                    manifest.max_timestamp_ms,
                    1,
                    0,
                )
            )
        await shared.commit(recs)
        log.increment_log_start_offset(segments[2].base_offset)

        # Consumers that do not read yet: their answers wait in the broker (sockets it
        # accepts take the listener's buffer size).
        for sock in server.rpc.sockets:  # type: ignore[union-attr]
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_SOCKET_BUFFER)
        answered = count_answers(server)
        fetches = []
        for _ in range(CONSUMERS):
            c = await slow_consumer(server.port)
            conns.append(c)
            fetches.append(
                asyncio.ensure_future(
                    fetch(c, TOPIC, 0, 0, max_bytes=HUGE, partition_max_bytes=HUGE)
                )
            )

        # Every fetch answered (data, or REQUEST_TIMED_OUT after waiting for the bound)
        # and its answer written as far as the peer takes it.
        await wait_until_async(
            lambda: len(answered) == CONSUMERS and not any(c.slots for c in server.rpc.connections),  # type: ignore[union-attr]
            message="every fetch to be answered",
        )
        held = unsent_bytes(server)
        assert held <= BOUND, f"{held} bytes of answers held, bound {BOUND}"
        assert tier.reader.read_bytes_peak <= BOUND

        # The consumers read: each gets segment 0, retrying a timed-out fetch.
        for c in conns:
            assert c._transport is not None
            c._transport.resume_reading()
        for c, first in zip(conns, fetches, strict=True):
            row, payload = await first
            while row[1] == errors.code_of("REQUEST_TIMED_OUT") or not payload:
                assert row[1] in (errors.NONE, errors.code_of("REQUEST_TIMED_OUT")), row
                row, payload = await fetch(c, TOPIC, 0, 0, max_bytes=HUGE, partition_max_bytes=HUGE)
            assert row[1] == errors.NONE and payload == expected
        # Written: nothing is counted any more.
        await wait_until_async(lambda: tier.reader.read_bytes_held == 0, message="the release")

        # A consumer that goes away without reading its answer releases it too.
        gone = await slow_consumer(server.port)
        unread = asyncio.ensure_future(
            fetch(gone, TOPIC, 0, 0, max_bytes=HUGE, partition_max_bytes=HUGE)
        )
        await wait_until_async(lambda: tier.reader.read_bytes_held > 0, message="a held answer")
        assert gone._transport is not None
        gone._transport.abort()
        await asyncio.gather(unread, return_exceptions=True)
        await wait_until_async(lambda: tier.reader.read_bytes_held == 0, message="the release")
    finally:
        for c in conns:
            c.close()
        await server.stop(controlled=False)
        tier.reader.close()


async def test_a_fetch_is_answered_with_at_most_the_brokers_fetch_max_bytes(
    tmp_path: Path,
) -> None:
    shared = SharedMetadata()
    config = broker_config(tmp_path / "logs", "fetch.max.bytes=4096")
    server = BrokerServer(config, link=Link(shared, 1))  # type: ignore[arg-type]
    await server.start()
    try:
        topic_id = uuid.uuid4().hex
        await shared.commit([Topic(TOPIC, topic_id), Partition(topic_id, 0, (1,), (1,), 1, 0, 0)])
        async with await Connection.open("127.0.0.1", server.port) as conn:
            for n in range(8):
                assert (await produce(conn, TOPIC, 0, batch(b"%d-" % n + b"v" * 1500)))[1] == 0
            row, payload = await fetch(conn, TOPIC, 0, 0, max_bytes=HUGE, partition_max_bytes=HUGE)
            assert row[1] == errors.NONE
            assert 0 < len(payload) <= 4096  # two whole batches of the eight
            assert (await produce(conn, TOPIC, 0, batch(b"v" * 6000)))[1] == 0
            _, big = await fetch(conn, TOPIC, 0, 8, max_bytes=HUGE, partition_max_bytes=HUGE)
            assert len(big) > 4096  # a first batch larger than the cap still goes
    finally:
        await server.stop(controlled=False)
