"""Choosing a partition for a record, as Kafka's Java producer does.

Keyed records go to ``toPositive(murmur2(key)) % partitions`` with Kafka's murmur2
(seed 0x9747b28c), so a key lands on the same partition number it would in Kafka.
Unkeyed records are sticky: they stay on one partition until its batch is sent, then
move on (KIP-480), which fills batches instead of spreading records thinly.
"""

from __future__ import annotations

import random
import struct

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2: a signed 32-bit hash of ``data``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n_words = length // 4
    for k in struct.unpack_from(f"<{n_words}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    base = n_words * 4
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Per-topic sticky choice for unkeyed records (KIP-480)."""

    __slots__ = ("_current", "_rng")

    def __init__(self, rng: random.Random | None = None) -> None:
        self._current: dict[str, int] = {}
        self._rng = rng or random.Random()

    def partition(self, topic: str, num_partitions: int) -> int:
        p = self._current.get(topic)
        if p is None or p >= num_partitions:
            p = self._rng.randrange(num_partitions)
            self._current[topic] = p
        return p

    def among(self, topic: str, candidates: list[int], previous: int = -1) -> int:
        """Stick to one of ``candidates`` (the partitions that have a leader), other than
        ``previous`` (the partition whose batch just closed) while there is another."""
        if previous in candidates and len(candidates) > 1:
            candidates = [c for c in candidates if c != previous]
        p = candidates[self._rng.randrange(len(candidates))]
        self._current[topic] = p
        return p

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> int:
        """The batch for ``previous`` was closed: stick to a different partition now."""
        if num_partitions <= 1:
            p = 0
        else:
            p = self._rng.randrange(num_partitions - 1)
            if p >= previous:
                p += 1
        self._current[topic] = p
        return p
