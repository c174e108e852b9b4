"""The consumer-group APIs: FindCoordinator, ConsumerGroupHeartbeat, OffsetCommit,
OffsetFetch, ListGroups, ConsumerGroupDescribe, DeleteGroups and OffsetDelete.

They decode, check what only the broker can check (topics exist, ids are not empty),
and hand the group's event to the ``GroupManager`` (broker/group/manager.py), which
runs the core, writes its records and returns once they are committed. A request for a
group this broker does not coordinate is answered NOT_COORDINATOR (or
COORDINATOR_LOAD_IN_PROGRESS while its partition loads), which clients answer with a
new FindCoordinator.

FindCoordinator creates `__consumer_offsets` on first use, through the controller as
every CreateTopics goes, and answers COORDINATOR_NOT_AVAILABLE (retriable) until it
exists with a leader for the group's partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rillet.broker.config import BrokerConfig
from rillet.broker.group.coordinator import (
    NONE,
    DeleteGroupResponse,
    GroupCoordinator,
    GroupState,
    Heartbeat,
    HeartbeatResponse,
    OffsetCommit,
    OffsetCommitResponse,
    OffsetDeleteResponse,
    Partitions,
    Step,
)
from rillet.broker.group.manager import (
    COORDINATOR_NOT_AVAILABLE,
    REQUEST_TIMED_OUT,
    GroupError,
    GroupManager,
)
from rillet.broker.group.placement import partition_for
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.runtime.tasks import on_death_log
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.controller.metadata.describe import OFFSETS_TOPIC
from rillet.controller.metadata.image import MetadataImage, TopicImage

logger = logging.getLogger(__name__)

Forward = Callable[[Any], Awaitable[Any]]
INVALID_REQUEST = errors.code_of("INVALID_REQUEST")
INVALID_GROUP_ID = errors.code_of("INVALID_GROUP_ID")
GROUP_ID_NOT_FOUND = errors.code_of("GROUP_ID_NOT_FOUND")
UNKNOWN_TOPIC = errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")
UNKNOWN_MEMBER_ID = errors.code_of("UNKNOWN_MEMBER_ID")
STALE_MEMBER_EPOCH = errors.code_of("STALE_MEMBER_EPOCH")
OFFSET_METADATA_TOO_LARGE = errors.code_of("OFFSET_METADATA_TOO_LARGE")
KEY_TYPE_GROUP = 0
# Kafka's offset.metadata.max.bytes default.
OFFSET_METADATA_MAX_BYTES = 4096
CREATE_TIMEOUT_MS = 30_000
NOT_ASKED = -(2**31)  # authorized_operations when the client did not ask
# Kafka's names of the consumer-group states, as ListGroups and describe show them.
STATE_NAMES = {
    GroupState.EMPTY: "Empty",
    GroupState.ASSIGNING: "Assigning",
    GroupState.RECONCILING: "Reconciling",
    GroupState.STABLE: "Stable",
}


def _parts(p: Partitions) -> list[m.GroupTopicPartitions]:
    return [m.GroupTopicPartitions(t, sorted(ps)) for t, ps in sorted(p.items()) if ps]


class GroupHandlers:
    def __init__(self, config: BrokerConfig, manager: GroupManager, forward: Forward) -> None:
        self.config = config
        self.manager = manager
        self.forward = forward
        self._creating: asyncio.Task[None] | None = None

    @property
    def image(self) -> MetadataImage:
        return self.manager.image

    def _now(self) -> int:
        return self.manager.clock()

    # --- FindCoordinator -----------------------------------------------------------------

    async def find_coordinator(self, request: Request) -> Response:
        req: m.FindCoordinatorRequest = request.message
        topic = self.image.topic(OFFSETS_TOPIC)
        waiting = "creating offsets"
        if topic is None and req.key_type == KEY_TYPE_GROUP:
            waiting = self._create_offsets_topic()
        out = []
        for key in req.coordinator_keys:
            if req.key_type != KEY_TYPE_GROUP:
                out.append(_no_coordinator(key, INVALID_REQUEST, "only groups (key_type 0)"))
            elif not key:
                out.append(_no_coordinator(key, INVALID_REQUEST, "empty group id"))
            elif topic is None:
                out.append(_no_coordinator(key, COORDINATOR_NOT_AVAILABLE, waiting))
            else:
                out.append(self._coordinator(key, topic, request.listener))
        return Response(m.FindCoordinatorResponse(coordinators=out))

    def _coordinator(self, key: str, topic: TopicImage, listener: str) -> m.Coordinator:
        index = partition_for(key, topic.partition_count or len(topic.partitions))
        p = topic.partitions.get(index)
        leader = -1 if p is None else p.leader
        # Where the coordinator serves the listener this request came in on.
        listener = listener or self.config.inter_broker_listener
        endpoint = self.manager.replicas.broker_endpoint(leader, listener)
        if leader < 0 or endpoint is None or not self.image.is_unfenced(leader):
            return _no_coordinator(key, COORDINATOR_NOT_AVAILABLE, f"partition {index}: no leader")
        host, port = endpoint
        return m.Coordinator(key, leader, host, port, NONE, None)

    def _create_offsets_topic(self) -> str:
        """Ask the controller for `__consumer_offsets` (once at a time) with Kafka's
        configs; what the coordinator is waiting for. Replication is
        offsets.topic.replication.factor capped at the brokers registered (fenced or
        not), and the topic is made only once that many are alive, as Kafka refuses to
        make it smaller: a topic made while one broker of three is up would keep a
        single replica for good."""
        if self._creating is not None and not self._creating.done():
            return "creating offsets"
        registered = len(self.image.brokers)
        rf = max(1, min(self.config["offsets.topic.replication.factor"], registered))
        alive = sum(1 for b in self.image.brokers if self.image.is_unfenced(b))
        if alive < rf:
            return f"offsets topic needs {rf} brokers alive, {alive} are"
        topic = m.CreatableTopic(
            name=OFFSETS_TOPIC,
            num_partitions=self.config["offsets.topic.num.partitions"],
            replication_factor=rf,
            assignments=[],
            configs={
                "cleanup.policy": "compact",
                "segment.bytes": str(self.config["offsets.topic.segment.bytes"]),
            },
        )
        request = m.CreateTopicsRequest(topics=[topic], timeout_ms=CREATE_TIMEOUT_MS)

        async def create() -> None:
            try:
                response: m.CreateTopicsResponse = await self.forward(request)
                (result,) = response.topics
                if result.error_code not in (NONE, errors.code_of("TOPIC_ALREADY_EXISTS")):
                    logger.warning("creating %s: %s", OFFSETS_TOPIC, result)
                else:
                    logger.info("%s created (replication %d)", OFFSETS_TOPIC, rf)
            except Exception as e:  # clients retry FindCoordinator, which asks again
                logger.warning("creating %s failed: %r", OFFSETS_TOPIC, e)

        self._creating = asyncio.get_running_loop().create_task(create(), name="create-offsets")
        on_death_log(self._creating, f"creating {OFFSETS_TOPIC}")
        return "creating offsets"

    # --- ConsumerGroupHeartbeat -------------------------------------------------------------

    async def heartbeat(self, request: Request) -> Response:
        req: m.ConsumerGroupHeartbeatRequest = request.message
        problem = _heartbeat_problem(req)
        if problem is not None:
            return _heartbeat_error(req, INVALID_REQUEST, problem)
        owned = (
            None
            if req.topic_partitions is None
            else {tp.topic_id: frozenset(tp.partitions) for tp in req.topic_partitions}
        )
        hb = Heartbeat(
            member_id=req.member_id,
            member_epoch=req.member_epoch,
            instance_id=req.instance_id,
            rack=req.rack_id,
            rebalance_timeout_ms=req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0 else None,
            subscribed_topics=(
                None
                if req.subscribed_topic_names is None
                else frozenset(req.subscribed_topic_names)
            ),
            server_assignor=req.server_assignor,
            owned=owned,
        )
        now = self._now()
        try:
            step = await self.manager.run(req.group_id, lambda g: g.heartbeat(hb, now))
        except GroupError as e:
            # Heartbeats retry on their own: a timed-out write is "not available" to them.
            code = COORDINATOR_NOT_AVAILABLE if e.code == REQUEST_TIMED_OUT else e.code
            return _heartbeat_error(req, code, None)
        resp = step.response
        assert isinstance(resp, HeartbeatResponse)
        if resp.error_code != NONE:
            return _heartbeat_error(req, resp.error_code, None, resp.heartbeat_interval_ms)
        return Response(
            m.ConsumerGroupHeartbeatResponse(
                member_id=resp.member_id,
                member_epoch=resp.member_epoch,
                heartbeat_interval_ms=resp.heartbeat_interval_ms,
                assignment=_parts(resp.assignment or {}),
            )
        )

    # --- OffsetCommit ------------------------------------------------------------------------

    async def offset_commit(self, request: Request) -> Response:
        req: m.OffsetCommitRequest = request.message
        codes: dict[tuple[str, int], int] = {}
        commits: list[OffsetCommit] = []
        for t in req.topics:
            topic = self.image.topic(t.name)
            for p in t.partitions:
                key = (t.name, p.partition)
                metadata = p.committed_metadata or ""
                if not req.group_id:
                    codes[key] = INVALID_GROUP_ID
                elif topic is None or p.partition not in topic.partitions:
                    codes[key] = UNKNOWN_TOPIC
                elif len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                    codes[key] = OFFSET_METADATA_TOO_LARGE
                else:
                    commits.append(
                        OffsetCommit(
                            req.member_id,
                            req.generation_id_or_member_epoch,
                            t.name,
                            p.partition,
                            p.committed_offset,
                            metadata,
                        )
                    )
        if commits:
            codes.update(await self._commit(req, commits))
        topics: dict[str, list[m.OffsetCommitPartitionResult]] = {}
        for t in req.topics:
            rows = topics.setdefault(t.name, [])
            rows += [
                m.OffsetCommitPartitionResult(p.partition, codes[(t.name, p.partition)])
                for p in t.partitions
            ]
        out = [m.OffsetCommitTopicResult(name, rows) for name, rows in topics.items()]
        return Response(m.OffsetCommitResponse(topics=out))

    async def _commit(
        self, req: m.OffsetCommitRequest, commits: list[OffsetCommit]
    ) -> dict[tuple[str, int], int]:
        codes: dict[tuple[str, int], int] = {}
        now = self._now()

        def event(g: GroupCoordinator) -> Step:
            if g.is_deleted and req.generation_id_or_member_epoch >= 0:
                # Kafka: a commit from a member of a group that does not exist.
                codes.update({(c.topic, c.partition): GROUP_ID_NOT_FOUND for c in commits})
                return Step()
            out = []
            for c in commits:
                step = g.commit_offset(c, now)
                assert isinstance(step.response, OffsetCommitResponse)
                codes[(c.topic, c.partition)] = step.response.error_code
                out += step.records
            return Step(tuple(out))

        try:
            await self.manager.run(req.group_id, event)
        except GroupError as e:
            return {(c.topic, c.partition): e.code for c in commits}
        return codes

    # --- OffsetFetch ---------------------------------------------------------------------------

    async def offset_fetch(self, request: Request) -> Response:
        req: m.OffsetFetchRequest = request.message
        # Concurrently: each group waits for its own writes only.
        out = list(await asyncio.gather(*(self._fetch_group(g) for g in req.groups)))
        return Response(m.OffsetFetchResponse(groups=out))

    async def _fetch_group(self, req: m.OffsetFetchGroup) -> m.OffsetFetchGroupResult:
        if not req.group_id:
            return m.OffsetFetchGroupResult(req.group_id, [], INVALID_GROUP_ID)
        try:
            g = await self.manager.committed(req.group_id)
        except GroupError as e:
            return m.OffsetFetchGroupResult(req.group_id, [], e.code)
        if req.member_id is not None and req.member_epoch >= 0:
            # KIP-848: a member reads the offsets at its own epoch.
            member = None if g is None else g.members.get(req.member_id)
            if member is None:
                return m.OffsetFetchGroupResult(req.group_id, [], UNKNOWN_MEMBER_ID)
            if member.member_epoch != req.member_epoch:
                return m.OffsetFetchGroupResult(req.group_id, [], STALE_MEMBER_EPOCH)
        offsets = {} if g is None else g.offsets
        if req.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(offsets):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in req.topics}
        topics = []
        for name, partitions in wanted.items():
            rows = []
            for p in partitions:
                record = offsets.get((name, p))
                if record is None:
                    rows.append(m.OffsetFetchPartitionResult(p, -1, -1, None, NONE))
                else:
                    rows.append(
                        m.OffsetFetchPartitionResult(p, record.offset, -1, record.metadata, NONE)
                    )
            topics.append(m.OffsetFetchTopicResult(name, rows))
        return m.OffsetFetchGroupResult(req.group_id, topics, NONE)

    # --- ListGroups, ConsumerGroupDescribe ---------------------------------------------------

    async def list_groups(self, request: Request) -> Response:
        req: m.ListGroupsRequest = request.message
        states = {s.lower() for s in req.states_filter}
        types = {t.lower() for t in req.types_filter}
        code = NONE
        if any(p.loading for p in self.manager.partitions.values()):
            code = errors.code_of("COORDINATOR_LOAD_IN_PROGRESS")
        out = []
        if not types or "consumer" in types:
            for group_id, group_state in self.manager.listed_groups():
                state = STATE_NAMES[group_state]
                if not states or state.lower() in states:
                    out.append(m.ListedGroup(group_id, "consumer", state, "consumer"))
        return Response(m.ListGroupsResponse(error_code=code, groups=out))

    async def describe(self, request: Request) -> Response:
        req: m.ConsumerGroupDescribeRequest = request.message
        out = list(await asyncio.gather(*(self._describe_one(g) for g in req.group_ids)))
        return Response(m.ConsumerGroupDescribeResponse(groups=out))

    async def _describe_one(self, group_id: str) -> m.DescribedGroup:
        def failed(code: int, message: str | None = None) -> m.DescribedGroup:
            return m.DescribedGroup(code, message, group_id, "", -1, -1, "", [], NOT_ASKED)

        if not group_id:
            return failed(INVALID_GROUP_ID, "empty group id")
        try:
            g = await self.manager.committed(group_id)
        except GroupError as e:
            return failed(e.code)
        if g is None or g.is_deleted:
            return failed(GROUP_ID_NOT_FOUND, f"group {group_id} does not exist")
        by_id = self.image.topics_by_id

        def named(parts: Partitions) -> list[m.DescribedTopicPartitions]:
            return [
                m.DescribedTopicPartitions(t, by_id[t].name if t in by_id else "", sorted(ps))
                for t, ps in sorted(parts.items())
                if ps
            ]

        members = [
            m.DescribedMember(
                member_id=mem.member_id,
                instance_id=mem.instance_id,
                rack_id=mem.rack,
                member_epoch=mem.member_epoch,
                client_id="",
                client_host="",
                subscribed_topic_names=sorted(mem.subscribed_topics),
                subscribed_topic_regex=None,
                assignment=named(mem.assigned),
                target_assignment=named(g.target.get(mem.member_id, {})),
            )
            for mem in sorted(g.members.values(), key=lambda mem: mem.member_id)
        ]
        return m.DescribedGroup(
            NONE,
            None,
            group_id,
            STATE_NAMES[g.state],
            g.group_epoch,
            g.target_assignment_epoch,
            g.assignor(),
            members,
            NOT_ASKED,
        )

    # --- DeleteGroups, OffsetDelete -------------------------------------------------------------

    async def delete_groups(self, request: Request) -> Response:
        req: m.DeleteGroupsRequest = request.message
        codes = await asyncio.gather(*(self._delete_group(g) for g in req.groups_names))
        out = [m.DeletableGroupResult(g, c) for g, c in zip(req.groups_names, codes, strict=True)]
        return Response(m.DeleteGroupsResponse(results=out))

    async def _delete_group(self, group_id: str) -> int:
        if not group_id:
            return INVALID_GROUP_ID
        try:
            g = await self.manager.committed(group_id)
            if g is None or g.is_deleted:
                return GROUP_ID_NOT_FOUND
            step = await self.manager.run(group_id, _delete_if_exists)
        except GroupError as e:
            return e.code
        assert isinstance(step.response, DeleteGroupResponse)
        return step.response.error_code

    async def offset_delete(self, request: Request) -> Response:
        req: m.OffsetDeleteRequest = request.message
        wanted = [(t.name, p) for t in req.topics for p in t.partitions]

        def answer(code: int, codes: dict[tuple[str, int], int]) -> Response:
            topics = [
                m.OffsetDeleteTopicResult(
                    t.name,
                    [
                        m.OffsetDeletePartitionResult(p, codes.get((t.name, p), NONE))
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ]
            return Response(m.OffsetDeleteResponse(error_code=code, topics=topics))

        if not req.group_id:
            return answer(INVALID_GROUP_ID, {})
        try:
            g = await self.manager.committed(req.group_id)
            if g is None or g.is_deleted:
                return answer(GROUP_ID_NOT_FOUND, {})
            step = await self.manager.run(
                req.group_id,
                # Deleted while we waited: not recreated by deleting its offsets.
                lambda g: Step() if g.is_deleted else g.delete_offsets(wanted),
            )
        except GroupError as e:
            return answer(e.code, {})
        if step.response is None:
            return answer(GROUP_ID_NOT_FOUND, {})
        assert isinstance(step.response, OffsetDeleteResponse)
        return answer(NONE, dict(step.response.error_codes))


def _delete_if_exists(g: GroupCoordinator) -> Step:
    # Checked again when applied: a concurrent DeleteGroups may have deleted it while
    # this one waited, and deleting a group that is gone must not answer NONE twice.
    if g.is_deleted:
        return Step((), DeleteGroupResponse(GROUP_ID_NOT_FOUND))
    return g.delete_group()


def _no_coordinator(key: str, code: int, message: str) -> m.Coordinator:
    return m.Coordinator(key, -1, "", -1, code, message)


def _heartbeat_problem(req: m.ConsumerGroupHeartbeatRequest) -> str | None:
    """What Kafka refuses as INVALID_REQUEST before the group is looked at."""
    if not req.group_id:
        return "group_id is empty"
    if not req.member_id:
        return "member_id is empty (a joining member chooses its id)"
    if req.instance_id == "":
        return "instance_id is empty (null for a dynamic member)"
    if req.rack_id == "":
        return "rack_id is empty (null for none)"
    if req.subscribed_topic_regex is not None:
        return "subscribed_topic_regex is not supported"
    if req.member_epoch == 0:
        if req.rebalance_timeout_ms == -1:
            return "a join must give rebalance_timeout_ms"
        if req.topic_partitions:
            return "a join must own no topic_partitions"
        if req.subscribed_topic_names is None:
            # Kafka also refuses an empty list; rillet's consumer joins with one while
            # its pattern matches no topic yet (patterns are matched client-side).
            return "a join must give subscribed_topic_names"
    elif req.member_epoch == -2 and req.instance_id is None:
        return "epoch -2 (a static member leaving) needs its instance_id"
    elif req.member_epoch < -2:
        return f"member_epoch {req.member_epoch} is invalid"
    return None


def _heartbeat_error(
    req: m.ConsumerGroupHeartbeatRequest,
    code: int,
    message: str | None,
    interval_ms: int = 0,
) -> Response:
    return Response(
        m.ConsumerGroupHeartbeatResponse(
            error_code=code,
            error_message=message,
            member_id=req.member_id,
            member_epoch=req.member_epoch,
            heartbeat_interval_ms=interval_ms,
        )
    )
