"""A broker under a low open-files limit serves many partitions: the log manager's
descriptor cache keeps its segment descriptors under a quarter of the soft limit."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import fetch_records

from rillet.client.admin import Admin, NewTopic
from rillet.client.producer import Producer
from rillet.client.wire.connection import Connection, parse_address

pytestmark = pytest.mark.cluster

PARTITIONS = 1000
LIMIT = 256


def open_segment_files(pid: int, log_dir: Path) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith(f"{log_dir}/") and target.endswith(".log"):
                count += 1
        except OSError:
            pass  # closed meanwhile
    return count


def test_a_broker_limited_to_256_open_files_serves_1000_partitions(
    cluster_factory: Any, tmp_path: Path
) -> None:
    # ``ulimit -n`` sets the soft and the hard limit: the node cannot raise it.
    wrapper = tmp_path / "python-nofile"
    wrapper.write_text(f'#!/bin/sh\nulimit -n {LIMIT}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    cluster = cluster_factory(controllers=1, brokers=1, python=str(wrapper))
    (broker_id,) = [n.node_id for n in cluster.nodes.values() if n.is_broker]
    pid = cluster.nodes[broker_id].pid

    async def body() -> None:
        async with Admin(cluster.bootstrap, timeout_ms=60_000) as admin:
            await admin.create_topics([NewTopic("wide", PARTITIONS, 1)])
            async with Producer(bootstrap=cluster.bootstrap, acks="all", linger_ms=5) as p:
                handles = [p.send("wide", b"v%d" % i, partition=i) for i in range(PARTITIONS)]
                await p.flush()
                assert [(await h).offset for h in handles] == [0] * PARTITIONS
        conn = await Connection.open(*parse_address(cluster.broker_address(broker_id)))
        try:
            for i in range(0, PARTITIONS, 97):
                assert [r.value for r in await fetch_records(conn, "wide", i)] == [b"v%d" % i]
        finally:
            await conn.aclose()

    asyncio.run(body())
    log = (cluster.node_dir(broker_id) / "node.log").read_text()
    assert f"open files limit: soft {LIMIT}, hard {LIMIT}" in log
    assert open_segment_files(pid, cluster.node_dir(broker_id) / "logs") <= LIMIT // 4
