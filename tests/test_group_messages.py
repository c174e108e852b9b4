"""Consumer-group wire messages (KIP-848): declarations, round trips, exact bytes, errors.

The group coordinator that serves these APIs comes later; these tests pin the messages
it and the client will speak, so both sides can be built against them.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack
import pytest

from rillet.client.wire import errors, schemas
from rillet.client.wire import messages as m
from rillet.client.wire.framing import encode_frame_bytes

GROUP_APIS = {
    "OffsetCommit": 8,
    "OffsetFetch": 9,
    "FindCoordinator": 10,
    "ListGroups": 16,
    "DeleteGroups": 42,
    "OffsetDelete": 47,
    "ConsumerGroupHeartbeat": 68,
    "ConsumerGroupDescribe": 69,
}

ASSIGNED = [m.GroupTopicPartitions("Zm9vYmFy", [0, 2, 4])]
DESCRIBED = [m.DescribedTopicPartitions("Zm9vYmFy", "orders", [1, 3])]

# One request and one response of every group API, every field away from its default,
# so a round trip that dropped or reordered a field would show.
SAMPLES: list[NamedTuple] = [
    m.FindCoordinatorRequest(coordinator_keys=["g1", "g2"], key_type=0),
    m.FindCoordinatorResponse(
        throttle_time_ms=5,
        coordinators=[
            m.Coordinator("g1", 2, "10.0.0.2", 9092, 0, None),
            m.Coordinator("g2", -1, "", -1, 15, "loading"),
        ],
    ),
    m.OffsetCommitRequest(
        group_id="g",
        generation_id_or_member_epoch=7,
        member_id="m-1",
        group_instance_id="i-1",
        topics=[m.OffsetCommitTopic("orders", [m.OffsetCommitPartition(0, 1 << 40, 3, "meta")])],
    ),
    m.OffsetCommitResponse(
        throttle_time_ms=1,
        topics=[
            m.OffsetCommitTopicResult("orders", [m.OffsetCommitPartitionResult(0, 113)]),
        ],
    ),
    m.OffsetFetchRequest(
        groups=[
            m.OffsetFetchGroup("g", "m-1", 7, [m.OffsetFetchTopic("orders", [0, 1])]),
            m.OffsetFetchGroup("h", None, -1, None),
        ],
        require_stable=True,
    ),
    m.OffsetFetchResponse(
        throttle_time_ms=2,
        groups=[
            m.OffsetFetchGroupResult(
                "g",
                [
                    m.OffsetFetchTopicResult(
                        "orders",
                        [
                            m.OffsetFetchPartitionResult(0, 42, 3, "meta", 0),
                            m.OffsetFetchPartitionResult(1, -1, -1, None, 0),
                        ],
                    )
                ],
                0,
            ),
            m.OffsetFetchGroupResult("h", [], 69),
        ],
    ),
    m.ListGroupsRequest(states_filter=["Stable", "Empty"], types_filter=["consumer"]),
    m.ListGroupsResponse(
        throttle_time_ms=3,
        error_code=0,
        groups=[m.ListedGroup("g", "consumer", "Stable", "consumer")],
    ),
    m.DeleteGroupsRequest(groups_names=["g", "h"]),
    m.DeleteGroupsResponse(
        throttle_time_ms=4,
        results=[m.DeletableGroupResult("g", 0), m.DeletableGroupResult("h", 68)],
    ),
    m.OffsetDeleteRequest(group_id="g", topics=[m.OffsetDeleteTopic("orders", [0, 5])]),
    m.OffsetDeleteResponse(
        error_code=0,
        throttle_time_ms=6,
        topics=[
            m.OffsetDeleteTopicResult(
                "orders",
                [m.OffsetDeletePartitionResult(0, 0), m.OffsetDeletePartitionResult(5, 86)],
            )
        ],
    ),
    m.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="m-1",
        member_epoch=0,
        instance_id="i-1",
        rack_id="r1",
        rebalance_timeout_ms=30000,
        subscribed_topic_names=["orders"],
        subscribed_topic_regex="ord.*",
        server_assignor="uniform",
        topic_partitions=ASSIGNED,
    ),
    m.ConsumerGroupHeartbeatResponse(
        throttle_time_ms=7,
        error_code=0,
        error_message="",
        member_id="m-1",
        member_epoch=12,
        heartbeat_interval_ms=5000,
        assignment=ASSIGNED,
    ),
    m.ConsumerGroupDescribeRequest(group_ids=["g"], include_authorized_operations=True),
    m.ConsumerGroupDescribeResponse(
        throttle_time_ms=8,
        groups=[
            m.DescribedGroup(
                0,
                None,
                "g",
                "Stable",
                12,
                12,
                "uniform",
                [
                    m.DescribedMember(
                        "m-1", "i-1", "r1", 12, "cli", "/10.0.0.9", ["orders"], None, DESCRIBED, []
                    )
                ],
                -(1 << 31),
            ),
            m.DescribedGroup(69, "no such group", "x", "Dead", 0, 0, "", [], -(1 << 31)),
        ],
    ),
]


def api_and_direction(message: Any) -> tuple[schemas.Api, bool]:
    """The API of a request or response message, and whether it is the request."""
    name = type(message).__name__
    is_request = name.endswith("Request")
    return schemas.APIS_BY_NAME[name.removesuffix("Request").removesuffix("Response")], is_request


def test_every_group_api_is_declared_with_kafkas_key_as_a_client_api() -> None:
    for name, key in GROUP_APIS.items():
        api = schemas.resolve(key)
        assert api.name == name and (api.min_version, api.max_version) == (0, 0)
        assert api.scope == schemas.SCOPE_CLIENT
        assert not api.request_payload and not api.response_payload


def test_samples_cover_every_group_request_and_response() -> None:
    covered = {(api.name, req) for api, req in map(api_and_direction, SAMPLES)}
    assert covered == {(name, req) for name in GROUP_APIS for req in (True, False)}


@pytest.mark.parametrize("message", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip_through_msgpack(message: Any) -> None:
    api, is_request = api_and_direction(message)
    header = msgpack.unpackb(msgpack.packb(message.to_header()), raw=False)
    if is_request:
        schemas.validate_request(api, 0, header)
        again = schemas.decode_request(api, 0, header)
    else:
        schemas.validate_response(api, 0, header)
        again = schemas.decode_response(api, 0, header)
    assert again == message and type(again) is type(message)


def test_defaults_fill_a_minimal_heartbeat_and_commit() -> None:
    beat = m.ConsumerGroupHeartbeatRequest.from_header(
        {"group_id": "g", "member_id": "m", "member_epoch": -1}
    )
    assert (beat.instance_id, beat.rebalance_timeout_ms, beat.topic_partitions) == (None, -1, None)
    commit = m.OffsetCommitRequest.from_header(
        {"group_id": "g", "topics": [["t", [[0, 10]]]]}
    )  # a row without leader epoch and metadata
    assert commit.generation_id_or_member_epoch == -1 and commit.member_id == ""
    assert commit.topics[0].partitions[0] == m.OffsetCommitPartition(0, 10, -1, None)


def test_bad_group_requests_name_the_bad_value() -> None:
    with pytest.raises(errors.InvalidRequestError, match=r"member_epoch: expected int, got str"):
        m.ConsumerGroupHeartbeatRequest.from_header(
            {"group_id": "g", "member_id": "m", "member_epoch": "0"}
        )
    with pytest.raises(
        errors.InvalidRequestError, match=r"groups\[0\].topics\[0\].partition_indexes\[1\]"
    ):
        m.OffsetFetchRequest.from_header({"groups": [["g", None, -1, [["t", [0, "1"]]]]]})


# --- exact bytes -----------------------------------------------------------------------
# Hand-built msgpack, byte by byte from the msgpack spec, so a change of field order,
# name or type in the declarations (which changes what a peer reads) fails here.


def s(text: str) -> bytes:  # fixstr
    raw = text.encode()
    assert len(raw) < 32
    return bytes([0xA0 | len(raw)]) + raw


def arr(*items: bytes) -> bytes:  # fixarray
    return bytes([0x90 | len(items)]) + b"".join(items)


def fixmap(*pairs: tuple[str, bytes]) -> bytes:
    return bytes([0x80 | len(pairs)]) + b"".join(s(k) + v for k, v in pairs)


def pos(n: int) -> bytes:  # positive fixint
    assert 0 <= n < 128
    return bytes([n])


NIL, NEG1 = b"\xc0", b"\xff"


def frame(header: bytes) -> bytes:
    return struct.pack(">II", 4 + len(header), len(header)) + header


def request_frame(message: Any, correlation_id: int) -> bytes:
    """The frame Connection sends for ``message`` (its header keys first, then fields)."""
    api = schemas.api_of(message)
    header = {
        "api": api.key,
        "version": api.max_version,
        "correlation_id": correlation_id,
        "client_id": "c",
        **message.to_header(),
    }
    return encode_frame_bytes(header)


def request_head(key: int, correlation_id: int) -> list[tuple[str, bytes]]:
    return [
        ("api", pos(key)),
        ("version", pos(0)),
        ("correlation_id", pos(correlation_id)),
        ("client_id", s("c")),
    ]


def test_consumer_group_heartbeat_bytes() -> None:
    message = m.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="m1",
        member_epoch=0,
        rack_id="r",
        rebalance_timeout_ms=300000,
        subscribed_topic_names=["t"],
        topic_partitions=[m.GroupTopicPartitions("id", [0, 1])],
    )
    expected = frame(
        fixmap(
            *request_head(68, 5),
            ("group_id", s("g")),
            ("member_id", s("m1")),
            ("member_epoch", pos(0)),
            ("instance_id", NIL),
            ("rack_id", s("r")),
            ("rebalance_timeout_ms", b"\xce" + struct.pack(">I", 300000)),  # uint32
            ("subscribed_topic_names", arr(s("t"))),
            ("subscribed_topic_regex", NIL),
            ("server_assignor", NIL),
            ("topic_partitions", arr(arr(s("id"), arr(pos(0), pos(1))))),
        )
    )
    assert request_frame(message, 5) == expected

    response = fixmap(
        ("correlation_id", pos(5)),
        ("throttle_time_ms", pos(0)),
        ("error_code", pos(0)),
        ("error_message", NIL),
        ("member_id", s("m1")),
        ("member_epoch", pos(1)),
        ("heartbeat_interval_ms", b"\xcd" + struct.pack(">H", 5000)),  # uint16
        ("assignment", arr(arr(s("id"), arr(pos(1))))),
    )
    decoded = m.ConsumerGroupHeartbeatResponse.from_header(msgpack.unpackb(response))
    assert decoded == m.ConsumerGroupHeartbeatResponse(
        0, 0, None, "m1", 1, 5000, [m.GroupTopicPartitions("id", [1])]
    )


def test_offset_commit_bytes() -> None:
    message = m.OffsetCommitRequest(
        group_id="g",
        generation_id_or_member_epoch=3,
        member_id="m1",
        topics=[m.OffsetCommitTopic("t", [m.OffsetCommitPartition(2, 1 << 33, 1, None)])],
    )
    expected = frame(
        fixmap(
            *request_head(8, 9),
            ("group_id", s("g")),
            (
                "topics",
                arr(
                    arr(s("t"), arr(arr(pos(2), b"\xcf" + struct.pack(">Q", 1 << 33), pos(1), NIL)))
                ),
            ),
            ("generation_id_or_member_epoch", pos(3)),
            ("member_id", s("m1")),
            ("group_instance_id", NIL),
        )
    )
    assert request_frame(message, 9) == expected

    response = fixmap(
        ("correlation_id", pos(9)),
        ("throttle_time_ms", pos(0)),
        ("topics", arr(arr(s("t"), arr(arr(pos(2), pos(110)))))),
    )
    decoded = m.OffsetCommitResponse.from_header(msgpack.unpackb(response))
    assert decoded.topics == [
        m.OffsetCommitTopicResult("t", [m.OffsetCommitPartitionResult(2, 110)])
    ]
    assert errors.error_for(decoded.topics[0].partitions[0].error_code).name == (
        "FENCED_MEMBER_EPOCH"
    )


# --- error codes -----------------------------------------------------------------------

# Kafka's numbers, names and retriability (its RetriableException subclasses).
GROUP_ERRORS = [
    (12, "OFFSET_METADATA_TOO_LARGE", False),
    (14, "COORDINATOR_LOAD_IN_PROGRESS", True),
    (15, "COORDINATOR_NOT_AVAILABLE", True),
    (16, "NOT_COORDINATOR", True),
    (22, "ILLEGAL_GENERATION", False),
    (23, "INCONSISTENT_GROUP_PROTOCOL", False),
    (24, "INVALID_GROUP_ID", False),
    (25, "UNKNOWN_MEMBER_ID", False),
    (26, "INVALID_SESSION_TIMEOUT", False),
    (27, "REBALANCE_IN_PROGRESS", False),
    (28, "INVALID_COMMIT_OFFSET_SIZE", False),
    (68, "NON_EMPTY_GROUP", False),
    (69, "GROUP_ID_NOT_FOUND", False),
    (79, "MEMBER_ID_REQUIRED", False),
    (81, "GROUP_MAX_SIZE_REACHED", False),
    (82, "FENCED_INSTANCE_ID", False),
    (86, "GROUP_SUBSCRIBED_TO_TOPIC", False),
    (88, "UNSTABLE_OFFSET_COMMIT", True),
    (100, "UNKNOWN_TOPIC_ID", True),
    (110, "FENCED_MEMBER_EPOCH", False),
    (111, "UNRELEASED_INSTANCE_ID", False),
    (112, "UNSUPPORTED_ASSIGNOR", False),
    (113, "STALE_MEMBER_EPOCH", False),
]


@pytest.mark.parametrize(("code", "name", "retriable"), GROUP_ERRORS)
def test_group_error_codes(code: int, name: str, retriable: bool) -> None:
    assert errors.error_name(code) == name
    assert errors.is_retriable(code) is retriable
    exc = errors.error_for(code, "why")
    assert exc.code == code and exc.retriable is retriable and exc.message == "why"
    with pytest.raises(errors.EXCEPTIONS[code]):
        errors.raise_for(code)


def test_named_group_exceptions_match_their_codes() -> None:
    assert errors.NotCoordinatorError.code == 16
    assert errors.CoordinatorLoadInProgressError.code == 14
    assert errors.FencedMemberEpochError.code == 110
    assert errors.StaleMemberEpochError.code == 113
    assert errors.UnknownMemberIdError.code == 25
    assert errors.GroupIdNotFoundError.code == 69
    assert errors.UnknownTopicIdError.code == 100
