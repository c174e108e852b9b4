"""An in-memory fake cluster speaking the real wire protocol, for client tests.

Several ``RpcServer``s (one per fake broker) share one in-memory state: topics,
partitions with a leader, and each partition's log as back-to-back batches stamped with
offsets. It serves Metadata, Produce, Fetch (long poll), ListOffsets, CreateTopics,
DeleteTopics and DescribeCluster, and lets a test move a leader or inject an error
into the next N produce answers for a partition. Client tests use it for what the
real cluster cannot do on demand; the real cluster is tested in test_client_cluster.py.

Run as a script (``python tests/test_client_fake_broker.py --brokers 3``) it prints
``PORT <first broker port>`` and serves until killed, for CLI subprocess tests.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from rillet.client.runtime.rpc_server import Request, Response, RpcServer
from rillet.client.wire import records, schemas
from rillet.client.wire.errors import (
    InvalidPartitionsError,
    NotLeaderOrFollowerError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

CLUSTER_ID = "fake-cluster"


@dataclass
class FakePartition:
    leader: int
    replicas: list[int]
    epoch: int = 0
    log: bytearray = field(default_factory=bytearray)
    bases: list[int] = field(default_factory=list)  # base offset of each batch
    positions: list[int] = field(default_factory=list)  # byte position of each batch
    end_offset: int = 0
    appended: asyncio.Event = field(default_factory=asyncio.Event)
    inject: list[int] = field(default_factory=list)  # error codes for the next produces
    fetch_inject: list[int] = field(default_factory=list)  # ... and the next fetches
    move_at: tuple[int, int] | None = None  # (end offset, node): move the leader there


class FakeCluster:
    def __init__(self, brokers: int = 3, **server_limits: Any) -> None:
        self.broker_ids = list(range(1, brokers + 1))
        self.server_limits = server_limits  # RpcServer keyword arguments (idle_ms, ...)
        self.servers: dict[int, RpcServer] = {}
        self.topics: dict[str, list[FakePartition]] = {}
        self.produce_requests = 0
        # The next N CreateTopics create their topics but answer REQUEST_TIMED_OUT, as a
        # controller past the request's timeout_ms does while the operation goes on.
        self.create_timeouts = 0

    async def start(self) -> FakeCluster:
        for node in self.broker_ids:
            server = RpcServer(self._handlers(node), name=f"fake-{node}", **self.server_limits)
            await server.start()
            self.servers[node] = server
        return self

    async def stop(self) -> None:
        for server in self.servers.values():
            await server.stop()

    async def stop_broker(self, node: int) -> None:
        await self.servers[node].stop()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.servers.values())

    def create(self, name: str, partitions: int, rf: int = 1) -> None:
        n = len(self.broker_ids)
        self.topics[name] = [
            FakePartition(
                leader=self.broker_ids[p % n],
                replicas=[self.broker_ids[(p + i) % n] for i in range(min(rf, n))],
            )
            for p in range(partitions)
        ]

    def move_leader(self, topic: str, partition: int, node: int) -> None:
        part = self.topics[topic][partition]
        part.leader, part.epoch = node, part.epoch + 1

    def records(self, topic: str, partition: int) -> list[records.Record]:
        return records.decode_all(bytes(self.topics[topic][partition].log))

    def _handlers(self, node: int) -> dict[int, Any]:
        def bind(fn: Any) -> Any:
            async def handler(request: Request) -> Response | None:
                return fn(node, request)

            return handler

        return {
            schemas.METADATA.key: bind(self._metadata),
            schemas.PRODUCE.key: bind(self._produce),
            schemas.FETCH.key: self._bind_fetch(node),
            schemas.LIST_OFFSETS.key: bind(self._list_offsets),
            schemas.CREATE_TOPICS.key: bind(self._create_topics),
            schemas.DELETE_TOPICS.key: bind(self._delete_topics),
            schemas.DESCRIBE_CLUSTER.key: bind(self._describe_cluster),
        }

    def _brokers(self) -> list[list[Any]]:
        return [[n, "127.0.0.1", s.port, None] for n, s in self.servers.items() if s.port]

    def _metadata(self, node: int, request: Request) -> Response:
        names = request.fields["topics"]
        out = []
        for name in sorted(self.topics) if names is None else names:
            parts = self.topics.get(name)
            if parts is None:
                out.append([3, name, False, []])
                continue
            out.append(
                [
                    0,
                    name,
                    False,
                    [
                        [0, i, p.leader, p.epoch, p.replicas, p.replicas, []]
                        for i, p in enumerate(parts)
                    ],
                ]
            )
        return Response(
            {
                "cluster_id": CLUSTER_ID,
                "controller_id": 101,
                "brokers": self._brokers(),
                "topics": out,
            }
        )

    def _produce(self, node: int, request: Request) -> Response | None:
        self.produce_requests += 1
        payload, pos = request.payload, 0
        results = []
        for topic, parts in request.fields["topics"]:
            out = []
            for p, nbytes in parts:
                chunk = bytes(payload[pos : pos + nbytes])
                pos += nbytes
                out.append([p, *self._append(node, topic, p, chunk), -1, 0, None])
            results.append([topic, out])
        if request.fields["acks"] == 0:
            return None
        return Response({"topics": results})

    def _append(self, node: int, topic: str, p: int, chunk: bytes) -> tuple[int, int]:
        parts = self.topics.get(topic)
        if parts is None or p >= len(parts):
            return UnknownTopicOrPartitionError.code, -1
        part = parts[p]
        if part.leader != node:
            return NotLeaderOrFollowerError.code, -1
        if part.inject:
            return part.inject.pop(0), -1
        base = part.end_offset
        buf = bytearray(chunk)
        pos = 0
        for batch_pos, h in list(records.iter_batches(buf)):
            records.stamp(buf, batch_pos, part.end_offset, part.epoch)
            part.bases.append(part.end_offset)
            part.positions.append(len(part.log) + batch_pos)
            part.end_offset += h.last_offset_delta + 1
            pos = batch_pos + h.size
        part.log += buf[:pos]
        if part.move_at is not None and part.end_offset >= part.move_at[0]:
            part.leader, part.epoch, part.move_at = part.move_at[1], part.epoch + 1, None
        part.appended.set()
        part.appended = asyncio.Event()
        return 0, base

    def _bind_fetch(self, node: int) -> Any:
        async def fetch(request: Request) -> Response:
            f = request.fields
            deadline = asyncio.get_running_loop().time() + f["max_wait_ms"] / 1000
            while True:
                results, payload, waits = self._fetch_once(node, f)
                remaining = deadline - asyncio.get_running_loop().time()
                if payload or not waits or remaining <= 0:
                    return Response({"topics": results}, payload)
                with_timeout = [asyncio.ensure_future(w.wait()) for w in waits]
                await asyncio.wait(with_timeout, timeout=remaining)
                for w in with_timeout:
                    w.cancel()

        return fetch

    def _fetch_once(self, node: int, f: dict) -> tuple[list, list[bytes], list[asyncio.Event]]:
        results: list[Any] = []
        payload: list[bytes] = []
        waits: list[asyncio.Event] = []
        for topic, parts in f["topics"]:
            out = []
            for p, offset, _lfe, _cle, _lso, max_bytes, _topic_id in parts:
                part = (self.topics.get(topic) or [None] * (p + 1))[p] if p >= 0 else None
                if part is None:
                    out.append([p, 3, -1, -1, -1, None, -1, 0])
                    continue
                if part.leader != node:
                    out.append([p, 6, -1, -1, -1, None, -1, 0])
                    continue
                if offset > part.end_offset or offset < 0:
                    out.append([p, 1, part.end_offset, part.end_offset, 0, None, -1, 0])
                    continue
                if part.fetch_inject:
                    code = part.fetch_inject.pop(0)
                    out.append([p, code, part.end_offset, part.end_offset, 0, None, -1, 0])
                    continue
                data = self._read(part, offset, max_bytes)
                if not data:
                    waits.append(part.appended)
                payload.append(data)
                out.append([p, 0, part.end_offset, part.end_offset, 0, None, -1, len(data)])
            results.append([topic, out])
        return results, payload, waits

    @staticmethod
    def _read(part: FakePartition, offset: int, max_bytes: int) -> bytes:
        if offset >= part.end_offset:
            return b""
        i = max(bisect.bisect_right(part.bases, offset) - 1, 0)
        start = part.positions[i]
        end = start
        for j in range(i, len(part.positions)):
            nxt = part.positions[j + 1] if j + 1 < len(part.positions) else len(part.log)
            if end > start and nxt - start > max_bytes:
                break
            end = nxt
        return bytes(part.log[start:end])

    def _list_offsets(self, node: int, request: Request) -> Response:
        results = []
        for topic, parts in request.fields["topics"]:
            out = []
            for p, _epoch, ts in parts:
                part = (
                    self.topics.get(topic, [])[p] if p < len(self.topics.get(topic, [])) else None
                )
                if part is None:
                    out.append([p, 3, -1, -1, -1])
                elif part.leader != node:
                    out.append([p, 6, -1, -1, -1])
                else:
                    out.append([p, 0, ts, 0 if ts == -2 else part.end_offset, part.epoch])
            results.append([topic, out])
        return Response({"topics": results})

    def _create_topics(self, node: int, request: Request) -> Response:
        out = []
        for name, n, rf, _assign, _configs, *_ in request.fields["topics"]:
            if name in self.topics:
                e = TopicAlreadyExistsError.code
                out.append([name, e, f"topic {name!r} already exists", n, rf])
            elif n <= 0:
                out.append([name, InvalidPartitionsError.code, "partitions must be > 0", n, rf])
            elif self.create_timeouts > 0:
                self.create_timeouts -= 1
                self.create(name, n, rf)
                out.append([name, 7, "timed out; the creation goes on", n, rf])
            else:
                self.create(name, n, rf)
                out.append([name, 0, None, n, rf])
        return Response({"topics": out})

    def _delete_topics(self, node: int, request: Request) -> Response:
        out = []
        for name in request.fields["topic_names"]:
            if self.topics.pop(name, None) is None:
                out.append([name, 3, f"topic {name!r} does not exist"])
            else:
                out.append([name, 0, None])
        return Response({"responses": out})

    def _describe_cluster(self, node: int, request: Request) -> Response:
        brokers = [[n, "127.0.0.1", s.port, None, False] for n, s in self.servers.items()]
        return Response({"cluster_id": CLUSTER_ID, "controller_id": 101, "brokers": brokers})


async def _serve(brokers: int) -> None:
    cluster = await FakeCluster(brokers).start()
    print(f"PORT {next(iter(cluster.servers.values())).port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", type=int, default=1)
    import uvloop

    uvloop.run(_serve(parser.parse_args().brokers))
    sys.exit(0)
