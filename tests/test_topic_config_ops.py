"""IncrementalAlterConfigs operations turned into the controller's changes."""

from __future__ import annotations

import pytest

from rillet.controller.metadata.topic_config import (
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    ConfigOpError,
    incremental_changes,
)


def test_set_and_delete() -> None:
    ops = [("retention.ms", OP_SET, "1000"), ("segment.ms", OP_DELETE, None)]
    assert incremental_changes({}, ops) == {"retention.ms": "1000", "segment.ms": None}


def test_append_and_subtract_work_on_the_current_list() -> None:
    assert incremental_changes({}, [("cleanup.policy", OP_APPEND, "compact")]) == {
        "cleanup.policy": "delete,compact"
    }
    both = {"cleanup.policy": "delete,compact"}
    assert incremental_changes(both, [("cleanup.policy", OP_SUBTRACT, "delete")]) == {
        "cleanup.policy": "compact"
    }
    assert incremental_changes(both, [("cleanup.policy", OP_APPEND, "delete")]) == {
        "cleanup.policy": "delete,compact"
    }


@pytest.mark.parametrize(
    ("ops", "invalid_request"),
    [
        ([("retention.ms", OP_SET, "1"), ("retention.ms", OP_DELETE, None)], True),
        ([("retention.ms", OP_APPEND, "1")], True),  # not a list key
        ([("retention.ms", 7, "1")], True),
        ([("retention.ms", OP_SET, None)], True),
        ([("no.such.key", OP_APPEND, "x")], False),
    ],
)
def test_refused(ops: list, invalid_request: bool) -> None:
    with pytest.raises(ConfigOpError) as e:
        incremental_changes({}, ops)
    assert e.value.invalid_request is invalid_request


class _CountedName(str):
    """A resource name that counts how often it is compared, so the test can bound the
    planning work without timing it."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        _CountedName.comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_alter_configs_planning_is_linear_in_the_resources() -> None:
    from rillet.client.wire import messages as m
    from rillet.client.wire.errors import code_of
    from rillet.controller.handlers import _alter_configs
    from rillet.controller.metadata.image import EMPTY_IMAGE, RESOURCE_BROKER, RESOURCE_TOPIC
    from rillet.controller.metadata.quorum import QuorumController

    n = 4_000
    resources = [
        m.AlterConfigsResource(RESOURCE_BROKER, _CountedName(f"b{i}"), []) for i in range(n)
    ]
    twice = m.AlterConfigsResource(RESOURCE_TOPIC, _CountedName("t"), [])
    request = m.IncrementalAlterConfigsRequest([*resources, twice, twice], validate_only=True)
    _CountedName.comparisons = 0
    records, out = _alter_configs(QuorumController(), request, EMPTY_IMAGE)
    assert records == [] and len(out) == n + 2
    assert [r.error_code for r in out[-2:]] == [code_of("INVALID_REQUEST")] * 2
    assert _CountedName.comparisons <= 4 * n  # a name is not compared with every other


def test_append_starts_from_the_default_the_brokers_apply() -> None:
    compact = {"cleanup.policy": "compact"}  # the cluster's log.cleanup.policy
    appended = incremental_changes({}, [("cleanup.policy", OP_APPEND, "delete")], compact)
    assert appended == {"cleanup.policy": "compact,delete"}
    subtracted = incremental_changes({}, [("cleanup.policy", OP_SUBTRACT, "delete")], compact)
    assert subtracted == {"cleanup.policy": "compact"}
    # A topic's own value still wins over the default.
    own = {"cleanup.policy": "delete"}
    assert incremental_changes(own, [("cleanup.policy", OP_APPEND, "compact")], compact) == {
        "cleanup.policy": "delete,compact"
    }


def test_the_controller_alters_against_its_log_defaults() -> None:
    """Through the controller's handler: APPEND on a topic without its own cleanup.policy
    starts from the cluster's log.cleanup.policy, and tiering a topic that is compacted
    by that default is refused."""
    from test_quorum_controller import Cluster

    from rillet.client.wire import messages as m
    from rillet.controller.config import controller_config_table
    from rillet.controller.handlers import _alter_configs
    from rillet.controller.metadata.image import RESOURCE_TOPIC
    from rillet.controller.server import controller_config_of

    config = controller_config_table().load(overrides=["log.cleanup.policy=compact"])
    settings = controller_config_of(config)
    assert settings.topic_defaults["cleanup.policy"] == "compact"
    c = Cluster(brokers=1, topic_defaults=settings.topic_defaults)
    c.create("t", rf=1)

    def alter(*ops: tuple[str, int, str | None]) -> int:
        configs = [m.AlterableConfig(*op) for op in ops]
        req = m.IncrementalAlterConfigsRequest(
            [m.AlterConfigsResource(RESOURCE_TOPIC, "t", configs)]
        )
        (out,) = c.run(_alter_configs(c.ctl, req, c.image))
        return out.error_code

    assert alter(("remote.storage.enable", OP_SET, "true")) != 0  # compacted by default
    assert alter(("cleanup.policy", OP_APPEND, "delete")) == 0
    assert c.image.topic_config("t") == {"cleanup.policy": "delete,compact"}  # canonical


def test_a_bad_log_default_in_the_controllers_config_is_a_config_error() -> None:
    from rillet.client.wire.errors import InvalidConfigError
    from rillet.controller.config import controller_config_table
    from rillet.controller.server import controller_config_of

    config = controller_config_table().load(overrides=["log.cleanup.policy=shred"])
    with pytest.raises(InvalidConfigError, match="log.cleanup.policy"):
        controller_config_of(config)
