"""The simulated file system's crash model (tests/sim/simfs.py), and that storage/fs.py
routes to it while installed."""

from __future__ import annotations

import errno
import os
import random

import pytest
from sim.simfs import FD_BASE, SimCrash, SimFileSystem

from rillet.storage import fs

NODE = "/sim/n1"
FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND


def fresh(**kwargs) -> SimFileSystem:
    sim = SimFileSystem(**kwargs)
    sim.makedirs(NODE)
    sim.sync_all()
    return sim


def write_file(sim: SimFileSystem, name: str, data: bytes, *, sync: bool) -> int:
    fd = sim.open(f"{NODE}/{name}", FLAGS, 0o644)
    sim.write(fd, data)
    if sync:
        sim.fsync(fd)
    return fd


def crashes(sim_factory, seeds=range(200)):
    """What a file's bytes become after a crash, over many seeds."""
    for seed in seeds:
        sim = sim_factory()
        sim.crash(NODE, random.Random(seed))
        yield sim


def test_fsynced_bytes_and_entries_survive_every_crash() -> None:
    def build() -> SimFileSystem:
        sim = fresh()
        write_file(sim, "a", b"durable", sync=True)
        sim.fsync_dir(NODE)
        return sim

    for sim in crashes(build):
        assert sim.read_bytes(f"{NODE}/a") == b"durable"


def test_unsynced_appends_survive_as_a_prefix_possibly_torn() -> None:
    def build() -> SimFileSystem:
        sim = fresh()
        fd = write_file(sim, "a", b"synced-", sync=True)
        sim.write(fd, b"unsynced-tail")
        sim.fsync_dir(NODE)
        return sim

    seen = set()
    for sim in crashes(build):
        data = sim.read_bytes(f"{NODE}/a")
        assert data.startswith(b"synced-") and len(data) <= len(b"synced-unsynced-tail")
        seen.add("lost" if data == b"synced-" else "whole" if data.endswith(b"tail") else "torn")
        if not b"unsynced-tail".startswith(data[7:]):
            seen.add("garbage")
    assert seen == {"lost", "whole", "torn", "garbage"}


def test_a_new_file_whose_directory_was_not_fsynced_may_vanish() -> None:
    def build() -> SimFileSystem:
        sim = fresh()
        write_file(sim, "new", b"x", sync=True)  # the file, not its directory entry
        return sim

    assert all(not sim.exists(f"{NODE}/new") for sim in crashes(build, range(20)))

    def build_ext4() -> SimFileSystem:  # ext4: fsync of a new file persists its entry
        sim = fresh(fsync_persists_entry=True)
        write_file(sim, "new", b"x", sync=True)
        return sim

    assert all(sim.read_bytes(f"{NODE}/new") == b"x" for sim in crashes(build_ext4, range(20)))


def test_a_rename_is_undone_by_a_crash_before_the_directory_fsync() -> None:
    def build(sync_dir: bool) -> SimFileSystem:
        sim = fresh()
        sim.close(write_file(sim, "ckpt", b"old", sync=True))
        sim.fsync_dir(NODE)
        sim.close(write_file(sim, "ckpt.tmp", b"new", sync=True))
        sim.replace(f"{NODE}/ckpt.tmp", f"{NODE}/ckpt")
        if sync_dir:
            sim.fsync_dir(NODE)
        return sim

    for sim in crashes(lambda: build(False), range(20)):
        assert sim.read_bytes(f"{NODE}/ckpt") == b"old"
        assert not sim.exists(f"{NODE}/ckpt.tmp")
    for sim in crashes(lambda: build(True), range(20)):
        assert sim.read_bytes(f"{NODE}/ckpt") == b"new"
        assert sim.listdir(NODE) == ["ckpt"]


def test_an_unsynced_truncation_may_be_undone() -> None:
    def build() -> SimFileSystem:
        sim = fresh()
        fd = write_file(sim, "a", b"0123456789", sync=True)
        sim.fsync_dir(NODE)
        sim.ftruncate(fd, 4)
        return sim

    outcomes = {sim.read_bytes(f"{NODE}/a") for sim in crashes(build)}
    assert outcomes == {b"0123", b"0123456789"}


def test_a_crash_invalidates_descriptors_under_its_prefix_only() -> None:
    sim = fresh()
    sim.makedirs("/sim/n2")
    fd1 = write_file(sim, "a", b"x", sync=False)
    fd2 = sim.open("/sim/n2/b", FLAGS, 0o644)
    assert fd1 >= FD_BASE and fd2 >= FD_BASE
    sim.crash(NODE, random.Random(1))
    for call in (
        lambda: sim.write(fd1, b"y"),
        lambda: sim.pread(fd1, 1, 0),
        lambda: sim.close(fd1),
    ):
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == errno.EBADF
    assert sim.write(fd2, b"still") == 5


def test_a_removed_file_stays_readable_through_its_descriptor() -> None:
    sim = fresh()
    fd = write_file(sim, "a", b"bytes", sync=False)
    sim.unlink(f"{NODE}/a")
    assert sim.pread(fd, 5, 0) == b"bytes" and not sim.exists(f"{NODE}/a")


def test_injected_faults_fail_once_or_by_rate() -> None:
    sim = fresh()
    fd = write_file(sim, "a", b"x", sync=False)
    sim.fail_next("fsync", NODE, errno.EIO)
    with pytest.raises(OSError) as info:
        sim.fsync(fd)
    assert info.value.errno == errno.EIO
    sim.fsync(fd)  # once only
    sim.fail_next("write", "/elsewhere", errno.ENOSPC)
    sim.write(fd, b"y")  # another prefix: not this one
    sim.fail_rate("pread", 1.0, NODE)
    with pytest.raises(OSError):
        sim.pread(fd, 1, 0)


def test_a_failed_write_may_leave_a_prefix_of_its_data() -> None:
    lengths = set()
    for seed in range(50):
        sim = fresh(rng=random.Random(seed))
        fd = write_file(sim, "a", b"", sync=False)
        sim.fail_next("write", NODE, errno.ENOSPC)
        with pytest.raises(OSError):
            sim.write(fd, b"0123456789")
        data = sim.read_bytes(f"{NODE}/a")
        assert b"0123456789".startswith(data) and len(data) < 10
        lengths.add(len(data))
    assert len(lengths) > 3


def test_crash_after_lands_inside_a_sequence_and_holds_the_node_down() -> None:
    sim = fresh()
    fd = write_file(sim, "a", b"synced", sync=True)
    sim.fsync_dir(NODE)
    sim.crash_after(2, NODE, random.Random(0))
    sim.write(fd, b"-1")
    with pytest.raises(SimCrash):
        sim.fsync(fd)  # the second mutating operation: the crash comes first
    with pytest.raises(SimCrash):
        sim.listdir(NODE)
    sim.restart(NODE)
    assert sim.read_bytes(f"{NODE}/a").startswith(b"synced")


def test_install_routes_storage_calls_and_restores_os() -> None:
    sim = fresh()
    with fs.install(sim):
        fd = fs.open(f"{NODE}/f", os.O_RDWR | os.O_CREAT, 0o644)
        fs.write(fd, b"abc")
        assert fs.pread(fd, 3, 0) == b"abc" and fs.fstat_size(fd) == 3
        assert [e.name for e in fs.scandir(NODE)] == ["f"]
        with pytest.raises(RuntimeError), fs.install(SimFileSystem()):
            pass
    assert fs.write is os.write and fs.pread is os.pread
    assert not os.path.exists(f"{NODE}/f")
