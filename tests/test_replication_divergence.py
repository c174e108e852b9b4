"""Two quick successive failovers (the KIP-101 cases), with real processes.

acks=1 writes leave tails that only the leader of the moment holds. Leader A is killed,
B takes over and takes some writes, then B is killed too before the third replica has
all of them, and C leads. A and B come back holding records C never had (A in epoch 0,
B in epoch 1): fetch-based truncation by leader epoch must cut exactly those, so that
afterwards every replica holds byte-identical batches up to the high watermark.
The logs are compared on disk, with rillet.storage.Log, after a clean stop.
"""

from __future__ import annotations

import pytest
from helpers import wait_until
from replication_cluster import BROKERS, Client, Writer, replication_cluster, run
from test_replication_faults import acks_grow, all_isrs_full, partitions

from rillet.broker.replication import hw_checkpoint
from rillet.client.wire import records
from rillet.controller.metadata.image import TopicPartition
from rillet.storage import Log

pytestmark = pytest.mark.cluster

TOPIC = "kip101"


def log_bytes(log: Log, end: int) -> bytes:
    """The log's batches from its start up to offset ``end``, as stored."""
    out = bytearray()
    offset = log.log_start_offset
    while offset < end:
        data = log.read_bytes(offset, 1 << 20, end)
        if not data:
            break
        out += data
        *_, (_, last) = records.iter_batches(data)
        offset = last.next_offset
    return bytes(out)


def test_two_quick_failovers_leave_no_divergent_replica(cluster_factory) -> None:
    cluster = replication_cluster(cluster_factory)

    async def create(client: Client) -> None:
        await client.create_topic(TOPIC, 1, 3, {})

    run(cluster, create)
    wait_until(lambda: all_isrs_full(cluster, TOPIC, 1), message="a full ISR")
    writer = Writer(cluster, TOPIC, 1, required_acks=1).start()
    try:
        acks_grow(writer)
        first = partitions(cluster, TOPIC)[0].leader
        cluster.stop_node(first, kill=True)
        second = wait_until(lambda: _new_leader(cluster, {first}), message="a second leader")
        acks_grow(writer, 20)  # the second leader takes writes in its own epoch...
        cluster.stop_node(second, kill=True)  # ...and dies before they all replicate
        third = wait_until(lambda: _new_leader(cluster, {first, second}), message="a third leader")
        acks_grow(writer, 20)
        cluster.start_node(first)
        cluster.start_node(second)
        wait_until(lambda: all_isrs_full(cluster, TOPIC, 1), message="the ISR refilled")
        acks_grow(writer)
    finally:
        writer.stop()

    # One acks=all write with the whole ISR: once it is acknowledged, every replica
    # holds everything below it.
    async def sentinel(client: Client) -> tuple[int, int]:
        leader = (await client.partitions(TOPIC))[0].leader
        return await client.produce(leader, TOPIC, 0, [b"sentinel"], acks=-1)

    code, sentinel_offset = run(cluster, sentinel)
    assert code == 0 and all_isrs_full(cluster, TOPIC, 1)
    cluster.stop(timeout_s=30)
    end = sentinel_offset + 1
    logs = {b: Log.open(cluster.node_dir(b) / "logs" / f"{TOPIC}-0") for b in BROKERS}
    try:
        leader_bytes = log_bytes(logs[third], end)
        decoded = records.decode_all(leader_bytes)
        assert decoded[-1].offset == sentinel_offset and decoded[-1].value == b"sentinel"
        assert all(r.value in writer.sent for r in decoded[:-1])
        for b, log in logs.items():
            assert log_bytes(log, end) == leader_bytes, f"broker {b} diverges below {end}"
            hw = hw_checkpoint.read(cluster.node_dir(b) / "logs").get(TopicPartition(TOPIC, 0))
            assert hw is not None and hw <= log.log_end_offset
        epochs = {b: [e for e in log.epochs.entries() if e[1] < end] for b, log in logs.items()}
        assert len({tuple(e) for e in epochs.values()}) == 1, epochs
    finally:
        for log in logs.values():
            log.close()


def _new_leader(cluster, excluded: set[int]) -> int | None:  # type: ignore[no-untyped-def]
    leader = partitions(cluster, TOPIC)[0].leader
    return leader if leader >= 0 and leader not in excluded else None
