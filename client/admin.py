"""Cluster administration: topics, the cluster's description, leaders and reassignments,
consumer groups.

Every call goes to any broker (brokers forward topic changes, leader elections and
reassignments to the active controller) and is retried through retriable errors
(NOT_CONTROLLER, a broken connection, an election) until ``timeout_ms``. Per-topic
failures are raised as ``AdminError`` naming every topic that failed and why; its
``errors`` map holds the exception per topic (per ``topic-partition`` for reassignments).

Group calls go to each group's coordinator (FindCoordinator, batched where several
groups are asked at once) and follow it when it moves; ListGroups goes to every broker.
Group errors are keyed by group id and say what to do, e.g. that a group with members
must be stopped before its offsets are changed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rillet.client.group_coordinator import (
    LOADING,
    MOVED,
    CoordinatorClient,
    find_coordinators,
)
from rillet.client.metadata import (
    DEFAULT_BOOTSTRAP,
    NO_LEADER,
    BrokerInfo,
    ClusterMetadata,
    MetadataClient,
    PartitionInfo,
)
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, R, RequestMessage
from rillet.client.wire.errors import (
    CoordinatorNotAvailableError,
    ElectionNotNeededError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    IllegalGenerationError,
    LeaderNotAvailableError,
    NonEmptyGroupError,
    RequestTimedOutError,
    RilletError,
    StaleMemberEpochError,
    TopicAlreadyExistsError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    error_for,
)

T = TypeVar("T")
# How much longer than an operation's timeout_ms its request may take: the broker answers
# by then (a controller past timeout_ms answers REQUEST_TIMED_OUT).
CALL_MARGIN_MS = 5_000


class AdminError(Exception):
    """Some topics (or groups) failed; ``errors`` maps each name to its RilletError."""

    def __init__(
        self,
        action: str,
        errors: dict[str, RilletError],
        what: str = "topic",
        *,
        found: dict[str, Any] | None = None,
    ) -> None:
        detail = "; ".join(f"{name}: {e.name}: {e}" for name, e in errors.items())
        super().__init__(f"{action} failed for {len(errors)} {what}(s): {detail}")
        self.errors = errors
        self.found = found or {}  # what the call got for the others, where it says so


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: int = -1  # -1: the broker default
    replication_factor: int = -1
    configs: dict[str, str] = field(default_factory=dict)
    assignments: dict[int, list[int]] | None = None  # partition -> broker ids


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionInfo, ...]

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partitions": [
                {
                    "partition": p.partition,
                    "leader": p.leader,
                    "leader_epoch": p.leader_epoch,
                    "replicas": list(p.replicas),
                    "isr": list(p.isr),
                    "offline_replicas": list(p.offline_replicas),
                    "under_replicated": p.under_replicated,
                    "offline": p.leader < 0,
                }
                for p in self.partitions
            ],
        }


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerInfo, ...]
    fenced: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "controller_id": self.controller_id,
            "brokers": [
                {
                    "id": b.node_id,
                    "host": b.host,
                    "port": b.port,
                    "rack": b.rack,
                    "fenced": b.node_id in self.fenced,
                }
                for b in self.brokers
            ],
        }


TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One partition's answer to a leader election or a reassignment request."""

    topic: str
    partition: int  # -1 when the whole topic failed (e.g. unknown topic)
    error: RilletError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def error_name(self) -> str:
        return "NONE" if self.error is None else self.error.name

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "error": self.error_name,
            "message": None if self.error is None else str(self.error),
        }


# Reassignment states as seen from metadata (no ListPartitionReassignments API yet).
REASSIGNMENT_COMPLETE = "complete"
REASSIGNMENT_IN_PROGRESS = "in_progress"
REASSIGNMENT_ABSENT = "absent"  # never submitted, cancelled, or replaced by another


@dataclass(frozen=True, slots=True)
class ReassignmentStatus:
    """Where a partition stands against a target replica list.

    While a reassignment runs, the controller keeps ``replicas = target + removing``
    (KIP-455), so the target is a prefix of the replicas; the adding replicas are the
    target members not yet in the ISR.
    """

    topic: str
    partition: int
    target: tuple[int, ...]
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int

    @property
    def state(self) -> str:
        if self.replicas == self.target:
            return REASSIGNMENT_COMPLETE
        if self.replicas[: len(self.target)] == self.target:
            return REASSIGNMENT_IN_PROGRESS
        return REASSIGNMENT_ABSENT

    @property
    def adding(self) -> tuple[int, ...]:
        if self.state != REASSIGNMENT_IN_PROGRESS:
            return ()
        return tuple(b for b in self.target if b not in self.isr)

    @property
    def removing(self) -> tuple[int, ...]:
        if self.state != REASSIGNMENT_IN_PROGRESS:
            return ()
        return self.replicas[len(self.target) :]

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "state": self.state,
            "target": list(self.target),
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader": self.leader,
            "adding": list(self.adding),
            "removing": list(self.removing),
        }


# --- configs and the controller quorum -------------------------------------------------

RESOURCE_TOPIC = 2
# Kafka's ConfigSource names, by value.
CONFIG_SOURCES = {
    0: "UNKNOWN",
    1: "TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
}
# IncrementalAlterConfigs operations.
OP_SET, OP_DELETE = 0, 1
CONFIG_BATCH = 1000  # topics per DescribeConfigs request: bounded requests and answers


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config of a resource as a broker applies it: ``is_default`` when nothing set
    it for this resource (the value is then the broker's default)."""

    name: str
    value: str | None
    source: str  # CONFIG_SOURCES' names: TOPIC_CONFIG, DEFAULT_CONFIG...
    is_default: bool
    read_only: bool = False
    is_sensitive: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "source": self.source,
            "is_default": self.is_default,
            "read_only": self.read_only,
            "is_sensitive": self.is_sensitive,
        }


@dataclass(frozen=True, slots=True)
class QuorumVoter:
    """A controller voter as the active controller sees it; times are wall-clock ms
    (-1 when unknown)."""

    id: int
    log_end_offset: int
    lag: int  # the leader's log end minus this voter's
    last_fetch_timestamp: int = -1
    last_caught_up_timestamp: int = -1

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "log_end_offset": self.log_end_offset,
            "lag": self.lag,
            "last_fetch_timestamp": self.last_fetch_timestamp,
            "last_caught_up_timestamp": self.last_caught_up_timestamp,
        }


@dataclass(frozen=True, slots=True)
class QuorumDescription:
    leader_id: int  # the active controller
    leader_epoch: int  # its Raft term
    high_watermark: int  # the committed offset of the metadata log
    voters: tuple[QuorumVoter, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "leader_id": self.leader_id,
            "leader_epoch": self.leader_epoch,
            "high_watermark": self.high_watermark,
            "voters": [v.as_dict() for v in self.voters],
        }


def _quorum(r: m.DescribeQuorumResponse) -> QuorumDescription:
    leader_end = next((v.log_end_offset for v in r.current_voters if v.replica_id == r.node_id), -1)
    voters = tuple(
        QuorumVoter(
            v.replica_id,
            v.log_end_offset,
            max(leader_end - v.log_end_offset, 0) if v.log_end_offset >= 0 else -1,
            v.last_fetch_timestamp,
            v.last_caught_up_timestamp,
        )
        for v in r.current_voters
    )
    return QuorumDescription(r.leader_id, r.term, r.high_watermark, voters)


# --- consumer groups ---------------------------------------------------------------

EARLIEST = -2
"""ListOffsets' "log start" (the remote tier's when it holds older records)."""
LATEST = -1
"""ListOffsets' "log end" (the high watermark)."""

ACTIVE_MEMBERS = "has active members; stop them first"
"""Why a group with members refuses offset changes and deletion (docs/groups.md)."""


def _partitions_dict(parts: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    return {t: sorted(ps) for t, ps in sorted(parts.items())}


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One group as ListGroups names it, with the broker that coordinates it."""

    group_id: str
    state: str
    type: str
    protocol_type: str
    coordinator: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "state": self.state,
            "type": self.type,
            "protocol_type": self.protocol_type,
            "coordinator": self.coordinator,
        }


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    instance_id: str | None
    rack: str | None
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: Mapping[str, tuple[int, ...]]
    """topic name -> partitions the member owns now."""
    target: Mapping[str, tuple[int, ...]]
    """topic name -> partitions the coordinator means it to own once reconciled."""

    def owns(self, topic: str, partition: int) -> bool:
        return partition in self.assignment.get(topic, ())

    def as_dict(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "instance_id": self.instance_id,
            "rack": self.rack,
            "client_id": self.client_id,
            "client_host": self.client_host,
            "member_epoch": self.member_epoch,
            "subscribed_topics": list(self.subscribed_topics),
            "assignment": _partitions_dict(self.assignment),
            "target_assignment": _partitions_dict(self.target),
        }


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    coordinator: int
    members: tuple[GroupMember, ...] = ()

    def owner(self, topic: str, partition: int) -> GroupMember | None:
        """The member owning the partition now (None while it moves or is unassigned)."""
        return next((mb for mb in self.members if mb.owns(topic, partition)), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "state": self.state,
            "group_epoch": self.group_epoch,
            "assignment_epoch": self.assignment_epoch,
            "assignor": self.assignor,
            "coordinator": self.coordinator,
            "members": [mb.as_dict() for mb in self.members],
        }


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "leader_epoch": self.leader_epoch,
            "metadata": self.metadata,
        }


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group: None where there is no commit (or no log end known)."""

    topic: str
    partition: int
    committed_offset: int | None
    log_end_offset: int | None
    member: GroupMember | None = None

    @property
    def lag(self) -> int | None:
        """Log end minus committed; below 0 only for a commit past the log end (say, of
        a topic deleted and created again), shown rather than hidden."""
        if self.committed_offset is None or self.log_end_offset is None:
            return None
        return self.log_end_offset - self.committed_offset

    def as_dict(self) -> dict[str, Any]:
        mb = self.member
        return {
            "topic": self.topic,
            "partition": self.partition,
            "committed_offset": self.committed_offset,
            "log_end_offset": self.log_end_offset,
            "lag": self.lag,
            "member_id": mb.member_id if mb else None,
            "instance_id": mb.instance_id if mb else None,
            "client_id": mb.client_id if mb else None,
            "host": mb.client_host if mb else None,
        }


@dataclass(frozen=True, slots=True)
class GroupLag:
    """A group's description and, per partition, committed offset, log end and lag."""

    group: GroupDescription
    partitions: tuple[PartitionLag, ...]

    @property
    def total_lag(self) -> int:
        """Records behind, over all partitions (a negative lag counts as none)."""
        return sum(max(p.lag or 0, 0) for p in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.group.as_dict(),
            "total_lag": self.total_lag,
            "partitions": [p.as_dict() for p in self.partitions],
        }


@dataclass(frozen=True, slots=True)
class GroupResult:
    """One group's answer to a batched request (deletion): ok, or why not."""

    group_id: str
    error: RilletError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "error": "NONE" if self.error is None else self.error.name,
            "message": None if self.error is None else str(self.error),
        }


class Admin:
    """``async with Admin(bootstrap) as admin: await admin.create_topics([...])``."""

    def __init__(
        self,
        bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
        *,
        timeout_ms: int = 30_000,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        client_id: str = "rillet-admin",
    ) -> None:
        self.timeout_ms = timeout_ms
        self.retry_backoff_s = retry_backoff_ms / 1000
        self._meta = MetadataClient(
            bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        self._coordinators: dict[str, CoordinatorClient] = {}

    async def start(self) -> Admin:
        """Connect to a bootstrap broker; NetworkError at once when none answers (later
        calls retry through errors, the cluster was reachable once)."""
        await self._meta.any_connection()
        return self

    async def __aenter__(self) -> Admin:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._meta.close()

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            try:
                return await call()
            except RilletError as e:
                if not e.retriable or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(self.retry_backoff_s)

    async def _request(self, message: RequestMessage[R]) -> R:
        return await self._retrying(lambda: self._meta.request_any(message))

    # --- topics --------------------------------------------------------------------

    async def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> None:
        """Create topics; AdminError lists the ones that failed (e.g. already exists)."""
        todo = {t.name: t for t in topics}
        errors: dict[str, RilletError] = {}
        # An attempt that timed out (or lost its connection) may still create its topics:
        # a controller past timeout_ms answers REQUEST_TIMED_OUT and carries on. A retry
        # then hears TOPIC_ALREADY_EXISTS for our own topic; it counts as created once the
        # topic shows with the partitions and replication factor asked for.
        uncertain: set[str] = set()
        exists: dict[str, NewTopic] = {}
        deadline = time.monotonic() + self.timeout_ms / 1000
        while todo:
            request = m.CreateTopicsRequest(
                topics=[_creatable(t) for t in todo.values()],
                timeout_ms=self.timeout_ms,
                validate_only=validate_only,
            )
            try:
                # Past the operation's own timeout: the broker answers by then.
                response = await self._meta.request_any(
                    request, timeout_ms=self.timeout_ms + CALL_MARGIN_MS
                )
            except RilletError as e:
                if not e.retriable or time.monotonic() >= deadline:
                    raise
                uncertain.update(todo)
                await asyncio.sleep(self.retry_backoff_s)
                continue
            retry: dict[str, NewTopic] = {}
            for r in response.topics:
                if r.error_code == 0:
                    continue
                error = error_for(r.error_code, r.error_message or "")
                if isinstance(error, TopicAlreadyExistsError) and r.name in uncertain:
                    exists[r.name] = todo[r.name]
                elif error.retriable and time.monotonic() < deadline:
                    retry[r.name] = todo[r.name]
                    uncertain.add(r.name)
                else:
                    errors[r.name] = error
            todo = retry
            if todo:
                await asyncio.sleep(self.retry_backoff_s)
        for name, topic in exists.items():
            if not await self._shows_as_asked(topic, deadline):
                errors[name] = TopicAlreadyExistsError(f"topic {name!r} already exists")
        if errors:
            raise AdminError("create topics", errors)

    async def _shows_as_asked(self, topic: NewTopic, deadline: float) -> bool:
        """Whether ``topic`` is visible with the shape asked for (waiting, until
        ``deadline``, while a large topic is still being built and invisible)."""
        while True:
            try:
                (desc,) = await self.describe_topics([topic.name])
                parts = desc.partitions
                return (topic.num_partitions in (-1, len(parts))) and (
                    topic.replication_factor in (-1, len(parts[0].replicas) if parts else -1)
                )
            except (AdminError, RilletError):
                if time.monotonic() >= deadline:
                    return False
            await asyncio.sleep(self.retry_backoff_s)

    async def delete_topics(self, names: Iterable[str]) -> None:
        names = list(names)
        response = await self._request(
            m.DeleteTopicsRequest(topic_names=names, timeout_ms=self.timeout_ms)
        )
        errors = {
            r.name: error_for(r.error_code, r.error_message or "")
            for r in response.responses
            if r.error_code
        }
        if errors:
            raise AdminError("delete topics", errors)

    async def _metadata(self, topics: list[str] | None) -> ClusterMetadata:
        response = await self._request(m.MetadataRequest(topics))
        return ClusterMetadata.from_response(response, time.monotonic())

    async def list_topics(self) -> list[str]:
        return sorted((await self._metadata(None)).topics)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Leader, replicas and ISR of every partition (all topics when ``names`` is None)."""
        wanted = list(names) if names is not None else None
        snap = await self._metadata(wanted)
        missing = {
            n: error_for(
                snap.topic_errors.get(n, UnknownTopicOrPartitionError.code),
                f"topic {n!r} does not exist",
            )
            for n in wanted or ()
            if n not in snap.topics
        }
        if missing:
            raise AdminError("describe topics", missing)
        return [TopicDescription(n, snap.topics[n]) for n in (wanted or sorted(snap.topics))]

    async def describe_logs(
        self, topics: Iterable[TopicDescription]
    ) -> dict[tuple[str, int], m.DescribeLogDirsPartition]:
        """Each partition's log as its leader sees it (DescribeLogDirs): log start in
        either tier, local log start, sizes, remote segments and copy lag. One request
        per leader, all at once; a partition whose leader is down or answered an error
        is left out (the caller shows it as unknown)."""
        by_leader: dict[int, dict[str, list[int]]] = {}
        for t in topics:
            for p in t.partitions:
                if p.leader >= 0:
                    by_leader.setdefault(p.leader, {}).setdefault(t.name, []).append(p.partition)

        async def ask(node: int, wanted: dict[str, list[int]]) -> m.DescribeLogDirsResponse:
            request = m.DescribeLogDirsRequest(
                topics=[m.DescribeLogDirsTopic(t, ps) for t, ps in wanted.items()]
            )
            conn = await self._meta.connection(node)
            response, _ = await conn.call(request)
            return response

        nodes = list(by_leader)
        if any(n not in self._meta.snapshot.brokers for n in nodes):
            await self._meta.refresh(force=True)  # where each leader listens
        answers = await asyncio.gather(
            *(ask(n, by_leader[n]) for n in nodes), return_exceptions=True
        )
        out: dict[tuple[str, int], m.DescribeLogDirsPartition] = {}
        for answer in answers:
            if isinstance(answer, BaseException):
                if not isinstance(answer, (RilletError, OSError)):
                    raise answer
                continue
            for t in answer.topics:
                for r in t.partitions:
                    if r.error_code == 0:
                        out[(t.topic, r.partition)] = r
        return out

    async def describe_cluster(self) -> ClusterDescription:
        response = await self._request(m.DescribeClusterRequest())
        listed = sorted(response.brokers)
        brokers = tuple(BrokerInfo(b.broker_id, b.host, b.port, b.rack) for b in listed)
        fenced = tuple(b.broker_id for b in listed if b.is_fenced)
        return ClusterDescription(response.cluster_id, response.controller_id, brokers, fenced)

    # --- configs and the quorum ------------------------------------------------------

    async def describe_configs(
        self,
        topics: Iterable[str],
        *,
        keys: Iterable[str] | None = None,
        documentation: bool = False,
    ) -> dict[str, dict[str, ConfigEntry]]:
        """Every config of each topic, or only ``keys`` (DescribeConfigs, one request per
        ``CONFIG_BATCH`` topics): its own values as TOPIC_CONFIG, the rest with the
        broker's defaults as DEFAULT_CONFIG. AdminError names the topics that failed
        (unknown ones); its ``found`` holds the others' configs."""
        names = list(dict.fromkeys(topics))
        wanted = None if keys is None else list(keys)
        results: list[m.DescribeConfigsResult] = []
        for start in range(0, len(names), CONFIG_BATCH):
            request = m.DescribeConfigsRequest(
                resources=[
                    m.DescribeConfigsResource(RESOURCE_TOPIC, n, wanted)
                    for n in names[start : start + CONFIG_BATCH]
                ],
                include_documentation=documentation,
            )
            results += (await self._request(request)).results
        out: dict[str, dict[str, ConfigEntry]] = {}
        errors: dict[str, RilletError] = {}
        for r in results:
            if r.error_code:
                errors[r.resource_name] = error_for(r.error_code, r.error_message or "")
                continue
            out[r.resource_name] = {
                c.name: ConfigEntry(
                    c.name,
                    c.value,
                    CONFIG_SOURCES.get(c.config_source, "UNKNOWN"),
                    c.is_default,
                    c.read_only,
                    c.is_sensitive,
                )
                for c in r.configs
            }
        found = {n: out[n] for n in names if n in out}
        if errors:
            raise AdminError("describe configs", errors, found=found)
        return found

    async def incremental_alter_configs(
        self, changes: Mapping[str, Mapping[str, str | None]], *, validate_only: bool = False
    ) -> None:
        """Set (a value) or delete (None: back to the default) topic configs, each topic
        whole or not at all (IncrementalAlterConfigs, through the active controller).
        ``validate_only`` checks without changing anything. AdminError names each topic
        refused and why (INVALID_CONFIG, UNKNOWN_TOPIC_OR_PARTITION...)."""
        resources = [
            m.AlterConfigsResource(
                RESOURCE_TOPIC,
                topic,
                [
                    m.AlterableConfig(k, OP_DELETE, None)
                    if v is None
                    else m.AlterableConfig(k, OP_SET, str(v))
                    for k, v in keys.items()
                ],
            )
            for topic, keys in changes.items()
        ]
        if not resources:
            return
        response = await self._request(
            m.IncrementalAlterConfigsRequest(resources=resources, validate_only=validate_only)
        )
        errors = {
            r.resource_name: error_for(r.error_code, r.error_message or "")
            for r in response.responses
            if r.error_code
        }
        if errors:
            raise AdminError("alter configs", errors)

    async def describe_quorum(self, *, retry: bool = True) -> QuorumDescription:
        """The controller quorum as its active controller sees it (a broker forwards the
        request there): leader, epoch, high watermark and each voter's log end and lag.
        Without an active controller a broker answers NOT_CONTROLLER within seconds;
        ``retry`` then asks again until ``timeout_ms`` (False: raises at once)."""
        request = m.DescribeQuorumRequest(leader_only=True)
        response = await (self._request(request) if retry else self._meta.request_any(request))
        return _quorum(response)

    # --- leaders and reassignments -------------------------------------------------

    async def elect_leaders(
        self,
        topics: Iterable[str] | None = None,
        partitions: Iterable[TopicPartitionKey] | None = None,
    ) -> list[PartitionResult]:
        """Preferred-leader election (Kafka's ElectLeaders, type PREFERRED).

        ``topics`` None (and no ``partitions``) means every topic. ``partitions`` narrows
        the answer to those partitions; the request itself names topics (the ElectLeaders
        schema carries no partition list), so the controller also moves any other
        partition of those topics that is off its preferred leader. A partition already
        led by its preferred replica answers ELECTION_NOT_NEEDED; one whose preferred
        replica is down or out of the ISR answers PREFERRED_LEADER_NOT_AVAILABLE. Per-
        partition errors are returned, not raised: the caller decides what is a failure.
        """
        wanted = [(t, p) for t, p in partitions] if partitions is not None else None
        names: list[str] | None
        if wanted is not None:
            names = sorted({t for t, _ in wanted} | set(topics or ()))
        else:
            names = sorted(set(topics)) if topics is not None else None
        response = await self._request(
            m.ElectLeadersRequest(election_type=0, topics=names, timeout_ms=self.timeout_ms)
        )
        results = _partition_results(response.results)
        if wanted is None:
            return results
        by_key = {(r.topic, r.partition): r for r in results}
        out = []
        for topic, partition in wanted:
            r = by_key.get((topic, partition)) or by_key.get((topic, -1))  # -1: whole topic
            error = (
                r.error
                if r is not None
                else UnknownTopicOrPartitionError(f"{topic}-{partition} does not exist")
            )
            out.append(PartitionResult(topic, partition, error))
        return out

    async def alter_partition_reassignments(
        self, moves: Mapping[TopicPartitionKey, Sequence[int] | None]
    ) -> None:
        """Start (target replica list) or cancel (None) reassignments (KIP-455).

        The controller adds the new replicas at once; they catch up and join the ISR,
        and then the old ones are dropped (``list_partition_reassignments`` follows it).
        AdminError names every partition that was refused, e.g. INVALID_REPLICA_ASSIGNMENT
        or NO_REASSIGNMENT_IN_PROGRESS (keys ``topic-partition``); the others went ahead.
        """
        items = [
            m.ReassignablePartition(t, p, None if r is None else [int(b) for b in r])
            for (t, p), r in moves.items()
        ]
        if not items:
            return
        response = await self._request(
            m.AlterPartitionReassignmentsRequest(partitions=items, timeout_ms=self.timeout_ms)
        )
        errors = {
            f"{r.topic}-{r.partition}": r.error
            for r in _partition_results(response.results)
            if r.error is not None
        }
        if errors:
            raise AdminError("alter partition reassignments", errors)

    async def list_partition_reassignments(
        self, targets: Mapping[TopicPartitionKey, Sequence[int]]
    ) -> list[ReassignmentStatus]:
        """Each target partition's state against its target replicas, from metadata.

        The wire has no ListPartitionReassignments yet, and Metadata does not carry the
        adding/removing lists, so this works from the plan (as kafka-reassign-partitions
        --verify does): complete when the replicas equal the target, in progress while
        the target is a prefix of them (target + the replicas being removed).
        """
        names = sorted({t for t, _ in targets})
        snap = await self._metadata(names)
        out = []
        for (topic, partition), target in targets.items():
            parts = {p.partition: p for p in snap.topics.get(topic, ())}
            p = parts.get(partition)
            if p is None:
                raise AdminError(
                    "list partition reassignments",
                    {
                        f"{topic}-{partition}": UnknownTopicOrPartitionError(
                            f"{topic}-{partition} does not exist"
                        )
                    },
                )
            out.append(
                ReassignmentStatus(topic, partition, tuple(target), p.replicas, p.isr, p.leader)
            )
        return out

    # --- consumer groups -------------------------------------------------------------

    def _coordinator(self, group: str) -> CoordinatorClient:
        client = self._coordinators.get(group)
        if client is None:
            client = CoordinatorClient(
                self._meta, group, retry_backoff_ms=int(self.retry_backoff_s * 1000)
            )
            self._coordinators[group] = client
        return client

    async def _ask_coordinators(
        self,
        groups: Iterable[str],
        ask: Callable[[Connection, list[str]], Awaitable[Mapping[str, tuple[int, T]]]],
    ) -> dict[str, tuple[int, int, T] | RilletError]:
        """One FindCoordinator for every group, then ``ask`` each coordinator about its
        groups in one request; ``ask`` maps each group to (error code, its answer row).
        Groups whose coordinator moved, is loading or did not answer are looked up and
        asked again until ``timeout_ms``. Each group ends as (coordinator, code, row) or
        as the error that stopped it."""
        pending = list(dict.fromkeys(groups))
        out: dict[str, tuple[int, int, T] | RilletError] = {}
        last: dict[str, RilletError] = {}
        deadline = time.monotonic() + self.timeout_ms / 1000

        async def one(
            node: int, host: str, port: int, gs: list[str]
        ) -> Mapping[str, tuple[int, T]]:
            conn = await self._meta.connect_to(node, host, port)
            try:
                return await ask(conn, gs)
            except RequestTimedOutError:
                conn.close()  # as CoordinatorClient: a timed-out connection is not reused
                raise

        while pending:
            try:
                found = await find_coordinators(self._meta, pending)
            except RilletError as e:
                if not e.retriable:
                    raise
                found = {}
                last.update((g, e) for g in pending)
            by_node: dict[tuple[int, str, int], list[str]] = {}
            for g in pending:
                c = found.get(g)
                if c is None:
                    last.setdefault(g, CoordinatorNotAvailableError(f"group {g!r}"))
                elif c.error_code != 0:
                    error = error_for(c.error_code, c.error_message or f"group {g!r}")
                    if error.retriable:
                        last[g] = error
                    else:
                        out[g] = error
                else:
                    by_node.setdefault((c.node_id, c.host, c.port), []).append(g)
            answers = await asyncio.gather(
                *(one(*node, gs) for node, gs in by_node.items()), return_exceptions=True
            )
            for (node, gs), answer in zip(by_node.items(), answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, RilletError) or not answer.retriable:
                        raise answer
                    last.update((g, answer) for g in gs)
                    continue
                for g in gs:
                    if g not in answer:
                        last[g] = CoordinatorNotAvailableError(f"no answer for group {g!r}")
                        continue
                    code, row = answer[g]
                    if code in MOVED or code == LOADING:
                        last[g] = error_for(code, f"group {g!r}")
                    else:
                        out[g] = (node[0], code, row)
            pending = [g for g in pending if g not in out]
            if pending:
                if time.monotonic() + self.retry_backoff_s >= deadline:
                    out.update((g, last[g]) for g in pending)
                    break
                await asyncio.sleep(self.retry_backoff_s)
        return out

    async def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        """Every group (ListGroups to every broker: each lists the groups it
        coordinates), sorted by id; ``states`` keeps only groups in those states (any
        case). A broker that does not answer fails the call: a partial list would look
        like a complete one."""
        wanted = {s.lower() for s in states} if states is not None else None
        snap = await self._metadata([])

        async def ask(b: BrokerInfo) -> m.ListGroupsResponse:
            conn = await self._meta.connect_to(b.node_id, b.host, b.port)
            response, _ = await conn.call(m.ListGroupsRequest())
            if response.error_code:
                raise error_for(response.error_code, f"broker {b.node_id} (ListGroups)")
            return response

        brokers = sorted(snap.brokers.values(), key=lambda b: b.node_id)
        answers = await asyncio.gather(
            *(self._retrying(lambda b=b: ask(b)) for b in brokers), return_exceptions=True
        )
        out: dict[str, GroupListing] = {}
        for b, answer in zip(brokers, answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, RilletError):
                    raise type(answer)(f"broker {b.node_id} did not list its groups: {answer}")
                raise answer
            for g in answer.groups:
                if wanted is None or g.group_state.lower() in wanted:
                    # While a group moves two brokers may list it: keep one.
                    out.setdefault(
                        g.group_id,
                        GroupListing(
                            g.group_id, g.group_state, g.group_type, g.protocol_type, b.node_id
                        ),
                    )
        return [out[g] for g in sorted(out)]

    async def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        """State, epochs, assignor and members (assignment and target by topic name) of
        each group, in the order asked; AdminError names every group that failed, e.g.
        GROUP_ID_NOT_FOUND."""
        ids = list(dict.fromkeys(group_ids))
        found = await self._describe(ids)
        errors = {g: d for g, d in found.items() if isinstance(d, RilletError)}
        if errors:
            raise AdminError("describe groups", errors, "group")
        return [d for d in found.values() if isinstance(d, GroupDescription)]

    async def _describe(self, ids: list[str]) -> dict[str, GroupDescription | RilletError]:
        async def ask(conn: Connection, gs: list[str]) -> dict[str, tuple[int, m.DescribedGroup]]:
            response, _ = await conn.call(m.ConsumerGroupDescribeRequest(gs))
            return {g.group_id: (g.error_code, g) for g in response.groups}

        answers = await self._ask_coordinators(ids, ask)
        out: dict[str, GroupDescription | RilletError] = {}
        for g in ids:
            answer = answers[g]
            if isinstance(answer, RilletError):
                out[g] = answer
                continue
            node, code, row = answer
            out[g] = _group_error(g, code, row.error_message) if code else _description(row, node)
        return out

    async def _describe_or_none(self, group: str) -> GroupDescription | None:
        """The group's description, None when the coordinator knows no such group."""
        answer = (await self._describe([group]))[group]
        if isinstance(answer, GroupIdNotFoundError):
            return None
        if isinstance(answer, RilletError):
            raise AdminError("describe groups", {group: answer}, "group")
        return answer

    async def list_group_offsets(
        self, group: str, partitions: Iterable[TopicPartitionKey] | None = None
    ) -> dict[TopicPartitionKey, CommittedOffset]:
        """The group's committed offsets (OffsetFetch), of ``partitions`` or of every
        partition it committed; a partition without a commit is left out."""
        topics = None
        if partitions is not None:
            topics = [m.OffsetFetchTopic(t, ps) for t, ps in _by_topic(partitions).items()]
        request = m.OffsetFetchRequest(
            [m.OffsetFetchGroup(group_id=group, member_id=None, member_epoch=-1, topics=topics)]
        )
        response = await self._coordinator(group).call(
            request, lambda r: r.groups[0].error_code if r.groups else 0, timeout_ms=self.timeout_ms
        )
        out: dict[TopicPartitionKey, CommittedOffset] = {}
        errors: dict[str, RilletError] = {}
        for result in response.groups:
            if result.error_code:
                errors[group] = _group_error(group, result.error_code, None)
                continue
            for t in result.topics:
                for p in t.partitions:
                    if p.error_code:
                        errors[f"{t.name}-{p.partition}"] = error_for(p.error_code)
                    elif p.committed_offset >= 0:
                        out[(t.name, p.partition)] = CommittedOffset(
                            t.name,
                            p.partition,
                            p.committed_offset,
                            p.committed_leader_epoch,
                            p.metadata,
                        )
        if errors:
            raise AdminError("list group offsets", errors, "group")
        return dict(sorted(out.items()))

    async def list_offsets_of_groups(
        self, group_ids: Iterable[str]
    ) -> dict[str, dict[TopicPartitionKey, CommittedOffset] | RilletError]:
        """Every committed offset of each group, many groups per request: one
        FindCoordinator for them all, then one OffsetFetch per coordinator naming all
        its groups (``list_group_offsets`` asks about one group). Per group: its
        offsets (empty when it committed none), or the error that stopped it."""
        ids = list(dict.fromkeys(group_ids))

        async def ask(
            conn: Connection, gs: list[str]
        ) -> dict[str, tuple[int, m.OffsetFetchGroupResult]]:
            request = m.OffsetFetchRequest([m.OffsetFetchGroup(g, None, -1, None) for g in gs])
            response, _ = await conn.call(request)
            return {r.group_id: (r.error_code, r) for r in response.groups}

        answers = await self._ask_coordinators(ids, ask) if ids else {}
        out: dict[str, dict[TopicPartitionKey, CommittedOffset] | RilletError] = {}
        for g in ids:
            answer = answers[g]
            if isinstance(answer, RilletError):
                out[g] = answer
            elif answer[1]:
                out[g] = _group_error(g, answer[1], None)
            else:
                out[g] = {
                    (t.name, p.partition): CommittedOffset(
                        t.name,
                        p.partition,
                        p.committed_offset,
                        p.committed_leader_epoch,
                        p.metadata,
                    )
                    for t in answer[2].topics
                    for p in t.partitions
                    if not p.error_code and p.committed_offset >= 0
                }
        return out

    async def alter_group_offsets(
        self, group: str, offsets: Mapping[TopicPartitionKey, int]
    ) -> None:
        """Commit ``offsets`` for the group from outside it (OffsetCommit with no member
        and epoch -1). The coordinator takes such a commit only while the group has no
        members, so that no consumer overwrites it or reads past it unaware; otherwise
        AdminError says the group has active members."""
        if not offsets:
            return
        by_topic: dict[str, list[m.OffsetCommitPartition]] = {}
        for (t, p), offset in sorted(offsets.items()):
            by_topic.setdefault(t, []).append(m.OffsetCommitPartition(p, offset))
        request = m.OffsetCommitRequest(
            group_id=group,
            topics=[m.OffsetCommitTopic(t, ps) for t, ps in by_topic.items()],
            generation_id_or_member_epoch=-1,
            member_id="",
        )

        def moved(r: m.OffsetCommitResponse) -> int:
            codes = (p.error_code for t in r.topics for p in t.partitions)
            return next((c for c in codes if c in MOVED or c == LOADING), 0)

        response = await self._coordinator(group).call(request, moved, timeout_ms=self.timeout_ms)
        codes = {(t.name, p.partition): p.error_code for t in response.topics for p in t.partitions}
        if any(c in MEMBER_ERRORS for c in codes.values()):
            error = _group_error(group, NON_EMPTY_GROUP, None)
            raise AdminError("alter group offsets", {group: error}, "group")
        errors = {f"{t}-{p}": error_for(c, f"{t}-{p}") for (t, p), c in codes.items() if c}
        if errors:
            raise AdminError("alter group offsets", errors, "partition")

    async def delete_groups(self, group_ids: Iterable[str]) -> list[GroupResult]:
        """Delete groups with their committed offsets (DeleteGroups), in the order
        asked. Only a group without members is deleted; per-group errors are returned,
        not raised (NON_EMPTY_GROUP: it has active members; GROUP_ID_NOT_FOUND)."""
        ids = list(dict.fromkeys(group_ids))

        async def ask(conn: Connection, gs: list[str]) -> dict[str, tuple[int, None]]:
            response, _ = await conn.call(m.DeleteGroupsRequest(gs))
            return {r.group_id: (r.error_code, None) for r in response.results}

        answers = await self._ask_coordinators(ids, ask)
        out = []
        for g in ids:
            answer = answers[g]
            if isinstance(answer, RilletError):
                out.append(GroupResult(g, answer))
            else:
                code = answer[1]
                out.append(GroupResult(g, _group_error(g, code, None) if code else None))
        return out

    async def delete_group_offsets(
        self, group: str, partitions: Iterable[TopicPartitionKey]
    ) -> None:
        """Drop the group's committed offsets of ``partitions`` (OffsetDelete). Refused
        for a topic the group's members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC): they
        would lose their position while reading it."""
        by_topic = _by_topic(partitions)
        if not by_topic:
            return
        request = m.OffsetDeleteRequest(
            group, [m.OffsetDeleteTopic(t, ps) for t, ps in by_topic.items()]
        )
        response = await self._coordinator(group).call(
            request, lambda r: r.error_code, timeout_ms=self.timeout_ms
        )
        if response.error_code:
            error = _group_error(group, response.error_code, None)
            raise AdminError("delete group offsets", {group: error}, "group")
        errors: dict[str, RilletError] = {}
        for t in response.topics:
            for p in t.partitions:
                key = f"{t.name}-{p.partition}"
                if p.error_code == GroupSubscribedToTopicError.code:
                    errors[key] = GroupSubscribedToTopicError(
                        f"group {group!r} is subscribed to topic {t.name!r}; "
                        "stop its members or change their subscription first"
                    )
                elif p.error_code:
                    errors[key] = error_for(p.error_code, key)
        if errors:
            raise AdminError("delete group offsets", errors, "partition")

    async def group_lag(self, group: str) -> GroupLag:
        """The group's description and, for every partition of the topics its members
        subscribe to or it committed offsets in: committed offset (None when none),
        log end offset (ListOffsets latest), lag and the member owning it. A group the
        coordinator does not know but with committed offsets shows as Empty."""
        desc = await self._describe_or_none(group)
        committed = await self.list_group_offsets(group)
        if desc is None:
            if not committed:
                error = GroupIdNotFoundError(f"group {group!r} does not exist")
                raise AdminError("describe groups", {group: error}, "group")
            coordinator = self._coordinator(group).node_id
            desc = GroupDescription(
                group, "Empty", 0, 0, "", -1 if coordinator is None else coordinator
            )
        topics = {t for t, _ in committed}
        for mb in desc.members:
            topics.update(mb.subscribed_topics, mb.assignment, mb.target)
        snap = await self._metadata(sorted(topics))
        keys = {(t, p.partition) for t in topics for p in snap.topics.get(t, ())}
        try:
            ends = await self.list_offsets(dict.fromkeys(sorted(keys), LATEST)) if keys else {}
        except AdminError as e:
            # A partition without a leader has no log end to give: its lag is unknown
            # (None), the others' still shown.
            ends = e.found
        rows = [
            PartitionLag(
                t,
                p,
                committed[(t, p)].offset if (t, p) in committed else None,
                ends.get((t, p)),
                desc.owner(t, p),
            )
            for t, p in sorted(keys | set(committed))
        ]
        return GroupLag(desc, tuple(rows))

    async def list_offsets(
        self, specs: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int]:
        """ListOffsets to each partition's leader: ``EARLIEST``, ``LATEST`` or a
        timestamp in ms (the first record at or after it; -1 when there is none),
        retrying through leader changes until ``timeout_ms``. AdminError names unknown
        topics and partitions."""
        todo = dict(specs)
        topics = sorted({t for t, _ in todo})
        snap = await self._metadata(topics)
        missing: dict[str, RilletError] = {}
        for t, p in todo:
            parts = snap.topics.get(t)
            if parts is None:
                missing[t] = UnknownTopicOrPartitionError(f"topic {t!r} does not exist")
            elif not 0 <= p < len(parts):
                missing[f"{t}-{p}"] = UnknownTopicOrPartitionError(f"{t}-{p} does not exist")
        if missing:
            raise AdminError("list offsets", missing)
        out: dict[TopicPartitionKey, int] = {}
        deadline = time.monotonic() + self.timeout_ms / 1000

        async def ask(node: int, keys: list[TopicPartitionKey]) -> list[m.ListOffsetsTopicResult]:
            b = snap.brokers[node]
            by_topic: dict[str, list[m.ListOffsetsPartition]] = {}
            for t, p in keys:
                epoch = snap.topics[t][p].leader_epoch
                by_topic.setdefault(t, []).append(m.ListOffsetsPartition(p, epoch, todo[(t, p)]))
            request = m.ListOffsetsRequest(
                [m.ListOffsetsTopic(t, ps) for t, ps in by_topic.items()]
            )
            conn = await self._meta.connect_to(node, b.host, b.port)
            response, _ = await conn.call(request)
            return response.topics

        while True:
            by_leader: dict[int, list[TopicPartitionKey]] = {}
            for key in todo:
                by_leader.setdefault(snap.leader_for(*key), []).append(key)
            retry: dict[TopicPartitionKey, RilletError] = {
                key: LeaderNotAvailableError(f"{key[0]}-{key[1]} has no leader")
                for key in by_leader.pop(NO_LEADER, [])
            }
            nodes = list(by_leader)
            answers = await asyncio.gather(
                *(ask(n, by_leader[n]) for n in nodes), return_exceptions=True
            )
            for node, answer in zip(nodes, answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, RilletError) or not answer.retriable:
                        raise answer
                    retry.update((key, answer) for key in by_leader[node])
                    continue
                for t in answer:
                    for r in t.partitions:
                        key = (t.topic, r.partition)
                        if r.error_code == 0:
                            out[key] = r.offset
                            continue
                        error = error_for(r.error_code, f"ListOffsets {t.topic}-{r.partition}")
                        if not error.retriable:
                            raise AdminError("list offsets", {f"{t.topic}-{r.partition}": error})
                        retry[key] = error
            todo = {key: todo[key] for key in retry}
            if not todo:
                return out
            if time.monotonic() + self.retry_backoff_s >= deadline:
                # ``found``: the partitions that did answer, for callers that can use them.
                errors = {f"{t}-{p}": e for (t, p), e in retry.items()}
                raise AdminError("list offsets", errors, found=dict(out))
            await asyncio.sleep(self.retry_backoff_s)
            snap = await self._metadata(topics)


def _creatable(t: NewTopic) -> m.CreatableTopic:
    assignments = [
        m.ReplicaAssignment(p, list(ids)) for p, ids in sorted((t.assignments or {}).items())
    ]
    configs = {str(k): str(v) for k, v in t.configs.items()}
    return m.CreatableTopic(t.name, t.num_partitions, t.replication_factor, assignments, configs)


def _partition_results(rows: Iterable[m.PartitionResult]) -> list[PartitionResult]:
    out = []
    for r in rows:
        error = None if r.error_code == 0 else error_for(r.error_code, r.error_message or "")
        out.append(PartitionResult(r.topic, r.partition, error))
    return out


def election_succeeded(result: PartitionResult) -> bool:
    """Elected now, or already led by the preferred replica."""
    return result.error is None or isinstance(result.error, ElectionNotNeededError)


NON_EMPTY_GROUP = NonEmptyGroupError.code
# What a commit from outside the group hears while the group has members: the
# coordinator takes member-less commits only for a group without members.
MEMBER_ERRORS = frozenset(
    {
        NON_EMPTY_GROUP,
        UnknownMemberIdError.code,
        IllegalGenerationError.code,
        StaleMemberEpochError.code,
        FencedMemberEpochError.code,
    }
)


def _group_error(group: str, code: int, message: str | None) -> RilletError:
    """A group-level error code as an error that says what to do about it."""
    if code == GroupIdNotFoundError.code:
        return GroupIdNotFoundError(f"group {group!r} does not exist")
    if code == NON_EMPTY_GROUP:
        return NonEmptyGroupError(f"group {group!r} {ACTIVE_MEMBERS}")
    return error_for(code, message or f"group {group!r}")


def _by_topic(partitions: Iterable[TopicPartitionKey]) -> dict[str, list[int]]:
    out: dict[str, set[int]] = {}
    for t, p in partitions:
        out.setdefault(t, set()).add(p)
    return {t: sorted(ps) for t, ps in sorted(out.items())}


def _assignment(parts: Iterable[m.DescribedTopicPartitions]) -> dict[str, tuple[int, ...]]:
    # The topic name; its id only when the coordinator no longer knows the topic.
    return {(tp.topic_name or tp.topic_id): tuple(sorted(tp.partitions)) for tp in parts}


def _description(row: m.DescribedGroup, coordinator: int) -> GroupDescription:
    members = tuple(
        GroupMember(
            member_id=mb.member_id,
            instance_id=mb.instance_id,
            rack=mb.rack_id,
            client_id=mb.client_id,
            client_host=mb.client_host,
            member_epoch=mb.member_epoch,
            subscribed_topics=tuple(sorted(mb.subscribed_topic_names)),
            assignment=_assignment(mb.assignment),
            target=_assignment(mb.target_assignment),
        )
        for mb in sorted(row.members, key=lambda mb: mb.member_id)
    )
    return GroupDescription(
        row.group_id,
        row.group_state,
        row.group_epoch,
        row.assignment_epoch,
        row.assignor_name,
        coordinator,
        members,
    )


__all__ = [
    "EARLIEST",
    "LATEST",
    "Admin",
    "AdminError",
    "ClusterDescription",
    "CommittedOffset",
    "GroupDescription",
    "GroupLag",
    "GroupListing",
    "GroupMember",
    "GroupResult",
    "NewTopic",
    "PartitionLag",
    "PartitionResult",
    "ReassignmentStatus",
    "TopicDescription",
    "election_succeeded",
]
