"""A small RpcServer in its own process, for tests that need a live peer.

Run ``python tests/rpc_echo_server.py [--file-send-mode pread|sendfile]``; it prints
``PORT <n>`` on stdout once listening on 127.0.0.1 and serves until SIGTERM or SIGINT.
``make_handlers`` is importable, so in-process tests serve the same APIs.

APIs served (besides the built-in ApiVersions):
- Produce: answers each partition with base_offset = its nbytes (acks=0: no answer);
- Fetch: each partition gets ``partition_max_bytes`` bytes of ``data_path`` from
  ``fetch_offset``, sent as a FileRange;
- ListOffsets: waits ``timestamp`` ms of its first partition (at most ``--max-delay-ms``),
  then echoes, so tests can make later requests finish first;
- DescribeCluster: raises, to exercise UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import uvloop

from rillet.client.runtime.rpc_server import FileRange, Handler, Request, Response, RpcServer
from rillet.client.wire import messages as m
from rillet.client.wire import schemas
from rillet.client.wire.errors import UnknownTopicOrPartitionError


async def produce(request: Request) -> Response | None:
    req: m.ProduceRequest = request.message
    if req.acks == 0:
        return None
    topics = [
        m.ProduceTopicResult(
            t.topic,
            [m.ProducePartitionResult(p.partition, 0, p.nbytes, -1, 0, None) for p in t.partitions],
        )
        for t in req.topics
    ]
    return Response(m.ProduceResponse(topics))


def make_fetch(data_path: str) -> Handler:
    size = os.path.getsize(data_path)

    async def fetch(request: Request) -> Response:
        req: m.FetchRequest = request.message
        topics: list[m.FetchTopicResult] = []
        parts: list[FileRange] = []
        for t in req.topics:
            results = []
            for p in t.partitions:
                if p.fetch_offset > size:
                    raise UnknownTopicOrPartitionError(
                        f"{t.topic}-{p.partition}: offset {p.fetch_offset} past end"
                    )
                n = min(p.partition_max_bytes, size - p.fetch_offset)
                results.append(m.FetchPartitionResult(p.partition, 0, size, size, 0, None, -1, n))
                parts.append(FileRange(data_path, p.fetch_offset, n))
            topics.append(m.FetchTopicResult(t.topic, results))
        return Response(m.FetchResponse(topics), parts)

    return fetch


def make_list_offsets(max_delay_ms: int) -> Handler:
    async def list_offsets(request: Request) -> Response:
        topics = request.message.topics
        delay_ms = topics[0].partitions[0].timestamp if topics and topics[0].partitions else 0
        await asyncio.sleep(min(delay_ms, max_delay_ms) / 1000)
        answer = [
            m.ListOffsetsTopicResult(
                t.topic,
                [
                    m.ListOffsetsPartitionResult(p.partition, 0, p.timestamp, p.timestamp, 0)
                    for p in t.partitions
                ],
            )
            for t in topics
        ]
        return Response(m.ListOffsetsResponse(answer))

    return list_offsets


async def describe_cluster(request: Request) -> Response:
    raise RuntimeError("describe cluster handler fails on purpose")


def make_handlers(data_path: str, max_delay_ms: int = 60_000) -> dict[int, Handler]:
    return {
        schemas.PRODUCE.key: produce,
        schemas.FETCH.key: make_fetch(data_path),
        schemas.LIST_OFFSETS.key: make_list_offsets(max_delay_ms),
        schemas.DESCRIBE_CLUSTER.key: describe_cluster,
    }


async def serve(args: argparse.Namespace) -> None:
    server = RpcServer(
        make_handlers(args.data, args.max_delay_ms),
        max_request_bytes=args.max_request_bytes,
        max_connections=args.max_connections,
        file_send_mode=args.file_send_mode,
        name="echo",
    )
    await server.start("127.0.0.1", 0)
    print(f"PORT {server.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--file-send-mode", default="pread", choices=["pread", "sendfile"])
    parser.add_argument("--max-request-bytes", type=int, default=1024 * 1024)
    parser.add_argument("--max-connections", type=int, default=64)
    parser.add_argument("--max-delay-ms", type=int, default=60_000, help="ListOffsets cap")
    parser.add_argument("--data", default=__file__, help="file that Fetch serves")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
