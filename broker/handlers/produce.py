"""The Produce handler.

Every append happens synchronously, before the handler's first ``await``: the RpcServer
starts handlers in arrival order, so pipelined produces on one connection land in the
log in the order they were sent. The payload is sliced per partition by the ``nbytes``
the header lists and handed to ``Log.append``, which validates each batch (length, CRC,
``max.message.bytes``), stamps offsets and the leader epoch in place and writes it: per
batch work only, records are never decoded here.

acks=0 returns no response; acks=1 answers after the leader's append (a page-cache
write, see docs/broker.md for what that makes durable); acks=all waits in the
partition's purgatory until the high watermark passes the batch, or ``timeout_ms``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rillet.broker.metrics import BrokerMetrics
from rillet.broker.replica_manager import Replica, ReplicaManager
from rillet.client.runtime.rpc_server import Request, Response
from rillet.client.wire import errors
from rillet.client.wire.errors import InvalidRequestError, RilletError
from rillet.controller.metadata.image import TopicPartition

logger = logging.getLogger(__name__)

NONE = errors.NONE
ACKS_ALL = -1
STORAGE_ERROR = errors.code_of("KAFKA_STORAGE_ERROR")
NOT_ENOUGH_REPLICAS = errors.code_of("NOT_ENOUGH_REPLICAS")

# One partition's outcome: [partition, error_code, base_offset, log_append_time,
# log_start_offset, error_message]; a pending acks=all result carries its future.
Result = list[Any]


class ProduceHandler:
    def __init__(self, replicas: ReplicaManager, metrics: BrokerMetrics) -> None:
        self.replicas = replicas
        self.metrics = metrics
        self._refusal_logged_ms: dict[str, int] = {}

    async def __call__(self, request: Request) -> Response | None:
        fields = request.fields
        acks, timeout_ms = fields["acks"], fields["timeout_ms"]
        slices = _slice_payload(fields["topics"], request.payload)
        now = self.replicas.now_ms()
        waits: list[tuple[Result, asyncio.Future[int]]] = []
        out: list[list[Any]] = []
        for topic, partitions in slices:
            results: list[Result] = []
            for partition, data in partitions:
                result, future = self.append_one(topic, partition, data, acks, now + timeout_ms)
                results.append(result)
                if future is not None:
                    waits.append((result, future))
            out.append([topic, results])
        # ---- every append is done; from here on the handler may wait ----
        if acks == 0:
            return None
        if waits:
            await _wait_all(waits, timeout_ms)
        return Response({"topics": out, "throttle_time_ms": 0, "error_code": 0})

    def append_one(
        self, topic: str, partition: int, data: memoryview, acks: int, deadline_ms: int
    ) -> tuple[Result, asyncio.Future[int] | None]:
        replica = self.replicas.replicas.get(TopicPartition(topic, partition))
        if replica is None:
            return _error(partition, self.replicas.partition_error(topic, partition)), None
        code = replica.state.check_produce(acks, replica.min_insync_replicas)
        if code is not None:
            if code == NOT_ENOUGH_REPLICAS:
                self._log_not_enough_replicas(replica)
            return _error(partition, code, replica), None
        log = replica.log
        try:
            first, last = log.append(data, replica.state.leader_epoch)
        except RilletError as e:
            return _error(partition, e.code, replica, e.message or str(e)), None
        except OSError as e:  # disk full, I/O error: the log is unusable, the broker is not
            logger.error("%s: append failed: %r", log.name, e)
            return _error(partition, STORAGE_ERROR, replica, repr(e)), None
        self.metrics.record_append(len(data), last - first + 1)
        self.replicas.after_append(replica, self.replicas.now_ms())
        result = [partition, NONE, first, -1, log.log_start_offset, None]
        if acks != ACKS_ALL:
            return result, None
        return result, self.replicas.await_produce(replica, last + 1, deadline_ms)

    def _log_not_enough_replicas(self, replica: Replica) -> None:
        """Say which ISR refused (at most once a second per partition): the core's
        committed ISR, which may differ from what metadata shows."""
        now = self.replicas.now_ms()
        last = self._refusal_logged_ms.get(replica.log.name)
        if last is not None and now - last < 1000:
            return
        self._refusal_logged_ms[replica.log.name] = now
        state = replica.state
        logger.warning(
            "%s: NOT_ENOUGH_REPLICAS: core isr %s (leader epoch %d, partition "
            "epoch %d) < min.insync.replicas %d; metadata isr %s",
            replica.log.name,
            list(state.isr),
            state.leader_epoch,
            state.partition_epoch,
            replica.min_insync_replicas,
            self._metadata_isr(replica),
        )

    def _metadata_isr(self, replica: Replica) -> str:
        p = self.replicas.image.partition(replica.topic, replica.partition)
        if p is None:
            return "unknown"
        return f"{list(p.isr)} (leader {p.leader}, epochs {p.leader_epoch}/{p.partition_epoch})"


def _slice_payload(
    topics: list[list[Any]], payload: memoryview
) -> list[tuple[str, list[tuple[int, memoryview]]]]:
    """Each partition's bytes, by the ``nbytes`` the header lists, in order."""
    out: list[tuple[str, list[tuple[int, memoryview]]]] = []
    position = 0
    for topic, partitions in topics:
        parts: list[tuple[int, memoryview]] = []
        for partition, nbytes in partitions:
            if nbytes < 0 or position + nbytes > len(payload):
                raise InvalidRequestError(
                    f"Produce: {topic}-{partition} claims {nbytes} bytes at {position}, "
                    f"payload has {len(payload)}"
                )
            parts.append((partition, payload[position : position + nbytes]))
            position += nbytes
        out.append((topic, parts))
    if position != len(payload):
        raise InvalidRequestError(
            f"Produce: partitions list {position} bytes, payload has {len(payload)}"
        )
    return out


def _error(
    partition: int, code: int, replica: Replica | None = None, message: str | None = None
) -> Result:
    log_start = replica.log.log_start_offset if replica is not None else -1
    return [partition, code, -1, -1, log_start, message]


async def _wait_all(waits: list[tuple[Result, asyncio.Future[int]]], timeout_ms: int) -> None:
    """Fill in each acks=all result's code once its future resolves. The purgatory times
    them out on the replica tick; the extra second here only guards against a lost wake."""
    futures = [f for _, f in waits]
    await asyncio.wait(futures, timeout=timeout_ms / 1000 + 1.0)
    for result, future in waits:
        if future.done():
            result[1] = future.result()
        else:
            future.cancel()
            result[1] = errors.code_of("REQUEST_TIMED_OUT")
        if result[1] not in (NONE, errors.code_of("NOT_ENOUGH_REPLICAS_AFTER_APPEND")):
            result[2] = -1  # no offset promised: the records may or may not survive
