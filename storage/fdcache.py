"""A bound on the segment file descriptors one process keeps open.

A log keeps its active segment's descriptor open for appends, and a closed segment's
once read. With thousands of partitions per broker that is thousands of descriptors,
past the common default soft limit of 1024. Kafka keeps them all and asks operators to
raise ``ulimit -n``; here the ``FdCache`` closes idle ones and the segment reopens its
file on the next access (``LogSegment.fd``).

What may be closed, and when:

- Clean segments (nothing written or cut through them since their last fsync began)
  before dirty ones with the same read mark (below). A dirty descriptor closed with
  unsynced data loses nothing: the page cache holds dirty pages per inode, not per
  descriptor, so the data is written back as usual, and the segment's next fsync (a
  flush, a roll's job, close) reopens the file and fsyncs it, which POSIX defines as
  flushing the *file*. A writeback error in between is reported to the reopened
  descriptor's fsync (Linux 4.16 on: an error no descriptor has seen is reported to the
  next one opened), and that fails the log as any failed fsync does.
- Never one handed out in the current event-loop step: a read hands out the descriptor
  in a ``FileSlice`` that its caller uses in the same step (the fetch path reads every
  partition, then the RPC server copies or dup()s each range, with no await between),
  so the protection ends with the step (``hand_out``). It must not last longer: a
  follower fetching every partition each round would otherwise keep every descriptor
  open, whatever the bound. Nor may one step hand out more than the bound: past it, a
  read returns its bytes instead (``LogSegment.slice``), or a fetch of N partitions
  would hold N descriptors.
- Preferably one not read since the last ``sweep`` (a read mark, as a CLOCK cache's
  reference bit): a segment being read is likely read again soon.
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

The bound is a target, not a hard limit: pinned descriptors and retired ones stay open
past it, and a step holds at most the bound's worth handed out plus the one being read;
an open past the bound closes down to an eighth below it.
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
        # Segments whose descriptor a read handed out in this event-loop step: kept open
        # until the step ends (``_end_step``, scheduled once per step), or with no loop
        # running (a simulation), until the next sweep.
        self._handed: list[LogSegment] = []
        self._end_loop: asyncio.AbstractEventLoop | None = None  # where _end_step waits
        self._exhausted = False  # the last eviction found nothing: wait for the step's end
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

    def hand_out(self, seg: LogSegment) -> None:
        """Keep ``seg``'s descriptor open until this event-loop step ends: a read is
        handing it out (a ``FileSlice``, ``LogSegment.slice``). Event-loop thread only."""
        seg._handed = True
        self._handed.append(seg)
        if self._end_loop is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no steps: released at the next sweep
        loop.call_soon(self._end_step)
        self._end_loop = loop

    def handed_out_full(self) -> bool:
        """Whether this step's reads hold the bound's worth of descriptors: a read then
        returns its bytes rather than one more descriptor."""
        return len(self._handed) >= self.max_open

    def close_if_over(self, seg: LogSegment) -> None:
        """Close ``seg``'s descriptor now if the cache is past its bound and nothing
        holds it: a read that copied its bytes since this step's reads hold the bound
        (each such read would otherwise leave one more open until the step ends)."""
        with self.lock:
            fd = seg._fd
            if len(self._open) <= self.max_open or fd is None:
                return
            if seg._pins or seg._handed or seg._retired:
                return
            self._open.pop(seg, None)
            seg._fd = None
            fs.close(fd)
        self.evictions += 1

    def _end_step(self) -> None:
        for seg in self._handed:
            seg._handed = False
        self._handed.clear()
        self._end_loop = None
        self._exhausted = False

    def closed(self, seg: LogSegment) -> None:
        """``seg`` closed its own descriptor (caller holds ``lock``)."""
        self._open.pop(seg, None)

    def sweep(self) -> int:
        """The periodic pass (event-loop thread): close descriptors beyond the bound,
        those not read since the last sweep first, and clear the read marks. Returns how
        many were closed."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        # Release what earlier steps handed out, not this one's (a sweep is a step of its
        # own in the broker); a loop that closed before its _end_step ran leaves them too.
        if self._end_loop is None or self._end_loop is not running:
            self._end_step()
        return self._evict(clear=True, keep=None)

    def trim(self) -> int:
        """Close descriptors down to the bound, keeping the read marks (what an open
        past the bound does). On the event-loop thread only."""
        return self._evict(clear=False, keep=None)

    def _evict(self, *, clear: bool, keep: LogSegment | None) -> int:
        with self.lock:
            over = len(self._open) - self.max_open
            if over <= 0 and not clear:
                return 0
            # An open past the bound closes down to an eighth below it: a stream of
            # reopens (appends to more partitions than the bound) then pays one scan of
            # the open set per max_open / 8 closes, not one per reopen.
            excess = over + (self.max_open // 8 if over > 0 and not clear else 0)
            # Not read since the last sweep before read, clean before dirty (a dirty one's
            # next fsync opens a descriptor of its own).
            unread_clean: list[LogSegment] = []
            unread_dirty: list[LogSegment] = []
            read_clean: list[LogSegment] = []
            read_dirty: list[LogSegment] = []
            for seg in self._open:
                used = seg._used
                if clear:
                    seg._used = False
                elif excess <= len(unread_clean):
                    break
                if seg is keep or seg._pins or seg._handed or excess <= 0:
                    continue
                if seg._writes == seg._synced:
                    (read_clean if used else unread_clean).append(seg)
                else:
                    (read_dirty if used else unread_dirty).append(seg)
            ranked = unread_clean + unread_dirty + read_clean + read_dirty
            victims = ranked[: max(excess, 0)]
            for seg in victims:
                del self._open[seg]
                fd = seg._fd
                if fd is not None:
                    seg._fd = None
                    fs.close(fd)
            if not clear and len(victims) < over:
                self._exhausted = True  # all in use or pinned until this step ends
        self.evictions += len(victims)
        return len(victims)
