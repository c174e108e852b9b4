"""The follower's half of replication (Kafka: AbstractFetcherThread / ReplicaFetcherThread
decisions for one partition), with no I/O.

The follower fetches from its log end offset, carrying the epoch of its last record
(last_fetched_epoch). The leader checks that pair against its own epoch history; where
they diverge it answers with a diverging epoch (epoch, end_offset) instead of records,
and the follower truncates (KIP-101, KIP-279, KIP-320/KIP-595 fetch-based truncation).
Truncation may take several rounds when the follower holds epochs the leader never saw;
each round uses the follower's newest remaining epoch, so it converges.

A fetch below the leader's local log start, in the range its remote tier holds, is
answered OFFSET_MOVED_TO_TIERED_STORAGE: the follower asks the leader for its local log
start (``ListLeaderLocalStart``), then empties its log and starts it there, with the
leader epochs of the records below taken from the remote segments' metadata
(``on_leader_local_start``), as Kafka's follower does; it never copies the remote range.
"""

from __future__ import annotations

from collections.abc import Sequence

from rillet.broker.replication.types import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AppendFetched,
    BatchInfo,
    Effect,
    EpochEndOffset,
    EpochLogView,
    FetchRequest,
    FetchResponse,
    ListLeaderLocalStart,
    Truncate,
    TruncateFullyAndStartAt,
    invariant,
)
from rillet.client.wire import errors

_OFFSET_OUT_OF_RANGE = errors.code_of("OFFSET_OUT_OF_RANGE")
_OFFSET_MOVED_TO_TIERED_STORAGE = errors.code_of("OFFSET_MOVED_TO_TIERED_STORAGE")


class FollowerState:
    """One partition followed from `leader_id` in `leader_epoch`. The high watermark
    itself lives in PartitionState; calls take the current one and return the new one."""

    __slots__ = ("broker_id", "leader_id", "leader_epoch", "_log")

    def __init__(self, broker_id: int, leader_id: int, leader_epoch: int, log: EpochLogView):
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self._log = log

    def fetch_request(self) -> FetchRequest:
        return FetchRequest(
            replica_id=self.broker_id,
            fetch_offset=self._log.log_end_offset,
            last_fetched_epoch=self._log.latest_epoch,
            current_leader_epoch=self.leader_epoch,
        )

    def on_fetch_response(
        self, response: FetchResponse, high_watermark: int
    ) -> tuple[list[Effect], int]:
        """Effects to apply in order, and the follower's new high watermark candidate."""
        log_end_offset = self._log.log_end_offset
        if response.leader_epoch != self.leader_epoch or response.fetch_offset != log_end_offset:
            return [], high_watermark  # answers an older request; the log has moved on
        if response.error_code == _OFFSET_OUT_OF_RANGE:
            return self._on_out_of_range(response, high_watermark)
        if response.error_code == _OFFSET_MOVED_TO_TIERED_STORAGE:
            return [ListLeaderLocalStart(log_end_offset, self.leader_epoch)], high_watermark
        if response.error_code != errors.NONE:
            return [], high_watermark  # fenced / not leader: wait for new metadata, retry
        if response.diverging_epoch is not None:
            offset = self.truncation_offset(response.diverging_epoch, high_watermark)
            return [Truncate(offset)], min(high_watermark, offset)
        effects: list[Effect] = []
        next_offset = log_end_offset
        if response.batches:
            next_offset = self._check_batches(response.batches, log_end_offset)
            effects.append(AppendFetched(log_end_offset, next_offset))
        # Kafka: follower HW = min(leader HW, own LEO). Never move it back here: every
        # record below the old HW was committed and the new leader holds it too.
        new_hw = max(high_watermark, min(response.high_watermark, next_offset))
        return effects, new_hw

    def truncation_offset(self, diverging: EpochEndOffset, high_watermark: int) -> int:
        """Where to truncate for the leader's diverging epoch (Kafka:
        getOffsetTruncationState). May be an intermediate point: the next fetch, carrying
        the follower's new latest epoch, lets the leader answer again."""
        log_end_offset = self._log.log_end_offset
        if diverging.epoch == UNDEFINED_EPOCH or diverging.end_offset == UNDEFINED_OFFSET:
            # The leader knows no epoch at or below ours: fall back to the high watermark.
            return min(high_watermark, log_end_offset)
        epoch, end_offset = self._log.end_offset_for_epoch(diverging.epoch)
        if epoch == UNDEFINED_EPOCH:
            return min(diverging.end_offset, log_end_offset)
        if epoch != diverging.epoch:
            # We never had the leader's epoch: cut to the end of our largest epoch below it.
            return min(end_offset, log_end_offset)
        return min(end_offset, diverging.end_offset, log_end_offset)

    def _on_out_of_range(
        self, response: FetchResponse, high_watermark: int
    ) -> tuple[list[Effect], int]:
        if response.fetch_offset < response.log_start_offset:
            start = response.log_start_offset
            return [TruncateFullyAndStartAt(start)], max(high_watermark, start)
        # Above the leader's end: only an unclean election gets here, and the epoch
        # check catches it first whenever we have an epoch. Wait for metadata.
        return [], high_watermark

    def on_leader_local_start(
        self,
        fetch_offset: int,
        leader_epoch: int,
        local_start: int,
        remote_epochs: Sequence[tuple[int, int]],
        high_watermark: int,
    ) -> tuple[list[Effect], int]:
        """The leader's local log start, asked for after an OFFSET_MOVED_TO_TIERED_STORAGE
        answer to our fetch at ``fetch_offset`` in ``leader_epoch``: start the log empty
        there, with the epochs of the remote records below it (``remote_epochs``, the
        remote segments' (epoch, start offset) entries, oldest first). Everything below
        it is committed (only committed records are copied remotely), so the high
        watermark may move up to it. An answer to an older question, or one that no
        longer lies past our log end, changes nothing: the next fetch asks again."""
        if (
            leader_epoch != self.leader_epoch
            or fetch_offset != self._log.log_end_offset
            or local_start <= fetch_offset
        ):
            return [], high_watermark
        epochs = tuple((e, s) for e, s in remote_epochs if s < local_start)
        return [TruncateFullyAndStartAt(local_start, epochs)], max(high_watermark, local_start)

    def _check_batches(self, batches: tuple[BatchInfo, ...], log_end_offset: int) -> int:
        """The batches must continue our log, in order, in epochs we may accept.

        A batch may start past where the previous one ended (Kafka: offsets only
        increase): compaction drops whole batches and the records at their ends, so a
        compacted leader's log has gaps, even at the offset a new replica fetches."""
        expected = log_end_offset
        epoch = self._log.latest_epoch
        for batch in batches:
            invariant(
                batch.base_offset >= expected,
                f"fetched batch starts at {batch.base_offset}, below {expected}",
            )
            invariant(batch.last_offset >= batch.base_offset, f"empty batch range {batch}")
            invariant(
                epoch <= batch.leader_epoch <= self.leader_epoch,
                f"fetched batch epoch {batch.leader_epoch} outside [{epoch}, {self.leader_epoch}]",
            )
            expected = batch.last_offset + 1
            epoch = batch.leader_epoch
        return expected
