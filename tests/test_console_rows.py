"""The console's sans-I/O parts: broker and topic rows, rates from two log samples,
paging, sorting, filtering helpers and the metrics endpoint parsing (no cluster)."""

from __future__ import annotations

import http.server
import threading

import pytest

from rillet.client.admin import ClusterDescription, TopicDescription
from rillet.client.console.format import human_bytes, human_rate
from rillet.client.console.metrics import BytesOutMeter, bytes_out_total, parse_targets
from rillet.client.console.rows import (
    FENCED,
    MISSING,
    UNREACHABLE,
    UP,
    broker_rows,
    int_param,
    log_stats,
    paginate,
    sort_rows,
    topic_rows,
)
from rillet.client.health import assess
from rillet.client.metadata import BrokerInfo, PartitionInfo
from rillet.client.wire.messages import DescribeLogDirsPartition


def part(
    topic: str, p: int, leader: int, replicas: tuple[int, ...], isr: tuple[int, ...]
) -> PartitionInfo:
    return PartitionInfo(topic, p, leader, 0, replicas, isr)


def logdir(
    p: int, end: int, size: int, remote: int = 0, tiered: bool = False
) -> DescribeLogDirsPartition:
    return DescribeLogDirsPartition(p, 0, 0, 0, end, size, -1, -1, remote, 0, 0, 0, tiered)


BROKERS = tuple(BrokerInfo(i, "127.0.0.1", 9090 + i, f"r{i}") for i in (1, 2, 3))
TOPICS = (
    TopicDescription(
        "a", (part("a", 0, 1, (1, 2, 3), (1, 2, 3)), part("a", 1, 2, (2, 3, 1), (2, 1)))
    ),
    TopicDescription("b", (part("b", 0, -1, (3,), ()),)),
)


def test_broker_states_and_counts() -> None:
    cluster = ClusterDescription("c", 101, BROKERS, fenced=(2,))
    gone = BrokerInfo(4, "127.0.0.1", 9999)
    health = assess(cluster, None, TOPICS, {})
    rows = broker_rows(health, unreachable={3}, missing=[gone, BROKERS[0]])
    by_id = {r.id: r for r in rows}
    assert [r.id for r in rows] == [1, 2, 3, 4]  # a listed broker is never "missing"
    assert by_id[1].state == UP and not by_id[1].bad and by_id[1].address == "127.0.0.1:9091"
    assert by_id[2].state == FENCED and by_id[2].bad
    assert by_id[3].state == UNREACHABLE and by_id[4].state == MISSING
    assert (by_id[1].leaders, by_id[1].partitions, by_id[1].under_replicated) == (1, 2, 0)
    assert (by_id[2].leaders, by_id[2].under_replicated) == (1, 1)
    assert by_id[3].partitions == 3
    assert by_id[1].bytes_in is None  # no rates before two log samples


def test_rates_come_from_two_log_samples_on_the_current_leader() -> None:
    first = log_stats(
        TOPICS, {("a", 0): logdir(0, 10, 1000), ("a", 1): logdir(1, 0, 0)}, 100.0, None
    )
    assert first.interval_s == 0 and first.topic_rates == {}
    assert first.topic_sizes["a"].local == 1000 and first.topic_sizes["a"].known == 2
    second = log_stats(
        TOPICS,
        {("a", 0): logdir(0, 30, 3000), ("a", 1): logdir(1, 10, 500, remote=100, tiered=True)},
        110.0,
        first,
    )
    assert second.interval_s == 10
    assert second.topic_rates["a"].records_in == pytest.approx(3.0)
    assert second.topic_rates["a"].bytes_in == pytest.approx(260.0)
    assert second.broker_rates[1].records_in == pytest.approx(2.0)
    assert second.broker_rates[2].bytes_in == pytest.approx(60.0)
    # A shrinking log (retention) counts as nothing appended, never as negative.
    third = log_stats(TOPICS, {("a", 0): logdir(0, 30, 100)}, 120.0, second)
    assert third.topic_rates["a"].bytes_in == 0

    rows = {r.name: r for r in topic_rows(TOPICS, second)}
    assert rows["a"].size_local == 3500 and rows["a"].size_remote == 100
    assert rows["a"].under_replicated == 1 and rows["b"].offline == 1
    assert rows["b"].size_local is None and rows["b"].records_in == 0


def test_paging_sorting_and_params() -> None:
    rows = list(range(1, 121))
    page = paginate(rows, 3, 50, {"q": "x"})
    assert (page.page, page.pages, page.first, page.last) == (3, 3, 101, 120)
    assert page.link(page=2) == "?q=x&page=2"
    assert paginate(rows, 99, 50, {}).page == 3 and paginate([], 1, 50, {}).first == 0
    assert sort_rows([3, None, 1], lambda v: v, descending=True) == [3, 1, None]
    assert sort_rows([3, None, 1], lambda v: v, descending=False) == [1, 3, None]
    assert int_param("abc", 7) == 7 and int_param("0", 7) == 1 and int_param(None, 7) == 7


def test_formatting() -> None:
    assert human_bytes(None) == "-" and human_bytes(1536) == "1.5 KiB" and human_bytes(12) == "12 B"
    assert human_rate(2048, "B") == "2.0 KiB/s" and human_rate(2.5) == "2.5/s"


def test_metrics_targets_and_bytes_out() -> None:
    assert parse_targets("1=127.0.0.1:9401, 2=http://h:9/m") == {
        1: "http://127.0.0.1:9401/metrics",
        2: "http://h:9/m",
    }
    with pytest.raises(ValueError):
        parse_targets("127.0.0.1:9401")
    text = (
        "# TYPE kafka_server_brokertopicmetrics_bytesout counter\n"
        'kafka_server_brokertopicmetrics_bytesout_total{topic="a"} 5.0\n'
        "kafka_server_brokertopicmetrics_bytesout_total 42.0\n"
    )
    assert bytes_out_total(text) == 42.0
    assert bytes_out_total("") is None


class _Exposition(http.server.BaseHTTPRequestHandler):
    """A /metrics whose all-topics bytes-out counter grows by 1,000 per scrape."""

    scrapes = 0

    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        type(self).scrapes += 1
        body = (
            "# TYPE kafka_server_brokertopicmetrics_bytesout counter\n"
            f"kafka_server_brokertopicmetrics_bytesout_total {1000.0 * type(self).scrapes}\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def test_bytes_out_is_the_counters_growth_between_scrapes() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        meter = BytesOutMeter({1: f"http://127.0.0.1:{port}/metrics", 2: "http://127.0.0.1:1/"})
        await meter.scrape()
        assert meter.rates == {}  # one scrape: no rate yet
        await meter.scrape()
        assert set(meter.rates) == {1}  # broker 2's endpoint refuses: unknown, not zero
        assert meter.rates[1] > 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
