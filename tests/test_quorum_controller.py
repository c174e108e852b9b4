"""The sans-I/O controller, scenario by scenario: each operation's records and response."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from rillet.client.wire import messages as m
from rillet.client.wire.errors import code_of
from rillet.controller import handlers
from rillet.controller.metadata.describe import describe_cluster, describe_topics
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    NO_LEADER,
    FenceBroker,
    MetadataImage,
    NoOp,
    Partition,
    PartitionChange,
    RegisterBroker,
    UnfenceBroker,
    check_partition,
    replay_records,
)
from rillet.controller.metadata.quorum import (
    LIFECYCLE,
    BrokerState,
    ControllerConfig,
    CreatableTopic,
    HeartbeatEvent,
    PendingImages,
    QuorumController,
    topic_name_error,
)

E = code_of


class Cluster:
    """A test driver: applies each operation's records as one committed entry."""

    def __init__(self, brokers: int = 3, racks: int = 0, **config: Any) -> None:
        self.ctl = QuorumController(ControllerConfig(**config), random.Random(7))
        self.image: MetadataImage = EMPTY_IMAGE
        self.now = 1_000
        self.epochs: dict[int, int] = {}
        self.last_records: list = []
        for b in range(1, brokers + 1):
            self.register(b, rack=f"rack-{b % racks}" if racks else None)
            self.heartbeat(b)

    def run(self, result: Any) -> Any:
        records, response = result
        self.last_records = records
        if records:
            self.image = replay_records(self.image, records, self.image.offset + 1, 1)
        return response

    def register(self, b: int, incarnation: str | None = None, rack: str | None = None) -> Any:
        resp = self.run(
            self.ctl.register_broker(
                self.image,
                b,
                incarnation or f"inc-{b}",
                [("PLAINTEXT", "h", 9000 + b)],
                rack,
                self.now,
            )
        )
        if resp.error_code == 0:
            self.epochs[b] = resp.broker_epoch
        return resp

    def heartbeat(
        self, b: int, fence: bool = False, shutdown: bool = False, offset: int | None = None
    ) -> Any:
        offset = self.image.offset if offset is None else offset
        return self.run(
            self.ctl.broker_heartbeat(
                self.image, b, self.epochs[b], offset, fence, shutdown, self.now
            )
        )

    def beat_all_but(self, *silent: int) -> None:
        for b in self.image.unfenced_broker_ids():
            if b not in silent:
                self.heartbeat(b)

    def create(
        self,
        name: str,
        partitions: int = 1,
        rf: int = 3,
        configs: Any = None,
        assignments: Any = None,
    ) -> Any:
        if assignments is not None:
            partitions = rf = -1
        (result,) = self.run(
            self.ctl.create_topics(self.image, [(name, partitions, rf, configs or {}, assignments)])
        )
        return result

    def tick(self, ms: int) -> list:
        self.now += ms
        return self.run(self.ctl.tick(self.image, self.now)) or self.last_records

    def p(self, topic: str, partition: int = 0) -> Partition:
        part = self.image.partition(topic, partition)
        assert part is not None
        return part

    def alter(self, topic: str, isr: tuple[int, ...], partition: int = 0, **over: int) -> Any:
        p = self.p(topic, partition)
        args = dict(
            broker_id=p.leader,
            broker_epoch=self.epochs.get(p.leader, -1),
            leader_epoch=p.leader_epoch,
            partition_epoch=p.partition_epoch,
        )
        args.update(over)
        return self.run(
            self.ctl.alter_partition(
                self.image,
                args["broker_id"],
                args["broker_epoch"],
                topic,
                partition,
                args["leader_epoch"],
                args["partition_epoch"],
                isr,
            )
        )


# ---------------------------------------------------------------------------- lifecycle


def test_a_new_broker_is_fenced_until_it_catches_up_with_the_metadata_log() -> None:
    c = Cluster(brokers=0)
    resp = c.register(1)
    assert resp.error_code == 0 and c.image.brokers[1].fenced
    behind = c.heartbeat(1, offset=resp.broker_epoch - 1)
    assert (behind.is_caught_up, behind.is_fenced) == (False, True)
    assert c.last_records == []
    caught = c.heartbeat(1)
    assert (caught.is_caught_up, caught.is_fenced) == (True, False)
    assert c.last_records == [UnfenceBroker(1, resp.broker_epoch)]
    assert not c.image.brokers[1].fenced


def test_broker_epochs_grow_with_the_log() -> None:
    c = Cluster(brokers=3)
    assert c.epochs[1] < c.epochs[2] < c.epochs[3]
    assert c.epochs[3] <= c.image.offset


def test_heartbeat_from_an_unknown_broker_or_with_a_stale_epoch_is_refused() -> None:
    c = Cluster(brokers=1)
    stale = c.run(c.ctl.broker_heartbeat(c.image, 1, c.epochs[1] - 1, 99, False, False, c.now))
    assert stale.error_code == E("STALE_BROKER_EPOCH")
    unknown = c.run(c.ctl.broker_heartbeat(c.image, 9, 1, 99, False, False, c.now))
    assert unknown.error_code == E("BROKER_ID_NOT_REGISTERED")


def test_reregistering_with_the_same_incarnation_is_idempotent() -> None:
    c = Cluster(brokers=1)
    again = c.register(1)
    assert again.broker_epoch == c.epochs[1] and c.last_records == []
    assert not c.image.brokers[1].fenced


def test_a_second_incarnation_is_refused_while_the_first_is_alive() -> None:
    c = Cluster(brokers=1)
    c.now += 2_000
    dup = c.register(1, incarnation="other")
    assert dup.error_code == E("DUPLICATE_BROKER_REGISTRATION") and c.last_records == []


def test_a_restarted_broker_reregisters_after_its_session_expires() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3)
    leader, old_epoch = c.p("t").leader, c.epochs[c.p("t").leader]
    c.now += 3_001
    resp = c.register(leader, incarnation="after-restart")
    assert resp.error_code == 0 and resp.broker_epoch > old_epoch
    assert c.image.brokers[leader].fenced
    assert c.p("t").leader != leader and leader not in c.p("t").isr  # moved with the record
    stale = c.run(c.ctl.broker_heartbeat(c.image, leader, old_epoch, 99, False, False, c.now))
    assert stale.error_code == E("STALE_BROKER_EPOCH")


def test_want_fence_fences_an_active_broker() -> None:
    c = Cluster(brokers=2)
    resp = c.heartbeat(2, fence=True)
    assert resp.is_fenced and c.image.brokers[2].fenced
    assert c.heartbeat(2, fence=True).is_fenced  # stays fenced while it asks
    assert not c.heartbeat(2).is_fenced  # and unfences when it stops asking


def test_every_state_and_heartbeat_event_has_a_transition() -> None:
    assert set(LIFECYCLE) == {(s, e) for s in BrokerState for e in HeartbeatEvent}


# ---------------------------------------------------------------------------- fencing


def test_a_silent_broker_is_fenced_after_the_session_timeout_and_not_before() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3)
    leader = c.p("t").leader
    c.now += 2_900
    c.beat_all_but(leader)
    assert c.tick(100) == [] and not c.image.brokers[leader].fenced  # 3000 ms: not yet
    records = c.tick(1)
    assert FenceBroker(leader, c.epochs[leader]) in records
    assert c.image.brokers[leader].fenced


def test_fencing_moves_leadership_within_the_isr_and_bumps_both_epochs() -> None:
    c = Cluster(brokers=4)
    c.create("t", rf=3, assignments={0: [1, 2, 3]})
    c.alter("t", (1, 3))  # 2 fell out of the ISR
    before = c.p("t")
    c.now += 3_001
    c.beat_all_but(1)
    c.tick(0)
    after = c.p("t")
    assert after.leader == 3  # not 2: it is not in the ISR, though it comes first
    assert after.isr == (3,)
    assert after.leader_epoch == before.leader_epoch + 1
    assert after.partition_epoch == before.partition_epoch + 1


def test_fencing_a_follower_shrinks_the_isr_without_a_leader_change() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3, assignments={0: [1, 2, 3]})
    before = c.p("t")
    c.heartbeat(3, fence=True)
    after = c.p("t")
    assert (after.leader, after.isr, after.leader_epoch) == (1, (1, 2), before.leader_epoch)


def test_the_last_isr_member_stays_so_the_partition_goes_offline_not_empty() -> None:
    c = Cluster(brokers=2)
    c.create("t", rf=2, assignments={0: [1, 2]})
    c.alter("t", (1,))
    c.heartbeat(1, fence=True)
    p = c.p("t")
    assert p.leader == NO_LEADER and p.isr == (1,)  # 2 is live but was not in sync
    (meta,) = describe_topics(c.image, ["t"])
    assert meta.partitions[0].error_code == E("LEADER_NOT_AVAILABLE")
    assert meta.partitions[0].offline_replicas == (1,)


def test_a_fenced_isr_member_that_returns_leads_its_offline_partitions_again() -> None:
    c = Cluster(brokers=2)
    c.create("t", rf=2, assignments={0: [1, 2]})
    c.alter("t", (1,))
    c.heartbeat(1, fence=True)
    epoch = c.p("t").leader_epoch
    c.heartbeat(1)  # caught up and no longer asking to be fenced
    assert c.p("t").leader == 1 and c.p("t").leader_epoch == epoch + 1


def test_unclean_election_takes_an_out_of_sync_replica_when_the_topic_allows_it() -> None:
    c = Cluster(brokers=2)
    c.create("t", rf=2, configs={"unclean.leader.election.enable": "true"}, assignments={0: [1, 2]})
    c.alter("t", (1,))
    c.heartbeat(1, fence=True)
    assert c.p("t").leader == 2 and c.p("t").isr == (2,)


def test_several_silent_brokers_are_fenced_in_one_batch() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3, assignments={0: [1, 2, 3]})
    c.now += 3_001
    c.beat_all_but(1, 2)
    records = c.tick(0)
    assert {r.broker_id for r in records if isinstance(r, FenceBroker)} == {1, 2}
    assert (c.p("t").leader, c.p("t").isr) == (3, (3,))


def test_a_new_active_controller_gives_every_broker_a_full_session() -> None:
    c = Cluster(brokers=2)
    c.ctl = QuorumController(ControllerConfig(), random.Random(1))  # failover: no heartbeats
    c.now += 60_000
    assert c.tick(0) == []
    c.heartbeat(1)
    c.now += 3_001
    c.heartbeat(1)
    assert c.tick(0) == [FenceBroker(2, c.epochs[2])]


# ---------------------------------------------------------------------------- controlled shutdown


def test_controlled_shutdown_moves_leaderships_away_then_lets_the_broker_go() -> None:
    c = Cluster(brokers=3)
    c.create("t", partitions=6, rf=3)
    first = c.heartbeat(1, shutdown=True)
    assert not first.should_shut_down and c.last_records
    assert all(p.leader != 1 and 1 not in p.isr for _, p in c.image.iter_partitions())
    assert all(isinstance(r, PartitionChange) for r in c.last_records)
    second = c.heartbeat(1, shutdown=True)
    assert second.should_shut_down and second.is_fenced
    assert c.last_records == [FenceBroker(1, c.epochs[1])]
    restarted = c.register(1, incarnation="next")  # its session ended with the shutdown
    assert restarted.error_code == 0


def test_controlled_shutdown_waits_until_the_broker_has_seen_the_moves() -> None:
    c = Cluster(brokers=2)
    c.create("t", rf=2, assignments={0: [1, 2]})
    c.heartbeat(1, shutdown=True)
    lagging = c.heartbeat(1, shutdown=True, offset=c.image.offset - 1)
    assert not lagging.should_shut_down and c.last_records == []
    assert c.heartbeat(1, shutdown=True).should_shut_down


def test_a_shutting_down_broker_is_not_elected_nor_readmitted_to_an_isr() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3, assignments={0: [2, 1, 3]})
    c.heartbeat(1, shutdown=True)
    assert c.p("t").isr == (2, 3)
    resp = c.alter("t", (2, 1, 3))
    assert resp.error_code == E("INELIGIBLE_REPLICA")
    c.heartbeat(2, fence=True)
    assert c.p("t").leader == 3


def test_a_sole_isr_leader_shutting_down_leaves_the_partition_offline() -> None:
    c = Cluster(brokers=1)
    c.create("t", rf=1)
    c.heartbeat(1, shutdown=True)
    assert c.p("t").leader == NO_LEADER and c.p("t").isr == (1,)
    assert c.heartbeat(1, shutdown=True).should_shut_down


def test_a_fenced_broker_asking_to_shut_down_may_go_at_once() -> None:
    c = Cluster(brokers=2)
    c.heartbeat(2, fence=True)
    resp = c.heartbeat(2, shutdown=True)
    assert resp.should_shut_down and c.last_records == []


# ---------------------------------------------------------------------------- create topics


def test_create_topic_places_balanced_replicas_on_live_brokers() -> None:
    c = Cluster(brokers=3)
    result = c.create("orders", partitions=6, rf=2, configs={"retention.ms": 1000})
    assert result.error_code == 0 and result.num_partitions == 6 and result.replication_factor == 2
    t = c.image.topic("orders")
    assert t is not None and t.topic_id == result.topic_id
    leaders = [p.leader for p in t.partitions.values()]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    for p in t.partitions.values():
        assert p.leader == p.replicas[0] and p.isr == p.replicas
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
    assert c.image.topic_config("orders") == {"retention.ms": "1000"}


def test_create_topic_uses_racks_and_skips_fenced_brokers() -> None:
    c = Cluster(brokers=6, racks=3)
    c.heartbeat(6, fence=True)
    c.create("r", partitions=10, rf=3)
    racks = {b: reg.rack for b, reg in c.image.brokers.items()}
    for _, p in c.image.iter_partitions():
        assert 6 not in p.replicas
        assert len({racks[b] for b in p.replicas}) == 3


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a" * 250, "has space", "slash/", "ünïcode", "colon:"]
)
def test_illegal_topic_names_are_refused(name: str) -> None:
    c = Cluster(brokers=1)
    assert c.create(name, rf=1).error_code == E("INVALID_TOPIC_EXCEPTION")
    assert topic_name_error(name) is not None


def test_legal_topic_names_pass() -> None:
    for name in ["a", "A-b_c.9", "x" * 249, "..."]:
        assert topic_name_error(name) is None


def test_create_topic_errors() -> None:
    c = Cluster(brokers=3)
    c.heartbeat(3, fence=True)
    assert c.create("t", rf=2).error_code == 0
    assert c.create("t", rf=1).error_code == E("TOPIC_ALREADY_EXISTS")
    assert c.create("u", rf=3).error_code == E("INVALID_REPLICATION_FACTOR")  # 2 live
    assert c.create("u", rf=0).error_code == E("INVALID_REPLICATION_FACTOR")
    assert c.create("u", partitions=0, rf=1).error_code == E("INVALID_PARTITIONS")
    assert c.create("u", rf=1, configs={"no.such.key": "1"}).error_code == E("INVALID_CONFIG")
    bad_values = [
        ("retention.ms", "soon"),
        ("cleanup.policy", "shred"),
        ("min.insync.replicas", "0"),
        ("unclean.leader.election.enable", "yes"),
    ]
    for key, value in bad_values:
        assert c.create("u", rf=1, configs={key: value}).error_code == E("INVALID_CONFIG")
    c.create("a.b", rf=1)
    assert c.create("a_b", rf=1).error_code == E("INVALID_TOPIC_EXCEPTION")  # collides
    assert c.image.topic("u") is None


def test_topics_of_one_request_whose_names_collide_are_not_both_created() -> None:
    c = Cluster(brokers=3)
    asked = [CreatableTopic("x.y", 1, 1), CreatableTopic("x_y", 1, 1), CreatableTopic("z", 1, 1)]
    results = c.run(c.ctl.create_topics(c.image, asked))
    assert [r.error_code for r in results] == [0, E("INVALID_TOPIC_EXCEPTION"), 0]
    assert "'x.y'" in results[1].error_message
    assert c.image.topic("x_y") is None and c.image.topic("x.y") is not None


def test_create_topic_with_defaults_and_canonical_configs() -> None:
    c = Cluster(brokers=3, default_num_partitions=4, default_replication_factor=2)
    result = c.create(
        "d",
        partitions=-1,
        rf=-1,
        configs={"cleanup.policy": "compact, delete", "unclean.leader.election.enable": True},
    )
    assert (result.num_partitions, result.replication_factor) == (4, 2)
    assert result.configs == {
        "cleanup.policy": "delete,compact",
        "unclean.leader.election.enable": "true",
    }


def test_validate_only_answers_without_records() -> None:
    c = Cluster(brokers=3)
    records, (result,) = c.ctl.create_topics(c.image, [("v", 3, 3, {}, None)], validate_only=True)
    assert records == [] and result.error_code == 0


def test_a_name_twice_in_one_request_is_refused_for_both() -> None:
    c = Cluster(brokers=1)
    records, results = c.ctl.create_topics(c.image, [CreatableTopic("d", 1, 1), ("d", 1, 1)])
    assert records == [] and [r.error_code for r in results] == [E("INVALID_REQUEST")] * 2


def test_several_topics_in_one_request_get_distinct_ids() -> None:
    c = Cluster(brokers=1)
    results = c.run(c.ctl.create_topics(c.image, [("a", 1, 1), ("b", 2, 1), ("c", 1, 1)]))
    assert len({r.topic_id for r in results}) == 3 and c.image.partition_count() == 4


def test_manual_assignments_are_checked_and_used() -> None:
    c = Cluster(brokers=3)
    c.heartbeat(3, fence=True)
    ok = c.create("m", partitions=-1, rf=-1, assignments={0: [3, 1], 1: [2, 3]})
    assert ok.error_code == 0
    assert (c.p("m", 0).replicas, c.p("m", 0).isr, c.p("m", 0).leader) == ((3, 1), (1,), 1)
    bad = [
        ({0: [1, 1]}, "INVALID_REPLICA_ASSIGNMENT"),
        ({0: [1, 9]}, "INVALID_REPLICA_ASSIGNMENT"),
        ({0: [1, 2], 1: [1]}, "INVALID_REPLICA_ASSIGNMENT"),
        ({0: [3]}, "INVALID_REPLICA_ASSIGNMENT"),  # every replica fenced
        ({1: [1]}, "INVALID_PARTITIONS"),
    ]
    for i, (assignment, error) in enumerate(bad):
        assert c.create(f"bad{i}", partitions=-1, rf=-1, assignments=assignment).error_code == E(
            error
        )
    both = c.run(c.ctl.create_topics(c.image, [("both", 1, 1, {}, {0: [1]})]))
    assert both[0].error_code == E("INVALID_REQUEST")


# ---------------------------------------------------------------------------- delete / configs


def test_delete_topics_removes_topic_and_configs_and_reports_unknown_names() -> None:
    c = Cluster(brokers=1)
    c.create("gone", rf=1, configs={"retention.ms": "5"})
    results = c.run(c.ctl.delete_topics(c.image, ["gone", "never"]))
    assert [r.error_code for r in results] == [0, E("UNKNOWN_TOPIC_OR_PARTITION")]
    assert c.image.topic("gone") is None and c.image.topic_config("gone") == {}


def test_alter_topic_configs_sets_and_deletes_keys() -> None:
    c = Cluster(brokers=1)
    c.create("cfg", rf=1, configs={"retention.ms": "5"})
    resp = c.run(
        c.ctl.alter_topic_configs(c.image, "cfg", {"retention.ms": None, "segment.ms": "60000"})
    )
    assert resp.error_code == 0 and c.image.topic_config("cfg") == {"segment.ms": "60000"}
    bad = c.run(c.ctl.alter_topic_configs(c.image, "cfg", {"segment.ms": "-5"}))
    assert bad.error_code == E("INVALID_CONFIG")
    missing = c.run(c.ctl.alter_topic_configs(c.image, "nope", {"segment.ms": "1"}))
    assert missing.error_code == E("UNKNOWN_TOPIC_OR_PARTITION")


def test_a_compacted_topic_cannot_be_tiered_on_create_or_alter() -> None:
    c = Cluster(brokers=1)
    for policy in ("compact", "compact,delete"):
        refused = c.create(
            "t", rf=1, configs={"cleanup.policy": policy, "remote.storage.enable": "true"}
        )
        assert refused.error_code == E("INVALID_CONFIG") and c.image.topic("t") is None
        assert "cleanup.policy=delete" in refused.error_message
    assert c.create("c", rf=1, configs={"cleanup.policy": "compact"}).error_code == 0
    on = c.run(c.ctl.alter_topic_configs(c.image, "c", {"remote.storage.enable": "true"}))
    assert on.error_code == E("INVALID_CONFIG")
    assert c.create("r", rf=1, configs={"remote.storage.enable": "true"}).error_code == 0
    compact = c.run(c.ctl.alter_topic_configs(c.image, "r", {"cleanup.policy": "compact"}))
    assert compact.error_code == E("INVALID_CONFIG") and "compact" in compact.error_message
    assert c.image.topic_config("r") == {"remote.storage.enable": "true"}


def test_tiering_cannot_be_turned_off_by_value_or_by_deleting_the_key() -> None:
    c = Cluster(brokers=1)
    c.create("r", rf=1, configs={"remote.storage.enable": "true"})
    for change in ({"remote.storage.enable": "false"}, {"remote.storage.enable": None}):
        refused = c.run(c.ctl.alter_topic_configs(c.image, "r", change))
        assert refused.error_code == E("INVALID_CONFIG"), change
        assert "orphaned" in refused.error_message and "delete it" in refused.error_message
        assert c.image.topic_config("r") == {"remote.storage.enable": "true"}
    # Setting it again, or changing other keys, is fine; so is turning it on later.
    again = {"remote.storage.enable": "true", "segment.ms": "60000"}
    assert c.run(c.ctl.alter_topic_configs(c.image, "r", again)).error_code == 0
    c.create("p", rf=1)
    on = c.run(c.ctl.alter_topic_configs(c.image, "p", {"remote.storage.enable": "true"}))
    assert on.error_code == 0


@pytest.mark.parametrize("unit,total", [("ms", "60000"), ("bytes", "1000000")])
def test_local_retention_is_bounded_by_total_retention_on_tiered_topics(
    unit: str, total: str
) -> None:
    c = Cluster(brokers=1)
    tiered = {"remote.storage.enable": "true", f"retention.{unit}": total}

    def create(name: str, local: str, **more: str) -> Any:
        configs = tiered | {f"local.retention.{unit}": local} | more
        return c.create(name, rf=1, configs=configs)

    for local in ("-1", str(int(total) + 1)):  # -1 keeps locally forever: longer than total
        refused = create(f"bad{local}", local)
        assert refused.error_code == E("INVALID_CONFIG"), local
        assert f"local.retention.{unit}" in refused.error_message
    assert create("low", "-3").error_code == E("INVALID_CONFIG")  # -2 is the minimum
    for i, local in enumerate(("-2", "0", total)):
        assert create(f"ok{i}", local).error_code == 0
    # Unbounded total retention bounds nothing; without tiering local retention is unused.
    assert create("forever", "-1", **{f"retention.{unit}": "-1"}).error_code == 0
    plain = {f"retention.{unit}": total, f"local.retention.{unit}": "-1"}
    assert c.create("plain", rf=1, configs=plain).error_code == 0
    # An alter is checked whichever of the two keys it changes.
    for change in ({f"retention.{unit}": "0"}, {f"local.retention.{unit}": str(int(total) * 2)}):
        refused = c.run(c.ctl.alter_topic_configs(c.image, "ok2", change))
        assert refused.error_code == E("INVALID_CONFIG"), change
    deleted = c.run(c.ctl.alter_topic_configs(c.image, "forever", {f"retention.{unit}": None}))
    assert deleted.error_code == (0 if unit == "bytes" else E("INVALID_CONFIG"))
    on = c.run(c.ctl.alter_topic_configs(c.image, "plain", {"remote.storage.enable": "true"}))
    assert on.error_code == E("INVALID_CONFIG")


def test_a_tiered_topic_refuses_unclean_leader_election_on_create_or_alter() -> None:
    """Either key may be the one that changes: a tiered topic turning unclean election
    on, or a topic with unclean election turning the tier on."""
    c = Cluster(brokers=1)
    both = {"remote.storage.enable": "true", "unclean.leader.election.enable": "true"}
    refused = c.create("t", rf=1, configs=both)
    assert refused.error_code == E("INVALID_CONFIG") and c.image.topic("t") is None
    assert "unclean.leader.election.enable=false" in refused.error_message
    assert "leader epoch" in refused.error_message  # says why
    assert c.create("r", rf=1, configs={"remote.storage.enable": "true"}).error_code == 0
    on = {"unclean.leader.election.enable": "true"}
    refused = c.run(c.ctl.alter_topic_configs(c.image, "r", on))
    assert refused.error_code == E("INVALID_CONFIG") and "ISR" in refused.error_message
    assert c.image.topic_config("r") == {"remote.storage.enable": "true"}
    assert c.create("u", rf=1, configs=on).error_code == 0
    tier = {"remote.storage.enable": "true"}
    assert c.run(c.ctl.alter_topic_configs(c.image, "u", tier)).error_code == E("INVALID_CONFIG")
    assert c.image.topic_config("u") == on
    # Both at once in one alter, too; turning it off again (or deleting it) is fine.
    assert c.run(c.ctl.alter_topic_configs(c.image, "u", on | tier)).error_code == E(
        "INVALID_CONFIG"
    )
    off = {"unclean.leader.election.enable": None, "remote.storage.enable": "true"}
    assert c.run(c.ctl.alter_topic_configs(c.image, "u", off)).error_code == 0
    assert c.image.topic_config("u") == tier
    explicit_off = {"unclean.leader.election.enable": "false"}
    assert c.run(c.ctl.alter_topic_configs(c.image, "r", explicit_off)).error_code == 0


def test_unregistering_a_broker_moves_its_leaderships_first() -> None:
    c = Cluster(brokers=2)
    c.create("t", rf=2, assignments={0: [1, 2]})
    assert c.run(c.ctl.unregister_broker(c.image, 1)) == 0
    assert 1 not in c.image.brokers and c.p("t").leader == 2
    assert c.run(c.ctl.unregister_broker(c.image, 1)) == E("BROKER_ID_NOT_REGISTERED")


# ---------------------------------------------------------------------------- AlterPartition


def test_the_leader_shrinks_and_expands_the_isr() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3, assignments={0: [1, 2, 3]})
    shrunk = c.alter("t", (1, 2))
    assert shrunk.error_code == 0 and shrunk.isr == (1, 2) and shrunk.partition_epoch == 1
    assert shrunk.leader_epoch == 0  # an ISR change keeps the leader epoch
    grown = c.alter("t", (1, 2, 3))
    assert grown.isr == (1, 2, 3) and c.p("t").partition_epoch == 2


def test_alter_partition_with_a_stale_partition_epoch_is_refused() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3, assignments={0: [1, 2, 3]})
    c.alter("t", (1, 2))
    resp = c.alter("t", (1,), partition_epoch=0)
    assert resp.error_code == E("INVALID_UPDATE_VERSION") and c.last_records == []


def test_a_retried_alter_partition_whose_answer_was_lost_succeeds_without_records() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3, assignments={0: [1, 2, 3]})
    c.alter("t", (1, 2))
    retry = c.alter("t", (1, 2), partition_epoch=0)
    assert retry.error_code == 0 and retry.partition_epoch == 1 and c.last_records == []


def test_alter_partition_epoch_and_leadership_checks() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3, assignments={0: [1, 2, 3]})
    c.heartbeat(1, fence=True)  # leadership moves to 2, leader epoch 1
    assert c.alter("t", (2,), broker_id=1, broker_epoch=c.epochs[1]).error_code == E(
        "NOT_LEADER_OR_FOLLOWER"
    )
    assert c.alter("t", (2,), leader_epoch=0).error_code == E("FENCED_LEADER_EPOCH")
    assert c.alter("t", (2,), leader_epoch=5).error_code == E("UNKNOWN_LEADER_EPOCH")
    assert c.alter("t", (2,), broker_epoch=0).error_code == E("STALE_BROKER_EPOCH")
    assert c.alter("t", (2, 1)).error_code == E("INELIGIBLE_REPLICA")  # 1 is fenced
    assert c.alter("t", (3,)).error_code == E("INVALID_REQUEST")  # leader missing
    assert c.alter("t", (2, 9)).error_code == E("INELIGIBLE_REPLICA")  # not a replica
    missing = c.run(c.ctl.alter_partition(c.image, 2, c.epochs[2], "t", 7, 0, 0, (2,)))
    assert missing.error_code == E("UNKNOWN_TOPIC_OR_PARTITION")


# ---------------------------------------------------------------------------- leader elections


def test_preferred_leader_election_brings_leadership_home() -> None:
    c = Cluster(brokers=2)
    c.create("t", rf=2, assignments={0: [1, 2]})
    c.heartbeat(1, fence=True)
    c.heartbeat(1)
    c.alter("t", (2, 1))  # 1 caught up and rejoined
    results = c.run(c.ctl.elect_preferred_leaders(c.image, ["t", "nope"]))
    assert [r.error_code for r in results] == [0, E("UNKNOWN_TOPIC_OR_PARTITION")]
    assert c.p("t").leader == 1
    again = c.run(c.ctl.elect_preferred_leaders(c.image))
    assert [r.error_code for r in again] == [E("ELECTION_NOT_NEEDED")]


def test_preferred_leader_not_in_the_isr_is_not_available() -> None:
    c = Cluster(brokers=2)
    c.create("t", rf=2, assignments={0: [1, 2]})
    c.heartbeat(1, fence=True)
    c.heartbeat(1)  # back, but not yet in the ISR
    (result,) = c.run(c.ctl.elect_preferred_leaders(c.image, ["t"]))
    assert result.error_code == E("PREFERRED_LEADER_NOT_AVAILABLE") and c.p("t").leader == 2


def test_automatic_rebalance_moves_drifted_leaders_after_the_check_interval() -> None:
    c = Cluster(brokers=2, leader_imbalance_check_interval_ms=10_000)
    c.create("t", partitions=4, rf=2)
    c.tick(0)  # arms the timer
    c.heartbeat(1, fence=True)
    c.heartbeat(1)
    for p in range(4):
        part = c.p("t", p)
        if 1 not in part.isr:
            c.alter("t", (*part.isr, 1), partition=p)
    assert all(c.p("t", p).leader == 2 for p in range(4))
    c.now += 5_000
    c.beat_all_but()
    assert c.tick(0) == []  # not yet time
    c.now += 5_000
    c.beat_all_but()
    c.tick(0)
    assert sorted(c.p("t", p).leader for p in range(4)) == [1, 1, 2, 2]


def test_automatic_rebalance_can_be_switched_off() -> None:
    c = Cluster(brokers=1, auto_leader_rebalance_enable=False)
    assert c.ctl.maybe_rebalance_leaders(c.image, 10**12) == []


# ---------------------------------------------------------------------------- reassignment


def test_reassignment_adds_targets_then_completes_when_they_join_the_isr() -> None:
    c = Cluster(brokers=4)
    c.create("t", rf=2, assignments={0: [1, 2]})
    (result,) = c.run(c.ctl.reassign_partitions(c.image, [("t", 0, [3, 4])]))
    p = c.p("t")
    assert result.error_code == 0
    assert (p.replicas, p.adding_replicas, p.removing_replicas) == ((3, 4, 1, 2), (3, 4), (1, 2))
    assert p.leader == 1 and p.isr == (1, 2)
    c.alter("t", (1, 2, 3))
    assert c.p("t").is_reassigning  # 4 still catching up
    resp = c.alter("t", (1, 2, 3, 4))
    p = c.p("t")
    assert (p.replicas, p.isr, p.adding_replicas, p.removing_replicas) == ((3, 4), (3, 4), (), ())
    assert p.leader == 3 and resp.leader == 3  # the old leader was removed


def test_a_reassignment_within_the_isr_completes_at_once() -> None:
    c = Cluster(brokers=3)
    c.create("t", rf=3, assignments={0: [1, 2, 3]})
    c.run(c.ctl.reassign_partitions(c.image, [("t", 0, [2, 3])]))
    p = c.p("t")
    assert (p.replicas, p.isr, p.leader, p.is_reassigning) == ((2, 3), (2, 3), 2, False)


def test_cancelling_a_reassignment_restores_the_original_replicas() -> None:
    c = Cluster(brokers=4)
    c.create("t", rf=2, assignments={0: [1, 2]})
    c.run(c.ctl.reassign_partitions(c.image, [("t", 0, [3, 4])]))
    (result,) = c.run(c.ctl.reassign_partitions(c.image, [("t", 0, None)]))
    p = c.p("t")
    assert result.error_code == 0 and (p.replicas, p.is_reassigning) == ((1, 2), False)
    (none,) = c.run(c.ctl.reassign_partitions(c.image, [("t", 0, None)]))
    assert none.error_code == E("NO_REASSIGNMENT_IN_PROGRESS")


def test_reassignment_errors() -> None:
    c = Cluster(brokers=2)
    c.create("t", rf=1, assignments={0: [1]})
    results = c.run(
        c.ctl.reassign_partitions(c.image, [("t", 0, [1, 1]), ("t", 0, [7]), ("x", 0, [1])])
    )
    assert [r.error_code for r in results] == [
        E("INVALID_REPLICA_ASSIGNMENT"),
        E("INVALID_REPLICA_ASSIGNMENT"),
        E("UNKNOWN_TOPIC_OR_PARTITION"),
    ]


@pytest.mark.parametrize("seed", range(40))
def test_a_request_naming_a_partition_twice_moves_it_as_two_requests_would(seed: int) -> None:
    # Each move was planned on the image before the request: a later move of the same
    # partition undid part of an earlier one, and the records did not apply ("adding not
    # within replicas"), answered as an unknown server error, or half proposed when the
    # request spanned several entries.
    rng = random.Random(seed)
    targets = [list(t) for r in (1, 2, 3) for t in itertools.permutations((1, 2, 3, 4), r)]
    moves = [("t", 0, rng.choice([*targets, None])) for _ in range(rng.randint(2, 4))]
    one, apart = Cluster(brokers=4), Cluster(brokers=4)
    for c in (one, apart):
        c.create("t", rf=3, assignments={0: [1, 2, 3]})
    together = one.run(one.ctl.reassign_partitions(one.image, moves))
    separately = [apart.run(apart.ctl.reassign_partitions(apart.image, [mv]))[0] for mv in moves]
    assert [r.error_code for r in together] == [r.error_code for r in separately]
    check_partition(one.p("t"))
    assert one.p("t") == apart.p("t"), moves


# ---------------------------------------------------------------- reads and the driver seam


def test_describe_cluster_lists_unfenced_brokers_with_their_endpoints() -> None:
    c = Cluster(brokers=3)
    c.heartbeat(2, fence=True)
    desc = describe_cluster(c.image, "cluster-1", controller_id=100)
    assert [(b.broker_id, b.port) for b in desc.brokers] == [(1, 9001), (3, 9003)]
    every = describe_cluster(c.image, "cluster-1", 100, include_fenced=True)
    assert [b.broker_id for b in every.brokers] == [1, 2, 3]


def test_describe_topics_reads_leaders_and_reports_unknown_topics() -> None:
    c = Cluster(brokers=2)
    c.create("t", partitions=2, rf=2)
    meta = {m.name: m for m in describe_topics(c.image, ["t", "nope"])}
    assert meta["nope"].error_code == E("UNKNOWN_TOPIC_OR_PARTITION")
    assert [p.leader for p in meta["t"].partitions] == [c.p("t", 0).leader, c.p("t", 1).leader]


def test_pending_images_let_the_next_operation_see_uncommitted_records() -> None:
    ctl = QuorumController(rng=random.Random(3))
    images = PendingImages(EMPTY_IMAGE)
    records, first = ctl.register_broker(images.pending, 1, "i", [("P", "h", 1)], None, 0)
    images.propose(records, 1, 1)
    records2, dup = ctl.register_broker(images.pending, 1, "j", [("P", "h", 1)], None, 1)
    assert dup.error_code == E("DUPLICATE_BROKER_REGISTRATION") and records2 == []
    assert images.committed is EMPTY_IMAGE and 1 in images.pending.brokers
    delta, committed = images.commit([(1, 1, records)])
    assert committed.brokers[1].broker_epoch == first.broker_epoch
    assert delta.changed_brokers[1] == records[0]
    assert images.pending is committed


def test_pending_images_reset_drops_uncommitted_proposals() -> None:
    images = PendingImages(EMPTY_IMAGE)
    images.propose([RegisterBroker(1, "i", 1)], 1, 1)
    images.propose([RegisterBroker(2, "i", 2)], 2, 1)
    _, committed = images.commit([(1, 1, [RegisterBroker(1, "i", 1)]), (2, 2, [NoOp()])])
    assert set(committed.brokers) == {1} and committed.offset == 2
    assert images.pending is committed  # proposal 2 was superseded by the new leader's entry
    images.propose([RegisterBroker(3, "i", 3)], 3, 2)
    images.reset()
    assert images.pending is images.committed


# ------------------------------------------------------------------ AlterPartition batches


class _HandlerServer:
    """What controller/handlers.py's alter_partition reads of the server: ``commit``,
    which runs the operation's plan on the pending image and keeps its records (as one
    Raft entry would hold them)."""

    def __init__(self, image: MetadataImage) -> None:
        self.images = PendingImages(image)
        self.entries: list[list[Any]] = []

    async def commit(self, ctl: Any, plan: Any) -> Any:
        records, answer = plan(self.images.pending)
        self.entries.append(list(records))
        return answer


def _isr_item(p: Partition, isr: tuple[int, ...], partition_epoch: int | None = None) -> Any:
    epoch = p.partition_epoch if partition_epoch is None else partition_epoch
    return m.IsrProposal(p.partition, p.leader_epoch, list(isr), epoch)


async def test_one_alter_partition_request_of_many_partitions_rebuilds_no_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker batches every pending ISR change into one request. The items are of
    distinct partitions, whose checks read only their own partition and the brokers, so
    the handler checks them all against the pending image: rebuilding the image after
    each one (a copy of the topic's partition map each time) made a request of thousands
    of partitions of one topic quadratic."""
    c = Cluster()
    c.create("t", partitions=600, rf=3)
    leader = c.p("t", 0).leader
    led = [p for _, p in c.image.partitions_led_by(leader)]
    assert len(led) >= 100
    rebuilds = []
    real = handlers.replay_records
    monkeypatch.setattr(
        handlers, "replay_records", lambda *a, **k: rebuilds.append(1) or real(*a, **k)
    )
    server = _HandlerServer(c.image)
    request = m.AlterPartitionRequest(
        broker_id=leader,
        broker_epoch=c.epochs[leader],
        topics=[m.AlterPartitionTopic("t", [_isr_item(p, p.isr[:2]) for p in led])],
    )
    response = await handlers.alter_partition(server, c.ctl, request)  # type: ignore[arg-type]
    (topic,) = response.topics
    assert [r.partition for r in topic.partitions] == [p.partition for p in led]
    assert all(r.error_code == 0 for r in topic.partitions)
    assert [tuple(r.isr) for r in topic.partitions] == [p.isr[:2] for p in led]
    assert [r.partition_epoch for r in topic.partitions] == [p.partition_epoch + 1 for p in led]
    (entry,) = server.entries
    assert sorted(rec.partition for rec in entry) == sorted(p.partition for p in led)
    assert rebuilds == []


async def test_a_partition_twice_in_one_alter_partition_request_sees_its_first_change() -> None:
    c = Cluster()
    c.create("t", partitions=2, rf=3)
    p, other = c.p("t", 0), c.p("t", 1)
    server = _HandlerServer(c.image)
    items = [_isr_item(p, p.isr[:2]), _isr_item(p, p.isr[:1], p.partition_epoch + 1)]
    if other.leader == p.leader:
        items.insert(1, _isr_item(other, other.isr[:2]))
    request = m.AlterPartitionRequest(
        broker_id=p.leader,
        broker_epoch=c.epochs[p.leader],
        topics=[m.AlterPartitionTopic("t", items)],
    )
    response = await handlers.alter_partition(server, c.ctl, request)  # type: ignore[arg-type]
    results = response.topics[0].partitions
    assert all(r.error_code == 0 for r in results)
    assert tuple(results[-1].isr) == p.isr[:1]
    assert results[-1].partition_epoch == p.partition_epoch + 2


def test_tiering_checks_start_from_the_controllers_log_defaults() -> None:
    c = Cluster(brokers=1, topic_defaults={"cleanup.policy": "compact", "retention.ms": "1000"})
    refused = c.create("t", rf=1, configs={"remote.storage.enable": "true"})
    assert refused.error_code == E("INVALID_CONFIG") and "compact" in refused.error_message
    local = {"remote.storage.enable": "true", "cleanup.policy": "delete"}
    too_long = c.create("u", rf=1, configs={**local, "local.retention.ms": "5000"})
    assert (
        too_long.error_code == E("INVALID_CONFIG") and "retention.ms=1000" in too_long.error_message
    )
    assert c.create("v", rf=1, configs=local).error_code == 0
