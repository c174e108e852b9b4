"""A group consumer in its own process, for cluster tests: prints one JSON line per
event on stdout ({"assigned": [...]}, {"revoked": [...]}, {"lost": [...]},
{"records": [[partition, offset, value], ...]}) and closes (commit, leave) on SIGTERM.

    python tests/group_member.py BOOTSTRAP TOPIC GROUP [SESSION_MS]
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

from rillet.client.consumer import Consumer, TopicPartition


def emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Listener:
    def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
        emit({"assigned": sorted(p for _, p in tps)})

    def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
        emit({"revoked": sorted(p for _, p in tps)})

    def on_partitions_lost(self, tps: set[TopicPartition]) -> None:
        emit({"lost": sorted(p for _, p in tps)})


async def main(bootstrap: str, topic: str, group: str, session_ms: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = Consumer(
        topic,
        bootstrap=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        session_timeout_ms=session_ms,
        auto_commit_interval_ms=300,
        retry_backoff_ms=50,
        request_timeout_ms=5_000,
        rebalance_listener=Listener(),
    )
    async with consumer:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            rows = [[r.partition, r.offset, r.value.decode()] for rs in batch.values() for r in rs]
            if rows:
                emit({"records": rows})
    emit({"closed": True})


if __name__ == "__main__":
    session = int(sys.argv[4]) if len(sys.argv) > 4 else 45_000
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], session))
