"""Values shared by the partition replication core: the log view it needs, its config,
the requests and responses it reads, and the effects it returns.

Everything here is a frozen, slotted dataclass (or a Protocol). Nothing does I/O.
Kafka's names are kept so a reader can map each field onto Kafka's Partition,
ReplicaManager and AbstractFetcherThread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

UNDEFINED_EPOCH = -1
"""Kafka's UNDEFINED_EPOCH: no leader epoch (an empty epoch cache, or an unknown epoch)."""
UNDEFINED_OFFSET = -1
"""Kafka's UNDEFINED_EPOCH_OFFSET / UnknownOffset: an offset nobody knows yet."""
ACKS_ALL = -1


class ReplicationInvariantError(Exception):
    """A check that guards data failed: the core (or its caller) has a bug, or a peer broke
    the protocol in a way that would corrupt a log. The driver should stop the partition."""


def invariant(condition: bool, message: str) -> None:
    """Raise ReplicationInvariantError unless `condition` holds. Unlike `assert`, survives -O."""
    if not condition:
        raise ReplicationInvariantError(message)


class EpochLogView(Protocol):
    """What the core reads from a partition's local log (storage.Log provides it).

    `end_offset_for_epoch` follows Kafka's LeaderEpochFileCache.endOffsetFor:
    - the requested epoch is the latest epoch -> (epoch, log_end_offset);
    - some later epoch exists -> (largest epoch <= requested, start offset of the first
      epoch > requested); if no epoch <= requested exists, (requested, that start offset);
    - the requested epoch is above every known epoch, or the cache is empty, or the
      requested epoch is UNDEFINED_EPOCH -> (UNDEFINED_EPOCH, UNDEFINED_OFFSET).
    """

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def latest_epoch(self) -> int:
        """The epoch of the newest epoch-cache entry, UNDEFINED_EPOCH if none."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]: ...


class FetchClock:
    """When a follower last fetched through one fetch session (milliseconds, the
    driver's clock). The driver moves it forward once per fetch of the session; the core
    only reads it, as it reads the log through EpochLogView.

    It stands in for the fetches a follower makes of a partition it is caught up on
    without listing it (an incremental fetch leaves such a partition out, and the leader
    does not read it): each would record the same position at the leader's unchanged
    log end and refresh the caught-up time. The driver must read the partition
    explicitly (``on_follower_fetch``) before moving the clock whenever anything that
    fetch would see has changed (an append, the log start, the leader epoch, the role,
    the ISR), so the clock only ever stands for such repeats."""

    __slots__ = ("last_fetch_ms",)

    def __init__(self, last_fetch_ms: int = 0) -> None:
        self.last_fetch_ms = last_fetch_ms


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    replica_lag_time_max_ms: int = 30_000
    """Kafka's replica.lag.time.max.ms: a follower not caught up for this long leaves the ISR."""

    def __post_init__(self) -> None:
        if self.replica_lag_time_max_ms <= 0:
            raise ValueError("replica_lag_time_max_ms must be positive")


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """Kafka's FetchResponse DivergingEpoch / OffsetForLeaderEpoch answer."""

    epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What the follower core needs to know of one fetched record batch."""

    base_offset: int
    last_offset: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """A follower's fetch for one partition (Kafka: FetchRequest partition data)."""

    replica_id: int
    fetch_offset: int
    last_fetched_epoch: int
    current_leader_epoch: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """The leader's answer for one partition, as the follower core reads it.

    `fetch_offset` and `leader_epoch` echo the request this answers (the fetcher knows
    them); a response that no longer matches the follower's state is ignored.
    """

    fetch_offset: int
    leader_epoch: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    diverging_epoch: EpochEndOffset | None = None
    batches: tuple[BatchInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class AlterPartitionResponse:
    """The controller's answer to a ProposeAlterPartition (Kafka: AlterPartitionResponse).
    On success `isr`, `leader_epoch` and `partition_epoch` are the committed state."""

    error_code: int
    isr: tuple[int, ...] = ()
    leader_epoch: int = UNDEFINED_EPOCH
    partition_epoch: int = -1


# ---- effects -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssignEpochStartOffset:
    """Leader: record `epoch` starting at `start_offset` in the log's epoch cache
    (Kafka: maybeAssignEpochStartOffset) before appending anything in the new epoch."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class UpdateHighWatermark:
    """Store the new high watermark (log HW, checkpoint lazily) and wake fetches
    waiting for it."""

    high_watermark: int


@dataclass(frozen=True, slots=True)
class ProposeAlterPartition:
    """Leader: send AlterPartition to the controller. Exactly one is outstanding at a time;
    the driver must answer every one with on_alter_partition_response (an error code such
    as REQUEST_TIMED_OUT when the request fails or times out)."""

    proposal_id: int
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CompleteProduce:
    """An acks=all produce is done: error NONE, or NOT_ENOUGH_REPLICAS_AFTER_APPEND when
    the committed ISR fell below its min.insync.replicas (the records are written)."""

    produce_id: object
    error_code: int


@dataclass(frozen=True, slots=True)
class FailProduce:
    """An acks=all produce ends without reaching the HW: REQUEST_TIMED_OUT or
    NOT_LEADER_OR_FOLLOWER (leadership lost). The records may or may not survive."""

    produce_id: object
    error_code: int


@dataclass(frozen=True, slots=True)
class Truncate:
    """Follower: remove every record at or above `offset` (Kafka: truncateTo)."""

    offset: int


@dataclass(frozen=True, slots=True)
class TruncateFullyAndStartAt:
    """Follower: drop the whole log and restart it empty at `offset` (the fetch offset was
    below the leader's log start offset, or its local log start). `epochs`: (epoch, start
    offset) entries of the records below `offset`, which only the remote tier holds
    (from its segments' metadata), recorded in the emptied log's epoch cache after the
    cut: the next fetch's last fetched epoch, and later this replica's answers to
    divergence checks, come from them (Kafka: buildRemoteLogAuxState)."""

    offset: int
    epochs: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ListLeaderLocalStart:
    """Follower: the leader answered OFFSET_MOVED_TO_TIERED_STORAGE (our fetch offset is
    below its local log start, in the remote tier): ask it for its local log start
    (ListOffsets EARLIEST_LOCAL_TIMESTAMP, -4) and hand the answer, with the remote
    segments' leader epochs, to ``PartitionState.on_leader_local_start`` with these
    values. Carried out by whoever holds the connection to the leader (the fetcher),
    not by the storage: the driver's ``apply`` passes it over."""

    fetch_offset: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class IncrementLogStartOffset:
    """Follower: the leader's log start passed ours (retention there): records below
    `offset` are gone from the partition (Kafka: maybeIncrementLogStartOffset with
    LeaderOffsetIncremented). Ours there may even differ from what the leader had: a
    tail this broker wrote as a deposed leader, below the leader's log start, where the
    leader's epoch history no longer reaches to tell us to truncate it. Never past the
    follower's own HW."""

    offset: int


@dataclass(frozen=True, slots=True)
class AppendFetched:
    """Follower: append the response's batches, offsets [base_offset, next_offset)."""

    base_offset: int
    next_offset: int


Effect = (
    AssignEpochStartOffset
    | UpdateHighWatermark
    | ProposeAlterPartition
    | CompleteProduce
    | FailProduce
    | Truncate
    | TruncateFullyAndStartAt
    | AppendFetched
    | IncrementLogStartOffset
    | ListLeaderLocalStart
)


@dataclass(frozen=True, slots=True)
class FetchDecision:
    """The leader's answer to one follower fetch.

    If error_code is NONE and diverging_epoch is None, the driver sends the records in
    [fetch_offset, log_end_offset); otherwise it sends no records. `effects` come from the
    follower's new position (HW advance, completed produces, an ISR expansion)."""

    error_code: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    diverging_epoch: EpochEndOffset | None = None
    effects: tuple[Effect, ...] = ()
