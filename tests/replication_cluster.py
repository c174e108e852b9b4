"""Helpers for the replication tests against real processes (tests/test_replication_*.py).

- ``replication_cluster``: 3 controllers + 3 brokers with fault-friendly timings (short
  session and lag timeouts, so a fault shows within seconds, not Kafka's 30 s);
- ``Client``: raw requests (records.encode_batch + client.connection), so every produce
  answer says exactly at which offset its records landed;
- ``Writer``: produces acks=all continuously, in a thread of its own, while the test
  injects faults; it records what was sent and what was acknowledged where (values
  encode topic, incarnation, partition and sequence; keyed from a small key space if
  asked, for compacted topics);
- ``check_acknowledged``: reads every partition from the start and checks the writer's
  acknowledgements against it (tests/chaos.py runs it after random fault schedules).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from helpers import fetch_records

from rillet.broker.link.controller_client import ControllerChannel, MetadataFollower
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, R, RequestMessage, parse_address
from rillet.controller.metadata.image import MetadataImage
from rillet.tools.local_cluster import ClusterError, LocalCluster

BROKERS = (1, 2, 3)
CONTROLLERS = (101, 102, 103)
LAG_MS = 1000
SESSION_MS = 2500


def replication_cluster(
    cluster_factory: Callable[..., LocalCluster], *, s3: bool = False, **broker_extra: Any
) -> LocalCluster:
    """Brokers shrink the ISR after LAG_MS; controllers fence after SESSION_MS (lag <
    session, so a paused follower leaves the ISR by lag before its session expires).
    ``s3``: the cluster runs its embedded S3 server and the brokers' remote tier."""
    broker = {
        "replica.lag.time.max.ms": LAG_MS,
        "replica.fetch.wait.max.ms": 200,
        "replica.fetch.backoff.ms": 100,
        "replica.high.watermark.checkpoint.interval.ms": 500,
        "broker.heartbeat.interval.ms": 250,
        "controlled.shutdown.timeout.ms": 10_000,
        **broker_extra,
    }
    controller = {"broker.session.timeout.ms": SESSION_MS, "broker.heartbeat.interval.ms": 250}
    overrides = {b: dict(broker) for b in BROKERS}
    overrides.update({c: dict(controller) for c in CONTROLLERS})
    return cluster_factory(controllers=3, brokers=3, node_overrides=overrides, s3=s3)


@dataclass(slots=True)
class PartitionInfo:
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]


class Client:
    """Raw requests to the brokers of a LocalCluster, connections cached per address."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._conns: dict[str, Connection] = {}

    async def conn(self, node_id: int) -> Connection:
        try:
            address = self.cluster.broker_address(node_id)
        except ClusterError as e:  # (re)starting: not listening yet
            raise errors.NetworkError(str(e)) from e
        conn = self._conns.get(address)
        if conn is None or conn.closed:
            conn = await Connection.open(
                *parse_address(address), connect_timeout_ms=2000, request_timeout_ms=15_000
            )
            self._conns[address] = conn
        return conn

    def live_brokers(self) -> list[int]:
        from rillet.tools.local_cluster import pid_alive

        return [n.node_id for n in self.cluster.brokers() if pid_alive(n.pid)]

    async def any_request(self, message: RequestMessage[R]) -> R:
        last: Exception | None = None
        for node_id in self.live_brokers():
            try:
                response, _ = await (await self.conn(node_id)).call(message, timeout_ms=3000)
                return response
            except errors.RilletError as e:
                last = e
        raise errors.NetworkError(f"no live broker answered {type(message).__name__}: {last}")

    async def create_topic(
        self, name: str, partitions: int, rf: int, configs: dict[str, str]
    ) -> None:
        topic = m.CreatableTopic(name, partitions, rf, [], configs)
        response = await self.any_request(m.CreateTopicsRequest([topic], timeout_ms=20_000))
        assert response.topics[0].error_code == 0, response

    async def delete_topic(self, name: str) -> None:
        response = await self.any_request(m.DeleteTopicsRequest([name], timeout_ms=20_000))
        assert response.responses[0].error_code == 0, response

    async def partitions(self, topic: str) -> dict[int, PartitionInfo]:
        """The topic's partitions as the first live broker's image shows them. A broker
        that has not loaded metadata yet (just restarted: it serves before its
        registration) answers UNKNOWN_TOPIC_OR_PARTITION with no partitions; that is
        raised, not returned as an empty dict, so that "every ISR is full" cannot hold
        vacuously."""
        response = await self.any_request(m.MetadataRequest([topic]))
        (t,) = response.topics
        if t.error_code != errors.NONE:
            raise errors.error_for(t.error_code, f"Metadata for {topic!r}")
        return {
            p.partition: PartitionInfo(p.leader_id, p.leader_epoch, list(p.replicas), list(p.isr))
            for p in t.partitions
        }

    async def produce(
        self,
        leader: int,
        topic: str,
        partition: int,
        values: list[bytes],
        acks: int = -1,
        timeout_ms: int = 5000,
        keys: list[bytes] | None = None,
    ) -> tuple[int, int]:
        """(error code, base offset) of one batch sent to ``leader``."""
        data = records.encode_batch(values, keys)
        result = await self.produce_bytes(leader, topic, partition, data, acks, timeout_ms)
        return result.error_code, result.base_offset

    async def produce_bytes(
        self,
        leader: int,
        topic: str,
        partition: int,
        data: bytes,
        acks: int = -1,
        timeout_ms: int = 5000,
    ) -> m.ProducePartitionResult:
        """The answer to a Produce of ``data`` (one partition's batches, as they are)."""
        request = m.ProduceRequest(
            acks=acks,
            timeout_ms=timeout_ms,
            topics=[m.ProduceTopic(topic, [m.ProducePartition(partition, len(data))])],
        )
        conn = await self.conn(leader)
        response, _ = await conn.call(request, data, timeout_ms=timeout_ms + 5000)
        return response.topics[0].partitions[0]

    async def read_all(self, node_id: int, topic: str, partition: int) -> list[records.Record]:
        """Every record below the leader's HW, from offset 0, as a consumer."""
        return await fetch_records(await self.conn(node_id), topic, partition)

    async def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def run(cluster: LocalCluster, body: Callable[[Client], Any]) -> Any:
    """Run ``body(client)`` (a coroutine function) on a fresh event loop."""

    async def main() -> Any:
        client = Client(cluster)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def committed_image(cluster: LocalCluster) -> MetadataImage:
    """The metadata image the controllers have committed, up to their high watermark
    as of the first answer (read as a broker reads it, through FetchMetadata)."""

    async def fetch() -> MetadataImage:
        channel = ControllerChannel(cluster.voters)
        follower = MetadataFollower(channel, max_wait_ms=50)
        try:
            while True:
                await follower.fetch_once()
                hw = follower.high_watermark
                if hw >= 0 and follower.image.offset >= hw:
                    return follower.image
        finally:
            await channel.close()

    return asyncio.run(fetch())


@dataclass(slots=True)
class Ack:
    partition: int
    base_offset: int
    values: list[bytes]
    keys: list[bytes] | None = None
    incarnation: int = 0


def parse_value(value: bytes) -> tuple[int, int]:
    """(incarnation, sequence) of a value the Writer made."""
    _, incarnation, _, seq = value.rsplit(b"-", 3)
    return int(incarnation), int(seq)


@dataclass
class Writer:
    """Produces batches of ``batch`` values (acks=all unless ``required_acks`` says
    otherwise), one request in flight per partition, until stopped. Runs its own event
    loop in a thread, so the test's own thread can inject faults meanwhile."""

    cluster: LocalCluster
    topic: str
    partitions: int
    batch: int = 5
    required_acks: int = -1
    keys: int = 0  # > 0: record keys cycle through this many
    # Bumped by a test that deletes and re-creates the topic once every broker serves
    # the new one: acknowledgements of older incarnations are not expected afterwards.
    incarnation: int = 0
    acks: list[Ack] = field(default_factory=list)
    sent: set[bytes] = field(default_factory=set)
    errors_seen: dict[str, int] = field(default_factory=dict)
    attempts: int = 0  # produce requests answered (or failed), a measure of progress
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _failure: BaseException | None = None

    def start(self) -> Writer:
        self._thread = threading.Thread(target=self._main, name="writer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)
        if self._failure is not None:
            raise self._failure

    def acked_count(self) -> int:
        return sum(len(a.values) for a in self.acks)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self._failure = e

    async def _run(self) -> None:
        client = Client(self.cluster)
        seq = itertools.count()
        try:
            await asyncio.gather(
                *(self._one_partition(client, p, seq) for p in range(self.partitions))
            )
        finally:
            await client.close()

    async def _one_partition(self, client: Client, p: int, seq: itertools.count) -> None:
        leader = -1
        while not self._stop.is_set():
            if leader < 0:
                leader = await self._leader_of(client, p)
                continue
            incarnation = self.incarnation
            seqs = [next(seq) for _ in range(self.batch)]
            values = [f"{self.topic}-{incarnation}-{p}-{s}".encode() for s in seqs]
            keys = [f"k{s % self.keys}".encode() for s in seqs] if self.keys else None
            self.sent.update(values)
            try:
                code, base = await client.produce(
                    leader, self.topic, p, values, self.required_acks, keys=keys
                )
            except errors.RilletError as e:
                code, base = e.code, -1
            self.attempts += 1
            if code == errors.NONE:
                self.acks.append(Ack(p, base, values, keys, incarnation))
                continue
            name = errors.error_name(code)
            self.errors_seen[name] = self.errors_seen.get(name, 0) + 1
            leader = -1

    async def _leader_of(self, client: Client, p: int) -> int:
        try:
            info = (await client.partitions(self.topic))[p]
        except (errors.RilletError, KeyError):
            info = None
        if info is None or info.leader < 0 or info.leader not in client.live_brokers():
            await asyncio.sleep(0.05)  # retry backoff while no leader is known
            return -1
        return info.leader


def check_acknowledged(
    cluster: LocalCluster, writer: Writer, *, compacted: bool = False
) -> dict[int, int]:
    """Every acknowledged record (of the writer's current incarnation) sits exactly at
    its acknowledged offset, acknowledgements of a partition come in offset order,
    nothing that was never sent is in the log, and each key's records are in the order
    they were sent. On a ``compacted`` topic an acknowledged record may be gone if a
    later record of its key is in the log (the cleaner removed it), never otherwise.
    Returns the record count read per partition."""

    async def body(client: Client) -> dict[int, int]:
        info = await client.partitions(writer.topic)
        counts = {}
        for p in range(writer.partitions):
            log = await client.read_all(info[p].leader, writer.topic, p)
            by_offset = {r.offset: r.value for r in log}
            offsets = [r.offset for r in log]
            assert offsets == sorted(by_offset), f"partition {p}: offsets out of order"
            unknown = [r for r in log if r.value not in writer.sent]
            assert not unknown, f"partition {p}: records never sent: {unknown[:3]}"
            last_of_key: dict[Any, tuple[int, int]] = {}  # key -> (seq, offset)
            for r in log:
                seq = parse_value(r.value)[1]
                before = last_of_key.get(r.key)
                assert before is None or before[0] < seq, (
                    f"partition {p}: key {r.key!r} at offset {r.offset} (seq {seq}) after "
                    f"offset {before[1]} (seq {before[0]})"
                )
                last_of_key[r.key] = (seq, r.offset)
            last_base = -1
            acks = [
                a for a in writer.acks if a.partition == p and a.incarnation == writer.incarnation
            ]
            for ack in acks:
                assert ack.base_offset > last_base, f"partition {p}: acks out of order at {ack}"
                last_base = ack.base_offset
                for i, value in enumerate(ack.values):
                    offset = ack.base_offset + i
                    found = by_offset.get(offset)
                    if found is None and compacted and ack.keys is not None:
                        latest = last_of_key.get(ack.keys[i])
                        if latest is not None and latest[1] > offset:
                            continue  # superseded by a later record of its key
                    assert found == value, (
                        f"partition {p}: offset {offset} holds {found!r}, acknowledged {value!r}"
                    )
            counts[p] = len(log)
        return counts

    return run(cluster, body)
