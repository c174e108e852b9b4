"""AlterPartition batching (broker/link/alter_partition_manager.py): every pending ISR
proposal of a broker in one request, one request in flight, each answer back to its
partition, backoff after a failed request and after a partition's refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rillet.broker.link.alter_partition_manager import (
    AlterItem,
    AlterPartitionManager,
    AlterPartitionQueue,
    Proposal,
    alter_partition_answers,
    alter_partition_request,
    summarize,
)
from rillet.broker.replication.types import AlterPartitionResponse, ProposeAlterPartition
from rillet.client.runtime import tasks
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.controller.metadata.image import TopicPartition

E = errors.code_of


def proposal(partition: int, leader_epoch: int = 3, partition_epoch: int = 5):
    return ProposeAlterPartition(partition + 1, 1, leader_epoch, partition_epoch, (1, 2))


class Answers:
    """Collects what each item was answered, by partition."""

    def __init__(self) -> None:
        self.got: dict[TopicPartition, list[AlterPartitionResponse]] = {}

    def item(self, topic: str, partition: int, **epochs: int) -> AlterItem:
        tp = TopicPartition(topic, partition)
        return AlterItem(tp, proposal(partition, **epochs), self.got.setdefault(tp, []).append)

    def deliver(self, answers: Sequence[tuple[AlterItem, AlterPartitionResponse]]) -> None:
        for item, answer in answers:
            item.on_answer(answer)


def accept(batch: Sequence[AlterItem]) -> list[AlterPartitionResponse]:
    return [
        AlterPartitionResponse(0, i.proposal.new_isr, i.proposal.leader_epoch, 6) for i in batch
    ]


def test_many_partitions_go_in_one_request_and_the_next_waits_for_its_answer() -> None:
    queue, answers = AlterPartitionQueue(), Answers()
    for p in range(500):
        queue.submit(answers.item("a" if p % 2 else "b", p))
    batch = queue.next_request(now_ms=0)
    assert batch is not None and [i.tp.partition for i in batch] == list(range(500))
    queue.submit(answers.item("c", 0))
    assert queue.next_request(0) is None and queue.next_due_ms(0) is None  # one in flight

    answers.deliver(queue.on_answers(accept(batch), now_ms=10))
    assert all(len(answers.got[i.tp]) == 1 for i in batch)
    assert all(answers.got[i.tp][0].error_code == 0 for i in batch)
    assert queue.next_due_ms(10) == 10
    (late,) = queue.next_request(10) or []
    assert late.tp == TopicPartition("c", 0)


def test_a_request_carries_at_most_max_items() -> None:
    queue, answers = AlterPartitionQueue(max_items=2000), Answers()
    for p in range(4500):
        queue.submit(answers.item("t", p))
    sizes = []
    while (batch := queue.next_request(0)) is not None:
        sizes.append(len(batch))
        queue.on_answers(accept(batch), 0)
    assert sizes == [2000, 2000, 500]


def test_the_wire_request_groups_by_topic_and_answers_go_back_to_their_partition() -> None:
    batch: list[Proposal] = [
        (TopicPartition("a", 0), proposal(0)),
        (TopicPartition("b", 7), proposal(7, leader_epoch=9)),
        (TopicPartition("a", 3), proposal(3)),
    ]
    request = alter_partition_request(4, 12, batch)
    assert (request.broker_id, request.broker_epoch) == (4, 12)
    assert [(t.topic, [p.partition for p in t.partitions]) for t in request.topics] == [
        ("a", [0, 3]),
        ("b", [7]),
    ]
    assert request.topics[1].partitions[0].leader_epoch == 9
    # The controller answers topic by topic; one partition it left out.
    response = m.AlterPartitionResponse(
        topics=[
            m.AlterPartitionTopicResult(
                "b", [m.IsrResult(7, E("FENCED_LEADER_EPOCH"), -1, 10, [], 2)]
            ),
            m.AlterPartitionTopicResult("a", [m.IsrResult(3, 0, 1, 3, [1, 2], 6)]),
        ]
    )
    answers = alter_partition_answers(batch, response)
    assert [a.error_code for a in answers] == [
        E("UNKNOWN_SERVER_ERROR"),
        E("FENCED_LEADER_EPOCH"),
        0,
    ]
    assert answers[2] == AlterPartitionResponse(0, (1, 2), 3, 6)


def test_a_failed_request_answers_every_item_and_the_next_one_backs_off() -> None:
    queue, answers = AlterPartitionQueue(backoff_min_ms=100, backoff_max_ms=400), Answers()
    for p in range(3):
        queue.submit(answers.item("t", p))
    first = queue.next_request(1000)
    assert first is not None
    answers.deliver(queue.on_failure(E("NOT_CONTROLLER"), 1000))
    assert [a.error_code for got in answers.got.values() for a in got] == [E("NOT_CONTROLLER")] * 3

    # The cores resend at their next tick: held until the backoff passes, doubling.
    delays = []
    now = 1000
    for _ in range(4):
        for p in range(3):
            queue.submit(answers.item("t", p))
        assert queue.next_request(now) is None
        due = queue.next_due_ms(now)
        assert due is not None
        delays.append(due - now)
        now = due
        assert queue.next_request(now) is not None
        queue.on_failure(E("REQUEST_TIMED_OUT"), now)
    assert delays == [100, 200, 400, 400]

    # An answer resets it.
    queue.submit(answers.item("t", 0))
    batch = queue.next_request(now + 400)
    assert batch is not None
    queue.on_answers(accept(batch), now + 400)
    queue.submit(answers.item("t", 1))
    assert queue.next_request(now + 400) is not None


def test_a_refused_partition_is_not_proposed_again_in_the_same_view_before_its_backoff() -> None:
    queue, answers = AlterPartitionQueue(backoff_min_ms=100, backoff_max_ms=800), Answers()
    refused = AlterPartitionResponse(E("NOT_LEADER_OR_FOLLOWER"))
    now = 0
    queue.submit(answers.item("t", 0))
    batch = queue.next_request(now)
    assert batch is not None
    holds = []
    for _ in range(5):
        queue.on_answers([refused], now)
        queue.submit(answers.item("t", 0))  # the core's resend at its next tick
        queue.submit(answers.item("t", 1))  # another partition is not held back
        batch = queue.next_request(now)
        assert batch is not None and [i.tp.partition for i in batch] == [1]
        queue.on_answers(accept(batch), now)
        due = queue.next_due_ms(now)
        assert due is not None
        holds.append(due - now)
        now = due
        batch = queue.next_request(now)
        assert batch is not None and [i.tp.partition for i in batch] == [0]
    assert holds == [100, 200, 400, 800, 800]

    # A new view (the next leader or partition epoch) is proposed at once.
    queue.on_answers([refused], now)
    queue.submit(answers.item("t", 0, partition_epoch=6))
    assert queue.next_request(now) is not None
    # And an accepted proposal clears the hold.
    queue.on_answers([AlterPartitionResponse(0, (1, 2), 3, 7)], now)
    queue.submit(answers.item("t", 0, partition_epoch=7))
    batch = queue.next_request(now)
    assert batch is not None
    queue.on_answers([refused], now)
    queue.submit(answers.item("t", 0, partition_epoch=7))
    assert queue.next_due_ms(now) == now + 100


def test_a_removed_partition_is_dropped_and_a_replaced_proposal_is_not_attempted() -> None:
    queue, answers = AlterPartitionQueue(), Answers()
    queue.submit(answers.item("t", 0))
    queue.drop(TopicPartition("t", 0))  # the partition left this broker
    replaced = answers.item("t", 1)
    queue.submit(replaced)
    queue.submit(answers.item("t", 1))  # from a replica re-created meanwhile
    answers.deliver(queue.take_answers_due())
    assert answers.got[TopicPartition("t", 1)] == [
        AlterPartitionResponse(E("OPERATION_NOT_ATTEMPTED"))
    ]
    batch = queue.next_request(0)
    assert batch is not None and [i.tp for i in batch] == [TopicPartition("t", 1)]
    assert batch[0] is not replaced
    assert answers.got[TopicPartition("t", 0)] == []

    # A proposal for a partition in flight waits for the next request (never two items
    # of one partition in a request).
    queue.submit(answers.item("t", 1))
    assert queue.next_request(0) is None
    queue.on_answers(accept(batch), 0)
    again = queue.next_request(0)
    assert again is not None and [i.tp for i in again] == [TopicPartition("t", 1)]


def test_summary_counts_accepted_and_refused_by_error() -> None:
    queue, answers = AlterPartitionQueue(), Answers()
    for p in range(4):
        queue.submit(answers.item("t", p))
    batch = queue.next_request(0)
    assert batch is not None
    fenced = AlterPartitionResponse(E("FENCED_LEADER_EPOCH"))
    out = queue.on_answers(accept(batch[:2]) + [fenced, fenced], 0)
    assert summarize(out) == "4 partitions: 2 accepted, refused: FENCED_LEADER_EPOCH 2"


async def test_the_manager_sends_proposals_made_together_in_one_request() -> None:
    sent: list[list[Proposal]] = []
    release = asyncio.Event()

    async def send(batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        sent.append(list(batch))
        await release.wait()
        return [AlterPartitionResponse(0, p.new_isr, p.leader_epoch, 6) for _, p in batch]

    manager = AlterPartitionManager(send)
    got: dict[int, list[AlterPartitionResponse]] = {}
    try:
        for p in range(300):  # one fetch answer can make a leader expand every partition
            manager.submit(TopicPartition("t", p), proposal(p), got.setdefault(p, []).append)
        while not sent:
            await asyncio.sleep(0)
        for p in range(300, 310):  # while the first request is out
            manager.submit(TopicPartition("t", p), proposal(p), got.setdefault(p, []).append)
        release.set()
        while len(sent) < 2 or any(not v for v in got.values()):
            await asyncio.sleep(0)
        assert [len(b) for b in sent] == [300, 10]
        assert all(len(v) == 1 and v[0].error_code == 0 for v in got.values())
    finally:
        await manager.close()


async def test_the_manager_answers_every_item_when_the_request_fails() -> None:
    async def send(batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        raise errors.NotControllerError("no active controller")

    manager = AlterPartitionManager(send)
    got: list[AlterPartitionResponse] = []
    try:
        for p in range(5):
            manager.submit(TopicPartition("t", p), proposal(p), got.append)
        while len(got) < 5:
            await asyncio.sleep(0)
        assert got == [AlterPartitionResponse(E("NOT_CONTROLLER"))] * 5
        assert manager.requests == 1 and manager.queue.not_before_ms > 0
    finally:
        await manager.close()


def test_on_answers_without_a_request_in_flight_is_a_bug() -> None:
    with pytest.raises(ValueError):
        AlterPartitionQueue().on_answers([], 0)


async def test_an_answer_that_raises_is_a_fatal_fault() -> None:
    """The core that raised applying its answer disagrees with its log now: the process
    must stop (docs/broker.md, "Faults"), not go on with a sender that died silently."""
    faults: list[tuple[str, BaseException]] = []
    previous = tasks.set_fatal_handler(lambda what, error: faults.append((what, error)))

    async def send(batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        return [AlterPartitionResponse(0)] * len(batch)

    def broken(answer: AlterPartitionResponse) -> None:
        raise ValueError("no AlterPartition 1 is outstanding")

    manager = AlterPartitionManager(send)
    try:
        manager.submit(TopicPartition("t", 0), proposal(0), broken)
        while not faults:
            await asyncio.sleep(0)
        ((what, error),) = faults
        assert what == "applying an AlterPartition answer" and isinstance(error, ValueError)
    finally:
        tasks.set_fatal_handler(previous)
        await manager.close()


def test_a_refusal_of_a_partition_dropped_in_flight_leaves_no_hold() -> None:
    """The answer to a removed partition's proposal still comes back (it was in flight);
    its refusal (a deleted topic's UNKNOWN_TOPIC_OR_PARTITION) must not leave a hold per
    deleted partition for the broker's lifetime, nor delay the first proposal of a topic
    re-created with the same name, whose epochs start over at the same values."""
    queue, answers = AlterPartitionQueue(), Answers()
    for p in range(3):
        queue.submit(answers.item("t", p, leader_epoch=0, partition_epoch=0))
    batch = queue.next_request(0)
    assert batch is not None
    for p in range(3):
        queue.drop(TopicPartition("t", p))  # the topic is deleted
    unknown = AlterPartitionResponse(E("UNKNOWN_TOPIC_OR_PARTITION"))
    queue.on_answers([unknown] * 3, 0)
    assert queue.held == 0
    queue.submit(answers.item("t", 0, leader_epoch=0, partition_epoch=0))  # re-created
    again = queue.next_request(0)
    assert again is not None and [i.tp for i in again] == [TopicPartition("t", 0)]


async def test_a_request_cancelled_in_flight_does_not_wedge_the_queue() -> None:
    """Cancelling the sender mid-request (close) must release the request in flight: a
    manager started again by a later proposal sends it, and that proposal, rather than
    finding one request in flight forever (no ISR change of this broker would ever be
    sent again)."""
    sent: list[list[Proposal]] = []
    hang = asyncio.Event()

    async def send(batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        sent.append(list(batch))
        if len(sent) == 1:
            await hang.wait()  # never set: cancelled in flight
        return [AlterPartitionResponse(0, p.new_isr, p.leader_epoch, 6) for _, p in batch]

    manager = AlterPartitionManager(send)
    got: dict[int, list[AlterPartitionResponse]] = {}
    try:
        manager.submit(TopicPartition("t", 0), proposal(0), got.setdefault(0, []).append)
        while not sent:
            await asyncio.sleep(0)
        await manager.close()
        assert manager.queue.in_flight is None
        manager.submit(TopicPartition("t", 1), proposal(1), got.setdefault(1, []).append)
        while len(got[1]) < 1 or len(got[0]) < 1:
            await asyncio.sleep(0)
        assert [[tp.partition for tp, _ in b] for b in sent] == [[0], [0, 1]]
        assert got[0][0].error_code == 0 and got[1][0].error_code == 0
    finally:
        await manager.close()


OPS = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 4), st.integers(0, 2)),
    st.tuples(st.just("drop"), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("send"), st.just(0), st.just(0)),
    st.tuples(st.just("answer"), st.just(0), st.integers(0, 3)),  # bit i: item i refused
    st.tuples(st.just("fail"), st.just(0), st.just(0)),
    st.tuples(st.just("abandon"), st.just(0), st.just(0)),
    st.tuples(st.just("time"), st.just(0), st.integers(1, 1500)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=50))
def test_every_proposal_is_answered_once_unless_dropped_unsent(
    ops: list[tuple[str, int, int]],
) -> None:
    """Whatever happens (replacements, drops, refusals, failed and abandoned requests),
    each proposal is answered at most once, one request at most is in flight, no request
    names a partition twice, the queue always knows when it can send next, holds only
    partitions still here, and once the controller accepts everything every proposal
    not dropped unsent is answered."""
    queue = AlterPartitionQueue(max_items=3)
    answered: dict[int, list[int]] = {}
    dropped_unsent: set[int] = set()
    dropped_in_flight: set[int] = set()  # answered if the request is, unsent if abandoned
    hosted: set[TopicPartition] = set()
    serial = 0
    now = 0

    def item(p: int, epoch: int) -> AlterItem:
        nonlocal serial
        serial += 1
        n = serial
        answered[n] = []
        return AlterItem(
            TopicPartition("t", p),
            proposal(p, leader_epoch=epoch, partition_epoch=epoch),
            lambda a: answered[n].append(a.error_code),
        )

    def deliver(answers: Sequence[tuple[AlterItem, AlterPartitionResponse]]) -> None:
        for i, a in answers:
            i.on_answer(a)

    ids: dict[int, int] = {}  # id(item) -> serial, to follow drops of unsent items
    for what, p, n in ops:
        if what == "submit":
            new = item(p, n)
            ids[id(new)] = serial
            hosted.add(new.tp)
            queue.submit(new)
        elif what == "drop":
            tp = TopicPartition("t", p)
            gone = queue.unsent.get(tp)
            if gone is not None:
                dropped_unsent.add(ids[id(gone)])
            for i in queue.in_flight or ():
                if i.tp == tp:
                    dropped_in_flight.add(ids[id(i)])
            hosted.discard(tp)
            queue.drop(tp)
        elif what == "send":
            batch = queue.next_request(now)
            if batch is not None:
                assert len({i.tp for i in batch}) == len(batch) <= 3
        elif queue.in_flight is not None and what == "answer":
            refused = AlterPartitionResponse(E("INVALID_UPDATE_VERSION"))
            deliver(
                queue.on_answers(
                    [
                        refused if n >> k & 1 else accept([i])[0]
                        for k, i in enumerate(queue.in_flight)
                    ],
                    now,
                )
            )
        elif queue.in_flight is not None and what == "fail":
            deliver(queue.on_failure(E("REQUEST_TIMED_OUT"), now))
        elif queue.in_flight is not None and what == "abandon":
            queue.on_abandoned()
            dropped_unsent |= dropped_in_flight
        if queue.in_flight is None:
            dropped_in_flight.clear()
        if what == "time":
            now += n
        deliver(queue.take_answers_due())
        assert all(len(a) <= 1 for a in answered.values())
        assert queue.held <= len(hosted) and set(queue._holds) <= hosted
        if queue.in_flight is None and queue.unsent:
            assert queue.next_due_ms(now) is not None

    for _ in range(100):  # the controller now accepts everything
        if queue.in_flight is not None:
            deliver(queue.on_answers(accept(queue.in_flight), now))
        deliver(queue.take_answers_due())
        due = queue.next_due_ms(now)
        if due is None and queue.in_flight is None:
            break
        now = max(now, due or now)
        queue.next_request(now)
    for n, got in answered.items():
        assert len(got) == (0 if n in dropped_unsent else 1), n
