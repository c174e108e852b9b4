"""The console as a process, without a browser: a cluster that does not answer is a
readable message on every page, never an error page, and the console keeps serving."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from browser import start_console
from helpers import ServerProcess


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def console_without_cluster() -> Iterator[str]:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    server: ServerProcess = start_console(dead)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/", "/topics", "/topics?page=3&sort=size&dir=desc"])
def test_pages_say_the_cluster_does_not_answer(console_without_cluster: str, path: str) -> None:
    status, body = get(console_without_cluster + path)
    assert status == 200
    assert 'id="no-snapshot"' in body and "No view of the cluster yet" in body
    assert "Traceback" not in body


def test_a_topic_page_explains_why_it_cannot_show_the_topic(console_without_cluster: str) -> None:
    status, body = get(console_without_cluster + "/topics/orders")
    assert status == 404
    assert "This topic cannot be shown" in body and "Traceback" not in body
    status, history = get(console_without_cluster + "/overview/history.json")
    assert status == 200 and json.loads(history)["t"] == []  # no sample without a snapshot


def test_a_malformed_metrics_list_is_refused_before_serving() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rillet.client.cli", "console", "--port", "0"]
        + ["--metrics", "127.0.0.1:9401"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "--metrics wants BROKER_ID=HOST:PORT" in proc.stderr
