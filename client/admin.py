"""Cluster administration: topics, the cluster's description, leaders and reassignments.

Every call goes to any broker (brokers forward topic changes, leader elections and
reassignments to the active controller) and is retried through retriable errors
(NOT_CONTROLLER, a broken connection, an election) until ``timeout_ms``. Per-topic
failures are raised as ``AdminError`` naming every topic that failed and why; its
``errors`` map holds the exception per topic (per ``topic-partition`` for reassignments).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rillet.client.metadata import (
    DEFAULT_BOOTSTRAP,
    BrokerInfo,
    ClusterMetadata,
    MetadataClient,
    PartitionInfo,
)
from rillet.client.wire import messages as m
from rillet.client.wire.connection import R, RequestMessage
from rillet.client.wire.errors import (
    ElectionNotNeededError,
    RilletError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    error_for,
)

T = TypeVar("T")
# How much longer than an operation's timeout_ms its request may take: the broker answers
# by then (a controller past timeout_ms answers REQUEST_TIMED_OUT).
CALL_MARGIN_MS = 5_000


class AdminError(Exception):
    """Some topics failed; ``errors`` maps each topic name to its RilletError."""

    def __init__(self, action: str, errors: dict[str, RilletError]) -> None:
        detail = "; ".join(f"{name}: {e.name}: {e}" for name, e in errors.items())
        super().__init__(f"{action} failed for {len(errors)} topic(s): {detail}")
        self.errors = errors


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


__all__ = [
    "Admin",
    "AdminError",
    "ClusterDescription",
    "NewTopic",
    "PartitionResult",
    "ReassignmentStatus",
    "TopicDescription",
    "election_succeeded",
]
