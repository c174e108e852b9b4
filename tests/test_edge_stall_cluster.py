"""A hostile client cannot get a broker fenced (docs/protocol.md, "Limits at the edge").

Pipelined requests that each cost the broker tens of milliseconds (Metadata naming
20,000 topics that do not exist) used to start together in one turn of the event loop,
holding it, and the broker's heartbeats to the controller with it, for seconds: longer
than the controller's session timeout, so the controller fenced a healthy broker. A
watcher follows the controller's committed metadata while one connection pipelines such
requests: the broker must never appear fenced, and every request must be answered.
"""

from __future__ import annotations

import asyncio

import pytest
from cluster import ClusterFactory

from rillet.broker.link.controller_client import ControllerChannel, MetadataFollower
from rillet.client.wire.connection import parse_address
from rillet.client.wire.framing import FrameDecoder, encode_frame_bytes
from rillet.controller.metadata.image import MetadataDelta, MetadataImage

pytestmark = pytest.mark.cluster

SESSION_TIMEOUT_MS = 1_000  # several of the broker's heartbeats (every 200 ms here)
PIPELINED = 60
TOPICS_PER_REQUEST = 20_000


def test_pipelined_costly_requests_do_not_get_the_broker_fenced(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(
        controllers=1,
        brokers=1,
        overrides={
            "broker.session.timeout.ms": SESSION_TIMEOUT_MS,
            "broker.heartbeat.interval.ms": 200,
        },
    )
    (broker,) = cluster.brokers()
    host, port = parse_address(cluster.broker_address(broker.node_id))
    frames = b"".join(
        encode_frame_bytes(
            {
                "api": 3,
                "version": 0,
                "correlation_id": i,
                "topics": [f"missing-{i}-{n}" for n in range(TOPICS_PER_REQUEST)],
            }
        )
        for i in range(PIPELINED)
    )

    async def main() -> tuple[list[bool], list[int]]:
        fenced: list[bool] = []  # the broker's state after each committed batch

        def watch(delta: MetadataDelta, image: MetadataImage) -> None:
            if broker.node_id in image.brokers:
                fenced.append(not image.is_unfenced(broker.node_id))

        follower = MetadataFollower(
            ControllerChannel(cluster.voters), listener=watch, max_wait_ms=100
        )
        follower.start()
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(frames)
            writer.write_eof()
            decoder, answered = FrameDecoder(), []
            while chunk := await reader.read(1 << 20):
                answered += [header["correlation_id"] for header, _ in decoder.feed(chunk)]
            writer.close()
            # Whatever the controller decided meanwhile, the watcher has seen it.
            await follower.wait_for_offset(follower.high_watermark)
        finally:
            await follower.stop()
            await follower.channel.close()
        return fenced, answered

    fenced, answered = asyncio.run(main())
    assert answered == list(range(PIPELINED))
    assert fenced and not any(fenced), "the controller fenced the broker"
