"""docker-compose.yml cannot run here (no Docker engine), so check what can be checked:
every node's command line is a config its own role accepts, and the quorum, listeners
and ids agree with each other."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rillet.broker.config import BrokerConfig, broker_config_table
from rillet.client.runtime.config import parse_listeners, parse_voters
from rillet.controller.config import controller_config_table

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def node_config(service: dict):  # noqa: ANN201
    command = service["command"]
    role, args = command[0], command[1:]
    overrides = [args[i + 1] for i in range(0, len(args), 2) if args[i] == "--set"]
    assert len(overrides) * 2 == len(args), f"only --set pairs expected: {args}"
    table = broker_config_table() if role == "broker" else controller_config_table()
    return role, table.load(None, overrides)


@pytest.mark.parametrize(
    "name",
    [
        n
        for n, s in services().items()
        if "command" in s and s["command"][0] in ("broker", "controller")
    ],
)
def test_every_node_command_is_a_valid_config(name: str) -> None:
    role, config = node_config(services()[name])
    listeners = parse_listeners(config["listeners"])
    hostname = services()[name]["hostname"]
    if role == "controller":
        assert set(listeners) == {"CONTROLLER"}
        assert listeners["CONTROLLER"][0] == hostname
        return
    # A broker: INTERNAL on its service name between brokers, EXTERNAL for the host.
    broker = BrokerConfig.from_config(config)
    assert set(listeners) == {"INTERNAL", "EXTERNAL"}
    assert broker.inter_broker_listener == "INTERNAL"
    assert broker.advertised["INTERNAL"] == (hostname, 9092) == listeners["INTERNAL"]
    published = {
        (host, int(host_port)): int(container_port)
        for host, host_port, container_port in (p.split(":") for p in services()[name]["ports"])
    }
    # The EXTERNAL address advertised is a host port published to EXTERNAL's port.
    assert published[broker.advertised["EXTERNAL"]] == listeners["EXTERNAL"][1]


def test_brokers_advertise_distinct_host_ports() -> None:
    external = [
        BrokerConfig.from_config(node_config(s)[1]).advertised["EXTERNAL"]
        for s in services().values()
        if s.get("command", [""])[0] == "broker"
    ]
    assert len(set(external)) == len(external) == 3


def test_quorum_voters_are_the_controller_services() -> None:
    nodes = [
        node_config(s)
        for s in services().values()
        if s.get("command", [""])[0] in ("broker", "controller")
    ]
    voter_sets = {config["controller.quorum.voters"] for _, config in nodes}
    assert len(voter_sets) == 1
    voters = parse_voters(voter_sets.pop())
    controllers = {
        c["node.id"]: parse_listeners(c["listeners"])["CONTROLLER"]
        for role, c in nodes
        if role == "controller"
    }
    assert voters == controllers
    ids = [c["node.id"] for _, c in nodes]
    assert len(ids) == len(set(ids)) == 6


def test_client_bootstrap_names_every_broker() -> None:
    bootstrap = services()["client"]["environment"]["RILLET_BOOTSTRAP"].split(",")
    brokers = {
        f"{s['hostname']}:9092"
        for s in services().values()
        if s.get("command", [""])[0] == "broker"
    }
    assert set(bootstrap) == brokers


def test_image_build_copies_every_source_folder_the_package_maps() -> None:
    # The compose file builds its image from the Dockerfile; a folder pyproject maps to a
    # package but the build stage does not copy fails `pip wheel .` (tools/ once did).
    import re
    import tomllib

    root = COMPOSE.parent
    stages = re.split(r"^FROM ", (root / "Dockerfile").read_text(), flags=re.M)
    (build_stage,) = [s for s in stages if " AS build" in s.split("\n")[0]]
    copied = {
        src.rstrip("/")
        for line in re.findall(r"^COPY (?!--from)(.+)$", build_stage, re.M)
        for src in line.split()[:-1]
    }
    package_dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(package_dirs["package-dir"].values()) <= copied
    assert {"pyproject.toml", "setup.py", "README.md"} <= copied
