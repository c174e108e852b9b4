"""Configuration for broker and controller processes: a declared key table, a TOML
file (stdlib tomllib) and ``--set key=value`` overrides typed by the table.

Every key has a type, a default and a line of documentation; an unknown key is an error
(with a did-you-mean hint), never silently ignored (DESIGN section 1). Keys use Kafka's
dotted names where Kafka has the setting. A TOML file may write them flat
(``"log.segment.bytes" = 1024``) or nested (``[log.segment] bytes = 1024``).
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rillet.client.errors import InvalidConfigError

_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key. ``type`` is int, float, str, bool or list (of str)."""

    name: str
    type: type
    default: Any
    doc: str

    def parse(self, text: str) -> Any:
        """A ``--set`` value from the command line, typed by this key."""
        try:
            if self.type is bool:
                return _parse_bool(text)
            if self.type is list:
                return [part.strip() for part in text.split(",") if part.strip()]
            return self.type(text)
        except ValueError as e:
            raise InvalidConfigError(f"{self.name}: {e}") from None

    def check(self, value: Any, source: str) -> Any:
        """A value from TOML (already typed): the right type, ints accepted as floats."""
        if self.type is float and type(value) is int:
            return float(value)
        if type(value) is not self.type or (
            self.type is list and not all(isinstance(v, str) for v in value)
        ):
            raise InvalidConfigError(
                f"{source}: {self.name} must be {self.type.__name__}, got {value!r}"
            )
        return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


class ConfigTable:
    """The declared keys of one process kind; ``load`` turns sources into a Config."""

    def __init__(self, keys: Iterable[Key]) -> None:
        self.keys: dict[str, Key] = {}
        for key in keys:
            if key.name in self.keys:
                raise ValueError(f"config key {key.name} declared twice")
            if key.default is not None:
                key.check(key.default, "default")
            self.keys[key.name] = key

    def __add__(self, other: ConfigTable) -> ConfigTable:
        return ConfigTable([*self.keys.values(), *other.keys.values()])

    def key(self, name: str, source: str = "config") -> Key:
        try:
            return self.keys[name]
        except KeyError:
            close = difflib.get_close_matches(name, self.keys, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise InvalidConfigError(f"{source}: unknown key {name}{hint}") from None

    def load(
        self, path: str | Path | None = None, overrides: Sequence[str] = ()
    ) -> Config:
        """Defaults, then the TOML file, then ``key=value`` overrides, in that order."""
        values = {name: key.default for name, key in self.keys.items()}
        if path is not None:
            values.update(self.from_toml(Path(path)))
        for item in overrides:
            name, value = self.parse_override(item)
            values[name] = value
        return Config(values)

    def from_toml(self, path: Path) -> dict[str, Any]:
        try:
            with path.open("rb") as f:
                raw = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidConfigError(f"{path}: {e}") from None
        return {
            name: self.key(name, str(path)).check(value, str(path))
            for name, value in _flatten(raw)
        }

    def parse_override(self, item: str) -> tuple[str, Any]:
        name, sep, text = item.partition("=")
        if not sep:
            raise InvalidConfigError(f"--set expects key=value, got {item!r}")
        key = self.key(name.strip(), "--set")
        return key.name, key.parse(text.strip())

    def render_markdown(self) -> str:
        """The key table for docs: name, type, default, meaning."""
        rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key in sorted(self.keys.values(), key=lambda k: k.name):
            default = "(none)" if key.default is None else f"`{key.default!r}`"
            rows.append(f"| `{key.name}` | {key.type.__name__} | {default} | {key.doc} |")
        return "\n".join(rows) + "\n"


def _flatten(raw: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """TOML tables to dotted names: ``{"log": {"dirs": x}}`` -> ``("log.dirs", x)``."""
    for name, value in raw.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, dict):
            yield from _flatten(value, dotted + ".")
        else:
            yield dotted, value


class Config(Mapping[str, Any]):
    """Loaded values, read-only: ``config["node.id"]``."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = dict(values)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Config({self._values!r})"


# Keys every node has (DESIGN section 1); brokers and controllers add their own tables,
# e.g. ``NODE_KEYS + BROKER_KEYS``.
NODE_KEYS = ConfigTable(
    [
        Key("node.id", int, 1, "Unique integer id of this node."),
        Key("process.roles", str, "broker,controller", "broker, controller or both."),
        Key("listeners.host", str, "127.0.0.1", "Address the RPC listener binds."),
        Key("socket.request.max.bytes", int, 100 * 1024 * 1024, "Largest request frame."),
        Key("max.connections", int, 10_000, "Connections accepted at once; more are refused."),
        Key("metrics.port", int, 0, "HTTP port for /metrics and status; 0 disables it."),
    ]
)
