"""What asks a node process to stop, and how urgently (docs/design.md, "Processes").

- The first SIGTERM or SIGINT asks for a clean stop: a broker's controlled shutdown
  (bounded by ``controlled.shutdown.timeout.ms``), a controller's leadership hand-over,
  then every log flushed and closed with its clean-shutdown marker.
- A second one means "now" (as a Kafka broker exits on a second signal): whatever the
  stop still waits for from other nodes is cut short, the logs are closed if that
  finishes within ``URGENT_EXIT_S``, and the process exits at that bound regardless. A
  third signal exits at once.
- Once the stop has finished, the process ends with ``exit_process``: threads still
  blocked in I/O that cannot be interrupted (a call to a hung S3) must not hold it.
- The node's owner exiting (``RILLET_OWNER``, set by `rillet cluster up` for the nodes
  it runs in the foreground) asks for a stop without the controlled shutdown: the whole
  cluster is going away, so moving leaderships around first would only add waiting.
  Nodes run in sessions of their own (Ctrl-C in the owner's terminal must reach the
  owner, which stops the brokers before the controllers), so nothing else would tell
  them that a killed owner is gone.

The owner is named by pid and start time (``pid:ticks``, the start time in clock ticks
since boot from /proc), so a recycled pid is not taken for the owner. On Linux the node
waits on a pidfd (readable once the process exits); elsewhere it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rillet.client.wire.errors import InvalidConfigError

log = logging.getLogger(__name__)

OWNER_ENV = "RILLET_OWNER"
URGENT_EXIT_S = 5.0  # after a second signal: the longest the logs may take to close
URGENT_EXIT_CODE = 1
OWNER_POLL_S = 1.0  # without pidfds only
T = TypeVar("T")


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None when it does not
    exist (or is a zombie), or without /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22, starttime


def owner_value(pid: int, start_time: int | None) -> str:
    """The ``RILLET_OWNER`` value naming process ``pid`` (started at ``start_time``)."""
    return f"{pid}:{'' if start_time is None else start_time}"


async def unless_set(event: asyncio.Event | None, work: Awaitable[T]) -> T | None:
    """``await work``, unless ``event`` is set first: then ``work`` is cancelled and the
    answer is None. How a stop skips what it waits for from other nodes once a second
    signal says "now"."""
    if event is None:
        return await work
    task = asyncio.ensure_future(work)
    cut = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([task, cut], return_when=asyncio.FIRST_COMPLETED)
    finally:
        cut.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return None


def exit_process(code: int) -> None:
    """Flush the logging handlers and stdio, then end the process at once (``os._exit``).

    A node calls it once its stop has finished (every log closed and fsynced, the
    checkpoints written), so nothing is left that an orderly interpreter exit would
    still save. What that exit would do instead is join every worker thread of every
    ``ThreadPoolExecutor`` (concurrent.futures' exit hook), and a thread blocked in a
    call that cannot be interrupted (a boto3 request to a hung S3: 4 attempts of a 30 s
    read timeout) would keep the stopped node alive for minutes. Daemon threads would
    not be joined, but a daemon thread still running while the interpreter finalizes
    can crash it, and every pool of every library would have to use them."""
    try:
        logging.shutdown()  # flushes every handler
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream must not stop the exit
                stream.flush()
        os._exit(code)


def run_then_exit(name: str, run: Callable[[], int]) -> int:
    """Run a node (``run``: its event loop, returning the exit code) and end the process
    through ``exit_process`` however it ends. An exception that escaped, in start-up or
    later, would otherwise take Python's own exit, which joins the worker threads: one
    blocked in a hung S3 kept a node that failed to start alive for minutes. Codes: 2
    for an invalid config, 1 for any other failure (logged with its traceback);
    SystemExit and KeyboardInterrupt keep theirs."""
    try:
        code = run()
    except InvalidConfigError as e:
        print(f"rillet {name}: {e}", file=sys.stderr)
        code = 2
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:
        logging.getLogger("rillet").exception("rillet %s failed", name)
        code = 1
    exit_process(code)
    return code  # not reached


class StopRequests:
    """Signals and the owner's exit, turned into a stop request and its urgency."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.requested = asyncio.Event()
        self.urgent = asyncio.Event()  # a second request: cut the stop short
        self.controlled = True  # False when the owner's exit asked
        self._count = 0
        self._owner_fd: int | None = None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT, and watch the owner named in ``RILLET_OWNER``."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request, sig.name, True)
        owner = os.environ.get(OWNER_ENV)
        if owner:
            self._watch_owner(loop, owner)

    def request(self, why: str, controlled: bool = True) -> None:
        self._count += 1
        if self._count == 1:
            self.controlled = controlled
            log.info("%s: stopping (%s)", self.name, why)
            self.requested.set()
        elif self._count == 2:
            log.warning(
                "%s: %s during the stop: stopping now (exit within %.0fs)",
                self.name,
                why,
                URGENT_EXIT_S,
            )
            self.urgent.set()
            asyncio.get_running_loop().call_later(URGENT_EXIT_S, self.exit_now, "time's up")
        else:
            self.exit_now(why)

    def exit_now(self, why: str) -> None:
        """Exit without finishing the stop (the logs are recovered at the next start)."""
        try:
            log.warning("%s: exiting now (%s); the logs were not all closed", self.name, why)
        finally:
            exit_process(URGENT_EXIT_CODE)

    def _watch_owner(self, loop: asyncio.AbstractEventLoop, owner: str) -> None:
        pid_text, _, start_text = owner.partition(":")
        try:
            pid = int(pid_text)
            start_time = int(start_text) if start_text else None
        except ValueError:
            log.warning("%s: ignoring %s=%r (want pid:starttime)", self.name, OWNER_ENV, owner)
            return

        def gone() -> None:
            self._unwatch(loop)
            self.request(f"owner process {pid} exited", controlled=False)

        pidfd_open: Callable[[int], int] | None = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                fd = pidfd_open(pid)
            except ProcessLookupError:
                loop.call_soon(gone)
                return
            except OSError:
                fd = None  # no pidfds in this kernel: poll
            if fd is not None:
                self._owner_fd = fd
                # Checked after opening: the pidfd holds this very process from here on.
                if start_time is not None and process_start_time(pid) != start_time:
                    loop.call_soon(gone)
                    return
                loop.add_reader(fd, gone)
                return
        loop.create_task(self._poll_owner(pid, start_time, gone), name="owner-watch")

    @staticmethod
    async def _poll_owner(pid: int, start_time: int | None, gone: Callable[[], None]) -> None:
        while True:
            try:
                os.kill(pid, 0)
                alive = start_time is None or process_start_time(pid) in (None, start_time)
            except ProcessLookupError:
                alive = False
            except PermissionError:
                alive = True
            if not alive:
                gone()
                return
            await asyncio.sleep(OWNER_POLL_S)

    def _unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._owner_fd is not None:
            loop.remove_reader(self._owner_fd)
            os.close(self._owner_fd)
            self._owner_fd = None
