"""Benchmark (marked slow): FileRange payloads sent by pread+write vs os.sendfile.

Run with ``pytest -m slow tests/test_rpc_bench.py -s``. The server runs in its own
process (tests/rpc_echo_server.py, uvloop); the client here fetches ranges of a cached
file with 8 requests in flight and we report throughput and the server's CPU time per
GiB served (from /proc). No assertion on the numbers: they inform FILE_SEND_MODE.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from helpers import python_command, start_server_process

from rillet.client.wire.connection import Connection

ECHO_SERVER = str(Path(__file__).with_name("rpc_echo_server.py"))
FILE_BYTES = 64 << 20
TOTAL_BYTES = 1 << 30
IN_FLIGHT = 8


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _fetch_all(port: int, range_bytes: int) -> int:
    conn = await Connection.open("127.0.0.1", port)
    got = 0

    async def one(i: int) -> int:
        offset = (i * range_bytes) % (FILE_BYTES - range_bytes)
        partition = [0, offset, -1, -1, 0, range_bytes]
        fields = {
            "replica_id": -1,
            "max_wait_ms": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 30,
            "topics": [["t", [partition]]],
        }
        _, payload = await conn.request("Fetch", fields)
        return len(payload)

    count = TOTAL_BYTES // range_bytes
    for base in range(0, count, IN_FLIGHT):
        got += sum(await asyncio.gather(*(one(i) for i in range(base, base + IN_FLIGHT))))
    await conn.aclose()
    return got


@pytest.mark.slow
@pytest.mark.parametrize("range_bytes", [64 << 10, 1 << 20])
@pytest.mark.parametrize("mode", ["pread", "sendfile"])
def test_file_send_throughput(tmp_path: Path, mode: str, range_bytes: int) -> None:
    data = tmp_path / "segment.log"
    data.write_bytes(os.urandom(FILE_BYTES))
    server = start_server_process(
        python_command(ECHO_SERVER, "--data", str(data), "--file-send-mode", mode)
    )
    try:
        cpu0, t0 = _cpu_seconds(server.proc.pid), time.perf_counter()
        got = asyncio.run(_fetch_all(server.port, range_bytes))
        cpu, wall = _cpu_seconds(server.proc.pid) - cpu0, time.perf_counter() - t0
    finally:
        server.stop()
    gib = got / (1 << 30)
    print(
        f"\n{mode:8} {range_bytes >> 10:5} KiB ranges: {got / wall / 2**20:7.0f} MiB/s, "
        f"server CPU {cpu / gib:.3f} s/GiB"
    )
