"""The high-watermark checkpoint of a log dir (Kafka: ``replication-offset-checkpoint``).

Kafka's format: a version line (0), a count line, then ``topic partition offset`` per
line. Written atomically (temp file, fsync, rename, fsync of the dir) from the default
executor, periodically and on clean shutdown; read once at start, so a restarted leader
does not begin at HW 0 and make consumers wait until every follower has fetched. File
calls go through storage/fs.py, so the replication simulator's file system serves them.

A missing or malformed file reads as empty: every HW can be relearned from the leader
(followers) or from the ISR's fetches (leaders), it is just slower.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rillet.controller.metadata.image import TopicPartition
from rillet.storage import fs

logger = logging.getLogger(__name__)

FILE_NAME = "replication-offset-checkpoint"
VERSION = 0


def read(log_dir: str | os.PathLike) -> dict[TopicPartition, int]:
    path = Path(log_dir) / FILE_NAME
    try:
        text = fs.read_text(path)
    except FileNotFoundError:
        return {}
    try:
        lines = text.split("\n")
        if int(lines[0]) != VERSION:
            raise ValueError(f"version {lines[0]}")
        count = int(lines[1])
        out: dict[TopicPartition, int] = {}
        for line in lines[2 : 2 + count]:
            topic, partition, offset = line.split(" ")
            out[TopicPartition(topic, int(partition))] = int(offset)
        if len(out) != count:
            raise ValueError(f"{len(out)} entries, header says {count}")
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        logger.warning("ignoring malformed %s (%s): high watermarks start at 0", path, e)
        return {}
    return out


def write(log_dir: str | os.PathLike, entries: dict[TopicPartition, int]) -> None:
    """Replace the checkpoint atomically and durably. Blocks: run it in an executor."""
    directory = Path(log_dir)
    lines = [str(VERSION), str(len(entries))]
    lines.extend(f"{tp.topic} {tp.partition} {hw}" for tp, hw in sorted(entries.items()))
    tmp = directory / (FILE_NAME + ".tmp")
    fd = fs.open(tmp, fs.O_WRONLY | fs.O_CREAT | fs.O_TRUNC, 0o644)
    try:
        fs.write(fd, ("\n".join(lines) + "\n").encode())
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.replace(tmp, directory / FILE_NAME)
    fs.fsync_dir(directory)
