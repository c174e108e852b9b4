"""Listener configuration (docs/broker.md, "Listeners"): ``listeners``,
``advertised.listeners``, ``listener.security.protocol.map`` and
``inter.broker.listener.name`` with Kafka's names and meanings, refused clearly when
they contradict each other."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rillet.broker.config import BrokerConfig, broker_config_table, combined_config_table
from rillet.client.runtime.config import parse_listeners
from rillet.client.wire.errors import InvalidConfigError
from rillet.tools.local_cluster import ClusterError, LocalCluster

TWO = "listeners=INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:9094"


def config(*overrides: str, combined: bool = False) -> BrokerConfig:
    base = ["node.id=1"] + (["process.roles=broker,controller"] if combined else [])
    table = combined_config_table() if combined else broker_config_table()
    return BrokerConfig.from_config(table.load(None, base + list(overrides)))


def test_a_default_broker_keeps_its_one_broker_listener() -> None:
    cfg = config()
    assert cfg.inter_broker_listener == "BROKER"
    assert cfg.broker_listeners == {"BROKER": ("127.0.0.1", 9092)}
    assert cfg.advertise({"BROKER": 9092}) == [("BROKER", "127.0.0.1", 9092)]


def test_every_listener_is_advertised_explicitly_or_where_bound() -> None:
    cfg = config(
        TWO,
        "advertised.listeners=EXTERNAL://localhost:0",
        "inter.broker.listener.name=internal",
        "listener.security.protocol.map=INTERNAL:PLAINTEXT,EXTERNAL:plaintext",
    )
    assert cfg.inter_broker_listener == "INTERNAL"
    # Port 0, bound or advertised, is the port actually bound.
    assert cfg.advertise({"INTERNAL": 4001, "EXTERNAL": 9094}) == [
        ("INTERNAL", "127.0.0.1", 4001),
        ("EXTERNAL", "localhost", 9094),
    ]
    assert cfg.broker_address == ("127.0.0.1", 0)


def test_an_every_interface_listener_advertises_the_host_name() -> None:
    cfg = config("listeners=BROKER://:9092")
    assert cfg.broker_listeners == {"BROKER": ("0.0.0.0", 9092)}
    assert cfg.advertise({"BROKER": 9092}) == [("BROKER", socket.gethostname(), 9092)]


def test_the_controller_listener_is_not_the_brokers() -> None:
    cfg = config(
        "listeners=CONTROLLER://127.0.0.1:9093,BROKER://127.0.0.1:9092",
        "controller.quorum.voters=1@127.0.0.1:9093",
        combined=True,
    )
    assert list(cfg.broker_listeners) == ["BROKER"]
    assert [e[0] for e in cfg.advertise({"BROKER": 9092})] == ["BROKER"]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["advertised.listeners=OTHER://h:1"], "OTHER is not one of the broker's listeners"),
        (["advertised.listeners=EXTERNAL://0.0.0.0:1"], "must name a host clients can reach"),
        (["advertised.listeners=EXTERNAL://:1"], "must name a host clients can reach"),
        (["advertised.listeners=EXTERNAL://h:1,external://g:2"], "EXTERNAL appears twice"),
        (["advertised.listeners=EXTERNAL"], "NAME://host:port"),
        (["inter.broker.listener.name=OUTSIDE"], "inter.broker.listener.name: OUTSIDE"),
        # The default, BROKER, with no BROKER listener:
        (["inter.broker.listener.name=BROKER"], "BROKER is not one of the broker's listeners"),
        (["listener.security.protocol.map=EXTERNAL:SSL"], "EXTERNAL: security protocol SSL"),
        (["listener.security.protocol.map=EXTERNAL"], "expected NAME:PROTOCOL"),
    ],
)
def test_contradictions_are_refused_at_start_up(overrides: list[str], match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match):
        config(TWO, "inter.broker.listener.name=INTERNAL", *overrides)


def test_a_listener_named_after_a_protocol_speaks_it() -> None:
    with pytest.raises(InvalidConfigError, match="SASL_SSL is not supported"):
        config("listeners=SASL_SSL://127.0.0.1:9092", "inter.broker.listener.name=SASL_SSL")
    cfg = config("listeners=PLAINTEXT://127.0.0.1:9092", "inter.broker.listener.name=PLAINTEXT")
    assert cfg.inter_broker_listener == "PLAINTEXT"


@pytest.mark.parametrize(
    "text, match",
    [
        ("A://h:1,a://h:2", "listener name A appears twice"),
        ("A://h:1,B://g:1", "A and B both use port 1"),
    ],
)
def test_listener_names_and_ports_differ(text: str, match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match):
        parse_listeners(text)
    # Ephemeral ports never collide.
    assert parse_listeners("A://h:0,B://h:0") == {"A": ("h", 0), "B": ("h", 0)}


def test_a_local_cluster_names_every_broker_listener(tmp_path: Path) -> None:
    """LocalCluster's ``listeners``: the first binds the broker's port and is the tool's
    own; the others bind ephemeral ports; the names survive a reload of the state."""
    cluster = LocalCluster(
        tmp_path / "c", controllers=1, brokers=1, combined=True, listeners=("inside", "OUTSIDE")
    )
    config = cluster.config_for(cluster.nodes[1])
    node = cluster.nodes[1]
    assert config["listeners"] == (
        f"CONTROLLER://127.0.0.1:{node.controller_port},"
        f"INSIDE://127.0.0.1:{node.broker_port},OUTSIDE://127.0.0.1:0"
    )
    assert cluster.broker_listener == "INSIDE"
    cluster.save()
    assert LocalCluster.load(tmp_path / "c").broker_listener == "INSIDE"
    with pytest.raises(ClusterError, match="distinct names"):
        LocalCluster(tmp_path / "d", controllers=1, brokers=1, listeners=("A", "a"))
