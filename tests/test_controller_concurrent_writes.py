"""Operations on the active controller that overlap in time (a real ControllerServer, one
voter, in-process).

A large operation is proposed as several Raft entries with a loop turn between them
(docs/controller.md, "Large operations"). Another operation must not plan and propose in
those turns: the rest of the first one was planned on an image without its changes.
Three brokers stopping at once (three controlled shutdowns, each moving leaderships off
its broker) did exactly that with a few thousand partitions: one shutdown's later entry
named as leader a broker another had just taken out of the ISR. That entry was already in
the Raft log when the pending image refused it, so it committed, and every controller
died applying it ("leader 2 not in ISR"), again at each restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rillet.client.wire import messages as m
from rillet.client.wire.errors import PolicyViolationError
from rillet.controller import handlers
from rillet.controller.config import controller_config_table
from rillet.controller.metadata.image import check_partition
from rillet.controller.metadata.quorum import QuorumController, total_partitions
from rillet.controller.server import ControllerServer
from rillet.controller.state_machine import EntryLimits

BROKERS = (1, 2, 3)
GUARD_S = 60  # only against a hang; never reached when it works


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ControllerServer]:
    port = free_port()
    config = controller_config_table().load(
        None,
        [
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{port}",
            f"metadata.log.dir={tmp_path}",
            "auto.leader.rebalance.enable=false",
        ],
    )
    server = ControllerServer(config)
    # One record per entry: every operation of more than one record yields in between.
    server.machine.entry_limits = EntryLimits(max_records=1)
    await server.start()
    try:
        await asyncio.wait_for(_until(lambda: server.active), GUARD_S)
        yield server
    finally:
        await server.stop(transfer_leadership=False)


async def _until(predicate) -> None:  # type: ignore[no-untyped-def]
    while not predicate():
        await asyncio.sleep(0.01)


async def _heartbeat(server: ControllerServer, broker: int, epoch: int, **flags: bool) -> Any:
    assert server.ctl is not None
    request = m.BrokerHeartbeatRequest(
        broker_id=broker,
        broker_epoch=epoch,
        current_metadata_offset=server.images.committed.offset,
        want_fence=False,
        want_shut_down=flags.get("want_shut_down", False),
    )
    return await handlers.broker_heartbeat(server, server.ctl, request)


async def _unfenced_brokers(server: ControllerServer) -> dict[int, int]:
    """Register BROKERS and heartbeat each once (caught up: unfenced); their epochs."""
    assert server.ctl is not None
    epochs = {}
    for b in BROKERS:
        registered = await handlers.broker_registration(
            server,
            server.ctl,
            m.BrokerRegistrationRequest(
                broker_id=b,
                cluster_id="",
                incarnation_id=f"inc{b}",
                listeners=[m.Listener("BROKER", "127.0.0.1", 9000 + b)],
            ),
        )
        epochs[b] = registered.broker_epoch
        await _heartbeat(server, b, epochs[b])
    return epochs


async def test_controlled_shutdowns_at_once_each_plan_on_the_others_changes(
    server: ControllerServer,
) -> None:
    assert server.ctl is not None
    epochs = await _unfenced_brokers(server)
    topic = m.CreateTopicsRequest(topics=[m.CreatableTopic("t", 30, 3, [], {})], timeout_ms=30_000)
    created = await handlers.create_topics(server, server.ctl, topic)
    assert created.topics[0].error_code == 0

    shutdowns = [_heartbeat(server, b, epochs[b], want_shut_down=True) for b in BROKERS]
    await asyncio.wait_for(asyncio.gather(*shutdowns), GUARD_S)
    await asyncio.wait_for(server.wait_applied(server.images.pending.offset), GUARD_S)
    assert server.failure is not None and not server.failure.done()
    for _, p in server.images.committed.iter_partitions():
        check_partition(p)


async def test_creates_planned_at_once_are_planned_again_off_the_loop(
    server: ControllerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two large CreateTopics planned on the same image: the second to write finds the
    first's topics in the pending image, so its plan no longer holds. It used to plan
    again on the loop (seconds for 100,000 partitions, with Raft and every heartbeat
    waiting); it plans again on a worker thread, and the limits are checked on the image
    it writes on (together the two pass max.partitions: the second is refused)."""
    assert server.ctl is not None
    server.machine.entry_limits = EntryLimits()
    await _unfenced_brokers(server)
    monkeypatch.setattr(handlers, "PLAN_OFF_LOOP_PARTITIONS", 10)
    loop_thread = threading.get_ident()
    on_loop: list[str] = []
    plan = QuorumController.create_topics

    def recording(self: QuorumController, image: Any, topics: Any, *args: Any) -> Any:
        if threading.get_ident() == loop_thread:
            on_loop.extend(t.name for t in topics)
        return plan(self, image, topics, *args)

    monkeypatch.setattr(QuorumController, "create_topics", recording)

    def create(name: str, partitions: int) -> Any:
        request = m.CreateTopicsRequest(
            topics=[m.CreatableTopic(name, partitions, 3, [], {})], timeout_ms=30_000
        )
        return handlers.create_topics(server, server.ctl, request)  # type: ignore[arg-type]

    a, b = await asyncio.wait_for(asyncio.gather(create("a", 40), create("b", 40)), GUARD_S)
    assert [a.topics[0].error_code, b.topics[0].error_code] == [0, 0]
    assert on_loop == []

    server.ctl.config = dataclasses.replace(server.ctl.config, max_partitions=100)
    results = await asyncio.wait_for(
        asyncio.gather(create("c", 15), create("d", 15), return_exceptions=True), GUARD_S
    )
    assert on_loop == []
    refused = [r for r in results if isinstance(r, PolicyViolationError)]
    created = [r for r in results if not isinstance(r, BaseException)]
    assert len(refused) == 1 and len(created) == 1, results
    assert created[0].topics[0].error_code == 0
    assert total_partitions(server.images.pending) == 95
