"""The console in a real headless Chromium against a real 3-broker cluster: the overview
(brokers, counts, chart; a broker killed -9 turns red and back), the topics list (paging,
filter, sort) and a topic's detail. Screenshots of each page go to the test artifacts."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import artifacts_dir, start_console
from browser import console_cluster as cluster_for_console
from helpers import ServerProcess, wait_until

from rillet.client.admin import Admin, NewTopic
from rillet.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from rillet.tools.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

# Generous: the console refreshes every second, the controller fences a dead broker
# after its session timeout and shrinks the ISRs it was in; a loaded CI box is slower.
SEEN_S = 30
MS = 1000
TOPICS = [
    NewTopic("orders", 6, 3, configs={"min.insync.replicas": "2"}),
    # Every replica needed: one broker down puts it under min ISR.
    NewTopic("payments", 1, 3, configs={"min.insync.replicas": "3"}),
    NewTopic("clicks", 3, 3),  # background traffic
] + [NewTopic(f"events-{i}", 1, 1) for i in range(7)]


@pytest.fixture(scope="module")
def console_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with cluster_for_console(Path(tmp_path_factory.mktemp("console")) / "cluster") as cluster:
        with SyncAdmin(cluster.bootstrap) as admin:
            admin.create_topics(TOPICS)
            wait_until(
                lambda: all(
                    len(p.isr) == 3
                    for t in admin.describe_topics(["orders", "payments"])
                    for p in t.partitions
                ),
                timeout=60,
                interval=0.2,
                message="orders and payments fully replicated",
            )
        with SyncProducer(bootstrap=cluster.bootstrap, acks="all") as producer:
            producer.send_many("orders", [f"order {i}".encode() for i in range(300)])
            producer.flush()
        asyncio.run(commit_offsets(cluster.bootstrap))  # makes __consumer_offsets
        yield cluster


async def commit_offsets(bootstrap: str) -> None:
    async with Admin(bootstrap) as admin:
        await admin.alter_group_offsets("billing", {("orders", 0): 10})


@pytest.fixture(scope="module")
def console(console_cluster: LocalCluster) -> Iterator[str]:
    # Each broker's /metrics, as `cluster up` gives them: bytes out per broker.
    metrics = ",".join(f"{n.node_id}={n.metrics}" for n in console_cluster.brokers())
    server: ServerProcess = start_console(console_cluster.bootstrap, "--metrics", metrics)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def screenshot(page: Any, name: str) -> None:
    page.screenshot(path=str(artifacts_dir() / f"{name}.png"))


def test_overview_lists_the_three_brokers(console: str, page: Any) -> None:
    from playwright.sync_api import expect

    page.goto(console + "/")
    rows = page.locator("table.brokers tbody tr")
    expect(rows).to_have_count(3, timeout=SEEN_S * MS)
    for broker in ("1", "2", "3"):
        expect(page.locator(f'tr[data-broker="{broker}"]')).to_have_attribute("data-state", "up")
    expect(page.locator("#urp b")).to_have_text("0")
    topics = len(TOPICS) + 1  # and __consumer_offsets
    expect(page.locator('[data-name="topics"] b')).to_have_text(str(topics), timeout=SEEN_S * MS)
    # The chart draws once the history endpoint has answered.
    expect(page.locator("#health-chart")).to_have_attribute("data-ready", "1", timeout=SEEN_S * MS)
    expect(page.locator("#health-chart canvas")).to_have_count(1)
    # The controller quorum: one active controller among three voters.
    expect(page.locator("table.quorum tbody tr")).to_have_count(3)
    active = page.locator("#active-controller").inner_text()
    assert active in {"101", "102", "103"}
    expect(page.locator(f'tr[data-voter="{active}"] td').nth(1)).to_have_text("active")
    # Rates are known once two log passes (and two scrapes of /metrics) are in.
    for broker in ("1", "2", "3"):
        cells = page.locator(f'tr[data-broker="{broker}"] td')
        expect(cells.nth(7)).to_have_text(re.compile(r"B/s$"), timeout=SEEN_S * MS)  # in
        expect(cells.nth(9)).to_have_text(re.compile(r"B/s$"), timeout=SEEN_S * MS)  # out


@contextlib.contextmanager
def traffic(bootstrap: str) -> Iterator[None]:
    """Produce to and consume from ``clicks`` in the background until the block ends (a
    batch every 50 ms: traffic, not a load test)."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with SyncProducer(bootstrap=bootstrap, acks="all") as producer:
                while not stop.wait(0.05):
                    producer.send_many("clicks", [b"x" * 200] * 50)
                    producer.flush()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    def consume() -> None:
        try:
            with SyncConsumer("clicks", bootstrap=bootstrap, from_beginning=True) as consumer:
                while not stop.is_set():
                    consumer.poll(200)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=f, daemon=True) for f in (produce, consume)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors


def test_bytes_in_and_out_show_the_traffic(
    console: str, console_cluster: LocalCluster, page: Any
) -> None:
    from playwright.sync_api import expect

    with SyncAdmin(console_cluster.bootstrap) as admin:
        leaders = {p.leader for p in admin.describe_topics(["clicks"])[0].partitions}
    page.goto(console + "/")
    nonzero = re.compile(r"^[1-9]|^0\.[0-9]*[1-9]")  # "0 B/s" is no traffic
    with traffic(console_cluster.bootstrap):
        # The leaders of clicks take its records in and serve them out.
        for broker in sorted(leaders):
            cells = page.locator(f'tr[data-broker="{broker}"] td')
            expect(cells.nth(7)).to_have_text(nonzero, timeout=SEEN_S * MS)  # bytes in
            expect(cells.nth(8)).to_have_text(nonzero, timeout=SEEN_S * MS)  # records in
            expect(cells.nth(9)).to_have_text(nonzero, timeout=SEEN_S * MS)  # bytes out
        screenshot(page, "overview")
        page.goto(console + "/topics?sort=records_in&dir=desc")
        expect(page.locator("table.topics tbody tr").first).to_have_attribute(
            "data-topic", "clicks"
        )
        row = page.locator("tr[data-topic='clicks'] td")
        expect(row.nth(7)).to_have_text(nonzero, timeout=SEEN_S * MS)
        screenshot(page, "topics")


def test_topics_list_pages_filters_and_sorts(console: str, page: Any) -> None:
    from playwright.sync_api import expect

    page.goto(console + "/topics?size=5")
    rows = page.locator("table.topics tbody tr")
    expect(rows).to_have_count(5)
    expect(page.locator("table.topics")).to_have_attribute("data-total", str(len(TOPICS)))
    expect(page.locator("tr[data-topic='__consumer_offsets']")).to_have_count(0)
    page.locator("a[rel=next]").first.click()
    expect(rows).to_have_count(len(TOPICS) - 5)
    expect(page).to_have_url(re.compile(r"page=2"))

    page.locator("input[name=q]").fill("orders")
    expect(rows).to_have_count(1)
    expect(page.locator("tr[data-topic='orders'] td").nth(1)).to_have_text("6")
    page.locator("input[name=q]").fill("")
    expect(page.locator("table.topics")).to_have_attribute("data-total", str(len(TOPICS)))

    # Sorted by partitions, most first: orders (6) heads the list.
    page.goto(console + "/topics?sort=partitions&dir=desc")
    expect(rows.first).to_have_attribute("data-topic", "orders")
    # Its size shows once the leaders' log sizes are sampled.
    expect(page.locator("tr[data-topic='orders'] td").nth(4)).to_have_text(
        re.compile(r"\d"), timeout=SEEN_S * MS
    )
    page.locator("input[name=internal]").check()
    expect(page.locator("tr[data-topic='__consumer_offsets']")).to_have_count(1)
    expect(page.locator("tr[data-topic='__consumer_offsets']")).to_have_class(
        re.compile("internal")
    )
    page.locator("input[name=internal]").uncheck()
    expect(page.locator("tr[data-topic='__consumer_offsets']")).to_have_count(0)


def test_topic_detail_shows_partitions_and_offsets(console: str, page: Any) -> None:
    from playwright.sync_api import expect

    page.goto(console + "/topics/orders")
    parts = page.locator("table.partitions tbody tr")
    expect(parts).to_have_count(6)
    total = 0
    for i in range(6):
        cells = parts.nth(i).locator("td")
        assert len(cells.nth(2).inner_text().split(",")) == 3  # replicas
        total += int(cells.nth(5).inner_text())  # log end
    assert total == 300
    expect(page.locator("#topic-groups")).to_be_attached()
    # Configs: the one set on the topic first, marked; the broker's defaults after.
    configs = page.locator("table.configs tbody tr")
    expect(configs.first).to_have_attribute("data-config", "min.insync.replicas")
    expect(configs.first).to_have_class(re.compile(r"\bset\b"))
    expect(configs.first.locator("td").nth(1)).to_have_text("2")
    assert configs.count() > 5
    screenshot(page, "topic")

    page.goto(console + "/topics/no-such-topic")
    expect(page.locator(".stale")).to_contain_text("does not exist")


def test_a_killed_broker_and_the_urp_count_turn_red_and_back(
    console: str, console_cluster: LocalCluster, page: Any
) -> None:
    from playwright.sync_api import expect

    page.goto(console + "/")
    row = page.locator('tr[data-broker="3"]')
    expect(row).to_have_attribute("data-state", "up", timeout=SEEN_S * MS)
    console_cluster.stop_node(3, kill=True)
    try:
        expect(row).to_have_class(re.compile(r"\bbad\b"), timeout=SEEN_S * MS)
        expect(page.locator("#urp")).to_have_class(re.compile(r"\bbad\b"), timeout=SEEN_S * MS)
        assert int(page.locator("#urp b").inner_text()) > 0
        expect(page.locator("#urp")).to_have_css("color", "rgb(198, 40, 40)")
        expect(page.locator("#under-min-isr")).to_have_class(re.compile(r"\bbad\b"))
        expect(page.locator("#under-min-isr b")).to_have_text(re.compile(r"^[1-9]"))  # payments
        # The chart has drawn the new point too.
        chart = page.locator("#health-chart")
        expect(chart).to_have_attribute(
            "data-last-under-replicated", re.compile(r"^[1-9]"), timeout=SEEN_S * MS
        )
        screenshot(page, "overview-broker-down")
        # The topic's page marks the partitions that lost the broker's replica.
        page.goto(console + "/topics/orders")
        short = page.locator("table.partitions tbody tr.bad")
        expect(short).to_have_count(6)  # every partition had a replica on broker 3
        expect(short.first.locator(".tag")).to_have_text("under-replicated")
        page.goto(console + "/")
    finally:
        console_cluster.start_node(3)
    expect(row).to_have_attribute("data-state", "up", timeout=SEEN_S * MS)
    expect(row).not_to_have_class(re.compile(r"\bbad\b"))
    expect(page.locator("#urp b")).to_have_text("0", timeout=60 * MS)
    expect(page.locator("#urp")).not_to_have_class(re.compile(r"\bbad\b"))
    expect(page.locator("#under-min-isr b")).to_have_text("0")
