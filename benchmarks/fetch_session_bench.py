"""Fetch sessions (KIP-227): what an idle fetch costs with and without one.

One in-process broker leads ``--partitions`` idle partitions (RF 1, hand-made metadata,
no controller). A fetcher of all of them asks with ``max_wait_ms`` 0, as a follower or
a consumer does between records, three ways: sessionless (every partition listed and
answered, as before sessions), the full fetch that opens a session, and incremental
fetches of that session (nothing listed, nothing answered). For each it prints the
request and response header bytes and the leader's CPU per fetch: decoding the request
header, the Fetch handler (session, reads, answer) and encoding the response header, as
the RPC server does them, without the socket; then the CPU of one replica tick.

    python benchmarks/fetch_session_bench.py --partitions 3000 --replica-id 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rillet.broker.config import BrokerConfig, broker_config_table
from rillet.broker.server import BrokerServer, MetadataListener
from rillet.client.fetch_session import FetchSessionBuilder
from rillet.client.runtime.rpc_server import Handler, Request
from rillet.client.wire import framing, schemas
from rillet.client.wire import messages as m
from rillet.controller.metadata.image import (
    Endpoint,
    MetadataDelta,
    MetadataImage,
    Partition,
    RegisterBroker,
    Topic,
    UnfenceBroker,
)

TOPIC = "idle"


class StandaloneLink:
    """Plays the controller for one broker: registers it and commits what it is given."""

    def __init__(self) -> None:
        self.image = MetadataImage()
        self.offset = 0
        self.listener: MetadataListener | None = None

    async def commit(self, recs: list[Any]) -> None:
        delta = MetadataDelta(self.image)
        for rec in recs:
            self.offset += 1
            delta.replay(rec, self.offset, 1)
        self.image = delta.apply()
        assert self.listener is not None
        await self.listener(delta, self.image)

    async def start(self, endpoints: list[tuple[str, str, int]], on_metadata: Any) -> None:
        self.listener = on_metadata
        eps = tuple(Endpoint(*e) for e in endpoints)
        await self.commit([RegisterBroker(1, uuid.uuid4().hex, 1, eps, None), UnfenceBroker(1, 1)])

    def controller_id(self) -> int:
        return -1

    async def forward(self, message: Any) -> Any:
        raise NotImplementedError

    async def alter_partitions(self, *args: Any) -> Any:
        raise NotImplementedError

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        return True

    async def stop(self) -> None:
        pass


async def leader_cpu_us(handler: Handler, header: bytes, rounds: int) -> tuple[float, int]:
    """Mean leader CPU per fetch (µs) and the response header's size."""
    size = 0
    start = time.process_time()
    for _ in range(rounds):
        fields = framing.decode_header(header)
        message = m.FetchRequest.from_header(fields)
        request = Request(schemas.FETCH, 0, 1, "bench", fields, memoryview(b""), "", message)
        response = await handler(request)
        assert response is not None
        size = len(framing.encode_header(response.message.to_header()))
    return (time.process_time() - start) / rounds * 1e6, size


async def run(partitions: int, replica_id: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        table = broker_config_table()
        values = table.load(
            None, ["node.id=1", "listeners=BROKER://127.0.0.1:0", f"log.dirs={Path(tmp)}"]
        )
        link = StandaloneLink()
        server = BrokerServer(BrokerConfig.from_config(values), link=link)  # type: ignore[arg-type]
        await server.start()
        try:
            topic_id = uuid.uuid4().hex
            await link.commit(
                [Topic(TOPIC, topic_id)]
                + [Partition(topic_id, p, (1, 2), (1, 2), 1, 0, 0) for p in range(partitions)]
            )
            assert server.rpc is not None
            handler = server.rpc.handlers[schemas.FETCH.key]
            wanted = {
                (TOPIC, p): m.FetchPartition(p, 0, -1, 0, -1, 1 << 20, "")
                for p in range(partitions)
            }
            builder = FetchSessionBuilder()

            def header(session_id: int = 0, epoch: int = -1, topics: Any = None) -> bytes:
                req = m.FetchRequest(
                    replica_id=replica_id,
                    max_wait_ms=0,
                    min_bytes=1,
                    max_bytes=10 << 20,
                    topics=topics if topics is not None else builder.build(wanted).topics,
                    session_id=session_id,
                    session_epoch=epoch,
                )
                fields = {"api": schemas.FETCH.key, "version": 0, "correlation_id": 1}
                return framing.encode_header({**fields, **req.to_header()})

            out: dict[str, Any] = {"partitions": partitions, "replica_id": replica_id}
            sessionless = header()
            cpu, resp = await leader_cpu_us(handler, sessionless, rounds)
            out["sessionless"] = {"request_bytes": len(sessionless), "response_bytes": resp,
                                  "leader_cpu_us": round(cpu)}  # fmt: skip
            s = builder.build(wanted)
            full = header(0, 0, s.topics)
            fields = framing.decode_header(full)
            request = Request(
                schemas.FETCH, 0, 1, "bench", fields, memoryview(b""), "",
                m.FetchRequest.from_header(fields),
            )  # fmt: skip
            response = await handler(request)
            assert response is not None
            builder.on_response(response.message)  # type: ignore[arg-type]
            out["session_full"] = {"request_bytes": len(full),
                                   "response_bytes": len(framing.encode_header(
                                       response.message.to_header()))}  # fmt: skip
            # Incremental: the same epoch can be sent once, so each round gets its own.
            total_cpu, resp_size, req_size = 0.0, 0, 0
            for _ in range(rounds):
                s = builder.build(wanted)
                assert s.listed == 0
                inc = header(s.session_id, s.session_epoch, s.topics)
                req_size = len(inc)
                cpu, resp_size = await leader_cpu_us(handler, inc, 1)
                builder.on_response(m.FetchResponse([], session_id=s.session_id))
                total_cpu += cpu
            out["incremental"] = {"request_bytes": req_size, "response_bytes": resp_size,
                                  "leader_cpu_us": round(total_cpu / rounds)}  # fmt: skip
            # The replica tick (replica.tick.interval.ms) once the fetches above left the
            # follower at every log end (as a consumer, follower 2 never fetched: every
            # partition may yet shrink its ISR, so each is ticked).
            assert server.replicas is not None
            server.replicas.tick()  # ticks every replica the fetches above touched, once
            start = time.process_time()
            for _ in range(rounds):
                server.replicas.tick()
            out["tick_us"] = round((time.process_time() - start) / rounds * 1e6)
            return out
        finally:
            await server.stop(controlled=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=3000)
    parser.add_argument("--replica-id", type=int, default=2, help="-1: a consumer")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.partitions, args.replica_id, args.rounds)), indent=2))


if __name__ == "__main__":
    main()
