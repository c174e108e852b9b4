"""The controller's config table: documented, parsed, mergeable with a broker's."""

from __future__ import annotations

from pathlib import Path

import pytest

from rillet.client.runtime.config import ConfigTable, Key
from rillet.client.wire.errors import InvalidConfigError
from rillet.controller.config import (
    CONFIG_TABLE_BEGIN,
    CONFIG_TABLE_END,
    CONTROLLER_KEYS,
    controller_config_table,
    node_keys,
    parse_listeners,
    parse_voters,
)

DOC = Path(__file__).parents[1] / "docs" / "controller.md"


def test_docs_key_table_is_generated_from_the_config_table() -> None:
    text = DOC.read_text()
    table = text.split(CONFIG_TABLE_BEGIN, 1)[1].split(CONFIG_TABLE_END, 1)[0]
    assert table.strip() == controller_config_table().render_markdown().strip(), (
        "docs/controller.md is stale: run `python -m rillet.controller.config`"
    )


def test_defaults_and_overrides() -> None:
    config = controller_config_table().load(None, ["node.id=3", "quorum.election.timeout.ms=500"])
    assert config["process.roles"] == "controller"
    assert config["quorum.election.timeout.ms"] == 500
    assert config["broker.session.timeout.ms"] == 3000
    with pytest.raises(InvalidConfigError, match="did you mean"):
        controller_config_table().load(None, ["quorum.election.timeout=5"])


def test_a_combined_node_merges_without_duplicates() -> None:
    broker_keys = ConfigTable([Key("log.dirs", str, "/tmp/x", "Partition logs.")])
    combined = node_keys("broker,controller") + CONTROLLER_KEYS + broker_keys
    assert combined.load()["process.roles"] == "broker,controller"


def test_listener_and_voter_syntax() -> None:
    assert parse_listeners("CONTROLLER://127.0.0.1:9093, broker://[::1]:0") == {
        "CONTROLLER": ("127.0.0.1", 9093),
        "BROKER": ("::1", 0),
    }
    assert parse_voters("1@a:1,2@b:2") == {1: ("a", 1), 2: ("b", 2)}
    for bad in ("x@a:1", "1a:1", "", "1@a"):
        with pytest.raises(InvalidConfigError):
            parse_voters(bad)
    with pytest.raises(InvalidConfigError):
        parse_listeners("127.0.0.1:9093")
