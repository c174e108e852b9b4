"""The console against one small real cluster, in-process (Starlette's TestClient), for
the cases that patch its byte caps or need odd records: the Host guard on every route,
paging and searching a partition of big records, records no page may choke on, a test
message the CLI cannot express, routes no group id can shadow, and every group's lag
while one partition has no leader (last: it stops a broker)."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import console_cluster
from helpers import wait_until, wait_until_async
from starlette.testclient import TestClient

from rillet.client.admin import Admin, NewTopic
from rillet.client.console import browse
from rillet.client.console.app import create_app
from rillet.client.console.context import ConsoleConfig
from rillet.client.console.group_lag import GroupLagCache
from rillet.client.console.snapshot import SnapshotCache
from rillet.client.sync import SyncAdmin, SyncProducer
from rillet.tools.local_cluster import LocalCluster

BIG, ODD = "big", "odd"
RECORDS, RECORD_BYTES, NEEDLE_AT = 300, 10 * 1024, 250
CAP = 200 * 1024  # about 20 records of BIG: a page of 50 is cut short
YEAR_10000_MS = 253_402_300_800_000
JSON_TOO_DEEP = b"[" * 4000 + b"]" * 4000


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data_dir = Path(tmp_path_factory.mktemp("console-review")) / "cluster"
    with console_cluster(data_dir, controllers=1, brokers=2) as cluster:
        a, b = (n.node_id for n in cluster.brokers())
        with SyncAdmin(cluster.bootstrap) as admin:
            admin.create_topics(
                [
                    NewTopic(BIG, 1, 1),
                    NewTopic(ODD, 1, 1),
                    NewTopic("kept", assignments={0: [a]}),
                    NewTopic("lost", assignments={0: [b]}),
                ]
            )
        with SyncProducer(bootstrap=cluster.bootstrap, acks="all", linger_ms=0) as producer:
            for i in range(RECORDS):
                word = b"needle" if i == NEEDLE_AT else b"hay"
                producer.send(BIG, word + b"." * RECORD_BYTES, f"k{i}".encode())
            producer.send(ODD, b"far future", timestamp=YEAR_10000_MS)
            producer.send(ODD, JSON_TOO_DEEP)
            for topic in ("kept", "lost"):
                for i in range(5):
                    producer.send(topic, b"x%d" % i)
        yield cluster


@pytest.fixture(scope="module")
def client(small_cluster: LocalCluster) -> Iterator[TestClient]:
    app = create_app(ConsoleConfig(bootstrap=small_cluster.bootstrap, refresh_s=1.0))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


def offsets(body: str) -> list[int]:
    return [int(o) for o in re.findall(r'<tr data-offset="(\d+)"', body)]


def href(body: str, cls: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)" class="{cls}"', body)
    return html.unescape(found.group(1)) if found else None


# 1. DNS rebinding: a loopback console answers no other name, on any route.


@pytest.mark.parametrize(
    "path",
    [f"/messages?topic={BIG}", "/groups", "/topics/big", "/events?f=overview-counts", "/"],
)
def test_a_loopback_console_answers_no_other_host_name(client: TestClient, path: str) -> None:
    r = client.get(path, headers={"host": "attacker.example:8080"})
    assert r.status_code == 421
    assert "data-offset" not in r.text


def test_loopback_names_are_served(client: TestClient) -> None:
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080"):
        r = client.get(f"/messages?topic={BIG}&limit=1", headers={"host": host})
        assert r.status_code == 200 and offsets(r.text) == [RECORDS - 1], host


# 2 and 8. Pages cut short by the byte cap, and the links between pages.


def walk(client: TestClient, url: str, cls: str) -> list[list[int]]:
    """The offsets of each page from ``url`` on, following the ``cls`` link."""
    pages: list[list[int]] = []
    next_url: str | None = url
    while next_url is not None:
        assert len(pages) < RECORDS, "the links go round in circles"
        body = client.get(next_url).text
        pages.append(offsets(body))
        next_url = href(body, cls)
    return pages


def test_newest_first_under_the_byte_cap_shows_the_newest(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browse, "PAGE_BYTES", CAP)
    first = client.get(f"/messages?topic={BIG}&from=newest&order=desc").text
    assert "Stopped at the byte cap" in first
    assert offsets(first)[0] == RECORDS - 1 and href(first, "newer") is None
    pages = walk(client, f"/messages?topic={BIG}&from=newest&order=desc", "older")
    # Each page newest first; together every record exactly once, no gap, no repeat.
    assert all(p == sorted(p, reverse=True) for p in pages)
    assert [o for p in pages for o in p] == list(range(RECORDS - 1, -1, -1))


def test_oldest_first_under_the_byte_cap_carries_on_where_it_stopped(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browse, "PAGE_BYTES", CAP)
    pages = walk(client, f"/messages?topic={BIG}&from=oldest&order=asc", "newer")
    assert len(pages) > 1
    assert [o for p in pages for o in p] == list(range(RECORDS))


def test_paging_toward_the_log_end_repeats_nothing(client: TestClient) -> None:
    body = client.get(f"/messages?topic={BIG}&from=offset&offset=60&order=desc").text
    assert offsets(body) == list(range(60, 10, -1))
    newer = href(body, "newer")
    assert newer is not None
    assert offsets(client.get(newer).text) == list(range(110, 60, -1))
    body = client.get(f"/messages?topic={BIG}&from=offset&offset=30&order=asc").text
    older = href(body, "older")
    assert older is not None
    assert offsets(client.get(older).text) == list(range(30))


def test_a_newest_first_search_under_the_byte_cap_says_what_it_read(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browse, "SCAN_BYTES", CAP)
    url: str | None = f"/messages?topic={BIG}&from=newest&order=desc&q=needle"
    expect_first = RECORDS - 1
    for _ in range(RECORDS):
        assert url is not None, "the search stopped before finding the needle"
        body = client.get(url).text
        searched = re.search(r"Searched offsets (\d+)\.\.(\d+): (\d+) match", body)
        assert searched, body
        first, last, found = map(int, searched.groups())
        # Each step reads on from where the last one stopped, downward.
        assert first == expect_first and last <= first
        if found:
            assert offsets(body) == [NEEDLE_AT] and last <= NEEDLE_AT
            return
        assert last > NEEDLE_AT  # said it searched there: it would have found it
        expect_first = last - 1
        url = href(body, "continue")
    pytest.fail("never found the needle")


# 3. Records that a page must show however odd.


@pytest.mark.parametrize("fmt", ["text", "json", "hex"])
def test_odd_records_do_not_break_their_page(client: TestClient, fmt: str) -> None:
    r = client.get(f"/messages?topic={ODD}&from=oldest&order=asc&format={fmt}")
    assert r.status_code == 200 and "Traceback" not in r.text
    assert offsets(r.text) == [0, 1]
    assert 'class="error"' not in r.text
    assert f"{YEAR_10000_MS} ms" in r.text


# 5. A test message whose key the CLI cannot say is sent, and said so, not a 500.


def test_a_key_with_every_separator_is_sent_without_a_cli_line(client: TestClient) -> None:
    same_site = {"origin": "http://127.0.0.1"}
    form = {"topic": ODD, "key": ":|=#~^\t", "value": "v", "partition": "0"}
    r = client.post("/messages/produce", data=form, headers=same_site)
    assert r.status_code == 200 and 'id="sent"' in r.text and 'id="no-cli"' in r.text
    body = client.get(f"/messages?topic={ODD}&from=oldest&order=asc").text
    assert offsets(body) == [0, 1, 2]  # sent once


# 7. Group ids that look like the pages' own data routes still have a page.


@pytest.mark.parametrize("group", ["lag.json", "by-topic/big"])
def test_every_group_id_has_its_page(client: TestClient, group: str) -> None:
    r = client.get(f"/groups/{group}")
    assert r.status_code == 200
    assert f"group {group!r} does not exist" in html.unescape(r.text)


def test_the_groups_data_lives_under_its_own_prefix(client: TestClient) -> None:
    assert client.get("/groups-data/lag.json?group=g").json() == [[], []]
    r = client.get(f"/groups-data/by-topic/{BIG}")
    assert r.status_code == 200 and 'class="topic-groups"' in r.text


# 4. One partition without a leader leaves every other lag known. Stops a broker: last.


def test_a_leaderless_partition_leaves_the_other_lags_known(small_cluster: LocalCluster) -> None:
    brokers = [n.node_id for n in small_cluster.brokers()]
    with SyncAdmin(small_cluster.bootstrap) as admin:
        admin.alter_group_offsets("healthy", {("kept", 0): 1})
        admin.alter_group_offsets("victim", {("lost", 0): 2})
        small_cluster.stop_node(brokers[1], kill=True)
        wait_until(
            lambda: admin.describe_topics(["lost"])[0].partitions[0].leader < 0,
            timeout=60,
            interval=0.2,
            message="lost-0 without a leader",
        )
    asyncio.run(lags_with_one_partition_down(small_cluster.bootstrap))


async def lags_with_one_partition_down(bootstrap: str) -> None:
    async with Admin(bootstrap, timeout_ms=2_000) as admin:
        snapshots = SnapshotCache(admin, 0.5, 60)
        await snapshots.start()
        try:

            def listed() -> Any:
                snap = snapshots.latest
                return snap and {"healthy", "victim"} <= {g.group_id for g in snap.groups}

            await wait_until_async(listed, timeout=60, interval=0.1)
            cache = GroupLagCache(admin, snapshots, 3, 60)
            await cache.refresh()
            healthy, victim = cache.rows["healthy"], cache.rows["victim"]
            assert (healthy.lag, healthy.unknown) == (4, 0)
            assert (victim.lag, victim.unknown, victim.partitions) == (0, 1, 1)
            assert cache.error == ""
            # The group's own page: the lost partition's log end and lag are unknown.
            lag = await admin.group_lag("victim")
            (p,) = lag.partitions
            assert (p.committed_offset, p.log_end_offset, p.lag) == (2, None, None)
        finally:
            await snapshots.stop()
