"""A new replica of a partition whose early history exists only in the remote tier
(broker/replication/fetcher.py, follower_state.py): two in-process brokers with
hand-made metadata. Broker 1 leads the partition alone; its first segments are in the
remote tier (RemoteSegment records) and gone from its local log. Broker 2 is added as
a replica: its fetch at 0 is answered OFFSET_MOVED_TO_TIERED_STORAGE, it asks the
leader's local log start (ListOffsets -4), restarts its log there with the remote
segments' leader epochs, and catches up from it without copying the remote range."""

from __future__ import annotations

import uuid
from pathlib import Path

from helpers import wait_until_async
from test_broker_inproc import batch, broker_config, fetch, produce
from test_replication_fetcher_faults import Link, SharedMetadata

from rillet.broker.server import BrokerServer
from rillet.client.wire.connection import Connection
from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    Partition,
    RemoteSegment,
    Topic,
    TopicPartition,
)

TOPIC = "history"


class TierOn:
    """A remote tier that is on, with nothing to do: this test reads nothing remotely
    and copies nothing (the remote segments are hand-made records)."""

    reader = None

    def on_metadata(self, *args: object) -> None:
        pass

    async def close(self) -> None:
        pass


TP = TopicPartition(TOPIC, 0)


async def test_a_new_replica_starts_at_the_leaders_local_log_start(tmp_path: Path) -> None:
    shared = SharedMetadata()
    servers: list[BrokerServer] = []
    try:
        for node_id in (1, 2):
            config = broker_config(
                tmp_path / f"logs-{node_id}",
                f"node.id={node_id}",
                "replica.fetch.backoff.ms=50",
                "replica.fetch.wait.max.ms=50",
            )
            server = BrokerServer(config, link=Link(shared, node_id))  # type: ignore[arg-type]
            await server.start()
            servers.append(server)
        leader, follower = servers
        assert leader.replicas is not None and follower.replicas is not None
        leader.replicas.remote = TierOn()  # type: ignore[assignment]
        topic_id = uuid.uuid4().hex
        await shared.commit([Topic(TOPIC, topic_id), Partition(topic_id, 0, (1,), (1,), 1, 0, 0)])
        async with await Connection.open("127.0.0.1", leader.port) as conn:
            log = leader.replicas.replicas[TP].log
            for seg in range(3):  # three segments of two batches: the first two go remote
                if seg:
                    log.roll()
                for n in range(2):
                    assert (await produce(conn, TOPIC, 0, batch(b"%d-%d" % (seg, n))))[1] == 0
            segments = list(log.segments)
            local_start = segments[2].base_offset
            await shared.commit(
                [
                    RemoteSegment(
                        topic_id,
                        0,
                        f"s{i}",
                        seg.base_offset,
                        segments[i + 1].base_offset - 1,
                        ((0, 0),),
                        SEGMENT_COPY_FINISHED,
                        seg.size,
                        1000,
                        1,
                        0,
                    )
                    for i, seg in enumerate(segments[:2])
                ]
            )
            log.increment_log_start_offset(local_start)
            # A reassignment adds broker 2 to the replicas (a new partition epoch).
            await shared.commit([Partition(topic_id, 0, (1, 2), (1,), 1, 0, 1)])
            end = log.log_end_offset

            def caught_up() -> bool:
                replica = follower.replicas.replicas.get(TP)  # type: ignore[union-attr]
                return replica is not None and replica.log.log_end_offset == end

            await wait_until_async(caught_up)
            copy = follower.replicas.replicas[TP].log
            assert copy.log_start_offset == local_start  # nothing below it was copied
            assert copy.read_bytes(local_start, 1 << 20) == log.read_bytes(local_start, 1 << 20)
            # The remote records' epoch (0 from offset 0) is in the follower's cache.
            assert copy.epochs.entries()[0] == (0, 0)
            # The leader's local log start moves on (its local retention, once the next
            # segment is remote too): the follower takes it, up to its own high watermark
            # (a consumer is told the log start across both tiers, 0).
            log.roll()
            assert (await produce(conn, TOPIC, 0, batch(b"last")))[1] == 0
            log.increment_log_start_offset(end)
            await wait_until_async(lambda: copy.log_start_offset == end)
            row, _ = await fetch(conn, TOPIC, 0, end)
            assert row[4] == 0  # log_start_offset
    finally:
        for server in reversed(servers):
            await server.stop(controlled=False)
