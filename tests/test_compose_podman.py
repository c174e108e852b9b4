"""docker-compose.yml started for real under a container engine: podman and
podman-compose (our machines have no Docker engine). `make compose-test` runs this
module (it installs podman and makes the base image available first; .ci/run runs it
after `make test`); `make test` deselects it (marker `compose`).

One compose project is started for the module and used from the host, as a user would:
the CLI and the Python client bootstrap from 127.0.0.1:9092 and must reach every leader
through the EXTERNAL listeners. It is torn down at the end, volumes and network too,
even when a test failed; each container's log tail is printed then.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import wait_until

from rillet.client.admin import Admin, NewTopic
from rillet.client.consumer import Consumer
from rillet.client.producer import Producer

pytestmark = [pytest.mark.compose, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
# Not the file's own name (`rillet`): a user's compose project is never touched.
PROJECT = "rillet-compose-test"
BOOTSTRAP = "127.0.0.1:9092"
HOST_PORTS = {"broker-1": 9092, "broker-2": 9094, "broker-3": 9096, "console": 8080}
IMAGES = ["rillet:latest", "rillet-spark:latest", "rillet-prometheus:latest"]
PROMETHEUS_PORT = 9090
NODES = ["controller-1", "controller-2", "controller-3", "broker-1", "broker-2", "broker-3"]
SERVICES = [*NODES, "s3", "console", "init"]
UP_TIMEOUT_S = 240.0
# Every profile, so that builds, `run` and teardown cover the optional services too.
PROFILES = ["--profile", "spark", "--profile", "monitoring"]
FIGURES: dict[str, float] = {}


def podman_compose_command() -> list[str]:
    here = Path(sys.executable).parent / "podman-compose"
    found = str(here) if here.exists() else shutil.which("podman-compose")
    if found is None or shutil.which("podman") is None:
        pytest.fail("podman and podman-compose are needed: run `make compose-test`")
    return [found, "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml")]


def run(cmd: list[str], timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check:
        assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Compose:
    base: list[str]  # podman-compose with this project's name and file

    def __call__(self, *args: str, timeout: float = 600, check: bool = True):  # noqa: ANN204
        return run([*self.base, *args], timeout=timeout, check=check)

    @staticmethod
    def container(service: str) -> str:
        return f"{PROJECT}_{service}_1"

    def inspect(self, service: str, what: str) -> str:
        fmt = "{{" + what + "}}"
        return run(["podman", "inspect", self.container(service), "--format", fmt]).stdout.strip()

    def logs(self, service: str, tail: int = 40) -> str:
        proc = run(["podman", "logs", "--tail", str(tail), self.container(service)], check=False)
        return proc.stdout + proc.stderr

    def owned(self) -> dict[str, list[str]]:
        """Every container, volume and network podman-compose labelled as this project's."""
        label = f"label=io.podman.compose.project={PROJECT}"
        return {
            kind: run(["podman", *cmd, "--filter", label, *fmt]).stdout.split()
            for kind, cmd, fmt in (
                ("containers", ["ps", "-a"], ["--format", "{{.Names}}"]),
                ("volumes", ["volume", "ls"], ["--format", "{{.Name}}"]),
                ("networks", ["network", "ls"], ["--format", "{{.Name}}"]),
            )
        }


def describe(topic: str):  # noqa: ANN201
    async def main():  # noqa: ANN202
        async with Admin(BOOTSTRAP, timeout_ms=10_000) as admin:
            (desc,) = await admin.describe_topics([topic])
            return desc, await admin.describe_cluster()

    return asyncio.run(main())


def serving(topic: str = "demo", partitions: int = 6) -> bool:
    """``topic`` is there with ``partitions``, every replica in sync, and three brokers
    (by default the init service's topic)."""
    try:
        desc, cluster = describe(topic)
    except Exception:  # noqa: BLE001 - not up yet, whatever the reason
        return False
    full = all(len(p.isr) == len(p.replicas) == 3 for p in desc.partitions)
    live = len(cluster.brokers) == 3 and not cluster.fenced
    return full and live and len(desc.partitions) == partitions


def tear_down(c: Compose) -> tuple[subprocess.CompletedProcess, dict[str, list[str]]]:
    """`down -v` with every profile, orphans (a `run --rm` cut short) included, then
    whatever still carries the project's label, forcibly; and what was left after all."""
    down = run([*c.base, *PROFILES, "down", "-v", "--remove-orphans"], check=False, timeout=600)
    for kind, names in c.owned().items():
        remove = {"containers": ["rm", "-f", "-v"], "volumes": ["volume", "rm", "-f"]}
        for name in names:
            run(["podman", *remove.get(kind, ["network", "rm", "-f"]), name], check=False)
    return down, c.owned()


def dump_logs(c: Compose) -> None:
    for service in [*SERVICES, "prometheus"]:
        print(f"\n--- {service} ---\n{c.logs(service)}", file=sys.stderr)


@pytest.fixture(scope="module")
def compose(request: pytest.FixtureRequest) -> Iterator[Compose]:
    c = Compose(podman_compose_command())
    # Leftovers of an interrupted run of this module (never a user's own project).
    tear_down(c)
    taken = [p for p in [*HOST_PORTS.values(), PROMETHEUS_PORT] if port_taken(p)]
    if taken:
        pytest.fail(f"host ports {taken} are in use: stop what holds them (a local cluster?)")
    # Built from this checkout by containers/podman-setup.sh (make compose-test).
    for image in IMAGES:
        if run(["podman", "image", "exists", image], check=False).returncode != 0:
            pytest.fail(f"no image {image}: run `make compose-test`, which builds it")
    failed_before = request.session.testsfailed
    started = time.monotonic()
    try:
        c("up", "-d", timeout=300)
        wait_until(serving, timeout=UP_TIMEOUT_S, interval=0.5, message="the cluster serving demo")
    except BaseException:
        dump_logs(c)  # the cluster never served: the tests' failures will not show it
        tear_down(c)
        raise
    FIGURES["up_to_serving_s"] = round(time.monotonic() - started, 1)
    yield c
    if request.session.testsfailed != failed_before:
        dump_logs(c)
    down, left = tear_down(c)
    print(f"\ncompose-test figures: {json.dumps(FIGURES)}", file=sys.stderr)
    assert down.returncode == 0, down.stderr
    assert left == {"containers": [], "volumes": [], "networks": []}, left


def produce_and_read_back(topic: str, count: int, partitions: int) -> dict[int, list[int]]:
    """Produce ``count`` records with acks=all, then read the topic from the start until
    every acknowledged one is back; the sequence numbers read, per partition."""

    async def main() -> dict[int, list[int]]:
        async with Producer(bootstrap=BOOTSTRAP, acks="all") as producer:
            for i in range(count):
                await producer.produce(topic, b"%09d" % i)
            await producer.flush()  # raises if any record was not acknowledged
        seen: dict[int, list[int]] = {p: [] for p in range(partitions)}
        total = 0
        async with Consumer(topic, bootstrap=BOOTSTRAP, from_beginning=True) as consumer:
            async with asyncio.timeout(120):
                async for record in consumer:
                    seen[record.partition].append(int(record.value))
                    total += 1
                    if total >= count:
                        break
        return seen

    return asyncio.run(main())


def create_topic(name: str, partitions: int, replication_factor: int = 3, **configs: str) -> None:
    async def main() -> None:
        async with Admin(BOOTSTRAP) as admin:
            await admin.create_topics([NewTopic(name, partitions, replication_factor, configs)])

    asyncio.run(main())


def test_a_host_client_bootstraps_from_the_published_ports(compose: Compose) -> None:
    desc, cluster = describe("demo")
    # Every broker is advertised by its EXTERNAL listener, published on the host.
    assert {(b.host, b.port) for b in cluster.brokers} == {
        ("127.0.0.1", HOST_PORTS[f"broker-{n}"]) for n in (1, 2, 3)
    }
    assert {b.rack for b in cluster.brokers} == {"rack-1", "rack-2", "rack-3"}
    # The init service created demo and exited 0. demo can be served while init's CLI
    # is still closing its connections and its interpreter: wait for the exit.
    wait_until(
        lambda: compose.inspect("init", ".State.Status") == "exited",
        timeout=60,
        interval=0.5,
        message="the init service exiting",
    )
    assert compose.inspect("init", ".State.ExitCode") == "0"
    assert all(len(set(p.replicas)) == 3 for p in desc.partitions)
    # The CLI's default bootstrap is 127.0.0.1:9092: no flag needed on the host.
    env = {k: v for k, v in os.environ.items() if k != "RILLET_BOOTSTRAP"}
    proc = subprocess.run(
        [sys.executable, "-m", "rillet.client.cli", "topic", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0 and "demo" in proc.stdout.split(), proc.stderr


def test_100k_records_with_acks_all_are_read_back_in_order(compose: Compose) -> None:
    # No count, no factor: the controllers' defaults (containers/controller.toml), which
    # must take acks=all writes under the brokers' min.insync.replicas=2.
    create_topic("events", -1, replication_factor=-1)
    desc, _ = describe("events")
    assert [len(p.replicas) for p in desc.partitions] == [3, 3, 3]
    started = time.monotonic()
    seen = produce_and_read_back("events", 100_000, 3)
    FIGURES["produce_consume_100k_s"] = round(time.monotonic() - started, 1)
    values = [v for vs in seen.values() for v in vs]
    assert sorted(values) == list(range(100_000))  # nothing lost, nothing twice
    for partition, vs in seen.items():
        assert vs == sorted(vs), f"partition {partition} out of order"
    assert sum(1 for vs in seen.values() if vs) > 1  # spread over the partitions


def test_the_console_serves_the_cluster_on_the_hosts_loopback(compose: Compose) -> None:
    def page(host: str) -> tuple[int, str]:
        request = urllib.request.Request("http://127.0.0.1:8080/topics", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""
        except OSError:
            return 0, ""

    wait_until(
        lambda: (got := page("127.0.0.1:8080"))[0] == 200 and "demo" in got[1],
        timeout=60,
        interval=0.5,
        message="the console listing the topic demo",
    )
    # Bound to 0.0.0.0 in its container, it still answers only loopback names.
    assert page("rebound.example:8080")[0] == 421


def test_writes_and_reads_go_on_with_a_broker_killed(compose: Compose) -> None:
    create_topic("survivors", 3)
    run(["podman", "kill", "--signal", "KILL", compose.container("broker-2")])
    try:
        wait_until(lambda: compose.inspect("broker-2", ".State.Status") == "exited", timeout=30)
        # RF=3, min.insync.replicas=2: acks=all is still accepted with two brokers.
        seen = produce_and_read_back("survivors", 20_000, 3)
        assert sorted(v for vs in seen.values() for v in vs) == list(range(20_000))
    finally:
        run(["podman", "start", compose.container("broker-2")])
    wait_until(lambda: serving("survivors", 3), timeout=120, interval=0.5, message="ISR full again")


def test_a_crashed_broker_is_restarted_and_rejoins(compose: Compose) -> None:
    # A kill -9 of the process itself (not `podman kill`, which counts as a stop by the
    # user): the restart policy brings it back, and it catches up into the ISR.
    def registrations() -> int:
        return compose.logs("broker-3", tail=100_000).count("broker 3: registered with epoch")

    before, registered = int(compose.inspect("broker-3", ".RestartCount")), registrations()
    pid = int(compose.inspect("broker-3", ".State.Pid"))
    assert pid > 0, "broker-3 is not running"  # os.kill(0) would signal our own group
    os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: int(compose.inspect("broker-3", ".RestartCount")) > before,
        timeout=60,
        interval=0.5,
        message="broker-3 restarted by its restart policy",
    )
    # Back within the session timeout, it may never have left the ISR: until the new
    # process registers, the controllers still count the old one as live. So wait for
    # the registration, then for it to be unfenced (caught up) and in every ISR.
    wait_until(lambda: registrations() > registered, timeout=60, interval=0.5)
    wait_until(lambda: serving("demo"), timeout=120, interval=0.5, message="demo's ISR full")
    # It leads again, or follows, and acks=all writes through it are read back.
    seen = produce_and_read_back("demo", 10_000, 6)
    assert sorted(v for vs in seen.values() for v in vs) == list(range(10_000))


LIST_SEGMENTS = """
import boto3, json
s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:9080", region_name="us-east-1",
                  aws_access_key_id="testing", aws_secret_access_key="testing")
try:
    listing = s3.list_objects_v2(Bucket="rillet-tier", Prefix="tiered-")
except s3.exceptions.NoSuchBucket:  # a broker creates it with its first upload
    listing = {}
print(json.dumps([o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith(".log")]))
"""


def test_closed_segments_reach_s3(compose: Compose) -> None:
    create_topic("tiered", 1, **{"remote.storage.enable": "true", "segment.bytes": str(256 * 1024)})
    seen = produce_and_read_back("tiered", 30_000, 1)  # ~1 MB: a few closed segments
    assert sorted(seen[0]) == list(range(30_000))

    def uploaded() -> list[str]:
        # The s3 service is not published on the host: ask it from its own container.
        cmd = ["podman", "exec", compose.container("s3"), "python", "-c", LIST_SEGMENTS]
        return json.loads(run(cmd).stdout)

    # Uploads run every remote.log.manager.task.interval.ms (Kafka's 30 s).
    keys = wait_until(uploaded, timeout=180, interval=2, message="segments of tiered in S3")
    assert all("/0/" in k for k in keys), keys


def test_spark_load_and_verify_through_the_spark_profile(compose: Compose) -> None:
    def spark(*args: str) -> dict:
        # `docker compose run --rm spark ...`: Spark in local mode inside the network.
        proc = compose(*PROFILES, "run", "--rm", "spark", *args, "--json", timeout=600)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    started = time.monotonic()
    load = spark(
        "load",
        "--topic",
        "spark-load",
        "--records",
        "20000",
        "--tasks",
        "2",
        "--partitions",
        "3",
        "--replication-factor",
        "3",
        "--master",
        "local[2]",
    )
    assert load["status"] == "committed" and load["records"] == 20_000, load
    verify = spark("verify", "--topic", "spark-load", "--master", "local[2]")
    FIGURES["spark_load_verify_s"] = round(time.monotonic() - started, 1)
    assert verify["ok"] and verify["acknowledged"] == verify["read"] == 20_000, verify


def test_prometheus_scrapes_every_node(compose: Compose) -> None:
    compose(*PROFILES, "up", "-d", "prometheus", timeout=300)
    url = f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/targets"

    def healthy() -> list[dict] | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                targets = json.loads(r.read())["data"]["activeTargets"]
        except OSError:
            return None
        up = [t for t in targets if t["health"] == "up"]
        return targets if len(targets) == len(up) == len(NODES) else None

    targets = wait_until(healthy, timeout=120, interval=1, message="6 targets up")
    names = {t["labels"]["instance"].split(":")[0] for t in targets}
    assert names == set(NODES)


def test_sigterm_is_a_controlled_shutdown_within_the_grace_period(compose: Compose) -> None:
    # Last: it leaves the cluster without controllers. A broker whose controllers are
    # already gone still exits on its own (exit 0) inside stop_grace_period (45 s),
    # having waited controlled.shutdown.timeout.ms (30 s) for an answer.
    for n in (1, 2, 3):
        run(["podman", "stop", "-t", "45", compose.container(f"controller-{n}")])
    started = time.monotonic()
    run(["podman", "stop", "-t", "45", compose.container("broker-1")], timeout=120)
    FIGURES["broker_stop_without_controllers_s"] = round(time.monotonic() - started, 1)
    assert compose.inspect("broker-1", ".State.ExitCode") == "0"  # not 137: not killed
    assert "broker 1 stopped" in compose.logs("broker-1", tail=20)
