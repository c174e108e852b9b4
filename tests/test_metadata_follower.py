"""The broker's metadata follower (broker/link/controller_client.py) against a scripted
controller: what it hands the broker while it catches up after a start."""

from __future__ import annotations

import asyncio
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
