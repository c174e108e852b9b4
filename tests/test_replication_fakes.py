"""In-memory fakes for the replication core's tests, and tests that the fakes keep
Kafka's semantics (LeaderEpochFileCache.endOffsetFor, truncateTo).

FakeLog is a list of (epoch, value) records plus an epoch cache, and is the storage a
``PartitionDriver`` writes to; Replica runs a PartitionState through the production
``PartitionDriver`` (broker/replication/driver.py) with FakeLog as storage, itself as the
network (it records what leaves the partition) and a manual clock. Other test modules
import these.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import pytest

from rillet.broker.replication.driver import PartitionDriver
from rillet.broker.replication.partition_state import PartitionState
from rillet.broker.replication.types import (
    ACKS_ALL,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AppendFetched,
    BatchInfo,
    Effect,
    FetchRequest,
    FetchResponse,
    ProposeAlterPartition,
    ReplicationConfig,
)
from rillet.client.wire import errors

Record = tuple[int, object]  # (leader epoch, value)


class FakeLog:
    """A log of (epoch, value) records with a leader-epoch cache, Kafka's semantics."""

    def __init__(self) -> None:
        self.log_start_offset = 0
        self.records: list[Record] = []
        self.epochs: list[tuple[int, int]] = []  # (epoch, start offset), ascending
        self.high_watermark = 0  # as storage.Log: what the driver last stored

    @property
    def log_end_offset(self) -> int:
        return self.log_start_offset + len(self.records)

    @property
    def latest_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else UNDEFINED_EPOCH

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        if epoch == UNDEFINED_EPOCH or not self.epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self.latest_epoch:
            return epoch, self.log_end_offset
        higher = [(e, s) for e, s in self.epochs if e > epoch]
        if not higher:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        floor = [e for e, _ in self.epochs if e <= epoch]
        return (floor[-1] if floor else epoch), higher[0][1]

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        # At the log end (a new leader epoch), or below the start of an emptied log (the
        # epochs of records only the remote tier holds).
        assert start_offset == self.log_end_offset or (
            not self.records and start_offset < self.log_start_offset
        )
        if epoch > self.latest_epoch:
            self.epochs.append((epoch, start_offset))

    def append(self, records: Sequence[Record]) -> None:
        for epoch, value in records:
            assert epoch >= self.latest_epoch, (epoch, self.latest_epoch)
            if epoch > self.latest_epoch:
                self.epochs.append((epoch, self.log_end_offset))
            self.records.append((epoch, value))

    # -- ReplicaStorage: what the PartitionDriver writes --------------------------------

    def set_high_watermark(self, high_watermark: int) -> None:
        self.high_watermark = high_watermark

    def append_as_leader(self, values: Sequence[object], leader_epoch: int) -> tuple[int, int]:
        first = self.log_end_offset
        self.append([(leader_epoch, v) for v in values])
        return first, self.log_end_offset - 1

    def append_fetched(self, effect: AppendFetched, fetched: Sequence[Record]) -> None:
        assert effect.base_offset == self.log_end_offset, (effect, self.log_end_offset)
        assert len(fetched) == effect.next_offset - effect.base_offset, (effect, len(fetched))
        self.append(fetched)

    def read(self, start: int, end: int | None = None) -> list[Record]:
        end = self.log_end_offset if end is None else end
        return self.records[start - self.log_start_offset : end - self.log_start_offset]

    def truncate_to(self, offset: int) -> None:
        """Kafka's truncateTo: cut records at or after ``offset``, and always forget epochs
        starting at or after the resulting log end, even when no record is cut (an epoch a
        leader assigned before it appended anything)."""
        if offset < self.log_end_offset:
            del self.records[offset - self.log_start_offset :]
        end = self.log_end_offset
        self.epochs = [(e, s) for e, s in self.epochs if s < end]

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.records, self.epochs, self.log_start_offset = [], [], offset

    def increment_log_start_offset(self, offset: int) -> None:
        """Kafka's truncateFromStart on the epochs: the last entry below moves up."""
        if offset <= self.log_start_offset:
            return
        del self.records[: offset - self.log_start_offset]
        self.log_start_offset = offset
        below = [e for e, s in self.epochs if s <= offset]
        after = [(e, s) for e, s in self.epochs if s > offset]
        self.epochs = ([(below[-1], offset)] if below else []) + after


def batches_of(start: int, records: Sequence[Record]) -> tuple[BatchInfo, ...]:
    """One BatchInfo per run of same-epoch records."""
    out: list[BatchInfo] = []
    for i, (epoch, _) in enumerate(records):
        offset = start + i
        if out and out[-1].leader_epoch == epoch:
            out[-1] = BatchInfo(out[-1].base_offset, offset, epoch)
        else:
            out.append(BatchInfo(offset, offset, epoch))
    return tuple(out)


@dataclass
class Replica:
    """One broker's copy of the partition: a FakeLog, its PartitionState run by the
    production PartitionDriver, and what the driver sent out of it (the network)."""

    broker_id: int
    lag_ms: int = 30_000
    log: FakeLog = field(default_factory=FakeLog)
    proposals: list[ProposeAlterPartition] = field(default_factory=list)
    results: dict[Hashable, int] = field(default_factory=dict)
    hw_updates: list[int] = field(default_factory=list)
    now_ms: int = 0  # the driver's clock, set by the helpers that take a time
    driver: PartitionDriver = field(init=False)

    def __post_init__(self) -> None:
        self.state = PartitionState(self.broker_id, self.log, ReplicationConfig(self.lag_ms))

    @property
    def state(self) -> PartitionState:
        return self.driver.state

    @state.setter
    def state(self, state: PartitionState) -> None:
        """A test may swap in a core built its own way; the driver follows."""
        self.driver = PartitionDriver(state, self.log, self, lambda: self.now_ms)

    def apply(self, effects: Sequence[Effect], fetched: Sequence[Record] = ()) -> None:
        self.driver.apply(effects, fetched)

    # --- ReplicaNetwork: record what leaves the partition --------------------------

    def send_alter_partition(self, proposal: ProposeAlterPartition) -> None:
        self.proposals.append(proposal)

    def complete_produce(self, produce_id: Hashable, error_code: int) -> None:
        assert produce_id not in self.results, f"produce {produce_id} answered twice"
        self.results[produce_id] = error_code

    def high_watermark_updated(self, high_watermark: int) -> None:
        self.hw_updates.append(high_watermark)

    def log_appended(self) -> None:
        pass

    # --- leader-side helpers -------------------------------------------------------

    def append(self, values: Sequence[object], now_ms: int = 0) -> int:
        """Append as leader; returns required_offset (last offset + 1)."""
        self.now_ms = now_ms
        outcome = self.driver.append_as_leader(values, 1, 1)
        if outcome.error_code != errors.NONE:
            raise ValueError(f"broker {self.broker_id} may not append: {outcome}")
        return outcome.last_offset + 1

    def produce(
        self,
        produce_id: Hashable,
        values: Sequence[object],
        min_isr: int = 1,
        now_ms: int = 0,
        timeout_ms: int = 30_000,
    ) -> int | None:
        """An acks=all produce, as a driver runs it. Returns the refusal code or None."""
        self.now_ms = now_ms
        outcome = self.driver.append_as_leader(
            values, ACKS_ALL, min_isr, produce_id, now_ms + timeout_ms
        )
        return outcome.error_code if outcome.error_code != errors.NONE else None

    def serve(
        self, request: FetchRequest, now_ms: int, remote_log_start: int = UNDEFINED_OFFSET
    ) -> tuple[FetchResponse, list[Record]]:
        """``remote_log_start``: the first offset the remote tier holds, if any."""
        self.now_ms = now_ms
        decision = self.driver.on_follower_fetch(request, None, remote_log_start)
        records: list[Record] = []
        if decision.error_code == errors.NONE and decision.diverging_epoch is None:
            records = self.log.read(request.fetch_offset)
        response = FetchResponse(
            fetch_offset=request.fetch_offset,
            leader_epoch=request.current_leader_epoch,
            error_code=decision.error_code,
            high_watermark=decision.high_watermark,
            log_start_offset=decision.log_start_offset,
            diverging_epoch=decision.diverging_epoch,
            batches=batches_of(request.fetch_offset, records),
        )
        return response, records

    # --- follower-side helpers -----------------------------------------------------

    def receive(self, response: FetchResponse, records: Sequence[Record]) -> None:
        self.driver.on_fetch_response(response, records)

    def fetch_from(self, leader: Replica, now_ms: int = 0) -> None:
        """One complete fetch round trip (request, leader decision, response)."""
        request = self.state.fetch_request()
        assert request is not None, f"broker {self.broker_id} is not a follower"
        self.receive(*leader.serve(request, now_ms))


# ---- the fake's own semantics -----------------------------------------------------


def make_log(epochs_and_counts: Sequence[tuple[int, int]]) -> FakeLog:
    log = FakeLog()
    for epoch, count in epochs_and_counts:
        log.append([(epoch, f"e{epoch}-{i}") for i in range(count)])
    return log


def test_fake_end_offset_for_latest_epoch_is_the_log_end() -> None:
    log = make_log([(0, 3), (2, 2)])
    assert log.end_offset_for_epoch(2) == (2, 5)


def test_fake_end_offset_for_middle_epoch_is_next_epoch_start() -> None:
    log = make_log([(0, 3), (2, 2), (5, 1)])
    assert log.end_offset_for_epoch(0) == (0, 3)
    assert log.end_offset_for_epoch(1) == (0, 3)  # floor epoch 0, next start 3
    assert log.end_offset_for_epoch(3) == (2, 5)


def test_fake_end_offset_below_first_epoch_and_above_last() -> None:
    log = make_log([(3, 2), (4, 1)])
    assert log.end_offset_for_epoch(1) == (1, 0)
    assert log.end_offset_for_epoch(9) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert FakeLog().end_offset_for_epoch(0) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def test_fake_truncate_drops_epochs_starting_at_or_after_offset() -> None:
    log = make_log([(0, 3), (2, 2), (5, 1)])
    log.truncate_to(5)
    assert log.epochs == [(0, 0), (2, 3)]
    assert log.latest_epoch == 2 and log.log_end_offset == 5


def test_fake_truncate_at_the_end_drops_an_epoch_without_records() -> None:
    log = make_log([(0, 2)])
    log.assign_epoch_start_offset(1, 2)  # elected leader, never appended
    log.truncate_to(2)  # cuts no record...
    assert log.latest_epoch == 0  # ...but the empty epoch goes, as in Kafka


def test_fake_assigned_epoch_without_records_answers_its_start() -> None:
    log = make_log([(0, 3)])
    log.assign_epoch_start_offset(4, 3)
    assert log.end_offset_for_epoch(0) == (0, 3)
    assert log.end_offset_for_epoch(4) == (4, 3)


@pytest.mark.parametrize("start", [0, 7])
def test_batches_of_groups_runs_of_one_epoch(start: int) -> None:
    records: list[Record] = [(1, "a"), (1, "b"), (3, "c")]
    assert batches_of(start, records) == (
        BatchInfo(start, start + 1, 1),
        BatchInfo(start + 2, start + 2, 3),
    )
