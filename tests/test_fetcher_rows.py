"""A follower's fetcher keeps its request rows from fetch to fetch (broker/replication/
fetcher.py): each Fetch rebuilds only the rows of partitions that were answered, added,
removed, backed off, or marked changed by their replica, so its cost follows what
changed, not how many partitions the follower has from that leader. Two in-process
brokers, broker 1 leading partitions that broker 2 follows over a real socket."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import wait_until_async
from test_broker_inproc import batch, produce
from test_replication_fetcher_faults import TOPIC, Pair, SharedMetadata, start_pair

from rillet.broker.replication.fetcher import SourceFetcher
from rillet.broker.replication.partition_state import PartitionState
from rillet.broker.replication.types import FetchRequest
from rillet.controller.metadata.image import TopicPartition

N = 8


def fetcher_of(pair: Pair) -> SourceFetcher:
    assert pair.follower.fetchers is not None
    return pair.follower.fetchers.fetchers[1]


async def fetches_pass(fetcher: SourceFetcher, count: int) -> None:
    target = fetcher.session.incremental_fetches + count
    await wait_until_async(lambda: fetcher.session.incremental_fetches >= target)


async def test_a_fetch_rebuilds_only_the_rows_of_partitions_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with start_pair(tmp_path, SharedMetadata(), partitions=N, backoff_ms=50) as pair:
        assert pair.follower.replicas is not None
        names = {id(r.state): tp.partition for tp, r in pair.follower.replicas.replicas.items()}
        built: list[int] = []
        real = PartitionState.fetch_request

        def spy(self: PartitionState) -> FetchRequest | None:
            built.append(names.get(id(self), -1))
            return real(self)

        monkeypatch.setattr(PartitionState, "fetch_request", spy)
        fetcher = fetcher_of(pair)
        await fetches_pass(fetcher, 3)
        built.clear()
        await fetches_pass(fetcher, 5)
        assert built == []  # idle: no row rebuilt
        assert (await produce(pair.conn, TOPIC, 3, batch(b"a")))[1] == 0
        await wait_until_async(lambda: pair.follower_leo(3) == 1)
        await fetches_pass(fetcher, 3)
        assert set(built) == {3}  # the answered partition only
        # Every other partition is still fetched.
        assert (await produce(pair.conn, TOPIC, 5, batch(b"b")))[1] == 0
        await wait_until_async(lambda: pair.follower_leo(5) == 1)


async def test_a_follower_log_start_move_is_listed(tmp_path: Path) -> None:
    async with start_pair(tmp_path, SharedMetadata(), partitions=N, backoff_ms=50) as pair:
        assert pair.follower.replicas is not None
        fetcher = fetcher_of(pair)
        for value in (b"a", b"b"):
            assert (await produce(pair.conn, TOPIC, 6, batch(value)))[1] == 0
        await wait_until_async(lambda: pair.follower_leo(6) == 2)
        await fetches_pass(fetcher, 2)
        replica = pair.follower.replicas.replicas[TopicPartition(TOPIC, 6)]
        replica.log.increment_log_start_offset(1)  # as its own retention would

        def sent_start() -> int:
            row = fetcher.session._sent.get((TOPIC, 6))
            return row.log_start_offset if row is not None else -1

        await wait_until_async(lambda: sent_start() == 1)


async def test_a_stopped_fetcher_leaves_no_watch_on_its_replicas(tmp_path: Path) -> None:
    async with start_pair(tmp_path, SharedMetadata(), partitions=N, backoff_ms=50) as pair:
        assert pair.follower.replicas is not None and pair.follower.fetchers is not None
        fetcher = fetcher_of(pair)
        await fetches_pass(fetcher, 2)
        replicas = list(pair.follower.replicas.replicas.values())
        assert all(fetcher in r.watchers for r in replicas)
        await pair.follower.fetchers.stop()
        assert not any(fetcher in r.watchers for r in replicas)
