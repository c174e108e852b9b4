"""Per-log settings under Kafka's names, each with a documented default.

``LogConfig.from_dict({"segment.bytes": 1 << 20})`` accepts Kafka's dotted names (values
may be ints or the strings a TOML file or ``--set k=v`` gives); an unknown key or a bad
value raises InvalidConfigError naming it, so a typo fails at start-up, not silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rillet.client.wire.errors import InvalidConfigError

DAY_MS = 24 * 3600 * 1000

CLEANUP_POLICIES = ("delete", "compact", "compact,delete")


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one partition log. Python names; Kafka names in ``KAFKA_NAMES``."""

    segment_bytes: int = 64 * 1024 * 1024  # Kafka: 1 GiB; smaller rolls keep retention fine
    segment_ms: int = 7 * DAY_MS
    index_interval_bytes: int = 4096
    flush_messages: int | None = None  # None: never force fsync by count (Kafka: Long.MAX)
    flush_ms: int | None = None  # None: never force fsync by age
    retention_ms: int = 7 * DAY_MS  # -1: keep forever
    retention_bytes: int = -1  # -1: unlimited
    cleanup_policy: str = "delete"  # "delete", "compact" or "compact,delete"
    delete_retention_ms: int = DAY_MS  # how long compaction keeps tombstones
    max_message_bytes: int = 1024 * 1024 + 12  # per batch, as Kafka's 1048588
    min_compaction_lag_ms: int = 0
    file_delete_delay_ms: int = 60_000  # retired segment files outlive in-flight reads
    # The remote (S3) tier: closed segments are copied there by the partition leader, and
    # a local segment is deleted only once it is remote and past local retention
    # (storage/retention.py); retention.ms / retention.bytes then bound the whole log.
    remote_storage_enable: bool = False
    local_retention_ms: int = -2  # -2: same as retention.ms
    local_retention_bytes: int = -2  # -2: same as retention.bytes

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def tiered(self) -> bool:
        """Whether this log's closed segments go to the remote tier: remote storage on
        and no compaction (a remote segment is never rewritten). The controller refuses
        compacted tiered topics by the built-in defaults; a broker's own
        log.cleanup.policy can still make the effective config compacted, and such a
        log is then kept, and retained, as an untiered one."""
        return self.remote_storage_enable and not self.compact

    @property
    def effective_local_retention_ms(self) -> int:
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        if self.local_retention_bytes == -2:
            return self.retention_bytes
        return self.local_retention_bytes

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any], base: LogConfig | None = None) -> LogConfig:
        """Build from Kafka-named keys, on top of ``base`` (defaults when None)."""
        changes: dict[str, Any] = {}
        for key, raw in settings.items():
            field = KAFKA_NAMES.get(key)
            if field is None:
                known = ", ".join(sorted(KAFKA_NAMES))
                raise InvalidConfigError(f"unknown log config key {key!r}; known keys: {known}")
            changes[field] = _parse(key, field, raw)
        config = dataclasses.replace(base or cls(), **changes)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, f) for k, f in KAFKA_NAMES.items()}

    def validate(self) -> None:
        _at_least("segment.bytes", self.segment_bytes, 1024)
        _at_least("segment.ms", self.segment_ms, 1)
        _at_least("index.interval.bytes", self.index_interval_bytes, 0)
        _at_least("max.message.bytes", self.max_message_bytes, 0)
        _at_least("delete.retention.ms", self.delete_retention_ms, 0)
        _at_least("min.compaction.lag.ms", self.min_compaction_lag_ms, 0)
        _at_least("file.delete.delay.ms", self.file_delete_delay_ms, 0)
        _at_least("retention.ms", self.retention_ms, -1)
        _at_least("retention.bytes", self.retention_bytes, -1)
        _at_least("local.retention.ms", self.local_retention_ms, -2)
        _at_least("local.retention.bytes", self.local_retention_bytes, -2)
        if self.flush_messages is not None:
            _at_least("flush.messages", self.flush_messages, 1)
        if self.flush_ms is not None:
            _at_least("flush.ms", self.flush_ms, 0)
        if self.cleanup_policy not in CLEANUP_POLICIES:
            raise InvalidConfigError(
                f"cleanup.policy must be one of {', '.join(CLEANUP_POLICIES)}, "
                f"not {self.cleanup_policy!r}"
            )


KAFKA_NAMES: dict[str, str] = {
    f.name.replace("_", "."): f.name for f in dataclasses.fields(LogConfig)
}


def _parse(key: str, field: str, raw: Any) -> Any:
    if field == "cleanup_policy":
        parts = sorted(p.strip() for p in str(raw).split(",") if p.strip())
        return ",".join(parts)
    if raw is None and field in ("flush_messages", "flush_ms"):
        return None
    if field in _BOOL_FIELDS:
        return _parse_bool(key, raw)
    if isinstance(raw, bool):
        raise InvalidConfigError(f"{key} must be an integer, not {raw!r}")
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{key} must be an integer, not {raw!r}") from None


_BOOL_FIELDS = frozenset(f.name for f in dataclasses.fields(LogConfig) if f.type in ("bool", bool))


def _parse_bool(key: str, raw: Any) -> bool:
    """A bool, or the strings topic configs travel as ("true"/"false", any case)."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower() if isinstance(raw, str) else None
    if text not in ("true", "false"):
        raise InvalidConfigError(f"{key} must be true or false, not {raw!r}")
    return text == "true"


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise InvalidConfigError(f"{key} must be >= {low}, not {value}")
