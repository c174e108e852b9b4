"""The broker's configuration: its key table (every key with a default and a line of
documentation, rendered into docs/broker.md) and ``BrokerConfig``, the typed view the
server reads.

Keys use Kafka's names where Kafka has the setting. ``log.*`` keys are the defaults of
every partition log; a topic's own configs (``segment.bytes``, ``max.message.bytes``...)
override them per topic.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from rillet.broker.group.assignors import ASSIGNORS
from rillet.client.runtime.config import (
    Config,
    ConfigTable,
    Key,
    merge_tables,
    node_keys,
    parse_endpoints,
    parse_listeners,
    parse_voters,
)
from rillet.client.wire.errors import InvalidConfigError
from rillet.storage.config import DAY_MS, KAFKA_NAMES, LogConfig

MIB = 1024 * 1024
FETCH_MAX_BYTES = 55 * MIB  # Kafka's fetch.max.bytes default (KIP-541)
BROKER_LISTENER = "BROKER"
DEFAULT_BROKER_LISTENER = "BROKER://127.0.0.1:9092"
CONTROLLER_LISTENER = "CONTROLLER"
# Listener names that are Kafka security protocols: without a map entry a listener so
# named speaks that protocol, and only PLAINTEXT is spoken here.
SECURITY_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})

# (broker key, LogConfig's Kafka name): the broker-wide defaults of every partition log.
LOG_DEFAULT_KEYS: dict[str, str] = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
}

# Keys only a broker reads. Keys every node has (node.id, process.roles, listeners,
# controller.quorum.voters, log.level, socket.request.max.bytes, max.connections,
# broker.heartbeat.interval.ms...) come from client/runtime/config.py's ``node_keys``.
BROKER_KEYS = ConfigTable(
    [
        Key("log.dirs", str, "/tmp/rillet-logs",
            "Directory of this broker's partition logs (one directory)."),
        Key("broker.rack", str, "", "Rack id for rack-aware placement; empty = none."),
        # Listeners: docs/broker.md, "Listeners".
        Key("advertised.listeners", str, "",
            "What each listener tells clients (`NAME://host:port,...`); a listener not "
            "named here advertises where it is bound (every-interface hosts as this "
            "machine's name; port 0 as the port bound)."),
        Key("listener.security.protocol.map", str, "",
            "`NAME:PROTOCOL,...`; only PLAINTEXT is supported (the default of every "
            "listener)."),
        Key("inter.broker.listener.name", str, BROKER_LISTENER,
            "The listener brokers reach each other on (follower fetches)."),
        Key("auto.create.topics.enable", bool, False,
            "Create a topic a Metadata request names when the client allows it."),
        Key("min.insync.replicas", int, 1,
            "Smallest ISR an acks=all produce accepts (topic config overrides)."),
        Key("message.max.bytes", int, MIB + 12,
            "Largest record batch (topic config `max.message.bytes` overrides)."),
        Key("replica.lag.time.max.ms", int, 30_000,
            "A follower not caught up for this long leaves the ISR."),
        Key("fetch.max.bytes", int, FETCH_MAX_BYTES,
            "Most bytes a fetch is answered with, whatever the client asks for (one batch "
            "more when the first is larger)."),
        Key("replica.fetch.max.bytes", int, MIB, "Follower fetch: bytes per partition."),
        Key("replica.fetch.response.max.bytes", int, 10 * MIB,
            "Follower fetch: bytes per response."),
        Key("replica.fetch.wait.max.ms", int, 500, "Follower fetch: longest wait at the leader."),
        Key("max.incremental.fetch.session.cache.slots", int, 1000,
            "Fetch sessions (incremental fetch) a broker keeps; 0 disables them."),
        Key("replica.fetch.backoff.ms", int, 1000,
            "Follower fetch: pause before retrying a partition that failed, or a lost leader."),
        Key("replica.high.watermark.checkpoint.interval.ms", int, 5000,
            "How often high watermarks are written to `replication-offset-checkpoint`."),
        Key("replica.tick.interval.ms", int, 100,
            "How often partitions with acks=all waiters or an ISR change to resend are "
            "ticked (ISR shrink checks: every half replica.lag.time.max.ms)."),
        Key("log.segment.bytes", int, 64 * MIB, "Segment size before rolling (Kafka: 1 GiB)."),
        Key("log.roll.ms", int, 7 * DAY_MS, "Segment age before rolling."),
        Key("log.index.interval.bytes", int, 4096, "Bytes between offset-index entries."),
        Key("log.flush.interval.messages", int, None,
            "fsync after this many messages; unset = rely on replication (Kafka's default)."),
        Key("log.flush.interval.ms", int, None, "fsync data older than this; unset = never."),
        Key("log.retention.ms", int, 7 * DAY_MS,
            "Delete closed segments older than this; -1 keeps them."),
        Key("log.retention.bytes", int, -1, "Per-partition size limit; -1 = unlimited."),
        Key("log.cleanup.policy", str, "delete", "`delete`, `compact` or `compact,delete`."),
        Key("log.cleaner.delete.retention.ms", int, DAY_MS,
            "How long compaction keeps tombstones."),
        Key("log.segment.delete.delay.ms", int, 60_000,
            "Retired segment files outlive in-flight reads this long."),
        Key("log.retention.check.interval.ms", int, 300_000, "Retention/compaction period."),
        Key("log.flush.scheduler.interval.ms", int, 1000, "How often flush.ms is checked."),
        # Consumer groups: docs/groups.md.
        Key("offsets.topic.num.partitions", int, 50,
            "Partitions of `__consumer_offsets` (fixed once it exists: it places groups)."),
        Key("offsets.topic.replication.factor", int, 3,
            "Replication of `__consumer_offsets`, capped at the brokers registered; it is "
            "created only once that many are alive."),
        Key("offsets.topic.segment.bytes", int, 100 * MIB,
            "Segment size of `__consumer_offsets` (small, so compaction keeps loads short)."),
        Key("offsets.commit.timeout.ms", int, 5000,
            "Longest a group write (commit, heartbeat) waits to be replicated before it "
            "fails retriably."),
        Key("group.consumer.session.timeout.ms", int, 45_000,
            "A consumer-group member silent this long is removed."),
        Key("group.consumer.heartbeat.interval.ms", int, 5000,
            "How often members are told to heartbeat."),
        Key("group.consumer.assignors", str, "uniform,range",
            "Server-side assignors a group may ask for; the first is the default."),
        # The remote (S3) tier: docs/tiered.md.
        Key("remote.log.storage.system.enable", bool, False,
            "Turn the remote tier on: topics with `remote.storage.enable` offload closed "
            "segments to the object store below."),
        Key("remote.log.storage.s3.bucket", str, "rillet-tier",
            "S3 bucket of remote segments (created when missing)."),
        Key("remote.log.storage.s3.prefix", str, "",
            "Key prefix of every object this cluster writes (e.g. `prod/`)."),
        Key("remote.log.storage.s3.endpoint.url", str, "",
            "S3 endpoint (moto, MinIO, Ceph); empty = AWS's. Credentials: boto3's chain."),
        Key("remote.log.storage.s3.region", str, "us-east-1", "S3 region."),
        Key("remote.log.manager.task.interval.ms", int, 30_000,
            "How often each led partition looks for segments to copy or delete remotely."),
        Key("remote.log.manager.copier.thread.pool.size", int, 2,
            "Segment uploads running at once (threads off the event loop)."),
        Key("remote.log.manager.copy.max.bytes.per.second", int, -1,
            "Upload rate limit over all partitions; -1 = unlimited."),
        Key("remote.log.reader.threads", int, 4, "Remote reads (ranged GETs) at once."),
        Key("remote.fetch.chunk.size.bytes", int, MIB,
            "Remote reads fetch and cache segments in chunks of this size."),
        Key("remote.fetch.chunk.cache.size.bytes", int, 64 * MIB,
            "Bound on the remote chunk cache (read-ahead included)."),
        Key("remote.fetch.prefetch.chunks", int, 2,
            "Chunks read ahead after a remote read, for sequential consumers."),
        Key("remote.fetch.max.wait.ms", int, 500,
            "Longest a fetch waits on its remote reads; those not done by then answer "
            "REQUEST_TIMED_OUT (retriable) and finish into the chunk cache."),
        Key("remote.log.orphan.min.age.ms", int, 600_000,
            "Objects no metadata record names are deleted once this old."),
        Key("remote.log.orphan.sweep.interval.ms", int, 300_000,
            "How often one broker (the lowest-id unfenced) looks for deleted topics' "
            "prefixes left in the bucket."),
    ]
)  # fmt: skip

# Keys a broker reads that a controller declares too (same name, same meaning). A
# broker-only node takes these defaults; a combined node takes the broker's where the
# two defaults differ (the tables are merged broker-first).
BROKER_SHARED_KEYS = ConfigTable(
    [
        Key("cluster.id", str, "",
            "Cluster id this broker registers with; empty = whatever the quorum has."),
        Key("num.partitions", int, 1, "Partitions of an auto-created topic."),
        Key("default.replication.factor", int, 1, "Replication factor of an auto-created topic."),
        Key("controlled.shutdown.timeout.ms", int, 30_000,
            "SIGTERM: longest wait for the controller to move this node's leaderships away;"
            " then it stops anyway."),
    ]
)  # fmt: skip


def broker_config_table() -> ConfigTable:
    """Every key of a broker-only node (``rillet broker``)."""
    return merge_tables(node_keys("broker"), BROKER_KEYS, BROKER_SHARED_KEYS)


def combined_config_table() -> ConfigTable:
    """Every key of a combined node: the broker's and the controller's tables merged."""
    from rillet.controller.config import CONTROLLER_KEYS

    return merge_tables(
        node_keys("broker,controller"), BROKER_KEYS, BROKER_SHARED_KEYS, CONTROLLER_KEYS
    )


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """What the broker reads, typed. Build with ``BrokerConfig.from_config``."""

    node_id: int
    roles: frozenset[str]
    listeners: dict[str, tuple[str, int]]
    voters: dict[int, tuple[str, int]]
    cluster_id: str
    log_dir: str
    rack: str | None
    log_defaults: LogConfig
    values: Config
    # Advertised (host, port) of each broker listener (CONTROLLER excluded); port 0
    # means the port bound, known once listening (``advertise``).
    advertised: dict[str, tuple[str, int]]
    inter_broker_listener: str

    @classmethod
    def from_config(cls, config: Config) -> BrokerConfig:
        roles = frozenset(r.strip() for r in config["process.roles"].split(",") if r.strip())
        if not roles or not roles <= {"broker", "controller"}:
            raise InvalidConfigError(
                f"process.roles must be broker, controller or broker,controller, "
                f"not {config['process.roles']!r}"
            )
        if config["node.id"] is None:
            raise InvalidConfigError("node.id is required")
        if not 0 <= config["node.id"] <= 2**31 - 1:  # Kafka's int32; the controller refuses
            raise InvalidConfigError(f"node.id must be in 0..2147483647, not {config['node.id']}")
        listeners = parse_listeners(config["listeners"] or DEFAULT_BROKER_LISTENER)
        inter = config["inter.broker.listener.name"].strip().upper()
        if "broker" in roles:
            check_security_protocols(config["listener.security.protocol.map"], listeners)
            if inter == CONTROLLER_LISTENER or inter not in listeners:
                raise InvalidConfigError(
                    f"inter.broker.listener.name: {inter} is not one of the broker's"
                    f" listeners ({', '.join(n for n in listeners if n != CONTROLLER_LISTENER)})"
                )
        advertised = advertised_listeners(config["advertised.listeners"], listeners)
        for name, value in (
            ("num.partitions", 1),
            ("default.replication.factor", 1),
            ("min.insync.replicas", 1),
            ("message.max.bytes", 0),
            ("max.connections", 1),
            ("socket.request.max.bytes", 1024),
            ("fetch.max.bytes", 1024),
            ("replica.tick.interval.ms", 1),
            ("replica.fetch.max.bytes", 1),
            ("replica.fetch.response.max.bytes", 1),
            ("replica.fetch.wait.max.ms", 0),
            ("replica.fetch.backoff.ms", 0),
            ("max.incremental.fetch.session.cache.slots", 0),
            ("replica.high.watermark.checkpoint.interval.ms", 1),
            ("offsets.topic.num.partitions", 1),
            ("offsets.topic.replication.factor", 1),
            ("offsets.topic.segment.bytes", 1024),
            ("offsets.commit.timeout.ms", 1),
            ("group.consumer.session.timeout.ms", 1),
            ("group.consumer.heartbeat.interval.ms", 1),
        ):
            if config[name] < value:
                raise InvalidConfigError(f"{name} must be >= {value}, not {config[name]}")
        assignors = [a.strip() for a in config["group.consumer.assignors"].split(",")]
        if not all(assignors) or not set(assignors) <= set(ASSIGNORS):
            raise InvalidConfigError(
                f"group.consumer.assignors must list some of {', '.join(sorted(ASSIGNORS))},"
                f" not {config['group.consumer.assignors']!r}"
            )
        return cls(
            node_id=config["node.id"],
            roles=roles,
            listeners=listeners,
            voters=parse_voters(config["controller.quorum.voters"]),
            cluster_id=config["cluster.id"],
            log_dir=config["log.dirs"],
            rack=config["broker.rack"] or None,
            log_defaults=log_defaults(config),
            values=config,
            advertised=advertised,
            inter_broker_listener=inter,
        )

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def broker_listeners(self) -> dict[str, tuple[str, int]]:
        """The listeners this node's broker binds: all but the controller's."""
        return {n: a for n, a in self.listeners.items() if n != CONTROLLER_LISTENER}

    @property
    def broker_address(self) -> tuple[str, int]:
        return self.listeners[self.inter_broker_listener]

    def advertise(self, bound: dict[str, int]) -> list[tuple[str, str, int]]:
        """The endpoints to register, ``(listener, host, port)``, given the port each
        listener bound: an advertised port 0 is the bound one."""
        return [(name, host, port or bound[name]) for name, (host, port) in self.advertised.items()]


def check_security_protocols(text: str, listeners: dict[str, tuple[str, int]]) -> None:
    """Accept ``listener.security.protocol.map`` entries that say PLAINTEXT (configs
    written for Kafka carry them); refuse every other protocol, mapped or implied by
    a listener's name, rather than serve plaintext where TLS or SASL was asked for."""
    protocols: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        if not sep or not name.strip() or not protocol.strip():
            raise InvalidConfigError(
                f"listener.security.protocol.map: expected NAME:PROTOCOL, got {item!r}"
            )
        protocols[name.strip().upper()] = protocol.strip().upper()
    for name in listeners:
        protocol = protocols.get(name, name if name in SECURITY_PROTOCOLS else "PLAINTEXT")
        if protocol != "PLAINTEXT":
            raise InvalidConfigError(
                f"listener {name}: security protocol {protocol} is not supported (only PLAINTEXT)"
            )


def advertised_listeners(
    text: str, listeners: dict[str, tuple[str, int]]
) -> dict[str, tuple[str, int]]:
    """Each broker listener's advertised (host, port), in ``listeners`` order. A
    listener bound to every interface advertises this machine's name (in a container,
    the name its peers resolve), as an every-interface address means nothing to a
    client; an explicit every-interface advertised host is refused, as Kafka does."""
    explicit = parse_endpoints(text, "advertised.listeners", distinct_ports=False)
    for name, (host, _) in explicit.items():
        if name not in listeners or name == CONTROLLER_LISTENER:
            raise InvalidConfigError(
                f"advertised.listeners: {name} is not one of the broker's listeners"
            )
        if host in WILDCARD_HOSTS:
            raise InvalidConfigError(
                f"advertised.listeners: {name} must name a host clients can reach,"
                f" not {host or 'an empty host'}"
            )
    out: dict[str, tuple[str, int]] = {}
    for name, (host, port) in listeners.items():
        if name == CONTROLLER_LISTENER:
            continue
        if name in explicit:
            out[name] = explicit[name]
        else:
            out[name] = (socket.gethostname() if host in WILDCARD_HOSTS else host, port)
    return out


def log_defaults(config: Config) -> LogConfig:
    """The broker-wide LogConfig: ``log.*`` keys plus ``message.max.bytes``."""
    settings: dict[str, Any] = {
        kafka: config[key] for key, kafka in LOG_DEFAULT_KEYS.items() if config[key] is not None
    }
    settings["max.message.bytes"] = config["message.max.bytes"]
    return LogConfig.from_dict(settings)


def topic_log_config(defaults: LogConfig, topic_config: dict[str, str] | Any) -> LogConfig:
    """A topic's LogConfig: its explicit configs that are log settings, over the broker
    defaults (topic keys such as min.insync.replicas are not log settings)."""
    own = {k: v for k, v in topic_config.items() if k in KAFKA_NAMES}
    return LogConfig.from_dict(own, defaults) if own else defaults


DOC_BEGIN = "<!-- BEGIN BROKER CONFIG TABLE (generated) -->"
DOC_END = "<!-- END BROKER CONFIG TABLE -->"


def render_doc_table() -> str:
    """The key table of docs/broker.md, from ``broker_config_table()``."""
    return f"{DOC_BEGIN}\n\n{broker_config_table().render_markdown()}\n{DOC_END}"


def update_doc(path: str) -> None:
    """Rewrite the generated table between the markers of ``path``."""
    from pathlib import Path

    doc = Path(path)
    text = doc.read_text()
    start, end = text.index(DOC_BEGIN), text.index(DOC_END) + len(DOC_END)
    doc.write_text(text[:start] + render_doc_table() + text[end:])


if __name__ == "__main__":  # python -m rillet.broker.config [docs/broker.md]
    import sys

    update_doc(sys.argv[1] if len(sys.argv) > 1 else "docs/broker.md")
