"""Topic configs and the controller quorum over the wire, on a real cluster: DescribeConfigs
from every broker, IncrementalAlterConfigs through the active controller (SET, DELETE,
validate_only, Kafka's error codes), DescribeQuorum through a broker, and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Iterator

import pytest
from cluster import combined_nodes
from helpers import run_cli, wait_until_async

from rillet.client.admin import Admin, AdminError, NewTopic
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection
from rillet.controller.metadata.image import RESOURCE_TOPIC
from rillet.controller.metadata.topic_config import OP_APPEND
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three combined nodes, shared by the module."""
    yield from combined_nodes(tmp_path_factory.mktemp("configs"), 3)


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


async def one_broker(cluster: LocalCluster, node_id: int) -> Admin:
    return await Admin(cluster.nodes[node_id].listeners["BROKER"], timeout_ms=20_000).start()


async def configs_everywhere(cluster: LocalCluster, topic: str) -> list[dict]:
    out = []
    for node in cluster.brokers():
        admin = await one_broker(cluster, node.node_id)
        try:
            out.append((await admin.describe_configs([topic]))[topic])
        finally:
            await admin.close()
    return out


async def every_broker_shows(cluster: LocalCluster, shown: Callable[[dict], bool]) -> list[dict]:
    """Each broker's view of topic cfg, once every one of them satisfies ``shown``."""
    seen: list[dict] = []

    async def check() -> bool:
        try:
            seen[:] = await configs_everywhere(cluster, "cfg")
        except AdminError as e:  # a broker that does not know the new topic yet
            seen[:] = [e]
            return False
        return all(map(shown, seen))

    await wait_until_async(check, message=lambda: f"every broker to show it: {seen}")
    return seen


def test_alter_is_seen_from_every_broker_and_delete_restores_the_default(cluster) -> None:  # noqa: ANN001
    async def go() -> None:
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topics([NewTopic("cfg", 2, 3)])
            before = (await admin.describe_configs(["cfg"]))["cfg"]
            assert before["min.insync.replicas"].is_default
            assert before["min.insync.replicas"].source == "DEFAULT_CONFIG"
            assert before["retention.ms"].value == str(7 * 24 * 3600 * 1000)
            await admin.incremental_alter_configs(
                {"cfg": {"min.insync.replicas": "2", "retention.ms": "600000"}}
            )
        # The broker that answered shows it at once; the others within their metadata lag.
        seen = await every_broker_shows(
            cluster, lambda c: (c["min.insync.replicas"].value, c["retention.ms"].value)
            == ("2", "600000"),
        )  # fmt: skip
        assert all(c["retention.ms"].source == "TOPIC_CONFIG" for c in seen)
        assert not any(c["retention.ms"].is_default for c in seen)
        async with Admin(cluster.bootstrap) as admin:
            await admin.incremental_alter_configs({"cfg": {"retention.ms": None}})
        seen = await every_broker_shows(cluster, lambda c: c["retention.ms"].is_default)
        assert all(c["retention.ms"].value == str(7 * 24 * 3600 * 1000) for c in seen)
        assert all(c["min.insync.replicas"].value == "2" for c in seen)

    run(go())


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"min.insync.replicas": "zero"}, "INVALID_CONFIG"),
        ({"retention.ms": "-7"}, "INVALID_CONFIG"),
        ({"no.such.key": "1"}, "INVALID_CONFIG"),
    ],
)
def test_invalid_changes_fail_with_kafka_codes_and_change_nothing(cluster, change, code) -> None:  # noqa: ANN001
    async def go() -> None:
        async with Admin(cluster.bootstrap) as admin:
            await _ensure(admin, "bad")
            before = (await admin.describe_configs(["bad"]))["bad"]
            # A valid key next to the bad one: the resource changes whole or not at all.
            with pytest.raises(AdminError) as e:
                await admin.incremental_alter_configs({"bad": {"segment.ms": "1000", **change}})
            assert e.value.errors["bad"].name == code
            assert (await admin.describe_configs(["bad"]))["bad"] == before

    run(go())


def test_unknown_topic_and_validate_only(cluster) -> None:  # noqa: ANN001
    async def go() -> None:
        async with Admin(cluster.bootstrap) as admin:
            with pytest.raises(AdminError) as e:
                await admin.incremental_alter_configs({"nope": {"retention.ms": "1000"}})
            assert e.value.errors["nope"].name == "UNKNOWN_TOPIC_OR_PARTITION"
            await _ensure(admin, "dry")
            with pytest.raises(AdminError) as e:
                await admin.describe_configs(["nope", "dry"])
            assert e.value.errors["nope"].name == "UNKNOWN_TOPIC_OR_PARTITION"
            assert list(e.value.found) == ["dry"]  # the others' configs are not lost
            await admin.incremental_alter_configs(
                {"dry": {"retention.ms": "1000"}}, validate_only=True
            )
            assert (await admin.describe_configs(["dry"]))["dry"]["retention.ms"].is_default
            with pytest.raises(AdminError) as e:
                await admin.incremental_alter_configs(
                    {"dry": {"retention.ms": "x"}}, validate_only=True
                )
            assert e.value.errors["dry"].name == "INVALID_CONFIG"

    run(go())


def test_describe_quorum_through_a_broker(cluster) -> None:  # noqa: ANN001
    async def go() -> None:
        async with Admin(cluster.bootstrap) as admin:
            quorum = await admin.describe_quorum()
        assert quorum.leader_id in {1, 2, 3}
        assert quorum.leader_epoch >= 1 and quorum.high_watermark > 0
        assert sorted(v.id for v in quorum.voters) == [1, 2, 3]
        leader = next(v for v in quorum.voters if v.id == quorum.leader_id)
        assert leader.lag == 0 and leader.log_end_offset >= quorum.high_watermark
        assert all(v.lag >= 0 and v.log_end_offset >= 0 for v in quorum.voters)

    run(go())


def test_an_altered_min_isr_applies_to_produce_on_the_leader(cluster) -> None:  # noqa: ANN001
    """The change reaches the partition's replica, not only the describe output."""

    async def produce(leader: int) -> int:
        data = records.encode_batch([b"v"], timestamp_ms=1000)
        host, port = cluster.nodes[leader].listeners["BROKER"].rsplit(":", 1)
        async with await Connection.open(host, int(port)) as conn:
            header, _ = await conn.request(
                "Produce",
                {"acks": -1, "timeout_ms": 10_000, "topics": [["minisr", [[0, len(data)]]]]},
                data,
            )
        return header["topics"][0][1][0][1]

    async def go() -> None:
        async with Admin(cluster.bootstrap) as admin:
            await _ensure(admin, "minisr")
            ((p,),) = [t.partitions for t in await admin.describe_topics(["minisr"])]
        leader = await one_broker(cluster, p.leader)
        try:
            assert await produce(p.leader) == errors.NONE
            # More than the replicas: no acks=all write can succeed.
            await leader.incremental_alter_configs({"minisr": {"min.insync.replicas": "4"}})
            assert await produce(p.leader) == errors.code_of("NOT_ENOUGH_REPLICAS")
            await leader.incremental_alter_configs({"minisr": {"min.insync.replicas": None}})
            assert await produce(p.leader) == errors.NONE
        finally:
            await leader.close()

    run(go())


async def call(cluster: LocalCluster, node_id: int, message):  # noqa: ANN001, ANN201
    host, port = cluster.nodes[node_id].listeners["BROKER"].rsplit(":", 1)
    async with await Connection.open(host, int(port)) as conn:
        response, _ = await conn.call(message, timeout_ms=20_000)
        return response


def test_list_operations_and_broker_resources_over_the_wire(cluster) -> None:  # noqa: ANN001
    def alter(*configs: m.AlterableConfig, kind: int = 2, name: str = "ops"):  # noqa: ANN202
        request = m.IncrementalAlterConfigsRequest([m.AlterConfigsResource(kind, name, configs)])
        (answer,) = run(call(cluster, 2, request)).responses
        return errors.error_name(answer.error_code)

    async def setup() -> None:
        async with Admin(cluster.bootstrap) as admin:
            await _ensure(admin, "ops")

    run(setup())
    # APPEND and SUBTRACT work on list keys only (cleanup.policy).
    assert alter(m.AlterableConfig("cleanup.policy", 2, "compact")) == "NONE"
    assert alter(m.AlterableConfig("retention.ms", 2, "1")) == "INVALID_REQUEST"
    assert alter(m.AlterableConfig("retention.ms", 0, None)) == "INVALID_REQUEST"
    assert alter(m.AlterableConfig("segment.ms", 0, "1"), kind=4, name="1") == "INVALID_REQUEST"

    async def described() -> dict[str, str | None]:
        admin = await one_broker(cluster, 2)  # the broker that answered the alter
        try:
            entries = (await admin.describe_configs(["ops"], keys=["cleanup.policy"]))["ops"]
        finally:
            await admin.close()
        return {k: e.value for k, e in entries.items()}

    assert run(described()) == {"cleanup.policy": "delete,compact"}
    assert alter(m.AlterableConfig("cleanup.policy", 3, "delete")) == "NONE"
    assert run(described()) == {"cleanup.policy": "compact"}

    # A broker describes its own static configuration, read-only; others are refused.
    own = m.DescribeConfigsResource(4, "1", ["node.id", "log.dirs", "min.insync.replicas"])
    other = m.DescribeConfigsResource(4, "2", None)
    mine, refused = run(call(cluster, 1, m.DescribeConfigsRequest([own, other]))).results
    assert mine.error_code == 0 and {c.name: c.value for c in mine.configs}["node.id"] == "1"
    assert all(c.read_only for c in mine.configs)
    assert errors.error_name(refused.error_code) == "INVALID_REQUEST"


async def _ensure(admin: Admin, topic: str) -> None:
    if topic not in await admin.list_topics():
        await admin.create_topics([NewTopic(topic, 1, 3)])


# --- CLI ---------------------------------------------------------------------------


def rillet(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    # One broker: it shows its own answer's change at once (others follow within their
    # metadata lag, which a describe through them right after could miss).
    return run_cli(cluster.nodes[1].listeners["BROKER"], *args, ok=ok)


def test_cli_alter_configs_and_describe(cluster) -> None:  # noqa: ANN001
    rillet(cluster, "topic", "create", "clicfg", "--partitions", "1", "--replication-factor", "3")
    dry = rillet(cluster, "topic", "alter", "clicfg", "--set", "retention.ms=60000", "--dry-run")
    assert "Validated (nothing changed)" in dry.stdout
    configs = json.loads(rillet(cluster, "topic", "configs", "clicfg", "--json").stdout)
    assert configs["configs"]["retention.ms"]["is_default"] is True

    rillet(
        cluster,
        "topic",
        "alter",
        "clicfg",
        "--set",
        "retention.ms=60000",
        "--set",
        "min.insync.replicas=2",
    )
    human = rillet(cluster, "topic", "describe", "clicfg").stdout
    assert "retention.ms=60000" in human and "min.insync.replicas=2" in human
    assert "segment.bytes" not in human  # defaults stay out of the human view
    (topic,) = json.loads(rillet(cluster, "topic", "describe", "clicfg", "--json").stdout)["topics"]
    assert topic["configs"]["retention.ms"]["source"] == "TOPIC_CONFIG"
    assert topic["configs"]["segment.bytes"]["is_default"] is True
    table = rillet(cluster, "topic", "configs", "clicfg").stdout
    assert "TOPIC_CONFIG" in table and "DEFAULT_CONFIG" in table

    rillet(cluster, "topic", "alter", "clicfg", "--delete", "retention.ms")
    configs = json.loads(rillet(cluster, "topic", "configs", "clicfg", "--json").stdout)
    assert configs["configs"]["retention.ms"]["is_default"] is True
    assert configs["configs"]["min.insync.replicas"]["value"] == "2"

    bad = rillet(cluster, "topic", "alter", "clicfg", "--set", "retention.ms=oops", ok=False)
    assert bad.returncode != 0 and "INVALID_CONFIG" in bad.stderr
    assert "Traceback" not in bad.stderr
    missing = rillet(cluster, "topic", "alter", "nope", "--set", "retention.ms=1", ok=False)
    assert missing.returncode != 0 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


@pytest.fixture(scope="module")
def compacting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One combined node whose file makes every topic compacted by default."""
    yield from combined_nodes(
        tmp_path_factory.mktemp("compacting"), 1, overrides={"log.cleanup.policy": "compact"}
    )


def test_append_starts_from_the_default_the_brokers_apply(compacting: LocalCluster) -> None:
    """log.cleanup.policy=compact: the default shows as the broker's static setting, and
    APPEND delete gives compact and delete (not delete alone, which would stop compaction
    and let retention delete the keys' latest values)."""

    def append(value: str) -> m.IncrementalAlterConfigsRequest:
        op = m.AlterableConfig("cleanup.policy", OP_APPEND, value)
        return m.IncrementalAlterConfigsRequest([m.AlterConfigsResource(RESOURCE_TOPIC, "c", [op])])

    async def go() -> None:
        async with Admin(compacting.bootstrap) as admin:
            await admin.create_topics([NewTopic("c", 1, 1)])
            policy = (await admin.describe_configs(["c"]))["c"]["cleanup.policy"]
            assert (policy.value, policy.source, policy.is_default) == (
                "compact",
                "STATIC_BROKER_CONFIG",
                False,
            )
            (answer,) = (await admin._request(append("delete"))).responses
            assert answer.error_code == 0
            policy = (await admin.describe_configs(["c"]))["c"]["cleanup.policy"]
            assert (policy.value, policy.source) == ("delete,compact", "TOPIC_CONFIG")
            with pytest.raises(AdminError) as refused:  # still compacted: cannot be tiered
                await admin.incremental_alter_configs({"c": {"remote.storage.enable": "true"}})
            assert refused.value.errors["c"].name == "INVALID_CONFIG"

    run(go())
