"""Which `__consumer_offsets` partition holds a group: Kafka's rule, bit for bit.

Kafka places a group on partition ``abs(groupId.hashCode()) % partitions``, with Java's
``String.hashCode`` and Kafka's ``Utils.abs`` (which maps Integer.MIN_VALUE to 0). A
Kafka client or tool that computes the partition of a group therefore agrees with us.
"""

from __future__ import annotations

INT_MIN = -(2**31)


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code
    units, in 32-bit two's complement."""
    data = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """The offsets partition of ``group_id`` (Kafka: ``Utils.abs(hash) % partitions``)."""
    h = java_string_hash(group_id)
    return (0 if h == INT_MIN else abs(h)) % partitions
