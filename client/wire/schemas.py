"""Every API of the wire protocol, declared once, as data.

An API has a key, a name, a version range, the fields of its request and of its
response, and whether either carries a raw payload. Field types are small objects:

- scalars ``INT``, ``STR``, ``BOOL``, ``BYTES``, ``FLOAT``;
- ``Array(T)`` a msgpack array of T; ``Map(K, V)`` a msgpack map;
- ``Opt(T)`` T or nil;
- ``Struct(F(...), ...)`` a msgpack array whose positions are named fields, so
  ``[[topic, [[partition, nbytes], ...]], ...]`` is
  ``Array(Struct(F("topic", STR), F("partitions", Array(Struct(...)))))``.
  Positional structs keep headers small and quick to pack, as Kafka's arrays do.

Versions: a field lives from ``since`` onwards, so adding a field is one line
(``F("rack_id", STR, since=1, default="")``) and adding a version is bumping the API's
``max_version``. A struct item may carry extra trailing positions (a newer peer's
fields) and a header may carry unknown keys: both are ignored, so old readers accept
newer writers. A missing field with a default gets the default written into the header,
so handlers can index every declared field.

Validation compiles each (API, version, direction) once into nested closures and
raises ``InvalidRequestError`` naming the path of the first bad value, e.g.
``Produce v0 request: topics[1][1][0].nbytes: expected int, got str``.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

from rillet.client.wire.errors import InvalidRequestError, UnsupportedVersionError

# Header keys the framing layer owns; no API may declare a field with these names.
REQUEST_HEADER_KEYS = ("api", "version", "correlation_id", "client_id")
RESPONSE_HEADER_KEYS = ("correlation_id",)

Checker = Callable[[Any], None]
_chain = chain.from_iterable
_LIST_TYPE = {list}


class _Mismatch(Exception):
    """A value did not fit; ``path`` is built while the exception unwinds."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []


def _type_name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


class Type:
    """Base of field types. ``checker(version)`` returns a fast validation closure."""

    __slots__ = ()

    def checker(self, version: int) -> Checker:
        raise NotImplementedError

    def render(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Scalar(Type):
    name: str
    python_types: tuple[type, ...]

    def checker(self, version: int) -> Checker:
        # `type(v) in ...` rather than isinstance: bool is an int subclass and must not pass.
        allowed, name = self.python_types, self.name

        def check(value: Any) -> None:
            if type(value) not in allowed:
                raise _Mismatch(f"expected {name}, got {_type_name(value)}")

        return check

    def render(self) -> str:
        return self.name


INT = Scalar("int", (int,))
STR = Scalar("str", (str,))
BOOL = Scalar("bool", (bool,))
BYTES = Scalar("bytes", (bytes,))
FLOAT = Scalar("float", (float, int))


@dataclass(frozen=True, slots=True)
class Opt(Type):
    of: Type

    def checker(self, version: int) -> Checker:
        inner = self.of.checker(version)

        def check(value: Any) -> None:
            if value is not None:
                inner(value)

        return check

    def render(self) -> str:
        return f"{self.of.render()}?"


@dataclass(frozen=True, slots=True)
class Array(Type):
    of: Type

    def checker(self, version: int) -> Checker:
        if isinstance(self.of, Scalar):
            return self._scalar_checker()
        inner = self.of.checker(version)

        def check(value: Any) -> None:
            if type(value) is not list:
                raise _Mismatch(f"expected array, got {_type_name(value)}")
            for i, item in enumerate(value):
                try:
                    inner(item)
                except _Mismatch as e:
                    e.path.append(f"[{i}]")
                    raise

        flat = self._flat_struct_types(version)
        return check if flat is None else self._flat_struct_checker(flat, check)

    def _flat_struct_types(self, version: int) -> tuple[type, ...] | None:
        """The field types of a struct of plain scalars (e.g. Fetch partitions), else None."""
        if not isinstance(self.of, Struct):
            return None
        live = [f.type for f in self.of.fields if f.since <= version]
        if not all(isinstance(t, Scalar) and len(t.python_types) == 1 for t in live):
            return None
        return tuple(t.python_types[0] for t in live)  # type: ignore[attr-defined]

    @staticmethod
    def _flat_struct_checker(types: tuple[type, ...], slow: Checker) -> Checker:
        # Arrays of [int, int, ...] structs are the bulk of Produce and Fetch headers. Check
        # them in C: every item a list of the right length, then the types of all values
        # flattened in one tuple compare. Anything unusual (extra trailing fields from a
        # newer peer, or an error to report with its path) takes the per-item path. Measured:
        # a 1000-partition Fetch request header validates in ~130us this way, ~500us item by
        # item; msgpack-unpacking that header takes ~90us.
        count = len(types)

        def check(value: Any) -> None:
            if (
                type(value) is list
                and set(map(type, value)) <= _LIST_TYPE
                and set(map(len, value)) <= {count}
                and tuple(map(type, _chain(value))) == types * len(value)
            ):
                return
            slow(value)

        return check

    def _scalar_checker(self) -> Checker:
        # Arrays of ints (replica lists, ISRs) are common: one C-level pass over the types.
        assert isinstance(self.of, Scalar)
        allowed, name = frozenset(self.of.python_types), self.of.name

        def check(value: Any) -> None:
            if type(value) is not list:
                raise _Mismatch(f"expected array, got {_type_name(value)}")
            if not allowed.issuperset(map(type, value)):
                i = next(i for i, v in enumerate(value) if type(v) not in allowed)
                e = _Mismatch(f"expected {name}, got {_type_name(value[i])}")
                e.path.append(f"[{i}]")
                raise e

        return check

    def render(self) -> str:
        return f"[{self.of.render()}]"


@dataclass(frozen=True, slots=True)
class Map(Type):
    key: Type
    value: Type

    def checker(self, version: int) -> Checker:
        check_key, check_value = self.key.checker(version), self.value.checker(version)

        def check(value: Any) -> None:
            if type(value) is not dict:
                raise _Mismatch(f"expected map, got {_type_name(value)}")
            for k, v in value.items():
                try:
                    check_key(k)
                    check_value(v)
                except _Mismatch as e:
                    e.path.append(f"[{k!r}]")
                    raise

        return check

    def render(self) -> str:
        return f"{{{self.key.render()}: {self.value.render()}}}"


_REQUIRED: Any = object()


@dataclass(frozen=True, slots=True)
class F:
    """A field: a name, a type, the first version holding it, and maybe a default."""

    name: str
    type: Type
    since: int = 0
    default: Any = _REQUIRED
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def fill(self) -> Any:
        """The value of this field when a peer did not send it: its default, else its
        type's zero (Kafka's rule for fields a version does not hold)."""
        return _zero(self.type) if self.default is _REQUIRED else self.default


def _zero(t: Type) -> Any:
    if isinstance(t, Scalar):
        return t.python_types[0]()
    if isinstance(t, Array):
        return []
    if isinstance(t, Map):
        return {}
    return None  # Opt, and a missing struct


Converter = Callable[[Any], Any]
_new = tuple.__new__


class Struct(Type):
    """A msgpack array with named positions (fields may only be appended over versions).

    ``name`` is the name of its typed class in client/wire/messages.py (a NamedTuple, so
    msgpack packs it as the array it is on the wire, at no cost).
    """

    __slots__ = ("name", "fields", "cls")

    def __init__(self, name: str, *fields: F) -> None:
        self.name = name
        self.fields = fields
        self.cls: type | None = None  # bound by messages.py

    def checker(self, version: int) -> Checker:
        live = [f for f in self.fields if f.since <= version]
        names = [f.name for f in live]
        checks = [f.type.checker(version) for f in live]
        count = len(live)
        # Trailing fields with a default may be missing (an older peer's row): the
        # converter fills them in.
        needed = max((i + 1 for i, f in enumerate(live) if f.required), default=0)

        def check(value: Any) -> None:
            if type(value) is not list:
                raise _Mismatch(f"expected array [{', '.join(names)}], got {_type_name(value)}")
            if len(value) < needed:
                raise _Mismatch(f"expected {count} items [{', '.join(names)}], got {len(value)}")
            for i in range(min(count, len(value))):
                try:
                    checks[i](value[i])
                except _Mismatch as e:
                    e.path.append(f".{names[i]}")
                    raise

        return check

    def converter(self, version: int) -> Converter:
        """Array -> this struct's class: extra trailing items (a newer peer's) dropped,
        missing ones (an older peer's, or a field this version lacks) filled in."""
        cls, fields, count = self.cls, self.fields, len(self.fields)
        assert cls is not None, f"{self.name}: messages.py is not imported"
        inner = [(i, c) for i, f in enumerate(fields) if (c := _converter(f.type, version))]

        def fit(value: Any) -> list[Any]:
            row = list(value[:count])
            row += [f.fill() for f in fields[len(row) :]]
            return row

        if not inner:

            def convert(value: Any) -> Any:
                return _new(cls, value) if len(value) == count else _new(cls, fit(value))

            return convert

        def convert_nested(value: Any) -> Any:
            row = value if len(value) == count and type(value) is list else fit(value)
            for i, c in inner:
                row[i] = c(row[i])
            return _new(cls, row)

        return convert_nested

    def render(self) -> str:
        fields = ", ".join(f"{f.name}: {f.type.render()}" for f in self.fields)
        return f"{self.name}[{fields}]"

    def __repr__(self) -> str:
        return f"Struct {self.render()}"


def _converter(t: Type, version: int) -> Converter | None:
    """What turns a decoded value of ``t`` into its typed form; None when nothing does
    (no struct inside)."""
    if isinstance(t, Struct):
        return t.converter(version)
    if isinstance(t, Opt):
        inner = _converter(t.of, version)
        if inner is None:
            return None
        return lambda value: None if value is None else inner(value)
    if isinstance(t, Array):
        item = _converter(t.of, version)
        if item is None:
            return None
        if isinstance(t.of, Struct):
            return _struct_array_converter(t.of, item, version)
        return lambda value: list(map(item, value))
    if isinstance(t, Map):
        conv = _converter(t.value, version)
        if conv is None:
            return None
        return lambda value: {k: conv(v) for k, v in value.items()}
    return None


def _struct_array_converter(struct: Struct, item: Converter, version: int) -> Converter:
    # The bulk of Produce and Fetch headers: every row becomes its class in C, one C-level
    # pass over the lengths finds a row that needs fitting, and one per optional nested
    # struct (Fetch's diverging_epoch) finds a row that holds one; only such arrays take
    # the row-by-row path. Measured on a 1000-partition Fetch response: ~130us this way,
    # ~400us row by row.
    cls, count = struct.cls, len(struct.fields)
    nested = [i for i, f in enumerate(struct.fields) if _converter(f.type, version)]
    if not all(isinstance(struct.fields[i].type, Opt) for i in nested):
        return lambda value: list(map(item, value))
    getters = [itemgetter(i) for i in nested]

    def convert(value: Any) -> list[Any]:
        rows = list(map(_new, repeat(cls), value))
        if set(map(len, rows)) <= {count} and all(
            list(map(get, rows)).count(None) == len(rows) for get in getters
        ):
            return rows
        return list(map(item, value))

    return convert


# --- APIs ------------------------------------------------------------------------------

SCOPE_CLIENT = "client"
SCOPE_CLUSTER = "inter-broker / controller"
SCOPE_RAFT = "raft"


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    request: tuple[F, ...]
    response: tuple[F, ...]
    request_payload: bool = False
    response_payload: bool = False
    scope: str = SCOPE_CLIENT
    doc: str = ""
    _compiled: dict = field(default_factory=dict, compare=False, repr=False)

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def request_fields(self, version: int) -> tuple[F, ...]:
        return tuple(f for f in self.request if f.since <= version)

    def response_fields(self, version: int) -> tuple[F, ...]:
        return tuple(f for f in self.response if f.since <= version)

    @property
    def request_class(self) -> str:
        return f"{self.name}Request"

    @property
    def response_class(self) -> str:
        return f"{self.name}Response"


APIS: dict[int, Api] = {}
APIS_BY_NAME: dict[str, Api] = {}


def declare(
    key: int,
    name: str,
    versions: tuple[int, int],
    request: list[F],
    response: list[F],
    *,
    payload: str = "",
    scope: str = SCOPE_CLIENT,
    doc: str = "",
) -> Api:
    """Register an API. ``payload`` is "", "request", "response" or "both"."""
    if key in APIS or name in APIS_BY_NAME:
        raise ValueError(f"API {key} {name} declared twice")
    for f in request:
        if f.name in REQUEST_HEADER_KEYS:
            raise ValueError(f"{name}: request field {f.name!r} clashes with a header key")
    for f in response:
        if f.name in RESPONSE_HEADER_KEYS:
            raise ValueError(f"{name}: response field {f.name!r} clashes with a header key")
    api = Api(
        key,
        name,
        versions[0],
        versions[1],
        tuple(request),
        tuple(response),
        request_payload=payload in ("request", "both"),
        response_payload=payload in ("response", "both"),
        scope=scope,
        doc=doc,
    )
    APIS[key] = api
    APIS_BY_NAME[name] = api
    return api


def resolve(api: Api | int | str) -> Api:
    """An Api from itself, its key or its name (KeyError if unknown)."""
    if isinstance(api, Api):
        return api
    if isinstance(api, int):
        return APIS[api]
    return APIS_BY_NAME[api]


def _field_validator(fields: tuple[F, ...], version: int) -> Callable[[dict], None]:
    live = [(f.name, f.type.checker(version), f.default) for f in fields if f.since <= version]

    def validate(header: dict) -> None:
        for name, check, default in live:
            try:
                value = header[name]
            except KeyError:
                if default is _REQUIRED:
                    e = _Mismatch("missing required field")
                    e.path.append(name)
                    raise e from None
                header[name] = default
                continue
            try:
                check(value)
            except _Mismatch as e:
                e.path.append(name)
                raise

    return validate


def _validator(api: Api, version: int, direction: str) -> Callable[[dict], None]:
    try:
        return api._compiled[version, direction]
    except KeyError:
        fields = api.request if direction == "request" else api.response
        fn = api._compiled[version, direction] = _field_validator(fields, version)
        return fn


def check_version(api: Api, version: int) -> None:
    if not api.supports(version):
        raise UnsupportedVersionError(
            f"{api.name} v{version} is not supported (v{api.min_version}-v{api.max_version})"
        )


def validate_request(api: Api, version: int, header: dict) -> None:
    """Check a decoded request header against the schema; fill in defaults.

    Raises UnsupportedVersionError or InvalidRequestError (naming the bad value's path).
    """
    check_version(api, version)
    _validate(api, version, "request", header)


def validate_response(api: Api, version: int, header: dict) -> None:
    """Check a response header (tests and debug mode; the hot path does not need it).

    A request-level error response (non-zero ``error_code`` and nothing else) passes.
    """
    if header.get("error_code", 0) != 0 and not any(
        f.name in header for f in api.response if f.name not in ("error_code", "error_message")
    ):
        return
    _validate(api, version, "response", header)


def _validate(api: Api, version: int, direction: str, header: dict) -> None:
    try:
        _validator(api, version, direction)(header)
    except _Mismatch as e:
        path = "".join(reversed(e.path))
        raise InvalidRequestError(
            f"{api.name} v{version} {direction}: {path}: {e.message}"
        ) from None


# --- Typed messages ---------------------------------------------------------------------
# client/wire/messages.py holds one NamedTuple per struct and per request and response,
# generated from the declarations below (``render_messages``) and bound back to them when
# it is imported (``bind``), which also checks that it is not stale. A header is a map, so
# a message class lists its required fields first (a NamedTuple's defaults come last);
# a struct keeps its wire order.

REQUEST, RESPONSE = "request", "response"


@dataclass(frozen=True, slots=True)
class Message:
    """One generated request or response class."""

    name: str
    fields: tuple[F, ...]  # in class order
    api: Api | None  # None for ErrorResponse
    direction: str
    doc: str = ""


def _class_order(fields: tuple[F, ...]) -> tuple[F, ...]:
    return tuple(f for f in fields if f.required) + tuple(f for f in fields if not f.required)


def message_specs() -> list[Message]:
    """Every message class, in generation order (each response before its request)."""
    specs = [Message("ErrorResponse", _class_order(ERROR_RESPONSE), None, RESPONSE)]
    for api in sorted(APIS.values(), key=lambda a: a.key):
        specs.append(Message(api.response_class, _class_order(api.response), api, RESPONSE))
        specs.append(Message(api.request_class, _class_order(api.request), api, REQUEST, api.doc))
    return specs


def struct_specs() -> list[Struct]:
    """Every struct, inner ones before the structs holding them (ValueError on a name
    two different structs share)."""
    out: dict[str, Struct] = {}

    def walk(t: Type) -> None:
        if isinstance(t, Opt | Array):
            walk(t.of)
        elif isinstance(t, Map):
            walk(t.key)
            walk(t.value)
        elif isinstance(t, Struct):
            for f in t.fields:
                walk(f.type)
            seen = out.setdefault(t.name, t)
            if seen is not t and seen.render() != t.render():
                raise ValueError(f"two different structs are named {t.name}")

    for spec in message_specs():
        for f in spec.fields:
            walk(f.type)
    return list(out.values())


_BOUND: dict[type, Message] = {}
_CLASSES: dict[tuple[int, str], type] = {}  # (api key, direction) -> class
_DECODERS: dict[tuple[type, int], Callable[[dict], Any]] = {}


class StaleMessagesError(ImportError):
    """client/wire/messages.py does not match the declarations."""


def bind(namespace: dict[str, Any]) -> None:
    """Attach messages.py's classes to the declarations, checking every field name, order
    and default (messages.py calls this as it is imported)."""

    def check(name: str, fields: tuple[F, ...]) -> type:
        cls = namespace.get(name)
        defaults = {f.name: f.default for f in fields if not f.required}
        if (
            cls is None
            or getattr(cls, "_fields", None) != tuple(f.name for f in fields)
            or cls._field_defaults != defaults
        ):
            raise StaleMessagesError(
                f"client/wire/messages.py is stale at {name}: "
                "run `python -m rillet.client.wire.schemas` to regenerate it"
            )
        return cls

    for struct in struct_specs():
        # A struct's optional fields are positional too: only trailing ones may default.
        struct.cls = check(struct.name, tuple(struct.fields))
    for spec in message_specs():
        cls = check(spec.name, spec.fields)
        _BOUND[cls] = spec
        if spec.api is not None:
            _CLASSES[spec.api.key, spec.direction] = cls
    _DECODERS.clear()


def api_of(message: Any) -> Api:
    """The API a request message belongs to (KeyError for anything else)."""
    spec = _BOUND[type(message)]
    assert spec.api is not None and spec.direction == REQUEST, spec.name
    return spec.api


def message_class(api: Api, direction: str) -> type:
    return _CLASSES[api.key, direction]


def decode(cls: type, header: dict[str, Any], version: int = 0) -> Any:
    """A header map as its typed message. A request is validated first (as
    ``validate_request``, InvalidRequestError naming the bad path); a response is trusted
    (it comes from the server the client chose): fields it lacks get their default or
    zero, so an error-only answer decodes too."""
    try:
        decoder = _DECODERS[cls, version]
    except KeyError:
        decoder = _DECODERS[cls, version] = _compile_decoder(_BOUND[cls], cls, version)
    return decoder(header)


def decode_request(api: Api, version: int, header: dict[str, Any]) -> Any:
    """``validate_request`` and the typed request in one call (the server's path)."""
    return decode(_CLASSES[api.key, REQUEST], header, version)


def decode_response(api: Api, version: int, header: dict[str, Any]) -> Any:
    return decode(_CLASSES[api.key, RESPONSE], header, version)


def _compile_decoder(spec: Message, cls: type, version: int) -> Callable[[dict], Any]:
    plan = [(f.name, _converter(f.type, version), f) for f in spec.fields]
    missing: Any = object()

    def convert(header: dict[str, Any]) -> Any:
        values = []
        for name, conv, f in plan:
            value = header.get(name, missing)
            if value is missing:
                value = f.fill()
            elif conv is not None:
                value = conv(value)
            values.append(value)
        return _new(cls, values)

    if spec.direction == RESPONSE or spec.api is None:
        return convert
    api = spec.api

    def validate_and_convert(header: dict[str, Any]) -> Any:
        validate_request(api, version, header)
        return convert(header)

    return validate_and_convert


# --- Declarations ----------------------------------------------------------------------
# Kafka's names and numbers where Kafka has the API. -1 means "none" for ids and epochs.
# Defaults must be immutable (they are shared between requests). Every struct is named:
# the name is its class in client/wire/messages.py.

ERROR_CODE = F("error_code", INT, default=0)
ERROR_MESSAGE = F("error_message", Opt(STR), default=None)
THROTTLE = F("throttle_time_ms", INT, default=0)
INT_LIST = Array(INT)
STR_MAP = Map(STR, STR)
EPOCH_END = Struct("EpochEndOffset", F("epoch", INT), F("end_offset", INT))

# What any request may be answered with instead of its response: a request-level error.
# NOT_CONTROLLER also says where the active controller is, when known.
ERROR_RESPONSE = (
    ERROR_CODE,
    ERROR_MESSAGE,
    F("leader_id", INT, default=-1, doc="NOT_CONTROLLER: the active controller"),
    F("leader_host", STR, default=""),
    F("leader_port", INT, default=-1),
)

PRODUCE_PARTITION = Struct("ProducePartition", F("partition", INT), F("nbytes", INT))
PRODUCE_RESULT = Struct(
    "ProducePartitionResult",
    F("partition", INT),
    F("error_code", INT),
    F("base_offset", INT),
    F("log_append_time", INT),
    F("log_start_offset", INT),
    F("error_message", Opt(STR)),
)
PRODUCE = declare(
    0,
    "Produce",
    (0, 0),
    request=[
        F("acks", INT, doc="0: no response, 1: leader append, -1: all in-sync replicas"),
        F("timeout_ms", INT),
        F("transactional_id", Opt(STR), default=None),
        F(
            "topics",
            Array(
                Struct("ProduceTopic", F("topic", STR), F("partitions", Array(PRODUCE_PARTITION)))
            ),
        ),
    ],
    response=[
        F(
            "topics",
            Array(
                Struct(
                    "ProduceTopicResult", F("topic", STR), F("partitions", Array(PRODUCE_RESULT))
                )
            ),
        ),
        THROTTLE,
        ERROR_CODE,
    ],
    payload="request",
    doc="Append batches; the payload is each partition's batches back to back, in order.",
)

FETCH_PARTITION = Struct(
    "FetchPartition",
    F("partition", INT),
    F("fetch_offset", INT),
    F("last_fetched_epoch", INT),
    F("current_leader_epoch", INT),
    F("log_start_offset", INT),
    F("partition_max_bytes", INT),
    F("topic_id", STR, default="", doc="a follower's: its replica's topic id (KIP-516)"),
)
FETCH_RESULT = Struct(
    "FetchPartitionResult",
    F("partition", INT),
    F("error_code", INT),
    F("high_watermark", INT),
    F("last_stable_offset", INT),
    F("log_start_offset", INT, doc="the first offset in either tier (local or remote)"),
    F("diverging_epoch", Opt(EPOCH_END)),
    F("preferred_read_replica", INT),
    F("nbytes", INT),
)
FETCH = declare(
    1,
    "Fetch",
    (0, 0),
    request=[
        F("replica_id", INT, doc="-1 for consumers, the broker id for followers"),
        F("replica_epoch", INT, default=-1, doc="the follower's broker epoch"),
        F("max_wait_ms", INT),
        F("min_bytes", INT),
        F("max_bytes", INT),
        F("isolation_level", INT, default=0),
        F(
            "topics",
            Array(Struct("FetchTopic", F("topic", STR), F("partitions", Array(FETCH_PARTITION)))),
        ),
        F("rack_id", STR, default=""),
        F(
            "session_id",
            INT,
            default=0,
            doc="the fetch session (KIP-227); 0: none, or ask for one (epoch 0)",
        ),
        F(
            "session_epoch",
            INT,
            default=-1,
            doc="0: full fetch opening a session; n > 0: the n-th incremental fetch, listing "
            "only changed partitions; -1: no session (full fetch; closes session_id)",
        ),
        F(
            "forgotten",
            Array(Struct("ForgottenTopic", F("topic", STR), F("partitions", Array(INT)))),
            default=[],
            doc="incremental: partitions to drop from the session",
        ),
    ],
    response=[
        THROTTLE,
        ERROR_CODE,
        F(
            "topics",
            Array(
                Struct("FetchTopicResult", F("topic", STR), F("partitions", Array(FETCH_RESULT)))
            ),
        ),
        F("session_id", INT, default=0, doc="the session this fetch opened or used; 0: none"),
    ],
    payload="response",
    doc="Read batches; the payload is each partition's `nbytes` of batches, in order.",
)

LIST_OFFSETS_PARTITION = Struct(
    "ListOffsetsPartition",
    F("partition", INT),
    F("current_leader_epoch", INT),
    F(
        "timestamp",
        INT,
        doc="-1 latest, -2 earliest (the remote log start when the tier holds older records), "
        "-4 earliest local (the local log start), else a timestamp in ms",
    ),
)
LIST_OFFSETS_RESULT = Struct(
    "ListOffsetsPartitionResult",
    F("partition", INT),
    F("error_code", INT),
    F("timestamp", INT),
    F("offset", INT),
    F("leader_epoch", INT),
)
LIST_OFFSETS = declare(
    2,
    "ListOffsets",
    (0, 0),
    request=[
        F("replica_id", INT, default=-1),
        F("isolation_level", INT, default=0),
        F(
            "topics",
            Array(
                Struct(
                    "ListOffsetsTopic",
                    F("topic", STR),
                    F("partitions", Array(LIST_OFFSETS_PARTITION)),
                )
            ),
        ),
    ],
    response=[
        THROTTLE,
        F(
            "topics",
            Array(
                Struct(
                    "ListOffsetsTopicResult",
                    F("topic", STR),
                    F("partitions", Array(LIST_OFFSETS_RESULT)),
                )
            ),
        ),
    ],
)

METADATA_BROKER = Struct(
    "MetadataBroker", F("node_id", INT), F("host", STR), F("port", INT), F("rack", Opt(STR))
)
METADATA_PARTITION = Struct(
    "MetadataPartition",
    F("error_code", INT),
    F("partition", INT),
    F("leader_id", INT),
    F("leader_epoch", INT),
    F("replicas", INT_LIST),
    F("isr", INT_LIST),
    F("offline_replicas", INT_LIST),
)
METADATA_TOPIC = Struct(
    "MetadataTopic",
    F("error_code", INT),
    F("name", STR),
    F("is_internal", BOOL),
    F("partitions", Array(METADATA_PARTITION)),
    F("topic_id", STR, default="", doc="KIP-516; consumer groups name topics by id"),
)
METADATA = declare(
    3,
    "Metadata",
    (0, 0),
    request=[
        F("topics", Opt(Array(STR)), doc="nil for all topics"),
        F("allow_auto_topic_creation", BOOL, default=False),
    ],
    response=[
        THROTTLE,
        F("cluster_id", Opt(STR)),
        F("controller_id", INT),
        F("brokers", Array(METADATA_BROKER)),
        F("topics", Array(METADATA_TOPIC)),
    ],
)

CONTROLLED_SHUTDOWN = declare(
    7,
    "ControlledShutdown",
    (0, 0),
    request=[F("broker_id", INT), F("broker_epoch", INT)],
    response=[
        ERROR_CODE,
        F(
            "remaining_partitions",
            Array(Struct("RemainingPartition", F("topic", STR), F("partition", INT))),
        ),
    ],
    scope=SCOPE_CLUSTER,
)

API_VERSIONS = declare(
    18,
    "ApiVersions",
    (0, 0),
    request=[
        F("client_software_name", STR, default=""),
        F("client_software_version", STR, default=""),
    ],
    response=[
        ERROR_CODE,
        F(
            "api_keys",
            Array(
                Struct(
                    "ApiVersionRange",
                    F("api_key", INT),
                    F("min_version", INT),
                    F("max_version", INT),
                )
            ),
        ),
        THROTTLE,
    ],
    doc="Built into every RpcServer: the APIs and versions this node serves.",
)

CREATABLE_TOPIC = Struct(
    "CreatableTopic",
    F("name", STR),
    F("num_partitions", INT, doc="-1: the broker default"),
    F("replication_factor", INT, doc="-1: the broker default"),
    F(
        "assignments",
        Array(Struct("ReplicaAssignment", F("partition", INT), F("broker_ids", INT_LIST))),
    ),
    F("configs", STR_MAP),
)
CREATE_TOPICS = declare(
    19,
    "CreateTopics",
    (0, 0),
    request=[
        F("topics", Array(CREATABLE_TOPIC)),
        F("timeout_ms", INT),
        F("validate_only", BOOL, default=False),
    ],
    response=[
        THROTTLE,
        F(
            "topics",
            Array(
                Struct(
                    "CreatableTopicResult",
                    F("name", STR),
                    F("error_code", INT),
                    F("error_message", Opt(STR)),
                    F("num_partitions", INT),
                    F("replication_factor", INT),
                )
            ),
        ),
    ],
)

DELETE_TOPICS = declare(
    20,
    "DeleteTopics",
    (0, 0),
    request=[F("topic_names", Array(STR)), F("timeout_ms", INT)],
    response=[
        THROTTLE,
        F(
            "responses",
            Array(
                Struct(
                    "DeletableTopicResult",
                    F("name", STR),
                    F("error_code", INT),
                    F("error_message", Opt(STR)),
                )
            ),
        ),
    ],
)

ISR_PROPOSAL = Struct(
    "IsrProposal",
    F("partition", INT),
    F("leader_epoch", INT),
    F("new_isr", INT_LIST),
    F("partition_epoch", INT),
)
ISR_RESULT = Struct(
    "IsrResult",
    F("partition", INT),
    F("error_code", INT),
    F("leader_id", INT),
    F("leader_epoch", INT),
    F("isr", INT_LIST),
    F("partition_epoch", INT),
)
ALTER_PARTITION = declare(
    56,
    "AlterPartition",
    (0, 0),
    request=[
        F("broker_id", INT),
        F("broker_epoch", INT),
        F(
            "topics",
            Array(
                Struct("AlterPartitionTopic", F("topic", STR), F("partitions", Array(ISR_PROPOSAL)))
            ),
        ),
    ],
    response=[
        THROTTLE,
        ERROR_CODE,
        F(
            "topics",
            Array(
                Struct(
                    "AlterPartitionTopicResult", F("topic", STR), F("partitions", Array(ISR_RESULT))
                )
            ),
        ),
    ],
    scope=SCOPE_CLUSTER,
)

REMOTE_SEGMENT_STATE = Struct(
    "RemoteSegmentState",
    F("topic_id", STR),
    F("partition", INT),
    F("segment_id", STR),
    F("start_offset", INT),
    F("end_offset", INT),
    F("state", INT, doc="0 COPY_STARTED, 1 COPY_FINISHED, 2 DELETE_STARTED, 3 DELETE_FINISHED"),
    F("leader_epoch", INT, doc="the proposer's leader epoch of the partition"),
    F("size_bytes", INT),
    F("max_timestamp_ms", INT),
    F(
        "leader_epochs",
        Array(Struct("EpochStart", F("epoch", INT), F("start_offset", INT))),
        doc="the leader-epoch entries the segment covers",
    ),
)
ALTER_REMOTE_SEGMENTS = declare(
    1010,
    "AlterRemoteSegments",
    (0, 0),
    request=[
        F("broker_id", INT),
        F("broker_epoch", INT),
        F("segments", Array(REMOTE_SEGMENT_STATE)),
    ],
    response=[
        THROTTLE,
        ERROR_CODE,
        F(
            "results",
            Array(
                Struct(
                    "RemoteSegmentResult",
                    F("segment_id", STR),
                    F("error_code", INT),
                    F("error_message", Opt(STR)),
                )
            ),
            doc="one per segment, in the request's order",
        ),
    ],
    scope=SCOPE_CLUSTER,
    doc="A partition leader records remote (tiered) segment state changes in the "
    "metadata log (docs/tiered.md); answered once the records are committed.",
)

DESCRIBE_CLUSTER_BROKER = Struct(
    "DescribeClusterBroker",
    F("broker_id", INT),
    F("host", STR),
    F("port", INT),
    F("rack", Opt(STR)),
    F("is_fenced", BOOL),
)
DESCRIBE_CLUSTER = declare(
    60,
    "DescribeCluster",
    (0, 0),
    request=[],
    response=[
        THROTTLE,
        ERROR_CODE,
        ERROR_MESSAGE,
        F("cluster_id", STR),
        F("controller_id", INT),
        F("brokers", Array(DESCRIBE_CLUSTER_BROKER)),
    ],
)

DESCRIBE_LOG_DIRS_PARTITION = Struct(
    "DescribeLogDirsPartition",
    F("partition", INT),
    F("error_code", INT),
    F("log_start_offset", INT, doc="the first offset in either tier"),
    F("local_log_start_offset", INT),
    F("log_end_offset", INT),
    F("size_bytes", INT, doc="on local disk"),
    F("remote_log_start_offset", INT, doc="-1: nothing in the remote tier"),
    F("remote_end_offset", INT, doc="the highest offset safely remote, -1 if none"),
    F("remote_size_bytes", INT),
    F("remote_segments", INT),
    F("copy_lag_bytes", INT, doc="closed, committed local segments not yet remote"),
    F("copy_lag_segments", INT),
    F("remote_storage", BOOL, doc="the topic's remote.storage.enable, on this broker"),
)
DESCRIBE_LOG_DIRS = declare(
    35,
    "DescribeLogDirs",
    (0, 0),
    request=[
        F(
            "topics",
            Opt(Array(Struct("DescribeLogDirsTopic", F("topic", STR), F("partitions", INT_LIST)))),
            default=None,
            doc="nil: every partition this broker leads",
        ),
    ],
    response=[
        THROTTLE,
        ERROR_CODE,
        F(
            "topics",
            Array(
                Struct(
                    "DescribeLogDirsTopicResult",
                    F("topic", STR),
                    F("partitions", Array(DESCRIBE_LOG_DIRS_PARTITION)),
                )
            ),
        ),
    ],
    doc="Answered by each partition's leader (others: NOT_LEADER_OR_FOLLOWER): its local "
    "and remote log (rillet's shape, not Kafka's). Feeds `rillet topic describe`.",
)

# --- Configs (KIP-339) ------------------------------------------------------------------
# Kafka's field names; resource types TOPIC=2, BROKER=4; config sources TOPIC_CONFIG=1,
# STATIC_BROKER_CONFIG=4, DEFAULT_CONFIG=5; config types as Kafka's ConfigType.

DESCRIBE_CONFIGS_RESOURCE_RESULT = Struct(
    "DescribeConfigsResourceResult",
    F("name", STR),
    F("value", Opt(STR), doc="nil for a sensitive key"),
    F("read_only", BOOL),
    F("is_default", BOOL),
    F("config_source", INT, doc="1: the topic's own, 4: the broker's file, 5: a default"),
    F("is_sensitive", BOOL),
    F("config_type", INT, doc="1 boolean, 2 string, 3 int, 5 long, 7 list"),
    F("documentation", Opt(STR)),
)
DESCRIBE_CONFIGS = declare(
    32,
    "DescribeConfigs",
    (0, 0),
    request=[
        F(
            "resources",
            Array(
                Struct(
                    "DescribeConfigsResource",
                    F("resource_type", INT),
                    F("resource_name", STR),
                    F("configuration_keys", Opt(Array(STR)), doc="nil: every key"),
                )
            ),
        ),
        F("include_synonyms", BOOL, default=False, doc="accepted; no synonyms are sent"),
        F("include_documentation", BOOL, default=False),
    ],
    response=[
        THROTTLE,
        F(
            "results",
            Array(
                Struct(
                    "DescribeConfigsResult",
                    F("error_code", INT),
                    F("error_message", Opt(STR)),
                    F("resource_type", INT),
                    F("resource_name", STR),
                    F("configs", Array(DESCRIBE_CONFIGS_RESOURCE_RESULT)),
                )
            ),
        ),
    ],
    doc="Any broker answers for topics from its metadata image (keys without an override "
    "show the broker's default, `is_default`), and for itself as a BROKER resource. A "
    "resource named twice is answered once (its key lists merged); a request naming more "
    "than 1,000 distinct resources has each refused INVALID_REQUEST.",
)

INCREMENTAL_ALTER_CONFIGS = declare(
    44,
    "IncrementalAlterConfigs",
    (0, 0),
    request=[
        F(
            "resources",
            Array(
                Struct(
                    "AlterConfigsResource",
                    F("resource_type", INT),
                    F("resource_name", STR),
                    F(
                        "configs",
                        Array(
                            Struct(
                                "AlterableConfig",
                                F("name", STR),
                                F(
                                    "config_operation",
                                    INT,
                                    doc="0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT",
                                ),
                                F("value", Opt(STR)),
                            )
                        ),
                    ),
                )
            ),
        ),
        F("validate_only", BOOL, default=False),
    ],
    response=[
        THROTTLE,
        F(
            "responses",
            Array(
                Struct(
                    "AlterConfigsResourceResponse",
                    F("error_code", INT),
                    F("error_message", Opt(STR)),
                    F("resource_type", INT),
                    F("resource_name", STR),
                )
            ),
        ),
    ],
    doc="Brokers forward it to the active controller, which commits the topic's Config "
    "records; a resource is changed whole or not at all.",
)

LISTENER = Struct("Listener", F("name", STR), F("host", STR), F("port", INT))
BROKER_REGISTRATION = declare(
    62,
    "BrokerRegistration",
    (0, 0),
    request=[
        F("broker_id", INT),
        F("cluster_id", STR),
        F("incarnation_id", STR, doc="a fresh uuid per process start"),
        F("listeners", Array(LISTENER)),
        F("rack", Opt(STR), default=None),
        F("previous_broker_epoch", INT, default=-1, doc="-1, or the epoch before a clean stop"),
    ],
    response=[THROTTLE, ERROR_CODE, ERROR_MESSAGE, F("broker_epoch", INT)],
    scope=SCOPE_CLUSTER,
)

BROKER_HEARTBEAT = declare(
    63,
    "BrokerHeartbeat",
    (0, 0),
    request=[
        F("broker_id", INT),
        F("broker_epoch", INT),
        F("current_metadata_offset", INT),
        F("want_fence", BOOL, default=False),
        F("want_shut_down", BOOL, default=False),
    ],
    response=[
        THROTTLE,
        ERROR_CODE,
        ERROR_MESSAGE,
        F("is_caught_up", BOOL),
        F("is_fenced", BOOL),
        F("should_shut_down", BOOL),
    ],
    scope=SCOPE_CLUSTER,
)

FETCH_METADATA = declare(
    1001,
    "FetchMetadata",
    (0, 0),
    request=[
        F("broker_id", INT),
        F("broker_epoch", INT),
        F("fetch_offset", INT, doc="the next metadata log offset the broker needs"),
        F("last_fetched_epoch", INT),
        F("max_wait_ms", INT),
        F("max_bytes", INT),
    ],
    response=[
        ERROR_CODE,
        F("leader_id", INT),
        F("leader_epoch", INT),
        F("high_watermark", INT, doc="the committed metadata offset"),
        F("log_start_offset", INT),
        F("diverging_epoch", Opt(EPOCH_END)),
        F(
            "snapshot_id",
            Opt(Struct("SnapshotId", F("end_offset", INT), F("epoch", INT))),
            doc="set when the broker must load this snapshot first",
        ),
        F("nbytes", INT),
    ],
    payload="response",
    scope=SCOPE_CLUSTER,
    doc="Brokers follow the committed metadata log (long poll); records in the payload.",
)

RAFT_MESSAGE = declare(
    1004,
    "RaftMessage",
    (0, 0),
    request=[
        F("cluster_id", Opt(STR), default=None, doc="nil until the cluster id is known"),
        F("src", INT, doc="sending voter"),
        F("dst", INT, doc="receiving voter"),
    ],
    response=[ERROR_CODE],
    payload="request",
    scope=SCOPE_RAFT,
    doc="One-way (never answered): one message of the Raft core, msgpack of "
    "`Message.to_dict()` in the payload. Replies travel as RaftMessages the other way.",
)

PARTITION_RESULT = Struct(
    "PartitionResult",
    F("topic", STR),
    F("partition", INT),
    F("error_code", INT),
    F("error_message", Opt(STR)),
)

ELECT_LEADERS = declare(
    43,
    "ElectLeaders",
    (0, 0),
    request=[
        F("election_type", INT, default=0, doc="0: preferred leader (the only type)"),
        F("topics", Opt(Array(STR)), default=None, doc="nil for every topic"),
        F("timeout_ms", INT, default=30_000),
    ],
    response=[THROTTLE, ERROR_CODE, ERROR_MESSAGE, F("results", Array(PARTITION_RESULT))],
    scope=SCOPE_CLUSTER,
    doc="Served by the active controller: move leadership to each partition's first replica.",
)

ALTER_PARTITION_REASSIGNMENTS = declare(
    45,
    "AlterPartitionReassignments",
    (0, 0),
    request=[
        F("timeout_ms", INT, default=30_000),
        F(
            "partitions",
            Array(
                Struct(
                    "ReassignablePartition",
                    F("topic", STR),
                    F("partition", INT),
                    F("replicas", Opt(INT_LIST), doc="target replicas; nil cancels"),
                )
            ),
        ),
    ],
    response=[THROTTLE, ERROR_CODE, ERROR_MESSAGE, F("results", Array(PARTITION_RESULT))],
    scope=SCOPE_CLUSTER,
    doc="Served by the active controller (KIP-455).",
)

QUORUM_REPLICA_STATE = Struct(
    "ReplicaState",
    F("replica_id", INT),
    F("log_end_offset", INT, doc="the leader's match index for it (its own last index)"),
    F("last_fetch_timestamp", INT, doc="wall-clock ms the leader last heard from it; -1"),
    F("last_caught_up_timestamp", INT, doc="wall-clock ms it last matched the leader; -1"),
)
DESCRIBE_QUORUM = declare(
    55,
    "DescribeQuorum",
    (0, 1),
    request=[
        F(
            "leader_only",
            BOOL,
            since=1,
            default=False,
            doc="a controller that is not active answers NOT_CONTROLLER (with a redirect)",
        ),
    ],
    response=[
        ERROR_CODE,
        F("node_id", INT),
        F("role", STR, doc="follower, pre-candidate, candidate or leader"),
        F("term", INT),
        F("leader_id", INT, doc="-1 when unknown"),
        F("active", BOOL, doc="this node is the active controller"),
        F("cluster_id", Opt(STR)),
        F("commit_index", INT),
        F("applied_offset", INT, doc="offset of the newest record in this node's image"),
        F("snapshot_index", INT, doc="last index of the local snapshot, 0 if none"),
        F("last_index", INT),
        F("high_watermark", INT, since=1, doc="the committed offset, as the leader knows it"),
        F(
            "current_voters",
            Array(QUORUM_REPLICA_STATE),
            since=1,
            doc="the leader's view of every voter; only itself on another node",
        ),
    ],
    scope=SCOPE_RAFT,
    doc="Any controller answers with its own view of the quorum (rillet's shape, not "
    "Kafka's): for tooling, tests and status pages. Brokers forward it to the active "
    "controller, asking with `leader_only`.",
)


# --- Consumer groups (KIP-848) ---------------------------------------------------------
# Declared ahead of their handlers: a broker answers them UNSUPPORTED_VERSION until the
# group coordinator serves them. Each takes the fields of Kafka's newest version of the
# API (group batching in FindCoordinator and OffsetFetch, member epochs in commits and
# fetches) as rillet's v0; topic ids are strings, as in Fetch.

FIND_COORDINATOR = declare(
    10,
    "FindCoordinator",
    (0, 0),
    request=[
        F("key_type", INT, default=0, doc="0: group, 1: transaction"),
        F("coordinator_keys", Array(STR), doc="group ids (or transactional ids) to look up"),
    ],
    response=[
        THROTTLE,
        F(
            "coordinators",
            Array(
                Struct(
                    "Coordinator",
                    F("key", STR),
                    F("node_id", INT, doc="-1 when there is none"),
                    F("host", STR),
                    F("port", INT),
                    F("error_code", INT),
                    F("error_message", Opt(STR)),
                )
            ),
        ),
    ],
    doc="Who coordinates each key: the leader of the `__consumer_offsets` partition "
    "its hash maps to.",
)

OFFSET_COMMIT_PARTITION = Struct(
    "OffsetCommitPartition",
    F("partition", INT),
    F("committed_offset", INT),
    F("committed_leader_epoch", INT, default=-1),
    F("committed_metadata", Opt(STR), default=None),
)
OFFSET_COMMIT = declare(
    8,
    "OffsetCommit",
    (0, 0),
    request=[
        F("group_id", STR),
        F(
            "generation_id_or_member_epoch",
            INT,
            default=-1,
            doc="the member epoch; -1 for a commit from outside the group (admin, manual)",
        ),
        F("member_id", STR, default=""),
        F("group_instance_id", Opt(STR), default=None),
        F(
            "topics",
            Array(
                Struct(
                    "OffsetCommitTopic",
                    F("name", STR),
                    F("partitions", Array(OFFSET_COMMIT_PARTITION)),
                )
            ),
        ),
    ],
    response=[
        THROTTLE,
        F(
            "topics",
            Array(
                Struct(
                    "OffsetCommitTopicResult",
                    F("name", STR),
                    F(
                        "partitions",
                        Array(
                            Struct(
                                "OffsetCommitPartitionResult",
                                F("partition", INT),
                                F("error_code", INT),
                            )
                        ),
                    ),
                )
            ),
        ),
    ],
    doc="Acknowledged once the commit is committed in the group's offsets partition.",
)

OFFSET_FETCH_PARTITION = Struct(
    "OffsetFetchPartitionResult",
    F("partition", INT),
    F("committed_offset", INT, doc="-1 when the group committed none"),
    F("committed_leader_epoch", INT),
    F("metadata", Opt(STR)),
    F("error_code", INT),
)
OFFSET_FETCH = declare(
    9,
    "OffsetFetch",
    (0, 0),
    request=[
        F(
            "groups",
            Array(
                Struct(
                    "OffsetFetchGroup",
                    F("group_id", STR),
                    F("member_id", Opt(STR), doc="nil from outside the group"),
                    F("member_epoch", INT, doc="-1 from outside the group"),
                    F(
                        "topics",
                        Opt(
                            Array(
                                Struct(
                                    "OffsetFetchTopic",
                                    F("name", STR),
                                    F("partition_indexes", INT_LIST),
                                )
                            )
                        ),
                        doc="nil for every partition the group committed",
                    ),
                )
            ),
        ),
        F("require_stable", BOOL, default=False),
    ],
    response=[
        THROTTLE,
        F(
            "groups",
            Array(
                Struct(
                    "OffsetFetchGroupResult",
                    F("group_id", STR),
                    F(
                        "topics",
                        Array(
                            Struct(
                                "OffsetFetchTopicResult",
                                F("name", STR),
                                F("partitions", Array(OFFSET_FETCH_PARTITION)),
                            )
                        ),
                    ),
                    F("error_code", INT),
                )
            ),
        ),
    ],
)

LIST_GROUPS = declare(
    16,
    "ListGroups",
    (0, 0),
    request=[
        F("states_filter", Array(STR), default=[], doc="empty for every state"),
        F("types_filter", Array(STR), default=[], doc="consumer or classic; empty for both"),
    ],
    response=[
        THROTTLE,
        ERROR_CODE,
        F(
            "groups",
            Array(
                Struct(
                    "ListedGroup",
                    F("group_id", STR),
                    F("protocol_type", STR),
                    F("group_state", STR),
                    F("group_type", STR),
                )
            ),
        ),
    ],
    doc="Sent to every broker: each lists the groups it coordinates.",
)

DELETE_GROUPS = declare(
    42,
    "DeleteGroups",
    (0, 0),
    request=[F("groups_names", Array(STR))],
    response=[
        THROTTLE,
        F(
            "results",
            Array(Struct("DeletableGroupResult", F("group_id", STR), F("error_code", INT))),
        ),
    ],
    doc="Only empty groups are deleted (NON_EMPTY_GROUP otherwise), with their offsets.",
)

OFFSET_DELETE = declare(
    47,
    "OffsetDelete",
    (0, 0),
    request=[
        F("group_id", STR),
        F(
            "topics",
            Array(
                Struct(
                    "OffsetDeleteTopic",
                    F("name", STR),
                    F("partitions", INT_LIST),
                )
            ),
        ),
    ],
    response=[
        ERROR_CODE,
        THROTTLE,
        F(
            "topics",
            Array(
                Struct(
                    "OffsetDeleteTopicResult",
                    F("name", STR),
                    F(
                        "partitions",
                        Array(
                            Struct(
                                "OffsetDeletePartitionResult",
                                F("partition", INT),
                                F("error_code", INT),
                            )
                        ),
                    ),
                )
            ),
        ),
    ],
    doc="Drops committed offsets of topics the group is not subscribed to.",
)

GROUP_TOPIC_PARTITIONS = Struct(
    "GroupTopicPartitions", F("topic_id", STR), F("partitions", INT_LIST)
)
CONSUMER_GROUP_HEARTBEAT = declare(
    68,
    "ConsumerGroupHeartbeat",
    (0, 0),
    request=[
        F("group_id", STR),
        F("member_id", STR, doc="chosen by the client (a UUID) when it joins"),
        F("member_epoch", INT, doc="0 joins, -1 leaves, -2 leaves a static member"),
        F("instance_id", Opt(STR), default=None, doc="static membership"),
        F("rack_id", Opt(STR), default=None),
        F("rebalance_timeout_ms", INT, default=-1),
        F(
            "subscribed_topic_names",
            Opt(Array(STR)),
            default=None,
            doc="nil: unchanged since the last heartbeat",
        ),
        F("subscribed_topic_regex", Opt(STR), default=None),
        F("server_assignor", Opt(STR), default=None, doc="uniform or range; nil: default"),
        F(
            "topic_partitions",
            Opt(Array(GROUP_TOPIC_PARTITIONS)),
            default=None,
            doc="what the member owns now; nil: unchanged",
        ),
    ],
    response=[
        THROTTLE,
        ERROR_CODE,
        ERROR_MESSAGE,
        F("member_id", Opt(STR), default=None),
        F("member_epoch", INT, default=-1),
        F("heartbeat_interval_ms", INT, default=0),
        F(
            "assignment",
            Opt(Array(GROUP_TOPIC_PARTITIONS)),
            default=None,
            doc="the member's target partitions; nil: unchanged",
        ),
    ],
    doc="KIP-848: join, stay alive, learn the assignment and leave, in one request.",
)

DESCRIBED_ASSIGNMENT = Array(
    Struct(
        "DescribedTopicPartitions",
        F("topic_id", STR),
        F("topic_name", STR),
        F("partitions", INT_LIST),
    )
)
CONSUMER_GROUP_DESCRIBE = declare(
    69,
    "ConsumerGroupDescribe",
    (0, 0),
    request=[
        F("group_ids", Array(STR)),
        F("include_authorized_operations", BOOL, default=False),
    ],
    response=[
        THROTTLE,
        F(
            "groups",
            Array(
                Struct(
                    "DescribedGroup",
                    F("error_code", INT),
                    F("error_message", Opt(STR)),
                    F("group_id", STR),
                    F("group_state", STR),
                    F("group_epoch", INT),
                    F("assignment_epoch", INT),
                    F("assignor_name", STR),
                    F(
                        "members",
                        Array(
                            Struct(
                                "DescribedMember",
                                F("member_id", STR),
                                F("instance_id", Opt(STR)),
                                F("rack_id", Opt(STR)),
                                F("member_epoch", INT),
                                F("client_id", STR),
                                F("client_host", STR),
                                F("subscribed_topic_names", Array(STR)),
                                F("subscribed_topic_regex", Opt(STR)),
                                F("assignment", DESCRIBED_ASSIGNMENT),
                                F("target_assignment", DESCRIBED_ASSIGNMENT),
                            )
                        ),
                    ),
                    F("authorized_operations", INT, doc="-2^31: not asked for"),
                )
            ),
        ),
    ],
)


def render_markdown() -> str:
    """The API table for docs/protocol.md (a test keeps the doc in step with this)."""
    lines: list[str] = []
    for scope in (SCOPE_CLIENT, SCOPE_CLUSTER, SCOPE_RAFT):
        lines += [f"### {scope.capitalize()} APIs", ""]
        for api in sorted(APIS.values(), key=lambda a: a.key):
            if api.scope == scope:
                lines += _render_api(api)
    return "\n".join(lines).rstrip() + "\n"


def _render_api(api: Api) -> list[str]:
    versions = f"v{api.min_version}" + (
        f"-v{api.max_version}" if api.max_version != api.min_version else ""
    )
    out = [f"#### {api.name} (key {api.key}, {versions})", ""]
    if api.doc:
        out += [api.doc, ""]
    for title, fields, has_payload in (
        ("Request", api.request, api.request_payload),
        ("Response", api.response, api.response_payload),
    ):
        out.append(f"{title}{' (+ payload)' if has_payload else ''}:")
        out.append("")
        for f in fields or ():
            out.append(_render_field(f))
        if not fields:
            out.append("- (no fields)")
        out.append("")
    return out


def _render_field(f: F) -> str:
    text = f"- `{f.name}`: `{f.type.render()}`"
    if f.since:
        text += f" (since v{f.since})"
    if not f.required:
        text += f", default `{f.default!r}`"
    if f.doc:
        text += f" - {f.doc}"
    return text


# --- Code generation ----------------------------------------------------------------------

MESSAGES_HEADER = '''"""Typed wire messages, generated from client/wire/schemas.py: do not edit.

Regenerate with `python -m rillet.client.wire.schemas` (tests/test_schemas.py fails when
this file is stale, and importing it checks it against the declarations).

Every struct is a NamedTuple in wire order, so msgpack packs it as the array it is on the
wire; every request and response is a NamedTuple of its header fields, required fields
first. ``to_header()`` gives the header map; ``from_header(header, version)`` the message
(a request is validated first, see ``schemas.decode``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Self

from rillet.client.wire import schemas
'''


def _py_type(t: Type) -> str:
    if isinstance(t, Scalar):
        return t.python_types[0].__name__
    if isinstance(t, Opt):
        return f"{_py_type(t.of)} | None"
    if isinstance(t, Array):
        return f"list[{_py_type(t.of)}]"
    if isinstance(t, Map):
        return f"dict[{_py_type(t.key)}, {_py_type(t.value)}]"
    assert isinstance(t, Struct)
    return t.name


def _py_literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _field_lines(fields: tuple[F, ...]) -> list[str]:
    lines = []
    for f in fields:
        if f.doc:
            lines += [f"    # {line}" for line in textwrap.wrap(f.doc, 90)]
        default = "" if f.required else f" = {_py_literal(f.default)}"
        lines.append(f"    {f.name}: {_py_type(f.type)}{default}")
    return lines


def _docstring(text: str) -> list[str]:
    wrapped = textwrap.wrap(text, 88)
    if len(wrapped) == 1:
        return [f'    """{wrapped[0]}"""', ""]
    return [f'    """{wrapped[0]}', *(f"    {line}" for line in wrapped[1:]), '    """', ""]


def render_messages() -> str:
    """The source of client/wire/messages.py."""
    out = [MESSAGES_HEADER]
    for struct in struct_specs():
        fields = struct.fields
        optional = [i for i, f in enumerate(fields) if not f.required]
        if optional and optional != list(range(optional[0], len(fields))):
            raise ValueError(f"{struct.name}: only trailing struct fields may have defaults")
        out += ["", f"class {struct.name}(NamedTuple):"]
        names = ", ".join(f.name for f in fields)
        out += _docstring(f"On the wire: ``[{names}]``.")
        out += _field_lines(fields)
        out.append("")
    for spec in message_specs():
        name, api = spec.name, spec.api
        what = f"{api.name} {spec.direction} (key {api.key})." if api else "A request-level error."
        out += ["", f"class {name}(NamedTuple):"]
        out += _docstring(f"{what} {spec.doc}".strip())
        out += _field_lines(spec.fields) or ["    pass"]
        out += [
            "",
            "    def to_header(self) -> dict[str, Any]:",
            "        return self._asdict()",
            "",
            "    @classmethod",
            "    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:",
            "        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]",
        ]
        if spec.direction == REQUEST and api is not None:
            out += [
                "",
                f"    def response_type(self) -> type[{api.response_class}]:",
                f"        return {api.response_class}",
            ]
        out.append("")
    out += ["", "schemas.bind(globals())", ""]
    return "\n".join(out)


def _update_doc(path: str) -> None:
    """Rewrite the generated API table between its markers in ``path``."""
    begin, end = "<!-- BEGIN API TABLE (generated) -->", "<!-- END API TABLE -->"
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{begin}\n\n{render_markdown()}\n{end}{tail}")


MESSAGES_PATH = Path(__file__).with_name("messages.py")


if __name__ == "__main__":  # python -m rillet.client.wire.schemas [docs/protocol.md]
    import sys

    _update_doc(sys.argv[1] if len(sys.argv) > 1 else "docs/protocol.md")
    MESSAGES_PATH.write_text(render_messages(), encoding="utf-8")
