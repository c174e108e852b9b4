from __future__ import annotations

import random

import pytest

from rillet.client.partitioner import StickyPartitioner, murmur2, partition_for_key

# Kafka's own vectors (clients UtilsTest), so keys land where Kafka would put them.
KAFKA_VECTORS = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize(("text", "expected"), sorted(KAFKA_VECTORS.items()))
def test_murmur2_matches_kafka(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected


def test_keyed_partition_is_positive_modulo() -> None:
    for text, h in KAFKA_VECTORS.items():
        assert partition_for_key(text.encode(), 7) == (h & 0x7FFFFFFF) % 7


def test_sticky_partitioner_stays_until_batch_closes_then_moves() -> None:
    sp = StickyPartitioner(random.Random(1))
    first = sp.partition("t", 6)
    assert all(sp.partition("t", 6) == first for _ in range(100))
    nxt = sp.on_new_batch("t", 6, first)
    assert nxt != first and sp.partition("t", 6) == nxt
    assert sp.on_new_batch("single", 1, 0) == 0
