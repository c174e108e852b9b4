"""What a read returns: a byte range of one segment file, ready for ``os.sendfile``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rillet.storage import fs


@dataclass(frozen=True, slots=True)
class FileSlice:
    """Whole batches at ``[position, position + length)`` of a segment file.

    ``fd`` is the segment's own open descriptor: send from it (``os.sendfile(sock, fd,
    position, length)`` or ``os.pread``) rather than reopening ``path``, because compaction
    may replace the file at that path; the descriptor keeps the old bytes readable until
    ``file.delete.delay.ms`` after the segment was retired. Do not close it, and use it
    in the event-loop step that read it: the fd cache may close it after that.
    ``first_offset`` is the base offset of the first batch, which may lie below the offset
    asked for (a batch is never split). ``length`` 0 means nothing to read.

    ``data``: the bytes themselves, read at once (``fd`` -1), when this step's reads
    already hold the fd cache's bound of descriptors (see storage/fdcache.py).
    """

    fd: int
    path: Path | None
    position: int
    length: int
    first_offset: int
    data: bytes | None = None

    @classmethod
    def empty(cls, offset: int) -> FileSlice:
        return cls(-1, None, 0, 0, offset)

    def read(self) -> bytes:
        """The bytes, by one pread (the copy ``read_bytes`` hands out)."""
        if self.data is not None:
            return self.data
        if self.length == 0:
            return b""
        # May come back short if a follower truncated the file since the read was planned.
        return fs.pread(self.fd, self.length, self.position)
