"""Hostile frames for fuzzing live nodes, derived from client/wire/schemas.py.

``hostile_request(rng)`` walks an API's declared request fields and fills each with a
value chosen to hurt: extreme and negative integers, huge counts, unknown and very long
topic names, enormous ``max_bytes`` and waits, NaN floats, and now and then a value of
the wrong type. ``malformed_frame(rng)`` breaks the framing itself (sizes, header sizes,
headers that are not maps, truncation). Both are plain ``random.Random`` driven, so a
seed replays a run, hypothesis can drive them through a seed, and the long fuzz run
(tests/test_fuzz_long.py) can make a million of them quickly.

Well-formed writes to cluster state (CreateTopics, DeleteTopics, reassignments, leader
elections, the brokers' registration, heartbeats, controlled shutdown and ISR changes,
and the group writes: offset commits and deletes, group deletes, and FindCoordinator,
which creates `__consumer_offsets`) are left out: the protocol has no authentication, so
they are operations any peer may do, with real effects on the cluster the fuzz run
measures (a heartbeat that guesses a broker's epoch may fence it), and their own limits
are checked where they are handled. They are still sent with wrongly typed fields, which
no handler may see.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import msgpack

from rillet.client.wire import records, schemas
from rillet.client.wire.framing import encode_frame_bytes

# Admin writes sent only with broken types (see the module docstring).
TYPE_ONLY_APIS = frozenset(
    api.key
    for api in (
        schemas.CREATE_TOPICS,
        schemas.DELETE_TOPICS,
        schemas.ALTER_PARTITION_REASSIGNMENTS,
        schemas.ELECT_LEADERS,
        schemas.BROKER_REGISTRATION,
        schemas.BROKER_HEARTBEAT,
        schemas.CONTROLLED_SHUTDOWN,
        schemas.ALTER_PARTITION,
        # Group writes: commits, deletes, and FindCoordinator, which creates the
        # 50-partition offsets topic on first use.
        schemas.FIND_COORDINATOR,
        schemas.OFFSET_COMMIT,
        schemas.DELETE_GROUPS,
        schemas.OFFSET_DELETE,
    )
)
INTS = [0, 1, -1, -2, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 2**64 - 1, 10**9, 1 << 40]
TOPICS = ["", "nope", "fuzz", "t", "x" * 300, "../etc", "\x00", "topic-\u00e9", "__metadata"]
BATCH = records.encode_batch([b"fuzz"])


def _wrong(rng: random.Random) -> Any:
    return rng.choice([None, True, 1.5, "s", b"b", [], {}, [[1]], {"k": "v"}, -1, 2**64 - 1])


def _count(rng: random.Random) -> int:
    """How many items an array gets: mostly a few, sometimes a huge count."""
    return rng.choice([0, 1, 1, 2, 3, 5]) if rng.random() < 0.97 else rng.choice([1000, 20_000])


def hostile_value(t: schemas.Type, rng: random.Random, depth: int = 0) -> Any:
    if rng.random() < 0.02:
        return _wrong(rng)
    if isinstance(t, schemas.Scalar):
        if t is schemas.INT:
            return rng.choice(INTS) if rng.random() < 0.7 else rng.randint(-5, 100)
        if t is schemas.STR:
            return rng.choice(TOPICS)
        if t is schemas.BOOL:
            return rng.random() < 0.5
        if t is schemas.BYTES:
            return rng.randbytes(rng.choice([0, 1, 16, 300]))
        return rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e308])
    if isinstance(t, schemas.Opt):
        return None if rng.random() < 0.3 else hostile_value(t.of, rng, depth)
    if isinstance(t, schemas.Array):
        count = _count(rng) if depth < 2 else rng.randint(0, 2)
        if isinstance(t.of, schemas.Scalar):  # a huge array of scalars is cheap: one value
            if count > 100 and t.of is schemas.STR and rng.random() < 0.5:
                # Distinct names: a node that de-duplicates still answers each of them.
                return [f"x{i}" for i in range(count)]
            one = hostile_value(t.of, rng, depth + 1)
            if count > 100 and isinstance(one, str | bytes):
                one = one[:8]  # a huge count, not a huge frame: those are sent apart
            return [one] * count
        return [hostile_value(t.of, rng, depth + 1) for _ in range(min(count, 50))]
    if isinstance(t, schemas.Map):
        keys = (hostile_value(t.key, rng, depth + 1) for _ in range(rng.randint(0, 3)))
        return {
            (k if isinstance(k, str | int | bytes | bool | None) else repr(k)): hostile_value(
                t.value, rng, depth + 1
            )
            for k in keys
        }
    assert isinstance(t, schemas.Struct)
    return [hostile_value(f.type, rng, depth + 1) for f in t.fields]


def hostile_request(
    rng: random.Random, apis: list[schemas.Api] | None = None, *, long_waits: bool = True
) -> bytes:
    """A well-framed request of a real API whose fields are hostile; ``long_waits=False``
    keeps long-poll waits short (a test that reads every answer)."""
    api = rng.choice(apis or list(schemas.APIS.values()))
    version = api.max_version if rng.random() < 0.95 else rng.choice([-1, api.max_version + 1])
    header: dict[str, Any] = {
        "api": api.key,
        "version": version,
        "correlation_id": rng.randint(0, 2**31 - 1),
        "client_id": "fuzz",
    }
    for f in api.request:
        if rng.random() < 0.05:
            continue  # missing: a default, or INVALID_REQUEST
        header[f.name] = hostile_value(f.type, rng)
    if api.key in TYPE_ONLY_APIS:
        if api.request:
            header[rng.choice(api.request).name] = _wrong(rng)
        if not _wrongly_typed(api, header):
            header["version"] = "broken"  # the wrong value fit after all: no handler may run
    if api.key == schemas.FETCH.key:  # mostly short waits; a rare one waits "forever"
        forever = long_waits and rng.random() < 0.01
        header["max_wait_ms"] = 2**31 - 1 if forever else rng.choice([0, 0, 10, 100])
    payload = b""
    if api.request_payload:
        payload = rng.choice([b"", BATCH, rng.randbytes(rng.choice([1, 61, 200])), BATCH * 3])
    return encode_frame_bytes(header, payload)


def _wrongly_typed(api: schemas.Api, header: dict[str, Any]) -> bool:
    try:
        schemas.validate_request(api, api.max_version, header)
    except Exception:
        return True
    return False


def malformed_frame(rng: random.Random, max_request_bytes: int) -> bytes:
    """Bytes that break the framing: each closes the connection that sends it."""
    kind = rng.randrange(6)
    good = hostile_request(rng)
    if kind == 0:  # a size over the limit
        return struct.pack(">I", rng.choice([max_request_bytes + 1, 2**32 - 1])) + good[4:]
    if kind == 1:  # a size below the prefix
        return struct.pack(">I", rng.randint(0, 3)) + good[4:]
    if kind == 2:  # header_size past the frame
        return good[:4] + struct.pack(">I", rng.randint(len(good), 2**32 - 1)) + good[8:]
    if kind == 3:  # a header that is not a map, or not msgpack at all
        body = (
            msgpack.packb(rng.choice([[1, 2], 7, "s", None]))
            if rng.random() < 0.5
            else (rng.randbytes(rng.randint(1, 40)))
        )
        return struct.pack(">II", 4 + len(body), len(body)) + body
    if kind == 4:  # a header without an integer api or correlation_id
        body = msgpack.packb({"api": "x", "correlation_id": None})
        return struct.pack(">II", 4 + len(body), len(body)) + body
    return good[: rng.randint(1, len(good) - 1)]  # truncated: the sender then goes away
