"""Memory grows with the number of partitions by a bounded amount per partition, in the
controller's metadata image and in a broker's per-partition structures (replica,
partition state, log, segment, indexes). Measured with tracemalloc as the difference
between two sizes, so fixed costs cancel; the bounds are about twice what was measured
when they were set (image ~300 B, broker ~6.6 KiB per partition), to catch a structure
that starts copying history or preallocating per partition, not a few fields more."""

from __future__ import annotations

import gc
import itertools
import sys
import tracemalloc
from collections.abc import Callable

from test_replica_manager import commit
from test_replication_checkpoint import broker_config

from rillet.broker.replica_manager import ReplicaManager
from rillet.controller.metadata.image import EMPTY_IMAGE, MetadataDelta, MetadataImage
from rillet.controller.metadata.quorum import ControllerConfig, QuorumController
from rillet.storage import LogManager

IMAGE_BYTES_PER_PARTITION = 640
BROKER_BYTES_PER_PARTITION = 14 * 1024


def applied(image: MetadataImage, records: list) -> MetadataImage:
    delta = MetadataDelta(image)
    delta.replay_all(records, image.offset + 1, 1)
    return delta.apply()


def registered(quorum: QuorumController, count: int) -> MetadataImage:
    image = EMPTY_IMAGE
    for b in range(1, count + 1):
        reg = quorum.register_broker(image, b, "inc", [("BROKER", "h", b)], None, 0)
        image = applied(image, reg.records)
        epoch = reg.response.broker_epoch
        image = applied(
            image, quorum.broker_heartbeat(image, b, epoch, image.offset, False, False, 0).records
        )
    return image


def retained(build: Callable[[], object]) -> int:
    """Bytes still allocated after ``build`` returns, held by what it returned."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return after - before


def make_room_in_the_interned_strings() -> None:
    """Make CPython's table of interned strings grow now, so that it cannot in a window.

    It is one process-wide dict, and pathlib interns every path component: each new
    partition's directory name, and the temporary names of its checkpoint files (which
    hold a thread id, so they are new every time). When one of those insertions finds the
    table full, the table is reallocated, and tracemalloc counts all of the new one (1.9,
    3.8 MB... after all a test session interned) in the window, while the old one's free
    is not subtracted (it was allocated before tracing started): that made the broker
    test fail once. Interning throwaway strings until the table is reallocated (one
    insertion allocating far more than a string) leaves room for at least as many
    strings as it holds, which is far more than a window interns."""
    tracemalloc.start()
    try:
        for i in itertools.count():
            before = tracemalloc.get_traced_memory()[0]
            sys.intern(f"make-room-{i}")  # dropped at once; its slot stays used till a resize
            if tracemalloc.get_traced_memory()[0] - before > 64 * 1024:
                return
    finally:
        tracemalloc.stop()


def per_partition(cost: Callable[[int], int], small: int, large: int) -> float:
    return (cost(large) - cost(small)) / (large - small)


def test_the_metadata_image_grows_by_a_bounded_amount_per_partition() -> None:
    def cost(n: int) -> int:
        quorum = QuorumController(ControllerConfig())
        image = registered(quorum, 3)
        return retained(
            lambda: applied(image, quorum.create_topics(image, [("t", n, 3, {})]).records)
        )

    assert per_partition(cost, 500, 1500) <= IMAGE_BYTES_PER_PARTITION


async def test_a_brokers_partitions_grow_its_memory_by_a_bounded_amount_each(tmp_path) -> None:
    async def cost(n: int) -> int:
        logs = LogManager(tmp_path / f"logs-{n}")
        logs.startup()
        manager = ReplicaManager(broker_config(tmp_path / f"b-{n}"), logs)
        quorum = QuorumController(ControllerConfig())
        image = EMPTY_IMAGE
        reg = quorum.register_broker(image, 1, "inc", [("BROKER", "h", 1)], None, 0)
        image = await commit(manager, image, reg.records)
        epoch = reg.response.broker_epoch
        heartbeat = quorum.broker_heartbeat(image, 1, epoch, image.offset, False, False, 0)
        image = await commit(manager, image, heartbeat.records)
        created = quorum.create_topics(image, [("t", n, 1, {})]).records
        make_room_in_the_interned_strings()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            image = await commit(manager, image, created)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(manager.replicas) == n
        await manager.shutdown()
        logs.close()
        return grown

    small, large = await cost(100), await cost(300)
    assert (large - small) / 200 <= BROKER_BYTES_PER_PARTITION
