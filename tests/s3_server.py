"""moto's S3 server as a real process, for tests of the remote tier.

``S3Server`` runs ``python -m moto.server`` on an ephemeral port (moto binds port 0 and
prints the port it got), waits until it answers, and stops it (SIGTERM, then SIGKILL)
even when the test fails; the child also dies with the test process (PR_SET_PDEATHSIG)
should that be killed outright. ``stop()`` and ``start()`` again reuse the same port,
but moto keeps objects in memory only, so they are gone after a restart.

``S3Gate`` is the outage switch: a TCP relay in front of a server whose ``close()``
refuses new connections and resets open ones, and whose ``open()`` listens on the same
port again. Clients see exactly what an unreachable S3 looks like, and the objects
written before the outage are still there after it.

``HangingS3`` accepts connections and never answers: a stalled S3.

``moto_server()`` is the context manager that gives a running server; the fixtures
below (``s3_server``: an endpoint URL; ``s3``: an ``S3Endpoint`` with ``stop()`` and
``restart()``) share one server per test session, and each test starts with it empty.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

START_TIMEOUT_S = 60.0  # a loaded 2-core machine imports moto slowly
_PORT_LINE = re.compile(rb"Running on http://127\.0\.0\.1:(\d+)")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class S3Server:
    """One moto S3 server process on 127.0.0.1."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.port = 0  # 0 until the first start picks one
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the process (on the port of the last run, if any) and wait until it
        answers HTTP."""
        if self.running:
            return
        env = dict(os.environ, MOTO_PORT=str(self.port))
        # The port line is read from stderr; everything after it goes to the log file.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=_die_with_parent,
        )
        try:
            self.port = self._read_port(self._proc)
            self._drain(self._proc)
            self._wait_answering()
        except BaseException:
            self.stop()
            raise

    def _read_port(self, proc: subprocess.Popen[bytes], timeout_s: float | None = None) -> int:
        """The port from moto's start-up line, within ``timeout_s`` (START_TIMEOUT_S):
        a server that hangs before printing it fails the fixture instead of the run.
        The lines are read in a thread (a pipe's readline has no deadline); the caller
        stops the process on failure, which ends the stream and the thread."""
        assert proc.stderr is not None
        stream = proc.stderr
        seen: list[bytes] = []
        found: list[int] = []
        ended = threading.Event()

        def scan() -> None:
            try:
                for line in iter(stream.readline, b""):
                    seen.append(line)
                    match = _PORT_LINE.search(line)
                    if match:
                        found.append(int(match.group(1)))
                        return
            finally:
                ended.set()

        threading.Thread(target=scan, name="moto-port", daemon=True).start()
        limit = START_TIMEOUT_S if timeout_s is None else timeout_s
        if not ended.wait(limit):
            raise RuntimeError(
                f"moto server printed no port line within {limit}s:\n"
                + b"".join(seen).decode(errors="replace")
            )
        if found:
            return found[0]
        output = b"".join(seen).decode(errors="replace")
        raise RuntimeError(f"moto server exited before listening:\n{output}")

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        """Keep reading the server's stderr (its request log) so it never blocks on a
        full pipe; into the log file when one is given."""

        def pump() -> None:
            assert proc.stderr is not None
            sink = self.log_path.open("ab") if self.log_path is not None else None
            try:
                for line in iter(proc.stderr.readline, b""):
                    if sink is not None:
                        sink.write(line)
                        sink.flush()
            finally:
                if sink is not None:
                    sink.close()

        threading.Thread(target=pump, name="moto-stderr", daemon=True).start()

    def _wait_answering(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=5):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if not self.running or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server on {self.url} does not answer") from None
                time.sleep(0.05)

    def reset(self) -> None:
        """Forget every bucket and object (moto's own reset call)."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def stop(self) -> None:
        """Stop the process (its objects are lost); the port stays this server's."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


class S3Gate:
    """A TCP relay to ``target_port`` on a port of its own, that can refuse service."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self.open()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def is_open(self) -> bool:
        return self._listener is not None

    def open(self) -> None:
        """Listen (again, on the same port after the first time)."""
        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        """The outage: stop listening (connections are refused) and reset every open
        connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                # Linger 0: the peer gets a reset, as when a server dies.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # closed meanwhile
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                for s in (src, dst):
                    if s in self._conns:
                        self._conns.discard(s)
                        s.close()


class HangingS3:
    """An S3 endpoint that hangs: it accepts connections and reads every request, and
    never answers (what a stalled S3 or a SIGSTOPped server looks like to a client).
    ``received`` counts the request bytes that arrived."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self.received = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._swallow, args=(conn,), daemon=True).start()

    def _swallow(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                with self._lock:
                    self.received += len(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
        self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()


@contextlib.contextmanager
def moto_server(log_path: Path | None = None) -> Iterator[S3Server]:
    """A running moto S3 server, stopped on exit whatever happened."""
    server = S3Server(log_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


class S3Endpoint:
    """What the ``s3`` fixture gives a test: an endpoint URL with an outage switch."""

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self._gate = S3Gate(server.port)

    @property
    def url(self) -> str:
        return self._gate.url

    @property
    def available(self) -> bool:
        return self._gate.is_open

    def stop(self) -> None:
        """S3 goes away: connections refused, open ones reset; objects are kept."""
        self._gate.close()

    def restart(self) -> None:
        """S3 comes back on the same URL with everything it held."""
        self._gate.open()

    def close(self) -> None:
        self._gate.close()


@pytest.fixture(scope="session")
def s3_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with moto_server(tmp_path_factory.mktemp("s3") / "moto.log") as server:
        yield server


@pytest.fixture
def s3(s3_process: S3Server) -> Iterator[S3Endpoint]:
    """An S3 endpoint for this test, with an outage switch; emptied afterwards."""
    if not s3_process.running:
        s3_process.start()  # an earlier test stopped the process itself
    endpoint = S3Endpoint(s3_process)
    try:
        yield endpoint
    finally:
        endpoint.close()
        if s3_process.running:
            s3_process.reset()


@pytest.fixture
def s3_server(s3: S3Endpoint) -> str:
    """The endpoint URL of a running moto S3 server (empty at the start of the test)."""
    return s3.url
