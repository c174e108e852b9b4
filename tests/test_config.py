"""The shared config loader: typed defaults, TOML, --set overrides, unknown keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from rillet.client.runtime.config import (
    ConfigTable,
    Key,
    merge_tables,
    node_keys,
    parse_listeners,
    parse_voters,
)
from rillet.client.wire.errors import InvalidConfigError

TABLE = ConfigTable(
    [
        Key("node.id", int, 1, "Node id."),
        Key("log.dirs", list, ["/tmp/rillet"], "Data directories."),
        Key("log.segment.bytes", int, 64 << 20, "Segment size."),
        Key("unclean.leader.election.enable", bool, False, "Allow unclean elections."),
        Key("broker.rack", str, None, "Rack."),
        Key("replica.lag.factor", float, 1.5, "A float."),
    ]
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = TABLE.load()
    assert config["node.id"] == 1 and config["broker.rack"] is None
    assert dict(config)["log.segment.bytes"] == 64 << 20


def test_toml_flat_and_nested_then_overrides_win(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '"node.id" = 3\nlog.dirs = ["/a", "/b"]\n[log.segment]\nbytes = 1024\n'
        "[replica.lag]\nfactor = 2\n",
    )
    config = TABLE.load(
        path,
        ["node.id=7", "unclean.leader.election.enable=true", "broker.rack = r1", "log.dirs=/x,/y"],
    )
    assert config["node.id"] == 7
    assert config["log.segment.bytes"] == 1024
    assert config["unclean.leader.election.enable"] is True
    assert config["broker.rack"] == "r1"
    assert config["log.dirs"] == ["/x", "/y"]
    assert config["replica.lag.factor"] == 2.0


def test_unknown_key_in_file_is_an_error_with_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path, '"log.segment.byte" = 5\n')
    with pytest.raises(
        InvalidConfigError,
        match=r"unknown key log.segment.byte \(did you mean log.segment.bytes\?\)",
    ):  # noqa: E501
        TABLE.load(path)


def test_unknown_override_without_a_close_match() -> None:
    with pytest.raises(InvalidConfigError, match=r"--set: unknown key zzz$"):
        TABLE.load(None, ["zzz=1"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("node.id=abc", "node.id: invalid literal"),
        ("unclean.leader.election.enable=maybe", "expected true or false"),
        ("node.id", "expects key=value"),
    ],
)
def test_bad_overrides(override: str, message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        TABLE.load(None, [override])


def test_wrong_type_in_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="node.id must be int"):
        TABLE.load(write(tmp_path, '"node.id" = "one"\n'))
    with pytest.raises(InvalidConfigError, match="unclean.leader.election.enable must be bool"):
        TABLE.load(write(tmp_path, '"unclean.leader.election.enable" = 1\n'))


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError):
        TABLE.load(write(tmp_path, "node.id = = 1\n"))
    with pytest.raises(InvalidConfigError):
        TABLE.load(tmp_path / "absent.toml")


def test_tables_combine_and_refuse_duplicates() -> None:
    node = node_keys("broker")
    combined = node + ConfigTable([Key("broker.rack", str, None, "Rack.")])
    assert {"node.id", "broker.rack"} <= set(combined.keys)
    with pytest.raises(ValueError, match="declared twice"):
        node + node  # noqa: B018


def test_merge_takes_the_first_declaration_of_a_shared_key() -> None:
    merged = merge_tables(node_keys("broker"), node_keys("controller"))
    assert merged.keys["process.roles"].default == "broker"


def test_listeners_and_voters_parse_as_the_contract_says() -> None:
    assert parse_listeners("BROKER://:9092, controller://[::1]:0") == {
        "BROKER": ("0.0.0.0", 9092),
        "CONTROLLER": ("::1", 0),
    }
    assert parse_voters("1@a:1,2@b:2") == {1: ("a", 1), 2: ("b", 2)}
    for bad in ("127.0.0.1:9092", "BROKER://host", "BROKER://host:x"):
        with pytest.raises(InvalidConfigError):
            parse_listeners(bad)
    for bad in ("", "x@a:1", "1@:9093", "1@a"):
        with pytest.raises(InvalidConfigError):
            parse_voters(bad)


def test_markdown_lists_every_key() -> None:
    text = TABLE.render_markdown()
    assert text.startswith("| key | type | default | meaning |")
    assert "| `log.segment.bytes` | int | `67108864` | Segment size. |" in text
    assert "| `broker.rack` | str | (none) | Rack. |" in text
