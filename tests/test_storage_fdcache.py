"""The bound on open segment descriptors (storage/fdcache.py): idle clean descriptors
close and reopen on use; dirty, pinned and just-read ones stay open; reads, appends and
fsyncs stay right across a reopen."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from pathlib import Path

from sim.simfs import SimFileSystem
from sim.storage_model import NODE

from rillet.client.wire import records
from rillet.storage import Log, LogConfig, fs
from rillet.storage.fdcache import FdCache
from rillet.storage.manager import LogManager
from rillet.storage.recovery import purge

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def batch(i: int) -> bytes:
    return records.encode_batch([b"v%d" % i], [b"k%d" % i], timestamps=[1000 + i])


def open_segment_files(root: Path) -> set[str]:
    """The segment files this process holds open under ``root``."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)) and target.endswith(".log"):
            held.add(target)
    return held


def values(log, start: int = 0) -> list[bytes]:
    return [r.value for r in records.decode_all(log.read_bytes(start, 1 << 20))]


async def manager(tmp_path: Path, count: int, max_open: int) -> LogManager:
    mgr = LogManager(tmp_path, SMALL, max_open_segments=max_open)
    await mgr.start(schedule=False)
    for p in range(count):
        mgr.get_or_create("t", p)
    return mgr


async def test_descriptors_stay_within_the_bound_and_reopen_on_use(tmp_path):
    mgr = await manager(tmp_path, 20, 4)
    cache = mgr.fd_cache
    # New logs are empty and clean: creating 20 holds no more than the bound.
    assert len(cache) <= 4 and len(open_segment_files(tmp_path)) <= 4
    for p in range(20):  # appends reopen and close others, written or not
        mgr.get("t", p).append(batch(p), 0)
        assert len(open_segment_files(tmp_path)) <= 4
    assert cache.reopens >= 16 and cache.evictions >= 16
    # The flush fsyncs every log, the closed dirty ones through a descriptor of its own
    # that it closes again: no more than the bound open afterwards either.
    await mgr.checkpoint_recovery_points()
    assert len(open_segment_files(tmp_path)) <= 4
    assert not any(mgr.get("t", p).active_segment.dirty for p in range(20))
    for p in range(20):
        log = mgr.get("t", p)
        assert log.recovery_point == log.log_end_offset == 1
        assert values(log) == [b"v%d" % p]
        assert log.append(batch(100 + p), 0) == (1, 1)
        assert values(log) == [b"v%d" % p, b"v%d" % (100 + p)]
    await asyncio.sleep(0)  # the step that handed the reads' descriptors out ends
    cache.sweep()
    assert len(cache) <= 4 and len(open_segment_files(tmp_path)) <= 4
    await mgr.close_async()
    assert open_segment_files(tmp_path) == set()

    # Start-up recovery opens every log's files; each closes once its log is open.
    again = await manager(tmp_path, 0, 4)
    assert len(open_segment_files(tmp_path)) <= 4
    for p in range(20):  # and the clean shutdown kept every record
        assert values(again.get("t", p)) == [b"v%d" % p, b"v%d" % (100 + p)]
    await again.close_async()


async def test_clean_descriptors_close_before_dirty_ones(tmp_path):
    mgr = await manager(tmp_path, 3, 2)
    cache = mgr.fd_cache
    a, b, c = (mgr.get("t", p) for p in range(3))
    a.append(batch(0), 0)  # dirty
    await b.flush_async()
    _ = b.active_segment.fd  # open, clean
    cache.sweep()
    cache.sweep()
    _ = c.active_segment.fd  # a third one open: one must close, and b is clean
    assert a.active_segment.is_open and not b.active_segment.is_open
    await mgr.close_async()


async def test_flush_fsyncs_what_was_written_through_a_closed_descriptor(tmp_path, monkeypatch):
    mgr = await manager(tmp_path, 3, 1)
    target = mgr.get("t", 0)
    seg = target.active_segment
    target.append(batch(0), 0)
    mgr.get("t", 1).append(batch(1), 0)  # closes target's descriptor, dirty
    assert not seg.is_open and seg.dirty
    synced: list[str] = []
    real_fsync = fs.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(fs, "fsync", recording_fsync)
    await target.flush_async()
    assert str(seg.log_path) in synced and not seg.dirty and not seg.is_open
    assert target.recovery_point == target.log_end_offset == 1
    await mgr.close_async()


async def test_a_fetch_holds_at_most_the_bound_of_descriptors_open_until_its_step_ends(
    tmp_path,
):
    """A multi-partition fetch reads every partition, then the RPC server uses every
    range, in one step. Up to the bound, a range hands out its segment's descriptor, kept
    open until the step ends whatever closes meanwhile; past it, ranges come as bytes
    read at once. Handing out all of them held one descriptor per partition read, so a
    follower's fetch of 10,000 partitions with data held 10,000 at once, whatever the
    bound (past an open-files limit of 4,096, the reopens fail with EMFILE)."""
    mgr = await manager(tmp_path, 10, 2)
    cache = mgr.fd_cache
    for p in range(10):
        mgr.get("t", p).append(batch(p), 0)
    await mgr.checkpoint_recovery_points()
    cache.sweep()
    # As a multi-partition fetch does in one step: read every log, then use the slices.
    slices = [mgr.get("t", p).read(0, 1 << 20) for p in range(10)]
    handed = [s for s in slices if s.data is None]
    assert len(handed) == 2
    assert len(open_segment_files(tmp_path)) <= 3  # the two handed out, the last read's
    inodes = [os.fstat(s.fd).st_ino for s in handed]
    cache.sweep()  # a sweep, an open past the bound in the same step: they stay open
    _ = mgr.get_or_create("t", 10).active_segment.fd
    assert [os.fstat(s.fd).st_ino for s in handed] == inodes
    for p, s in enumerate(slices):
        assert [r.value for r in records.decode_all(s.read())] == [b"v%d" % p]
    await asyncio.sleep(0)  # the step ends (the RPC server copied or pinned the ranges)
    cache.sweep()
    assert len(cache) <= 2
    await mgr.close_async()


async def test_pinned_and_retired_segments_are_not_closed(tmp_path):
    mgr = await manager(tmp_path, 4, 1)
    cache = mgr.fd_cache
    logs = [mgr.get("t", p) for p in range(4)]
    pinned = logs[0].active_segment
    pinned.pin()  # as an executor thread does (the cleaner), for as long as it works
    others = [log.active_segment for log in logs[1:]]
    for seg in others:
        _ = seg.fd
    cache.sweep()
    cache.sweep()
    assert pinned.is_open and not any(seg.is_open for seg in others)
    pinned.unpin()
    _ = others[0].fd
    cache.sweep()
    assert not pinned.is_open and others[0].is_open
    # A truncation retires segments (renamed to *.deleted): a reader's descriptor of a
    # retired segment is no longer the cache's to close (its path names another file).
    log = logs[1]
    for i in range(200):
        log.append(batch(i), 0)
    await log.flush_async()
    first = log.segments[0]
    _ = first.fd
    log.truncate_fully_and_start_at(500)
    assert first.is_open and first._retired
    for _ in range(3):
        cache.sweep()
    assert first.is_open
    await mgr.close_async()


def test_the_bound_follows_the_soft_open_files_limit(monkeypatch):
    import resource

    from rillet.storage import fdcache

    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    assert fdcache.default_max_open() == 64
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))
    assert fdcache.default_max_open() == fdcache.DEFAULT_MAX_OPEN
    assert FdCache().max_open == fdcache.DEFAULT_MAX_OPEN


def test_a_crash_keeps_what_a_flush_promised_through_closed_dirty_descriptors() -> None:
    """On the storage simulator's file system (unsynced bytes are lost at a crash):
    records written through descriptors the cache then closed dirty survive a crash
    once a flush has promised them."""
    sim = SimFileSystem()
    sim.makedirs(NODE)
    sim.sync_all()
    with fs.install(sim):
        cache = FdCache(max_open=1)
        logs = [Log.open(f"{NODE}/t-{p}", LogConfig()) for p in range(3)]
        for log in logs:
            log.use_fd_cache(cache)
        for i in range(4):
            for p, log in enumerate(logs):
                log.append(batch(10 * p + i), 0)
                cache.trim()  # what an append past the bound does on the event loop
        assert len(cache) <= 1
        assert sum(log.active_segment.dirty and not log.active_segment.is_open for log in logs)
        for log in logs:
            log.flush()
        assert len([fd for fd in sim.open_fds(NODE) if sim._fds[fd].path.endswith(".log")]) <= 1
        sim.crash(NODE, random.Random(0))
        for p in range(3):
            again = Log.open(f"{NODE}/t-{p}", LogConfig())
            assert values(again) == [b"v%d" % (10 * p + i) for i in range(4)]


def test_a_retired_segment_stays_open_while_a_background_fsync_uses_it(tmp_path, monkeypatch):
    """A roll job (an executor thread) fsyncs every segment from the recovery point on;
    a truncation may retire one of them meanwhile and, file.delete.delay.ms later (here
    0), the purge (another executor thread) closes it. The close must wait for the
    fsync: closed under it, the descriptor's number goes to the next file opened, and
    the fsync fails with EBADF (the log turns read-only, the broker halts) or lands on
    that other file."""
    cache = FdCache(max_open=4)
    jobs: list = []
    config = LogConfig(segment_bytes=4096, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "t-0", config, background=lambda job, after: jobs.append(job))
    log.use_fd_cache(cache)
    log.append(batch(0), 0)
    old = log.active_segment
    log.roll()  # its job fsyncs ``old``: deferred
    log.truncate_fully_and_start_at(100)  # retires ``old`` (renamed *.deleted)
    assert old.is_open and len(jobs) == 1
    old_file = os.fstat(old.fd).st_ino

    entered, release = threading.Event(), threading.Event()
    seen: list[int] = []
    real_fsync = fs.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread() is not threading.main_thread() and not entered.is_set():
            entered.set()
            release.wait()
            seen.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(fs, "fsync", slow_fsync)
    worker = threading.Thread(target=jobs[0])
    worker.start()
    entered.wait()
    purge(log.due_retired(None))  # the purge, while the job is inside old's fsync
    reuse = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)  # takes a freed number
    release.set()
    worker.join()
    os.close(reuse)
    assert log.failure is None
    assert seen == [old_file]  # the fsync went to old's file
    assert not old.is_open  # and the purge's close happened once it was done
    log.close()


async def test_the_bound_holds_while_every_partition_is_read_each_round(tmp_path):
    """A follower fetching every partition each round hands out a descriptor for each.
    Protecting them until the next sweep, and sparing them at the sweep as recently
    used, kept all of them open for as long as the fetches went on: a broker fetched
    from on 10,000 partitions held 10,000 descriptors whatever the bound. A handed-out
    descriptor needs protecting only until the event-loop step that handed it out ends
    (the RPC server has copied or dup()ed the range by then); after it, the bound holds."""
    mgr = await manager(tmp_path, 20, 4)
    positions = [0] * 20
    for round_no in range(4):
        for p in range(20):
            mgr.get("t", p).append(batch(round_no * 100 + p), 0)
        # One fetch, one step: every partition read, every range used after all reads.
        slices = [mgr.get("t", p).read(positions[p], 1 << 20) for p in range(20)]
        for p, s in enumerate(slices):
            got = [r.value for r in records.decode_all(s.read())]
            assert got == [b"v%d" % (round_no * 100 + p)]
            positions[p] += 1
        await asyncio.sleep(0)  # the step ends
        mgr.fd_cache.sweep()
        assert len(mgr.fd_cache) <= 4 and len(open_segment_files(tmp_path)) <= 4
    await mgr.close_async()


def test_descriptors_handed_out_on_a_loop_that_closed_are_released_at_the_next_sweep(tmp_path):
    """The end of a step is a callback on the loop that handed the descriptor out: if that
    loop closes first (a tool or test that runs one coroutine per loop), the next sweep
    must still release them, or they would stay open past the bound for good."""
    cache = FdCache(max_open=1)
    logs = [Log.open(tmp_path / f"t-{p}", SMALL) for p in range(3)]
    for p, log in enumerate(logs):
        log.append(batch(p), 0)
        log.use_fd_cache(cache)

    loop = asyncio.new_event_loop()

    def fetch_and_stop() -> None:
        for log in logs:
            log.read(0, 1 << 20).read()
        loop.stop()  # the loop ends with this step: the step's end callback never runs

    loop.call_soon(fetch_and_stop)
    loop.run_forever()
    loop.close()
    cache.sweep()
    assert len(cache) <= 1
    for log in logs:
        log.close()
