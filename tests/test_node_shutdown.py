"""SIGTERM ends a node even when the nodes it would wait for are gone: a broker's
controlled shutdown gives up after ``controlled.shutdown.timeout.ms`` and the broker
stops anyway, and a second SIGTERM (or SIGINT) cuts any such wait short at once. Real
processes; deadlines are generous waits, not timing assertions. A stop does not wait
for a remote-tier call hung in S3 either."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from cluster import ClusterFactory
from helpers import python_command, wait_until
from replication_cluster import Client, run
from s3_server import HangingS3

from rillet.tools.local_cluster import LocalCluster, pid_alive

pytestmark = pytest.mark.cluster

EXIT_TIMEOUT_S = 60.0
# Generous for a stop on a loaded machine, and still far below a hung S3 call's end.
HUNG_S3_EXIT_TIMEOUT_S = 30.0


def wait_exited(cluster: LocalCluster, node_id: int, timeout: float = EXIT_TIMEOUT_S) -> str:
    """Wait until the node's process has exited; its log."""
    node = cluster.nodes[node_id]
    wait_until(
        lambda: not pid_alive(node.pid),
        timeout=timeout,
        message=lambda: f"node {node_id} to exit; log:\n{cluster.log_tail(node_id)}",
    )
    return cluster.log_tail(node_id, 200)


def test_sigterm_stops_a_broker_whose_controllers_are_gone(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(
        controllers=1, brokers=1, overrides={"controlled.shutdown.timeout.ms": 2000}
    )
    cluster.stop_node(101, kill=True)
    cluster.signal_node(1, signal.SIGTERM)
    log = wait_exited(cluster, 1)
    assert "controlled shutdown timed out" in log
    assert "broker 1 stopped" in log  # and the logs were closed cleanly


def test_a_second_signal_cuts_a_broker_shutdown_short(cluster_factory: ClusterFactory) -> None:
    # The controlled shutdown alone would wait ten minutes for the dead controller.
    cluster = cluster_factory(
        controllers=1, brokers=1, overrides={"controlled.shutdown.timeout.ms": 600_000}
    )
    cluster.stop_node(101, kill=True)
    cluster.signal_node(1, signal.SIGTERM)
    wait_until(
        lambda: "stopping (SIGTERM)" in cluster.log_tail(1),
        message=lambda: f"the broker to start stopping; log:\n{cluster.log_tail(1)}",
    )
    cluster.signal_node(1, signal.SIGINT)
    log = wait_exited(cluster, 1)
    assert "controlled shutdown cut short" in log
    assert "broker 1 stopped" in log  # closing the logs is quick: it still happened


def test_a_broker_exits_promptly_while_an_upload_hangs_in_s3(
    cluster_factory: ClusterFactory,
) -> None:
    """A stop does not wait for the remote tier's threads: one boto3 call into a hung
    S3 lasts minutes (4 attempts of a 30 s read timeout), and Python's exit would join
    the thread making it."""
    hung = HangingS3()
    try:
        cluster = cluster_factory(
            controllers=1,
            brokers=1,
            overrides={
                "controlled.shutdown.timeout.ms": 2000,
                "remote.log.storage.system.enable": True,
                "remote.log.storage.s3.endpoint.url": hung.url,
                "remote.log.manager.task.interval.ms": 100,
            },
        )

        async def produce(client: Client) -> None:
            configs = {"segment.bytes": "1024", "remote.storage.enable": "true"}
            await client.create_topic("tiered", 1, 1, configs)
            for _ in range(20):  # segments roll and close below the high watermark
                code = 1
                while code:  # the leader may not know the topic yet
                    code, _ = await client.produce(1, "tiered", 0, [b"x" * 300] * 4)

        run(cluster, produce)
        # An upload (or the bucket's creation before it) is now stuck in the hung S3.
        wait_until(
            lambda: hung.received > 0,
            timeout=EXIT_TIMEOUT_S,
            message=lambda: f"an upload to start; log:\n{cluster.log_tail(1)}",
        )
        cluster.signal_node(1, signal.SIGTERM)
        # Far below the hung call's own end (minutes): the stop is not waiting for it.
        log = wait_exited(cluster, 1, timeout=HUNG_S3_EXIT_TIMEOUT_S)
        assert "broker 1 stopped" in log
    finally:
        hung.close()


# A node whose run fails (as a start-up error would) while a worker thread is stuck, as
# one is in a call to a hung S3. argv: the role, the log dir.
FAILING_RUN = """
import argparse, concurrent.futures, sys, threading
import uvloop
from rillet.broker import cli as broker_cli
from rillet.controller import cli as controller_cli

def failing_run(coro):
    coro.close()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.submit(threading.Event().wait)  # never ends: Python's own exit would join it
    raise OSError("the listener's port is in use")

uvloop.run = failing_run
role, log_dir = sys.argv[1], sys.argv[2]
if role == "broker":
    sets = ["node.id=1", f"log.dirs={log_dir}"]
    broker_cli.cmd_broker(argparse.Namespace(config=None, set=sets))
else:
    sets = ["node.id=101", "process.roles=controller", f"metadata.log.dir={log_dir}"]
    controller_cli.cmd_controller(argparse.Namespace(config=None, set=sets))
"""


@pytest.mark.parametrize("role", ["broker", "controller"])
def test_a_node_whose_run_fails_exits_with_code_1_despite_a_stuck_thread(
    tmp_path: Path, role: str
) -> None:
    """Any exception out of the node's run still ends the process through exit_process
    (code 1, the traceback logged), never Python's exit, which would wait for the stuck
    thread forever (the subprocess timeout is only the guard against that)."""
    script = tmp_path / "failing_run.py"
    script.write_text(FAILING_RUN)
    proc = subprocess.run(
        python_command(str(script), role, str(tmp_path / "logs")),
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT_S,
    )
    assert proc.returncode == 1, proc.stderr
    assert "OSError: the listener's port is in use" in proc.stderr
