"""A bound on the segment file descriptors one process keeps open.

A log keeps its active segment's descriptor open for appends, and a closed segment's
once read. With thousands of partitions per broker that is thousands of descriptors,
past the common default soft limit of 1024. Kafka keeps them all and asks operators to
raise ``ulimit -n``; here the ``FdCache`` closes idle ones and the segment reopens its
file on the next access (``LogSegment.fd``).

What may be closed, and when:

- Only a *clean* segment: nothing written (or truncated) through it since its last
  fsync began. A dirty descriptor stays open until a flush, a roll's job or the
  manager's periodic checkpoint fsyncs it, so every fsync the log relies on runs on a
  descriptor that saw the writes. (Linux keeps dirty pages per inode, so an fsync via a
  reopened descriptor would cover them too, and since 4.13 it reports a writeback error
  that happened meanwhile; keeping dirty ones open does not depend on either.)
- Only a segment not touched since the last ``sweep`` (second chance, as a CLOCK cache):
  a read hands out the descriptor in a ``FileSlice`` that its caller uses in the same
  event-loop step, and a sweep is a step of its own, so a descriptor handed out is never
  closed before its caller is done with it.
- Never a pinned one: executor threads (fsync jobs, the cleaner) pin a segment while
  they use its descriptor.
- Only on the event-loop thread, the one thread that appends and reads without the lock;
  closes and thread-side uses hold ``lock``.

The bound is a target, not a hard limit: descriptors that are dirty, pinned or recently
used stay open past it (a broker writing to 10,000 partitions at once needs their
descriptors until the next flush).
"""

from __future__ import annotations

import asyncio
import resource
import threading
from typing import TYPE_CHECKING

from rillet.storage import fs

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
    def __init__(self, max_open: int = DEFAULT_MAX_OPEN) -> None:
        self.max_open = max_open
        self.lock = threading.Lock()
        self._open: dict[LogSegment, None] = {}  # registered segments holding a descriptor
        self._exhausted = False  # the last eviction found nothing: wait for a sweep
        self.evictions = 0
        self.reopens = 0

    def __len__(self) -> int:
        return len(self._open)

    def open(self, seg: LogSegment) -> int:
        """``seg``'s descriptor, opening its file (and evicting idle ones) if closed."""
        with self.lock:
            fd = seg._fd
            if fd is None:
                fd = seg._fd = fs.open(seg.log_path, fs.O_RDWR | fs.O_APPEND)
                if seg._ever_opened:
                    self.reopens += 1
                seg._ever_opened = True
            self._open[seg] = None
            over = len(self._open) > self.max_open and not self._exhausted
        if over and _on_loop_thread():
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
        """Take ``seg`` out (retired: its descriptor must outlive its path); keeps the fd."""
        with self.lock:
            self._open.pop(seg, None)
            seg._cache = None

    def closed(self, seg: LogSegment) -> None:
        """``seg`` closed its own descriptor (caller holds ``lock``)."""
        self._open.pop(seg, None)

    def sweep(self) -> int:
        """The periodic pass (event-loop thread): clear every use mark, close idle clean
        descriptors beyond the bound. Returns how many were closed."""
        self._exhausted = False
        return self._evict(clear=True, keep=None)

    def trim(self) -> int:
        """Close idle clean descriptors down to the bound, keeping the use marks: on the
        event-loop thread, or while none of the cache's logs is served yet."""
        return self._evict(clear=False, keep=None)

    def _evict(self, *, clear: bool, keep: LogSegment | None) -> int:
        closed = 0
        with self.lock:
            excess = len(self._open) - self.max_open
            for seg in list(self._open):
                if excess <= 0 and not clear:
                    break
                if seg._used:
                    if clear:
                        seg._used = False
                    continue
                if excess <= 0 or seg is keep or seg._pins or seg._writes != seg._synced:
                    continue
                fd = seg._fd
                del self._open[seg]
                if fd is not None:
                    seg._fd = None
                    fs.close(fd)
                    closed += 1
                excess -= 1
            if not clear and excess > 0:
                self._exhausted = True  # nothing evictable until the next sweep
        self.evictions += closed
        return closed
