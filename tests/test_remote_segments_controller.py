"""Remote segment metadata through the controller (docs/tiered.md, "Remote metadata"):
which proposer and which state transitions `record_remote_segment` accepts, and the
AlterRemoteSegments handler, whose answer goes out only once its records are committed."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from test_controller_concurrent_writes import GUARD_S, _unfenced_brokers, server  # noqa: F401
from test_quorum_controller import Cluster, _HandlerServer

from rillet.broker.link.controller_link import remote_segments_request
from rillet.client.wire import messages as m
from rillet.client.wire.errors import code_of
from rillet.controller import handlers
from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    SEGMENT_COPY_STARTED,
    SEGMENT_DELETE_FINISHED,
    SEGMENT_DELETE_STARTED,
    RemoteSegment,
)
from rillet.controller.metadata.remote_log import remote_log_view
from rillet.controller.server import ControllerServer

E = code_of
STARTED, FINISHED = SEGMENT_COPY_STARTED, SEGMENT_COPY_FINISHED
DELETING, DELETED = SEGMENT_DELETE_STARTED, SEGMENT_DELETE_FINISHED


class Tiered:
    """A cluster with one topic "t" (rf 3) and its partition 0's leader as proposer."""

    def __init__(self) -> None:
        self.c = Cluster(brokers=3)
        self.c.create("t", rf=3)
        p = self.c.p("t")
        self.topic_id, self.leader, self.epoch = p.topic_id, p.leader, p.leader_epoch

    def segment(self, seg_id: str = "s1", state: int = STARTED, **over: Any) -> RemoteSegment:
        fields: dict[str, Any] = dict(
            topic_id=self.topic_id,
            partition=0,
            segment_id=seg_id,
            start_offset=0,
            end_offset=99,
            leader_epochs=((0, 0),),
            state=state,
            size_bytes=1000,
            max_timestamp_ms=5,
            broker_id=self.leader,
            leader_epoch=self.epoch,
        )
        fields.update(over)
        return RemoteSegment(**fields)

    def propose(self, seg: RemoteSegment, broker: int | None = None, epoch: int | None = None):  # type: ignore[no-untyped-def]
        b = self.leader if broker is None else broker
        broker_epoch = self.c.epochs[b] if epoch is None else epoch
        result = self.c.run(self.c.ctl.record_remote_segment(self.c.image, b, broker_epoch, seg))
        return result.error_code

    def state(self, seg_id: str = "s1") -> RemoteSegment | None:
        return self.c.image.remote_segments.get((self.topic_id, 0), {}).get(seg_id)

    def move_leader(self) -> None:
        """Fence the leader: another replica leads, in a new leader epoch."""
        self.c.heartbeat(self.leader, fence=True)
        p = self.c.p("t")
        assert p.leader != self.leader and p.leader_epoch > self.epoch
        self.old_leader, self.old_epoch = self.leader, self.epoch
        self.leader, self.epoch = p.leader, p.leader_epoch


def test_the_whole_lifecycle_is_accepted_and_delete_finished_removes_the_segment() -> None:
    t = Tiered()
    assert t.propose(t.segment()) == 0
    assert t.state().state == STARTED  # type: ignore[union-attr]
    assert remote_log_view(t.c.image, t.topic_id, 0).end_offset == -1  # not yet readable
    assert t.propose(t.segment(state=FINISHED)) == 0
    assert remote_log_view(t.c.image, t.topic_id, 0).end_offset == 99
    assert t.propose(t.segment(state=DELETING)) == 0
    assert remote_log_view(t.c.image, t.topic_id, 0).end_offset == -1  # gone for readers
    assert t.propose(t.segment(state=DELETED)) == 0
    assert t.state() is None and (t.topic_id, 0) not in t.c.image.remote_segments


def test_a_retried_change_succeeds_and_writes_nothing() -> None:
    t = Tiered()
    for state in (STARTED, FINISHED, DELETING, DELETED):
        assert t.propose(t.segment(state=state)) == 0
        assert t.propose(t.segment(state=state)) == 0
        assert t.c.last_records == []


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((STARTED,), STARTED),  # a segment id is started once
        ((STARTED, FINISHED), STARTED),
        ((), FINISHED),  # nothing to finish
        ((STARTED, DELETING), FINISHED),  # a deleted copy never finishes
        ((), DELETING),
        ((STARTED,), DELETED),  # deletion finishes only what it started
        ((STARTED, FINISHED), DELETED),
        ((STARTED, DELETING), STARTED),
    ],
)
def test_illegal_transitions_are_refused(before: tuple[int, ...], after: int) -> None:
    t = Tiered()
    for state in before:
        assert t.propose(t.segment(state=state)) == 0
    held = t.state()
    assert t.propose(t.segment(state=after, size_bytes=2000)) == E("INVALID_REQUEST")
    assert t.state() == held


def test_a_finish_must_match_the_started_copys_offsets() -> None:
    t = Tiered()
    assert t.propose(t.segment()) == 0
    assert t.propose(t.segment(state=FINISHED, end_offset=120)) == E("INVALID_REQUEST")


def test_only_the_current_leader_in_its_current_epoch_may_write() -> None:
    t = Tiered()
    follower = next(b for b in t.c.p("t").replicas if b != t.leader)
    as_follower = t.segment(broker_id=follower)
    assert t.propose(as_follower, broker=follower) == E("NOT_LEADER_OR_FOLLOWER")
    assert t.propose(t.segment(leader_epoch=t.epoch - 1)) == E("FENCED_LEADER_EPOCH")
    assert t.propose(t.segment(leader_epoch=t.epoch + 1)) == E("UNKNOWN_LEADER_EPOCH")
    stale = t.c.epochs[t.leader] - 1
    assert t.propose(t.segment(), epoch=stale) == E("STALE_BROKER_EPOCH")
    other = t.segment(broker_id=follower)  # a record must name its proposer as writer
    assert t.propose(other) == E("INVALID_REQUEST")
    assert t.propose(t.segment(partition=7)) == E("UNKNOWN_TOPIC_OR_PARTITION")
    assert t.propose(t.segment(topic_id="nope")) == E("UNKNOWN_TOPIC_OR_PARTITION")
    assert t.propose(t.segment(start_offset=5, end_offset=4)) == E("INVALID_REQUEST")
    assert t.state() is None


def test_a_deposed_leaders_copy_never_finishes_and_the_new_leader_deletes_it() -> None:
    t = Tiered()
    assert t.propose(t.segment()) == 0
    t.move_leader()
    late = t.segment(state=FINISHED, broker_id=t.old_leader, leader_epoch=t.old_epoch)
    assert t.propose(late, broker=t.old_leader) == E("NOT_LEADER_OR_FOLLOWER")
    # The new leader cannot finish its predecessor's copy either ...
    stolen = t.segment(state=FINISHED)
    assert t.propose(stolen) == E("INVALID_REQUEST")
    # ... but may delete it, as its own deletion, and finish that.
    assert t.propose(t.segment(state=DELETING)) == 0
    assert (t.state().broker_id, t.state().leader_epoch) == (t.leader, t.epoch)  # type: ignore[union-attr]
    assert t.propose(t.segment(state=DELETED)) == 0
    assert t.state() is None


def test_a_new_leader_takes_over_a_deletion_its_predecessor_started() -> None:
    t = Tiered()
    for state in (STARTED, FINISHED, DELETING):
        assert t.propose(t.segment(state=state)) == 0
    t.move_leader()
    assert t.propose(t.segment(state=DELETING)) == 0
    assert t.state().broker_id == t.leader  # type: ignore[union-attr]
    assert t.propose(t.segment(state=DELETED)) == 0


def test_a_new_leader_deletes_a_finished_segment_of_an_earlier_epoch() -> None:
    t = Tiered()
    assert t.propose(t.segment()) == 0
    assert t.propose(t.segment(state=FINISHED)) == 0
    t.move_leader()
    assert t.propose(t.segment(state=DELETING)) == 0  # remote retention, by the new leader


# ---------------------------------------------------------------------------- the handler


def _wire(seg: RemoteSegment) -> m.RemoteSegmentState:
    """The segment as the broker's link sends it."""
    (state,) = remote_segments_request(seg.broker_id, 0, [seg]).segments
    return state


async def test_one_request_carries_several_changes_each_judged_after_the_ones_before() -> None:
    t = Tiered()
    hs = _HandlerServer(t.c.image)
    request = m.AlterRemoteSegmentsRequest(
        broker_id=t.leader,
        broker_epoch=t.c.epochs[t.leader],
        segments=[
            _wire(t.segment("a")),
            _wire(t.segment("a", FINISHED)),
            _wire(t.segment("b", FINISHED)),  # never started: refused alone
            _wire(t.segment("c", start_offset=100, end_offset=199)),
        ],
    )
    response = await handlers.alter_remote_segments(hs, t.c.ctl, request)  # type: ignore[arg-type]
    assert [(r.segment_id, r.error_code) for r in response.results] == [
        ("a", 0),
        ("a", 0),
        ("b", E("INVALID_REQUEST")),
        ("c", 0),
    ]
    (entry,) = hs.entries  # one operation, one entry
    assert [(r.segment_id, r.state) for r in entry] == [("a", STARTED), ("a", FINISHED), ("c", 0)]
    assert entry[0] == dataclasses.replace(t.segment("a"))  # every field travels


async def test_the_broker_is_answered_once_the_records_are_committed(
    server: ControllerServer,  # noqa: F811
) -> None:
    assert server.ctl is not None
    epochs = await _unfenced_brokers(server)
    topic = m.CreateTopicsRequest(topics=[m.CreatableTopic("t", 1, 3, [], {})], timeout_ms=30_000)
    created = await handlers.create_topics(server, server.ctl, topic)
    assert created.topics[0].error_code == 0
    p = server.images.committed.partition("t", 0)
    assert p is not None
    seg = RemoteSegment(p.topic_id, 0, "s1", 0, 9, ((p.leader_epoch, 0),), STARTED, 10, 1)
    seg = dataclasses.replace(seg, broker_id=p.leader, leader_epoch=p.leader_epoch)
    request = m.AlterRemoteSegmentsRequest(p.leader, epochs[p.leader], [_wire(seg)])
    response = await asyncio.wait_for(
        handlers.alter_remote_segments(server, server.ctl, request), GUARD_S
    )
    assert [r.error_code for r in response.results] == [0]
    assert server.images.committed.remote_segments[(p.topic_id, 0)]["s1"] == seg
