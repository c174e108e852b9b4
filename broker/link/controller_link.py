"""``QuorumLink``: the broker's ``ControllerLink`` over the controller's own client pieces
(broker/link/controller_client.py): ``ControllerChannel`` to the active controller,
``BrokerLifecycle`` (register, heartbeat, controlled shutdown) and ``MetadataFollower``
(long-polls FetchMetadata, hands each committed ``(delta, image)`` to the broker).

Registration runs in the background and retries until the quorum answers, so a broker
binds and prints its readiness line even when it starts before the controllers have
elected a leader (it holds requests until its metadata has caught up: broker/server.py).

Stray logs: the first deltas a broker sees are over the empty image (a snapshot, or the
log from its start), so partitions deleted while the broker was down never show up as
deletes. Once the follower has caught up with the controller's high watermark, every
local log that the image does not assign to this broker is deleted, once per start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

from rillet.broker.config import BrokerConfig
from rillet.broker.link.alter_partition_manager import (
    Proposal,
    alter_partition_answers,
    alter_partition_request,
)
from rillet.broker.link.controller_client import (
    BrokerLifecycle,
    ControllerChannel,
    MetadataFollower,
)
from rillet.broker.replication.types import AlterPartitionResponse
from rillet.client.runtime.tasks import on_death_fatal
from rillet.client.wire import messages as m
from rillet.client.wire.connection import R, RequestMessage
from rillet.client.wire.errors import RilletError
from rillet.controller.metadata.image import MetadataDelta, MetadataImage, RemoteSegment

logger = logging.getLogger(__name__)

REGISTER_RETRY_S = 0.5
# Tests only: ``RILLET_TEST_FAULT=metadata_apply`` makes applying the first metadata batch
# that holds a topic raise (after the replica manager applied it), to check that such a
# fault terminates the process (docs/broker.md, "Faults"). Topics, not the first batch: a
# test can then start the node normally and trigger the fault by creating a topic.
TEST_FAULT_ENV = "RILLET_TEST_FAULT"


class InjectedTestFault(RuntimeError):
    """Raised where ``RILLET_TEST_FAULT`` asks for a fault (tests only)."""


class QuorumLink:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.channel = ControllerChannel(config.voters, client_id=f"broker-{config.node_id}")
        self.lifecycle: BrokerLifecycle | None = None
        self.follower: MetadataFollower | None = None
        self._task: asyncio.Task[None] | None = None
        self._strays_checked = False
        self._strays: Any = None  # async callable(image) -> None, set by start()

    async def start(self, endpoints: list[tuple[str, str, int]], on_metadata: Any) -> None:
        cfg = self.config
        self.follower = MetadataFollower(
            self.channel,
            cfg.node_id,
            listener=self._listener(on_metadata),
            broker_epoch=lambda: self.lifecycle.state.broker_epoch if self.lifecycle else -1,
        )
        self.lifecycle = BrokerLifecycle(
            self.channel,
            cfg.node_id,
            endpoints,
            lambda: self.follower.image.offset,
            cluster_id=cfg.cluster_id,
            rack=cfg.rack,
            heartbeat_interval_ms=cfg["broker.heartbeat.interval.ms"],
        )
        # Policy fatal: a broker that never registers or follows metadata serves nothing
        # useful while looking alive (registration failures themselves are retried).
        task = asyncio.get_running_loop().create_task(
            self._register_and_follow(), name="register-and-follow"
        )
        self._task = on_death_fatal(task, f"broker {cfg.node_id}: registration")

    def on_caught_up(self, strays: Any) -> None:
        """``strays(image)`` runs once the follower has caught up (stray-log cleanup)."""
        self._strays = strays

    def _listener(self, on_metadata: Any) -> Any:
        inject_fault = os.environ.get(TEST_FAULT_ENV) == "metadata_apply"

        async def listener(delta: MetadataDelta, image: MetadataImage) -> None:
            await on_metadata(delta, image)
            if inject_fault and image.topics_by_id:
                raise InjectedTestFault(f"{TEST_FAULT_ENV}=metadata_apply at offset {image.offset}")
            follower = self.follower
            if (
                not self._strays_checked
                and follower is not None
                and image.offset >= follower.high_watermark
            ):
                self._strays_checked = True
                if self._strays is not None:
                    await self._strays(image)

        return listener

    async def _register_and_follow(self) -> None:
        assert self.lifecycle is not None and self.follower is not None
        while True:
            try:
                await self.lifecycle.start()
                break
            except RilletError as e:
                logger.warning(
                    "broker %d: registration failed, retrying: %s", self.config.node_id, e
                )
                await asyncio.sleep(REGISTER_RETRY_S)
        self.follower.start()

    def metadata_age_ms(self) -> float | None:
        """How old the metadata image may be, at most: the time since a fetch was sent
        whose high watermark the image has reached; None before the first."""
        at = None if self.follower is None else self.follower.caught_up_at
        if at is None:
            return None
        return (asyncio.get_running_loop().time() - at) * 1000

    def controller_id(self) -> int:
        leader = self.channel.leader_id
        return -1 if leader is None else leader

    async def forward(self, message: RequestMessage[R]) -> R:
        response, _ = await self.channel.call(message)
        return response

    async def alter_partitions(self, batch: Sequence[Proposal]) -> list[AlterPartitionResponse]:
        """One AlterPartition request carrying every proposal of ``batch`` (see
        broker/link/alter_partition_manager.py); the answers in the batch's order."""
        assert self.lifecycle is not None
        broker_epoch = self.lifecycle.state.broker_epoch
        request = alter_partition_request(self.config.node_id, broker_epoch, batch)
        return alter_partition_answers(batch, await self.forward(request))

    async def alter_remote_segments(
        self, segments: Sequence[RemoteSegment]
    ) -> list[m.RemoteSegmentResult]:
        """One AlterRemoteSegments request (docs/tiered.md): this broker, as partition
        leader, records remote segment state changes; one result per segment, in order,
        once the controller has committed them."""
        assert self.lifecycle is not None
        request = remote_segments_request(
            self.config.node_id, self.lifecycle.state.broker_epoch, segments
        )
        return list((await self.forward(request)).results)

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        if self.lifecycle is None or not self.lifecycle.state.registered:
            return True  # never registered: nothing to move
        return await self.lifecycle.controlled_shutdown(int(timeout_s * 1000))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # An exception that ended it already went to the fatal handler.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.lifecycle is not None:
            await self.lifecycle.stop()
        if self.follower is not None:
            await self.follower.stop()
        await self.channel.close()


def remote_segments_request(
    broker_id: int, broker_epoch: int, segments: Sequence[RemoteSegment]
) -> m.AlterRemoteSegmentsRequest:
    return m.AlterRemoteSegmentsRequest(
        broker_id=broker_id,
        broker_epoch=broker_epoch,
        segments=[
            m.RemoteSegmentState(
                topic_id=s.topic_id,
                partition=s.partition,
                segment_id=s.segment_id,
                start_offset=s.start_offset,
                end_offset=s.end_offset,
                state=s.state,
                leader_epoch=s.leader_epoch,
                size_bytes=s.size_bytes,
                max_timestamp_ms=s.max_timestamp_ms,
                leader_epochs=[m.EpochStart(e, o) for e, o in s.leader_epochs],
            )
            for s in segments
        ],
    )
