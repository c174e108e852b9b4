"""Background-task policies and the process's fatal fault handler.

A background task that dies unnoticed leaves a node serving with part of its machinery
stopped (a frozen metadata image, no heartbeats, a follower that never fetches again),
which is worse than a crash. So every ``create_task`` in broker/ and controller/ picks
one of three policies (docs/broker.md, "Faults"):

- **fatal** (``on_death_fatal``): the task's death leaves the node's state suspect (the
  metadata image moved on but the partitions did not, no heartbeats...). Any exception
  goes to ``fatal_fault``, which logs the traceback and terminates the process with
  ``FATAL_EXIT_CODE`` after flushing the logs (Kafka: ProcessTerminatingFaultHandler).
  No controlled shutdown: a restart recovers from what is on disk.
- **restart** (``run_restarting``): harmless to retry; an unexpected exception is logged
  with its traceback and the loop starts again after a backoff.
- **expected to end** (``on_death_log``): a one-shot task; if it fails, its exception is
  logged at ERROR at once instead of as "Task exception was never retrieved" at GC time
  (or never).

It lives in client/runtime/ with the rest of what every node process shares, so that
broker/, controller/ and storage/ can all use it without importing each other.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)

FATAL_EXIT_CODE = 70  # EX_SOFTWARE: an internal error, distinct from a config error (2)
RESTART_BACKOFF_MIN_S = 0.1
RESTART_BACKOFF_MAX_S = 5.0

FatalHandler = Callable[[str, BaseException], None]
T = TypeVar("T")


def terminate_process(what: str, error: BaseException) -> None:
    """Log the fault with its traceback, flush, and exit at once (``os._exit``: no
    ``finally`` blocks, no clean-shutdown markers: the in-memory state is suspect)."""
    from rillet.client.runtime.shutdown import exit_process

    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        log.critical(
            "FATAL: %s; terminating the process (exit %d)\n%s", what, FATAL_EXIT_CODE, text
        )
    finally:
        exit_process(FATAL_EXIT_CODE)


_handler: FatalHandler = terminate_process


def set_fatal_handler(handler: FatalHandler) -> FatalHandler:
    """Replace the process's fatal fault handler (tests, embedding); returns the old one."""
    global _handler
    previous, _handler = _handler, handler
    return previous


def fatal_fault(what: str, error: BaseException) -> None:
    """Report a fault that leaves the process's state inconsistent."""
    _handler(what, error)


def on_death_fatal(task: asyncio.Task[T], what: str) -> asyncio.Task[T]:
    """Policy *fatal*: an exception ending ``task`` is a fatal fault. Cancellation (a
    stop) and a normal return (a loop that is meant to finish) are not."""

    def done(t: asyncio.Task[T]) -> None:
        if not t.cancelled() and (error := t.exception()) is not None:
            fatal_fault(what, error)

    task.add_done_callback(done)
    return task


def on_death_log(task: asyncio.Task[T], what: str) -> asyncio.Task[T]:
    """Policy *expected to end*: log an exception that ended ``task`` at ERROR, now."""

    def done(t: asyncio.Task[T]) -> None:
        if not t.cancelled() and (error := t.exception()) is not None:
            log.error("%s failed", what, exc_info=error)

    task.add_done_callback(done)
    return task


async def run_restarting(
    body: Callable[[], Awaitable[None]],
    what: str,
    *,
    backoff_min_s: float = RESTART_BACKOFF_MIN_S,
    backoff_max_s: float = RESTART_BACKOFF_MAX_S,
) -> None:
    """Policy *restart*: run ``body()`` until it returns; an exception is logged with
    its traceback and ``body`` starts again after a doubling backoff."""
    backoff_s = backoff_min_s
    while True:
        try:
            await body()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; restarting in %.2fs", what, backoff_s)
        await asyncio.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, backoff_max_s)
