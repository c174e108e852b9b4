"""Durable Raft log, hard state and snapshot of one controller (blocking file I/O).

The driver calls these from an executor, never on the event loop. Every call that the
Ready ordering rules need durable before a message goes out has fsynced when it returns.

Directory layout:
- `raft.log`: append-only records `u32 length | u32 crc32c | u64 term | u64 index |
  u8 kind | data`, where length counts the bytes after the crc field and the CRC covers
  the same bytes. Records hold consecutive indexes starting after the snapshot.
- `hardstate`: `u32 crc32c | u64 term | i64 vote (-1 = none) | u64 commit`, replaced
  atomically (temp file, fsync, rename, fsync directory).
- `snapshot`: `u32 crc32c | u64 index | u64 term | data`, replaced the same way.
- `storage.id`: `u32 crc32c | u64 id`, a random non-zero id written (atomically) when the
  directory is first opened, and never changed. A wiped or replaced directory gets a new
  one, which is how the leader learns that this voter's log is gone (docs/raft.md). A
  directory written before storage ids existed gets one on open.

Recovery on open: a torn or CRC-failing tail of `raft.log` is truncated away. Only
unacknowledged entries can be torn, since appends fsync before any acknowledgement; if
the truncation would cut below the stored commit index, that is corruption of
acknowledged data and opening fails with `RaftStoreCorruption`.
"""

from __future__ import annotations

import logging
import os
import secrets
import struct
from collections.abc import Sequence
from pathlib import Path

import crc32c

from rillet.controller.raft.core import Entry, HardState, Ready, Snapshot, StorageState

__all__ = ["RaftStore", "RaftStoreCorruption", "RaftStoreError", "STORAGE_ID_FILE"]

logger = logging.getLogger(__name__)

LOG_FILE = "raft.log"
HARD_STATE_FILE = "hardstate"
SNAPSHOT_FILE = "snapshot"
STORAGE_ID_FILE = "storage.id"

_RECORD_HEAD = struct.Struct(">II")  # length, crc
_RECORD_BODY = struct.Struct(">QQB")  # term, index, kind
_HARD_STATE = struct.Struct(">IQqQ")  # crc, term, vote, commit
_SNAPSHOT_HEAD = struct.Struct(">IQQ")  # crc, index, term
_STORAGE_ID = struct.Struct(">IQ")  # crc, id
MAX_RECORD_BYTES = 64 * 1024 * 1024


class RaftStoreError(Exception):
    """A local storage failure or misuse."""


class RaftStoreCorruption(RaftStoreError):
    """Stored data fails its checks in a way a crash cannot explain; refuse to start."""


def _check(condition: bool, message: str) -> None:
    """Always-on invariant check (survives python -O)."""
    if not condition:
        raise RaftStoreError(message)


def encode_record(entry: Entry) -> bytes:
    body = _RECORD_BODY.pack(entry.term, entry.index, int(entry.kind)) + entry.data
    _check(len(body) <= MAX_RECORD_BYTES, f"entry {entry.index} of {len(body)} bytes too big")
    return _RECORD_HEAD.pack(len(body), crc32c.crc32c(body)) + body


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(directory: Path, name: str, data: bytes) -> None:
    """Temp file + fsync + rename + fsync of the directory: old or new, never half."""
    tmp = directory / (name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / name)
    _fsync_dir(directory)


class RaftStore:
    """One controller's Raft storage. Not thread-safe: one executor call at a time."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.storage_id = self._read_or_create_storage_id()
        self.hard_state = self._read_hard_state()
        self.snapshot = self._read_snapshot()
        self._offsets: list[int] = []  # byte offset of each record, entry i at [i - first]
        self._terms: list[int] = []
        self._fd = os.open(self.directory / LOG_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        self._end = 0
        self._pending_hard_state: HardState | None = None
        self._recover_log()

    # -- queries ----------------------------------------------------------

    @property
    def snapshot_index(self) -> int:
        return self.snapshot.index if self.snapshot else 0

    @property
    def first_index(self) -> int:
        return self.snapshot_index + 1

    @property
    def last_index(self) -> int:
        return self.snapshot_index + len(self._offsets)

    def term(self, index: int) -> int | None:
        if index == self.snapshot_index:
            return self.snapshot.term if self.snapshot else 0
        if not self.first_index <= index <= self.last_index:
            return None
        return self._terms[index - self.first_index]

    def entries(self, first: int, last: int) -> list[Entry]:
        """Entries first..last inclusive, each re-checked against its CRC."""
        _check(
            self.first_index <= first and last <= self.last_index,
            f"range {first}..{last} outside {self.first_index}..{self.last_index}",
        )
        if last < first:
            return []
        start = self._offsets[first - self.first_index]
        stop = self._offsets[last + 1 - self.first_index] if last < self.last_index else self._end
        buf = os.pread(self._fd, stop - start, start)
        out: list[Entry] = []
        pos = 0
        while pos < len(buf):
            entry, pos = self._decode_at(buf, pos)
            _check(entry is not None, f"record at {start + pos} fails its CRC after open")
            assert entry is not None  # for the type checker; checked just above
            out.append(entry)
        return out

    def load(self) -> StorageState:
        """What a RaftNode needs to start: hard state, snapshot and the stored entries."""
        entries = tuple(self.entries(self.first_index, self.last_index))
        return StorageState(self.hard_state, self.snapshot, entries, self.storage_id)

    # -- writes -----------------------------------------------------------

    def persist_ready(self, ready: Ready) -> None:
        """Step 1 of the driver loop: snapshot, entries, hard state, in that order."""
        if ready.snapshot is not None:
            self.install_snapshot(ready.snapshot)
        if ready.entries:
            self.append(ready.entries)
        if ready.hard_state is not None:
            self.save_hard_state(ready.hard_state, sync=ready.must_sync)

    def append(self, entries: Sequence[Entry]) -> None:
        """Append `entries` (after dropping stored entries at or past the first); fsyncs."""
        if not entries:
            return
        first = entries[0].index
        if first <= self.last_index:
            self.truncate_suffix(first, sync=False)
        _check(
            first == self.last_index + 1, f"append at {first} leaves a gap after {self.last_index}"
        )
        chunks: list[bytes] = []
        offset = self._end
        for expected, entry in enumerate(entries, start=first):
            _check(entry.index == expected, f"entries not consecutive at {entry.index}")
            record = encode_record(entry)
            self._offsets.append(offset)
            self._terms.append(entry.term)
            offset += len(record)
            chunks.append(record)
        data = b"".join(chunks)
        written = os.pwrite(self._fd, data, self._end)
        _check(written == len(data), f"short write: {written} of {len(data)} bytes")
        self._end = offset
        os.fdatasync(self._fd)

    def truncate_suffix(self, index: int, sync: bool = True) -> None:
        """Drop every entry at or after `index` (a follower's conflicting tail)."""
        _check(index > self.snapshot_index, f"cannot truncate into snapshot at {index}")
        if index > self.last_index:
            return
        keep = index - self.first_index
        self._end = self._offsets[keep]
        del self._offsets[keep:]
        del self._terms[keep:]
        os.ftruncate(self._fd, self._end)
        if sync:
            os.fdatasync(self._fd)

    def save_hard_state(self, hard_state: HardState, sync: bool = True) -> None:
        """Atomic replace when `sync`; a commit-only change may wait for the next sync."""
        if not sync:
            self._pending_hard_state = hard_state
            return
        self._pending_hard_state = None
        vote = -1 if hard_state.vote is None else hard_state.vote
        body = _HARD_STATE.pack(0, hard_state.term, vote, hard_state.commit)[4:]
        _write_atomically(
            self.directory, HARD_STATE_FILE, struct.pack(">I", crc32c.crc32c(body)) + body
        )
        self.hard_state = hard_state

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Persist a snapshot the application took (RaftNode.compact), then drop the prefix."""
        if snapshot.index <= self.snapshot_index:
            return
        _check(
            self.term(snapshot.index) == snapshot.term,
            f"snapshot at {snapshot.index} term {snapshot.term} does not match the log",
        )
        kept = self.entries(snapshot.index + 1, self.last_index)
        self._write_snapshot(snapshot)
        self._rewrite_log(kept)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """A snapshot from the leader replaces the whole log."""
        self._write_snapshot(snapshot)
        self._rewrite_log([])

    def flush(self) -> None:
        """Write a lazily held commit index (call on clean shutdown)."""
        if self._pending_hard_state is not None:
            self.save_hard_state(self._pending_hard_state)

    def close(self) -> None:
        if self._fd >= 0:
            self.flush()
            os.close(self._fd)
            self._fd = -1

    # -- internals ----------------------------------------------------------

    def _write_snapshot(self, snapshot: Snapshot) -> None:
        body = _SNAPSHOT_HEAD.pack(0, snapshot.index, snapshot.term)[4:] + snapshot.data
        _write_atomically(
            self.directory, SNAPSHOT_FILE, struct.pack(">I", crc32c.crc32c(body)) + body
        )
        self.snapshot = snapshot

    def _rewrite_log(self, entries: Sequence[Entry]) -> None:
        """Replace raft.log by `entries` (which must follow the snapshot) atomically."""
        data = b"".join(encode_record(e) for e in entries)
        _write_atomically(self.directory, LOG_FILE, data)
        os.close(self._fd)
        self._fd = os.open(self.directory / LOG_FILE, os.O_RDWR)
        self._offsets, self._terms, self._end = [], [], 0
        offset = 0
        for expected, entry in enumerate(entries, start=self.first_index):
            _check(entry.index == expected, f"rewritten log not consecutive at {entry.index}")
            self._offsets.append(offset)
            self._terms.append(entry.term)
            offset += _RECORD_HEAD.size + _RECORD_BODY.size + len(entry.data)
        self._end = offset

    def _read_or_create_storage_id(self) -> int:
        """Durable before any answer can carry it: a crash must not change it."""
        path = self.directory / STORAGE_ID_FILE
        if path.exists():
            raw = path.read_bytes()
            if len(raw) != _STORAGE_ID.size:
                raise RaftStoreCorruption(f"{path}: {len(raw)} bytes, expected {_STORAGE_ID.size}")
            crc, storage_id = _STORAGE_ID.unpack(raw)
            if crc != crc32c.crc32c(raw[4:]):
                raise RaftStoreCorruption(f"{path}: CRC mismatch")
            if storage_id == 0:  # 0 means "no id" on the wire
                raise RaftStoreCorruption(f"{path}: storage id 0")
            return storage_id
        storage_id = secrets.randbelow(2**63 - 1) + 1
        body = _STORAGE_ID.pack(0, storage_id)[4:]
        _write_atomically(
            self.directory, STORAGE_ID_FILE, struct.pack(">I", crc32c.crc32c(body)) + body
        )
        logger.info("raft store %s: new storage id %d", self.directory, storage_id)
        return storage_id

    def _read_hard_state(self) -> HardState:
        path = self.directory / HARD_STATE_FILE
        if not path.exists():
            return HardState()
        raw = path.read_bytes()
        if len(raw) != _HARD_STATE.size:
            raise RaftStoreCorruption(f"{path}: {len(raw)} bytes, expected {_HARD_STATE.size}")
        crc, term, vote, commit = _HARD_STATE.unpack(raw)
        if crc != crc32c.crc32c(raw[4:]):
            raise RaftStoreCorruption(f"{path}: CRC mismatch")
        return HardState(term, None if vote < 0 else vote, commit)

    def _read_snapshot(self) -> Snapshot | None:
        path = self.directory / SNAPSHOT_FILE
        if not path.exists():
            return None
        raw = path.read_bytes()
        if len(raw) < _SNAPSHOT_HEAD.size:
            raise RaftStoreCorruption(f"{path}: {len(raw)} bytes is too short")
        crc, index, term = _SNAPSHOT_HEAD.unpack_from(raw)
        if crc != crc32c.crc32c(raw[4:]):
            raise RaftStoreCorruption(f"{path}: CRC mismatch")
        return Snapshot(index, term, raw[_SNAPSHOT_HEAD.size :])

    @staticmethod
    def _decode_at(buf: bytes, pos: int) -> tuple[Entry | None, int]:
        """Entry at `pos` and the next position; None if short, oversized or CRC-failing."""
        if pos + _RECORD_HEAD.size > len(buf):
            return None, pos
        length, crc = _RECORD_HEAD.unpack_from(buf, pos)
        body_start = pos + _RECORD_HEAD.size
        if not _RECORD_BODY.size <= length <= MAX_RECORD_BYTES or body_start + length > len(buf):
            return None, pos
        body = buf[body_start : body_start + length]
        if crc32c.crc32c(body) != crc:
            return None, pos
        term, index, kind = _RECORD_BODY.unpack_from(body)
        return Entry(index, term, bytes(body[_RECORD_BODY.size :]), kind), body_start + length

    def _recover_log(self) -> None:
        size = os.fstat(self._fd).st_size
        buf = os.pread(self._fd, size, 0) if size else b""
        pos = 0
        entries: list[tuple[int, Entry]] = []
        while pos < len(buf):
            entry, next_pos = self._decode_at(buf, pos)
            if entry is None or (entries and entry.index != entries[-1][1].index + 1):
                break
            entries.append((pos, entry))
            pos = next_pos
        if pos < len(buf):
            logger.warning(
                "raft log %s: truncating %d bytes of torn or corrupt tail at offset %d",
                self.directory / LOG_FILE,
                len(buf) - pos,
                pos,
            )
            os.ftruncate(self._fd, pos)
            os.fdatasync(self._fd)
        self._end = pos
        self._adopt_recovered(entries)

    def _adopt_recovered(self, entries: list[tuple[int, Entry]]) -> None:
        """Keep the recovered records that continue the snapshot; check the commit survived."""
        first = self.snapshot_index + 1
        if not entries or entries[0][1].index == first:
            self._offsets = [off for off, _ in entries]
            self._terms = [e.term for _, e in entries]
        else:
            # A crash between writing a snapshot and rewriting the log: finish the job.
            start = entries[0][1].index
            if start > first:
                raise RaftStoreCorruption(
                    f"raft log starts at {start}, after snapshot index {self.snapshot_index}"
                )
            position = self.snapshot_index - start
            at_snapshot = entries[position][1] if position < len(entries) else None
            joins = (
                self.snapshot is not None
                and at_snapshot is not None
                and at_snapshot.term == self.snapshot.term
            )
            self._rewrite_log([e for _, e in entries[position + 1 :]] if joins else [])
        if self.hard_state.commit > self.last_index:
            raise RaftStoreCorruption(
                f"raft log ends at {self.last_index} but commit {self.hard_state.commit} was "
                f"stored: acknowledged entries are gone (corruption, not a torn write)"
            )
