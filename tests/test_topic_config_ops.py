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
