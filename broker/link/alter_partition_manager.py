"""AlterPartition batching: every pending ISR change of this broker in one request.

A leader's replication core proposes an ISR change (``ProposeAlterPartition``) and waits
for exactly one answer. Sent one request per proposal, thousands of partitions whose
leaders move at once became thousands of requests to the active controller, each a Raft
entry, and a controller that refused them was asked again at every tick. As Kafka's
``AlterPartitionManager`` does, proposals queue here per partition and go out together:

- ``AlterPartitionQueue`` (no I/O, its clock passed in) decides what to send and when,
  and where each answer goes:
  - at most one request in flight; it carries every queued partition, at most
    ``max_items`` of them (the rest go in the next one), so a request and the Raft
    entry it becomes stay bounded;
  - a partition is queued once: a newer proposal for it replaces an unsent one (which
    is answered OPERATION_NOT_ATTEMPTED), and one for a partition already in flight
    waits for the next request (Kafka refuses it instead; a core proposes again only
    after its answer, so the second proposal comes from a replica re-created
    meanwhile, and refusing it would only delay it by a tick);
  - the answer is split back per partition (an item the controller left out is answered
    UNKNOWN_SERVER_ERROR); a request that fails as a whole (timeout, no controller,
    network) answers each of its items with that error, and the next request waits a
    backoff that doubles up to a cap and resets at the next answer;
  - a partition the controller refused is not proposed again in the same view (same
    leader and partition epochs) before its own backoff passes, doubling per refusal up
    to the cap: the core resends a transient refusal at every tick, and without this a
    refusing controller would be asked again and again;
  - ``drop(tp)``: a partition removed from this broker leaves the queue unsent (if its
    proposal is in flight, the answer is delivered but leaves no refusal hold behind);
  - a request whose sender is cancelled (``close``) goes back to the queue, so a
    manager started again sends it: it is never left "in flight" for ever.
- ``AlterPartitionManager``: the asyncio loop around it for the broker process (one
  task, started with the first proposal); the replication simulator drives the same
  queue from its own clock (tests/sim/controller_quorum.py).

Logging: one INFO line per request with its counts, per partition only at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rillet.broker.replication.types import AlterPartitionResponse, ProposeAlterPartition
from rillet.client.runtime.tasks import on_death_fatal
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.controller.metadata.image import TopicPartition

logger = logging.getLogger(__name__)

MAX_ITEMS_PER_REQUEST = 2000
BACKOFF_MIN_MS = 100  # Kafka's retry.backoff.ms
BACKOFF_MAX_MS = 1000  # Kafka's retry.backoff.max.ms
OPERATION_NOT_ATTEMPTED = errors.code_of("OPERATION_NOT_ATTEMPTED")
UNKNOWN_SERVER_ERROR = errors.code_of("UNKNOWN_SERVER_ERROR")
REQUEST_TIMED_OUT = errors.code_of("REQUEST_TIMED_OUT")

Proposal = tuple[TopicPartition, ProposeAlterPartition]
# The link's side: one request for the batch; its answers in the batch's order, or an
# exception (a RilletError's code answers every item).
AlterPartitionsSender = Callable[[Sequence[Proposal]], Awaitable[list[AlterPartitionResponse]]]


@dataclass(slots=True)
class AlterItem:
    tp: TopicPartition
    proposal: ProposeAlterPartition
    on_answer: Callable[[AlterPartitionResponse], None]


Answer = tuple[AlterItem, AlterPartitionResponse]


@dataclass(slots=True)
class _Hold:
    """A refused partition: the view refused and when that view may be proposed again."""

    leader_epoch: int
    partition_epoch: int
    until_ms: int
    backoff_ms: int


class AlterPartitionQueue:
    """What to send to the controller and when; no I/O (module docstring)."""

    def __init__(
        self,
        max_items: int = MAX_ITEMS_PER_REQUEST,
        backoff_min_ms: int = BACKOFF_MIN_MS,
        backoff_max_ms: int = BACKOFF_MAX_MS,
    ) -> None:
        self.max_items = max_items
        self.backoff_min_ms = backoff_min_ms
        self.backoff_max_ms = backoff_max_ms
        self.unsent: dict[TopicPartition, AlterItem] = {}  # in arrival order
        self.in_flight: list[AlterItem] | None = None
        self.not_before_ms = 0  # after a failed request
        self._backoff_ms = backoff_min_ms
        self._holds: dict[TopicPartition, _Hold] = {}
        self._answers_due: list[Answer] = []  # replaced items, answered outside a request
        # Partitions dropped while a request is in flight: their answers still come back
        # (to a replica that ignores them) but must not leave a hold behind.
        self._dropped: set[TopicPartition] = set()

    def submit(self, item: AlterItem) -> None:
        replaced = self.unsent.pop(item.tp, None)
        if replaced is not None:
            self._answers_due.append((replaced, AlterPartitionResponse(OPERATION_NOT_ATTEMPTED)))
        self.unsent[item.tp] = item

    def drop(self, tp: TopicPartition) -> None:
        """The partition left this broker: its unsent proposal is not sent (nobody waits
        for the answer)."""
        self.unsent.pop(tp, None)
        self._holds.pop(tp, None)
        if self.in_flight is not None:
            self._dropped.add(tp)

    @property
    def held(self) -> int:
        """Partitions whose refused view is remembered (tests, diagnosis)."""
        return len(self._holds)

    def take_answers_due(self) -> list[Answer]:
        """Answers owed outside any request (proposals replaced before they were sent)."""
        due, self._answers_due = self._answers_due, []
        return due

    def _held(self, item: AlterItem, now_ms: int) -> bool:
        hold = self._holds.get(item.tp)
        if hold is None:
            return False
        p = item.proposal
        if (hold.leader_epoch, hold.partition_epoch) != (p.leader_epoch, p.partition_epoch):
            return False  # a new view: the refusal said nothing about it
        return now_ms < hold.until_ms

    def next_request(self, now_ms: int) -> list[AlterItem] | None:
        """The items of the request to send now (they are in flight from here on), or
        None: one is in flight, the backoff runs, or nothing may go yet."""
        if self.in_flight is not None or now_ms < self.not_before_ms:
            return None
        batch: list[AlterItem] = []
        for item in self.unsent.values():
            if not self._held(item, now_ms):
                batch.append(item)
                if len(batch) >= self.max_items:
                    break
        if not batch:
            return None
        for item in batch:
            del self.unsent[item.tp]
        self.in_flight = batch
        return batch

    def next_due_ms(self, now_ms: int) -> int | None:
        """When ``next_request`` may have something to send (None: not before an answer
        or a new proposal)."""
        if self.in_flight is not None or not self.unsent:
            return None
        earliest: int | None = None
        for item in self.unsent.values():
            if not self._held(item, now_ms):
                earliest = now_ms
                break
            until = self._holds[item.tp].until_ms
            earliest = until if earliest is None else min(earliest, until)
        assert earliest is not None
        return max(earliest, self.not_before_ms)

    def on_answers(self, answers: Sequence[AlterPartitionResponse], now_ms: int) -> list[Answer]:
        """The controller answered the request in flight: each item's answer, in order."""
        batch, dropped = self._take_in_flight()
        self._backoff_ms = self.backoff_min_ms
        self.not_before_ms = 0
        out: list[Answer] = []
        for i, item in enumerate(batch):
            answer = (
                answers[i] if i < len(answers) else AlterPartitionResponse(UNKNOWN_SERVER_ERROR)
            )
            if item.tp not in dropped:
                self._note(item, answer.error_code, now_ms)
            out.append((item, answer))
        return out

    def on_failure(self, error_code: int, now_ms: int) -> list[Answer]:
        """The request in flight failed as a whole: every item gets ``error_code``, and
        the next request waits the backoff."""
        batch, _ = self._take_in_flight()
        self.not_before_ms = now_ms + self._backoff_ms
        self._backoff_ms = min(self.backoff_max_ms, self._backoff_ms * 2)
        return [(item, AlterPartitionResponse(error_code)) for item in batch]

    def on_abandoned(self) -> None:
        """The request in flight will never be answered (its sender was cancelled): its
        items go back to the queue, ahead of newer ones, for the next request. Left in
        flight, no request would ever go again, and each core would wait forever for
        its one answer."""
        batch, dropped = self._take_in_flight()
        newer, self.unsent = self.unsent, {}
        for item in batch:
            if item.tp not in dropped:
                self.unsent[item.tp] = item
        for item in newer.values():
            self.submit(item)  # replaces (answers NOT_ATTEMPTED) an older item of its tp

    def _take_in_flight(self) -> tuple[list[AlterItem], set[TopicPartition]]:
        """The request in flight, and which of its partitions were dropped meanwhile."""
        batch = self.in_flight
        if batch is None:
            raise ValueError("no AlterPartition request is in flight")
        self.in_flight = None
        dropped, self._dropped = self._dropped, set()
        return batch, dropped

    def _note(self, item: AlterItem, error_code: int, now_ms: int) -> None:
        if error_code == errors.NONE:
            self._holds.pop(item.tp, None)
            return
        p = item.proposal
        hold = self._holds.get(item.tp)
        same_view = hold is not None and (hold.leader_epoch, hold.partition_epoch) == (
            p.leader_epoch,
            p.partition_epoch,
        )
        backoff = (
            min(self.backoff_max_ms, hold.backoff_ms * 2)
            if same_view and hold is not None
            else self.backoff_min_ms
        )
        self._holds[item.tp] = _Hold(p.leader_epoch, p.partition_epoch, now_ms + backoff, backoff)


def summarize(answers: Sequence[Answer]) -> str:
    """One request's outcome in a line: "N partitions: M accepted, refused: X k, ..."."""
    refused = Counter(
        errors.error_name(a.error_code) for _, a in answers if a.error_code != errors.NONE
    )
    accepted = len(answers) - sum(refused.values())
    text = f"{len(answers)} partitions: {accepted} accepted"
    if refused:
        text += ", refused: " + ", ".join(f"{name} {n}" for name, n in sorted(refused.items()))
    return text


# -- the wire form --------------------------------------------------------------------------


def alter_partition_request(
    broker_id: int, broker_epoch: int, batch: Sequence[Proposal]
) -> m.AlterPartitionRequest:
    """A batch of ISR proposals as the one request the active controller answers."""
    topics: dict[str, list[m.IsrProposal]] = {}
    for tp, proposal in batch:
        topics.setdefault(tp.topic, []).append(
            m.IsrProposal(
                partition=tp.partition,
                leader_epoch=proposal.leader_epoch,
                new_isr=list(proposal.new_isr),
                partition_epoch=proposal.partition_epoch,
            )
        )
    return m.AlterPartitionRequest(
        broker_id=broker_id,
        broker_epoch=broker_epoch,
        topics=[m.AlterPartitionTopic(topic, items) for topic, items in topics.items()],
    )


def alter_partition_answers(
    batch: Sequence[Proposal], response: m.AlterPartitionResponse
) -> list[AlterPartitionResponse]:
    """The controller's answer to `alter_partition_request`, per item of ``batch`` as the
    replication core reads it (UNKNOWN_SERVER_ERROR for an item it left out)."""
    by_tp = {
        TopicPartition(t.topic, r.partition): AlterPartitionResponse(
            r.error_code, tuple(r.isr), r.leader_epoch, r.partition_epoch
        )
        for t in response.topics
        for r in t.partitions
    }
    missing = AlterPartitionResponse(UNKNOWN_SERVER_ERROR)
    return [by_tp.get(tp, missing) for tp, _ in batch]


# -- the asyncio loop ---------------------------------------------------------------------


class AlterPartitionManager:
    """The queue run by one task: sends a request whenever one may go, hands each answer
    to its proposer. An answer that raises ends the task under the fatal policy (a core
    that raised applying it disagrees with its log: docs/broker.md, "Faults")."""

    def __init__(
        self,
        send: AlterPartitionsSender,
        queue: AlterPartitionQueue | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.send = send
        self.queue = queue if queue is not None else AlterPartitionQueue()
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.requests = 0

    def now_ms(self) -> int:
        if self._clock is not None:
            return self._clock()
        return int(asyncio.get_running_loop().time() * 1000)

    def submit(
        self,
        tp: TopicPartition,
        proposal: ProposeAlterPartition,
        on_answer: Callable[[AlterPartitionResponse], None],
    ) -> None:
        self.queue.submit(AlterItem(tp, proposal, on_answer))
        self._wake.set()
        if self._task is None:
            task = asyncio.get_running_loop().create_task(self._run(), name="alter-partition")
            self._task = on_death_fatal(task, "applying an AlterPartition answer")

    def drop(self, tp: TopicPartition) -> None:
        self.queue.drop(tp)

    async def close(self) -> None:
        """Stop sending; nothing is answered any more (the partitions are shut down)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _run(self) -> None:
        queue = self.queue
        while True:
            for item, answer in queue.take_answers_due():
                item.on_answer(answer)
            now = self.now_ms()
            batch = queue.next_request(now)
            if batch is None:
                self._wake.clear()
                due = queue.next_due_ms(now)
                timeout = None if due is None else max(due - now, 0) / 1000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            answers = await self._request(batch)
            for item, answer in answers:
                logger.debug(
                    "%s-%d: AlterPartition %s answered %s, isr %s, partition epoch %d",
                    item.tp.topic,
                    item.tp.partition,
                    list(item.proposal.new_isr),
                    errors.error_name(answer.error_code),
                    list(answer.isr),
                    answer.partition_epoch,
                )
                item.on_answer(answer)

    async def _request(self, batch: list[AlterItem]) -> list[Answer]:
        self.requests += 1
        queue = self.queue
        try:
            responses = await self.send([(item.tp, item.proposal) for item in batch])
        except asyncio.CancelledError:
            queue.on_abandoned()  # close(): a manager started again sends them
            raise
        except errors.RilletError as e:
            answers = queue.on_failure(e.code, self.now_ms())
            logger.info(
                "AlterPartition of %d partitions failed (%s); next request in %d ms at the "
                "earliest",
                len(batch),
                errors.error_name(e.code),
                max(queue.not_before_ms - self.now_ms(), 0),
            )
            return answers
        except Exception:  # a bug or a dropped channel: the cores resend on their tick
            logger.exception("AlterPartition of %d partitions failed", len(batch))
            return queue.on_failure(REQUEST_TIMED_OUT, self.now_ms())
        answers = queue.on_answers(responses, self.now_ms())
        logger.info("AlterPartition: %s", summarize(answers))
        return answers
