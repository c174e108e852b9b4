"""Connection and RpcServer together, in one event loop (plus one uvloop process)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import python_command, start_server_process, wait_until_async
from rpc_echo_server import make_handlers

from rillet.client.runtime import rpc_server
from rillet.client.runtime.rpc_server import FileRange, Request, Response, RpcServer
from rillet.client.wire import errors, messages, schemas
from rillet.client.wire.connection import (
    Connection,
    RequestAbandoned,
    connect_any,
    parse_address,
)
from rillet.client.wire.errors import (
    InvalidRequestError,
    NetworkError,
    RequestTimedOutError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from rillet.client.wire.framing import encode_frame_bytes

ECHO_SERVER = str(Path(__file__).with_name("rpc_echo_server.py"))
DATA = bytes(range(256)) * 1024  # 256 KiB


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "segment.log"
    path.write_bytes(DATA)
    return path


@pytest.fixture
async def server(data_file: Path) -> AsyncIterator[RpcServer]:
    srv = RpcServer(make_handlers(str(data_file)), max_request_bytes=1 << 20, name="test")
    await srv.start("127.0.0.1", 0)
    yield srv
    await srv.stop()


@pytest.fixture
async def conn(server: RpcServer) -> AsyncIterator[Connection]:
    c = await Connection.open("127.0.0.1", server.port, client_id="tests")
    yield c
    await c.aclose()


def produce(partitions: list[int], acks: int = 1) -> dict:
    return {"acks": acks, "timeout_ms": 1000, "topics": [["t", [[i, n] for i, n in partitions]]]}


def fetch(*ranges: tuple[int, int]) -> dict:
    parts = [[i, offset, -1, -1, 0, n] for i, (offset, n) in enumerate(ranges)]
    return {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [["t", parts]],
    }


def list_offsets(delay_ms: int) -> dict:
    return {"topics": [["t", [[0, -1, delay_ms]]]]}


async def test_typed_requests_get_typed_responses(conn: Connection) -> None:
    request = messages.ProduceRequest(
        acks=1,
        timeout_ms=1000,
        topics=[messages.ProduceTopic("t", [messages.ProducePartition(3, 5)])],
    )
    response, payload = await conn.call(request, b"x" * 5)
    assert isinstance(response, messages.ProduceResponse) and not payload
    assert response.topics == [
        messages.ProduceTopicResult("t", [messages.ProducePartitionResult(3, 0, 5, -1, 0, None)])
    ]
    conn.post(request._replace(acks=0), b"y" * 5)  # one-way: no answer to wait for
    assert (await conn.api_versions())[0] == (0, 0)


async def test_debug_mode_validates_typed_responses_as_sent() -> None:
    async def answer(request: Request) -> Response:
        nbytes = request.message.topics[0].partitions[0].nbytes
        code: Any = 0 if nbytes == 0 else "not an int"  # what the debug check must catch
        row = messages.ProducePartitionResult(0, code, 0, -1, 0, None)
        return Response(messages.ProduceResponse([messages.ProduceTopicResult("t", [row])]))

    async with RpcServer({schemas.PRODUCE.key: answer}, validate_responses=True) as srv:
        await srv.start()
        async with await Connection.open("127.0.0.1", srv.port) as c:
            response, _ = await c.call(produce_message(nbytes=0))
            assert response.topics[0].partitions[0].error_code == 0
            with pytest.raises(InvalidRequestError, match=r"partitions\[0\].error_code"):
                await c.call(produce_message(nbytes=1))


def produce_message(nbytes: int) -> messages.ProduceRequest:
    partition = messages.ProducePartition(0, nbytes)
    return messages.ProduceRequest(1, 1000, [messages.ProduceTopic("t", [partition])])


async def test_api_versions_lists_served_apis(conn: Connection) -> None:
    versions = await conn.api_versions()
    assert versions == {k: (0, 0) for k in (0, 1, 2, 18, 60)}


async def test_many_pipelined_requests_are_matched_by_correlation_id(conn: Connection) -> None:
    sizes = list(range(1, 401))
    results = await asyncio.gather(
        *(conn.request("Produce", produce([(0, n)]), b"x" * n) for n in sizes)
    )
    assert [h["topics"][0][1][0][2] for h, _ in results] == sizes
    assert conn.in_flight == 0


async def test_responses_are_written_in_arrival_order(conn: Connection) -> None:
    # Earlier requests take longer, so handlers finish in reverse; answers must not.
    completed: list[int] = []

    async def one(i: int) -> None:
        header, _ = await conn.request("ListOffsets", list_offsets(delay_ms=(10 - i) * 5))
        completed.append(header["topics"][0][1][0][2])

    tasks = [asyncio.ensure_future(one(i)) for i in range(10)]
    await asyncio.gather(*tasks)
    assert completed == [(10 - i) * 5 for i in range(10)]


async def test_handlers_start_in_arrival_order(data_file: Path) -> None:
    started: list[int] = []

    async def record(request: Request) -> Response:
        started.append(request.message.topics[0].partitions[0].nbytes)  # before any await
        await asyncio.sleep(0)
        return Response(messages.ProduceResponse(topics=[]))

    async with RpcServer({schemas.PRODUCE.key: record}) as srv:
        await srv.start()
        async with await Connection.open("127.0.0.1", srv.port) as c:
            await asyncio.gather(*(c.request("Produce", produce([(0, i)])) for i in range(50)))
    assert started == list(range(50))


@pytest.mark.parametrize("mode", ["pread", "sendfile"])
async def test_file_range_payload_is_delivered_intact(data_file: Path, mode: str) -> None:
    async with RpcServer(make_handlers(str(data_file)), file_send_mode=mode) as srv:
        await srv.start()
        async with await Connection.open("127.0.0.1", srv.port) as c:
            ranges = [(0, 100), (1000, 200_000), (len(DATA) - 5, 5), (7, 0)]
            results = await asyncio.gather(*(c.request("Fetch", fetch(*ranges)) for _ in range(4)))
    expected = b"".join(DATA[o : o + n] for o, n in ranges)
    for header, payload in results:
        assert [p[7] for p in header["topics"][0][1]] == [n for _, n in ranges]
        assert payload == expected


async def test_file_range_from_an_fd_the_handler_closes_at_once(data_file: Path) -> None:
    async def from_fd(request: Request) -> Response:
        fd = os.open(data_file, os.O_RDONLY)
        # The server dup()s the fd in the step the handler returns in: the owner may
        # close it right after (as a log closing a deleted segment would).
        asyncio.get_running_loop().call_soon(os.close, fd)
        return Response(
            {"throttle_time_ms": 0, "error_code": 0, "topics": []},
            [b"head", FileRange(fd, 10, 20), b"tail"],
        )

    async with RpcServer({schemas.FETCH.key: from_fd}, file_send_mode="sendfile") as srv:
        await srv.start()
        async with await Connection.open("127.0.0.1", srv.port) as c:
            _, payload = await c.request("Fetch", fetch())
    assert payload == b"head" + DATA[10:30] + b"tail"


async def test_a_queued_file_range_holds_the_bytes_of_when_its_handler_returned(
    tmp_path: Path,
) -> None:
    # Responses go out in request order, so a Fetch answer can wait behind a slower one
    # (a long poll). A log truncated and rewritten in place meanwhile (a follower
    # diverging, a leader becoming a follower) must not change what the waiting answer
    # sends: its header already describes the batches it read (issue 11, finding 8).
    path = tmp_path / "segment"
    path.write_bytes(b"A" * 100)
    release = asyncio.Event()

    async def slow(request: Request) -> Response:
        await release.wait()
        return Response(messages.ProduceResponse(topics=[]))

    async def read(request: Request) -> Response:
        fd = os.open(path, os.O_RDONLY)
        asyncio.get_running_loop().call_soon(os.close, fd)
        return Response(
            {"throttle_time_ms": 0, "error_code": 0, "topics": []}, [FileRange(fd, 0, 100)]
        )

    async with RpcServer({schemas.PRODUCE.key: slow, schemas.FETCH.key: read}) as srv:
        await srv.start()
        async with await Connection.open("127.0.0.1", srv.port) as c:
            first = asyncio.create_task(c.request("Produce", produce([(0, 0)])))
            second = asyncio.create_task(c.request("Fetch", fetch()))
            await wait_until_async(lambda: srv.connections and _handlers_done(srv) >= 1)
            with open(path, "r+b") as f:  # truncate and rewrite in place, same inode
                f.truncate(0)
                f.write(b"B" * 100)
            release.set()
            await first
            _, payload = await second
    assert payload == b"A" * 100


async def test_a_file_range_past_the_end_of_its_file_is_an_error_answer(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"x" * 10)

    async def read(request: Request) -> Response:
        return Response(
            {"throttle_time_ms": 0, "error_code": 0, "topics": []}, [FileRange(str(path), 0, 50)]
        )

    async with RpcServer({schemas.FETCH.key: read}) as srv:
        await srv.start()
        async with await Connection.open("127.0.0.1", srv.port) as c:
            with pytest.raises(errors.UnknownServerError, match="short"):
                await c.request("Fetch", fetch())
            await c.request("ApiVersions", {})  # the connection stays usable


def _handlers_done(srv: RpcServer) -> int:
    """Answers ready and waiting in order behind an unfinished one, over all connections."""
    return sum(1 for conn in srv.connections for s in conn.slots if s.task and s.task.done())


@pytest.mark.parametrize("mode", ["pread", "sendfile"])
def test_file_ranges_from_a_uvloop_server_process(data_file: Path, mode: str) -> None:
    proc = start_server_process(
        python_command(ECHO_SERVER, "--data", str(data_file), "--file-send-mode", mode)
    )
    try:

        async def run() -> list:
            async with await Connection.open("127.0.0.1", proc.port) as c:
                return await asyncio.gather(
                    *(c.request("Fetch", fetch((i * 1000, 150_000))) for i in range(8))
                )

        results = asyncio.run(run())
    finally:
        assert proc.stop() == 0, "\n".join(proc.output)
    assert [bytes(p) for _, p in results] == [DATA[i * 1000 : i * 1000 + 150_000] for i in range(8)]


async def test_dropped_connection_fails_every_pending_request(server: RpcServer) -> None:
    conn = await Connection.open("127.0.0.1", server.port)
    pending = [
        asyncio.ensure_future(conn.request("ListOffsets", list_offsets(60_000))) for _ in range(5)
    ]
    await wait_until_async(lambda: conn.in_flight == 5)
    for peer in list(server.connections):
        peer.shutdown()
    for future in pending:
        with pytest.raises(NetworkError):
            await future
    with pytest.raises(NetworkError):
        await conn.request("ApiVersions", {})
    await conn.wait_closed()


async def test_oversized_frame_closes_that_connection_only(
    server: RpcServer, conn: Connection
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(struct.pack(">II", (1 << 20) + 1, 10))
    assert await reader.read() == b""  # closed by the server without an answer
    writer.close()
    assert (await conn.api_versions())[18] == (0, 0)


async def test_header_without_correlation_id_closes_the_connection(server: RpcServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode_frame_bytes({"api": 18, "version": 0}))
    assert await reader.read() == b""
    writer.close()


async def test_request_level_errors_keep_the_connection(conn: Connection) -> None:
    with pytest.raises(UnsupportedVersionError):
        await conn.request(schemas.METADATA, {"topics": None})  # not served here
    with pytest.raises(UnsupportedVersionError, match="v3 is not supported"):
        await conn.request("Produce", produce([(0, 1)]), b"x", version=3)
    with pytest.raises(InvalidRequestError, match=r"topics\[0\].partitions\[0\].nbytes"):
        await conn.request("Produce", produce([(0, "1")]))
    with pytest.raises(InvalidRequestError, match="carry no payload"):
        await conn.request("ListOffsets", list_offsets(0), b"stray")
    with pytest.raises(UnknownServerError, match="fails on purpose"):
        await conn.request("DescribeCluster", {})
    with pytest.raises(UnknownTopicOrPartitionError):
        await conn.request("Fetch", fetch((len(DATA) + 1, 10)))
    header, _ = await conn.request("Produce", produce([(0, "1")]), raise_errors=False)
    assert header["error_code"] == InvalidRequestError.code
    assert not conn.closed and (await conn.api_versions())[0] == (0, 0)


async def test_one_way_requests_get_no_answer(conn: Connection) -> None:
    for n in range(20):
        conn.send_oneway("Produce", produce([(0, n)], acks=0), b"y" * n)
    await conn.drain()
    conn.send_oneway("Produce", produce([(0, "bad")], acks=0))  # its error answer is dropped
    header, _ = await conn.request("Produce", produce([(0, 5)]), b"z" * 5)
    assert header["topics"][0][1][0][2] == 5


async def test_backpressure_drain_with_large_one_way_sends(conn: Connection) -> None:
    chunk = b"b" * 512 * 1024
    for _ in range(64):  # 32 MiB, well past the client's 4 MiB high-water mark
        conn.send_oneway("Produce", produce([(0, len(chunk))], acks=0), chunk)
        await conn.drain()
    assert (await conn.api_versions())[0] == (0, 0)


async def test_request_timeout(conn: Connection) -> None:
    with pytest.raises(RequestTimedOutError):
        # The answer cannot come before the handler's 300 ms wait, so 20 ms always expires.
        await conn.request("ListOffsets", list_offsets(300), timeout_ms=20)
    # Answered after the late ListOffsets answer (order), which must not confuse the client.
    assert (await conn.api_versions())[18] == (0, 0)


async def test_abandoned_requests_fail_at_once_and_the_connection_goes_on(
    conn: Connection,
) -> None:
    """``abandon`` (a follower's fetcher leaving a long poll): the callers get
    RequestAbandoned without waiting, the late answer is dropped, and the next request
    on the same connection is answered (after it, in order: this server's handler holds
    it 300 ms, where a broker ends the parked fetch of a session its next fetch closes)."""
    slow = asyncio.ensure_future(conn.request("ListOffsets", list_offsets(300)))
    await wait_until_async(lambda: conn.in_flight == 1)
    conn.abandon()
    with pytest.raises(RequestAbandoned):
        await slow
    assert conn.in_flight == 0 and not conn.closed
    header, _ = await conn.request("ListOffsets", list_offsets(0))
    assert header["topics"][0][1][0][2] == 0


async def test_connection_limit_refuses_extra_connections(data_file: Path) -> None:
    async with RpcServer(make_handlers(str(data_file)), max_connections=2) as srv:
        await srv.start()
        kept = [await Connection.open("127.0.0.1", srv.port) for _ in range(2)]
        await wait_until_async(lambda: len(srv.connections) == 2)
        extra = await Connection.open("127.0.0.1", srv.port)
        with pytest.raises(NetworkError):
            await extra.request("ApiVersions", {})
        for c in kept:
            assert (await c.api_versions())[18] == (0, 0)
            await c.aclose()


async def test_connect_any_skips_unreachable_addresses(server: RpcServer) -> None:
    async with RpcServer({}) as dead:  # bind a port, then free it: nothing listens there
        await dead.start()
        dead_port = dead.port
    c = await connect_any([f"127.0.0.1:{dead_port}", f"127.0.0.1:{server.port}"])
    assert c.port == server.port
    await c.aclose()
    with pytest.raises(NetworkError, match="no bootstrap address reachable"):
        await connect_any([f"127.0.0.1:{dead_port}"], connect_timeout_ms=2000)


def test_parse_address() -> None:
    assert parse_address("localhost:9092") == ("localhost", 9092)
    assert parse_address("[::1]:9093") == ("::1", 9093)
    with pytest.raises(ValueError):
        parse_address("nohost")


async def test_server_stop_fails_clients_and_frees_the_port(data_file: Path) -> None:
    srv = RpcServer(make_handlers(str(data_file)))
    await srv.start()
    c = await Connection.open("127.0.0.1", srv.port)
    await srv.stop()
    await c.wait_closed()
    with pytest.raises(NetworkError):
        await c.request("ApiVersions", {})


@pytest.mark.parametrize("mode", ["pread", "sendfile"])
async def test_on_written_runs_once_when_the_answer_has_been_written(
    data_file: Path, mode: str
) -> None:
    """What a handler holds for its answer's bytes (a memory budget) goes back once they
    have left the server, and only once."""
    written: list[int] = []

    async def handler(request: Request) -> Response:
        parts = [b"remote bytes", FileRange(str(data_file), 0, 1024)]
        done = lambda: written.append(request.correlation_id)  # noqa: E731
        return Response(messages.FetchResponse([]), parts, done)

    srv = RpcServer({schemas.FETCH.key: handler}, file_send_mode=mode)
    await srv.start("127.0.0.1", 0)
    try:
        async with await Connection.open("127.0.0.1", srv.port) as c:
            for _ in range(3):
                _, payload = await c.request("Fetch", fetch((0, 1)))
                assert bytes(payload) == b"remote bytes" + DATA[:1024]
        await wait_until_async(lambda: len(written) == 3)
        assert len(set(written)) == 3
    finally:
        await srv.stop()


async def test_on_written_runs_for_an_answer_its_connection_never_takes() -> None:
    """An answer queued behind a slower one (answers go out in order) whose connection
    goes away is never written: its hold goes back all the same."""
    slow = asyncio.Event()
    written: list[str] = []

    async def handler(request: Request) -> Response:
        if request.message.max_wait_ms:  # the slow one
            await slow.wait()
        return Response(messages.FetchResponse([]), [b"x"], lambda: written.append("yes"))

    srv = RpcServer({schemas.FETCH.key: handler})
    await srv.start("127.0.0.1", 0)
    try:
        c = await Connection.open("127.0.0.1", srv.port)
        first = asyncio.ensure_future(c.request("Fetch", {**fetch((0, 1)), "max_wait_ms": 1}))
        second = asyncio.ensure_future(c.request("Fetch", fetch((0, 1))))
        await wait_until_async(lambda: any(conn.slots for conn in srv.connections))
        await wait_until_async(
            lambda: any(s.ready() for conn in srv.connections for s in conn.slots)
        )
        assert c._transport is not None
        # Reset (a close would be a half-close, whose answers are still written).
        sock = c._transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c._transport.abort()
        await asyncio.gather(first, second, return_exceptions=True)
        await wait_until_async(lambda: written == ["yes"])
    finally:
        slow.set()
        await srv.stop()


@pytest.mark.parametrize("mode", ["pread", "sendfile"])
async def test_on_written_runs_once_when_the_connection_is_lost_as_its_answer_is_ready(
    data_file: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection lost in the loop turn its answer became ready (a reset polled in
    that turn: its connection_lost runs before the sendfile writer's first step): the
    answer's hold goes back once and its pinned file is closed all the same."""
    written: list[int] = []

    async def handler(request: Request) -> Response:
        parts = [b"remote bytes", FileRange(str(data_file), 0, 1024)]
        return Response(messages.FetchResponse([]), parts, lambda: written.append(1))

    original = rpc_server._ServerProtocol.on_handler_done

    def lost_first(self: Any, task: asyncio.Task) -> None:
        self.transport.abort()  # queues connection_lost ahead of what flush starts
        original(self, task)

    monkeypatch.setattr(rpc_server._ServerProtocol, "on_handler_done", lost_first)

    def pinned() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if _fd_target(fd) == str(data_file))

    srv = RpcServer({schemas.FETCH.key: handler}, file_send_mode=mode)
    await srv.start("127.0.0.1", 0)
    try:
        c = await Connection.open("127.0.0.1", srv.port)
        with pytest.raises(errors.RilletError):
            await c.request("Fetch", fetch((0, 1)))
        c.close()
        await wait_until_async(lambda: written == [1] and not srv.connections)
        assert pinned() == 0
    finally:
        await srv.stop()
    assert written == [1]


def _fd_target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


async def test_a_peer_that_stops_reading_an_answer_with_on_written_is_dropped() -> None:
    """What an unread answer holds (a budget shared by every connection) must not be
    held forever by a peer that stopped reading: with no progress for the request read
    timeout, the connection is closed and the hold goes back."""
    written: list[str] = []

    async def handler(request: Request) -> Response:
        return Response(messages.FetchResponse([]), [bytes(32 << 20)], lambda: written.append("x"))

    srv = RpcServer({schemas.FETCH.key: handler}, request_read_timeout_ms=200)
    await srv.start("127.0.0.1", 0)
    try:
        c = await Connection.open("127.0.0.1", srv.port)
        assert c._transport is not None
        c._transport.pause_reading()
        answer = asyncio.ensure_future(c.request("Fetch", fetch((0, 1))))
        await wait_until_async(lambda: written == ["x"], message="the hold to go back")
        assert not srv.connections
        with pytest.raises(NetworkError):
            c._transport.resume_reading()
            await answer
    finally:
        await srv.stop()
