"""Metadata records, the image/delta replay, listener deltas and snapshots."""

from __future__ import annotations

import random
import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    NO_LEADER,
    RESOURCE_TOPIC,
    SEGMENT_COPY_FINISHED,
    SEGMENT_DELETE_FINISHED,
    Config,
    Endpoint,
    FenceBroker,
    MetadataDelta,
    MetadataFormatError,
    MetadataImage,
    MetadataInvariantError,
    NoOp,
    Partition,
    PartitionChange,
    RegisterBroker,
    RemoteSegment,
    RemoveTopic,
    Topic,
    TopicPartition,
    UnfenceBroker,
    UnregisterBroker,
    apply_partition_change,
    decode_record,
    decode_records,
    decode_snapshot,
    encode_record,
    encode_records,
    encode_snapshot,
    image_to_records,
    records_to_image,
    replay_records,
)
from rillet.controller.metadata.quorum import ControllerConfig, QuorumController

EP = (Endpoint("PLAINTEXT", "localhost", 9092),)
ALL_RECORDS = [
    NoOp(),
    RegisterBroker(1, "inc-1", 5, EP, "rack-a", fenced=True),
    UnregisterBroker(1, 5),
    FenceBroker(1, 5),
    UnfenceBroker(1, 5),
    Topic("orders", "tid-orders"),
    Partition("tid-orders", 0, (1, 2, 3), (1, 2), 1, 4, 9, (3,), ()),
    PartitionChange("tid-orders", 0, leader=2, isr=(2,)),
    PartitionChange("tid-orders", 0, replicas=(1, 2), adding_replicas=()),
    Config(RESOURCE_TOPIC, "orders", "retention.ms", "1000"),
    Config(RESOURCE_TOPIC, "orders", "retention.ms", None),
    RemoveTopic("tid-orders"),
    RemoteSegment(
        "tid-orders", 0, "seg-1", 0, 99, ((0, 0), (3, 50)), SEGMENT_COPY_FINISHED, 1 << 20
    ),
]


def base_image() -> MetadataImage:
    return replay_records(
        EMPTY_IMAGE,
        [
            RegisterBroker(1, "i1", 1, EP, None, fenced=False),
            RegisterBroker(2, "i2", 2, EP, None, fenced=False),
            RegisterBroker(3, "i3", 3, EP, None, fenced=False),
            Topic("a", "tid-a"),
            Partition("tid-a", 0, (1, 2, 3), (1, 2, 3), 1),
            Partition("tid-a", 1, (2, 3, 1), (2, 3, 1), 2),
            Topic("b", "tid-b"),
            Partition("tid-b", 0, (3, 1), (3, 1), 3),
            Config(RESOURCE_TOPIC, "b", "cleanup.policy", "compact"),
        ],
        offset=10,
        epoch=1,
    )


# ---------------------------------------------------------------------------- encoding


@pytest.mark.parametrize("rec", ALL_RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_type_round_trips_through_its_encoding(rec: object) -> None:
    assert decode_record(encode_record(rec)) == rec  # type: ignore[arg-type]
    assert type(decode_record(encode_record(rec))) is type(rec)  # type: ignore[arg-type]


def test_a_list_of_records_round_trips_as_one_entry() -> None:
    assert decode_records(encode_records(ALL_RECORDS)) == ALL_RECORDS


def test_encoding_is_compact_a_tagged_array_not_a_map() -> None:
    data = encode_record(FenceBroker(3, 7))
    assert msgpack.unpackb(data) == [FenceBroker.TYPE, 0, 3, 7]
    assert len(data) <= 6


def test_an_older_version_without_trailing_fields_decodes_with_defaults() -> None:
    old = msgpack.packb([Partition.TYPE, 0, "t", 0, [1], [1], 1])
    assert decode_record(old) == Partition("t", 0, (1,), (1,), 1, 0, 0, (), ())


def test_a_newer_version_or_unknown_type_is_refused() -> None:
    with pytest.raises(MetadataFormatError):
        decode_record(msgpack.packb([FenceBroker.TYPE, 9, 1, 1]))
    with pytest.raises(MetadataFormatError):
        decode_record(msgpack.packb([250, 0]))
    with pytest.raises(MetadataFormatError):
        decode_record(msgpack.packb({"type": 1}))
    with pytest.raises(MetadataFormatError):
        decode_record(msgpack.packb([FenceBroker.TYPE, 0, 1]))  # required field missing


# ---------------------------------------------------------------------------- partitions


def test_a_leader_change_bumps_both_epochs_an_isr_change_only_the_partition_epoch() -> None:
    p = Partition("t", 0, (1, 2, 3), (1, 2, 3), 1, 4, 10)
    shrunk = apply_partition_change(p, PartitionChange("t", 0, isr=(1, 2)))
    assert (shrunk.leader_epoch, shrunk.partition_epoch, shrunk.isr) == (4, 11, (1, 2))
    moved = apply_partition_change(shrunk, PartitionChange("t", 0, leader=2, isr=(2,)))
    assert (moved.leader, moved.leader_epoch, moved.partition_epoch) == (2, 5, 12)
    dropped = apply_partition_change(moved, PartitionChange("t", 0, replicas=(2, 3), isr=(2,)))
    assert dropped.leader_epoch == 6  # a replica left: fence its fetches


def test_a_change_that_breaks_partition_invariants_is_refused() -> None:
    p = Partition("t", 0, (1, 2), (1, 2), 1)
    with pytest.raises(MetadataInvariantError):
        apply_partition_change(p, PartitionChange("t", 0, leader=3))
    with pytest.raises(MetadataInvariantError):
        apply_partition_change(p, PartitionChange("t", 0, isr=()))
    with pytest.raises(MetadataInvariantError):
        apply_partition_change(p, PartitionChange("t", 0, isr=(2,)))  # leader 1 left out


# ---------------------------------------------------------------------------- image / delta


def test_replay_builds_an_image_readable_by_name_and_id() -> None:
    img = base_image()
    assert img.offset == 10 and img.epoch == 1
    assert img.topic("a").topic_id == "tid-a"  # type: ignore[union-attr]
    assert img.topics_by_id["tid-b"].name == "b"
    assert img.partition("a", 1).leader == 2  # type: ignore[union-attr]
    assert img.unfenced_broker_ids() == [1, 2, 3]
    assert img.topic_config("b") == {"cleanup.policy": "compact"}
    assert img.partition_count() == 3
    assert [p.partition for _, p in img.partitions_led_by(2)] == [1]


def test_the_image_is_read_only() -> None:
    img = base_image()
    with pytest.raises(TypeError):
        img.brokers[9] = img.brokers[1]  # type: ignore[index]
    with pytest.raises(AttributeError):
        img.offset = 3  # type: ignore[misc]


def test_apply_reuses_every_part_the_records_did_not_touch() -> None:
    img = base_image()
    nxt = replay_records(img, [PartitionChange("tid-a", 0, isr=(1, 2))], 11, 1)
    assert nxt.topics_by_id["tid-b"] is img.topics_by_id["tid-b"]
    assert nxt.topic("a").partitions[1] is img.topic("a").partitions[1]  # type: ignore[union-attr]
    assert nxt.brokers is img.brokers
    assert nxt.configs is img.configs
    assert img.partition("a", 0).isr == (1, 2, 3)  # type: ignore[union-attr]  # old untouched


def test_fence_and_unfence_flip_the_broker_flag_and_check_its_epoch() -> None:
    img = replay_records(base_image(), [FenceBroker(2, 2)])
    assert img.brokers[2].fenced and img.unfenced_broker_ids() == [1, 3]
    img = replay_records(img, [UnfenceBroker(2, 2)])
    assert not img.brokers[2].fenced
    with pytest.raises(MetadataInvariantError):
        replay_records(img, [FenceBroker(2, 99)])
    with pytest.raises(MetadataInvariantError):
        replay_records(img, [UnregisterBroker(42, 1)])


def test_records_about_unknown_topics_or_partitions_are_invariant_errors() -> None:
    img = base_image()
    with pytest.raises(MetadataInvariantError):
        replay_records(img, [PartitionChange("tid-a", 7, isr=(1,))])
    with pytest.raises(MetadataInvariantError):
        replay_records(img, [Partition("nope", 0, (1,), (1,), 1)])
    with pytest.raises(MetadataInvariantError):
        replay_records(img, [Topic("a", "another-id")])  # name taken
    with pytest.raises(MetadataInvariantError):
        replay_records(img, [RemoveTopic("nope")])


def test_remove_topic_drops_its_partitions_configs_and_remote_segments() -> None:
    img = replay_records(base_image(), [RemoteSegment("tid-b", 0, "s1", 0, 9)])
    assert ("tid-b", 0) in img.remote_segments
    img = replay_records(img, [RemoveTopic("tid-b")])
    assert img.topic("b") is None and "tid-b" not in img.topics_by_id
    assert img.topic_config("b") == {}
    assert ("tid-b", 0) not in img.remote_segments


def test_a_finished_remote_delete_removes_the_segment() -> None:
    img = replay_records(base_image(), [RemoteSegment("tid-a", 0, "s1", 0, 9)])
    img = replay_records(
        img, [RemoteSegment("tid-a", 0, "s1", 0, 9, state=SEGMENT_DELETE_FINISHED)]
    )
    assert img.remote_segments == {}


def test_delete_and_recreate_under_the_same_name_in_one_delta() -> None:
    delta = MetadataDelta(base_image())
    delta.replay(RemoveTopic("tid-b"))
    delta.replay(Topic("b", "tid-b2"))
    delta.replay(Partition("tid-b2", 0, (1,), (1,), 1))
    img = delta.apply()
    assert img.topic("b").topic_id == "tid-b2"  # type: ignore[union-attr]
    assert set(img.topics_by_id) == {"tid-a", "tid-b2"}
    assert delta.deleted_topics == {"tid-b": "b"}
    assert delta.created_topics == {"tid-b2": "b"}
    changes = delta.local_changes(1)
    assert TopicPartition("b", 0) in changes.deletes and TopicPartition("b", 0) in changes.leaders


def test_a_topic_created_and_deleted_in_one_delta_leaves_no_trace() -> None:
    delta = MetadataDelta(base_image())
    delta.replay(Topic("tmp", "tid-tmp"))
    delta.replay(Partition("tid-tmp", 0, (1,), (1,), 1))
    delta.replay(RemoveTopic("tid-tmp"))
    img = delta.apply()
    assert img.topic("tmp") is None and delta.deleted_topics == {}
    assert set(img.topics_by_id) == {"tid-a", "tid-b"}


def test_local_changes_tell_a_broker_what_it_now_leads_follows_and_drops() -> None:
    delta = MetadataDelta(base_image())
    delta.replay(PartitionChange("tid-a", 0, leader=2, isr=(2, 3)))  # 1 loses leadership
    delta.replay(PartitionChange("tid-a", 1, replicas=(2, 3), isr=(2, 3)))  # 1 removed
    delta.replay(RemoveTopic("tid-b"))
    one = delta.local_changes(1)
    assert set(one.followers) == {TopicPartition("a", 0)}
    assert one.leaders == {}
    assert one.deletes == {TopicPartition("a", 1), TopicPartition("b", 0)}
    two = delta.local_changes(2)
    assert set(two.leaders) == {TopicPartition("a", 0), TopicPartition("a", 1)}


def test_the_image_offset_follows_the_last_replayed_record() -> None:
    delta = MetadataDelta(base_image())
    delta.replay(NoOp(), 11, 2)
    delta.replay(NoOp(), 12, 2)
    assert (delta.apply().offset, delta.apply().epoch) == (12, 2)
    with pytest.raises(MetadataInvariantError):
        delta.replay(NoOp(), 5, 2)


# ---------------------------------------------------------------------------- snapshots


def test_snapshot_round_trips_the_image() -> None:
    img = replay_records(base_image(), [RemoteSegment("tid-a", 1, "s", 0, 5, ((0, 0),))], 11, 1)
    img = replay_records(img, [FenceBroker(3, 3)], 12, 2)
    back = decode_snapshot(encode_snapshot(img))
    assert back == img
    assert (back.offset, back.epoch) == (12, 2)
    assert records_to_image(image_to_records(img), 12, 2) == img


def test_a_corrupt_snapshot_is_detected() -> None:
    data = bytearray(encode_snapshot(base_image()))
    data[-1] ^= 0xFF
    with pytest.raises(MetadataFormatError):
        decode_snapshot(bytes(data))
    with pytest.raises(MetadataFormatError):
        decode_snapshot(b"nope")


def test_a_ten_thousand_partition_snapshot_is_small_and_fast() -> None:
    rng = random.Random(1)
    records: list = [RegisterBroker(b, f"i{b}", b, EP, f"r{b % 3}", False) for b in range(12)]
    for t in range(100):
        tid = rng.randbytes(16).hex()
        records.append(Topic(f"topic-{t}", tid))
        for p in range(100):
            reps = tuple(rng.sample(range(12), 3))
            records.append(Partition(tid, p, reps, reps, reps[0], rng.randrange(9), 7))
    img = replay_records(EMPTY_IMAGE, records, 1000, 3)
    start = time.perf_counter()
    data = encode_snapshot(img)
    encode_s = time.perf_counter() - start
    back = decode_snapshot(data)
    assert back == img and img.partition_count() == 10_000
    assert len(data) < 200_000  # about 18 bytes a partition
    assert encode_s < 1.0


# ---------------------------------------------------------------------------- replay property


class _Run:
    """A tiny driver for the property test: apply each result's records as one entry."""

    def __init__(self, ctl: QuorumController) -> None:
        self.ctl, self.img, self.now = ctl, EMPTY_IMAGE, 0
        self.entries: list[tuple[int, list]] = []
        self.epochs: dict[int, int] = {}

    def apply(self, res: object) -> object:
        records, response = res  # type: ignore[misc]
        if records:
            offset = self.img.offset + 1
            self.img = replay_records(self.img, records, offset, 1)
            self.entries.append((offset, records))
        return response

    def register(self, b: int, incarnation: str) -> None:
        resp = self.apply(
            self.ctl.register_broker(
                self.img, b, incarnation, [("P", "h", b)], f"r{b % 2}", self.now
            )
        )
        if resp.error_code == 0:  # type: ignore[attr-defined]
            self.epochs[b] = resp.broker_epoch  # type: ignore[attr-defined]

    def beat(self, b: int, want_fence: bool = False, want_shutdown: bool = False) -> None:
        self.apply(
            self.ctl.broker_heartbeat(
                self.img, b, self.epochs[b], self.img.offset, want_fence, want_shutdown, self.now
            )
        )


def random_operations(data: st.DataObject, ctl: QuorumController) -> list[tuple[int, list]]:
    """Drive the real controller with random operations; return the committed entries."""
    run = _Run(ctl)
    for b in range(1, 5):
        run.register(b, f"i{b}")
        run.beat(b)
    topics = st.sampled_from(["x", "y", "z"])
    ops = [
        "beat",
        "beat",
        "beat",
        "reg",
        "create",
        "create",
        "delete",
        "isr",
        "isr",
        "tick",
        "elect",
        "reassign",
    ]
    for _ in range(data.draw(st.integers(5, 40))):
        run.now += data.draw(st.integers(0, 1500))
        op, b = data.draw(st.sampled_from(ops)), data.draw(st.integers(1, 4))
        img = run.img
        if op == "reg":
            run.register(b, f"i{b}-{data.draw(st.integers(0, 1))}")
        elif op == "beat" and b in run.epochs:
            flags = data.draw(
                st.sampled_from([(False, False)] * 4 + [(True, False), (False, True)])
            )
            run.beat(b, *flags)
        elif op == "create":
            spec = (
                data.draw(topics),
                data.draw(st.integers(1, 4)),
                data.draw(st.integers(1, 3)),
                {},
                None,
            )
            run.apply(ctl.create_topics(img, [spec]))
        elif op == "delete":
            run.apply(ctl.delete_topics(img, [data.draw(topics)]))
        elif op in ("isr", "reassign") and img.topics_by_name:
            t, p = data.draw(st.sampled_from(list(img.iter_partitions())))
            if op == "reassign":
                target = data.draw(st.permutations([1, 2, 3, 4]))[: len(p.replicas)]
                run.apply(ctl.reassign_partitions(img, [(t.name, p.partition, target)]))
            elif p.leader > 0:
                isr = tuple(r for r in p.replicas if r == p.leader or data.draw(st.booleans()))
                leader_epoch = img.brokers[p.leader].broker_epoch
                run.apply(
                    ctl.alter_partition(
                        img,
                        p.leader,
                        leader_epoch,
                        t.name,
                        p.partition,
                        p.leader_epoch,
                        p.partition_epoch,
                        isr,
                    )
                )
        elif op == "elect":
            run.apply(ctl.elect_preferred_leaders(img))
        elif op == "tick":
            run.apply(ctl.tick(img, run.now))
    return run.entries


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_record_by_record_replay_equals_batch_replay_and_the_snapshot(data: st.DataObject) -> None:
    ctl = QuorumController(ControllerConfig(), random.Random(data.draw(st.integers(0, 9))))
    entries = random_operations(data, ctl)
    one_by_one = EMPTY_IMAGE
    batch = MetadataDelta(EMPTY_IMAGE)
    for offset, records in entries:
        for rec in records:
            encoded = decode_record(encode_record(rec))
            one_by_one = replay_records(one_by_one, [encoded], offset, 1)
            batch.replay(rec, offset, 1)
    batched = batch.apply()
    assert batched == one_by_one
    restored = decode_snapshot(encode_snapshot(one_by_one))
    assert restored == one_by_one
    for _, p in restored.iter_partitions():
        assert p.leader == NO_LEADER or restored.is_unfenced(p.leader)


@pytest.mark.timeout(60)
def test_a_delta_creating_many_topics_replays_in_linear_time() -> None:
    # Each Topic record compared its name with every topic created earlier in the same
    # delta: a snapshot (one delta) of 10,000 single-partition topics took 8 s to load
    # on every controller and broker start, these 60,000 about five minutes, and a slice
    # of committed entries of one large create paid the same.
    n = 60_000
    records: list = [RegisterBroker(1, "inc-1", 1, (Endpoint("B", "h", 1),), None, False)]
    for i in range(n):
        records += [Topic(f"t.{i}", f"id{i}"), Partition(f"id{i}", 0, (1,), (1,), 1)]
    image = records_to_image(records)
    assert len(image.topics_by_name) == n
    # A name is still taken within the delta, and free again once its topic is removed.
    with pytest.raises(MetadataInvariantError, match="topic t.5 exists"):
        replay_records(image, [Topic("x", "idx"), Topic("t.5", "new")])
    with pytest.raises(MetadataInvariantError, match="topic x exists"):
        replay_records(image, [Topic("x", "idx"), Topic("x", "idy")])
    again = replay_records(image, [Topic("x", "idx"), RemoveTopic("idx"), Topic("x", "idy")])
    assert again.topic("x").topic_id == "idy"
