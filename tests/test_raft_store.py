"""RaftStore: durable Raft log, hard state and snapshots, including crash leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rillet.controller.raft.core import Entry, EntryKind, HardState, RaftConfig, RaftNode, Snapshot
from rillet.controller.raft.store import (
    HARD_STATE_FILE,
    LOG_FILE,
    SNAPSHOT_FILE,
    STORAGE_ID_FILE,
    RaftStore,
    RaftStoreCorruption,
)


def entries(first: int, last: int, term: int = 1) -> list[Entry]:
    return [Entry(i, term, f"e{i}".encode()) for i in range(first, last + 1)]


def flip_last_bit(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))


def test_entries_and_hard_state_survive_reopen(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append([Entry(1, 1, b"", EntryKind.NOOP), *entries(2, 5)])
    store.save_hard_state(HardState(term=1, vote=3, commit=4))
    store.close()
    state = RaftStore(tmp_path).load()
    assert state.hard_state == HardState(1, 3, 4)
    assert [e.index for e in state.entries] == [1, 2, 3, 4, 5]
    assert state.entries[0].kind == EntryKind.NOOP and state.entries[4].data == b"e5"


def test_append_over_conflicting_tail_truncates_it(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 6, term=1))
    store.append(entries(4, 5, term=2))
    assert store.last_index == 5 and store.term(4) == 2 and store.term(3) == 1
    store.close()
    reopened = RaftStore(tmp_path)
    assert [(e.index, e.term) for e in reopened.load().entries] == [
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 2),
        (5, 2),
    ]


def test_torn_tail_after_kill_is_truncated_on_open(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 3))
    store.close()
    log = tmp_path / LOG_FILE
    whole = log.read_bytes()
    store = RaftStore(tmp_path)
    store.append(entries(4, 4))
    store.close()
    with_fourth = log.read_bytes()
    log.write_bytes(with_fourth[: len(whole) + 7])  # the 4th record half written
    reopened = RaftStore(tmp_path)
    assert reopened.last_index == 3
    assert log.stat().st_size == len(whole)
    reopened.append(entries(4, 5, term=2))  # appends continue cleanly after the cut
    reopened.close()
    assert [e.term for e in RaftStore(tmp_path).load().entries] == [1, 1, 1, 2, 2]


def test_crc_failure_in_tail_truncates_from_bad_record(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 4))
    offsets = list(store._offsets)
    store.close()
    log = tmp_path / LOG_FILE
    raw = bytearray(log.read_bytes())
    raw[offsets[2] + 12] ^= 0xFF  # flip a byte inside the 3rd record's body
    log.write_bytes(bytes(raw))
    reopened = RaftStore(tmp_path)
    assert reopened.last_index == 2
    assert [e.data for e in reopened.entries(1, 2)] == [b"e1", b"e2"]


def test_lost_committed_entries_refuse_to_open(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 4))
    store.save_hard_state(HardState(term=1, vote=1, commit=4))
    offsets = list(store._offsets)
    store.close()
    log = tmp_path / LOG_FILE
    raw = bytearray(log.read_bytes())
    raw[offsets[1] + 12] ^= 0xFF  # corrupt an entry the store had acknowledged
    log.write_bytes(bytes(raw))
    with pytest.raises(RaftStoreCorruption, match="commit 4"):
        RaftStore(tmp_path)


def test_corrupt_hard_state_is_reported(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.save_hard_state(HardState(term=7, vote=2, commit=0))
    store.close()
    flip_last_bit(tmp_path / HARD_STATE_FILE)
    with pytest.raises(RaftStoreCorruption, match="CRC"):
        RaftStore(tmp_path)


def test_snapshot_compacts_log_prefix_and_survives_reopen(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 10, term=2))
    store.save_snapshot(Snapshot(6, 2, b"state@6"))
    assert store.first_index == 7 and store.last_index == 10
    store.append(entries(11, 12, term=3))
    store.close()
    state = RaftStore(tmp_path).load()
    assert state.snapshot == Snapshot(6, 2, b"state@6")
    assert [e.index for e in state.entries] == [7, 8, 9, 10, 11, 12]


def test_crash_between_snapshot_and_log_rewrite_is_finished_on_open(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 8, term=2))
    store.close()
    other = RaftStore(tmp_path / "scratch")  # write only the snapshot file, as if killed
    other.append(entries(1, 5, term=2))
    other.save_snapshot(Snapshot(5, 2, b"state@5"))
    other.close()
    os.replace(tmp_path / "scratch" / SNAPSHOT_FILE, tmp_path / SNAPSHOT_FILE)
    state = RaftStore(tmp_path).load()
    assert state.snapshot is not None and state.snapshot.index == 5
    assert [e.index for e in state.entries] == [6, 7, 8]


def test_installed_snapshot_replaces_whole_log(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 9, term=1))
    store.install_snapshot(Snapshot(20, 4, b"leader-state"))
    assert store.last_index == 20 and store.first_index == 21
    store.append(entries(21, 22, term=4))
    store.close()
    state = RaftStore(tmp_path).load()
    assert [e.index for e in state.entries] == [21, 22]


def test_commit_only_hard_state_is_written_lazily_and_on_close(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 3))
    store.save_hard_state(HardState(term=1, vote=1, commit=0))
    store.save_hard_state(HardState(term=1, vote=1, commit=3), sync=False)
    assert RaftStore(tmp_path).hard_state.commit == 0  # not yet on disk
    store.close()
    assert RaftStore(tmp_path).hard_state.commit == 3


def test_single_node_persists_ready_and_restarts_from_store(tmp_path: Path) -> None:
    config = RaftConfig(node_id=1, voters=(1,))
    store = RaftStore(tmp_path)
    node = RaftNode(config, store.load(), now_ms=0)
    node.tick(2000)  # elects itself
    index = node.propose(b"hello")
    while node.has_ready():
        ready = node.ready()
        store.persist_ready(ready)
        node.advance(ready)
    store.close()
    restarted = RaftNode(config, RaftStore(tmp_path).load(), now_ms=5000)
    assert restarted.term == 1 and restarted.vote == 1
    assert restarted.log.term(index) == 1 and restarted.commit_index == index


def test_a_new_store_gets_a_storage_id_that_survives_reopen(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    storage_id = store.storage_id
    assert storage_id > 0 and store.load().storage_id == storage_id
    store.append(entries(1, 3))
    store.install_snapshot(Snapshot(9, 2, b"leader-state"))  # the same disk, a new log
    store.close()
    assert RaftStore(tmp_path).load().storage_id == storage_id


def test_a_wiped_directory_gets_a_new_storage_id(tmp_path: Path) -> None:
    first = RaftStore(tmp_path / "a")
    first.close()
    for path in (tmp_path / "a").iterdir():
        path.unlink()
    assert RaftStore(tmp_path / "a").storage_id != first.storage_id


def test_a_store_written_before_storage_ids_gets_one_on_open(tmp_path: Path) -> None:
    store = RaftStore(tmp_path)
    store.append(entries(1, 3))
    store.save_hard_state(HardState(term=1, vote=1, commit=2))
    store.close()
    (tmp_path / STORAGE_ID_FILE).unlink()  # as an older version left the directory
    upgraded = RaftStore(tmp_path)
    state = upgraded.load()
    assert state.storage_id > 0 and [e.index for e in state.entries] == [1, 2, 3]
    upgraded.close()
    assert RaftStore(tmp_path).storage_id == state.storage_id


def test_corrupt_storage_id_is_reported(tmp_path: Path) -> None:
    RaftStore(tmp_path).close()
    flip_last_bit(tmp_path / STORAGE_ID_FILE)
    with pytest.raises(RaftStoreCorruption, match="CRC"):
        RaftStore(tmp_path)
