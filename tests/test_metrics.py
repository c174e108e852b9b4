"""Metrics under Kafka's names, in process: the ISR shrink and expand counters move when
the leader's AlterPartition answer is applied, produce and fetch count bytes and
messages per topic (consumers apart from followers), the controller's counts and
election timings, the windowed quantiles, and the /metrics HTTP server (404 elsewhere,
garbage answered with 400 and closed, and still serving after it)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
import test_fetch_session_leader
from helpers import wait_until_async
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from test_fetch_session_leader import Follower, Leader, settle_alter_partitions
from test_replica_manager import batch

from rillet.broker.kafka_metrics import BrokerCollector
from rillet.client.runtime.metrics_http import MetricsServer
from rillet.client.runtime.summaries import RecentSummary
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    Endpoint,
    FenceBroker,
    MetadataDelta,
    Partition,
    PartitionChange,
    RegisterBroker,
    Topic,
    TopicPartition,
    UnfenceBroker,
)
from rillet.controller.metrics import elects_leaders, image_counts

session_leader = test_fetch_session_leader.leader  # the fixture, under this name here
LAG_MS = 30_000  # the leader fixture's replica.lag.time.max.ms


def sample(leader: Leader, name: str, **labels: str) -> float | None:
    return leader.handler.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def observed(session_leader: Leader) -> Leader:
    """test_fetch_session_leader's leader, its metrics wired as the broker wires them."""
    leader = session_leader
    metrics = leader.handler.metrics
    leader.manager.metrics = metrics
    metrics.registry.register(BrokerCollector(metrics.kafka, metrics, leader.manager))
    return leader


async def consumer_fetch(leader: Leader) -> int:
    """Bytes a consumer's fetch of every partition of ``t`` from offset 0 got."""
    answer = await Follower(leader, replica_id=-1).fetch()
    return sum(r.nbytes for r in answer.values())


async def test_isr_shrink_and_expand_count_when_the_leaders_answer_is_applied(
    observed: Leader,
) -> None:
    leader = observed
    rm = "kafka_server_replicamanager"
    follower = Follower(leader)
    await follower.fetch()
    tp = TopicPartition("t", 1)
    await leader.manager.append_records([(tp, batch(b"a"))], 1, 1000)
    assert sample(leader, f"{rm}_underreplicatedpartitions") == 0
    leader.advance(LAG_MS + 1)
    leader.tick()
    # Proposed, not yet answered: nothing counted.
    assert sample(leader, f"{rm}_isrshrinks_total") == 0
    await settle_alter_partitions(leader)
    assert leader.isr(1) == (1,)
    assert sample(leader, f"{rm}_isrshrinks_total") == 1
    assert sample(leader, f"{rm}_isrexpands_total") == 0
    assert sample(leader, f"{rm}_underreplicatedpartitions") == 1
    assert sample(leader, f"{rm}_underminisrpartitioncount") == 0  # min.insync.replicas 1
    await follower.fetch()
    follower.positions[1] = 1
    await follower.fetch()
    await settle_alter_partitions(leader)
    assert leader.isr(1) == (1, 2)
    assert sample(leader, f"{rm}_isrexpands_total") == 1
    assert sample(leader, f"{rm}_isrshrinks_total") == 1
    assert sample(leader, f"{rm}_underreplicatedpartitions") == 0
    assert sample(leader, f"{rm}_partitioncount") == sample(leader, f"{rm}_leadercount") == 6


async def test_bytes_and_messages_in_and_out_per_topic(observed: Leader) -> None:
    leader = observed
    tm = "kafka_server_brokertopicmetrics"
    data = batch(b"a", b"b", b"c")
    await leader.manager.append_records([(TopicPartition("t", 0), data)], 1, 1000)
    assert sample(leader, f"{tm}_bytesin_total", topic="t") == len(data)
    assert sample(leader, f"{tm}_messagesin_total", topic="t") == 3
    assert sample(leader, f"{tm}_messagesin_total") == 3  # all topics
    follower = Follower(leader)
    await follower.fetch()  # replication, not bytes out
    follower.positions[0] = 3
    await follower.fetch()  # the high watermark passes the batch
    assert sample(leader, f"{tm}_replicationbytesout_total", topic="t") == len(data)
    assert sample(leader, f"{tm}_bytesout_total", topic="t") is None
    got = await consumer_fetch(leader)
    assert got == len(data)
    assert sample(leader, f"{tm}_bytesout_total", topic="t") == got
    assert sample(leader, f"{tm}_bytesout_total") == got
    # The rillet_ series count every fetch, as before.
    assert leader.handler.metrics.snapshot()["bytes_out_total"] == 2 * len(data)
    leader.handler.metrics.kafka.forget_topic("t")  # the topic deleted
    assert sample(leader, f"{tm}_messagesin_total", topic="t") is None
    assert sample(leader, f"{tm}_messagesin_total") == 3


def test_request_times_are_a_summary_per_kafka_api_name() -> None:
    from rillet.broker.metrics import BrokerMetrics

    metrics = BrokerMetrics()
    metrics.registry.register(BrokerCollector(metrics.kafka, metrics, replicas=_NoReplicas()))  # type: ignore[arg-type]
    for ms in range(1, 101):
        metrics.observe_latency("Produce", ms / 1000)
    get = metrics.registry.get_sample_value
    name = "kafka_network_requestmetrics_totaltimems"
    assert get(f"{name}_count", {"request": "Produce"}) == 100
    assert get(name, {"request": "Produce", "quantile": "0.5"}) == pytest.approx(51)
    assert get(name, {"request": "Produce", "quantile": "0.99"}) == pytest.approx(100)
    assert get("kafka_network_requestmetrics_requests_total", {"request": "Produce"}) == 100
    idle = get("kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent")
    assert idle is not None and 0 <= idle <= 1


class _NoReplicas:
    replicas: dict = {}
    image = EMPTY_IMAGE


def test_recent_summary_keeps_a_bounded_window_and_life_totals() -> None:
    s = RecentSummary(window=10)
    assert s.quantiles() == []
    for v in range(100):
        s.observe(float(v))
    assert (s.count, s.sum, len(s.recent)) == (100, sum(range(100)), 10)
    assert dict(s.quantiles())[0.5] == 95.0  # of the last ten: 90..99


def test_controller_counts_and_what_is_an_election() -> None:
    endpoints = (Endpoint("BROKER", "h", 1),)
    recs: list = [RegisterBroker(b, f"inc-{b}", 1, endpoints, None) for b in (1, 2, 3)]
    recs += [UnfenceBroker(b, 1) for b in (1, 2)]
    recs.append(Topic("t", "tid"))
    recs += [
        Partition("tid", 0, (1, 2), (1, 2), 1, 0, 0),
        Partition("tid", 1, (1, 2), (2,), 2, 0, 0),  # not its preferred leader
        Partition("tid", 2, (3,), (3,), -1, 0, 0),  # offline
    ]
    delta = MetadataDelta(EMPTY_IMAGE)
    delta.replay_all(recs, 0, 1)
    counts = image_counts(delta.apply())
    assert (counts.topics, counts.partitions, counts.offline, counts.imbalanced) == (1, 3, 1, 1)
    assert (counts.fenced, counts.active) == (1, 2)
    assert elects_leaders([FenceBroker(1, 1), PartitionChange("tid", 0, leader=2)])
    assert not elects_leaders([PartitionChange("tid", 0, isr=(1,))])


# ---- the HTTP server ---------------------------------------------------------------------


@pytest.fixture
async def server() -> MetricsServer:
    registry = CollectorRegistry(auto_describe=False)
    Counter("probe", "A counter", registry=registry).inc(3)
    other = CollectorRegistry(auto_describe=False)
    Counter("other_probe", "Another node's counter", registry=other).inc()
    s = MetricsServer([registry, other], head_timeout_s=0.5)
    await s.start("127.0.0.1", -1)
    yield s
    await s.stop()


async def exchange(server: MetricsServer, data: bytes, eof: bool = False) -> bytes:
    """Send ``data`` (then end the stream, with ``eof``) and read until the server closes
    the connection; b"" when it reset it (closed with our bytes unread)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(data)
        if eof:
            writer.write_eof()
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def test_metrics_are_served_and_other_paths_are_404(server: MetricsServer) -> None:
    answer = await exchange(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"probe_total 3.0" in body and b"other_probe_total 1.0" in body  # both registries
    assert (await exchange(server, b"GET /status HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
    assert (await exchange(server, b"POST /metrics HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.1 405")
    head_only = await exchange(server, b"HEAD /metrics?x=1 HTTP/1.1\r\n\r\n")
    assert head_only.startswith(b"HTTP/1.1 200") and head_only.endswith(b"\r\n\r\n")
    assert f"Content-Length: {len(body)}".encode() in head_only


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff\x16\x03\x01 not http\r\n\r\n",  # e.g. TLS to a plain port
        b"GET /metrics\r\n\r\n",  # no version
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",  # a head over the bound
        b"GET /metrics HTTP/1.1\r\n",  # never finished: closed after the head timeout
        b"",  # connected, then closed at once (eof)
    ],
)
async def test_garbage_is_answered_400_and_closed_and_serving_goes_on(
    server: MetricsServer, garbage: bytes
) -> None:
    answer = await exchange(server, garbage, eof=not garbage)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
    ok = await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200")


async def test_an_operation_is_timed_once_it_commits_and_an_election_counts() -> None:
    from rillet.controller.metrics import ControllerMetrics
    from rillet.controller.server import ControllerServer

    now = [10.0]
    server = object.__new__(ControllerServer)  # the timing needs no running node
    server.metrics = ControllerMetrics(server, clock=lambda: now[0])
    loop = asyncio.get_running_loop()
    elected, plain, failed = loop.create_future(), loop.create_future(), loop.create_future()
    server._time_commit(elected, planned=10.0, proposed=10.5, election=True)
    server._time_commit(plain, planned=10.0, proposed=10.5, election=False)
    server._time_commit(failed, planned=10.0, proposed=10.5, election=True)
    now[0] = 12.0
    elected.set_result(None)
    plain.set_result(None)
    failed.set_exception(RuntimeError("leadership lost"))
    await asyncio.sleep(0)  # the done callbacks run
    elections, commits = server.metrics.elections, server.metrics.commits
    assert (elections.count, elections.sum) == (1, 2000.0)  # planning to commit
    assert (commits.count, commits.sum) == (2, 3000.0)  # proposal to commit, twice


# ---- the HTTP server's bounds --------------------------------------------------------------


class _WideCollector:
    """Few series with very long label values: a large exposition, quick to render."""

    def __init__(self, series: int, label_bytes: int) -> None:
        self.series, self.label_bytes = series, label_bytes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("big", "Series with long labels", labels=["topic"])
        for i in range(self.series):
            family.add_metric([f"{i:06d}" + "x" * self.label_bytes], i)
        yield family


def big_registry(series: int = 120, label_bytes: int = 100_000) -> CollectorRegistry:
    """A registry whose exposition (~12 MB) is far more than the kernel buffers for an
    unread socket (a few MB), so its answer cannot finish unless the client reads."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_WideCollector(series, label_bytes))
    return registry


def stalled_scraper(server: MetricsServer) -> socket.socket:
    """A scraper that asks for /metrics and never reads the answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((server.host, server.port))
    sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    return sock


def drain_to_end(sock: socket.socket) -> None:
    """Read what the server sent until it closed or reset the connection."""
    sock.settimeout(30)  # a deadline: the server closes long before
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    finally:
        sock.close()


async def test_a_scrape_that_is_never_read_is_closed_in_bounded_time() -> None:
    server = MetricsServer([big_registry()], answer_timeout_s=0.5)
    await server.start("127.0.0.1", -1)
    try:
        socks = [stalled_scraper(server) for _ in range(3)]
        await wait_until_async(
            lambda: server.answers_abandoned == 3, timeout=60, message="stalled scrapes dropped"
        )
        assert server.open_connections == 0
        for sock in socks:  # each was reset (or closed) by the server
            await asyncio.to_thread(drain_to_end, sock)
        ok = await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200") and b"big{" in ok
        # A node's shutdown does not wait for a scraper that stalls.
        server.answer_timeout_s = 600
        late = stalled_scraper(server)
        await wait_until_async(lambda: server.open_connections == 1, timeout=30)
    finally:
        await asyncio.wait_for(server.stop(), 30)
    assert server.open_connections == 0
    late.close()


async def test_connections_over_the_cap_are_refused_503_and_serving_goes_on() -> None:
    server = MetricsServer([big_registry(1, 10)], head_timeout_s=60, max_connections=2)
    await server.start("127.0.0.1", -1)
    try:
        held = [await asyncio.open_connection(server.host, server.port) for _ in range(2)]
        await wait_until_async(lambda: server.open_connections == 2, timeout=30)
        refused = await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert refused == b"" or refused.startswith(b"HTTP/1.1 503")
        for _, writer in held:
            writer.close()
        await wait_until_async(lambda: server.open_connections == 0, timeout=30)
        ok = await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")
    finally:
        await server.stop()


def test_topics_deleted_while_a_broker_was_behind_leave_no_series() -> None:
    """A delta that deletes a topic drops its series; a broker that loads a snapshot sees
    no deletions, only the topics that remain, and the others' series must go then too."""
    from test_quorum_controller import Cluster

    from rillet.broker.kafka_metrics import KafkaBrokerStats
    from rillet.broker.link.controller_client import snapshot_delta
    from rillet.controller.metadata.image import encode_snapshot

    c = Cluster(brokers=1)
    for name in ("kept", "gone", "deleted"):
        c.create(name, rf=1)
    stats = KafkaBrokerStats()
    for name in ("kept", "gone", "deleted"):
        stats.record_in(name, 100, 1)
        stats.record_out(name, 50, replication=True)
    before = c.image
    c.run(c.ctl.delete_topics(c.image, ["deleted"]))
    delta = MetadataDelta(before)
    delta.replay_all(c.last_records, c.image.offset, c.image.epoch)
    stats.on_metadata(delta, delta.apply())
    assert set(stats.bytes_in.by_topic) == {"kept", "gone"}
    # Then the broker falls behind "gone"'s deletion and catches up from a snapshot.
    c.run(c.ctl.delete_topics(c.image, ["gone"]))
    delta = snapshot_delta(encode_snapshot(c.image))
    stats.on_metadata(delta, delta.apply())
    for counter in (stats.bytes_in, stats.messages_in, stats.replication_bytes_out):
        assert set(counter.by_topic) == {"kept"}
    assert stats.bytes_in.total == 300  # the all-topics total keeps what they counted
