"""acks=all produces waiting for the high watermark (Kafka: DelayedProduce purgatory).

Each waiter needs the HW to reach `required_offset` (its last offset + 1). Completion runs
in required_offset order, expiry in deadline order; both are heaps with lazy deletion, so
a HW advance costs O(completed * log n), not a scan of every waiter.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass

from rillet.broker.replication.types import CompleteProduce, FailProduce
from rillet.client.wire import errors


@dataclass(frozen=True, slots=True)
class PendingProduce:
    produce_id: Hashable
    required_offset: int
    min_insync_replicas: int
    deadline_ms: int


class ProducePurgatory:
    def __init__(self) -> None:
        # produce_id -> (seq, waiter); a heap entry is live only if its seq matches.
        self._live: dict[Hashable, tuple[int, PendingProduce]] = {}
        self._by_offset: list[tuple[int, int, Hashable]] = []
        self._by_deadline: list[tuple[int, int, Hashable]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, produce_id: Hashable) -> bool:
        return produce_id in self._live

    def add(self, pending: PendingProduce) -> None:
        if pending.produce_id in self._live:
            raise ValueError(f"produce {pending.produce_id!r} is already waiting")
        self._seq += 1
        self._live[pending.produce_id] = (self._seq, pending)
        heapq.heappush(self._by_offset, (pending.required_offset, self._seq, pending.produce_id))
        heapq.heappush(self._by_deadline, (pending.deadline_ms, self._seq, pending.produce_id))

    def complete_up_to(self, high_watermark: int, isr_size: int) -> list[CompleteProduce]:
        """Every waiter whose required_offset <= high_watermark, in offset order."""
        done: list[CompleteProduce] = []
        while self._by_offset and self._by_offset[0][0] <= high_watermark:
            _, seq, produce_id = heapq.heappop(self._by_offset)
            pending = self._pop_live(produce_id, seq)
            if pending is None:
                continue  # already expired or failed
            ok = isr_size >= pending.min_insync_replicas
            code = errors.NONE if ok else errors.code_of("NOT_ENOUGH_REPLICAS_AFTER_APPEND")
            done.append(CompleteProduce(produce_id, code))
        self._compact()
        return done

    def expire(self, now_ms: int) -> list[FailProduce]:
        """Every waiter whose deadline_ms <= now_ms fails with REQUEST_TIMED_OUT."""
        timed_out = errors.code_of("REQUEST_TIMED_OUT")
        failed: list[FailProduce] = []
        while self._by_deadline and self._by_deadline[0][0] <= now_ms:
            _, seq, produce_id = heapq.heappop(self._by_deadline)
            if self._pop_live(produce_id, seq) is not None:
                failed.append(FailProduce(produce_id, timed_out))
        self._compact()
        return failed

    def fail_all(self, error_code: int) -> list[FailProduce]:
        """Every waiter fails with `error_code`, in arrival order."""
        failed = [FailProduce(pid, error_code) for pid in self._live]  # dicts keep arrival order
        self._live.clear()
        self._by_offset.clear()
        self._by_deadline.clear()
        return failed

    def _pop_live(self, produce_id: Hashable, seq: int) -> PendingProduce | None:
        entry = self._live.get(produce_id)
        if entry is None or entry[0] != seq:
            return None
        del self._live[produce_id]
        return entry[1]

    def _compact(self) -> None:
        # Lazy deletion leaves dead heap entries; rebuild when they dominate.
        if len(self._by_offset) > 2 * len(self._live) + 64:
            self._by_offset = [e for e in self._by_offset if self._is_live(e)]
            heapq.heapify(self._by_offset)
        if len(self._by_deadline) > 2 * len(self._live) + 64:
            self._by_deadline = [e for e in self._by_deadline if self._is_live(e)]
            heapq.heapify(self._by_deadline)

    def _is_live(self, entry: tuple[int, int, Hashable]) -> bool:
        live = self._live.get(entry[2])
        return live is not None and live[0] == entry[1]
