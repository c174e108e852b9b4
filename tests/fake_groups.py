"""The fake cluster of test_client_fake_broker.py plus consumer-group APIs, for Admin and
``rillet group`` tests of what a real cluster cannot do on demand (a coordinator that
moves at a chosen moment, a broker that never answers).

Groups live in memory: members (as ConsumerGroupDescribe lists them), committed offsets
and a coordinator node per group. The group rules are Kafka's: a commit from outside
the group (no member, epoch -1) and a deletion are refused while it has members, and
offsets of a topic its members subscribe to cannot be deleted.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from test_client_fake_broker import FakeCluster

from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import errors, schemas
from rillet.client.wire import messages as m

NOT_COORDINATOR = errors.code_of("NOT_COORDINATOR")
GROUP_ID_NOT_FOUND = errors.code_of("GROUP_ID_NOT_FOUND")
NON_EMPTY_GROUP = errors.code_of("NON_EMPTY_GROUP")
UNKNOWN_MEMBER_ID = errors.code_of("UNKNOWN_MEMBER_ID")
SUBSCRIBED = errors.code_of("GROUP_SUBSCRIBED_TO_TOPIC")


@dataclass
class FakeGroup:
    coordinator: int
    members: list[m.DescribedMember] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    epoch: int = 1

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"


def member(
    member_id: str,
    topics: dict[str, list[int]],
    *,
    subscribed: list[str] | None = None,
    client_id: str = "app",
    host: str = "/127.0.0.1",
    instance_id: str | None = None,
) -> m.DescribedMember:
    parts = [m.DescribedTopicPartitions(f"id-{t}", t, ps) for t, ps in sorted(topics.items())]
    return m.DescribedMember(
        member_id=member_id,
        instance_id=instance_id,
        rack_id=None,
        member_epoch=3,
        client_id=client_id,
        client_host=host,
        subscribed_topic_names=subscribed if subscribed is not None else sorted(topics),
        subscribed_topic_regex=None,
        assignment=parts,
        target_assignment=parts,
    )


class FakeGroupCluster(FakeCluster):
    def __init__(self, brokers: int = 3) -> None:
        super().__init__(brokers)
        self.groups: dict[str, FakeGroup] = {}
        self.lookups = 0
        self.describes: dict[int, int] = {}
        self.offset_fetches: dict[int, int] = {}
        self.silent: set[int] = set()  # brokers that never answer ListGroups
        self.new_group_coordinator = 1
        self.moved_once: set[str] = set()  # groups whose next describe says NOT_COORDINATOR

    def group(self, group_id: str) -> FakeGroup:
        return self.groups.setdefault(group_id, FakeGroup(self.new_group_coordinator))

    def _handlers(self, node: int) -> dict[int, Any]:
        def bind(fn: Callable[[int, Any], Any]) -> Any:
            async def handler(request: Request) -> Response | None:
                if fn == self._list_groups and node in self.silent:
                    await asyncio.Event().wait()  # never answers
                return Response(fn(node, request.message))

            return handler

        return {
            **super()._handlers(node),
            schemas.FIND_COORDINATOR.key: bind(self._find),
            schemas.LIST_GROUPS.key: bind(self._list_groups),
            schemas.CONSUMER_GROUP_DESCRIBE.key: bind(self._describe),
            schemas.OFFSET_FETCH.key: bind(self._offset_fetch),
            schemas.OFFSET_COMMIT.key: bind(self._offset_commit),
            schemas.DELETE_GROUPS.key: bind(self._delete_groups),
            schemas.OFFSET_DELETE.key: bind(self._offset_delete),
        }

    def _coordinator(self, group_id: str) -> int:
        g = self.groups.get(group_id)
        return g.coordinator if g is not None else self.new_group_coordinator

    def _find(self, node: int, req: m.FindCoordinatorRequest) -> m.FindCoordinatorResponse:
        self.lookups += 1
        out = []
        for key in req.coordinator_keys:
            coord = self._coordinator(key)
            out.append(m.Coordinator(key, coord, "127.0.0.1", self.servers[coord].port, 0, None))
        return m.FindCoordinatorResponse(out)

    def _list_groups(self, node: int, req: m.ListGroupsRequest) -> m.ListGroupsResponse:
        listed = [
            m.ListedGroup(gid, "consumer", g.state, "consumer")
            for gid, g in sorted(self.groups.items())
            if g.coordinator == node
        ]
        return m.ListGroupsResponse(listed)

    def _describe(
        self, node: int, req: m.ConsumerGroupDescribeRequest
    ) -> m.ConsumerGroupDescribeResponse:
        self.describes[node] = self.describes.get(node, 0) + 1
        out = []
        for gid in req.group_ids:
            g = self.groups.get(gid)
            code = 0
            if self._coordinator(gid) != node or gid in self.moved_once:
                self.moved_once.discard(gid)
                code = NOT_COORDINATOR
            elif g is None:
                code = GROUP_ID_NOT_FOUND
            if code:
                out.append(m.DescribedGroup(code, None, gid, "Dead", -1, -1, "", [], -(2**31)))
            else:
                assert g is not None
                members = list(g.members)
                out.append(
                    m.DescribedGroup(
                        0, None, gid, g.state, g.epoch, g.epoch, "uniform", members, -(2**31)
                    )
                )
        return m.ConsumerGroupDescribeResponse(out)

    def _offset_fetch(self, node: int, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
        self.offset_fetches[node] = self.offset_fetches.get(node, 0) + 1
        out = []
        for want in req.groups:
            if self._coordinator(want.group_id) != node:
                out.append(m.OffsetFetchGroupResult(want.group_id, [], NOT_COORDINATOR))
                continue
            g = self.groups.get(want.group_id)
            offsets = g.offsets if g is not None else {}
            by_topic: dict[str, list[m.OffsetFetchPartitionResult]] = {}
            for (t, p), off in sorted(offsets.items()):
                if want.topics is None or any(
                    w.name == t and p in w.partition_indexes for w in want.topics
                ):
                    by_topic.setdefault(t, []).append(
                        m.OffsetFetchPartitionResult(p, off, -1, None, 0)
                    )
            topics = [m.OffsetFetchTopicResult(t, ps) for t, ps in by_topic.items()]
            out.append(m.OffsetFetchGroupResult(want.group_id, topics, 0))
        return m.OffsetFetchResponse(out)

    def _offset_commit(self, node: int, req: m.OffsetCommitRequest) -> m.OffsetCommitResponse:
        g = self.group(req.group_id)
        if g.coordinator != node:
            code = NOT_COORDINATOR
        elif req.member_id == "" and g.members:
            code = UNKNOWN_MEMBER_ID  # KIP-848: an epoch-less commit needs an empty group
        else:
            code = 0
        out = []
        for t in req.topics:
            rows = []
            for p in t.partitions:
                if code == 0:
                    g.offsets[(t.name, p.partition)] = p.committed_offset
                rows.append(m.OffsetCommitPartitionResult(p.partition, code))
            out.append(m.OffsetCommitTopicResult(t.name, rows))
        return m.OffsetCommitResponse(out)

    def _delete_groups(self, node: int, req: m.DeleteGroupsRequest) -> m.DeleteGroupsResponse:
        out = []
        for gid in req.groups_names:
            g = self.groups.get(gid)
            if self._coordinator(gid) != node:
                code = NOT_COORDINATOR
            elif g is None:
                code = GROUP_ID_NOT_FOUND
            elif g.members:
                code = NON_EMPTY_GROUP
            else:
                code = 0
                del self.groups[gid]
            out.append(m.DeletableGroupResult(gid, code))
        return m.DeleteGroupsResponse(out)

    def _offset_delete(self, node: int, req: m.OffsetDeleteRequest) -> m.OffsetDeleteResponse:
        g = self.groups.get(req.group_id)
        if self._coordinator(req.group_id) != node:
            return m.OffsetDeleteResponse([], NOT_COORDINATOR)
        if g is None:
            return m.OffsetDeleteResponse([], GROUP_ID_NOT_FOUND)
        subscribed = {t for mb in g.members for t in mb.subscribed_topic_names}
        out = []
        for t in req.topics:
            rows = []
            for p in t.partitions:
                code = SUBSCRIBED if t.name in subscribed else 0
                if code == 0:
                    g.offsets.pop((t.name, p), None)
                rows.append(m.OffsetDeletePartitionResult(p, code))
            out.append(m.OffsetDeleteTopicResult(t.name, rows))
        return m.OffsetDeleteResponse(out)


@dataclass
class ThreadedCluster:
    """A FakeGroupCluster served from its own event loop in a thread, so code that runs
    its own loop (the CLI's ``main``) can talk to it; ``call`` runs ``fn(cluster)`` on
    that loop to change the fake's state safely."""

    cluster: FakeGroupCluster
    loop: asyncio.AbstractEventLoop

    def call(self, fn: Callable[[FakeGroupCluster], Any]) -> Any:
        async def run() -> Any:
            return fn(self.cluster)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)


def threaded_cluster() -> Iterator[ThreadedCluster]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    cluster = FakeGroupCluster()
    asyncio.run_coroutine_threadsafe(cluster.start(), loop).result(10)
    try:
        yield ThreadedCluster(cluster, loop)
    finally:
        asyncio.run_coroutine_threadsafe(cluster.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
