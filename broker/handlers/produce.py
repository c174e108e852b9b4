"""The Produce handler: decode, call ``ReplicaManager.append_records``, encode.

The payload is sliced per partition by the ``nbytes`` the header lists; each slice goes
to ``Log.append`` through the ReplicaManager, which first checks that consumers can read
every batch (``records.validate_produced``: records decode, counts agree, keys on a
compacted topic), then has the log validate each batch (length, CRC,
``max.message.bytes``), stamp offsets and the leader epoch in place and write it.

Ordering: ``append_records`` appends every partition before its first ``await``, and it
is the first thing this handler awaits, so pipelined produces on one connection land in
the log in the order they were sent (the RpcServer starts handlers in arrival order).

acks=0 returns no response; acks=1 answers after the leader's append (a page-cache
write, see docs/broker.md for what that makes durable); acks=all waits in the
partition's purgatory until the high watermark passes the batch, or ``timeout_ms``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from rillet.broker.replica_manager import AppendResult, ReplicaManager
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.client.wire.errors import InvalidRequestError
from rillet.controller.metadata.describe import INTERNAL_TOPICS
from rillet.controller.metadata.image import TopicPartition

INVALID_TOPIC = errors.code_of("INVALID_TOPIC_EXCEPTION")

# ProducePartitionResult from a tuple of its fields, in C: one per partition per produce,
# where the class call (a Python-level __new__) costs ~150 ns more.
_result: Callable[[tuple[Any, ...]], m.ProducePartitionResult] = partial(
    tuple.__new__, m.ProducePartitionResult
)


class ProduceHandler:
    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas

    async def __call__(self, request: Request) -> Response | None:
        req: m.ProduceRequest = request.message
        acks = req.acks
        entries = _slice_payload(req.topics, request.payload)
        if any(t.topic in INTERNAL_TOPICS for t in req.topics):
            results = await self._append_refusing_internal(entries, acks, req.timeout_ms)
        else:
            results = await self.replicas.append_records(entries, acks, req.timeout_ms)
        if acks == 0:
            return None
        # Results come back in request order: regroup them under their topics.
        out: list[m.ProduceTopicResult] = []
        i = 0
        for t in req.topics:
            rows = [
                _result(
                    (
                        r.partition,
                        r.error_code,
                        r.base_offset,
                        r.log_append_time,
                        r.log_start_offset,
                        r.error_message,
                    )
                )
                for r in results[i : i + len(t.partitions)]
            ]
            i += len(t.partitions)
            out.append(m.ProduceTopicResult(t.topic, rows))
        return Response(m.ProduceResponse(out))

    async def _append_refusing_internal(
        self, entries: list[tuple[TopicPartition, memoryview]], acks: int, timeout_ms: int
    ) -> list[AppendResult]:
        """Only brokers write internal topics (Kafka answers INVALID_TOPIC_EXCEPTION):
        their partitions are refused, the others appended, answers in request order."""
        allowed = [(tp, data) for tp, data in entries if tp.topic not in INTERNAL_TOPICS]
        appended = iter(await self.replicas.append_records(allowed, acks, timeout_ms))
        return [
            AppendResult(
                tp.topic,
                tp.partition,
                INVALID_TOPIC,
                error_message=f"{tp.topic} is an internal topic: only brokers write it",
            )
            if tp.topic in INTERNAL_TOPICS
            else next(appended)
            for tp, _ in entries
        ]


def _slice_payload(
    topics: Sequence[m.ProduceTopic], payload: memoryview
) -> list[tuple[TopicPartition, memoryview]]:
    """Each partition's bytes, by the ``nbytes`` the header lists, in order."""
    out: list[tuple[TopicPartition, memoryview]] = []
    position = 0
    for topic, partitions in topics:
        for partition, nbytes in partitions:
            if nbytes < 0 or position + nbytes > len(payload):
                raise InvalidRequestError(
                    f"Produce: {topic}-{partition} claims {nbytes} bytes at {position}, "
                    f"payload has {len(payload)}"
                )
            out.append((TopicPartition(topic, partition), payload[position : position + nbytes]))
            position += nbytes
    if position != len(payload):
        raise InvalidRequestError(
            f"Produce: partitions list {position} bytes, payload has {len(payload)}"
        )
    return out
