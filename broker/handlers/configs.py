"""DescribeConfigs, IncrementalAlterConfigs and DescribeQuorum on a broker.

DescribeConfigs is answered from this broker's metadata image: a topic's own configs
(its Config records) as TOPIC_CONFIG, every other key with the value this broker applies
to the topic: what a replica of the topic really runs with. That is its ``log.*``,
``min.insync.replicas`` or ``message.max.bytes`` setting as STATIC_BROKER_CONFIG where
its file sets one, else the key's built-in default as DEFAULT_CONFIG with
``is_default``. A BROKER resource names this broker's id and lists its own static
configuration, read-only.

IncrementalAlterConfigs is forwarded to the active controller, the only writer of the
metadata log (a broker cannot change a topic's configs on its own: every broker applies
them from the Config records it replays). On success the handler waits, bounded, until
this broker's image shows the changes, so a describe through it right after sees them.

DescribeQuorum is forwarded to the active controller too (``leader_only``, so a voter
that is not the leader redirects): only the leader knows how far every voter is. With no
active controller it answers NOT_CONTROLLER after a few seconds rather than hunting for
one as long as other forwarded requests do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any

from rillet.broker.config import LOG_DEFAULT_KEYS, BrokerConfig, broker_config_table
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.client.wire.errors import NotControllerError
from rillet.controller.metadata.image import RESOURCE_BROKER, RESOURCE_TOPIC, MetadataImage
from rillet.controller.metadata.topic_config import (
    OP_DELETE,
    OP_SET,
    TOPIC_CONFIGS,
    canonical,
    parse_value,
)

Forward = Callable[[Any], Awaitable[Any]]
WaitImage = Callable[[Callable[[MetadataImage], bool], int], Awaitable[None]]

# Kafka's ConfigSource values.
TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
# Kafka's ConfigType values, by topic config kind.
CONFIG_TYPES = {"bool": 1, "int": 3, "long": 5, "policy": 7}
STRING_TYPE = 2
UNKNOWN_TOPIC = errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")
INVALID_REQUEST = errors.code_of("INVALID_REQUEST")
IMAGE_WAIT_MS = 5_000
QUORUM_FORWARD_S = 5.0  # a controller failover takes a second or two
# Distinct resources one DescribeConfigs may name (the Admin asks in batches of this many):
# the answer is built on the loop, up to every key of each, so it is bounded per request.
MAX_DESCRIBE_RESOURCES = 1000
_SENSITIVE_WORDS = ("password", "secret")


def topic_defaults(config: BrokerConfig) -> dict[str, str]:
    """The value of every topic key this broker applies when a topic does not set it."""
    log = config.log_defaults.to_dict()
    out = {}
    for key, d in TOPIC_CONFIGS.items():
        value = log.get(key)
        out[key] = canonical(key, d.default if value is None else value)
    out["min.insync.replicas"] = str(config["min.insync.replicas"])
    return out


# The broker key that gives each topic key its default on this broker, where one does.
_BROKER_KEY_OF = {topic_key: key for key, topic_key in LOG_DEFAULT_KEYS.items()} | {
    "min.insync.replicas": "min.insync.replicas",
    "max.message.bytes": "message.max.bytes",
}


def static_defaults(config: BrokerConfig) -> frozenset[str]:
    """The topic keys whose default comes from a broker setting its file changes (a value
    other than the key's declared default): Kafka's STATIC_BROKER_CONFIG source."""
    table = broker_config_table().keys
    return frozenset(
        topic_key
        for topic_key, key in _BROKER_KEY_OF.items()
        if topic_key in TOPIC_CONFIGS and key in table and config[key] != table[key].default
    )


def describe_topic(
    overrides: Mapping[str, str],
    defaults: Mapping[str, str],
    keys: Iterable[str] | None,
    documentation: bool,
    static: Collection[str] = frozenset(),
) -> list[m.DescribeConfigsResourceResult]:
    """One topic's configs (every key when ``keys`` is None; unknown keys are left out,
    as Kafka does). A key the topic does not set shows this broker's default: sourced
    STATIC_BROKER_CONFIG when in ``static`` (set in the broker's file), else
    DEFAULT_CONFIG with ``is_default``."""
    wanted = TOPIC_CONFIGS if keys is None else [k for k in keys if k in TOPIC_CONFIGS]
    rows = []
    for key in wanted:
        d = TOPIC_CONFIGS[key]
        own = overrides.get(key)
        if own is not None:
            source = TOPIC_CONFIG
        else:
            source = STATIC_BROKER_CONFIG if key in static else DEFAULT_CONFIG
        rows.append(
            m.DescribeConfigsResourceResult(
                name=key,
                value=defaults[key] if own is None else own,
                read_only=False,
                is_default=source == DEFAULT_CONFIG,
                config_source=source,
                is_sensitive=False,
                config_type=CONFIG_TYPES[d.kind],
                documentation=d.doc if documentation else None,
            )
        )
    return rows


def describe_broker(
    config: BrokerConfig, keys: Iterable[str] | None, documentation: bool
) -> list[m.DescribeConfigsResourceResult]:
    """This broker's static configuration: read-only, sensitive values hidden."""
    table = broker_config_table().keys
    names = sorted(config.values) if keys is None else [k for k in keys if k in config.values]
    rows = []
    for name in names:
        key = table.get(name)
        value = config[name]
        sensitive = any(word in name for word in _SENSITIVE_WORDS)
        default = key is not None and value == key.default
        rows.append(
            m.DescribeConfigsResourceResult(
                name=name,
                value=None if sensitive or value is None else _text(value),
                read_only=True,
                is_default=default,
                config_source=DEFAULT_CONFIG if default else STATIC_BROKER_CONFIG,
                is_sensitive=sensitive,
                config_type=STRING_TYPE,
                documentation=key.doc if documentation and key is not None else None,
            )
        )
    return rows


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def shows_changes(image: MetadataImage, resource: m.AlterConfigsResource) -> bool:
    """Whether ``image`` holds a topic's SET and DELETE changes (APPEND and SUBTRACT are
    not checked: their result depends on the value they were applied to)."""
    have = image.topic_config(resource.resource_name)
    if image.topic(resource.resource_name) is None:
        return True  # deleted meanwhile: nothing to wait for
    for c in resource.configs:
        if c.config_operation == OP_DELETE and c.name in have:
            return False
        if c.config_operation == OP_SET and c.value is not None:
            try:
                wanted = canonical(c.name, parse_value(c.name, c.value))
            except (KeyError, ValueError):
                continue
            if have.get(c.name) != wanted:
                return False
    return True


def distinct_resources(
    resources: Iterable[m.DescribeConfigsResource],
) -> list[m.DescribeConfigsResource]:
    """Each (type, name) once, in first-seen order, with its key lists merged and
    deduplicated (None, every key, wins): the answer grows with what is distinct."""
    keys: dict[tuple[int, str], dict[str, None] | None] = {}
    for r in resources:
        at = (r.resource_type, r.resource_name)
        if r.configuration_keys is None:
            keys[at] = None
        elif (merged := keys.setdefault(at, {})) is not None:
            merged.update(dict.fromkeys(r.configuration_keys))
    return [
        m.DescribeConfigsResource(kind, name, None if wanted is None else list(wanted))
        for (kind, name), wanted in keys.items()
    ]


class ConfigHandlers:
    def __init__(
        self,
        config: BrokerConfig,
        image: Callable[[], MetadataImage],
        forward: Forward,
        wait_image: WaitImage,
    ) -> None:
        self.config = config
        self.image = image
        self.forward = forward
        self.wait_image = wait_image
        self.defaults = topic_defaults(config)
        self.static_defaults = static_defaults(config)

    async def describe_configs(self, request: Request) -> Response:
        """One result per distinct resource (a resource named twice is described once,
        with the union of its key lists); a request naming more than
        ``MAX_DESCRIBE_RESOURCES`` has each refused with INVALID_REQUEST."""
        req: m.DescribeConfigsRequest = request.message
        resources = distinct_resources(req.resources)
        if len(resources) > MAX_DESCRIBE_RESOURCES:
            message = f"at most {MAX_DESCRIBE_RESOURCES} resources per DescribeConfigs request"
            results = [
                m.DescribeConfigsResult(
                    INVALID_REQUEST, message, r.resource_type, r.resource_name, []
                )
                for r in resources
            ]
            return Response(m.DescribeConfigsResponse(results=results))
        image = self.image()
        results = [self._describe(image, r, req.include_documentation) for r in resources]
        return Response(m.DescribeConfigsResponse(results=results))

    def _describe(
        self, image: MetadataImage, r: m.DescribeConfigsResource, documentation: bool
    ) -> m.DescribeConfigsResult:
        def fail(code: int, message: str) -> m.DescribeConfigsResult:
            return m.DescribeConfigsResult(code, message, r.resource_type, r.resource_name, [])

        keys = r.configuration_keys
        if r.resource_type == RESOURCE_TOPIC:
            if image.topic(r.resource_name) is None:
                return fail(UNKNOWN_TOPIC, f"topic {r.resource_name!r} does not exist")
            overrides = image.topic_config(r.resource_name)
            rows = describe_topic(
                overrides, self.defaults, keys, documentation, self.static_defaults
            )
        elif r.resource_type == RESOURCE_BROKER:
            if r.resource_name not in ("", str(self.config.node_id)):
                return fail(INVALID_REQUEST, f"broker {self.config.node_id} describes only itself")
            rows = describe_broker(self.config, keys, documentation)
        else:
            return fail(INVALID_REQUEST, f"unsupported resource type {r.resource_type}")
        return m.DescribeConfigsResult(errors.NONE, None, r.resource_type, r.resource_name, rows)

    async def incremental_alter_configs(self, request: Request) -> Response:
        req: m.IncrementalAlterConfigsRequest = request.message
        response: m.IncrementalAlterConfigsResponse = await self.forward(req)
        if not req.validate_only:
            # Only accepted topics change this broker's image; a refused resource of another
            # type may share a topic's name, so both type and name pick what to wait for.
            ok = {
                (r.resource_type, r.resource_name)
                for r in response.responses
                if r.error_code == errors.NONE and r.resource_type == RESOURCE_TOPIC
            }
            done = [r for r in req.resources if (r.resource_type, r.resource_name) in ok]
            await self.wait_image(lambda im: all(shows_changes(im, r) for r in done), IMAGE_WAIT_MS)
        return Response(response)

    async def describe_quorum(self, request: Request) -> Response:
        """Bounded: without an active controller the forward would retry for half a
        minute, and a client's later requests on this connection wait behind it."""
        req: m.DescribeQuorumRequest = request.message
        try:
            response = await asyncio.wait_for(
                self.forward(req._replace(leader_only=True)), QUORUM_FORWARD_S
            )
        except TimeoutError:
            raise NotControllerError(
                f"no active controller answered within {QUORUM_FORWARD_S:g} s"
            ) from None
        return Response(response)
