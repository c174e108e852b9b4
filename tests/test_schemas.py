"""API schemas: declarations, validation with precise paths, and the generated doc."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import msgpack
import pytest

from rillet.client.wire import messages, schemas
from rillet.client.wire.errors import InvalidRequestError, UnsupportedVersionError
from rillet.client.wire.schemas import INT, STR, Api, Array, F, Struct

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "protocol.md"
BEGIN, END = "<!-- BEGIN API TABLE (generated) -->", "<!-- END API TABLE -->"

# docs/architecture.md fixes these keys.
EXPECTED_KEYS = {
    "Produce": 0,
    "Fetch": 1,
    "ListOffsets": 2,
    "Metadata": 3,
    "ControlledShutdown": 7,
    "ApiVersions": 18,
    "CreateTopics": 19,
    "DeleteTopics": 20,
    "AlterPartition": 56,
    "DescribeCluster": 60,
    "BrokerRegistration": 62,
    "BrokerHeartbeat": 63,
    "FetchMetadata": 1001,
    "ElectLeaders": 43,
    "AlterPartitionReassignments": 45,
    "RaftMessage": 1004,
    "DescribeQuorum": 55,
    "AlterRemoteSegments": 1010,
    "DescribeLogDirs": 35,
    "DescribeConfigs": 32,
    "IncrementalAlterConfigs": 44,
    "OffsetCommit": 8,
    "OffsetFetch": 9,
    "FindCoordinator": 10,
    "ListGroups": 16,
    "DeleteGroups": 42,
    "OffsetDelete": 47,
    "ConsumerGroupHeartbeat": 68,
    "ConsumerGroupDescribe": 69,
}

# APIs declared ahead of the handler that will serve them; until then a broker answers
# them UNSUPPORTED_VERSION. A key leaves this set when a handler for it lands (the group
# APIs left it with the broker's group coordinator).
AWAITING_COORDINATOR: set[str] = set()


def produce_fields(**overrides: object) -> dict:
    fields = {"acks": -1, "timeout_ms": 1000, "topics": [["t", [[0, 10], [1, 20]]]]}
    return {**fields, **overrides}


def fetch_fields() -> dict:
    return {
        "replica_id": -1,
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [["t", [[0, 100, 3, 3, 0, 65536]]]],
    }


def test_every_documented_api_is_declared_with_its_key() -> None:
    assert {name: api.key for name, api in schemas.APIS_BY_NAME.items()} == EXPECTED_KEYS
    assert schemas.resolve(0) is schemas.resolve("Produce") is schemas.PRODUCE


def test_payload_flags() -> None:
    with_payload = {a.name for a in schemas.APIS.values() if a.request_payload}
    assert with_payload == {"Produce", "RaftMessage"}
    assert {a.name for a in schemas.APIS.values() if a.response_payload} == {
        "Fetch",
        "FetchMetadata",
    }


def test_field_names_are_unique_per_struct() -> None:
    def check(fields: tuple[F, ...]) -> None:
        names = [f.name for f in fields]
        assert len(names) == len(set(names)), names
        for f in fields:
            t = f.type
            while isinstance(t, schemas.Array | schemas.Opt):
                t = t.of
            if isinstance(t, Struct):
                check(t.fields)

    for api in schemas.APIS.values():
        check(api.request)
        check(api.response)


def test_valid_requests_pass_and_get_defaults() -> None:
    header = produce_fields()
    schemas.validate_request(schemas.PRODUCE, 0, header)
    assert header["transactional_id"] is None
    header = fetch_fields()
    schemas.validate_request(schemas.FETCH, 0, header)
    assert header["rack_id"] == "" and header["isolation_level"] == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"acks": "1"}, "acks: expected int, got str"),
        ({"acks": True}, "acks: expected int, got bool"),
        ({"topics": {}}, "topics: expected array, got dict"),
        ({"topics": [["t", [[0, "10"]]]]}, "topics[0].partitions[0].nbytes: expected int"),
        ({"topics": [["t", [[0]]]]}, "topics[0].partitions[0]: expected 2 items"),
        ({"topics": [[1, []]]}, "topics[0].topic: expected str, got int"),
        ({"topics": [["t", [[0, 1], None]]]}, "topics[0].partitions[1]: expected array"),
        ({"transactional_id": 5}, "transactional_id: expected str, got int"),
    ],
)
def test_invalid_requests_name_the_bad_value(change: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(f"Produce v0 request: {message}")):
        schemas.validate_request(schemas.PRODUCE, 0, produce_fields(**change))


def test_missing_required_field() -> None:
    header = produce_fields()
    del header["timeout_ms"]
    with pytest.raises(InvalidRequestError, match="timeout_ms: missing required field"):
        schemas.validate_request(schemas.PRODUCE, 0, header)


def test_unsupported_version() -> None:
    with pytest.raises(UnsupportedVersionError, match=r"Produce v7 is not supported \(v0-v0\)"):
        schemas.validate_request(schemas.PRODUCE, 7, produce_fields())


def test_newer_peers_extra_keys_and_trailing_items_are_accepted() -> None:
    header = produce_fields(future_key=1, topics=[["t", [[0, 10, "new"]], "extra"]])
    schemas.validate_request(schemas.PRODUCE, 0, header)  # raises if refused
    # Accepted as they are: validation neither strips nor rewrites what it does not know.
    assert header["future_key"] == 1
    assert header["topics"] == [["t", [[0, 10, "new"]], "extra"]]
    with pytest.raises(InvalidRequestError):  # while a known field of the wrong type is refused
        schemas.validate_request(schemas.PRODUCE, 0, produce_fields(topics=[["t", [[0, "x"]]]]))


def test_fields_added_in_a_later_version() -> None:
    item = Struct("Item", F("a", INT), F("b", STR, since=1))
    api = Api(9999, "Test", 0, 1, (F("xs", Array(item)), F("new", INT, since=1)), ())
    schemas.validate_request(api, 0, {"xs": [[1]]})
    with pytest.raises(InvalidRequestError, match=r"Test v1 request: xs\[0\]: expected 2 items"):
        schemas.validate_request(api, 1, {"xs": [[1]], "new": 1})
    with pytest.raises(InvalidRequestError, match="new: missing required field"):
        schemas.validate_request(api, 1, {"xs": [[1, "b"]]})
    assert [f.name for f in api.request_fields(0)] == ["xs"]


def test_response_validation_and_error_only_responses() -> None:
    fetch_response = {
        "throttle_time_ms": 0,
        "error_code": 0,
        "topics": [["t", [[0, 0, 10, 10, 0, [3, 7], -1, 100], [1, 6, -1, -1, -1, None, -1, 0]]]],
    }
    schemas.validate_response(schemas.FETCH, 0, fetch_response)
    schemas.validate_response(schemas.FETCH, 0, {"error_code": 42, "error_message": "bad"})
    fetch_response["topics"][0][1][0][5] = [3]
    with pytest.raises(InvalidRequestError, match=r"partitions\[0\].diverging_epoch: expected 2"):
        schemas.validate_response(schemas.FETCH, 0, fetch_response)


def test_declaring_a_header_key_as_a_field_is_refused() -> None:
    with pytest.raises(ValueError, match="clashes with a header key"):
        schemas.declare(9998, "Clash", (0, 0), [F("correlation_id", INT)], [])


def test_protocol_doc_api_table_is_up_to_date() -> None:
    text = DOC.read_text()
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert table.strip() == schemas.render_markdown().strip(), (
        "docs/protocol.md is stale: run `python -m rillet.client.wire.schemas` to regenerate it"
    )


def test_messages_module_is_up_to_date() -> None:
    assert (ROOT / "client" / "wire" / "messages.py").read_text() == schemas.render_messages(), (
        "client/wire/messages.py is stale: run `python -m rillet.client.wire.schemas`"
    )


def test_every_declared_api_is_served() -> None:
    # ApiVersions by every RpcServer; the rest by the broker or the controller.
    from rillet.broker.server import BrokerServer
    from rillet.controller.handlers import build_handlers

    served = {schemas.API_VERSIONS.key}
    served |= _served_keys(BrokerServer._handlers)
    served |= _served_keys(build_handlers)
    awaiting = {schemas.APIS_BY_NAME[name].key for name in AWAITING_COORDINATOR}
    assert not served & awaiting, "served now: drop it from AWAITING_COORDINATOR"
    unserved = set(schemas.APIS) - served - awaiting
    assert served | awaiting == set(schemas.APIS), {schemas.APIS[k].name for k in unserved}


def _served_keys(fn: object) -> set[int]:
    """The API constants a handler table names (read off its source: building the real
    tables needs a running node)."""
    import inspect

    source = inspect.getsource(fn)  # type: ignore[arg-type]
    return {
        api.key
        for name, api in vars(schemas).items()
        if isinstance(api, Api) and re.search(rf"schemas\.{name}\b", source)
    }


def test_a_request_decodes_to_its_typed_message_and_back() -> None:
    header = fetch_fields()
    request = messages.FetchRequest.from_header(header)
    assert request.replica_id == -1 and request.rack_id == ""  # default filled in
    partition = request.topics[0].partitions[0]
    assert isinstance(partition, messages.FetchPartition)
    assert (partition.fetch_offset, partition.partition_max_bytes) == (100, 65536)
    assert partition.topic_id == ""  # a row without the trailing defaulted field passes
    again = messages.FetchRequest.from_header(msgpack.unpackb(msgpack.packb(request.to_header())))
    assert again == request


def test_decoding_a_request_validates_it() -> None:
    with pytest.raises(InvalidRequestError, match=r"topics\[0\].partitions\[0\].nbytes"):
        messages.ProduceRequest.from_header(produce_fields(topics=[["t", [[0, "1"]]]]))


def test_rows_from_newer_and_older_peers_fit_their_class() -> None:
    response = messages.FetchResponse.from_header(
        {
            "topics": [
                ["t", [[0, 0, 10, 10, 0, [3, 7, "new"], -1, 100, "new"], [1, 6]]],
            ]
        }
    )
    newer, older = response.topics[0].partitions
    assert newer == messages.FetchPartitionResult(
        0, 0, 10, 10, 0, messages.EpochEndOffset(3, 7), -1, 100
    )
    assert older == messages.FetchPartitionResult(1, 6, 0, 0, 0, None, 0, 0)
    assert response.error_code == 0 and response.throttle_time_ms == 0


def test_an_error_only_response_decodes_with_defaults() -> None:
    answer = messages.ErrorResponse.from_header({"error_code": 41, "leader_id": 2})
    assert answer == messages.ErrorResponse(41, None, 2, "", -1)
    assert messages.CreateTopicsResponse.from_header({"error_code": 41}).topics == []


def test_a_stale_messages_module_is_refused_on_import() -> None:
    namespace = dict(vars(messages))

    class FetchPartition(NamedTuple):  # a field renamed in the table but not regenerated
        partition: int
        offset: int

    namespace["FetchPartition"] = FetchPartition
    with pytest.raises(schemas.StaleMessagesError, match="stale at FetchPartition"):
        schemas.bind(namespace)
