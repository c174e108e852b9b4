"""The console's Messages, Consumer groups and Actions pages in a real headless Chromium
against a real 3-broker cluster, with a second console in ``--read-only`` mode."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from browser import REPO, artifacts_dir, console_cluster, running_console
from helpers import wait_until
from playwright.sync_api import expect

from rillet.client.admin import Admin, NewTopic
from rillet.client.producer import Producer
from rillet.tools.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

T = TypeVar("T")
TOPIC = "orders"
WAIT_MS = 30_000  # generous: the lag cache refreshes every few seconds
DOCS = REPO / "docs" / "console"
HOSTILE = '<img src=x onerror="document.title=1"><script>document.title=2</script>'


def admin_call(bootstrap: str, call: Callable[[Admin], Awaitable[T]]) -> T:
    """An Admin call from a sync test: in a thread of its own, since Playwright's sync
    API keeps an event loop running in this one."""

    async def main() -> T:
        async with Admin(bootstrap) as admin:
            return await call(admin)

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


def screenshot(page: Any, name: str) -> None:
    """To the test artifacts; with RILLET_DOCS_SCREENSHOTS=1 also over the copy in
    docs/console/ (so an ordinary run leaves the committed pictures alone)."""
    path = artifacts_dir() / f"{name}.png"
    page.screenshot(path=str(path))
    if os.environ.get("RILLET_DOCS_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS / f"{name}.png")


@pytest.fixture(scope="module")
def pages_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with console_cluster(tmp_path_factory.mktemp("console-pages") / "cluster") as cluster:
        bootstrap = cluster.bootstrap

        async def setup() -> None:
            async with Admin(bootstrap) as admin:
                await admin.create_topics([NewTopic(TOPIC, 3, 3)])
            async with Producer(bootstrap, acks="all") as producer:
                for i in range(20):
                    await producer.produce(
                        TOPIC, f"order {i}".encode(), f"k{i}".encode(), partition=0
                    )
                # Markup in a key, a value and a header shows as text, never as markup.
                await producer.produce(
                    TOPIC, HOSTILE.encode(), b"<b>key</b>", [("h", b"<i>x</i>")], partition=2
                )
                await producer.flush()

        asyncio.run(setup())
        yield cluster


@pytest.fixture(scope="module")
def console(pages_cluster: LocalCluster) -> Iterator[str]:
    with running_console(pages_cluster.bootstrap) as url:
        yield url


@pytest.fixture(scope="module")
def read_only_console(pages_cluster: LocalCluster) -> Iterator[str]:
    with running_console(pages_cluster.bootstrap, "--read-only") as url:
        yield url


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Committed offsets of a group without members (which creates the group)."""
    admin_call(bootstrap, lambda a: a.alter_group_offsets(group, offsets))


def test_a_message_produced_through_the_page_is_browsed_searched_and_formatted(
    console: str, page: Any
) -> None:
    page.goto(f"{console}/messages?topic={TOPIC}")
    page.locator("details.produce summary").click()
    form = page.locator("details.produce form")
    # A partition the topic does not have is refused on the page, readably.
    form.locator("input[name=partition]").fill("9")
    form.locator("textarea[name=value]").fill("nowhere")
    form.locator("button[type=submit]").click()
    expect(page.locator("#produced p.error")).to_contain_text("no partition 9", timeout=WAIT_MS)
    form.locator("input[name=partition]").fill("1")
    form.locator("input[name=key]").fill("order-7731")
    form.locator("textarea[name=value]").fill('{"id": 7731, "status": "paid"}')
    form.locator("textarea[name=headers]").fill("source=console")
    form.locator("button[type=submit]").click()
    sent = page.locator("#sent")
    expect(sent).to_contain_text(f"{TOPIC}-1", timeout=WAIT_MS)
    expect(page.locator("#produced pre.cli")).to_contain_text(
        f"rillet produce {TOPIC} --acks all --partition 1"
    )
    offset = page.locator("#sent [data-name=offset]").inner_text()

    # Newest first: the record just sent is the first row.
    sent.locator("a").click()
    first = page.locator("table.records tbody tr").first
    expect(first).to_have_attribute("data-offset", offset, timeout=WAIT_MS)
    expect(first.locator("td.key")).to_have_text("order-7731")
    expect(first.locator("td.headers")).to_contain_text("source: console")

    page.locator("a[data-format=json]").click()
    value = page.locator(f"tr[data-offset='{offset}'] td.value pre")
    expect(value).to_have_text('{\n  "id": 7731,\n  "status": "paid"\n}', timeout=WAIT_MS)
    screenshot(page, "messages")
    page.locator("a[data-format=hex]").click()
    expect(page.locator(f"tr[data-offset='{offset}'] td.key pre")).to_have_text(
        "6f 72 64 65 72 2d 37 37 33 31", timeout=WAIT_MS
    )

    # The search box finds it by a piece of its value, and says what it scanned.
    page.goto(f"{console}/messages?topic={TOPIC}&partition=1")
    page.locator("form.browse input[name=q]").fill('"status": "paid"')
    page.locator("form.browse button[type=submit]").click()
    expect(page.locator("p.searched")).to_contain_text("1 match(es)", timeout=WAIT_MS)
    expect(page.locator("p.searched")).to_contain_text(f"Searched offsets {offset}..0")
    expect(page.locator("table.records tbody tr")).to_have_count(1)


def test_browsing_pages_through_a_partition_both_ways(console: str, page: Any) -> None:
    page.goto(f"{console}/messages?topic={TOPIC}&partition=0&from=oldest&order=asc&limit=8")
    rows = page.locator("table.records tbody tr")
    expect(rows).to_have_count(8, timeout=WAIT_MS)
    expect(rows.first).to_have_attribute("data-offset", "0")
    page.locator("a.newer").click()
    expect(rows.first).to_have_attribute("data-offset", "8", timeout=WAIT_MS)
    # From an offset, newest first: that record and the ones before it.
    page.goto(f"{console}/messages?topic={TOPIC}&partition=0&from=offset&offset=5&order=desc")
    expect(rows).to_have_count(6, timeout=WAIT_MS)
    expect(rows.first).to_have_attribute("data-offset", "5")
    page.goto(f"{console}/messages?topic={TOPIC}&partition=2")
    row = page.locator("table.records tbody tr").first
    expect(row.locator("td.value")).to_have_text(HOSTILE, timeout=WAIT_MS)
    expect(row.locator("td.key")).to_have_text("<b>key</b>")
    expect(row.locator("td.headers")).to_contain_text("<i>x</i>")
    expect(page.locator("main img, main b:text('key'), table.records script")).to_have_count(0)
    assert page.title() == "Messages · rillet console"
    # An unknown topic is a message on the page, not an error page.
    page.goto(f"{console}/messages?topic=no-such-topic")
    expect(page.locator("p.error")).to_contain_text("UNKNOWN_TOPIC_OR_PARTITION")


def test_groups_are_listed_and_sorted_by_lag_with_a_detail_page(
    console: str, pages_cluster: LocalCluster, page: Any
) -> None:
    bootstrap = pages_cluster.bootstrap
    commit(bootstrap, "lag-small", {(TOPIC, 0): 17})  # 20 records: lag 3
    commit(bootstrap, "lag-big", {(TOPIC, 0): 2})  # lag 18

    page.goto(f"{console}/groups?q=lag-")
    big = page.locator("tr[data-group='lag-big'] td.lag")
    expect(big).to_have_text("18", timeout=WAIT_MS)
    expect(page.locator("tr[data-group='lag-small'] td.lag")).to_have_text("3", timeout=WAIT_MS)
    groups = page.locator("table.groups tbody tr")
    expect(groups.first).to_have_attribute("data-group", "lag-big")
    screenshot(page, "groups")
    # Sorting by lag again flips the order (a partial swap of the table).
    page.locator("a[data-sort=lag]").click()
    expect(groups.first).to_have_attribute("data-group", "lag-small", timeout=WAIT_MS)

    page.locator("a", has_text="lag-small").click()
    expect(page.locator("#total-lag")).to_have_text("3", timeout=WAIT_MS)
    page.goto(f"{console}/groups/lag-big")
    expect(page.locator("#total-lag")).to_have_text("18", timeout=WAIT_MS)
    expect(page.locator(f"tr[data-partition='{TOPIC}-0'] td.lag")).to_have_text("18")
    expect(page.locator("#lag-chart canvas")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("a", has_text="Reset offsets")).to_be_visible()
    screenshot(page, "group-detail")

    # The topic page's fragment: the groups reading it, with their lag there.
    page.goto(f"{console}/groups-data/by-topic/{TOPIC}")
    expect(page.locator("tr[data-group='lag-big'] td.lag")).to_have_text("18")


def test_create_a_topic_through_the_page(
    console: str, pages_cluster: LocalCluster, page: Any
) -> None:
    page.goto(f"{console}/groups")
    page.locator("header nav a", has_text="Actions").click()
    page.locator("a", has_text="Create a topic").click()
    page.locator("input[name=topic]").fill("made-by-console")
    page.locator("input[name=partitions]").fill("2")
    page.locator("input[name=replication_factor]").fill("3")
    page.locator("textarea[name=configs]").fill("retention.ms=3600000")
    page.locator("button", has_text="Review").click()
    cli = page.locator("#cli")
    expect(cli).to_contain_text(
        "rillet topic create made-by-console --partitions 2 --replication-factor 3 "
        "--config retention.ms=3600000 --bootstrap",
        timeout=WAIT_MS,
    )
    screenshot(page, "action-confirm")
    # Nothing exists before the confirmation is executed.
    names = admin_call(pages_cluster.bootstrap, lambda a: a.list_topics())
    assert "made-by-console" not in names
    page.locator("#execute").click()
    expect(page.locator("#outcome")).to_contain_text(
        "Created topic made-by-console", timeout=WAIT_MS
    )
    (topic,) = admin_call(pages_cluster.bootstrap, lambda a: a.describe_topics(["made-by-console"]))
    assert len(topic.partitions) == 2 and topic.replication_factor == 3

    # Asking for more replicas than brokers is refused at the confirmation, readably.
    page.goto(f"{console}/actions/create-topic")
    page.locator("input[name=topic]").fill("too-many-replicas")
    page.locator("input[name=replication_factor]").fill("9")
    page.locator("button", has_text="Review").click()
    expect(page.locator("p.error")).to_contain_text("INVALID_REPLICATION_FACTOR", timeout=WAIT_MS)


def test_change_a_topic_config_through_the_page(
    console: str, pages_cluster: LocalCluster, page: Any
) -> None:
    page.goto(f"{console}/actions/alter-config?topic={TOPIC}")
    page.locator("input[name=key]").fill("retention.ms")
    page.locator("input[name=value]").fill("7200000")
    page.locator("button", has_text="Review").click()
    expect(page.locator("#cli")).to_contain_text(
        f"rillet topic alter {TOPIC} --set retention.ms=7200000", timeout=WAIT_MS
    )
    page.locator("#execute").click()
    expect(page.locator("#outcome")).to_contain_text("Set retention.ms = 7200000", timeout=WAIT_MS)
    configs = admin_call(pages_cluster.bootstrap, lambda a: a.describe_configs([TOPIC]))
    assert configs[TOPIC]["retention.ms"].value == "7200000"
    # The form lists the topic's configs, the ones set on it marked.
    page.goto(f"{console}/actions/alter-config?topic={TOPIC}")
    row = page.locator("tr[data-config='retention.ms']")
    expect(row).to_have_class("set", timeout=WAIT_MS)
    expect(row).to_contain_text("7200000")


def test_elect_leaders_and_delete_a_topic_through_the_page(
    console: str, pages_cluster: LocalCluster, page: Any
) -> None:
    bootstrap = pages_cluster.bootstrap
    page.goto(f"{console}/actions/elect-leaders?topic={TOPIC}")
    page.locator("button", has_text="Review").click()
    expect(page.locator("#cli")).to_contain_text(
        f"rillet leader elect --preferred {TOPIC} --bootstrap", timeout=WAIT_MS
    )
    page.locator("#execute").click()
    expect(page.locator("#outcome")).to_contain_text("partition(s)", timeout=WAIT_MS)

    admin_call(bootstrap, lambda a: a.create_topics([NewTopic("to-delete", 1, 3)]))
    page.goto(f"{console}/actions/topic?topic=to-delete")
    page.locator("a", has_text="Delete the topic").click()
    page.locator("button", has_text="Review").click()
    expect(page.locator("#plan.danger")).to_contain_text("cannot be undone", timeout=WAIT_MS)
    expect(page.locator("#cli")).to_contain_text("rillet topic delete to-delete --bootstrap")
    page.locator("#execute").click()
    expect(page.locator("#outcome")).to_contain_text("Deleted topic to-delete", timeout=WAIT_MS)
    wait_until(
        lambda: "to-delete" not in admin_call(bootstrap, lambda a: a.list_topics()),
        timeout=30,
        interval=0.2,
        message="the topic deleted through the page to go",
    )


def test_reset_the_offsets_of_an_empty_group(
    console: str, pages_cluster: LocalCluster, page: Any
) -> None:
    bootstrap = pages_cluster.bootstrap
    commit(bootstrap, "to-reset", {(TOPIC, 0): 4})
    page.goto(f"{console}/actions/reset-offsets?group=to-reset")
    page.locator("input[name=topics]").fill(f"{TOPIC}:0")
    page.locator("select[name=mode]").select_option("to-latest")
    page.locator("button", has_text="Review").click()
    # The dry-run plan first: current 4, new 20 (the log end), and the CLI command.
    plan = page.locator("#plan table.plan tbody tr").first
    expect(plan).to_contain_text("4", timeout=WAIT_MS)
    expect(plan.locator("td").nth(3)).to_have_text("20")
    expect(page.locator("#cli")).to_contain_text(
        f"rillet group reset-offsets to-reset --topic {TOPIC}:0 --to-latest --execute"
    )
    committed = admin_call(bootstrap, lambda a: a.list_group_offsets("to-reset"))
    assert committed[(TOPIC, 0)].offset == 4  # nothing written by the plan
    page.locator("#execute").click()
    expect(page.locator("#outcome")).to_contain_text("Wrote the new offsets", timeout=WAIT_MS)
    committed = admin_call(bootstrap, lambda a: a.list_group_offsets("to-reset"))
    assert committed[(TOPIC, 0)].offset == 20


def test_a_group_with_members_is_shown_and_not_reset(
    console: str, pages_cluster: LocalCluster, page: Any
) -> None:
    member = subprocess.Popen(
        [sys.executable, "-m", "rillet.client.cli", "consume", TOPIC, "--group", "live-group"]
        + ["--from-beginning", "--bootstrap", pages_cluster.bootstrap],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        page.goto(f"{console}/groups/live-group")
        # The page refreshes its tables every few seconds: the member shows once joined.
        expect(page.locator("table.members td.mono").first).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("table.members tbody")).to_contain_text(f"{TOPIC}: 0, 1, 2")
        page.goto(f"{console}/actions/reset-offsets?group=live-group")
        page.locator("select[name=mode]").select_option("to-earliest")
        page.locator("button", has_text="Review").click()
        expect(page.locator("p.error")).to_contain_text("has active members", timeout=WAIT_MS)
    finally:
        member.terminate()
        try:
            member.wait(20)
        except subprocess.TimeoutExpired:
            member.kill()
            member.wait()


def test_a_post_from_another_site_is_refused(console: str, page: Any) -> None:
    response = page.request.post(
        f"{console}/actions/create-topic",
        form={"step": "execute", "topic": "from-elsewhere"},
        headers={"Origin": "https://elsewhere.example"},
    )
    assert response.status == 403


def test_read_only_console_has_no_actions(
    read_only_console: str, pages_cluster: LocalCluster, page: Any
) -> None:
    commit(pages_cluster.bootstrap, "lag-read-only", {(TOPIC, 0): 1})
    page.goto(f"{read_only_console}/messages?topic={TOPIC}")
    expect(page.locator("table.records tbody tr").first).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("details.produce")).to_have_count(0)
    expect(page.locator("header nav a", has_text="Actions")).to_have_count(0)
    page.goto(f"{read_only_console}/groups/lag-read-only")
    expect(page.locator("#total-lag")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("a", has_text=re.compile("Reset offsets"))).to_have_count(0)
    page.goto(f"{read_only_console}/groups-data/by-topic/{TOPIC}")
    expect(page.locator("a", has_text=re.compile("Actions"))).to_have_count(0)
    for path in ("/actions", "/actions/create-topic", "/actions/topic?topic=x"):
        assert page.request.get(read_only_console + path).status == 404
    origin = {"Origin": read_only_console}
    for path in ("/actions/create-topic", "/actions/reset-offsets", "/messages/produce"):
        status = page.request.post(
            read_only_console + path, form={"step": "execute", "topic": "x"}, headers=origin
        ).status
        assert status in (404, 405), path
    names = admin_call(pages_cluster.bootstrap, lambda a: a.list_topics())
    assert "x" not in names
