"""``Log``: one partition's segmented, append-only log in ``<data.dir>/<topic>-<partition>/``.

Threading model: every public method runs on the event-loop thread (the broker's), and
the synchronous ones never fsync. Appends are one ``fs.write`` to the page cache, so a
produce handler can append before its first ``await`` and keep arrival order.

Which calls block (do file work beyond a page-cache write) and what to use instead:

- ``append``/``append_as_follower``: never fsync. A roll creates the new segment file
  inline (one open) and hands the old segment's fsync and index write to the default
  executor when a loop is running (inline otherwise). ``flush.messages``/``flush.ms``
  schedule a background flush the same way.
- ``read``/``read_bytes``/``offset_for_timestamp``: preads of headers (61 bytes each)
  and, for a closed segment first touched, its index file (<= ~200 KiB).
- ``truncate_to``/``truncate_fully_and_start_at``: ftruncate and renames inline (fast
  metadata work); unlinks are deferred to ``purge_retired``.
- ``flush``/``close``/``Log.open``: block (fsync, recovery scan). Use ``flush_async``,
  ``close_async`` and ``LogManager`` (which opens logs in threads) from the loop.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

from rillet.client.wire import records
from rillet.client.wire.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    OffsetOutOfRangeError,
    StorageError,
)
from rillet.client.wire.records import LOG_OVERHEAD, BatchHeader
from rillet.storage import checkpoints, fs
from rillet.storage.config import LogConfig
from rillet.storage.epoch_cache import LeaderEpochCache, agreed_end
from rillet.storage.fdcache import FdCache
from rillet.storage.fileslice import FileSlice
from rillet.storage.invariants import invariant
from rillet.storage.segment import LogSegment

logger = logging.getLogger(__name__)

Clock = Callable[[], int]
T = TypeVar("T")
# Runs a log's background work instead of the default executor: receives ``job`` (the
# blocking part) and ``after`` (its loop-thread follow-up), to call in that order, later
# or never (a crash). Neither raises: a failed job marks the log failed and makes
# ``after`` do nothing. For a simulator that decides when a roll's fsync lands.
Background = Callable[[Callable[[], None], Callable[[], None]], None]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class TimestampOffset(NamedTuple):
    offset: int
    timestamp: int


@dataclass(slots=True)
class Retired:
    """A segment out of the log whose descriptor must outlive in-flight reads."""

    deadline_ms: int
    segment: LogSegment
    unlink: list[Path]


class Log:
    """One partition log. Build with ``Log.open(directory, config)``."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock: Clock,
        background: Background | None = None,
    ) -> None:
        self.directory = directory
        self.background = background  # None: the default executor (inline with no loop)
        self.config = config  # the setter below caches what the append path reads
        self.clock = clock
        # The append path checks segment.ms once per batch: with the wall clock that is
        # one builtin call in ns instead of a Python call and an integer division.
        self._now_ns: Callable[[], int] = (
            time.time_ns if clock is wall_clock_ms else lambda: clock() * 1_000_000
        )
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._log_start = 0
        self._recovery_point = 0
        # The recovery point as last written to disk: recovery judges a segment's short
        # end from the one holding it, so the cleaner compacts only below it.
        self.durable_recovery_point = 0
        self.epochs = LeaderEpochCache(directory / checkpoints.LEADER_EPOCH)
        self.generation = 0  # bumped whenever segments are removed or cut: cleaner checks it
        # Bumped (under the state lock) before a truncation or a compaction swap touches
        # any file: a roll or flush job captured earlier must not write its index
        # snapshot after that, to a path a cut, replaced or new segment now owns.
        self._cuts = 0
        self._unflushed_messages = 0
        self._last_flush_ms = clock()
        self._pending: set[asyncio.Future] = set()
        self._retired: list[Retired] = []
        # Guards the recovery point, the generation and every checkpoint write (executor
        # threads flush; the loop thread truncates).
        self._state_lock = threading.Lock()
        # The on-disk epoch checkpoint holds these entries and is valid for every offset
        # below _epochs_durable_end. The recovery point on disk never passes that end:
        # recovery keeps the checkpointed epochs below the recovery point and re-derives
        # the rest from batch headers, so a recovery point past it would lose epochs.
        self._epochs_on_disk: list[tuple[int, int]] | None = None
        self._epochs_durable_end = 0
        self.failure: BaseException | None = None
        # Told once when the log turns read-only (LogManager sets it; Kafka's
        # LogDirFailureChannel): the owner decides what a failed log means for the node.
        self.failure_listener: Callable[[Log, BaseException], None] | None = None
        # Told after the log start moves (retention, a follower taking its leader's
        # start, a full truncation): a broker's fetch sessions answer the new start
        # without reading every partition on every fetch.
        self.start_listener: Callable[[], None] | None = None
        self.maintenance_lock = asyncio.Lock()
        self.closed = False
        # The gate every roll and flush job passes (``_job``): ``close`` shuts it, then
        # waits for the jobs inside to leave, so no job touches the log's files once the
        # close starts. A delete renames the directory after the close, and a re-created
        # topic may put a new log at the same path: a job let through later would fsync
        # a missing directory (a fatal error on a live broker) or write its snapshot of
        # the old log's index and checkpoints into the new log's files.
        self._jobs = threading.Condition(self._state_lock)
        self._jobs_running = 0
        self._jobs_shut = False
        # Set by the broker that replicates this log (Kafka keeps the HW on the log too).
        # Retention and compaction touch only segments wholly below it: a segment above
        # it holds records a follower may still need, or a leader change may truncate.
        # None: a log no broker replicates, bounded by its end.
        self.high_watermark: int | None = None
        self.topic_id: str | None = None  # partition.metadata; set by load and LogManager
        # The highest offset safely in remote storage (docs/tiered.md), -1 when none:
        # set by the broker from the metadata image, as the end of the run of finished
        # remote segments from the remote log start (never across a hole). On a
        # remote-enabled log retention deletes only segments that end at or below it
        # (storage/retention.py).
        self.remote_copied_end = -1
        # The remote log's (epoch, start offset) entries and start, set with it: local
        # retention counts an offset as remote only where this log agrees with the
        # remote one (``remote_end_in_lineage``). None: not known, the end alone counts.
        self.remote_epochs: tuple[Sequence[tuple[int, int]], int] | None = None
        self.clean_upto = -1  # cleaner's in-memory checkpoint (base of last cleaned segment)
        # Closes this log's idle segment descriptors under a process-wide bound (the log
        # manager's); None: every descriptor stays open until the segment closes.
        self.fd_cache: FdCache | None = None

    # -- opening ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike,
        config: LogConfig | None = None,
        *,
        clock: Clock | None = None,
        background: Background | None = None,
        sync_parent: bool = True,
    ) -> Log:
        """Open (or create) a partition log. Blocks: run it in a thread from a loop.
        ``background``: see ``Background`` (default: the executor). ``sync_parent``
        False: a created directory's entry is left for the caller to make durable
        (``fsync_dir`` of the parent) before the log is used; LogManager does it once
        for a whole batch of new logs."""
        from rillet.storage.recovery import load_log

        path = Path(directory)
        if not fs.exists(path):
            fs.makedirs(path)
            # The new directory is an entry in its parent, durable only once the parent
            # is fsynced (fsync of a file inside does not promise it): without this, a
            # crash could lose the whole partition after a flush promised its records.
            if sync_parent:
                fs.fsync_dir(path.parent)
        log = cls(path, config or LogConfig(), clock or wall_clock_ms, background)
        load_log(log)
        return log

    def use_fd_cache(self, cache: FdCache) -> None:
        """Put every segment, and every one made from now on, under ``cache``."""
        self.fd_cache = cache
        for seg in self._segments:
            seg._used = False  # opened by recovery, handed to no reader yet
            cache.adopt(seg)

    def release_descriptors(self) -> None:
        """Close every segment descriptor (they reopen on use): for a log opened off the
        event loop, so that opening thousands never holds thousands of descriptors."""
        for seg in self._segments:
            seg.release()

    def _adopt(self, seg: LogSegment) -> None:
        if self.fd_cache is not None:
            self.fd_cache.adopt(seg)

    def _install(self, segments: list[LogSegment], log_start: int, recovery_point: int) -> None:
        """Set the loaded state; called once by recovery.load_log."""
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._log_start = log_start
        self._recovery_point = recovery_point
        self.durable_recovery_point = recovery_point  # load_log writes it next
        self._check_segments()

    # -- state --------------------------------------------------------------------------

    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, config: LogConfig) -> None:
        """Replace the settings (a topic config change); takes effect on the next append."""
        self._config = config
        self._flush_policy = config.flush_messages is not None or config.flush_ms is not None
        self._segment_bytes = config.segment_bytes
        self._segment_ns = config.segment_ms * 1_000_000
        self._max_message_bytes = config.max_message_bytes

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    def remote_end_in_lineage(self) -> int:
        """``remote_copied_end``, lowered to where this log stops agreeing with the remote
        log: after an unclean election the leader's records at offsets the remote log
        also holds are others than the remote ones, and are not safely remote."""
        if self.remote_epochs is None or self.remote_copied_end < 0:
            return self.remote_copied_end
        entries, start = self.remote_epochs
        own = self.epochs.entries()
        return agreed_end(
            own, self.log_start_offset, self.log_end_offset, entries, start, self.remote_copied_end
        )

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def removable_end(self) -> int:
        """Offsets below this may be deleted or compacted: the high watermark if set."""
        return self.log_end_offset if self.high_watermark is None else self.high_watermark

    @property
    def latest_epoch(self) -> int:
        return self.epochs.latest_epoch

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def segments(self) -> Sequence[LogSegment]:
        return tuple(self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """KIP-101/279: (largest epoch <= ``epoch``, where the next epoch starts or the
        log end for the latest); (-1, -1) when ``epoch`` is newer than any known."""
        return self.epochs.end_offset_for(epoch, self.log_end_offset)

    # -- appends ------------------------------------------------------------------------

    def append(self, batches: bytes | bytearray | memoryview, leader_epoch: int) -> tuple[int, int]:
        """Append a produce payload as leader: validate every batch, then assign offsets
        and stamp ``leader_epoch``, then write. Returns (first, last) offset.

        A writable payload (bytearray, writable memoryview) is stamped in place; a
        read-only one is left as it is and written with a stamped copy of its prefix.
        Raises CorruptRecordError / MessageTooLargeError having written nothing.
        This is the hot path (one call per produced batch): keep per-batch work lean.
        """
        if self.failure is not None or self.closed:
            self._refuse_write()
        # The common case inline: one valid batch that needs no roll, checked, stamped and
        # written by batchwrite.write_batch. Everything else (several batches, a roll, a
        # fenced epoch, a bad batch) takes the general path, which validates again and
        # raises the precise error: cheap next to what that path does anyway.
        seg = self._segments[-1]
        epoch = self.epochs.latest_epoch
        if (
            leader_epoch >= epoch
            and seg.size + len(batches) <= self._segment_bytes  # else: roll (or oversized)
            and self._now_ns() - seg.created_ns < self._segment_ns
        ):
            base = seg.next_offset
            try:
                done = seg.append_one(batches, leader_epoch, self._max_message_bytes)
            except OSError as exc:
                self._write_failed(seg, exc)
                raise
            if done is not None:
                last, count = done
                if leader_epoch != epoch:  # before a flush captures the epochs
                    self.epochs.assign(leader_epoch, base)
                if self._flush_policy:  # counted only when flush.messages / flush.ms ask
                    self._unflushed_messages += count
                    self._maybe_flush_by_policy()
                return base, last
        return self._append_many(batches, leader_epoch)

    def _append_many(
        self, batches: bytes | bytearray | memoryview, leader_epoch: int
    ) -> tuple[int, int]:
        """``append`` in general: any number of batches, rolling first when needed."""
        buf = _writable(batches)
        headers, count = self._validate(buf, self.config.max_message_bytes)
        if leader_epoch < self.epochs.latest_epoch:
            raise FencedLeaderEpochError(
                f"{self.name}: append at epoch {leader_epoch} < latest {self.latest_epoch}"
            )
        first = next_offset = self._segments[-1].next_offset
        entries = []
        position = 0
        for h in headers:
            records.stamp(buf, position, next_offset, leader_epoch)
            size = h.batch_length + LOG_OVERHEAD
            last = next_offset + h.last_offset_delta
            entries.append((next_offset, last, h.max_timestamp, size))
            position += size
            next_offset = last + 1
        self._write(buf, entries, count)
        if leader_epoch != self.epochs.latest_epoch:
            self.epochs.assign(leader_epoch, first)
        if self._flush_policy:  # after the epochs: a flush captures them
            self._maybe_flush_by_policy()
        return first, next_offset - 1

    def append_as_follower(self, batches: bytes | bytearray | memoryview) -> tuple[int, int]:
        """Append batches fetched from the leader, keeping their offsets and epochs.

        Offsets must start at or after the log end and increase (compacted batches may
        leave gaps). Returns (first, last) offset; raises CorruptRecordError otherwise.
        ``max.message.bytes`` is not checked: it limits what clients produce, and the
        leader already accepted these batches (a lowered limit, or a broker configured
        lower than the leader, must not wedge replication).
        """
        if self.failure is not None or self.closed:
            self._refuse_write()
        headers, count = self._validate(batches, None)
        expected = self.log_end_offset
        entries = []
        for h in headers:
            if h.base_offset < expected:
                raise CorruptRecordError(
                    f"{self.name}: follower batch has base offset {h.base_offset}, "
                    f"expected >= {expected}"
                )
            expected = h.next_offset
            entries.append(
                (h.base_offset, h.last_offset, h.max_timestamp, h.batch_length + LOG_OVERHEAD)
            )
        self._write(batches, entries, count)
        for h in headers:
            if h.partition_leader_epoch > self.epochs.latest_epoch:
                self.epochs.assign(h.partition_leader_epoch, h.base_offset)
        if self._flush_policy:  # after the epochs: a flush captures them
            self._maybe_flush_by_policy()
        return headers[0].base_offset, headers[-1].last_offset

    def _validate(
        self, buf: bytes | bytearray | memoryview, limit: int | None
    ) -> tuple[list[BatchHeader], int]:
        """Every batch complete, CRC-valid and within ``limit`` bytes (None: no limit);
        nothing written. Returns the headers and the total record count."""
        end = len(buf)
        if end == 0:
            raise CorruptRecordError(f"{self.name}: empty append")
        out = []
        count = position = 0
        while position < end:
            h = records.validate_batch(buf, position, max_size=limit)
            if h.record_count < 1:
                raise CorruptRecordError(f"{self.name}: batch at byte {position} has no records")
            out.append(h)
            count += h.record_count
            position += h.batch_length + LOG_OVERHEAD
        return out, count

    def _write(
        self,
        data: bytes | bytearray | memoryview,
        entries: list[tuple[int, int, int, int]],
        count: int,
    ) -> None:
        """entries: (base offset, last offset, max timestamp, size) per batch."""
        seg = self._segments[-1]
        if seg.size and seg.size + len(data) > self._segment_bytes:
            seg = self.roll()
        else:
            self._maybe_roll(entries[-1][1])
            seg = self._segments[-1]
        try:
            seg.append(data, entries)
        except OSError as exc:
            self._write_failed(seg, exc)
            raise
        self._unflushed_messages += count

    def _write_failed(self, seg: LogSegment, exc: OSError) -> None:
        """A write raised: cut whatever part of it reached the file, so the next append
        lands where the segment's size says. If even that fails, the file no longer
        matches the log, and the log turns read-only (Kafka takes the log dir offline)."""
        try:
            fs.ftruncate(seg.fd, seg.size)
        except OSError as cut_exc:
            self._fail(cut_exc)
            logger.error(
                "%s: a write failed (%r) and its partial bytes could not be cut (%r); "
                "the log is now read-only",
                self.name,
                exc,
                cut_exc,
            )

    def _refuse_write(self) -> None:
        if self.failure is not None:
            raise StorageError(f"{self.name}: log failed earlier: {self.failure}")
        invariant(not self.closed, f"{self.name}: append to a closed log")

    # -- rolling and flushing -----------------------------------------------------------

    def _maybe_roll(self, last_offset: int) -> None:
        """Roll by segment.ms, or when relative offsets would overflow the index."""
        seg = self._segments[-1]
        if seg.size and (
            self.clock() - seg.created_ms >= self._config.segment_ms or not seg.fits(last_offset)
        ):
            self.roll()

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end; the old one's fsync and index write
        run in the background (inline without a running loop)."""
        old = self.active_segment
        snapshot = old.seal()
        # Every segment from the recovery point's up to the old one: roll jobs run on
        # several executor threads, and one finishing early must not move the recovery
        # point past an earlier segment whose own job has not fsynced it yet (Kafka's
        # roll flushes everything from the recovery point up to the new segment too).
        unsynced = [s for s in self._segments if s.base_offset >= self._recovery_point_base()]
        new = LogSegment.create(
            self.directory, old.next_offset, self.config.index_interval_bytes, self.clock()
        )
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self._adopt(new)
        end = new.base_offset
        generation = self.generation
        cuts = self._cuts
        indexed = False

        def persist() -> None:
            nonlocal indexed
            with self._state_lock:
                if cuts == self._cuts:
                    old.write_indexes(snapshot, fsync=True)
                    indexed = True
            for seg in unsynced:
                seg.fsync()
            self._advance_recovery_point(end, generation, write=False)

        def after() -> None:
            if indexed:  # else the index stays in memory; close() writes it
                self._freeze_if_closed(old)

        self._background(self._job(persist), after=after)
        return new

    def _freeze_if_closed(self, seg: LogSegment) -> None:
        """After a roll's index write: drop the in-memory index, unless a truncation made
        the segment active again meanwhile."""
        if seg is not self._segments[-1]:
            seg.freeze()

    def _maybe_flush_by_policy(self) -> None:
        c = self.config
        due = c.flush_messages is not None and self._unflushed_messages >= c.flush_messages
        if c.flush_ms is not None and self._unflushed_messages:
            due = due or self.clock() - self._last_flush_ms >= c.flush_ms
        if due:
            self._unflushed_messages = 0
            self._last_flush_ms = self.clock()
            self._background(self._prepare_flush(), after=None)

    def maybe_flush_by_time(self) -> None:
        """The manager's periodic tick: flush.ms also applies to a log gone quiet."""
        self._maybe_flush_by_policy()

    def _prepare_flush(self) -> Callable[[], None]:
        """Capture, on the loop thread, what a flush must persist; returns the job."""
        segments = [s for s in self._segments if s.base_offset >= self._recovery_point_base()]
        end = self.log_end_offset
        active = self.active_segment
        snapshot = active.index_snapshot()
        epochs = self.epochs.snapshot()
        generation = self.generation
        cuts = self._cuts

        def job() -> None:
            for seg in segments:
                seg.fsync()
            with self._state_lock:
                if cuts == self._cuts:
                    active.write_indexes(snapshot, fsync=True)
            with self._state_lock:
                if generation == self.generation:  # else a cut since capture wrote newer
                    self._checkpoint_epochs_locked(epochs, end)
            self._advance_recovery_point(end, generation, write=True)

        return self._job(job)

    def _job(self, job: Callable[[], None]) -> Callable[[], None]:
        """``job`` (a roll's or a flush's blocking part) through the close gate: a no-op
        once the log is closing or closed (the close persists everything the job would
        have), and, when let through, one the close waits for. A failure is still fatal
        (``_fail_on_error``): no job runs after its log's files went away."""
        guarded = self._fail_on_error(job)

        def run() -> None:
            with self._jobs:
                if self._jobs_shut:
                    return
                self._jobs_running += 1
            try:
                guarded()
            finally:
                with self._jobs:
                    self._jobs_running -= 1
                    self._jobs.notify_all()

        return run

    def _shut_jobs(self) -> None:
        """Let no roll or flush job start, and wait for those running. Blocks (for at
        most one job's fsyncs); called by ``close`` before it touches any file."""
        with self._jobs:
            self._jobs_shut = True
            self._jobs.wait_for(lambda: self._jobs_running == 0)

    def _fail_on_error(self, job: Callable[[], None]) -> Callable[[], None]:
        """``job`` (fsyncs, checkpoint writes) marking the log failed before it raises.
        After a failed fsync the kernel may have dropped the dirty pages and marked them
        clean, so a later fsync succeeds without them ("fsyncgate"): nothing written
        before may be trusted, and no later flush may move the recovery point past it.
        Marked at once, on the thread that saw it, so a concurrent job cannot advance."""

        def run() -> None:
            try:
                job()
            except Exception as exc:
                self._fail(exc)
                raise

        return run

    def _recovery_point_base(self) -> int:
        i = bisect.bisect_right(self._bases, self._recovery_point) - 1
        return self._bases[max(i, 0)]

    def _checkpoint_epochs_locked(self, entries: list[tuple[int, int]], end: int) -> None:
        """Make the on-disk epoch file valid through ``end``, given the entries captured
        when the log ended there (caller holds the lock, and no cut happened since the
        capture). Flush jobs may finish out of order: an older capture never overwrites
        a newer one, and unchanged entries need no write."""
        if end <= self._epochs_durable_end:
            return
        if entries != self._epochs_on_disk:
            self.epochs.write(entries, fsync=True)
            self._epochs_on_disk = entries
        self._epochs_durable_end = end

    def _write_recovery_point(self) -> None:
        with self._state_lock:
            self._write_recovery_point_locked()

    def _write_recovery_point_locked(self) -> None:
        point = min(self._recovery_point, self._epochs_durable_end)
        checkpoints.write_offset(self.directory / checkpoints.RECOVERY_POINT, point, fsync=True)
        self.durable_recovery_point = point

    def _advance_recovery_point(self, offset: int, generation: int, *, write: bool) -> None:
        """Raise the recovery point (thread-safe) unless the log was cut meanwhile."""
        with self._state_lock:
            if self.failure is not None:
                return  # a failed fsync may have lost pages below ``offset``
            if generation != self.generation or offset <= self._recovery_point:
                if not write:
                    return
            else:
                self._recovery_point = offset
            if write:
                self._write_recovery_point_locked()

    def flush(self) -> None:
        """fsync everything written so far and checkpoint the recovery point. Blocks."""
        self._unflushed_messages = 0
        self._last_flush_ms = self.clock()
        self._prepare_flush()()

    async def flush_async(self) -> None:
        """``flush`` with the blocking part in the default executor. Tracked with the
        other background jobs, so ``wait_background`` (and a delete) waits for it."""
        if self.closed:
            return
        self._unflushed_messages = 0
        self._last_flush_ms = self.clock()
        job = self._prepare_flush()
        loop = asyncio.get_running_loop()
        if self.background is None:
            future = loop.run_in_executor(None, job)
        else:
            future = self._defer_flush(loop, job)
        self._pending.add(future)
        try:
            await future
        finally:
            self._pending.discard(future)

    def _background(self, job: Callable[[], None], after: Callable[[], None] | None) -> None:
        """Run blocking ``job`` in the default executor (inline with no running loop);
        then ``after`` on the loop thread. A failure marks the log failed."""
        if self.background is not None:
            self._defer(job, after)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            job()
            if after is not None:
                after()
            return
        future = loop.run_in_executor(None, job)
        self._pending.add(future)
        future.add_done_callback(lambda f: self._background_done(f, after))

    def _defer(self, job: Callable[[], None], after: Callable[[], None] | None) -> None:
        """Hand ``job`` and ``after`` to the ``background`` hook, wrapped so that neither
        raises and ``after`` runs only after a successful ``job``, as the executor path."""
        done = False

        def run() -> None:
            nonlocal done
            try:
                job()
            except Exception as exc:
                logger.error("%s: background job failed; log is now read-only: %r", self.name, exc)
                self._fail(exc)
                return
            done = True

        def then() -> None:
            if done and after is not None and not self.closed:
                after()

        assert self.background is not None  # for the type checker
        self.background(run, then)

    def _defer_flush(
        self, loop: asyncio.AbstractEventLoop, job: Callable[[], None]
    ) -> asyncio.Future:
        """``flush_async``'s job through the ``background`` hook: the future resolves
        when the hook runs it (never, if it never does)."""
        future: asyncio.Future = loop.create_future()

        def run() -> None:
            if future.done():
                return
            try:
                job()
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(None)

        assert self.background is not None  # for the type checker
        self.background(run, lambda: None)
        return future

    def _background_done(self, future: asyncio.Future, after: Callable[[], None] | None) -> None:
        self._pending.discard(future)
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            logger.error("%s: background flush failed; log is now read-only: %r", self.name, exc)
            self._fail(exc)
        elif after is not None and not self.closed:
            after()

    def _fail(self, exc: BaseException) -> None:
        """Turn read-only: what the files hold may no longer match what the log says."""
        if self.failure is not None:
            return
        self.failure = exc
        if self.failure_listener is not None:
            self.failure_listener(self, exc)

    async def wait_background(self) -> None:
        """Wait for background work started so far: rolls, flushes, and the blocking
        steps of retention and compaction (``run_tracked``)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def run_tracked(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in the default executor, tracked with the background jobs: for
        maintenance's blocking steps (retention's renames, compaction), which hold the
        maintenance lock a delete takes. Cancelling the caller (a shutdown cancels the
        maintenance task) cannot stop the thread, and the lock is released at once:
        ``wait_background``, which every close goes through, still waits for it."""
        future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return await asyncio.shield(future)

    # -- reads ----------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> FileSlice:
        """Whole batches from the one holding ``offset``: up to ``max_bytes`` but at least
        one batch, none reaching ``max_offset`` (the high watermark). Within one segment.

        OffsetOutOfRangeError below the log start or above the log end; empty at the end.
        """
        self._check_offset(offset)
        end = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        if offset >= end:
            return FileSlice.empty(offset)
        i = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        for seg in self._segments[i:]:
            hit = seg.find(offset)
            if hit is None:
                continue  # the offset fell in a compacted gap at the segment's end
            position, h = hit
            if h.last_offset >= end:
                break
            stop = seg.read_end(position, h, max_bytes, end)
            return seg.slice(position, stop - position, h.base_offset)
        return FileSlice.empty(offset)

    def read_bytes(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """``read`` as plain bytes (one pread)."""
        return self.read(offset, max_bytes, max_offset).read()

    def _check_offset(self, offset: int) -> None:
        if offset < self._log_start or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"{self.name}: offset {offset} outside [{self._log_start}, {self.log_end_offset}]"
            )

    def offset_for_timestamp(self, timestamp: int) -> TimestampOffset | None:
        """The first record (lowest offset) whose timestamp is >= ``timestamp``, or None."""
        for seg in self._segments:
            if seg.max_timestamp < timestamp:
                continue
            hit = seg.find_timestamp(timestamp)
            if hit is None:
                continue
            position, h = hit
            data = fs.pread(seg.fd, h.batch_length + LOG_OVERHEAD, position)
            offsets, stamps, *_ = records.decode_columns(data, 0, h)
            for off, ts in zip(offsets, stamps, strict=True):
                if ts >= timestamp and off >= self._log_start:
                    return TimestampOffset(off, ts)
        return None

    # -- truncation -------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Cut the log so it ends at or before ``offset`` (whole batches: a batch holding
        ``offset`` goes too). For a follower whose tail diverged from the leader's.

        Epochs starting at or past the resulting log end are dropped even when no record
        is cut (Kafka's truncateTo): a broker elected leader that appended nothing holds
        an epoch with no records; kept, it would be this follower's last fetched epoch,
        and the leader, which never had it, would answer the same divergence forever."""
        with self._read_only_on_error():
            self._truncate_to(offset)

    def _truncate_to(self, offset: int) -> None:
        if offset >= self.log_end_offset:
            if self.epochs.ends_at_or_past(self.log_end_offset):
                self._after_cut()
            return
        if offset <= self._log_start:
            self._truncate_fully_and_start_at(offset)
            return
        # The recovery point on disk comes down first: a crash may keep any part of the
        # cut (the renames below, the ftruncate), and recovery must then scan from where
        # the cut starts rather than trust segments that are half gone.
        with self._state_lock:
            self._cuts += 1
            self._recovery_point = min(self._recovery_point, offset)
        self._fail_on_error(self._write_recovery_point)()
        keep = max(bisect.bisect_left(self._bases, offset), 1)
        self.retire(self._segments[keep:], files="rename")
        del self._segments[keep:], self._bases[keep:]
        last = self.active_segment
        cut = last.truncate_to(offset)
        if last.next_offset < self._log_start:
            # The cut took a batch holding the log start (a start moved inside a batch),
            # or it fell in a compacted gap over the start: no record at or after the
            # start is left, so the log empties there (recovery does the same if a crash
            # comes first: the start is checkpointed, the recovery point came down).
            self._truncate_fully_and_start_at(self._log_start)
            return
        last.created_ms = self.clock()
        self._after_cut()
        logger.info(
            "%s: truncated to %d (%d bytes cut from the last segment)",
            self.name,
            self.log_end_offset,
            cut,
        )

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start empty at ``offset`` (a follower far behind)."""
        with self._read_only_on_error():
            self._truncate_fully_and_start_at(offset)

    def _truncate_fully_and_start_at(self, offset: int) -> None:
        with self._state_lock:
            self._cuts += 1
        self.retire(self._segments, files="rename")
        # The renames durable before the new segment exists: on ext4/xfs the new file's
        # fsync may make its own entry durable, and a crash would pair it with the old
        # segments (whose records may pass its base).
        self._fail_on_error(lambda: fs.fsync_dir(self.directory))()
        new = LogSegment.create(
            self.directory, offset, self.config.index_interval_bytes, self.clock()
        )
        self._segments, self._bases = [new], [offset]
        self._adopt(new)
        self._log_start = offset
        self.epochs.clear()
        self._after_cut()
        # Durable like every log-start write: recovery trusts the value it reads, and an
        # unsynced file may come back from a crash torn into another number.
        checkpoints.write_offset(self.directory / checkpoints.LOG_START_OFFSET, offset, fsync=True)
        self._start_moved()

    def increment_log_start_offset(self, offset: int) -> None:
        """Move the log start up to ``offset`` (a follower taking its leader's log start,
        Kafka's maybeIncrementLogStartOffset): reads below it fail OffsetOutOfRange, epoch
        entries below it go, and the start is checkpointed durably before this returns,
        since the records below it may be ones the partition never committed. Segments
        wholly below it go at the next retention round (or the next open's clean-up)."""
        if offset <= self._log_start:
            return
        invariant(offset <= self.log_end_offset, f"{self.name}: log start {offset} past the end")
        with self._read_only_on_error():
            self._log_start = offset
            self.epochs.truncate_from_start(offset)
            path = self.directory / checkpoints.LOG_START_OFFSET
            checkpoints.write_offset(path, offset, fsync=True)
        self._start_moved()

    def _start_moved(self) -> None:
        if self.start_listener is not None:
            self.start_listener()

    @contextlib.contextmanager
    def _read_only_on_error(self) -> Iterator[None]:
        """A cut or a log-start move that fails part way (a rename, a checkpoint) leaves
        the log in memory and its files apart: a later flush could write epochs that fit
        only the new state next to a log start or recovery point that fits only the old,
        and recovery would trust both. Turn read-only and tell the listener (the broker
        halts, as Kafka takes the log dir offline on such an error), then re-raise."""
        try:
            yield
        except OSError as exc:
            self._fail(exc)
            raise

    def _after_cut(self) -> None:
        """Bookkeeping after records (or epochs with no records) were cut from the end.

        Both checkpoints are written, fsynced, before the next append (Kafka checkpoints
        them on truncation too). Recovery trusts them: it scans only from the recovery
        point and keeps the epoch entries below it. Left stale after a cut, they would
        describe the old tail: a recovery point past the cut skips the new records'
        epochs, and an old epoch entry survives, so this broker, once leader, would send
        a follower the wrong divergence point. Blocking the loop for two small fsyncs is
        fine: truncation happens once per leader change, not per request. The new
        generation makes background flush jobs captured before the cut skip their
        now-stale epoch snapshot; the lock orders every checkpoint write. The truncated
        segment is fsynced before either checkpoint (see below)."""
        self._fail_on_error(self._persist_cut)()
        self.clean_upto = min(self.clean_upto, self.active_segment.base_offset - 1)
        self._check_segments()

    def _persist_cut(self) -> None:
        # The cut itself first: recovery skips what lies below the recovery point, so a
        # crash that undid an unsynced ftruncate would leave the cut batches there.
        self.active_segment.fsync()
        with self._state_lock:
            self.generation += 1
            self._recovery_point = min(self._recovery_point, self.log_end_offset)
            self.epochs.truncate_from_end(self.log_end_offset)
            self._epochs_durable_end = -1  # what is on disk may describe the cut tail
            self._checkpoint_epochs_locked(self.epochs.snapshot(), self.log_end_offset)
            self._write_recovery_point_locked()

    # -- segment removal (retention, compaction, truncation) ------------------------------

    def remove_prefix(self, count: int) -> list[LogSegment]:
        """Take the first ``count`` closed segments out of the log (retention); the log
        start moves to the next segment. The caller retires the files (``retire``)."""
        invariant(0 < count < len(self._segments), f"cannot remove {count} segments")
        gone = self._segments[:count]
        del self._segments[:count], self._bases[:count]
        with self._state_lock:
            self.generation += 1
        self._log_start = max(self._log_start, self._bases[0])
        self.epochs.truncate_from_start(self._log_start)
        self._check_segments()
        self._start_moved()
        return gone

    def files_replaced(self) -> None:
        """Segment files are about to be replaced in place (a compaction swap): roll and
        flush jobs captured before must not write their index snapshots over them."""
        with self._state_lock:
            self._cuts += 1

    def replace_segment(self, old: LogSegment, new: LogSegment | None) -> None:
        """Swap a closed segment for its compacted copy (or drop it when ``new`` is None)."""
        i = self._segments.index(old)
        invariant(i < len(self._segments) - 1, "compaction never touches the active segment")
        if new is None:
            del self._segments[i], self._bases[i]
        else:
            self._segments[i] = new
            self._adopt(new)
        self._check_segments()

    def retire(self, segments: Sequence[LogSegment], *, files: str) -> None:
        """Keep retired descriptors open for file.delete.delay.ms, then close them.

        ``files``: "rename" renames them to ``*.deleted`` now (a reopen never sees them)
        and unlinks later; "renamed" means the caller already renamed them; "keep" means
        their paths now hold other files (a compaction swap): only close.
        """
        deadline = self.clock() + self.config.file_delete_delay_ms
        for seg in segments:
            if self.fd_cache is not None:  # its path may soon name another file: no reopen
                self.fd_cache.forget(seg)
            deleted = [p.with_name(p.name + ".deleted") for p in seg.paths()]
            if files == "rename":
                for path, target in zip(seg.paths(), deleted, strict=True):
                    with contextlib.suppress(FileNotFoundError):
                        fs.replace(path, target)
            self._retired.append(Retired(deadline, seg, [] if files == "keep" else deleted))

    def due_retired(self, now_ms: int | None = None) -> list[Retired]:
        """Retired segments whose delay passed (all of them with ``now_ms`` None)."""
        due = [r for r in self._retired if now_ms is None or r.deadline_ms <= now_ms]
        self._retired = [r for r in self._retired if r not in due]
        return due

    def _check_segments(self) -> None:
        invariant(len(self._segments) > 0, f"{self.name}: a log always has a segment")
        invariant(self._bases == sorted(set(self._bases)), f"{self.name}: segment order")
        invariant(self._log_start <= self.log_end_offset, f"{self.name}: start > end")

    # -- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, persist indexes, write the clean-shutdown marker, close. Blocks."""
        if self.closed:
            return
        from rillet.storage.recovery import close_log

        self._shut_jobs()
        # A failed fsync here leaves the log failed: a retried close writes no marker.
        self._fail_on_error(lambda: close_log(self))()

    async def close_async(self) -> None:
        await self.wait_background()
        await asyncio.get_running_loop().run_in_executor(None, self.close)


def _writable(data: bytes | bytearray | memoryview) -> bytearray | memoryview:
    """A buffer ``stamp`` can patch: the caller's own if writable, else one copy."""
    kind = type(data)
    if kind is bytes:
        return bytearray(data)
    if kind is bytearray or (kind is memoryview and not data.readonly):  # type: ignore[union-attr]
        return data  # type: ignore[return-value]
    return bytearray(data)
