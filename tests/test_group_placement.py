"""A group's offsets partition is computed exactly as Kafka computes it."""

from __future__ import annotations

from rillet.broker.group.placement import java_string_hash, partition_for


def test_java_string_hash_matches_known_java_values() -> None:
    # Values printed by Java's "...".hashCode().
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Hello World") == -862545276
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -(2**31)
    # Outside the BMP Java hashes the two UTF-16 surrogates.
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00


def test_partition_for_uses_kafkas_abs() -> None:
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("Hello World", 50) == 862545276 % 50
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 (Math.abs would stay negative).
    assert partition_for("polygenelubricants", 7) == 0
    assert all(0 <= partition_for(f"g{i}", 3) < 3 for i in range(100))
