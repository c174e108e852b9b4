"""Configuration for broker and controller processes: a declared key table, a TOML
file (stdlib tomllib) and ``--set key=value`` overrides typed by the table.

Every key has a type, a default and a line of documentation; an unknown key is an error
(with a did-you-mean hint), never silently ignored (docs/design.md, "Processes"). Keys use Kafka's
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

from rillet.client.wire.errors import InvalidConfigError

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

    def load(self, path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
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
            name: self.key(name, str(path)).check(value, str(path)) for name, value in _flatten(raw)
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


# --- the node contract (docs/architecture.md: "Node processes and configuration") ---


def node_keys(default_roles: str) -> ConfigTable:
    """Keys every node has, with ``process.roles`` defaulting to ``default_roles``
    (``rillet broker`` passes "broker", ``rillet controller`` "controller")."""
    return ConfigTable(
        [
            Key("node.id", int, None, "Unique integer id of this node (required)."),
            Key(
                "process.roles",
                str,
                default_roles,
                "`broker`, `controller` or `broker,controller` (combined mode).",
            ),
            Key(
                "listeners",
                str,
                "",
                "Kafka-style listener list, e.g. `BROKER://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093`;"
                " port 0 binds an ephemeral port, an empty host binds every interface. Empty: a "
                "controller listens on its own voter address, a broker on 127.0.0.1:9092.",
            ),
            Key(
                "controller.quorum.voters",
                str,
                "1@127.0.0.1:9093",
                "The controller quorum: `id@host:port` entries separated by commas.",
            ),
            Key("log.level", str, "INFO", "Python logging level; logs go to stderr."),
            Key(
                "broker.heartbeat.interval.ms",
                int,
                500,
                "How often a broker heartbeats to the active controller (Kafka: 2000).",
            ),
            Key("socket.request.max.bytes", int, 100 * 1024 * 1024, "Largest request frame."),
            Key("max.connections", int, 10_000, "Connections accepted at once; more are refused."),
            Key(
                "max.connections.per.ip",
                int,
                1_000,
                "Connections accepted at once from one client address; more are refused.",
            ),
            Key(
                "max.connections.per.ip.overrides",
                str,
                "",
                "Per-address exceptions to `max.connections.per.ip`: `ip:count` entries"
                " separated by commas, e.g. `127.0.0.1:5000`.",
            ),
            Key(
                "connections.max.idle.ms",
                int,
                600_000,
                "Close a connection with no request in flight and no traffic for this long"
                " (clients close theirs after 540000 ms idle, before this can cut them).",
            ),
            Key(
                "socket.request.read.timeout.ms",
                int,
                30_000,
                "A request frame begun must arrive whole within this, or the connection is"
                " closed (a slow or stalled sender holds no buffer forever); the default is"
                " the clients' request timeout, past which the sender has given up anyway.",
            ),
            Key(
                "queued.max.requests.per.connection",
                int,
                100,
                "Requests read but not yet answered on one connection; at the cap the"
                " connection is not read until answers go out (back-pressure, no buffering).",
            ),
            Key(
                "queued.max.request.bytes",
                int,
                256 * 1024 * 1024,
                "Bytes of partly received request frames over all connections: a split frame"
                " above 64 KiB reserves its announced size, and waits unread while it does not"
                " fit (a frame above the whole budget is let in alone).",
            ),
            Key(
                "metrics.port",
                int,
                0,
                "HTTP port of the Prometheus endpoint /metrics, on the host of the node's"
                " inter-broker listener (a controller's: CONTROLLER); 0 disables it, -1"
                " picks a free port (the readiness line says which).",
            ),
            Key(
                "event.loop.stall.warn.ms",
                int,
                200,
                "Log a WARNING, with what the event loop was running, when it is held this"
                ' long (docs/design.md, "Event-loop stalls").',
            ),
        ]
    )


def merge_tables(*tables: ConfigTable) -> ConfigTable:
    """The union of several tables; a key declared twice is taken from the first."""
    keys: dict[str, Key] = {}
    for table in tables:
        for name, key in table.keys.items():
            keys.setdefault(name, key)
    return ConfigTable(keys.values())


def _split_host_port(address: str, what: str, item: str) -> tuple[str, int]:
    host, colon, port = address.strip().rpartition(":")
    if not colon or not port.isdigit():
        raise InvalidConfigError(f"{what}: expected host:port, got {item!r}")
    return host.strip("[]"), int(port)


def parse_listeners(text: str) -> dict[str, tuple[str, int]]:
    """``BROKER://127.0.0.1:9092,CONTROLLER://:9093`` -> {NAME: (host, port)}; an empty
    host means every interface, as in Kafka."""
    out = parse_endpoints(text, "listeners")
    return {name: (host or "0.0.0.0", port) for name, (host, port) in out.items()}


def parse_endpoints(
    text: str, what: str, distinct_ports: bool = True
) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)} as written (the host may be
    empty). Names must differ (one name meaning two addresses is a typo), and so must
    the non-zero ports of sockets to bind; advertised ones may share a port (two hosts
    behind one proxy port)."""
    out: dict[str, tuple[str, int]] = {}
    ports: dict[int, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, address = item.partition("://")
        name = name.strip().upper()
        if not sep or not name:
            raise InvalidConfigError(f"{what}: expected NAME://host:port, got {item!r}")
        host, port = _split_host_port(address, what, item)
        if name in out:
            raise InvalidConfigError(f"{what}: listener name {name} appears twice")
        if distinct_ports and port and port in ports:
            raise InvalidConfigError(f"{what}: {ports[port]} and {name} both use port {port}")
        out[name] = (host, port)
        if port:
            ports[port] = name
    return out


def parse_voters(text: str) -> dict[int, tuple[str, int]]:
    """``1@host:port,2@host:port`` -> {1: (host, port), ...}."""
    out: dict[int, tuple[str, int]] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        node, sep, address = item.partition("@")
        if not sep or not node.strip().isdigit():
            raise InvalidConfigError(
                f"controller.quorum.voters: expected id@host:port, got {item!r}"
            )
        host, port = _split_host_port(address, "controller.quorum.voters", item)
        if not host:
            raise InvalidConfigError(f"controller.quorum.voters: no host in {item!r}")
        out[int(node)] = (host, port)
    if not out:
        raise InvalidConfigError("controller.quorum.voters is empty")
    return out


def format_voters(voters: Mapping[int, tuple[str, int]]) -> str:
    return ",".join(f"{n}@{h}:{p}" for n, (h, p) in sorted(voters.items()))


def require_node_id(config: Mapping[str, Any]) -> int:
    node_id = config["node.id"]
    if node_id is None:
        raise InvalidConfigError("node.id is required")
    return int(node_id)
