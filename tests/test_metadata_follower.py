"""The broker's metadata follower (broker/link/controller_client.py) against a scripted
controller: what it hands the broker while it catches up after a start."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import msgpack
import pytest

from rillet.broker.link import controller_client
from rillet.broker.link.controller_client import MetadataFollower
from rillet.client.wire import messages as m
from rillet.controller.metadata.image import (
    MetadataDelta,
    MetadataImage,
    MetadataRecord,
    RegisterBroker,
    decode_records,
    encode_records,
    encode_snapshot,
    records_to_image,
)


class TwoBatchChannel:
    """The committed log holds entries 1 and 2 (broker 1 then broker 2 registering);
    each FetchMetadata answer carries one entry, with the high watermark at 2."""

    async def call(self, request: m.FetchMetadataRequest, **_: Any) -> tuple[Any, memoryview]:
        response = m.FetchMetadataResponse.from_header({"high_watermark": 2})
        offset = max(request.fetch_offset, 1)  # Raft indexes start at 1
        if offset > 2:
            return response, memoryview(b"")
        entry = [offset, 1, encode_records([RegisterBroker(offset, f"inc-{offset}", offset)])]
        return response, memoryview(msgpack.packb([entry]))


async def test_a_starting_broker_is_handed_metadata_only_once_caught_up() -> None:
    """An image behind the controller's high watermark may name this broker leader of
    an epoch long over, with an ISR of itself: acting on it, a restarted broker would
    advance its high watermark over records the real leader truncated (found by the
    replication simulator). So, as Kafka's metadata loader does, nothing is published
    until the first catch-up; then the caught-up image comes as one delta over the
    empty image."""
    published: list[tuple[MetadataDelta, MetadataImage]] = []
    follower = MetadataFollower(
        TwoBatchChannel(),  # type: ignore[arg-type]
        3,
        listener=lambda delta, image: published.append((delta, image)),
    )
    assert await follower.fetch_once() == 1
    assert published == []  # at offset 1 of 2: still catching up
    assert follower.image.offset == 1  # the next fetch goes on from there
    assert await follower.fetch_once() == 1
    ((delta, image),) = published
    assert image.offset == 2 and set(image.brokers) == {1, 2}
    assert delta.image.offset == -1 and set(delta.changed_brokers) == {1, 2}
    assert await follower.fetch_once() == 0
    assert len(published) == 1


async def test_a_fetched_answer_is_replayed_an_entry_per_loop_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One answer holds up to 1 MiB of entries: replayed in one go, some 24,000
    partition records held a broker's loop for 250-400 ms. A task that runs at every
    loop turn sees the replay advance an entry at a time; the result is the same."""
    entries = [[i, 1, encode_records([RegisterBroker(i, f"inc-{i}", i)])] for i in range(1, 6)]
    payload = msgpack.packb([[0, 1, b""], *entries])  # offset 0: a duplicate, skipped
    image = MetadataImage()
    decoded: list[bytes] = []

    def counting(data: bytes) -> list[MetadataRecord]:
        decoded.append(data)
        return decode_records(data)

    monkeypatch.setattr(controller_client, "decode_records", counting)
    turns: list[int] = []

    async def watch() -> None:
        while True:
            turns.append(len(decoded))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)
    fetched = await controller_client.apply_fetched_yielding(image, False, payload)
    watcher.cancel()
    assert fetched is not None and fetched[2] == 6
    assert {1, 2, 3, 4} <= set(turns)  # the loop ran between entries
    expected = controller_client.apply_fetched(image, False, payload)
    assert expected is not None and fetched[1] == expected[1]


def _snapshot_of(brokers: int) -> tuple[MetadataImage, bytes]:
    image = records_to_image(
        [RegisterBroker(b, f"inc-{b}", b) for b in range(1, brokers + 1)], offset=40, epoch=3
    )
    return image, encode_snapshot(image)


async def test_a_snapshot_answer_is_replayed_on_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot is the whole image: 50,000 partitions decoded and replayed on the loop
    held a broker's loop for about 4 s, past its session timeout. Its result is the
    image the snapshot holds, as a delta over the empty image."""
    image, data = _snapshot_of(50)
    threads: list[int] = []
    real = controller_client.snapshot_records

    def recording(payload: bytes) -> Any:
        threads.append(threading.get_ident())
        return real(payload)

    monkeypatch.setattr(controller_client, "snapshot_records", recording)
    fetched = await controller_client.apply_fetched_yielding(
        MetadataImage(), True, memoryview(data)
    )
    assert fetched is not None
    delta, got, count = fetched
    assert threads and threads[0] != threading.get_ident()
    assert count == 1 and got == image and delta.image.offset == -1
    assert set(delta.changed_brokers) == set(image.brokers)


class SnapshotChannel:
    """The committed log starts with a snapshot (offset 40): a starting broker gets it."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def call(self, request: m.FetchMetadataRequest, **_: Any) -> tuple[Any, memoryview]:
        header: dict[str, Any] = {"high_watermark": 41}
        if request.fetch_offset <= 40:
            header["snapshot_id"] = [40, 3]
            return m.FetchMetadataResponse.from_header(header), memoryview(self.data)
        entry = [41, 3, encode_records([RegisterBroker(99, "inc-99", 99)])]
        return m.FetchMetadataResponse.from_header(header), memoryview(msgpack.packb([entry]))


async def test_the_first_caught_up_image_is_built_as_one_delta_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A starting broker's first publish is its whole image as a delta over the empty
    one: a pass over every partition, made on a worker thread."""
    image, data = _snapshot_of(20)
    threads: list[int] = []
    real = controller_client.delta_from_empty

    def recording(img: MetadataImage) -> MetadataDelta:
        threads.append(threading.get_ident())
        return real(img)

    monkeypatch.setattr(controller_client, "delta_from_empty", recording)
    published: list[tuple[MetadataDelta, MetadataImage]] = []
    follower = MetadataFollower(
        SnapshotChannel(data),  # type: ignore[arg-type]
        3,
        listener=lambda delta, image: published.append((delta, image)),
    )
    assert await follower.fetch_once() == 1  # the snapshot: offset 40 of 41, held back
    assert published == []
    assert await follower.fetch_once() == 1
    ((delta, got),) = published
    assert got.offset == 41 and set(got.brokers) == set(image.brokers) | {99}
    assert delta.image.offset == -1 and set(delta.changed_brokers) == set(got.brokers)
    assert threads and all(t != threading.get_ident() for t in threads)


async def test_caught_up_at_is_when_a_fetch_was_sent_whose_high_watermark_was_reached() -> None:
    """The remote bucket sweep bounds how stale the image may be by it: the image holds
    everything committed before that moment."""
    follower = MetadataFollower(TwoBatchChannel(), 3)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    await follower.fetch_once()
    assert follower.caught_up_at is None  # at offset 1 of 2
    before = loop.time()
    await follower.fetch_once()
    assert follower.caught_up_at is not None and before <= follower.caught_up_at <= loop.time()
    first = follower.caught_up_at
    await follower.fetch_once()  # nothing new, still caught up: a later moment
    assert follower.caught_up_at >= first
