"""Walk the batches of a segment file, validating each one, in large sequential reads.

Used by recovery, ``rillet log verify|dump`` and the cleaner. The scanner stops at the
first batch that is torn (runs past the end of the file), corrupt (bad magic, length or
CRC) or out of order (offsets going backwards), and reports where and why, so the caller
can cut the file there or print the position.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rillet.client.wire import records
from rillet.client.wire.errors import CorruptRecordError
from rillet.client.wire.records import HEADER_SIZE, LOG_OVERHEAD, BatchHeader
from rillet.storage import fs

CHUNK_BYTES = 1 << 20


@dataclass(slots=True)
class ScanProblem:
    position: int
    reason: str


class BatchScanner:
    """Iterate ``(position, header, view)`` over a file from ``start``; see ``problem``.

    ``view`` is a memoryview of the whole batch, valid until the next step. After the
    loop, ``end`` is the position just past the last good batch and ``problem`` says why
    the scan stopped early (None when the file ended cleanly on a batch boundary).
    """

    def __init__(
        self,
        fd: int,
        *,
        start: int = 0,
        end: int | None = None,
        min_offset: int = 0,
        validate: bool = True,
    ) -> None:
        self.fd = fd
        self.end = start
        self.limit = fs.fstat_size(fd) if end is None else end
        self.next_offset = min_offset
        self.validate = validate
        self.problem: ScanProblem | None = None
        self.bytes_read = 0

    def __iter__(self) -> Iterator[tuple[int, BatchHeader, memoryview]]:
        buf = b""
        buf_pos = self.end  # file position of buf[0]
        while self.end < self.limit:
            off = self.end - buf_pos
            if len(buf) - off < HEADER_SIZE or len(buf) - off < self._size_at(buf, off):
                buf, buf_pos = self._read_from(self.end), self.end
                off = 0
            header = self._check(buf, off)
            if header is None:
                return
            size = header.batch_length + LOG_OVERHEAD
            yield self.end, header, memoryview(buf)[off : off + size]
            self.end += size
            self.next_offset = header.next_offset

    @staticmethod
    def _size_at(buf: bytes, off: int) -> int:
        return records.read_header(buf, off).batch_length + LOG_OVERHEAD

    def _read_from(self, pos: int) -> bytes:
        """Read a chunk at ``pos``, enlarged to hold a whole batch bigger than a chunk."""
        want = min(CHUNK_BYTES, self.limit - pos)
        data = fs.pread(self.fd, want, pos)
        if len(data) >= HEADER_SIZE:
            size = self._size_at(data, 0)
            if len(data) < size <= self.limit - pos:
                data += fs.pread(self.fd, size - len(data), pos + len(data))
        self.bytes_read += len(data)
        return data

    def _check(self, buf: bytes, off: int) -> BatchHeader | None:
        try:
            if self.validate:
                header = records.validate_batch(buf, off)
            else:
                header = records.read_header(buf, off)
                size = header.batch_length + LOG_OVERHEAD
                if size < HEADER_SIZE or size > len(buf) - off:  # never loop in place
                    raise CorruptRecordError(f"batch length {header.batch_length} impossible")
        except CorruptRecordError as e:
            self.problem = ScanProblem(self.end, str(e))
            return None
        if header.base_offset < self.next_offset:
            self.problem = ScanProblem(
                self.end,
                f"offsets go backwards: batch base offset {header.base_offset} "
                f"after next offset {self.next_offset}",
            )
            return None
        return header


def read_header_at(fd: int, position: int) -> BatchHeader:
    """One batch header by pread (61 bytes); CorruptRecordError if it is not all there."""
    return records.read_header(fs.pread(fd, HEADER_SIZE, position))
