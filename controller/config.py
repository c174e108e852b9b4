"""Config keys of a controller node, and parsers for `listeners` and the voter list.

Three tables, so a combined node (broker + controller in one process) can merge them
without declaring a key twice (``ConfigTable.__add__`` refuses duplicates):

- ``node_keys(default_roles)``: what every node has (the NODE PROCESS/CONFIG CONTRACT in
  docs/architecture.md: ``node.id``, ``process.roles``, ``listeners``,
  ``controller.quorum.voters``, ``log.level``...), plus ``broker.heartbeat.interval.ms``,
  which brokers send at and controllers expect;
- ``CONTROLLER_KEYS``: only a controller reads these;
- a broker's own table (broker/).

``controller_config_table()`` is ``node_keys("controller") + CONTROLLER_KEYS``; a
combined node uses ``node_keys("broker,controller") + CONTROLLER_KEYS + BROKER_KEYS``.
"""

from __future__ import annotations

from rillet.client.runtime.config import (  # noqa: F401  (re-exported for controller modules)
    ConfigTable,
    Key,
    format_voters,
    node_keys,
    parse_listeners,
    parse_voters,
    require_node_id,
)

CONTROLLER_KEYS = ConfigTable([
    Key("metadata.log.dir", str, "/tmp/rillet-controller",
        "Directory of the Raft log, hard state, snapshot and meta.properties."),
    Key("quorum.election.timeout.ms", int, 1000,
        "Raft election timeout T: a follower campaigns after a random wait in [T, 2T) "
        "without hearing from a leader; a leader steps down without a quorum for T. The "
        "only voter of a one-controller quorum campaigns at once on start: no one else "
        "can lead or vote."),
    Key("quorum.fetch.timeout.ms", int, 2000,
        "Connect and write timeout of the Raft transport towards another voter."),
    Key("quorum.heartbeat.interval.ms", int, 100,
        "Raft leader heartbeat (empty append) interval; must be below the election timeout."),
    Key("quorum.prevote.on.leader.loss.enable", bool, True,
        "A follower whose leader's address refuses connections (its process is gone) "
        "starts a pre-vote at once (the followers taking turns a heartbeat interval apart) "
        "instead of waiting out the "
        "election timeout."),
    Key("quorum.tick.interval.ms", int, 20, "How often the driver ticks the Raft core."),
    Key("broker.session.timeout.ms", int, 3000,
        "A broker without a heartbeat for this long is fenced (Kafka: 9000)."),
    Key("controller.tick.interval.ms", int, 100,
        "How often the active controller checks sessions and leader balance."),
    Key("metadata.snapshot.max.records", int, 20_000,
        "Snapshot the image and compact the Raft log after this many applied records."),
    Key("metadata.snapshot.max.bytes", int, 16 * 1024 * 1024,
        "Snapshot and compact after this many bytes of applied entries (or the record "
        "count above, whichever comes first)."),
    Key("metadata.fetch.max.bytes", int, 1024 * 1024,
        "Upper bound of one FetchMetadata response's records (at least one entry is sent)."),
    Key("cluster.id", str, "",
        "Cluster id to write when this quorum starts empty; empty generates one."),
    Key("num.partitions", int, 1, "Partitions of a topic created without a count."),
    Key("default.replication.factor", int, 1, "Replication factor when none is given."),
    Key("auto.leader.rebalance.enable", bool, True,
        "Move leadership back to preferred replicas when a broker's imbalance is too high."),
    Key("leader.imbalance.per.broker.percentage", int, 10,
        "Imbalance (share of its preferred partitions a broker does not lead) that triggers it."),
    Key("leader.imbalance.check.interval.ms", int, 300_000, "How often the imbalance is checked."),
    Key("max.partitions", int, 200_000,
        "Partitions the cluster may hold in all (each counted once, building topics too): "
        "a CreateTopics that would pass it is refused as a whole with POLICY_VIOLATION "
        "before anything is planned (Kafka's KIP-578 name)."),
    Key("max.broker.partitions", int, 100_000,
        "Replicas one broker may hold: a topic whose placement would put more on any "
        "broker is refused with POLICY_VIOLATION (KIP-578's name; ~6.6 KiB of broker "
        "memory each, docs/broker.md)."),
    Key("controlled.shutdown.timeout.ms", int, 5000,
        "On SIGTERM, how long a leading controller waits for a leadership transfer."),
    # The brokers' topic defaults the controller validates against (docs/controller.md,
    # "Topic defaults"): same names, defaults and meaning as the brokers' keys.
    Key("log.cleanup.policy", str, "delete",
        "Topic default the brokers apply: set it as on the brokers."),
    Key("log.retention.ms", int, 7 * 24 * 3600 * 1000,
        "Topic default the brokers apply: set it as on the brokers."),
    Key("log.retention.bytes", int, -1,
        "Topic default the brokers apply: set it as on the brokers."),
])  # fmt: skip


def controller_config_table() -> ConfigTable:
    return node_keys("controller") + CONTROLLER_KEYS


CONFIG_TABLE_BEGIN = "<!-- BEGIN CONFIG TABLE (generated) -->"
CONFIG_TABLE_END = "<!-- END CONFIG TABLE -->"


def update_doc(path: str) -> None:
    """Rewrite the generated key table in docs/controller.md between its markers."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(CONFIG_TABLE_BEGIN, 1)
    _, tail = rest.split(CONFIG_TABLE_END, 1)
    table = controller_config_table().render_markdown()
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{CONFIG_TABLE_BEGIN}\n{table}{CONFIG_TABLE_END}{tail}")


if __name__ == "__main__":  # python -m rillet.controller.config [docs/controller.md]
    import sys

    update_doc(sys.argv[1] if len(sys.argv) > 1 else "docs/controller.md")
