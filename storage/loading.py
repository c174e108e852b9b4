"""Opening a partition directory: tidy leftovers of interrupted work, list segments,
and recover whatever an unclean shutdown may have torn.

Leftovers and what they mean:
- ``*.tmp``: a checkpoint or index write that never reached its rename: delete.
- ``*.cleaned``: compaction output not yet committed: delete (the old segment stands).
- ``*.log.swap``: committed compaction output: finish the swap (drop the old indexes,
  rename it over ``.log``; its indexes are then rebuilt by a scan).
- ``*.deleted``: a retired segment whose unlink was still pending: delete.
- an index without its ``.log``: delete.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rillet.storage import fs
from rillet.storage.segment import LogSegment

log = logging.getLogger(__name__)


def tidy_directory(directory: Path) -> set[int]:
    """Apply the rules above; returns base offsets whose indexes must be rebuilt."""
    rebuild: set[int] = set()
    names = fs.listdir(directory)
    for name in names:
        path = directory / name
        if name.endswith((".tmp", ".cleaned", ".deleted")):
            fs.unlink(path, missing_ok=True)
        elif name.endswith(".log.swap"):
            stem = name[: -len(".log.swap")]
            for suffix in (".index", ".timeindex"):
                fs.unlink(directory / f"{stem}{suffix}", missing_ok=True)
            fs.replace(path, directory / f"{stem}.log")
            log.info("%s: finished an interrupted compaction swap of %s", directory, stem)
            rebuild.add(int(stem))
    logs = {n[:-4] for n in fs.listdir(directory) if n.endswith(".log")}
    for name in fs.listdir(directory):
        stem, dot, suffix = name.partition(".")
        if suffix in ("index", "timeindex") and stem not in logs:
            fs.unlink(directory / name, missing_ok=True)
    return rebuild


def list_segments(directory: Path, index_interval: int) -> list[LogSegment]:
    """Every ``<20 digits>.log`` as a closed segment; reads nothing but the directory."""
    segments = []
    for name in fs.listdir(directory):
        if len(name) == 24 and name.endswith(".log") and name[:20].isdigit():
            seg = LogSegment(
                directory,
                int(name[:20]),
                size=fs.stat_size(directory / name),
                active=False,
                index_interval=index_interval,
            )
            segments.append(seg)
    segments.sort(key=lambda s: s.base_offset)
    return segments


def needs_index_rebuild(seg: LogSegment) -> bool:
    """A non-empty segment whose offset index file is missing or not whole entries."""
    if seg.size == 0:
        return False
    try:
        size = fs.stat_size(seg.index.path)
        fs.stat_size(seg.time_index.path)
    except FileNotFoundError:
        return True
    return size % seg.index.ENTRY.size != 0
