"""Small checkpoint files, written atomically (temp file, optional fsync, rename).

Format, as Kafka's checkpoint files: a version line, a count line, then one entry per
line of space-separated integers. A file that does not parse reads as missing, and the
caller rebuilds what it held from the log (every checkpoint here is derivable).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from rillet.storage import fs

log = logging.getLogger(__name__)

VERSION = 0
RECOVERY_POINT = "recovery-point"
LOG_START_OFFSET = "log-start-offset"
LEADER_EPOCH = "leader-epoch-checkpoint"
CLEAN_SHUTDOWN = "clean-shutdown"
PARTITION_METADATA = "partition.metadata"


def write_entries(path: Path, entries: list[tuple[int, ...]], *, fsync: bool) -> None:
    """Replace ``path`` atomically with ``entries``; fsync file and dir when asked."""
    lines = [str(VERSION), str(len(entries))]
    lines.extend(" ".join(str(v) for v in e) for e in entries)
    replace_file(path, ("\n".join(lines) + "\n").encode(), fsync=fsync)


def replace_file(path: Path, data: bytes, *, fsync: bool) -> None:
    """Replace ``path`` with ``data`` atomically (temp file, rename), so a crash leaves
    the old file or the new one, never half of one; with ``fsync``, durably."""
    # A unique temp name: a roll's background flush and close() may write at once.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = fs.open(tmp, fs.O_WRONLY | fs.O_CREAT | fs.O_TRUNC, 0o644)
    try:
        fs.write(fd, data)
        if fsync:
            fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def read_entries(path: Path, width: int) -> list[tuple[int, ...]] | None:
    """The entries of a checkpoint, or None when missing or malformed (then rebuild)."""
    try:
        data = fs.read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        text = data.decode()  # a torn unsynced file may hold any bytes
        # Every line ends in a newline and nothing follows the entries (Kafka's reader
        # demands the same): a torn tail that still parses, "36\n" become "361", fails.
        if not text.endswith("\n"):
            raise ValueError("no final newline")
        lines = text[:-1].split("\n")
        if int(lines[0]) != VERSION:
            raise ValueError(f"version {lines[0]}")
        count = int(lines[1])
        entries = [tuple(int(v) for v in line.split()) for line in lines[2:]]
        if len(entries) != count or any(len(e) != width for e in entries):
            raise ValueError("entry count or width")
    except (ValueError, IndexError) as e:
        log.warning("ignoring malformed checkpoint %s (%s); rebuilding from the log", path, e)
        return None
    return entries


def write_offset(path: Path, offset: int, *, fsync: bool) -> None:
    write_entries(path, [(offset,)], fsync=fsync)


def read_offset(path: Path) -> int | None:
    entries = read_entries(path, 1)
    return entries[0][0] if entries else None


def fsync_dir(path: Path) -> None:
    """Make renames and unlinks in a directory durable."""
    fs.fsync_dir(path)


def write_topic_id(directory: Path, topic_id: str) -> None:
    """Record which topic a partition directory belongs to, durably, in Kafka's
    ``partition.metadata`` format. Not derivable from the log: written once, on first
    use under a topic id, and never changed."""
    data = f"version: {VERSION}\ntopic_id: {topic_id}\n".encode()
    replace_file(directory / PARTITION_METADATA, data, fsync=True)


def read_topic_id(directory: Path) -> str | None:
    """The topic id a partition directory belongs to; None if unknown or unreadable."""
    try:
        lines = fs.read_text(directory / PARTITION_METADATA).splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    if fields.get("version") != str(VERSION) or not fields.get("topic_id"):
        return None
    return fields["topic_id"]
