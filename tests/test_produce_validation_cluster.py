"""A leader refuses batches consumers could not read (issue 11, finding 4).

Real processes: 1 controller, 1 broker. Batches with a valid CRC but records that do
not decode, or a record count that disagrees with the records or the offset delta, go
in through raw Produce requests: each is refused with INVALID_RECORD (not retriable:
resending the same bytes cannot help), a request whose
batches for a partition include one such batch appends none of them, and a consumer
reads the good records around them. On a compacted topic a keyless record is refused
with INVALID_RECORD naming it, and the cleaner goes on compacting that log.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from helpers import wait_until
from replication_cluster import Client, run

from rillet.client.wire import errors, records

pytestmark = pytest.mark.cluster

BROKER = 1
OVERRIDES = {
    BROKER: {"log.retention.check.interval.ms": 200},  # the cleaner runs every round
}
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.compaction.lag.ms": "0"}
KEYS = 8
CORRUPT = errors.code_of("CORRUPT_MESSAGE")
INVALID = errors.code_of("INVALID_RECORD")


def restamped(body: bytes, count: int, last_delta: int) -> bytes:
    """A batch whose CRC is valid for whatever ``body`` holds."""
    return records.assemble_batch(
        body,
        attributes=0,
        record_count=count,
        last_offset_delta=last_delta,
        base_timestamp=0,
        max_timestamp=0,
    )


GARBAGE = restamped(b"\xc1 not msgpack at all", 1, 0)
TWO_RECORDS = msgpack.packb([None, b"x", None, b"y"], use_bin_type=True)
COUNT_TOO_HIGH = restamped(TWO_RECORDS, 3, 2)
DELTA_TOO_HIGH = restamped(TWO_RECORDS, 2, 4)


def test_a_leader_refuses_batches_consumers_could_not_read(cluster_factory: Any) -> None:
    cluster = cluster_factory(controllers=1, brokers=1, node_overrides=OVERRIDES)

    async def body(client: Client) -> None:
        await client.create_topic("plain", 1, 1, {})
        await client.create_topic("c", 1, 1, COMPACTED)
        assert await client.produce(BROKER, "plain", 0, [b"a", b"b"]) == (errors.NONE, 0)
        for bad in (GARBAGE, COUNT_TOO_HIGH, DELTA_TOO_HIGH):
            refused = await client.produce_bytes(BROKER, "plain", 0, bad)
            assert refused.error_code == INVALID, refused
        # One request's batches for a partition are all or nothing.
        good = records.encode_batch([b"never"])
        refused = await client.produce_bytes(BROKER, "plain", 0, good + GARBAGE)
        assert refused.error_code == INVALID and "batch 1" in refused.error_message
        assert await client.produce(BROKER, "plain", 0, [b"c"]) == (errors.NONE, 2)
        got = [(r.offset, r.value) for r in await client.read_all(BROKER, "plain", 0)]
        assert got == [(0, b"a"), (1, b"b"), (2, b"c")]

        # A compacted topic: keys overwritten many times, in many small segments, with
        # refused batches in between; the cleaner must keep compacting the log.
        keys = [b"k%d" % k for k in range(KEYS)]
        for round_ in range(40):
            values = [b"v%d-%d" % (round_, k) for k in range(KEYS)]
            code, _ = await client.produce(BROKER, "c", 0, values, keys=keys)
            assert code == errors.NONE
            if round_ == 10:
                keyless = records.encode_batch([b"a", b"b", b"c"], [b"k0", b"k1", None])
                refused = await client.produce_bytes(BROKER, "c", 0, keyless)
                assert refused.error_code == INVALID, refused
                assert "record 2 has no key" in refused.error_message
                refused = await client.produce_bytes(BROKER, "c", 0, GARBAGE)
                assert refused.error_code == INVALID, refused

    run(cluster, body)

    def compacted() -> list[Any]:
        recs: list[Any] = run(cluster, lambda client: client.read_all(BROKER, "c", 0))
        return recs if recs and recs[0].offset > 0 else []

    wait_until(compacted, timeout=60, message="the cleaner compacted the head of the log")
    recs = run(cluster, lambda client: client.read_all(BROKER, "c", 0))
    assert len(recs) < 40 * KEYS
    assert all(r.key is not None for r in recs)
    latest = {r.key: r.value for r in recs}
    assert latest == {b"k%d" % k: b"v39-%d" % k for k in range(KEYS)}
