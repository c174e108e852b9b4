"""A bound on the segment file descriptors one process keeps open.

A log keeps its active segment's descriptor open for appends, and a closed segment's
once read. With thousands of partitions per broker that is thousands of descriptors,
past the common default soft limit of 1024. Kafka keeps them all and asks operators to
raise ``ulimit -n``; here the ``FdCache`` closes idle ones and the segment reopens its
file on the next access (``LogSegment.fd``).

What may be closed, and when:

- Clean segments first (nothing written or cut through them since their last fsync
  began), then dirty ones. A dirty descriptor closed with unsynced data loses nothing:
  the page cache holds dirty pages per inode, not per descriptor, so the data is written
  back as usual, and the segment's next fsync (a flush, a roll's job, close) reopens the
  file and fsyncs it, which POSIX defines as flushing the *file*. A writeback error in
  between is reported to the reopened descriptor's fsync (Linux 4.16 on: an error no
  descriptor has seen is reported to the next one opened), and that fails the log as
  any failed fsync does.
- Only a segment not touched since the last ``sweep`` (second chance, as a CLOCK cache):
  a read hands out the descriptor in a ``FileSlice`` that its caller uses in the same
  event-loop step, and a sweep is a step of its own, so a descriptor handed out is never
  closed before its caller is done with it.
- Never a pinned one: executor threads (fsync jobs, the cleaner) pin a segment while
  they use its descriptor. A segment's own ``close`` (a purge of a retired segment, a
  log's close) waits for them too: the last ``unpin`` closes it. Closed under a thread
  still using it, the descriptor's number would go to the next file opened, and that
  thread's fsync or pread would reach the wrong file.
- Never a retired one (``forget``): retention, truncation and compaction take segments
  out of the log but keep their descriptors until file.delete.delay.ms has passed, for
  reads already handed out; their paths are renamed or name another file by then, so
  they are never reopened either.
- Only on the event-loop thread, the one thread that appends and reads without the lock;
  closes and thread-side uses hold ``lock``.

The bound is a target, not a hard limit: pinned and recently used descriptors stay open
past it until the next sweep.
"""

from __future__ import annotations

import asyncio
import resource
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from rillet.storage import fs
from rillet.storage.invariants import invariant

if TYPE_CHECKING:
    from rillet.storage.segment import LogSegment

# At most this many, and at most a quarter of the soft RLIMIT_NOFILE: sockets, the Raft
# and checkpoint files, index files and retired segments' descriptors need the rest.
DEFAULT_MAX_OPEN = 1024


def default_max_open() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_OPEN
    return max(16, min(DEFAULT_MAX_OPEN, soft // 4))


def _on_loop_thread() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class FdCache:
    def __init__(
        self,
        max_open: int = DEFAULT_MAX_OPEN,
        *,
        on_loop_thread: Callable[[], bool] = _on_loop_thread,
    ) -> None:
        self.max_open = max_open
        # Whether the caller is the one thread that may close descriptors (see above). A
        # single-threaded simulation, which runs no event loop between its coroutines,
        # passes ``lambda: True``.
        self.on_loop_thread = on_loop_thread
        self.lock = threading.Lock()
        self._open: dict[LogSegment, None] = {}  # registered segments holding a descriptor
        self._exhausted = False  # the last eviction found nothing: wait for a sweep
        self.evictions = 0
        self.reopens = 0

    def __len__(self) -> int:
        return len(self._open)

    def fd_of(self, seg: LogSegment) -> int:
        """``seg``'s descriptor, opening its file (and evicting idle ones) if closed."""
        with self.lock:
            fd = seg._fd
            if seg._retired:
                # Its path is renamed or names another file now: never reopened.
                invariant(fd is not None, f"{seg.log_path}: a retired segment reopened")
                assert fd is not None  # for the type checker
                return fd
            if fd is None:
                fd = seg._fd = fs.open(seg.log_path, fs.O_RDWR | fs.O_APPEND)
                if seg._ever_opened:
                    self.reopens += 1
                seg._ever_opened = True
            self._open[seg] = None
            over = len(self._open) > self.max_open and not self._exhausted
        if over and self.on_loop_thread():
            self._evict(clear=False, keep=seg)
        return fd

    def adopt(self, seg: LogSegment) -> None:
        """Put ``seg`` (already holding a descriptor or not) under this cache."""
        with self.lock:
            seg._cache = self
            if seg._fd is not None:
                seg._ever_opened = True
                self._open[seg] = None

    def forget(self, seg: LogSegment) -> None:
        """Take ``seg`` out for good (retired: its descriptor must outlive its path, for
        reads handed out): never closed by eviction, never reopened. It keeps this
        cache's lock, so its close still waits for threads that pinned it."""
        with self.lock:
            self._open.pop(seg, None)
            seg._retired = True

    def closed(self, seg: LogSegment) -> None:
        """``seg`` closed its own descriptor (caller holds ``lock``)."""
        self._open.pop(seg, None)

    def sweep(self) -> int:
        """The periodic pass (event-loop thread): clear every use mark, close idle clean
        descriptors beyond the bound. Returns how many were closed."""
        self._exhausted = False
        return self._evict(clear=True, keep=None)

    def trim(self) -> int:
        """Close idle descriptors down to the bound, keeping the use marks (what an open
        past the bound does). On the event-loop thread only."""
        return self._evict(clear=False, keep=None)

    def _evict(self, *, clear: bool, keep: LogSegment | None) -> int:
        with self.lock:
            excess = len(self._open) - self.max_open
            clean: list[LogSegment] = []
            dirty: list[LogSegment] = []
            for seg in list(self._open):
                if seg._used:
                    if clear:
                        seg._used = False
                    continue
                if seg is keep or seg._pins or excess <= 0:
                    continue
                if seg._writes == seg._synced:
                    clean.append(seg)
                    if not clear and len(clean) >= excess:
                        break
                else:
                    dirty.append(seg)
            victims = (clean + dirty)[: max(excess, 0)]  # clean ones first
            for seg in victims:
                del self._open[seg]
                fd = seg._fd
                if fd is not None:
                    seg._fd = None
                    fs.close(fd)
            if not clear and len(victims) < excess:
                self._exhausted = True  # nothing more to close until the next sweep
        self.evictions += len(victims)
        return len(victims)
