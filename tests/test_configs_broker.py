"""A broker's DescribeConfigs and IncrementalAlterConfigs handlers over a real metadata
image (broker/handlers/configs.py): bounds, config sources, which resources it waits for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from test_quorum_controller import Cluster

from rillet.broker.config import BrokerConfig, broker_config_table
from rillet.broker.handlers.configs import (
    DEFAULT_CONFIG,
    MAX_DESCRIBE_RESOURCES,
    STATIC_BROKER_CONFIG,
    TOPIC_CONFIG,
    ConfigHandlers,
)
from rillet.client.runtime.rpc_server import Request
from rillet.client.wire import messages as m
from rillet.client.wire.errors import code_of
from rillet.controller.metadata.image import RESOURCE_BROKER, RESOURCE_TOPIC, MetadataImage
from rillet.controller.metadata.topic_config import OP_SET, TOPIC_CONFIGS


def request(message: Any) -> Request:
    return Request(None, 0, 1, "test", {}, memoryview(b""), "peer", message)  # type: ignore[arg-type]


def handlers(
    image: Callable[[], MetadataImage],
    *settings: str,
    forward: Any = None,
    wait_image: Any = None,
) -> ConfigHandlers:
    config = BrokerConfig.from_config(
        broker_config_table().load(overrides=["node.id=1", *settings])
    )
    return ConfigHandlers(config, image, forward, wait_image)


def describe(h: ConfigHandlers, *resources: m.DescribeConfigsResource) -> list:
    msg = m.DescribeConfigsRequest(list(resources))
    return asyncio.run(h.describe_configs(request(msg))).message.results


def test_a_small_describe_configs_request_cannot_make_the_broker_build_tens_of_mb() -> None:
    c = Cluster(brokers=1)
    c.create("t", rf=1, configs={"retention.ms": "1000"})
    h = handlers(lambda: c.image)
    # The same resource 20,000 times (~100 KB on the wire): answered once.
    results = describe(h, *[m.DescribeConfigsResource(RESOURCE_TOPIC, "t", None)] * 20_000)
    assert len(results) == 1 and len(results[0].configs) == len(TOPIC_CONFIGS)
    # A key named many times comes back once; a resource named twice gets both key lists.
    keys = ["retention.ms"] * 50_000
    (one,) = describe(
        h,
        m.DescribeConfigsResource(RESOURCE_TOPIC, "t", keys),
        m.DescribeConfigsResource(RESOURCE_TOPIC, "t", ["segment.ms"]),
    )
    assert [c.name for c in one.configs] == ["retention.ms", "segment.ms"]
    # More distinct resources than one request may name: each refused, nothing built.
    many = [
        m.DescribeConfigsResource(RESOURCE_TOPIC, f"t{i}", None)
        for i in range(MAX_DESCRIBE_RESOURCES + 1)
    ]
    refused = describe(h, *many)
    assert len(refused) == len(many)
    assert all(r.error_code == code_of("INVALID_REQUEST") and not r.configs for r in refused)


def test_a_refused_resource_named_like_an_altered_topic_is_not_waited_for() -> None:
    """The controller accepts topic "1" and refuses broker "1": the broker waits until
    its image shows the topic's change, and not for the refused broker resource."""
    c = Cluster(brokers=1)
    c.create("1", rf=1)
    c.run(c.ctl.alter_topic_configs(c.image, "1", {"retention.ms": "1000"}))  # applied
    topic = m.AlterConfigsResource(
        RESOURCE_TOPIC, "1", [m.AlterableConfig("retention.ms", OP_SET, "1000")]
    )
    broker = m.AlterConfigsResource(
        RESOURCE_BROKER, "1", [m.AlterableConfig("segment.ms", OP_SET, "5")]
    )
    answer = m.IncrementalAlterConfigsResponse(
        [
            m.AlterConfigsResourceResponse(0, None, RESOURCE_TOPIC, "1"),
            m.AlterConfigsResourceResponse(
                code_of("INVALID_REQUEST"), "static", RESOURCE_BROKER, "1"
            ),
        ]
    )
    waited: list[bool] = []

    async def forward(req: Any) -> Any:
        return answer

    async def wait_image(shows: Callable[[MetadataImage], bool], timeout_ms: int) -> None:
        waited.append(shows(c.image))  # the image already holds the accepted change

    h = handlers(lambda: c.image, forward=forward, wait_image=wait_image)
    msg = m.IncrementalAlterConfigsRequest([topic, broker])
    assert asyncio.run(h.incremental_alter_configs(request(msg))).message == answer
    assert waited == [True]


def test_a_broker_log_setting_is_reported_as_static_broker_config() -> None:
    c = Cluster(brokers=1)
    c.create("t", rf=1, configs={"retention.ms": "1000"})
    h = handlers(lambda: c.image, "log.cleanup.policy=compact", "min.insync.replicas=2")
    (result,) = describe(h, m.DescribeConfigsResource(RESOURCE_TOPIC, "t", None))
    rows = {r.name: (r.value, r.config_source, r.is_default) for r in result.configs}
    assert rows["cleanup.policy"] == ("compact", STATIC_BROKER_CONFIG, False)
    assert rows["min.insync.replicas"] == ("2", STATIC_BROKER_CONFIG, False)
    assert rows["retention.ms"] == ("1000", TOPIC_CONFIG, False)
    assert rows["segment.ms"][1:] == (DEFAULT_CONFIG, True)  # no broker setting: built in
    assert rows["max.message.bytes"][1:] == (DEFAULT_CONFIG, True)
