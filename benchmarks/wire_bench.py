"""Header codec cost of a 1000-partition Fetch: the request as the broker decodes it and
the response as the broker encodes and the client decodes it, in microseconds (best of
several runs). Prints JSON.

``raw`` is the header as msgpack maps and lists (what handlers read before typed
messages); ``typed`` goes through client/wire/messages.py. Run with another checkout's
interpreter to compare: the typed rows are skipped where messages.py does not exist.
"""

from __future__ import annotations

import json
import timeit
from typing import Any

import msgpack

try:
    from rillet.client.wire import schemas
except ImportError:  # a checkout from before client/wire/
    from rillet.client import schemas  # type: ignore[no-redef]

PARTITIONS, TOPICS = 1000, 10
PER_TOPIC = PARTITIONS // TOPICS


def best_us(fn: Any, number: int = 300, repeat: int = 7) -> float:
    return round(min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6, 1)


def request_rows() -> list[list[Any]]:
    return [
        [f"topic-{t}", [[p, 1000 + p, 3, 3, 0, 1 << 20] for p in range(PER_TOPIC)]]
        for t in range(TOPICS)
    ]


def request_header() -> dict[str, Any]:
    return {
        "api": 1,
        "version": 0,
        "correlation_id": 7,
        "client_id": "bench",
        "replica_id": -1,
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 50 << 20,
        "topics": request_rows(),
    }


def result_row(p: int) -> list[Any]:
    return [p, 0, 5000, 5000, 0, None, -1, 4096]


def main() -> None:
    packed_request = msgpack.packb(request_header(), use_bin_type=True)

    def unpack() -> dict[str, Any]:
        return msgpack.unpackb(packed_request, raw=False, strict_map_key=False)

    def raw_request() -> None:
        schemas.validate_request(schemas.FETCH, 0, unpack())

    def raw_response() -> bytes:
        topics = [[f"topic-{t}", [result_row(p) for p in range(PER_TOPIC)]] for t in range(TOPICS)]
        header = {"throttle_time_ms": 0, "error_code": 0, "topics": topics}
        return msgpack.packb({"correlation_id": 7, **header}, use_bin_type=True)

    packed_response = raw_response()
    out: dict[str, Any] = {
        "partitions": PARTITIONS,
        "request_bytes": len(packed_request),
        "response_bytes": len(packed_response),
        "request_unpack_us": best_us(unpack),
        "request_unpack_validate_us": best_us(raw_request),
        "response_build_pack_raw_us": best_us(raw_response),
        "response_unpack_raw_us": best_us(
            lambda: msgpack.unpackb(packed_response, raw=False, strict_map_key=False)
        ),
    }
    try:
        from rillet.client.wire import messages as m
    except ImportError:
        print(json.dumps(out, indent=2))
        return

    def typed_request() -> m.FetchRequest:
        return schemas.decode_request(schemas.FETCH, 0, unpack())  # type: ignore[no-any-return]

    result = m.FetchPartitionResult

    def typed_response() -> bytes:
        topics = [
            m.FetchTopicResult(
                f"topic-{t}",
                [result(p, 0, 5000, 5000, 0, None, -1, 4096) for p in range(PER_TOPIC)],
            )
            for t in range(TOPICS)
        ]
        header = m.FetchResponse(topics).to_header()
        header["correlation_id"] = 7
        return msgpack.packb(header, use_bin_type=True)

    assert typed_response() == packed_response or len(typed_response()) == len(packed_response)
    out |= {
        "request_unpack_decode_typed_us": best_us(typed_request),
        "response_build_pack_typed_us": best_us(typed_response),
        "response_unpack_decode_typed_us": best_us(
            lambda: m.FetchResponse.from_header(
                msgpack.unpackb(packed_response, raw=False, strict_map_key=False)
            )
        ),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
