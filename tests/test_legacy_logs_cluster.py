"""A broker started on a data dir holding an old log (legacy batches, magic 0x52)
serves it as it is: our Consumer and the Spark reader's fetch path read every record,
new produces land after it as v2, and a producer's legacy batch is refused with
INVALID_RECORD naming the format. Real processes: 1 controller, 1 broker."""

from __future__ import annotations

from typing import Any

import pytest
from legacy_batches import encode_legacy_batch
from replication_cluster import Client, run

from rillet.client.consumer import Consumer
from rillet.client.wire import codecs, errors
from rillet.storage import Log

pytestmark = pytest.mark.cluster
pa = pytest.importorskip("pyarrow", reason="needs the spark extra")

BROKER = 1
INVALID = errors.code_of("INVALID_RECORD")
CODECS = (codecs.NONE, codecs.LZ4, codecs.ZSTD, codecs.NONE)


def old_batch(i: int) -> bytes:
    return encode_legacy_batch(
        [b"old%d-%d" % (i, j) for j in range(3)],
        [b"k%d" % j for j in range(3)],
        headers=[[("h", b"%d" % i)], None, None],
        timestamps=[1000 + i * 10 + j for j in range(3)],
        compression=CODECS[i],
    )


def test_a_broker_serves_an_old_log_and_refuses_legacy_produces(cluster_factory: Any) -> None:
    from rillet.client.metadata import MetadataClient
    from rillet.client.spark.source import OffsetRange, fetch_chunks, to_arrow

    cluster = cluster_factory(controllers=1, brokers=1)

    async def create(client: Client) -> None:
        await client.create_topic("old", 1, 1, {})
        await client.partitions("old")

    run(cluster, create)
    cluster.stop_node(BROKER)  # the old broker's log, written before the upgrade
    log = Log.open(cluster.node_dir(BROKER) / "logs" / "old-0")
    for i in range(4):
        log.append(old_batch(i), max(log.latest_epoch, 0))
    log.close()
    cluster.start_node(BROKER)
    cluster.wait_ready()
    want = [(i * 3 + j, b"old%d-%d" % (i, j)) for i in range(4) for j in range(3)]
    want += [(12, b"new0"), (13, b"new1")]

    async def body(client: Client) -> None:
        assert await client.produce(BROKER, "old", 0, [b"new0", b"new1"]) == (errors.NONE, 12)
        refused = await client.produce_bytes(BROKER, "old", 0, old_batch(0))
        assert refused.error_code == INVALID and "magic 0x52" in refused.error_message
        async with Consumer(
            "old", bootstrap=cluster.bootstrap, from_beginning=True, fetch_max_wait_ms=100
        ) as consumer:
            got: list = []
            while len(got) < len(want):
                batch = await consumer.getmany(timeout_ms=30_000)
                assert batch, f"no records after {len(got)}"
                for recs in batch.values():
                    got += recs
        assert [(r.offset, r.value) for r in got] == want
        assert (got[0].timestamp, got[0].headers) == (1000, [("h", b"0")])

        meta = MetadataClient(cluster.bootstrap)
        try:
            rng = OffsetRange("old", 0, 1, 14)  # starts inside the first legacy batch
            table = pa.Table.from_batches(
                [to_arrow("old", 0, c) async for c in fetch_chunks(meta, rng)]
            )
        finally:
            await meta.close()
        assert (
            list(zip(table["offset"].to_pylist(), table["value"].to_pylist(), strict=True))
            == want[1:]
        )
        headers = table["headers"].to_pylist()
        assert headers[2] == [{"key": "h", "value": b"1"}] and headers[0] is None  # offsets 3, 1

    run(cluster, body)
