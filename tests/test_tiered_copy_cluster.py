"""The remote tier's write side on real processes (3 controllers, 3 brokers) against
moto's S3 server as a real process (tests/s3_server.py): segments reach S3 and leave
local disk, a leader killed during uploads leaves nothing behind, an S3 outage delays
uploads without deleting or blocking anything, retention and topic deletion clean S3.

The remote metadata is read as a broker reads it: a `MetadataFollower` fetching the
committed metadata log from the controllers (docs/tiered.md)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until, wait_until_async
from replication_cluster import Client, Writer, committed_image, replication_cluster, run
from s3_server import S3Endpoint

from rillet.client.wire import messages as m
from rillet.client.wire import records
from rillet.controller.metadata.image import (
    SEGMENT_COPY_FINISHED,
    MetadataImage,
    RemoteSegment,
)
from rillet.controller.metadata.remote_log import remote_log_view
from rillet.storage.remote.layout import parse_segment_key, topic_prefix
from rillet.storage.remote.store import S3ObjectStore
from rillet.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

BUCKET = "rillet-tier"
TOPIC_CONFIG = {
    "segment.bytes": "1024",
    "remote.storage.enable": "true",
    "local.retention.bytes": "0",  # a segment leaves local disk once it is remote
    "retention.ms": "-1",  # the Writer's records carry no timestamps (0: ages old)
}
DEADLINE_S = 90  # generous: 2 cores shared with other test runs


def tiered_cluster(cluster_factory: Any, s3: S3Endpoint, **extra: Any) -> LocalCluster:
    return replication_cluster(
        cluster_factory,
        **{
            "remote.log.storage.system.enable": True,
            "remote.log.storage.s3.endpoint.url": s3.url,
            "remote.log.storage.s3.bucket": BUCKET,
            "remote.log.manager.task.interval.ms": 200,
            "remote.log.orphan.min.age.ms": 3000,
            "log.retention.check.interval.ms": 200,
            "log.segment.delete.delay.ms": 0,
            **extra,
        },
    )


class Tier:
    """What a test reads of the tier: the committed metadata image, the bucket, and
    each broker's local segment files."""

    def __init__(self, cluster: LocalCluster, s3: S3Endpoint) -> None:
        self.cluster = cluster
        self.store = S3ObjectStore(BUCKET, endpoint_url=s3.url)

    def image(self) -> MetadataImage:
        return committed_image(self.cluster)

    def segments(self, topic: str, partition: int = 0) -> dict[str, RemoteSegment]:
        image = self.image()
        t = image.topic(topic)
        assert t is not None
        return dict(image.remote_segments.get((t.topic_id, partition), {}))

    def finished(self, topic: str, partition: int = 0) -> list[RemoteSegment]:
        image = self.image()
        t = image.topic(topic)
        assert t is not None
        return list(remote_log_view(image, t.topic_id, partition).segments)

    def objects(self, prefix: str = "") -> list[str]:
        return [o.key for o in self.store.list(prefix)]

    def local_bytes(self, broker: int, topic: str, partition: int = 0) -> int:
        d = Path(self.cluster.node_dir(broker)) / "logs" / f"{topic}-{partition}"
        total = 0
        for path in d.glob("*.log"):
            with contextlib.suppress(FileNotFoundError):  # retention renamed it meanwhile
                total += path.stat().st_size
        return total

    def local_bases(self, broker: int, topic: str, partition: int = 0) -> list[int]:
        d = Path(self.cluster.node_dir(broker)) / "logs" / f"{topic}-{partition}"
        return sorted(int(p.name.split(".")[0]) for p in d.glob("*.log"))


def covered(segments: list[RemoteSegment]) -> int:
    """The end of the run of offsets from 0 the segments cover without a gap (-1: none)."""
    end = -1
    for seg in sorted(segments, key=lambda s: s.start_offset):
        if seg.start_offset > end + 1:
            break
        end = max(end, seg.end_offset)
    return end


def only_finished_objects(tier: Tier, topic: str) -> bool:
    """Every object of the topic is a log or manifest of a finished segment, and every
    finished segment has both, and no copy or delete is unfinished."""
    segs = tier.segments(topic)
    if any(s.state != SEGMENT_COPY_FINISHED for s in segs.values()):
        return False
    named: dict[str, set[str]] = {}
    for key in tier.objects(f"{topic}-"):
        parsed = parse_segment_key(key)
        if parsed is None or parsed[1] not in segs:
            return False
        named.setdefault(parsed[1], set()).add(parsed[2])
    return all(named.get(s) == {"log", "manifest"} for s in segs)


def check_local_is_remote(tier: Tier, topic: str, brokers: list[int]) -> None:
    """No broker deleted a local segment that was not remote: every offset below its
    local log start is in a finished remote segment."""
    remote_end = covered(tier.finished(topic))
    for b in brokers:
        bases = tier.local_bases(b, topic)
        assert bases, f"broker {b} holds no segment of {topic}"
        assert bases[0] - 1 <= remote_end, (
            f"broker {b}: local log starts at {bases[0]}, remote covers only ..{remote_end}"
        )


def produce(cluster: LocalCluster, topic: str, batches: int, value: bytes = b"x" * 100) -> None:
    """Batches of 4 records stamped now (retention.ms counts from record timestamps)."""

    async def body(client: Client) -> None:
        leader = (await client.partitions(topic))[0].leader
        for _ in range(batches):
            now = int(time.time() * 1000)
            data = records.encode_batch([value] * 4, timestamps=[now] * 4)
            result = await client.produce_bytes(leader, topic, 0, data)
            assert result.error_code == 0

    run(cluster, body)


def create(cluster: LocalCluster, topic: str, on: list[int] | None = None, **configs: str) -> None:
    """Create ``topic`` (one partition, on the brokers ``on`` or any 3) and wait until
    every broker's metadata has it with a leader: CreateTopics is answered once the
    controllers committed it, and a leader that has not applied that record yet answers
    a produce UNKNOWN_TOPIC_OR_PARTITION."""

    async def known_everywhere(client: Client) -> bool:
        for b in client.live_brokers():
            response, _ = await (await client.conn(b)).call(m.MetadataRequest([topic]))
            (t,) = response.topics
            if t.error_code != 0 or not t.partitions:
                return False
            if any(p.leader_id < 0 for p in t.partitions):
                return False
        return True

    async def body(client: Client) -> None:
        if on is None:
            await client.create_topic(topic, 1, 3, {**TOPIC_CONFIG, **configs})
        else:
            assigned = [m.ReplicaAssignment(0, on)]
            request = m.CreatableTopic(topic, -1, -1, assigned, {**TOPIC_CONFIG, **configs})
            response = await client.any_request(m.CreateTopicsRequest([request], 20_000))
            assert response.topics[0].error_code == 0, response
        await wait_until_async(lambda: known_everywhere(client), DEADLINE_S, 0.05, topic)

    run(cluster, body)


def leader_of(cluster: LocalCluster, topic: str) -> int:
    async def body(client: Client) -> int:
        return (await client.partitions(topic))[0].leader

    return run(cluster, body)


def test_segments_reach_s3_and_leave_local_disk_then_retention_and_deletion_clean_s3(
    cluster_factory: Any, s3: S3Endpoint
) -> None:
    cluster = tiered_cluster(cluster_factory, s3)
    tier = Tier(cluster, s3)
    create(cluster, "tiered")
    create(cluster, "expiring", **{"retention.ms": "4000"})
    create(cluster, "bounded", **{"retention.bytes": "8192"})
    produce(cluster, "tiered", 200)
    produce(cluster, "expiring", 100)
    produce(cluster, "bounded", 100)

    # Closed, committed segments go to S3 and, once there, leave every replica's disk.
    wait_until(lambda: len(tier.finished("tiered")) >= 10, DEADLINE_S, 0.2, "copies")
    wait_until(
        lambda: min(tier.local_bases(b, "tiered")[0] for b in (1, 2, 3)) > 0,
        DEADLINE_S,
        0.2,
        "local deletion of remote segments",
    )
    check_local_is_remote(tier, "tiered", [1, 2, 3])
    wait_until(lambda: only_finished_objects(tier, "tiered"), DEADLINE_S, 0.2, "quiet bucket")
    finished = tier.finished("tiered")
    assert covered(finished) == max(s.end_offset for s in finished)  # from 0, no gap
    leader = leader_of(cluster, "tiered")
    assert {s.broker_id for s in finished} == {leader}

    # retention.ms: the expiring topic's remote segments and objects go once old enough.
    wait_until(lambda: tier.objects("expiring-"), DEADLINE_S, 0.2, "expiring copies")
    wait_until(
        lambda: not tier.segments("expiring") and not tier.objects("expiring-"),
        DEADLINE_S,
        0.2,
        "remote retention",
    )

    # retention.bytes: remote plus local stay within one segment of the bound.
    def bounded() -> bool:
        remote = tier.finished("bounded")
        local = tier.local_bytes(leader_of(cluster, "bounded"), "bounded")
        total = sum(s.size_bytes for s in remote) + local
        return bool(remote) and remote[0].start_offset > 0 and total - remote[0].size_bytes < 8192

    wait_until(bounded, DEADLINE_S, 0.2, "remote retention by size")
    wait_until(lambda: only_finished_objects(tier, "bounded"), DEADLINE_S, 0.2, "quiet bucket")

    # Topic deletion empties the topic's prefix.
    t = tier.image().topic("tiered")
    assert t is not None
    prefix = topic_prefix("tiered", t.topic_id)
    assert tier.objects(prefix)

    async def delete(client: Client) -> None:
        await client.delete_topic("tiered")

    run(cluster, delete)
    wait_until(lambda: not tier.objects(prefix), DEADLINE_S, 0.2, "the topic prefix emptied")


def test_a_leader_killed_during_uploads_leaves_no_copy_or_object_behind(
    cluster_factory: Any, s3: S3Endpoint
) -> None:
    # Slow uploads (a few KiB/s per broker), so several are under way at the kill.
    cluster = tiered_cluster(
        cluster_factory, s3, **{"remote.log.manager.copy.max.bytes.per.second": 4096}
    )
    tier = Tier(cluster, s3)
    create(cluster, "tiered")
    writer = Writer(cluster, "tiered", 1, batch=5).start()
    try:
        wait_until(lambda: len(tier.finished("tiered")) >= 3, DEADLINE_S, 0.2, "first copies")
        old = leader_of(cluster, "tiered")
        before = covered(tier.finished("tiered"))
        cluster.stop_node(old, kill=True)
        wait_until(
            lambda: leader_of(cluster, "tiered") not in (old, -1), DEADLINE_S, 0.2, "new leader"
        )
        new = leader_of(cluster, "tiered")
        wait_until(
            lambda: any(s.broker_id == new for s in tier.finished("tiered")),
            DEADLINE_S,
            0.2,
            "copies by the new leader",
        )
    finally:
        writer.stop()
    # The new leader resumes where the remote log ends: it copies nothing the remote
    # log already held, and leaves no gap.
    wait_until(lambda: only_finished_objects(tier, "tiered"), DEADLINE_S, 0.2, "quiet bucket")
    finished = tier.finished("tiered")
    by_new = [s for s in finished if s.broker_id == new]
    assert all(s.end_offset > before for s in by_new)
    assert covered(finished) == max(s.end_offset for s in finished)
    assert not any(
        s.broker_id == old
        for s in tier.segments("tiered").values()
        if s.state != SEGMENT_COPY_FINISHED
    )
    check_local_is_remote(tier, "tiered", [b for b in (1, 2, 3) if b != old])


def test_an_s3_outage_delays_uploads_and_deletes_nothing_uncopied(
    cluster_factory: Any, s3: S3Endpoint
) -> None:
    cluster = tiered_cluster(cluster_factory, s3)
    tier = Tier(cluster, s3)
    create(cluster, "tiered")
    writer = Writer(cluster, "tiered", 1, batch=5).start()
    try:
        wait_until(lambda: len(tier.finished("tiered")) >= 2, DEADLINE_S, 0.2, "first copies")
        s3.stop()
        errors_before = dict(writer.errors_seen)  # a first produce may beat the metadata
        # Produce (acks=all) goes on, and the log grows well past what is remote. (The
        # remote end is read once an upload finished just before the outage has had
        # time to commit.)
        acked = writer.acked_count()
        wait_until(lambda: writer.acked_count() >= acked + 750, DEADLINE_S, 0.1, "produce")
        remote_end = covered(tier.finished("tiered"))
        acked = writer.acked_count()
        wait_until(lambda: writer.acked_count() >= acked + 750, DEADLINE_S, 0.1, "produce")
        leader = leader_of(cluster, "tiered")
        wait_until(
            lambda: len(tier.local_bases(leader, "tiered")) > 5, DEADLINE_S, 0.2, "more segments"
        )
        assert covered(tier.finished("tiered")) == remote_end  # nothing copied meanwhile
        for b in (1, 2, 3):
            assert tier.local_bases(b, "tiered")[0] - 1 <= remote_end
        high = sum(len(a.values) for a in writer.acks)
        s3.restart()
        # Uploads catch up with everything acknowledged during the outage.
        wait_until(
            lambda: covered(tier.finished("tiered")) >= high - 200,
            DEADLINE_S,
            0.2,
            "uploads caught up",
        )
    finally:
        if not s3.available:
            s3.restart()
        writer.stop()
    assert writer.errors_seen == errors_before  # no produce failed for the outage
    check_local_is_remote(tier, "tiered", [1, 2, 3])


def test_a_topic_deleted_while_its_only_broker_was_down_leaves_no_prefix(
    cluster_factory: Any, s3: S3Endpoint
) -> None:
    """Nobody that held the topic sees its deletion, so the bucket sweep of the
    lowest-id unfenced broker (1) deletes its prefix once its objects are old enough
    (3 s here); a key outside the layout stays."""
    cluster = tiered_cluster(cluster_factory, s3, **{"remote.log.orphan.sweep.interval.ms": 500})
    tier = Tier(cluster, s3)

    create(cluster, "lonely", on=[3])
    produce(cluster, "lonely", 20)
    wait_until(lambda: tier.finished("lonely"), DEADLINE_S, 0.2, "a copy")
    t = tier.image().topic("lonely")
    assert t is not None
    prefix = topic_prefix("lonely", t.topic_id)
    tier.store.put("shared/notes.txt", b"not the cluster's")
    cluster.stop_node(3)

    async def delete(client: Client) -> None:
        await client.delete_topic("lonely")

    run(cluster, delete)
    wait_until(lambda: not tier.objects(prefix), DEADLINE_S, 0.2, "the bucket sweep")
    assert "shared/notes.txt" in tier.objects()
