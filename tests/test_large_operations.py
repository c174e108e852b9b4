"""Large metadata operations: bounded entries, building topics, orphan aborts.

A CreateTopics of thousands of partitions is proposed as several bounded Raft entries
(docs/controller.md, "Large operations"); these tests pin what that must preserve: the
entries stay within their limits, the image after the last one equals the image of one
big entry, nobody outside the controller sees a half-created topic, and a leader change
half-way through leaves a consistent image with the topic removed.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from test_controller_state_machine import Quorum, register

from rillet.client.wire.errors import PolicyViolationError
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    RESOURCE_TOPIC,
    Config,
    Endpoint,
    MetadataDelta,
    MetadataImage,
    MetadataRecord,
    Partition,
    PartitionMap,
    RegisterBroker,
    RemoveTopic,
    Topic,
    decode_records,
    decode_snapshot,
    encode_snapshot,
    replay_records,
)
from rillet.controller.metadata.quorum import (
    ControllerConfig,
    CreatableTopic,
    PendingImages,
    QuorumController,
)
from rillet.controller.raft.core import Role
from rillet.controller.state_machine import ControllerStateMachine, EntryLimits, split_records

BROKERS = (1, 2, 3)


def brokers_image() -> MetadataImage:
    regs = [RegisterBroker(b, f"inc{b}", b, (Endpoint("B", "h", b),), None, False) for b in BROKERS]
    return replay_records(EMPTY_IMAGE, regs, 3, 1)


def plan_topic(image: MetadataImage, name: str, partitions: int) -> list[MetadataRecord]:
    ctl = QuorumController(ControllerConfig(), random.Random(7))
    records, results = ctl.create_topics(image, [CreatableTopic(name, partitions, 3, {}, None)])
    assert results[0].error_code == 0, results[0]
    return records


def test_split_entries_stay_within_their_limits_and_keep_record_order() -> None:
    records = plan_topic(brokers_image(), "big", 5000)
    limits = EntryLimits(max_records=700, max_bytes=16 * 1024)
    chunks = list(split_records(records, limits))
    assert len(chunks) > len(records) // 700  # the byte limit cut some further
    for part, data in chunks:
        assert 1 <= len(part) <= 700 and len(data) <= 16 * 1024
        assert decode_records(data) == part
    assert [r for part, _ in chunks for r in part] == records
    # A record bigger than the byte limit still goes, alone.
    ((part, data),) = list(split_records(records[:1], EntryLimits(max_bytes=8)))
    assert part == records[:1] and len(data) > 8


def test_a_topic_split_over_entries_is_invisible_until_complete_then_whole() -> None:
    base = brokers_image()
    records = plan_topic(base, "big", 2500)
    chunks = list(split_records(records, EntryLimits(max_records=1000)))
    assert len(chunks) == 3
    image = base
    for i, (part, _) in enumerate(chunks):
        delta = MetadataDelta(image)
        delta.replay_all(part, 10 + i, 1)
        image = delta.apply()
        done = i == len(chunks) - 1
        assert (image.topic("big") is not None) == done
        assert image.partition_count() == (2500 if done else 0)
        assert len(image.building_topics) == (0 if done else 1)
        local = delta.local_changes(1)
        assert len(local.leaders) + len(local.followers) == (2500 if done else 0)
        assert set(delta.created_topics.values()) == ({"big"} if done else set())
        # A snapshot taken half-way holds the building topic and restores it.
        assert decode_snapshot(encode_snapshot(image)) == image
    whole = replay_records(base, records, 12, 1)
    assert image == whole


def test_an_orphaned_building_topic_is_removed_and_its_name_freed() -> None:
    base = brokers_image()
    records = plan_topic(base, "big", 2500)
    first, *_ = list(split_records(records, EntryLimits(max_records=1000)))
    half = replay_records(base, first[0], 10, 1)
    (topic_id,) = half.building_topics
    creating = QuorumController(ControllerConfig(), random.Random(1))
    creating.building.add(topic_id)
    assert creating.abort_orphan_topics(half) == []  # its own operation is still going
    records, _ = creating.create_topics(half, [CreatableTopic("big", 3, 3, {}, None)])
    assert records == []  # the name is taken while it builds
    new_leader = QuorumController(ControllerConfig(), random.Random(2))
    abort = new_leader.tick(half, 0).records
    assert abort == [RemoveTopic(topic_id)]
    delta = MetadataDelta(half)
    delta.replay_all(abort, 11, 2)
    after = delta.apply()
    assert after.building_topics == {} and after.topic("big") is None
    assert delta.local_changes(1).deletes == frozenset()  # no broker ever had it
    assert after == dataclasses.replace(base, offset=11, epoch=2)
    again, results = new_leader.create_topics(after, [CreatableTopic("big", 3, 3, {}, None)])
    assert results[0].error_code == 0 and again


def test_fencing_a_broker_moves_leadership_off_building_partitions_too() -> None:
    base = brokers_image()
    records = plan_topic(base, "big", 2500)
    first, *_ = list(split_records(records, EntryLimits(max_records=1000)))
    half = replay_records(base, first[0], 10, 1)
    ctl = QuorumController(ControllerConfig(), random.Random(1))
    moves = ctl._fence_records(half, [1])
    after = replay_records(half, moves, 11, 1)
    (building,) = after.building_topics.values()
    assert all(p.leader != 1 and 1 not in p.isr for p in building.partitions.values())


def test_committing_our_own_proposals_keeps_pending_equal_to_a_rebuild() -> None:
    base = brokers_image()
    records = plan_topic(base, "big", 2500)
    chunks = list(split_records(records, EntryLimits(max_records=500)))
    images = PendingImages(base)
    entries = [(10 + i, 1, part) for i, (part, _) in enumerate(chunks)]
    for offset, epoch, part in entries:
        images.propose(part, offset, epoch)
    final = images.pending
    for entry in entries:
        images.commit([entry])
        rebuilt = replay_records(images.committed, [], -1, -1)
        for offset, epoch, part in entries:
            if offset > images.committed.offset:
                rebuilt = replay_records(rebuilt, part, offset, epoch)
        assert images.pending == (rebuilt if images.committed.offset < 14 else final)
    assert images.committed == final == images.pending


def unfenced_quorum(limits: EntryLimits) -> Quorum:
    q = Quorum()
    for machine in q.machines.values():
        machine.entry_limits = limits
    q.elect(1)
    q.run(100)
    active = q.machines[1]
    for b in BROKERS:
        active.propose(register(active, b))
        q.run(20)
        assert active.ctl is not None
        epoch = active.image.brokers[b].broker_epoch
        records, _ = active.ctl.broker_heartbeat(
            active.images.pending, b, epoch, active.image.offset, False, False, q.now_ms
        )
        active.propose(records)
        q.run(20)
    assert active.image.unfenced_broker_ids() == list(BROKERS)
    return q


def plan_on(machine: ControllerStateMachine, name: str, partitions: int) -> list[MetadataRecord]:
    assert machine.ctl is not None
    topics = [CreatableTopic(name, partitions, 3, {}, None)]
    records, results = machine.ctl.create_topics(machine.images.pending, topics)
    assert results[0].error_code == 0
    return records


def test_a_split_proposal_commits_on_every_controller_as_one_topic() -> None:
    q = unfenced_quorum(EntryLimits(max_records=40))
    active = q.machines[1]
    records = plan_on(active, "big", 150)
    outcomes: list[Exception | None] = []
    first = q.nodes[1].log.last_index() + 1
    last = active.propose(records, outcomes.append)
    assert last - first + 1 == 4  # 151 records in entries of 40
    q.run(100)
    assert outcomes == [None]
    images = [m.image for m in q.machines.values()]
    assert all(im.topic("big") is not None and im.partition_count() == 150 for im in images)
    assert images[0].topics_by_id == images[1].topics_by_id == images[2].topics_by_id


def test_a_leader_change_half_way_through_a_split_proposal_leaves_no_half_topic() -> None:
    q = unfenced_quorum(EntryLimits(max_records=40))
    old = q.machines[1]
    records = plan_on(old, "big", 150)
    chunks = list(old.split(records))
    assert old.ctl is not None
    old.ctl.building.add(next(r.topic_id for r in records if isinstance(r, Topic)))
    for chunk in chunks[:2]:  # these commit everywhere
        old.propose_chunk(chunk)
    q.run(500)  # a heartbeat tells the followers the commit index
    assert all(len(m.image.building_topics) == 1 for m in q.machines.values())
    assert all(m.image.topic("big") is None for m in q.machines.values())
    q.isolate(1)
    for chunk in chunks[2:]:  # these never reach a majority
        old.propose_chunk(chunk)
    q.run(3000)
    new = next(i for i in (2, 3) if q.nodes[i].role is Role.LEADER)
    q.machines[new].tick(q.now_ms)  # the new controller aborts the orphan
    q.run(100)
    q.blocked.clear()
    q.run(3000)
    for m in q.machines.values():
        assert m.image.building_topics == {} and m.image.topic("big") is None
        assert not any(isinstance(p, Partition) for _, p in m.image.iter_partitions())
    assert len({m.image.offset for m in q.machines.values()}) == 1
    again = plan_on(q.machines[new], "big", 150)
    q.machines[new].propose(again)
    q.run(100)
    assert all(m.image.partition_count() == 150 for m in q.machines.values())


def test_committing_every_pending_proposal_at_once_takes_the_pending_image() -> None:
    base = brokers_image()
    chunks = list(split_records(plan_topic(base, "big", 2500), EntryLimits(max_records=500)))
    entries = [(10 + i, 1, part) for i, (part, _) in enumerate(chunks)]
    images = PendingImages(base)
    for offset, epoch, part in entries:
        images.propose(part, offset, epoch)
    pending = images.pending
    delta, committed = images.commit(entries, want_delta=False)
    assert delta is None and committed is pending is images.pending
    whole = base
    for offset, epoch, part in entries:
        whole = replay_records(whole, part, offset, epoch)
    assert committed == whole


def test_committing_a_head_of_our_proposals_takes_the_image_built_when_proposing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Raft hands commits over a slice per Ready; the active controller built each
    # proposal's image already and must not replay the records a second time.
    base = brokers_image()
    chunks = list(split_records(plan_topic(base, "big", 2500), EntryLimits(max_records=500)))
    entries = [(10 + i, 1, part) for i, (part, _) in enumerate(chunks)]
    images = PendingImages(base)
    built = []
    for offset, epoch, part in entries:
        images.propose(part, offset, epoch)
        built.append(images.pending)
    pending = images.pending
    replays: list[int] = []
    real_replay = MetadataDelta.replay_all
    monkeypatch.setattr(
        MetadataDelta,
        "replay_all",
        lambda self, *a: replays.append(1) or real_replay(self, *a),  # type: ignore[func-returns-value]
    )
    for n, entry in enumerate(entries):
        delta, committed = images.commit([entry], want_delta=False)
        assert delta is None and committed is built[n] and images.pending is pending
    assert replays == [] and images.committed is pending


def test_a_plan_made_off_the_loop_is_kept_only_while_its_inputs_hold() -> None:
    base = brokers_image()
    ctl = QuorumController(ControllerConfig(), random.Random(1))
    planner = ctl.planner()
    records, results = planner.create_topics(base, [CreatableTopic("big", 2000, 3, {}, None)])
    assert results[0].error_code == 0 and len(records) == 2001
    assert ctl.plan_still_holds(base, base)
    other = replay_records(base, plan_topic(base, "other", 3), 10, 1)
    assert not ctl.plan_still_holds(base, other)  # the names taken changed
    fenced = replay_records(base, ctl._fence_records(base, [2]), 10, 1)
    assert not ctl.plan_still_holds(base, fenced)  # who may hold a replica changed
    beat = dataclasses.replace(base, offset=10)  # only the offset moved
    assert ctl.plan_still_holds(base, beat)


def test_changing_one_partition_of_a_wide_topic_copies_one_page_not_the_topic() -> None:
    base = brokers_image()
    image = replay_records(base, plan_topic(base, "big", 10_000), 10, 1)
    ctl = QuorumController(ControllerConfig(), random.Random(1))
    (topic,) = image.topics_by_name.values()
    before = topic.partitions
    assert isinstance(before, PartitionMap) and len(before) == 10_000
    change = ctl._fence_records(image, [1])[0]  # one PartitionChange, partition n
    after = replay_records(image, [change], 11, 1).topics_by_name["big"].partitions
    assert isinstance(after, PartitionMap) and len(after) == 10_000
    shared = [k for k in before._pages if before._pages[k] is after._pages[k]]
    assert len(shared) == len(before._pages) - 1  # every page but the changed one
    assert after[change.partition] != before[change.partition]
    assert dict(after.items()) == {
        **dict(before.items()),
        change.partition: after[change.partition],
    }
    assert list(after) == sorted(after) and list(after.values()) == [after[i] for i in after]


def test_one_resource_is_never_split_across_metadata_log_entries() -> None:
    """An IncrementalAlterConfigs whose records pass an entry's record limit: each
    topic's Config records land in one entry, so a leader lost between entries leaves
    every topic altered wholly or not at all (never a state tiering_error forbids)."""
    from test_quorum_controller import Cluster

    from rillet.client.wire import messages as m
    from rillet.controller.handlers import _alter_configs
    from rillet.controller.metadata.image import RESOURCE_TOPIC
    from rillet.controller.metadata.topic_config import OP_DELETE, OP_SET, tiering_error

    c = Cluster(brokers=1)
    fillers = [f"f{i}" for i in range(999)]
    c.run(c.ctl.create_topics(c.image, [(f, 1, 1, {}, None) for f in fillers]))
    c.create("target", rf=1, configs={"unclean.leader.election.enable": "true"})
    delete = [m.AlterableConfig("retention.ms", OP_DELETE, None)]
    tier = [
        m.AlterableConfig("remote.storage.enable", OP_SET, "true"),
        m.AlterableConfig("unclean.leader.election.enable", OP_SET, "false"),
    ]
    resources = [m.AlterConfigsResource(RESOURCE_TOPIC, f, delete) for f in fillers]
    request = m.IncrementalAlterConfigsRequest(
        [*resources, m.AlterConfigsResource(RESOURCE_TOPIC, "target", tier)]
    )
    records, results = _alter_configs(c.ctl, request, c.image)
    assert all(r.error_code == 0 for r in results) and len(records) == 1001
    chunks = list(split_records(records, EntryLimits()))
    assert len(chunks) == 2 and [r for part, _ in chunks for r in part] == records
    # Replay only the first entry (the leader died before the second committed).
    first = replay_records(c.image, chunks[0][0], c.image.offset + 1, 1)
    assert tiering_error(None, first.topic_config("target")) is None


def config_run(name: str, keys: int) -> list[MetadataRecord]:
    return [Config(RESOURCE_TOPIC, name, f"k{i}", "v") for i in range(keys)]


def test_entries_cut_between_resources_and_refuse_one_too_large_for_an_entry() -> None:
    rng = random.Random(3)
    records: list[MetadataRecord] = []
    for i in range(300):
        records += config_run(f"t{i}", rng.randint(1, 7))
        if rng.random() < 0.3:
            records.append(RemoveTopic(f"id{i}"))
    for limits in (EntryLimits(max_records=7), EntryLimits(max_records=10, max_bytes=300)):
        chunks = list(split_records(records, limits))
        assert [r for part, _ in chunks for r in part] == records
        seen: dict[str, int] = {}
        for n, (part, _) in enumerate(chunks):
            assert len(part) <= limits.max_records
            for r in part:
                if isinstance(r, Config):
                    assert seen.setdefault(r.resource_name, n) == n, r.resource_name
    with pytest.raises(PolicyViolationError):
        list(split_records(config_run("wide", 8), EntryLimits(max_records=7)))
