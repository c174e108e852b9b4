"""The one place storage touches the file system.

Every storage module calls these functions (``fs.write(fd, data)``) instead of ``os``,
``shutil`` or ``Path`` I/O, so a test can swap the whole file system for a simulated one
that loses unsynced writes on a crash, tears the last write and injects I/O errors
(tests/sim/simfs.py). By default each name is bound to the ``os`` call itself, so the
hot paths (append, pread) cost what they cost before: one module attribute lookup, as
``os.write`` is. ``install(impl)`` rebinds every name to ``impl``'s methods until it
exits; one process-wide file system at a time (the simulator gives each node its own
directory prefix). tests/test_layering.py keeps other storage modules off ``os``.

Descriptors from here are real ones in production: the broker sends ``FileSlice``
ranges with ``os.sendfile`` on them, which never runs under a simulated file system.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from typing import Any, NamedTuple

from rillet.storage import batchwrite

PathLike = str | os.PathLike

# Flags callers combine (plain ints, the same under any implementation).
O_RDONLY = os.O_RDONLY
O_WRONLY = os.O_WRONLY
O_RDWR = os.O_RDWR
O_CREAT = os.O_CREAT
O_EXCL = os.O_EXCL
O_TRUNC = os.O_TRUNC
O_APPEND = os.O_APPEND


class DirEntry(NamedTuple):
    name: str
    path: str
    is_dir: bool


# -- the os implementation (rebound by install) ----------------------------------------

open = os.open  # noqa: A001 (the fs call, as os.open)
close = os.close
write = os.write
writev = os.writev
pread = os.pread
fsync = os.fsync
ftruncate = os.ftruncate
replace = os.replace
listdir = os.listdir
write_batch = batchwrite.write_batch  # the native one where built: writes with write(2)


def fstat_size(fd: int) -> int:
    return os.fstat(fd).st_size


def stat_size(path: PathLike) -> int:
    return os.stat(path).st_size


def exists(path: PathLike) -> bool:
    return os.path.exists(path)


def unlink(path: PathLike, missing_ok: bool = False) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def scandir(path: PathLike) -> list[DirEntry]:
    with os.scandir(path) as it:
        return [DirEntry(e.name, e.path, e.is_dir()) for e in it]


def makedirs(path: PathLike) -> None:
    os.makedirs(path, exist_ok=True)


def read_bytes(path: PathLike) -> bytes:
    with builtins.open(path, "rb") as f:
        return f.read()


def read_text(path: PathLike) -> str:
    return read_bytes(path).decode()


def rmtree(path: PathLike) -> None:
    """Remove a directory tree; what is already gone is no error."""
    shutil.rmtree(path, ignore_errors=True)


def fsync_dir(path: PathLike) -> None:
    """Make renames, creations and unlinks in a directory durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_file(path: PathLike) -> int:
    """Open ``path`` and hold an exclusive advisory lock on it (the data-dir lock);
    BlockingIOError when another process holds it. Release with ``close``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return fd


# -- swapping the implementation ---------------------------------------------------------

NAMES = (
    "open",
    "close",
    "write",
    "writev",
    "pread",
    "fsync",
    "ftruncate",
    "replace",
    "listdir",
    "write_batch",
    "fstat_size",
    "stat_size",
    "exists",
    "unlink",
    "scandir",
    "makedirs",
    "read_bytes",
    "read_text",
    "rmtree",
    "fsync_dir",
    "lock_file",
)
_OS = {name: globals()[name] for name in NAMES}
_installed: list[Any] = []


@contextlib.contextmanager
def install(impl: Any) -> Iterator[Any]:
    """Route every call above to ``impl``'s methods of the same names until exit."""
    if _installed:
        raise RuntimeError("a file system is already installed")
    missing = [n for n in NAMES if not callable(getattr(impl, n, None))]
    if missing:
        raise TypeError(f"{type(impl).__name__} lacks {', '.join(missing)}")
    g = globals()
    _installed.append(impl)
    for name in NAMES:
        g[name] = getattr(impl, name)
    try:
        yield impl
    finally:
        g.update(_OS)
        _installed.clear()
