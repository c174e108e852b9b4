"""Seeded crash simulations of one production Log over a simulated file system
(tests/sim/storage_model.py): crashes anywhere, I/O errors, recovery checked against a
model of what was written and what the log promised durable.

A failure prints the one command line that replays its seed:
    RILLET_SIM_SEED=1234 .venv/bin/pytest tests/test_storage_sim.py -k replay -s
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import os
import random

import pytest
from sim.log_creation_model import run_creation_seed
from sim.seeds import replay, run_block, run_many, seeds_from_env
from sim.simfs import SimCrash, SimFileSystem
from sim.storage_model import NODE, SimulationFailure, run_inline, run_seed

from rillet.client.wire import records
from rillet.client.wire.errors import StorageError
from rillet.storage import Log, LogConfig, LogManager, checkpoints, cleaner, fs

QUICK_SEEDS = 40
FD_CACHE_QUICK_SEEDS = 20


@pytest.mark.parametrize("block", range(2))
def test_crashes_anywhere_keep_what_the_log_promised(block: int) -> None:
    run_block(run_seed, block, 2, QUICK_SEEDS)


@pytest.mark.slow
@pytest.mark.timeout(0)  # thousands of seeds: the suite-wide 300 s bound would cut them
def test_crashes_anywhere_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS seeds after the quick ones."""
    run_many(run_seed, QUICK_SEEDS, seeds_from_env(2_000), SimulationFailure)


def run_seed_tiny_fd_cache(seed: int, **kwargs: object) -> object:
    """Under an fd cache of bound 1 (even seeds) or 2 (odd seeds): see storage_model."""
    return run_seed(seed, fd_bound=1 + seed % 2, **kwargs)


@pytest.mark.parametrize("block", range(2))
def test_crashes_anywhere_under_a_tiny_fd_cache(block: int) -> None:
    """Descriptors closed and reopened all the time (dirty ones too, the active one
    too) change nothing a crash keeps, and no closed descriptor is ever used."""
    run_block(run_seed_tiny_fd_cache, block, 2, FD_CACHE_QUICK_SEEDS)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_crashes_anywhere_under_a_tiny_fd_cache_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS / 2 seeds after the quick ones."""
    count = seeds_from_env(2_000) // 2
    run_many(run_seed_tiny_fd_cache, FD_CACHE_QUICK_SEEDS, count, SimulationFailure)


REMOTE_QUICK_SEEDS = 20


def run_seed_remote_tier(seed: int, **kwargs: object) -> object:
    """A remote-enabled log whose highest remote offset moves at random (storage_model)."""
    return run_seed(seed, remote_tier=True, **kwargs)


@pytest.mark.parametrize("block", range(2))
def test_a_remote_enabled_log_never_deletes_above_the_remote_end(block: int) -> None:
    """Crashes and faults anywhere, and retention never deletes a segment of a
    remote-enabled log that ends above the highest remote offset."""
    run_block(run_seed_remote_tier, block, 2, REMOTE_QUICK_SEEDS)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_a_remote_enabled_log_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS / 2 seeds after the quick ones."""
    count = seeds_from_env(2_000) // 2
    run_many(run_seed_remote_tier, REMOTE_QUICK_SEEDS, count, SimulationFailure)


def test_replay() -> None:
    """Replays RILLET_SIM_SEED with the whole trace echoed (-s to see it); with
    RILLET_SIM_FD_BOUND, under an fd cache of that bound."""
    bound = os.environ.get("RILLET_SIM_FD_BOUND")
    replay(run_seed if bound is None else functools.partial(run_seed, fd_bound=int(bound)))


CREATION_QUICK_SEEDS = 10


@pytest.mark.parametrize("block", range(2))
def test_creating_logs_with_crashes_anywhere_keeps_what_creation_returned(block: int) -> None:
    """Logs created one by one and in batches (tests/sim/log_creation_model.py)."""
    run_block(run_creation_seed, block, 2, CREATION_QUICK_SEEDS)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_creating_logs_with_crashes_anywhere_many_seeds() -> None:
    """make sim-long: RILLET_SIM_SEEDS / 2 seeds after the quick ones."""
    count = seeds_from_env(2_000) // 2
    run_many(run_creation_seed, CREATION_QUICK_SEEDS, count, SimulationFailure)


def test_replay_creation() -> None:
    """Replays RILLET_SIM_SEED of the log creation simulation with its trace."""
    replay(run_creation_seed)


def _counting(sim: SimFileSystem, calls: dict[str, int]) -> None:
    for name in ("fsync", "fsync_dir"):
        original = getattr(sim, name)

        def counted(*args, _original=original, _name=name):
            calls[_name] += 1
            return _original(*args)

        setattr(sim, name, counted)


def test_a_batch_of_new_logs_costs_two_fsyncs_a_log_and_survives_a_crash() -> None:
    """A new, empty log writes no checkpoint (missing ones read as the 0 it would
    write): its partition.metadata (file and directory fsync) is all it persists, and
    the data dir is fsynced once for the whole batch. Once the batch returns, a crash
    keeps every log with its topic id (strict POSIX directory entries)."""
    sim = SimFileSystem()
    sim.makedirs(NODE)
    sim.sync_all()
    calls = {"fsync": 0, "fsync_dir": 0}
    _counting(sim, calls)
    with fs.install(sim):
        manager = LogManager(NODE, create_threads=1)
        manager.startup()
        calls.update(fsync=0, fsync_dir=0)
        specs = [("t", p, None, f"id-{p}") for p in range(5)]
        logs = manager.open_unregistered_many(specs)
        assert calls == {"fsync": 5, "fsync_dir": 6}
        assert not {checkpoints.RECOVERY_POINT, checkpoints.LOG_START_OFFSET} & set(
            sim.listdir(f"{NODE}/t-0")
        )
        for p, log in enumerate(logs):
            manager.register("t", p, log)
        sim.crash(NODE, random.Random(0))
        sim.restart(NODE)
        again = LogManager(NODE, create_threads=1)
        again.startup()
        assert {tp: log.topic_id for tp, log in again.logs.items()} == {
            ("t", p): f"id-{p}" for p in range(5)
        }


def test_a_directory_left_by_a_failed_batch_is_made_durable_by_the_retry() -> None:
    """A batch that fails part way leaves directories (and partition.metadata) that
    were never fsynced; the retry finds them, with the right id already, and must
    still make them durable before it returns."""
    sim = SimFileSystem()
    sim.makedirs(NODE)
    sim.sync_all()
    with fs.install(sim):
        manager = LogManager(NODE, create_threads=1)
        manager.startup()
        specs = [("t", 0, None, "id-0"), ("t", 1, None, "id-1")]
        sim.fail_next("fsync_dir", f"{NODE}/t-0")  # t-0's partition.metadata entry
        with pytest.raises(OSError):
            manager.open_unregistered_many(specs)
        manager.open_unregistered_many(specs)
        sim.crash(NODE, random.Random(0))
        sim.restart(NODE)
        again = LogManager(NODE, create_threads=1)
        again.startup()
        assert {tp: log.topic_id for tp, log in again.logs.items()} == {
            ("t", 0): "id-0",
            ("t", 1): "id-1",
        }


def test_a_new_logs_directory_entry_is_durable_before_it_promises_anything() -> None:
    """A partition directory created by Log.open is an entry in the data dir, durable
    only once the data dir is fsynced; a flush that promised records must not lose
    them with the directory (POSIX: fsync of a file does not persist the entries above)."""
    sim = SimFileSystem()
    sim.makedirs(NODE)
    sim.sync_all()
    with fs.install(sim):
        log = Log.open(f"{NODE}/t-0", LogConfig())
        log.append(bytearray(records.encode_batch([b"v"])), 0)
        log.flush()
        sim.crash(NODE, random.Random(0))
        assert Log.open(f"{NODE}/t-0", LogConfig()).log_end_offset == 1


def test_a_checkpoint_torn_into_invalid_utf8_reads_as_missing(tmp_path) -> None:
    """An unsynced checkpoint may come back from a crash with garbage in it (found by
    the simulator: Log.open raised UnicodeDecodeError). Every checkpoint is derivable:
    it must read as missing, and the log rebuilds it."""
    for name in ("recovery-point", "log-start-offset", "leader-epoch-checkpoint"):
        (tmp_path / name).write_bytes(b"0\n1\n\x93\xfd")
        assert checkpoints.read_entries(tmp_path / name, 1) is None
    log = Log.open(tmp_path, LogConfig())
    assert log.log_end_offset == 0
    log.close()


def test_a_checkpoint_torn_into_a_plausible_number_reads_as_missing(tmp_path) -> None:
    """A torn unsynced write may end in garbage that still parses: "36\n" with its last
    byte turned into "1" read as log start 361, past the log's end, and Log.open raised
    InvariantError (found by storage sim seeds 3608 and 4074). Every line of a
    checkpoint ends in a newline and nothing follows the entries, as Kafka's reader
    demands: anything else reads as missing."""
    for torn in (b"0\n1\n361", b"0\n1\n36\n1", b"0\n1\n36\n\n"):
        (tmp_path / "log-start-offset").write_bytes(torn)
        assert checkpoints.read_entries(tmp_path / "log-start-offset", 1) is None, torn
    (tmp_path / "log-start-offset").write_bytes(b"0\n1\n36\n")
    assert checkpoints.read_offset(tmp_path / "log-start-offset") == 36


def test_truncate_fully_checkpoints_the_log_start_durably() -> None:
    """The only checkpoint written without an fsync was the log start after a full
    truncation; unsynced, a crash may tear it into any value (seeds 3608, 4074)."""
    sim = SimFileSystem()
    jobs: list = []
    with fs.install(sim):
        log = _log_with_deferred_jobs(sim, jobs)
        log.append(bytearray(records.encode_batch([b"x"])), 0)
        log.truncate_fully_and_start_at(36)
        assert sim.is_durable(log.directory / checkpoints.LOG_START_OFFSET)


def test_a_log_start_past_the_recovered_end_opens_an_empty_log_there(tmp_path) -> None:
    """A follower moves its log start up to its leader's (fsynced at once) over records
    it has not flushed; a power cut then recovers a log that ends below its start.
    Recovery must not refuse to open it (it raised InvariantError, taking the partition
    offline for good): nothing at or after the start survived, so the log starts empty
    at the checkpointed start, as Kafka's loader does, and refetches from its leader."""
    log = Log.open(tmp_path, LogConfig())
    for _ in range(5):
        log.append(bytearray(records.encode_batch([b"a", b"b"])), 2)
    log.flush()
    log.close()
    (tmp_path / "clean-shutdown").unlink()
    checkpoints.write_offset(tmp_path / "log-start-offset", 40, fsync=True)
    log = Log.open(tmp_path, LogConfig())
    assert (log.log_start_offset, log.log_end_offset) == (40, 40)
    assert log.epochs.entries() == []
    assert [s.base_offset for s in log.segments] == [40]
    log.append(bytearray(records.encode_batch([b"c"])), 3)
    log.close()
    log = Log.open(tmp_path, LogConfig())
    assert (log.log_start_offset, log.log_end_offset) == (40, 41)
    log.close()


def _log_with_deferred_jobs(sim: SimFileSystem, jobs: list) -> Log:
    sim.makedirs(NODE)
    sim.sync_all()
    config = LogConfig(segment_bytes=300, index_interval_bytes=64)
    return Log.open(f"{NODE}/t-0", config, background=lambda job, after: jobs.append(job))


def _durable_below_recovery_point(sim: SimFileSystem, log: Log) -> list[int]:
    """Segments below the recovery point whose bytes a crash could still change."""
    return [
        s.base_offset
        for s in log.segments
        if s.base_offset < log.recovery_point and not sim.is_durable(s.log_path)
    ]


def test_roll_jobs_finishing_out_of_order_never_pass_an_unsynced_segment() -> None:
    """The executor runs roll jobs on several threads: a later roll's job can finish
    first. Its recovery point must not cover an earlier segment whose fsync has not run
    (found by the simulator: a flush then checkpointed past it, and recovery, trusting
    the checkpoint, kept that segment's torn tail)."""
    sim = SimFileSystem()
    jobs: list = []
    with fs.install(sim):
        log = _log_with_deferred_jobs(sim, jobs)
        while len(log.segments) < 3:
            log.append(bytearray(records.encode_batch([b"x" * 100])), 0)
        assert len(jobs) == 2
        jobs[1]()  # the second roll's job first; the first one's never runs
        log.flush()
        assert _durable_below_recovery_point(sim, log) == []


def test_a_truncation_is_durable_before_its_checkpoints() -> None:
    """A cut lowers the recovery point on disk; recovery then skips the segments below
    it. An unsynced ftruncate undone by a crash would leave the cut batches there, below
    the recovery point, in front of the new ones (found by the simulator: offsets went
    backwards across a segment boundary)."""
    sim = SimFileSystem()
    jobs: list = []
    with fs.install(sim):
        log = _log_with_deferred_jobs(sim, jobs)
        for _ in range(2):
            log.append(bytearray(records.encode_batch([b"x" * 50])), 0)
        log.flush()
        log.truncate_to(1)
        assert _durable_below_recovery_point(sim, log) == []
        assert sim.is_durable(log.active_segment.log_path)


def test_recovery_ends_the_log_where_a_segment_lost_its_unsynced_tail() -> None:
    """A roll creates the next segment's file at once; its directory entry may become
    durable (any checkpoint fsyncs the directory) before the rolled segment's data is.
    A crash then leaves a clean but short segment followed by a later one: recovery
    must end the log where the records end, not leave a hole of offsets that never
    come back (found by the simulator: the log ended past offsets it could not read)."""
    for seed in range(20):
        sim = SimFileSystem()
        jobs: list = []
        with fs.install(sim):
            log = _log_with_deferred_jobs(sim, jobs)
            while len(log.segments) < 2:
                log.append(bytearray(records.encode_batch([b"x" * 60])), 0)
            log.append(bytearray(records.encode_batch([b"y" * 60])), 0)
            sim.fsync_dir(log.directory)  # as a checkpoint write would
            sim.crash(NODE, random.Random(seed))
            log = Log.open(f"{NODE}/t-0", log.config)
            offset = log.log_start_offset
            while data := log.read_bytes(offset, 1 << 20):
                offset = [h for _, h in records.iter_batches(data)][-1].next_offset
            assert offset == log.log_end_offset, f"seed {seed}: records end at {offset}"


def _read_all(log: Log) -> list[tuple[int, int]]:
    """(base, next offset) of every batch from the log start, by the log's read path."""
    out: list[tuple[int, int]] = []
    offset = log.log_start_offset
    while data := log.read_bytes(offset, 1 << 20):
        out += [(h.base_offset, h.next_offset) for _, h in records.iter_batches(data)]
        offset = out[-1][1]
    return out


def test_a_crash_anywhere_inside_a_truncation_leaves_a_whole_log() -> None:
    """truncate_to renames the later segments away and cuts the one holding the offset;
    a crash may keep any part of that (found by the simulator: the cut was durable, the
    renames were not, and recovery, starting at the old recovery point, kept the later
    segments behind a hole of offsets)."""
    for n in range(1, 16):
        sim = SimFileSystem()
        jobs: list = []
        with fs.install(sim):
            log = _log_with_deferred_jobs(sim, jobs)
            while len(log.segments) < 4:
                log.append(bytearray(records.encode_batch([b"x" * 60] * 2)), 0)
            log.flush()
            sim.crash_after(n, NODE, random.Random(n))
            with contextlib.suppress(SimCrash):
                log.truncate_to(3)
            sim.restart(NODE)
            sim.cancel_crash()
            log = Log.open(f"{NODE}/t-0", log.config)
            batches = _read_all(log)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(batches)), (n, batches)
            assert batches[-1][1] == log.log_end_offset, (n, batches, log.log_end_offset)


def test_a_truncated_segment_never_leaves_a_stale_index_below_the_recovery_point() -> None:
    """A closed segment's index file describes its old tail; truncation makes it active
    and writes new batches where the old ones were. If it rolls again and a flush moves
    the recovery point past it before the roll's job rewrites the index, recovery trusts
    the index file it finds (found by the simulator: reads landed inside batches)."""
    for seed in range(10):
        sim = SimFileSystem()
        jobs: list = []
        with fs.install(sim):
            log = _log_with_deferred_jobs(sim, jobs)
            while len(log.segments) < 2:
                log.append(bytearray(records.encode_batch([b"x" * 30])), 0)
            for job in jobs:
                job()  # the first segment's index reaches the disk
            log.flush()
            log.truncate_to(1)
            while len(log.segments) < 2:
                log.append(bytearray(records.encode_batch([b"y" * 45])), 1)
            log.flush()  # the new roll's job (index rewrite) never runs
            sim.crash(NODE, random.Random(seed))
            log = Log.open(f"{NODE}/t-0", log.config)
            batches = _read_all(log)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(batches)), (seed, batches)
            assert batches[-1][1] == log.log_end_offset


def test_a_deferred_roll_job_never_writes_its_index_over_a_new_namesake() -> None:
    """A roll's job may run after a truncation removed its segment, and
    truncate_fully_and_start_at may have created a new segment of the same name: the
    old index snapshot must not land on the new segment's index file (found by the
    simulator: appends then failed on index keys going backwards)."""
    sim = SimFileSystem()
    jobs: list = []
    with fs.install(sim):
        log = _log_with_deferred_jobs(sim, jobs)
        while len(log.segments) < 2:
            log.append(bytearray(records.encode_batch([b"x" * 30])), 0)
        index_path = log.segments[0].index.path
        log.truncate_fully_and_start_at(0)
        for job in jobs:
            job()
        assert not sim.exists(index_path)


def test_a_flush_makes_the_active_segments_index_durable() -> None:
    """A flush moves the recovery point past the active segment, so recovery will trust
    its index file once the segment has rolled: written unsynced, a crash could leave
    it torn into whole garbage entries (found by the simulator: a read then started past
    the end of the file)."""
    sim = SimFileSystem()
    jobs: list = []
    with fs.install(sim):
        log = _log_with_deferred_jobs(sim, jobs)
        for _ in range(2):
            log.append(bytearray(records.encode_batch([b"x" * 40])), 0)
        log.flush()
        seg = log.active_segment
        assert len(seg.index) > 0
        assert sim.is_durable(seg.index.path) and sim.is_durable(seg.time_index.path)


def test_recovery_rewrites_the_indexes_of_what_it_scanned() -> None:
    """A roll's job writes the index before it fsyncs the data, so a crash between can
    leave a durable index over lost bytes. Recovery rebuilds the index in memory; the
    stale file must go too, or the next recovery, once a flush has moved the recovery
    point past the segment, trusts it (reads then land inside batches). These seeds of
    the simulator found it."""
    for seed in (333, 963, 1346, 1529):
        run_seed(seed, log_start_moves=False)


def test_a_job_captured_before_a_compaction_swap_never_writes_over_its_index() -> None:
    """A flush job captured while a segment was active holds that segment's index
    snapshot; run after compaction swapped the segment's files, it wrote the old index
    over the cleaned segment's (found by the simulator, seed 336)."""
    run_seed(336, log_start_moves=False)


def test_ext4_mode_a_compaction_swap_is_durable_as_a_whole() -> None:
    """With fsync persisting a file's own entry (ext4, xfs), a later fsync of the
    swapped-in X.log could make its rename durable without the index renames: a crash
    paired the cleaned log with the old index (seeds 73 and 458 of the ext4 mode; reads
    and a truncation then missed batches). The swap ends with a directory fsync."""
    for seed in (73, 458):
        run_seed(seed, fsync_persists_entry=True, log_start_moves=False)


def test_ext4_mode_truncate_fully_makes_its_renames_durable_first() -> None:
    """truncate_fully_and_start_at renames every segment away and creates a new one;
    the new file's fsync could persist its entry while the renames were undone by a
    crash, bringing back old segments whose records pass the new base (seeds 242, 335
    and 469 of the ext4 mode: overlapping batches, lost durable records, stale epochs)."""
    for seed in (242, 335, 469):
        run_seed(seed, fsync_persists_entry=True, log_start_moves=False)


def _flushed_log(sim: SimFileSystem, jobs: list) -> tuple[Log, list]:
    log = _log_with_deferred_jobs(sim, jobs)
    failures: list = []
    log.failure_listener = lambda failed, exc: failures.append((failed, exc))
    log.append(bytearray(records.encode_batch([b"a"])), 0)
    log.flush()
    log.append(bytearray(records.encode_batch([b"b"])), 0)
    return log, failures


@pytest.mark.parametrize("path", ["flush", "flush_async", "policy job", "roll job", "truncate"])
def test_a_failed_fsync_turns_the_log_read_only(path: str) -> None:
    """After a failed fsync the kernel may have dropped the dirty pages and marked them
    clean, so a later fsync succeeds without them (PostgreSQL's "fsyncgate"; Kafka halts
    the log dir on an IOException in flush). The log must fail as on a failed write:
    tell its listener, refuse appends, and never move the recovery point again."""
    sim = SimFileSystem()
    jobs: list = []
    with fs.install(sim):
        log, failures = _flushed_log(sim, jobs)
        point = log.recovery_point
        sim.fail_next("fsync", NODE)
        if path == "flush":
            with pytest.raises(OSError):
                log.flush()
        elif path == "flush_async":

            async def flush_async() -> None:
                task = asyncio.ensure_future(log.flush_async())
                await asyncio.sleep(0)  # the flush is queued to the hook
                for job in jobs:
                    job()
                await task

            with pytest.raises(OSError):
                run_inline(flush_async())
        elif path == "policy job":
            log.config = dataclasses.replace(log.config, flush_messages=1)
            log.append(bytearray(records.encode_batch([b"c"])), 0)
            for job in jobs:
                job()
        elif path == "roll job":
            while len(log.segments) < 2:
                log.append(bytearray(records.encode_batch([b"x" * 100])), 0)
            for job in jobs:
                job()
        else:
            with pytest.raises(OSError):
                log.truncate_to(1)
        assert log.failure is not None and [f for f, _ in failures] == [log]
        with pytest.raises(StorageError):
            log.append(bytearray(records.encode_batch([b"d"])), 0)
        log.flush()  # a later fsync succeeds, but promises nothing
        assert log.recovery_point == point


def test_a_compacted_gap_never_makes_recovery_drop_later_segments() -> None:
    """Recovery ends the log where an unflushed segment's records stop short of the next
    segment's base (a lost tail). Compaction leaves that shape legitimately: a segment
    whose last batch was superseded. Compacted while the recovery point on disk lay
    before it (a roll moves the recovery point in memory only), a crash then made
    recovery drop every later segment, though their roll jobs had fsynced them. The
    cleaner first writes the recovery point, then cleans only below it."""
    sim = SimFileSystem()
    jobs: list = []
    with fs.install(sim):
        sim.makedirs(NODE)
        sim.sync_all()
        config = LogConfig(segment_bytes=200, cleanup_policy="compact", file_delete_delay_ms=0)
        log = Log.open(f"{NODE}/t-0", config, background=lambda job, after: jobs.append(after))
        log.flush()
        for i in range(12):  # one batch per segment; key k1 superseded in the next one
            log.append(bytearray(records.encode_batch([b"v" * 90], [b"k%d" % (i % 2)])), 0)
        jobs.clear()
        for seg in log.segments[:-1]:
            seg.fsync()  # as the roll jobs do; their index writes ran too
            seg.write_indexes(seg.index_snapshot(), fsync=True)
            seg.freeze()
        sim.fsync_dir(log.directory)
        end = log.segments[-1].base_offset  # every record below it is on disk
        assert run_inline(cleaner.compact(log)).rewritten > 0
        sim.crash(NODE, random.Random(0))
        assert Log.open(f"{NODE}/t-0", config).log_end_offset >= end
