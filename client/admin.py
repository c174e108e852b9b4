"""Cluster administration: topics and the cluster's description.

Every call goes to any broker (brokers forward topic changes to the active controller)
and is retried through retriable errors (NOT_CONTROLLER, a broken connection, an
election) until ``timeout_ms``. Per-topic failures are raised as ``AdminError`` naming
every topic that failed and why; its ``errors`` map holds the exception per topic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rillet.client import schemas
from rillet.client.errors import RilletError, UnknownTopicOrPartitionError, error_for
from rillet.client.metadata import (
    DEFAULT_BOOTSTRAP,
    BrokerInfo,
    ClusterMetadata,
    MetadataClient,
    PartitionInfo,
)

T = TypeVar("T")


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
                {"id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
                 "fenced": b.node_id in self.fenced}
                for b in self.brokers
            ],
        }  # fmt: skip


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

    async def _request(self, api: schemas.Api, fields: dict[str, Any]) -> dict[str, Any]:
        return await self._retrying(lambda: self._meta.request_any(api, fields))

    # --- topics --------------------------------------------------------------------

    async def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> None:
        """Create topics; AdminError lists the ones that failed (e.g. already exists)."""
        todo = {t.name: t for t in topics}
        errors: dict[str, RilletError] = {}
        deadline = time.monotonic() + self.timeout_ms / 1000
        while todo:
            header = await self._request(schemas.CREATE_TOPICS, {
                "topics": [_new_topic_fields(t) for t in todo.values()],
                "timeout_ms": self.timeout_ms,
                "validate_only": validate_only,
            })  # fmt: skip
            retry: dict[str, NewTopic] = {}
            for name, code, message, *_ in header["topics"]:
                if code == 0:
                    continue
                error = error_for(code, message or "")
                if error.retriable and time.monotonic() < deadline:
                    retry[name] = todo[name]
                else:
                    errors[name] = error
            todo = retry
            if todo:
                await asyncio.sleep(self.retry_backoff_s)
        if errors:
            raise AdminError("create topics", errors)

    async def delete_topics(self, names: Iterable[str]) -> None:
        names = list(names)
        header = await self._request(
            schemas.DELETE_TOPICS, {"topic_names": names, "timeout_ms": self.timeout_ms}
        )
        errors = {
            name: error_for(code, message or "")
            for name, code, message, *_ in header["responses"]
            if code
        }
        if errors:
            raise AdminError("delete topics", errors)

    async def _metadata(self, topics: list[str] | None) -> ClusterMetadata:
        header = await self._request(schemas.METADATA, {"topics": topics})
        return ClusterMetadata.from_response(header, time.monotonic())

    async def list_topics(self) -> list[str]:
        return sorted((await self._metadata(None)).topics)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Leader, replicas and ISR of every partition (all topics when ``names`` is None)."""
        wanted = list(names) if names is not None else None
        snap = await self._metadata(wanted)
        missing = {
            n: error_for(snap.topic_errors.get(n, UnknownTopicOrPartitionError.code),
                         f"topic {n!r} does not exist")
            for n in wanted or () if n not in snap.topics
        }  # fmt: skip
        if missing:
            raise AdminError("describe topics", missing)
        return [TopicDescription(n, snap.topics[n]) for n in (wanted or sorted(snap.topics))]

    async def describe_cluster(self) -> ClusterDescription:
        header = await self._request(schemas.DESCRIBE_CLUSTER, {})
        brokers = tuple(
            BrokerInfo(bid, host, port, rack)
            for bid, host, port, rack, *_ in sorted(header["brokers"])
        )
        fenced = tuple(b[0] for b in header["brokers"] if len(b) > 4 and b[4])
        return ClusterDescription(header["cluster_id"], header["controller_id"], brokers, fenced)


def _new_topic_fields(t: NewTopic) -> list[Any]:
    assignments = [[p, list(ids)] for p, ids in sorted((t.assignments or {}).items())]
    configs = {str(k): str(v) for k, v in t.configs.items()}
    return [t.name, t.num_partitions, t.replication_factor, assignments, configs]


__all__ = ["Admin", "AdminError", "ClusterDescription", "NewTopic", "TopicDescription"]
