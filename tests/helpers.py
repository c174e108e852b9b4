"""Test helpers shared across rillet's test suites.

- ``wait_until`` / ``wait_until_async``: poll a condition with a generous deadline,
  instead of sleeping a guessed time (no timing thresholds in tests).
- ``ServerProcess`` / ``start_server_process``: run a node (or a test server) in its
  own OS process, learn its port from a line it prints, and always stop it.
- ``run_cli``: the ``rillet`` command line as a subprocess against a cluster.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TIMEOUT_S = 30.0  # generous: the shared CI machine has two busy cores


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.01,
    message: str | Callable[[], str] = "",
) -> Any:
    """Call ``predicate`` until it returns something truthy, and return that.

    Raises AssertionError after ``timeout`` seconds; ``message`` (or its result) says
    what was being waited for. Exceptions from the predicate propagate.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {_describe(message)}")
        time.sleep(interval)


async def wait_until_async(
    predicate: Callable[[], Any | Awaitable[Any]],
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.01,
    message: str | Callable[[], str] = "",
) -> Any:
    """``wait_until`` for event-loop code; ``predicate`` may be sync or async."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {_describe(message)}")
        await asyncio.sleep(interval)


def _describe(message: str | Callable[[], str]) -> str:
    text = message() if callable(message) else message
    return text or "the condition"


@dataclass
class ServerProcess:
    """A child process that announced its listening port on stdout."""

    proc: subprocess.Popen[str]
    port: int
    host: str = "127.0.0.1"
    output: list[str] = field(default_factory=list)  # every stdout/stderr line so far

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def start_server_process(
    command: Sequence[str],
    *,
    port_pattern: str = r"^PORT (\d+)$",
    timeout: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> ServerProcess:
    """Start ``command`` and wait until a stdout line matches ``port_pattern``.

    The child's stderr is merged into stdout and read by a thread for the whole life of
    the process (so the pipe never fills); lines land in ``ServerProcess.output``.
    Callers must ``stop()`` it, e.g. in a fixture finalizer.
    """
    proc = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line.rstrip("\n"))
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, name=f"pump-{proc.pid}", daemon=True).start()
    pattern = re.compile(port_pattern)
    deadline = time.monotonic() + timeout
    try:
        while True:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError(f"{command[0]} exited early:\n" + "\n".join(output))
            match = pattern.search(line)
            if match:
                return ServerProcess(proc, int(match.group(1)), output=output)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def rss_bytes(pid: int) -> int:
    """A live process's resident set (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def run_cli(
    bootstrap: str, *args: str, ok: bool = True, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """``rillet ARGS`` as a real subprocess with RILLET_BOOTSTRAP set; with ``ok`` it must
    exit 0 (its stderr is the assertion's message)."""
    env = {**os.environ, "RILLET_BOOTSTRAP": bootstrap}
    proc = subprocess.run(
        [sys.executable, "-m", "rillet.client.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def python_command(script: str, *args: str) -> list[str]:
    """The command line to run a Python script with this interpreter (the venv's)."""
    return [sys.executable, script, *args]


async def fetch_records(conn: Any, topic: str, partition: int = 0) -> list[Any]:
    """Every record a consumer may read (below the HW) from ``partition``, from offset 0,
    through raw Fetch requests on ``conn`` (a rillet.client.wire.connection.Connection)."""
    from rillet.client.wire import messages as m
    from rillet.client.wire import records

    out: list[Any] = []
    offset = 0
    while True:
        wanted = m.FetchPartition(partition, offset, -1, -1, 0, 1 << 22)
        request = m.FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=1 << 22,
            topics=[m.FetchTopic(topic, [wanted])],
        )
        response, payload = await conn.call(request)
        result = response.topics[0].partitions[0]
        assert result.error_code == 0, result
        recs = [r for r in records.decode_all(bytes(payload)) if r.offset >= offset]
        if not recs:
            return out
        out.extend(recs)
        offset = recs[-1].offset + 1


def log_records(log: Any) -> list[Any]:
    """Every record of a rillet.storage Log from its start, read through ``read_bytes``
    (batches may start below the offset asked for, as after compaction: skip those)."""
    from rillet.client.wire import records

    out: list[Any] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, 1 << 20)
        if not data:
            break
        out.extend(r for r in records.decode_all(data) if r.offset >= offset)
        offset = [h for _, h in records.iter_batches(data)][-1].next_offset
    return out


def stamped(batch: bytes, base: int, epoch: int) -> bytes:
    """A batch as a leader writes it: base offset and epoch stamped, the rest as it was."""
    from rillet.client.wire import records

    out = bytearray(batch)
    records.stamp(out, 0, base, epoch)
    return bytes(out)


# --- Kafka's v2 record bytes, written here independently of the codec under test ---


def uvarint(u: int) -> bytes:
    """An unsigned varint: 7 bits a byte, low group first."""
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def zigzag(v: int) -> bytes:
    """A signed varint as Kafka writes it (zigzag), of any length: tests make over-long
    ones on purpose."""
    return uvarint(v << 1 if v >= 0 else ((-v) << 1) - 1)


def bytes_field(b: bytes | None) -> bytes:
    """A nullable key, value or header field: its length (-1 for null), then its bytes."""
    return zigzag(-1) if b is None else zigzag(len(b)) + b
