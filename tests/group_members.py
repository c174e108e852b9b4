"""A consumer-group member speaking ConsumerGroupHeartbeat and OffsetCommit itself, for
tests that need a group on a real cluster without the group Consumer.

It owns whatever the coordinator assigns it at once (it reads nothing), reports that in
its next heartbeat, and commits with its member epoch, as a consumer would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping

from rillet.client.group_coordinator import CoordinatorClient
from rillet.client.metadata import MetadataClient
from rillet.client.wire import messages as m
from rillet.client.wire.errors import error_for

LEAVE_EPOCH = -1


class RawMember:
    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Iterable[str],
        *,
        client_id: str = "raw-member",
        timeout_ms: int = 30_000,
    ) -> None:
        self.group = group
        self.topics = sorted(topics)
        self.member_id = uuid.uuid4().hex
        self.epoch = 0
        self.timeout_ms = timeout_ms
        self.owned: list[m.GroupTopicPartitions] = []
        self.meta = MetadataClient(bootstrap, client_id=client_id)
        self.coordinator = CoordinatorClient(self.meta, group)

    async def heartbeat(self, epoch: int | None = None) -> m.ConsumerGroupHeartbeatResponse:
        joining = self.epoch == 0
        request = m.ConsumerGroupHeartbeatRequest(
            group_id=self.group,
            member_id=self.member_id,
            member_epoch=self.epoch if epoch is None else epoch,
            rebalance_timeout_ms=self.timeout_ms if joining else -1,
            subscribed_topic_names=self.topics if joining else None,
            topic_partitions=self.owned,
        )
        response = await self.coordinator.call(
            request, lambda r: r.error_code, timeout_ms=self.timeout_ms
        )
        if response.error_code:
            raise error_for(response.error_code, response.error_message or "heartbeat")
        self.epoch = response.member_epoch
        if response.assignment is not None:
            self.owned = response.assignment
        return response

    def owned_count(self) -> int:
        return sum(len(tp.partitions) for tp in self.owned)

    async def join_until_owning(self, partitions: int) -> None:
        """Heartbeat until the member owns ``partitions`` partitions and the
        coordinator has nothing more to tell it (it reconciled)."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            before = (self.epoch, self.owned_count())
            await self.heartbeat()
            if self.owned_count() == partitions and (self.epoch, self.owned_count()) == before:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"member owns {self.owned} at epoch {self.epoch}")

    async def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        by_topic: dict[str, list[m.OffsetCommitPartition]] = {}
        for (t, p), offset in sorted(offsets.items()):
            by_topic.setdefault(t, []).append(m.OffsetCommitPartition(p, offset))
        request = m.OffsetCommitRequest(
            group_id=self.group,
            topics=[m.OffsetCommitTopic(t, ps) for t, ps in by_topic.items()],
            generation_id_or_member_epoch=self.epoch,
            member_id=self.member_id,
        )

        def first_code(r: m.OffsetCommitResponse) -> int:
            return next((p.error_code for t in r.topics for p in t.partitions if p.error_code), 0)

        response = await self.coordinator.call(request, first_code, timeout_ms=self.timeout_ms)
        code = first_code(response)
        if code:
            raise error_for(code, "commit")

    async def leave(self) -> None:
        await self.heartbeat(LEAVE_EPOCH)

    async def close(self) -> None:
        await self.meta.close()
