"""docker-compose.yml checked without a container engine (tests/test_compose_podman.py
starts it for real under podman, in `make compose-test`): the file is valid against the
compose-spec schema, every node's command line is a config its own role accepts, and
the quorum, listeners, published ports and ids agree with each other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rillet.broker.config import BrokerConfig, broker_config_table
from rillet.client.runtime.config import parse_listeners, parse_voters
from rillet.controller.config import controller_config_table

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def node_config(service: dict):  # noqa: ANN201
    """(role, config) as the node would load it: its --config file (bind-mounted from
    the repository) under its --set overrides."""
    command = service["command"]
    role, args = command[0], command[1:]
    mounts = {
        v["target"]: ROOT / v["source"] for v in service.get("volumes", []) if isinstance(v, dict)
    }
    path, overrides = None, []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag == "--config":
            path = mounts[value]  # a config file the container does not have fails here
        else:
            assert flag == "--set", f"only --config and --set expected: {args}"
            overrides.append(value)
    table = broker_config_table() if role == "broker" else controller_config_table()
    return role, table.load(path, overrides)


def node_services() -> dict[str, dict]:
    return {
        n: s
        for n, s in services().items()
        if "command" in s and s["command"][0] in ("broker", "controller")
    }


def test_compose_file_follows_the_compose_spec() -> None:
    # check-jsonschema ships the compose-spec schema (vendor.compose-spec).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_nothing_waits_on_a_healthcheck() -> None:
    # podman-compose runs no healthchecks, so a condition on one would never be met.
    for name, service in services().items():
        depends = service.get("depends_on", [])
        assert isinstance(depends, list), f"{name}: depends_on conditions are not run"


@pytest.mark.parametrize("name", list(node_services()))
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
    assert config["broker.rack"], "rack-aware placement wants every broker's rack"
    # The remote tier is the compose file's own S3 service.
    assert config["remote.log.storage.system.enable"]
    s3 = services()["s3"]
    assert config["remote.log.storage.s3.endpoint.url"] == f"http://s3:{s3['command'][3]}"


def test_brokers_advertise_distinct_host_ports() -> None:
    external = [
        BrokerConfig.from_config(node_config(s)[1]).advertised["EXTERNAL"]
        for s in services().values()
        if s.get("command", [""])[0] == "broker"
    ]
    assert len(set(external)) == len(external) == 3
    # The CLI's default bootstrap (127.0.0.1:9092) is one of them: `rillet ...` on the
    # host needs no --bootstrap.
    assert ("127.0.0.1", 9092) in external


def test_quorum_voters_are_the_controller_services() -> None:
    nodes = [node_config(s) for s in node_services().values()]
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


@pytest.mark.parametrize("name", ["client", "console", "init", "spark"])
def test_in_network_clients_bootstrap_from_every_broker(name: str) -> None:
    bootstrap = services()[name]["environment"]["RILLET_BOOTSTRAP"].split(",")
    brokers = {
        f"{s['hostname']}:9092"
        for s in services().values()
        if s.get("command", [""])[0] == "broker"
    }
    assert set(bootstrap) == brokers


def test_prometheus_scrapes_every_node() -> None:
    config = yaml.safe_load((ROOT / "containers" / "prometheus.yml").read_text())
    targets = {
        t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    }
    nodes = node_services()
    assert targets == {
        f"{s['hostname']}:{node_config(s)[1]['metrics.port']}" for s in nodes.values()
    }


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


def test_topics_created_without_a_factor_take_acks_all_writes() -> None:
    # The controllers fill in a CreateTopics without count or factor; a factor below the
    # brokers' min.insync.replicas would refuse every acks=all write to such a topic.
    controllers = [c for role, c in map(node_config, node_services().values()) if role != "broker"]
    brokers = [c for role, c in map(node_config, node_services().values()) if role == "broker"]
    for controller in controllers:
        for broker in brokers:
            assert controller["default.replication.factor"] > broker["min.insync.replicas"]
            assert controller["default.replication.factor"] <= len(brokers)


def test_only_loopback_addresses_are_published() -> None:
    # Nothing here authenticates. The S3 server is not published at all: moto allows any
    # web origin, so a page in a browser on the host could delete tiered segments.
    for name, service in services().items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    assert "ports" not in services()["s3"]
