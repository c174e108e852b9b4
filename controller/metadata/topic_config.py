"""The topic config keys the controller accepts, their types, defaults and validation.

Values travel and are stored as strings (as Kafka's are); ``validate_topic_config``
turns a request's values into their canonical string form or names the bad key, and
``effective_topic_config`` gives a topic's typed values with defaults filled in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    kind: str  # "long", "int", "bool", "policy"
    default: Any
    minimum: int | None = None
    doc: str = ""


TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef("cleanup.policy", "policy", "delete", doc="delete, compact, or both"),
        ConfigDef("retention.ms", "long", 7 * 24 * 3600 * 1000, -1, "-1: keep forever"),
        ConfigDef("retention.bytes", "long", -1, -1, "per partition; -1: unlimited"),
        ConfigDef("segment.bytes", "int", 64 * 1024 * 1024, 1024, "roll the active segment"),
        ConfigDef("segment.ms", "long", 7 * 24 * 3600 * 1000, 1, "roll the active segment"),
        ConfigDef("min.insync.replicas", "int", 1, 1, "acks=all needs this many in sync"),
        ConfigDef("max.message.bytes", "int", 1024 * 1024, 0, "largest batch accepted"),
        ConfigDef("unclean.leader.election.enable", "bool", False, doc="elect outside the ISR"),
        ConfigDef("delete.retention.ms", "long", 24 * 3600 * 1000, 0, "tombstone lifetime"),
        ConfigDef("remote.storage.enable", "bool", False, doc="tier closed segments to S3"),
        ConfigDef("local.retention.ms", "long", -2, -2, "-2: same as retention.ms"),
        ConfigDef("local.retention.bytes", "long", -2, -2, "-2: same as retention.bytes"),
        ConfigDef("flush.messages", "long", LONG_MAX, 1, "fsync every N messages"),
        ConfigDef("flush.ms", "long", LONG_MAX, 0, "fsync every N ms"),
        ConfigDef("min.compaction.lag.ms", "long", 0, 0, "records younger stay uncompacted"),
    )
}

_POLICIES = {"delete", "compact"}

# The broker keys whose value is a topic key's default on every broker (``log.*``, as in
# Kafka). The controller reads the same keys from its own config so the defaults it
# validates against and computes APPEND/SUBTRACT from are the ones brokers apply (rule:
# docs/controller.md, "Topic defaults"); a combined node reads them from one file.
BROKER_DEFAULT_KEYS: dict[str, str] = {
    "log.cleanup.policy": "cleanup.policy",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
}


def _parse_int(d: ConfigDef, raw: str) -> int:
    value = int(raw.strip())
    limit = INT_MAX if d.kind == "int" else LONG_MAX
    if value > limit or (d.minimum is not None and value < d.minimum):
        raise ValueError(f"{d.name}={raw} is outside [{d.minimum}, {limit}]")
    return value


def _parse_bool(d: ConfigDef, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"{d.name} must be true or false, not {raw!r}")
    return lowered == "true"


def _parse_policy(d: ConfigDef, raw: str) -> str:
    parts = sorted({p.strip() for p in raw.split(",")})
    if not parts or not set(parts) <= _POLICIES:
        raise ValueError(f"{d.name} must be delete, compact or both, not {raw!r}")
    return ",".join(sorted(parts, key=["delete", "compact"].index))


_PARSERS: dict[str, Callable[[ConfigDef, str], Any]] = {
    "long": _parse_int,
    "int": _parse_int,
    "bool": _parse_bool,
    "policy": _parse_policy,
}


def parse_value(key: str, raw: str) -> Any:
    """The typed value of one key; ValueError (KeyError for an unknown key) when invalid."""
    d = TOPIC_CONFIGS[key]
    return _PARSERS[d.kind](d, raw)


def canonical(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def validate_topic_config(configs: Mapping[str, Any]) -> tuple[dict[str, str], str | None]:
    """(canonical string values, error message or None). Accepts str, int or bool values."""
    out: dict[str, str] = {}
    for key, raw in configs.items():
        if key not in TOPIC_CONFIGS:
            return {}, f"unknown topic config {key!r}"
        text = canonical(key, raw) if isinstance(raw, bool | int) else raw
        if not isinstance(text, str):
            return {}, f"{key}: value must be a string, not {type(raw).__name__}"
        try:
            out[key] = canonical(key, parse_value(key, text))
        except ValueError as exc:
            return {}, f"{key}: {exc}"
    return out, None


def topic_defaults_of(settings: Mapping[str, Any]) -> dict[str, str]:
    """The topic defaults a node's ``log.*`` settings give (canonical strings; unset
    keys are left out: their built-in default applies). Raises ValueError if invalid."""
    out = {}
    for broker_key, key in BROKER_DEFAULT_KEYS.items():
        value = settings.get(broker_key)
        if value is not None:
            text = canonical(key, value) if isinstance(value, bool | int) else str(value)
            try:
                out[key] = canonical(key, parse_value(key, text))
            except ValueError as e:
                raise ValueError(f"{broker_key}: {e}") from None
    return out


def effective_topic_config(
    overrides: Mapping[str, str], defaults: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Typed values of every key: the topic's overrides on top of ``defaults`` (the
    cluster's ``log.*`` ones), on top of the built-in defaults."""
    out = {k: d.default for k, d in TOPIC_CONFIGS.items()}
    for key, raw in {**(defaults or {}), **overrides}.items():
        if key in TOPIC_CONFIGS:
            out[key] = parse_value(key, raw)
    return out


def tiering_error(
    before: Mapping[str, str] | None,
    after: Mapping[str, str],
    defaults: Mapping[str, str] | None = None,
) -> str | None:
    """Why a topic's overrides ``after`` break KIP-405's rules for tiered topics, given
    those it had ``before`` (None: the topic is being created) and the cluster's topic
    ``defaults`` that fill the keys it does not set; None when they hold.

    - A compacted topic cannot be tiered: a remote segment is immutable, so compaction
      could never reach it, and its keys' latest values would be spread over both tiers.
    - Tiering cannot be turned off (nor its key deleted) once on: the remote segments
      would be orphaned, and the local log would no longer be bounded by what is remote.
    - Local retention must not outlast total retention: data cannot stay on local disk
      longer than it is kept at all (-2: the same as the total setting).
    - No unclean leader election: a leader from outside the ISR may lack records the
      remote log holds, or hold others at the same offsets; telling them apart needs
      remote segments indexed by leader epoch, which rillet's are not."""
    cfg = effective_topic_config(after, defaults)
    tiered = cfg["remote.storage.enable"]
    was_tiered = (
        before is not None and effective_topic_config(before, defaults)["remote.storage.enable"]
    )
    if was_tiered and not tiered:
        return (
            "remote.storage.enable cannot be turned off once on: the topic's remote "
            "segments would be orphaned and its local log no longer bounded by what is "
            "remote; keep the topic tiered, or delete it"
        )
    if not tiered:
        return None
    if "compact" in cfg["cleanup.policy"].split(","):
        return (
            f"remote.storage.enable=true needs cleanup.policy=delete, not "
            f"{cfg['cleanup.policy']!r}: compacted topics cannot be tiered"
        )
    if cfg["unclean.leader.election.enable"]:
        return (
            "remote.storage.enable=true needs unclean.leader.election.enable=false: a "
            "leader elected from outside the ISR can lose records the remote log holds, "
            "and reconciling them needs remote segments indexed by leader epoch, which "
            "rillet does not do"
        )
    for unit in ("ms", "bytes"):
        total, local = cfg[f"retention.{unit}"], cfg[f"local.retention.{unit}"]
        if total != -1 and local != -2 and (local == -1 or local > total):
            return (
                f"local.retention.{unit}={local} must be -2 or at most "
                f"retention.{unit}={total}: nothing stays local longer than it is kept"
            )
    return None


def unclean_election_enabled(overrides: Mapping[str, str]) -> bool:
    raw = overrides.get("unclean.leader.election.enable")
    return raw is not None and raw.strip().lower() == "true"


# IncrementalAlterConfigs operations (Kafka's AlterConfigOp types).
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_LIST_KINDS = {"policy"}  # the keys whose value is a comma-separated list


class ConfigOpError(ValueError):
    """An operation that cannot apply: ``invalid_request`` tells a malformed request
    (INVALID_REQUEST) from a bad key or value (INVALID_CONFIG)."""

    def __init__(self, message: str, invalid_request: bool) -> None:
        super().__init__(message)
        self.invalid_request = invalid_request


def incremental_changes(
    overrides: Mapping[str, str],
    ops: list[tuple[str, int, str | None]],
    defaults: Mapping[str, str] | None = None,
) -> dict[str, str | None]:
    """A topic's ``(name, operation, value)`` list as changes for the controller: a value
    sets a key, None deletes it (back to the default). APPEND and SUBTRACT work on the
    key's current list (its override, else the cluster's default from ``defaults``, else
    the built-in one: the value brokers apply) and only on list keys; a key named twice
    is refused, as Kafka does. Raises ConfigOpError."""
    changes: dict[str, str | None] = {}
    for name, op, value in ops:
        if name in changes:
            raise ConfigOpError(f"{name} is named twice", invalid_request=True)
        if op == OP_DELETE:
            changes[name] = None
            continue
        if op not in (OP_SET, OP_APPEND, OP_SUBTRACT):
            raise ConfigOpError(f"{name}: unknown operation {op}", invalid_request=True)
        if value is None:
            raise ConfigOpError(f"{name}: a null value is only for DELETE", invalid_request=True)
        if op == OP_SET:
            changes[name] = value
            continue
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise ConfigOpError(f"unknown topic config {name!r}", invalid_request=False)
        if d.kind not in _LIST_KINDS:
            raise ConfigOpError(f"{name} is not a list: APPEND and SUBTRACT do not apply", True)
        current = overrides.get(name) or (defaults or {}).get(name) or canonical(name, d.default)
        current = current.split(",")
        given = [v.strip() for v in value.split(",") if v.strip()]
        if op == OP_APPEND:
            listed = current + [v for v in given if v not in current]
        else:
            listed = [v for v in current if v not in given]
        changes[name] = ",".join(listed)
    return changes
