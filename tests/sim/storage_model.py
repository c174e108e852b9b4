"""One production `Log` under a seeded random schedule over `SimFileSystem`, crashed at
arbitrary points and reopened, checked against a model of what was written.

The schedule appends as leader (its epoch sometimes rises) and as follower (batches the
client encoder built, with their own offsets, epochs and sometimes gaps), truncates,
flushes inline and through the flush policy's background jobs, moves the high
watermark, runs retention and compaction, runs deferred background jobs (a roll's fsync
and index write, a policy flush) in any order or never, injects I/O errors, and crashes:
between steps, or inside any storage call (``crash_after``: between a write and its
fsync, a truncation and its checkpoint, in the middle of a deferred job or of recovery).
An I/O error that escapes, or a log turned read-only, halts the node: a crash too,
except EBADF (never injected): a closed descriptor used is a failure. With ``fd_bound``
the log runs under an fd cache (storage/fdcache.py) of that bound, with fetches (a read
used in the same step) and cache sweeps in the schedule, so descriptors close and
reopen all the time. A failed fsync (outside compaction, retention and reopening) must
have turned the log read-only first. Each seed runs in both directory-entry modes of
`SimFileSystem`.

Checked after every step: the log's end and start are the model's. After every reopen:
- every batch reads back CRC-valid, in offset order, from the log start;
- every record present was written at that offset (by some append, maybe one since
  truncated: an undone truncation may bring records back);
- every record below the durable point is present and unchanged: the durable point is
  the log end at the last successful flush (inline, or a policy flush job that ran with
  no cut or retention since its capture), lowered by every truncation since;
  compaction may have removed superseded keys;
- the log start never passes the highest start the log was given, and the recovery
  point is the log end;
- the leader-epoch cache agrees with the batches: epochs and starts strictly increase,
  no entry at or past the log end, each epoch starts at its first batch (only <= once
  compaction or retention removed batches);
- the log accepts an append.
A failure raises `SimulationFailure` with the seed, its replay command and the trace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import errno
import itertools
import random
import sys
import traceback
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from rillet.client.wire import records
from rillet.client.wire.errors import CorruptRecordError, StorageError
from rillet.storage import Log, LogConfig, cleaner, fs, retention
from rillet.storage.fdcache import FdCache
from rillet.storage.segment import LogSegment

from .simfs import SimCrash, SimFileSystem

REPLAY_COMMAND = "RILLET_SIM_SEED={seed} .venv/bin/pytest tests/test_storage_sim.py -k replay -s"
NODE = "/sim/node"
LOG_DIR = f"{NODE}/t-0"
FAULT_OPS = ("write", "fsync", "pread", "replace", "ftruncate", "fsync_dir", "create", "read")


class SimulationFailure(AssertionError):
    """An invariant broke; the message carries the seed's replay command and a trace."""


Record = tuple[int, Any, Any]  # (leader epoch, key, value)


@dataclass
class Batch:
    base: int
    last: int
    epoch: int
    records: dict[int, tuple[Any, Any]]  # offset -> (key, value)


@dataclass
class Job:
    run: Callable[[], None]
    after: Callable[[], None]
    flush_end: int | None  # a flush job: what it makes durable (None once a cut intervened)


@dataclass
class Options:
    seed: int
    steps: int = 250
    fsync_persists_entry: bool = False  # strict by default (see simfs.py)
    echo_trace: bool = False
    # Moves of the log start past unflushed records (a follower taking its leader's
    # start). Off, the action mix is the one the seeds pinned before it existed replay.
    log_start_moves: bool = True
    # The fd cache's bound (storage/fdcache.py), tiny to close descriptors all the time,
    # with sweeps and fetch-like reads in the schedule; None: no cache, the action mix
    # the seeds pinned before it existed.
    fd_bound: int | None = None
    # A remote-enabled log (docs/tiered.md): the highest remote offset moves at random,
    # and retention must never delete a segment that ends above it (unless wholly below
    # the log start). Off: the config and action mix the seeds pinned before it existed.
    remote_tier: bool = False


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """run_in_executor without threads: deterministic, and a crash raised inside the job
    reaches the coroutine as it would from a thread (asyncio wants this class)."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


def run_inline(coro: Coroutine[Any, Any, Any]) -> Any:
    loop = asyncio.new_event_loop()
    loop.set_default_executor(InlineExecutor())
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


@dataclass
class StorageModel:
    options: Options
    rng: random.Random = field(init=False)
    sim: SimFileSystem = field(init=False)
    config: LogConfig = field(init=False)
    log: Log = field(init=False)
    batches: list[Batch] = field(default_factory=list)
    start: int = 0
    end: int = 0
    durable_end: int = 0
    max_start: int = 0
    epoch: int = 0
    written: dict[int, set[Record]] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list)
    removed_batches: bool = False  # compaction or retention ran: epoch starts may be lower
    now: int = 1_000_000
    trace: list[str] = field(default_factory=list)
    fd_cache: FdCache | None = None
    step_no: int = 0
    reopens: int = 0

    def __post_init__(self) -> None:
        seed = self.options.seed
        self.rng = random.Random(seed)
        self.sim = SimFileSystem(
            fsync_persists_entry=self.options.fsync_persists_entry,
            rng=random.Random(seed * 7919 + 1),
        )
        rng = self.rng
        compact = rng.random() < 0.4
        policy = "compact,delete" if compact and rng.random() < 0.5 else "compact"
        self.config = LogConfig(
            segment_bytes=rng.choice([400, 800, 1500, 4000]),
            index_interval_bytes=rng.choice([64, 200, 1000]),
            flush_messages=rng.choice([None, None, 3, 10]),
            cleanup_policy=policy if compact else "delete",
            retention_bytes=rng.choice([-1, -1, 2000, 5000]),
            file_delete_delay_ms=0,
        )
        self.keys = compact
        if self.options.remote_tier:
            remote_rng = random.Random(seed * 104_729 + 3)  # the pinned draws stay as they were
            self.config = dataclasses.replace(
                self.config,
                remote_storage_enable=True,
                local_retention_bytes=remote_rng.choice([-2, 0, 1000, 3000]),
                local_retention_ms=remote_rng.choice([-2, 0]),
            )

    # -- running -------------------------------------------------------------------------

    def run(self) -> None:
        self.sim.makedirs(NODE)
        self.sim.sync_all()  # the node's data dir exists, durably
        self.note(f"config {self.config}")
        self.log = self.open_log()
        self.check_recovered()
        steps = [
            (self.append_leader, 30),
            (self.append_follower, 10),
            (self.truncate, 5),
            (self.truncate_fully, 1),
            (self.flush, 4),
            (self.run_job, 12),
            (self.set_high_watermark, 5),
            (self.apply_retention, 3),
            (self.compact, 3),
            (self.purge, 2),
            (self.crash, 2),
            (self.inject_fault, 3),
            (self.arm_crash, 4),
            (self.close_and_reopen, 1),
        ]
        if self.options.log_start_moves:
            steps.append((self.increment_log_start, 2))
        if self.options.fd_bound is not None:
            steps += [(self.fetch, 8), (self.sweep, 4)]
        if self.options.remote_tier:
            steps.append((self.move_remote_end, 4))
        actions, weights = zip(*steps, strict=True)
        for step_no in range(self.options.steps):
            self.step_no = step_no
            action = self.rng.choices(actions, weights)[0]
            self.step(action)
        self.step(self.crash)

    def step(self, action: Callable[[], None]) -> None:
        injected = len(self.sim.injected)
        try:
            action()
        except SimCrash:
            self.note("  -> crashed inside the step")
            self.recover()
            return
        except OSError as exc:
            self.check_descriptor(exc)
            self.check_failed_fsync(action, injected)
            self.note(f"  -> {exc!r} escaped: the node halts")
            self.halt_and_recover()
            return
        except SimulationFailure:
            raise
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.fail(f"{exc!r} at {where.filename}:{where.lineno}")
        self.check_failed_fsync(action, injected)
        if self.log.failure is not None:
            self.check_descriptor(self.log.failure)
            self.note(f"  -> log failed ({self.log.failure!r}): the node halts")
            self.halt_and_recover()
            return
        self.expect(self.log.log_end_offset == self.end, f"log end {self.log.log_end_offset}")
        self.expect(self.log.log_start_offset == self.start, "log start")

    def check_descriptor(self, exc: BaseException) -> None:
        """EBADF is never injected, and after a crash the old log is dropped: a storage
        call on a closed descriptor is a bug (on a real system the number may already
        name another file, and a write through it would land there)."""
        if isinstance(exc, OSError) and exc.errno == errno.EBADF:
            where = traceback.extract_tb(exc.__traceback__)
            self.fail(f"a closed descriptor was used: {exc!r} at {where[-1] if where else '?'}")

    def check_failed_fsync(self, action: Callable[[], None], injected: int) -> None:
        """A failed fsync of the log's files (not compaction's scratch copies, not
        retention's checkpoint, not a reopen's recovery) turns the log read-only, as a
        failed write does: the kernel may have dropped the pages, and a later fsync
        would succeed without them."""
        if action in (self.compact, self.apply_retention, self.close_and_reopen):
            return
        if not any(op.startswith("fsync") for op in self.sim.injected[injected:]):
            return
        self.expect(self.log.failure is not None, "a failed fsync left the log writable")
        try:
            self.log.append(bytearray(records.encode_batch([b"after"])), self.epoch)
        except StorageError:
            return
        self.fail("a log whose fsync failed accepted an append")

    def segments(self) -> str:
        return " ".join(f"{s.base_offset}+{s.size}" for s in self.log.segments)

    def note(self, line: str) -> None:
        line = f"[{self.step_no}] {line}" if not line.startswith(" ") else line
        self.trace.append(line)
        if self.options.echo_trace:
            print(line)

    def fail(self, message: str) -> None:
        seed = self.options.seed
        mode = "ext4" if self.options.fsync_persists_entry else "strict"
        bound = self.options.fd_bound
        if bound is not None:
            mode += f", fd bound {bound}"
        replay = REPLAY_COMMAND.format(seed=seed)
        if bound is not None:
            replay = f"RILLET_SIM_FD_BOUND={bound} {replay}"
        tail = "\n".join(self.trace[-60:])
        raise SimulationFailure(
            f"storage sim seed {seed} ({mode} mode): {message}\n"
            f"model: start {self.start} end {self.end} durable end {self.durable_end}\n"
            f"replay: {replay}\n"
            f"trace (last 60 lines):\n{tail}"
        )

    def expect(self, ok: bool, message: str) -> None:
        if not ok:
            self.fail(f"{message} (model: start {self.start}, end {self.end})")

    # -- the log's background jobs ------------------------------------------------------------

    def background(self, run: Callable[[], None], after: Callable[[], None]) -> None:
        caller = sys._getframe(3).f_code.co_name  # roll or _maybe_flush_by_policy
        flush_end = self.log.log_end_offset if caller == "_maybe_flush_by_policy" else None
        self.jobs.append(Job(run, after, flush_end))
        self.note(f"  job queued ({caller})")

    def open_log(self) -> Log:
        log = Log.open(LOG_DIR, self.config, clock=lambda: self.now, background=self.background)
        if self.options.fd_bound is not None:
            # A process's cache: a new one after every crash or reopen, as after a restart.
            # One thread: opening past the bound closes others, as on the event loop.
            self.fd_cache = FdCache(self.options.fd_bound, on_loop_thread=lambda: True)
            log.release_descriptors()  # as LogManager opens a log
            log.use_fd_cache(self.fd_cache)
        return log

    # -- steps ---------------------------------------------------------------------------

    def _values(self) -> tuple[list[bytes], list[bytes | None]]:
        n = self.rng.randint(1, 5)
        values = [self.rng.randbytes(self.rng.randint(5, 60)) for _ in range(n)]
        keys = [b"k%d" % self.rng.randint(0, 6) if self.keys else None for _ in range(n)]
        return values, keys

    def _written(self, base: int, epoch: int, keys: list, values: list, deltas=None) -> None:
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            off = base + (deltas[i] if deltas else i)
            self.written.setdefault(off, set()).add((epoch, k, v))

    def _add(self, base: int, epoch: int, keys: list, values: list) -> None:
        recs = {base + i: (k, v) for i, (k, v) in enumerate(zip(keys, values, strict=True))}
        self.batches.append(Batch(base, base + len(values) - 1, epoch, recs))
        self.end = base + len(values)

    def append_leader(self) -> None:
        self.now += 1
        if self.rng.random() < 0.1:
            self.epoch += 1
        values, keys = self._values()
        batch = records.encode_batch(values, keys, timestamp_ms=self.now)
        self.note(f"append as leader epoch {self.epoch}: {len(values)} at {self.end}")
        self._written(self.end, self.epoch, keys, values)
        try:
            first, last = self.log.append(bytearray(batch), self.epoch)
        except OSError as exc:  # nothing appended, or the log failed
            self.note(f"  -> append failed {exc!r}")
            return
        self.expect(first == self.end and last == self.end + len(values) - 1, "append offsets")
        self._add(first, self.epoch, keys, values)

    def append_follower(self) -> None:
        self.now += 1
        epoch = max(self.epoch, self.log.latest_epoch, 0) + (self.rng.random() < 0.3)
        self.epoch = epoch
        payload = b""
        base = self.end
        added = []
        for _ in range(self.rng.randint(1, 2)):
            base += self.rng.randint(1, 3) if self.rng.random() < 0.15 else 0  # compacted gap
            values, keys = self._values()
            payload += records.encode_batch(
                values, keys, base_offset=base, partition_leader_epoch=epoch, timestamp_ms=self.now
            )
            self._written(base, epoch, keys, values)
            added.append((base, keys, values))
            base += len(values)
        self.note(f"append as follower epoch {epoch}: bases {[a[0] for a in added]}")
        try:
            self.log.append_as_follower(payload)
        except OSError as exc:
            self.note(f"  -> append failed {exc!r}")
            return
        for b, keys, values in added:
            self._add(b, epoch, keys, values)

    def _cut_model(self, new_end: int) -> None:
        self.batches = [b for b in self.batches if b.last < new_end]
        self.end = new_end
        self.durable_end = min(self.durable_end, new_end)
        self._forget_flush_promises()

    def _forget_flush_promises(self) -> None:
        """A flush job captured before a cut or a retention moves no recovery point (the
        log's generation changed): it promises nothing."""
        for job in self.jobs:
            job.flush_end = None

    def truncate(self) -> None:
        offset = self.rng.randint(self.start, self.end)
        if offset <= self.start:
            return self.truncate_fully(offset)
        holding = [b for b in self.batches if b.base <= offset <= b.last]
        if holding and holding[0].base < self.start:  # it holds the log start too
            self.note(f"truncate_to {offset} (its batch holds the log start: empty there)")
            self._cut_model(self.start)
            self.batches = []
            self.log.truncate_to(offset)
            return
        new_end = holding[0].base if holding else min(offset, self.end)
        self.note(f"truncate_to {offset} (end -> {new_end})")
        self._cut_model(new_end)  # before the call: a crash inside it may keep either
        self.log.truncate_to(offset)
        # An offset in a gap between segments may end the log at the earlier one's end.
        floor = self.batches[-1].last + 1 if self.batches else self.start
        end = self.log.log_end_offset
        self.expect(floor <= end <= new_end, f"truncate_to {offset} ended the log at {end}")
        self._cut_model(end)

    def truncate_fully(self, offset: int | None = None) -> None:
        if offset is None:
            offset = self.end + self.rng.randint(0, 5)
            if self.rng.random() < 0.3:
                offset = self.rng.randint(self.start, self.end)
        self.note(f"truncate_fully_and_start_at {offset}")
        self._cut_model(min(offset, self.end))
        self.batches, self.start, self.end = [], offset, offset
        self.max_start = max(self.max_start, offset)
        self.log.truncate_fully_and_start_at(offset)

    def increment_log_start(self) -> None:
        """A follower taking its leader's log start: checkpointed durably at once, maybe
        past records the log has not flushed (a crash can then end the log below it)."""
        offset = self.rng.randint(self.start, self.end)
        self.note(f"increment_log_start_offset {offset}")
        self.max_start = max(self.max_start, offset)  # a crash inside may keep it
        # The leader's start is at most its HW, and the follower's HW follows the leader's.
        self.log.high_watermark = max(self.log.high_watermark or 0, offset)
        self.log.increment_log_start_offset(offset)
        # As after retention: the first epoch may now have no record at or past the start.
        self.removed_batches = True
        self._resync("log start moved")

    def flush(self) -> None:
        self.note(f"flush (end {self.end})")
        end = self.end
        self.log.flush()
        self.durable_end = max(self.durable_end, end)

    def run_job(self) -> None:
        if not self.jobs:
            return
        job = self.jobs.pop(self.rng.randrange(len(self.jobs)))
        self.note(f"run a background job (flush to {job.flush_end}; segments {self.segments()})")
        job.run()
        job.after()
        if job.flush_end is not None and self.log.failure is None:
            self.durable_end = max(self.durable_end, job.flush_end)

    def set_high_watermark(self) -> None:
        hw = self.rng.randint(self.start, self.end)
        self.note(f"high watermark {hw}")
        self.log.high_watermark = hw

    def move_remote_end(self) -> None:
        """The metadata image's highest remote offset: anywhere up to the log end, down
        too (the remote log's newest segments deleted by its own retention)."""
        end = self.rng.randint(-1, max(self.end - 1, -1))
        self.note(f"remote copied end {end}")
        self.log.remote_copied_end = end

    def apply_retention(self) -> None:
        hw = self.log.removable_end
        self.note(f"retention (removable end {hw})")
        segments = self.log.segments
        remote_end, log_start = self.log.remote_copied_end, self.log.log_start_offset
        count, _ = retention.segments_to_delete(segments, self.config, self.now, hw)
        if count:  # a crash inside may keep the new start: it is a start the log was given
            self.max_start = max(self.max_start, segments[count].base_offset)
            self._forget_flush_promises()
        removed = run_inline(retention.apply_retention(self.log))
        if self.config.tiered:  # a compacted log is never tiered (LogConfig.tiered)
            self.check_only_remote_deleted(segments[: removed + 1], remote_end, log_start)
        if removed:
            self.expect(self.log.log_start_offset <= hw, "retention passed the high watermark")
            self.removed_batches = True
            self._resync("retention")

    def check_only_remote_deleted(
        self, segments: Sequence[LogSegment], remote_end: int, log_start: int
    ) -> None:
        """Every segment retention deleted (all of ``segments`` but the last) ended at or
        below the remote end, or wholly below the log start (nothing can read it)."""
        for seg, after in itertools.pairwise(segments):
            last = after.base_offset - 1
            self.expect(
                last <= remote_end or after.base_offset <= log_start,
                f"retention deleted segment {seg.base_offset}..{last} of a remote-enabled "
                f"log above the remote end {remote_end}",
            )

    def compact(self) -> None:
        if not self.config.compact:
            return
        self.note("compact")
        stats = run_inline(cleaner.compact(self.log))
        if stats.rewritten:
            self.removed_batches = True
            self._resync("compaction")

    def fetch(self) -> None:
        """A fetch: read a range and use it in the same step (the RPC server preads or
        dup()s it when the handler returns), as a follower or a consumer would."""
        offset = self.rng.randint(self.start, self.end)
        self.note(f"fetch from {offset}")
        data = self.log.read(offset, self.rng.choice([100, 1000, 1 << 20])).read()
        try:
            batches = list(records.iter_batches(data))
        except CorruptRecordError as exc:
            self.fail(f"fetch at {offset}: {exc}")
        for position, h in batches:
            offsets, _, keys, values, _ = records.decode_columns(data, position, h)
            for o, k, v in zip(offsets, keys, values, strict=True):
                if (h.partition_leader_epoch, k, v) not in self.written.get(o, ()):
                    self.fail(f"fetch at {offset}: record at {o} was never written there")
        if batches and batches[-1][1].last_offset < offset:
            self.fail(f"fetch at {offset} returned batches ending before it")

    def sweep(self) -> None:
        """The log manager's periodic pass over the fd cache."""
        assert self.fd_cache is not None  # the step is scheduled only with a bound
        closed = self.fd_cache.sweep()
        self.note(f"fd cache sweep: {closed} closed, {len(self.fd_cache)} open")

    def purge(self) -> None:
        self.note("purge retired segments")
        run_inline(retention.purge_retired(self.log, self.now + 10**9))

    def crash(self) -> None:
        self.note(f"crash (segments {self.segments()})")
        self.sim.crash(NODE, self.rng)
        self.recover()

    def inject_fault(self) -> None:
        op = self.rng.choice(FAULT_OPS)
        err = self.rng.choice([errno.EIO, errno.ENOSPC])
        self.note(f"next {op} fails with {errno.errorcode[err]}")
        self.sim.fail_next(op, NODE, err)

    def arm_crash(self) -> None:
        n = self.rng.randint(1, 12)
        self.note(f"crash before the {n}th next mutating file operation")
        self.sim.crash_after(n, NODE, self.rng)

    def close_and_reopen(self) -> None:
        self.note("close and reopen")
        self.log.close()
        self.durable_end = self.end  # a clean close persists everything
        self.jobs.clear()
        self.log = self.open_log()
        self.check_recovered()

    # -- what the log holds now ----------------------------------------------------------------

    def read_log(self) -> list[Batch]:
        """Every batch from the log start, through the log's own read path."""
        log = self.log
        out: list[Batch] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            try:
                data = log.read_bytes(offset, 1 << 20)
            except CorruptRecordError as exc:
                self.fail(f"read at {offset}: {exc}")
            if not data:  # the rest is a gap (compacted, or a truncation into a gap)
                break
            try:
                batches = list(records.iter_batches(data))  # validates CRCs
            except CorruptRecordError as exc:
                self.fail(f"read at {offset}: {exc}")
            for position, h in batches:
                offsets, _, keys, values, _ = records.decode_columns(data, position, h)
                recs = dict(zip(offsets, zip(keys, values, strict=True), strict=True))
                if out and h.base_offset <= out[-1].last:
                    self.fail(f"batch at {h.base_offset} after one ending at {out[-1].last}")
                out.append(Batch(h.base_offset, h.last_offset, h.partition_leader_epoch, recs))
                offset = h.next_offset
        return out

    def _resync(self, why: str) -> None:
        """After retention or compaction: what remains must be a subset of the model."""
        old = {o: (b.epoch, *kv) for b in self.batches for o, kv in b.records.items()}
        self.batches = self.read_log()
        self.start = self.log.log_start_offset
        self.max_start = max(self.max_start, self.start)
        for b in self.batches:
            for o, (k, v) in b.records.items():
                if o >= self.start and old.get(o) != (b.epoch, k, v):
                    self.fail(f"{why} changed the record at {o}")
        self.note(f"  -> {why}: start {self.start}, {len(self.batches)} batches")

    # -- crashes and recovery ------------------------------------------------------------

    def halt_and_recover(self) -> None:
        if not self.sim.down(NODE):
            self.sim.crash(NODE, self.rng)
        self.recover()

    def recover(self) -> None:
        self.reopens += 1
        self.sim.restart(NODE)
        self.sim.cancel_crash()
        self.sim.clear_faults()
        self.jobs.clear()
        if self.rng.random() < 0.2:  # crash inside recovery too
            self.sim.crash_after(self.rng.randint(1, 10), NODE, self.rng)
            try:
                self.reopen()
                self.note("  reopened before the armed crash")
                self.sim.crash(NODE, self.rng)
            except SimCrash:
                self.note("  crashed inside recovery")
            self.sim.restart(NODE)
            self.sim.cancel_crash()
        self.log = self.reopen()
        self.check_recovered()

    def reopen(self) -> Log:
        """Log.open after a crash: any error but the simulated crash is a failure of
        this seed, reported with its replay line (an escaped exception would not be)."""
        try:
            return self.open_log()
        except SimCrash:
            raise
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.fail(f"reopening raised {exc!r} at {where.filename}:{where.lineno}")

    def check_recovered(self) -> None:
        log = self.log
        present = self.read_log()
        start, end = log.log_start_offset, log.log_end_offset
        self.note(f"  reopened: start {start} end {end} epochs {log.epochs.entries()}")
        self.expect(log.recovery_point == end, f"recovery point {log.recovery_point} != end")
        self.expect(start <= max(self.max_start, self.start), f"log start {start} passed")
        durable = [o for b in self.batches for o in b.records if o < self.durable_end]
        self.expect(end > max(durable, default=-1), f"log end {end} below a durable record")
        got: dict[int, Record] = {}
        for b in present:
            for o, (k, v) in b.records.items():
                if (b.epoch, k, v) not in self.written.get(o, ()):
                    self.fail(f"record at {o} (epoch {b.epoch}) was never written there")
                got[o] = (b.epoch, k, v)
        latest_key = {}
        for b in self.batches:
            for o, (k, _) in b.records.items():
                latest_key[k] = o
        for b in self.batches:
            for o, (k, v) in b.records.items():
                if o >= self.durable_end or o < start:
                    continue
                superseded = self.config.compact and k is not None and latest_key[k] > o
                if got.get(o) != (b.epoch, k, v) and not (superseded and o not in got):
                    self.fail(f"durable record at {o} lost or changed: {got.get(o)}")
        self.check_epochs(present, start, end)
        # The recovered log is the new model; all of it is durable now.
        self.batches, self.start, self.end = present, start, end
        self.durable_end, self.max_start = end, start
        self.epoch = max(self.epoch, log.latest_epoch)
        self.step(self.append_leader)  # it accepts appends again

    def check_epochs(self, present: list[Batch], start: int, end: int) -> None:
        cached = self.log.epochs.entries()
        derived: list[tuple[int, int]] = []
        for b in present:
            if not derived or b.epoch > derived[-1][0]:
                derived.append((b.epoch, b.base))
        epochs = [e for e, _ in cached]
        starts = [s for _, s in cached]
        if epochs != sorted(set(epochs)) or starts != sorted(set(starts)):
            self.fail(f"epoch cache not increasing: {cached}")
        if cached and cached[-1][1] >= end:
            self.fail(f"epoch cache entry at or past the log end {end}: {cached}")
        by_epoch = dict(cached)
        if not self.removed_batches and [e for e, _ in derived] != epochs:
            self.fail(f"epoch cache {cached} != epochs of the batches {derived}")
        for i, (e, s) in enumerate(derived):
            if e not in by_epoch:
                self.fail(f"epoch {e} of the batch at {s} missing from the cache {cached}")
            # The first epoch may also hold records below the log start (a batch the
            # start was moved into, or one before a cut gap): its entry is clamped up to
            # the start, anywhere from the start to its first batch here.
            first = i == 0 and (s < start or by_epoch[e] == start)
            exact = not self.removed_batches and not first
            if (by_epoch[e] != s) if exact else (by_epoch[e] > max(s, start)):
                self.fail(f"epoch {e} starts at {s} on disk, {by_epoch[e]} in the cache {cached}")


def run_seed(seed: int, echo_trace: bool = False, **kwargs: Any) -> StorageModel:
    """Both directory-entry modes, strict then ext4-like, unless
    ``fsync_persists_entry`` picks one: production runs on ext4/xfs, where a file's
    fsync also persists its entry, and strict POSIX finds what relies on that."""
    if "fsync_persists_entry" in kwargs:
        modes = [kwargs.pop("fsync_persists_entry")]
    else:
        modes = [False, True]
    for persists in modes:
        model = StorageModel(
            Options(seed, echo_trace=echo_trace, fsync_persists_entry=persists, **kwargs)
        )
        with fs.install(model.sim):
            model.run()
    return model
