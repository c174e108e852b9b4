"""A small synchronous facade for scripts and Spark tasks.

Each facade object runs its async client on a private event loop in a background
daemon thread and forwards calls with ``run_coroutine_threadsafe``. Per-record calls
cross threads, so ``SyncProducer.send_many`` (one crossing per list) is the fast path;
``SyncProducer.produce`` crossing per record suits modest rates.

    with SyncProducer(bootstrap="127.0.0.1:9092") as p:
        p.send_many("events", [b"a", b"b"])
        p.flush()
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from rillet.client.admin import (
    Admin,
    ClusterDescription,
    CommittedOffset,
    ConfigEntry,
    GroupDescription,
    GroupLag,
    GroupListing,
    GroupResult,
    NewTopic,
    PartitionResult,
    QuorumDescription,
    ReassignmentStatus,
    TopicDescription,
)
from rillet.client.consumer import Consumer, ConsumerRecord, TopicPartition
from rillet.client.producer import Producer, RecordMetadata
from rillet.client.wire.errors import RilletError

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


class _SyncBase:
    _client: Any

    def __init__(self, name: str) -> None:
        self._thread = _LoopThread(name)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._thread.run(coro)

    def close(self) -> None:
        try:
            self._run(self._client.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncProducer(_SyncBase):
    """``Producer`` with blocking calls; takes the same keyword arguments."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("rillet-sync-producer")

        async def make() -> Producer:
            return await Producer(**kwargs).start()

        try:
            self._client = self._run(make())
        except BaseException:
            self._thread.stop()
            raise

    def send(self, topic: str, value: Any, key: Any = None, **kwargs: Any) -> RecordMetadata:
        """Send one record and wait for its metadata (one round trip per call)."""
        return self._run(self._client.send_and_wait(topic, value, key, **kwargs))

    def produce(self, topic: str, value: Any, key: Any = None, **kwargs: Any) -> None:
        """Buffer one record (blocks only while buffer_memory is full)."""

        async def produce() -> None:
            await self._client.produce(topic, value, key, **kwargs)

        self._run(produce())

    def send_many(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        partition: int | None = None,
    ) -> None:
        self._run(self._client.send_many(topic, values, keys, partition))

    def flush(self) -> None:
        self._run(self._client.flush())


class SyncConsumer(_SyncBase):
    """``Consumer`` with blocking calls; iterate it for records. With ``group_id`` it is a
    group member; a ``rebalance_listener``'s methods then run on the facade's event loop
    thread (they may be sync or async)."""

    def __init__(
        self, topics: Iterable[str] | str | re.Pattern[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__("rillet-sync-consumer")

        async def make() -> Consumer:
            return await Consumer(topics, **kwargs).start()

        try:
            self._client = self._run(make())
        except BaseException:
            self._thread.stop()
            raise

    def poll(
        self, timeout_ms: float = 1000, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        return self._run(self._client.getmany(timeout_ms, max_records))

    getmany = poll

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while True:
            for recs in self.poll().values():
                yield from recs

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        self._thread.loop.call_soon_threadsafe(self._client.seek, tp, offset)

    def seek_to_beginning(self, *tps: tuple[str, int]) -> None:
        self._run(self._client.seek_to_beginning(*tps))

    def seek_to_end(self, *tps: tuple[str, int]) -> None:
        self._run(self._client.seek_to_end(*tps))

    def position(self, tp: tuple[str, int]) -> int:
        async def position() -> int:
            return self._client.position(tp)

        return self._run(position())

    def assignment(self) -> set[TopicPartition]:
        async def assignment() -> set[TopicPartition]:
            return self._client.assignment()

        return self._run(assignment())

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit the positions of records already returned, or ``offsets``."""
        self._run(self._client.commit(offsets))

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[TopicPartition, int | None]:
        return self._run(self._client.committed(list(partitions)))

    def end_offsets(self, tps: Iterable[tuple[str, int]]) -> dict[TopicPartition, int]:
        return self._run(self._client.end_offsets(list(tps)))


class SyncAdmin(_SyncBase):
    def __init__(self, bootstrap: str | Iterable[str] = "127.0.0.1:9092", **kwargs: Any) -> None:
        super().__init__("rillet-sync-admin")

        async def make() -> Admin:
            return await Admin(bootstrap, **kwargs).start()

        try:
            self._client = self._run(make())
        except BaseException:
            self._thread.stop()
            raise

    def create_topics(self, topics: Iterable[NewTopic], **kwargs: Any) -> None:
        self._run(self._client.create_topics(list(topics), **kwargs))

    def delete_topics(self, names: Iterable[str]) -> None:
        self._run(self._client.delete_topics(list(names)))

    def list_topics(self) -> list[str]:
        return self._run(self._client.list_topics())

    def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        return self._run(self._client.describe_topics(names))

    def describe_cluster(self) -> ClusterDescription:
        return self._run(self._client.describe_cluster())

    def describe_configs(
        self, topics: Iterable[str], *, keys: Iterable[str] | None = None
    ) -> dict[str, dict[str, ConfigEntry]]:
        return self._run(
            self._client.describe_configs(list(topics), keys=None if keys is None else list(keys))
        )

    def incremental_alter_configs(
        self, changes: Mapping[str, Mapping[str, str | None]], *, validate_only: bool = False
    ) -> None:
        self._run(self._client.incremental_alter_configs(changes, validate_only=validate_only))

    def describe_quorum(self) -> QuorumDescription:
        return self._run(self._client.describe_quorum())

    def elect_leaders(
        self,
        topics: Iterable[str] | None = None,
        partitions: Iterable[tuple[str, int]] | None = None,
    ) -> list[PartitionResult]:
        return self._run(
            self._client.elect_leaders(
                None if topics is None else list(topics),
                None if partitions is None else list(partitions),
            )
        )

    def alter_partition_reassignments(
        self, moves: Mapping[tuple[str, int], Sequence[int] | None]
    ) -> None:
        self._run(self._client.alter_partition_reassignments(dict(moves)))

    def list_partition_reassignments(
        self, targets: Mapping[tuple[str, int], Sequence[int]]
    ) -> list[ReassignmentStatus]:
        return self._run(self._client.list_partition_reassignments(dict(targets)))

    def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        return self._run(self._client.list_groups(None if states is None else list(states)))

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        return self._run(self._client.describe_groups(list(group_ids)))

    def list_group_offsets(
        self, group: str, partitions: Iterable[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], CommittedOffset]:
        parts = None if partitions is None else list(partitions)
        return self._run(self._client.list_group_offsets(group, parts))

    def list_offsets_of_groups(
        self, group_ids: Iterable[str]
    ) -> dict[str, dict[tuple[str, int], CommittedOffset] | RilletError]:
        return self._run(self._client.list_offsets_of_groups(list(group_ids)))

    def group_lag(self, group: str) -> GroupLag:
        return self._run(self._client.group_lag(group))

    def alter_group_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        self._run(self._client.alter_group_offsets(group, dict(offsets)))

    def delete_groups(self, group_ids: Iterable[str]) -> list[GroupResult]:
        return self._run(self._client.delete_groups(list(group_ids)))

    def delete_group_offsets(self, group: str, partitions: Iterable[tuple[str, int]]) -> None:
        self._run(self._client.delete_group_offsets(group, list(partitions)))

    def list_offsets(self, specs: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        return self._run(self._client.list_offsets(dict(specs)))


__all__ = ["SyncAdmin", "SyncConsumer", "SyncProducer"]
