"""An in-memory file system that crashes the way Linux may: `SimFileSystem`.

Installed with ``rillet.storage.fs.install(SimFileSystem())``, it serves every call the
storage code makes (see storage/fs.py). Deterministic: no real I/O, no clock, and every
random choice comes from the ``random.Random`` a caller passes.

Crash model (what POSIX allows and Linux file systems do):

- A file's bytes have a durable part (as of its last ``fsync``) and the current part (the
  page cache). A crash keeps the durable bytes, plus possibly a prefix of what changed
  since: a random length of the unsynced tail, sometimes ending in garbage (a torn last
  write); or, after an unsynced truncation, the old durable content.
- A directory's entries (create, rename, unlink) are durable only after ``fsync_dir`` of
  that directory; a crash reverts them, so a new file may vanish and a rename be undone.
  ``fsync`` of a file also persists its own entry only with ``fsync_persists_entry``
  (ext4 does for a new file; POSIX does not promise it): strict by default.
- ``crash(prefix, rng)`` applies that to every directory and file under ``prefix`` (the
  prefix directory itself is taken as durable: it is a node's data dir) and invalidates
  every descriptor opened under it: later use raises OSError(EBADF).
- Faults: ``fail_next`` fails the next matching operation once; ``fail_rate`` fails each
  matching operation with a probability. A failed ``write`` may have written a prefix of
  its data first, as a short write followed by ENOSPC leaves it.
- ``crash_after(n, prefix, rng)`` crashes just before the n-th next mutating operation
  under ``prefix`` and raises `SimCrash` there, so a crash can land inside any storage
  call (between a write and its fsync, a truncation and its checkpoint). The prefix then
  stays down (every operation under it raises `SimCrash`) until ``restart(prefix)``.

Descriptors are integers from ``FD_BASE`` up, never confused with real ones.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rillet.storage import batchwrite
from rillet.storage.fs import DirEntry

FD_BASE = 1 << 20
MUTATING = frozenset(
    {"create", "write", "fsync", "ftruncate", "replace", "unlink", "fsync_dir", "rmtree", "mkdir"}
)
OPS = MUTATING | {"open", "pread", "read", "listdir"}


class SimCrash(BaseException):
    """The node crashed inside a storage call. A BaseException: storage code catches
    OSError and Exception, and must not handle its own node's death."""


@dataclass(eq=False)
class Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""


@dataclass(eq=False)
class Dir:
    entries: dict[str, Inode | Dir] = field(default_factory=dict)
    durable: dict[str, Inode | Dir] = field(default_factory=dict)


@dataclass(eq=False)
class OpenFile:
    inode: Inode | None  # None: a directory or a lock descriptor
    path: str
    append: bool
    position: int = 0
    valid: bool = True


@dataclass
class Fault:
    op: str
    prefix: str
    errno: int


def _norm(path: Any) -> str:
    p = os.path.normpath(os.fspath(path))
    if not p.startswith("/"):
        raise ValueError(f"simulated paths are absolute: {p!r}")
    return "/" + p.lstrip("/")


def _under(path: str, prefix: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def _err(code: int, path: Any = None) -> OSError:
    if code == errno.ENOENT:
        return FileNotFoundError(code, os.strerror(code), path)
    if code == errno.EEXIST:
        return FileExistsError(code, os.strerror(code), path)
    if code == errno.EISDIR:
        return IsADirectoryError(code, os.strerror(code), path)
    if code == errno.ENOTDIR:
        return NotADirectoryError(code, os.strerror(code), path)
    return OSError(code, os.strerror(code), path)


class SimFileSystem:
    """The storage/fs.py interface over memory, with the crash model above."""

    def __init__(self, *, fsync_persists_entry: bool = False, rng: random.Random | None = None):
        self.fsync_persists_entry = fsync_persists_entry
        self.rng = rng or random.Random(0)  # for fail_rate
        self.root = Dir()
        self._fds: dict[int, OpenFile] = {}
        self._next_fd = FD_BASE
        self._faults: list[Fault] = []
        self._rates: list[tuple[str, str, float, int]] = []
        self._crash_at: tuple[int, str, random.Random] | None = None
        self._down: set[str] = set()
        self.crashes = 0
        self.injected: list[str] = []  # what fail_next / fail_rate made fail, in order

    # -- faults ------------------------------------------------------------------------

    def fail_next(self, op: str, prefix: str = "/", err: int = errno.EIO) -> None:
        """Fail the next ``op`` on a path under ``prefix`` once with ``err``."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        self._faults.append(Fault(op, _norm(prefix), err))

    def fail_rate(self, op: str, probability: float, prefix: str = "/", err: int = errno.EIO):
        """Fail each ``op`` under ``prefix`` with ``probability`` (self.rng decides)."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        self._rates.append((op, _norm(prefix), probability, err))

    def clear_faults(self) -> None:
        self._faults.clear()
        self._rates.clear()

    def crash_after(self, n: int, prefix: str, rng: random.Random) -> None:
        """Crash ``prefix`` just before its n-th next mutating operation (n >= 1)."""
        self._crash_at = (n, _norm(prefix), rng)

    def cancel_crash(self) -> None:
        self._crash_at = None

    def down(self, prefix: str) -> bool:
        """Whether an armed crash took ``prefix`` down (until ``restart``)."""
        return _norm(prefix) in self._down

    def restart(self, prefix: str) -> None:
        """A crashed node comes back: operations under ``prefix`` work again."""
        self._down.discard(_norm(prefix))

    def _op(self, op: str, path: str) -> None:
        """Before every operation: a down node, an armed crash, an injected fault."""
        for prefix in self._down:
            if _under(path, prefix):
                raise SimCrash(f"{path}: {prefix} is down")
        if self._crash_at is not None and op in MUTATING:
            n, prefix, rng = self._crash_at
            if _under(path, prefix):
                if n > 1:
                    self._crash_at = (n - 1, prefix, rng)
                else:
                    self._crash_at = None
                    self.crash(prefix, rng)
                    self._down.add(prefix)
                    raise SimCrash(f"crashed before {op} {path}")
        for i, fault in enumerate(self._faults):
            if fault.op == op and _under(path, fault.prefix):
                del self._faults[i]
                self.injected.append(f"{op} {path}")
                raise _err(fault.errno, path)
        for rop, prefix, probability, err in self._rates:
            if rop == op and _under(path, prefix) and self.rng.random() < probability:
                self.injected.append(f"{op} {path}")
                raise _err(err, path)

    # -- the crash ---------------------------------------------------------------------

    def crash(self, prefix: str, rng: random.Random) -> None:
        """Lose what was not durable under ``prefix`` (see the module docstring)."""
        prefix = _norm(prefix)
        top = self._lookup(prefix)
        if not isinstance(top, Dir):
            raise NotADirectoryError(prefix)
        self.crashes += 1
        dirs: list[Dir] = []
        inodes: dict[int, Inode] = {}
        stack = [top]
        seen: set[int] = set()
        while stack:
            d = stack.pop()
            if id(d) in seen:
                continue
            seen.add(id(d))
            dirs.append(d)
            for node in (*d.entries.values(), *d.durable.values()):
                if isinstance(node, Dir):
                    stack.append(node)
                else:
                    inodes[id(node)] = node
        for d in dirs:
            d.entries = dict(d.durable)
        for inode in inodes.values():  # in discovery order: deterministic
            self._revert(inode, rng)
        for of in self._fds.values():
            if _under(of.path, prefix):
                of.valid = False

    @staticmethod
    def _revert(inode: Inode, rng: random.Random) -> None:
        cur, dur = bytes(inode.data), inode.durable
        if cur == dur:
            return
        if rng.random() < 0.3:
            inode.data = bytearray(dur)  # nothing since the fsync reached the disk
            return
        same = 0
        limit = min(len(cur), len(dur))
        while same < limit and cur[same] == dur[same]:
            same += 1
        if same == len(cur) and rng.random() < 0.5:
            inode.data = bytearray(dur)  # an unsynced truncation undone
            return
        kept = rng.randint(0, len(cur) - same)  # a prefix of what changed since the fsync
        data = bytearray(cur[: same + kept])
        if kept and rng.random() < 0.3:  # the last write torn: its end is garbage
            bad = rng.randint(1, kept)
            fill = bytes(bad) if rng.random() < 0.5 else rng.randbytes(bad)
            data[len(data) - bad :] = fill
        inode.data = data
        inode.durable = bytes(data)

    def sync_all(self) -> None:
        """Make everything durable (a test's clean starting point)."""
        stack = [self.root]
        while stack:
            d = stack.pop()
            d.durable = dict(d.entries)
            for node in d.entries.values():
                if isinstance(node, Dir):
                    stack.append(node)
                else:
                    node.durable = bytes(node.data)

    # -- namespace -----------------------------------------------------------------------

    def _lookup(self, path: str) -> Inode | Dir | None:
        node: Inode | Dir | None = self.root
        for part in path.split("/")[1:]:
            if not part:
                continue
            if not isinstance(node, Dir):
                return None
            node = node.entries.get(part)
        return node

    def _parent(self, path: str) -> tuple[Dir, str]:
        head, name = os.path.split(path)
        parent = self._lookup(head)
        if parent is None:
            raise _err(errno.ENOENT, path)
        if not isinstance(parent, Dir):
            raise _err(errno.ENOTDIR, path)
        return parent, name

    def _file(self, fd: int) -> OpenFile:
        of = self._fds.get(fd)
        if of is not None and not of.valid:
            for prefix in self._down:  # the dying process itself (a finally: close)
                if _under(of.path, prefix):
                    raise SimCrash(f"{of.path}: {prefix} is down")
        if of is None or not of.valid:
            raise _err(errno.EBADF)
        return of

    def _inode(self, fd: int, op: str) -> tuple[OpenFile, Inode]:
        of = self._file(fd)
        self._op(op, of.path)
        if of.inode is None:
            raise _err(errno.EISDIR, of.path)
        return of, of.inode

    # -- the fs interface ------------------------------------------------------------

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        p = _norm(path)
        parent, name = self._parent(p)
        node = parent.entries.get(name)
        if node is None:
            if not flags & os.O_CREAT:
                self._op("open", p)
                raise _err(errno.ENOENT, p)
            self._op("create", p)
            node = parent.entries[name] = Inode()
        else:
            self._op("open", p)
            if flags & os.O_CREAT and flags & os.O_EXCL:
                raise _err(errno.EEXIST, p)
            if isinstance(node, Dir):
                if flags & (os.O_WRONLY | os.O_RDWR):
                    raise _err(errno.EISDIR, p)
            elif flags & os.O_TRUNC:
                self._op("ftruncate", p)
                del node.data[:]
        fd = self._next_fd
        self._next_fd += 1
        inode = node if isinstance(node, Inode) else None
        self._fds[fd] = OpenFile(inode, p, append=bool(flags & os.O_APPEND))
        return fd

    def close(self, fd: int) -> None:
        self._file(fd)
        del self._fds[fd]

    def write(self, fd: int, data: Any) -> int:
        of = self._file(fd)
        view = memoryview(data).cast("B")
        try:
            of, inode = self._inode(fd, "write")
        except SimCrash:
            raise
        except OSError:
            if of.inode is not None and len(view):  # a short write, then the error
                self._put(of, of.inode, bytes(view[: self.rng.randint(0, len(view) - 1)]))
            raise
        self._put(of, inode, bytes(view))
        return len(view)

    @staticmethod
    def _put(of: OpenFile, inode: Inode, data: bytes) -> None:
        pos = len(inode.data) if of.append else of.position
        if pos > len(inode.data):
            inode.data.extend(bytes(pos - len(inode.data)))
        inode.data[pos : pos + len(data)] = data
        of.position = pos + len(data)

    def writev(self, fd: int, buffers: Iterable[Any]) -> int:
        return self.write(fd, b"".join(bytes(memoryview(b).cast("B")) for b in buffers))

    def write_batch(self, fd: int, data: Any, base: int, epoch: int, max_size: int, delta: int):
        return batchwrite.write_batch_py(
            fd, data, base, epoch, max_size, delta, write=self.write, writev=self.writev
        )

    def pread(self, fd: int, n: int, position: int) -> bytes:
        _, inode = self._inode(fd, "pread")
        return bytes(inode.data[position : position + n])

    def fsync(self, fd: int) -> None:
        of, inode = self._inode(fd, "fsync")
        inode.durable = bytes(inode.data)
        if self.fsync_persists_entry:
            parent, name = self._parent(of.path)
            if parent.entries.get(name) is inode:
                parent.durable[name] = inode

    def fstat_size(self, fd: int) -> int:
        of = self._file(fd)
        return len(of.inode.data) if of.inode is not None else 0

    def ftruncate(self, fd: int, length: int) -> None:
        _, inode = self._inode(fd, "ftruncate")
        if length <= len(inode.data):
            del inode.data[length:]
        else:
            inode.data.extend(bytes(length - len(inode.data)))

    def replace(self, src: Any, dst: Any) -> None:
        s, d = _norm(src), _norm(dst)
        self._op("replace", s)
        sp, sname = self._parent(s)
        dp, dname = self._parent(d)
        if sname not in sp.entries:
            raise _err(errno.ENOENT, s)
        node = sp.entries.pop(sname)
        dp.entries[dname] = node

    def unlink(self, path: Any, missing_ok: bool = False) -> None:
        p = _norm(path)
        self._op("unlink", p)
        parent, name = self._parent(p)
        node = parent.entries.get(name)
        if node is None:
            if missing_ok:
                return
            raise _err(errno.ENOENT, p)
        if isinstance(node, Dir):
            raise _err(errno.EISDIR, p)
        del parent.entries[name]

    def listdir(self, path: Any) -> list[str]:
        p = _norm(path)
        self._op("listdir", p)
        node = self._lookup(p)
        if node is None:
            raise _err(errno.ENOENT, p)
        if not isinstance(node, Dir):
            raise _err(errno.ENOTDIR, p)
        return sorted(node.entries)

    def scandir(self, path: Any) -> list[DirEntry]:
        p = _norm(path)
        names = self.listdir(p)
        node = self._lookup(p)
        assert isinstance(node, Dir)
        return [DirEntry(n, f"{p}/{n}", isinstance(node.entries[n], Dir)) for n in names]

    def stat_size(self, path: Any) -> int:
        p = _norm(path)
        node = self._lookup(p)
        if node is None:
            raise _err(errno.ENOENT, p)
        return len(node.data) if isinstance(node, Inode) else 0

    def exists(self, path: Any) -> bool:
        return self._lookup(_norm(path)) is not None

    def makedirs(self, path: Any) -> None:
        p = _norm(path)
        node: Inode | Dir = self.root
        walked = ""
        for part in p.split("/")[1:]:
            if not part:
                continue
            walked += "/" + part
            assert isinstance(node, Dir)
            child = node.entries.get(part)
            if child is None:
                self._op("mkdir", walked)
                child = node.entries[part] = Dir()
            elif not isinstance(child, Dir):
                raise _err(errno.ENOTDIR, walked)
            node = child

    def read_bytes(self, path: Any) -> bytes:
        p = _norm(path)
        self._op("read", p)
        node = self._lookup(p)
        if node is None:
            raise _err(errno.ENOENT, p)
        if isinstance(node, Dir):
            raise _err(errno.EISDIR, p)
        return bytes(node.data)

    def read_text(self, path: Any) -> str:
        return self.read_bytes(path).decode()

    def rmtree(self, path: Any) -> None:
        p = _norm(path)
        self._op("rmtree", p)
        try:
            parent, name = self._parent(p)
        except OSError:
            return
        parent.entries.pop(name, None)

    def fsync_dir(self, path: Any) -> None:
        p = _norm(path)
        self._op("fsync_dir", p)
        node = self._lookup(p)
        if node is None:
            raise _err(errno.ENOENT, p)
        if not isinstance(node, Dir):
            raise _err(errno.ENOTDIR, p)
        node.durable = dict(node.entries)

    def lock_file(self, path: Any) -> int:
        return self.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    # -- for checkers ----------------------------------------------------------------

    def is_durable(self, path: Any) -> bool:
        """Whether a crash now would leave this file's bytes exactly as they are."""
        node = self._lookup(_norm(path))
        if not isinstance(node, Inode):
            raise _err(errno.ENOENT, path)
        return bytes(node.data) == node.durable

    def open_fds(self, prefix: str = "/") -> list[int]:
        prefix = _norm(prefix)
        return [fd for fd, of in self._fds.items() if of.valid and _under(of.path, prefix)]
