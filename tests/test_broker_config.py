"""The broker's config table: the docs table is current, combined mode merges the broker's
and the controller's keys, listeners and roles are checked at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from rillet.broker.cli import load_config
from rillet.broker.config import BrokerConfig, broker_config_table, render_doc_table
from rillet.client.wire.errors import InvalidConfigError

DOC = Path(__file__).parent.parent / "docs" / "broker.md"


def test_docs_table_is_current() -> None:
    assert render_doc_table() in DOC.read_text(), (
        "docs/broker.md is stale: run python -m rillet.broker.config docs/broker.md"
    )


def test_every_key_has_a_doc_line() -> None:
    assert all(key.doc for key in broker_config_table().keys.values())


def test_combined_mode_takes_controller_keys(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        '"node.id" = 1\n"process.roles" = "broker,controller"\n"metadata.log.dir" = "/tmp/x"\n'
    )
    config = load_config(str(path), ["listeners=CONTROLLER://127.0.0.1:0,BROKER://127.0.0.1:0"])
    assert config["metadata.log.dir"] == "/tmp/x"
    assert BrokerConfig.from_config(config).roles == {"broker", "controller"}
    with pytest.raises(InvalidConfigError, match="unknown key metadata.log.dir"):
        load_config(None, ["node.id=1", "metadata.log.dir=/tmp/x"])  # broker-only node


@pytest.mark.parametrize(
    "override, match",
    [
        ("listeners=CONTROLLER://127.0.0.1:1", "BROKER"),
        ("listeners=nonsense", "NAME://host:port"),
        ("process.roles=router", "process.roles"),
        ("message.max.bytes=-1", "message.max.bytes"),
        # The controller refuses to register such an id (-1 is "no leader"): refused at
        # start-up, not by a registration retried forever.
        ("node.id=-1", "node.id must be in 0..2147483647"),
        ("node.id=2147483648", "node.id must be in 0..2147483647"),
        ("offsets.topic.num.partitions=0", "offsets.topic.num.partitions"),
        ("group.consumer.assignors=uniform,magic", "group.consumer.assignors"),
        ("group.consumer.assignors=", "group.consumer.assignors"),
    ],
)
def test_bad_values_fail_start_up(override: str, match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match):
        BrokerConfig.from_config(broker_config_table().load(None, ["node.id=1", override]))


def test_log_defaults_come_from_log_keys() -> None:
    config = broker_config_table().load(
        None,
        [
            "node.id=1",
            "log.segment.bytes=4096",
            "log.flush.interval.messages=1",
            "message.max.bytes=2048",
        ],
    )
    defaults = BrokerConfig.from_config(config).log_defaults
    assert (defaults.segment_bytes, defaults.flush_messages, defaults.max_message_bytes) == (
        4096,
        1,
        2048,
    )
