"""The console's Messages, groups and actions logic without a cluster: which offsets a
page covers, how values are shown and searched, how group rows are summed, and the
CLI commands the pages print (each parsed back by the real CLI parser)."""

from __future__ import annotations

import argparse
import json
import shlex
from types import SimpleNamespace

import pytest
from starlette.datastructures import FormData
from starlette.requests import Request

from rillet.client.admin import GroupDescription, GroupListing, GroupMember
from rillet.client.cli import build_parser
from rillet.client.cli.group import parse_datetime
from rillet.client.console import browse
from rillet.client.console.context import ConsoleConfig
from rillet.client.console.forms import paginate, same_origin
from rillet.client.console.group_lag import GroupRow, TopicLag, summarize
from rillet.client.console.live import MAX_FRAGMENTS, Fragments
from rillet.client.console.pages.actions import reset_command
from rillet.client.console.pages.groups import list_rows
from rillet.client.console.pages.messages import (
    KEY_SEPARATORS,
    iso,
    parse_headers,
    produce_command,
)
from rillet.client.console.snapshot import ClusterSnapshot
from rillet.client.consumer import ConsumerRecord

W = browse.Window


def test_windows_clamp_into_the_log() -> None:
    # Oldest first from an anchor; newest first up to and including it.
    assert browse.window(browse.ASC, 10, 0, 100, 5) == W(10, 15)
    assert browse.window(browse.DESC, 10, 0, 100, 5) == W(6, 11)
    assert browse.window(browse.ASC, 98, 0, 100, 5) == W(98, 100)
    assert browse.window(browse.DESC, 2, 0, 100, 5) == W(0, 3)
    assert browse.window(browse.DESC, 500, 0, 100, 5) == W(95, 100)
    assert browse.window(browse.ASC, 0, 40, 100, 5) == W(40, 45)  # before the log start
    assert browse.window(browse.ASC, 0, 0, 0, 5).empty
    assert browse.window(browse.DESC, 7, 10, 10, 5).empty


def test_newest_and_oldest_anchors_and_paging() -> None:
    start, end, n = 0, 100, 10
    newest_desc = browse.window(
        browse.DESC, browse.anchor_for("newest", "desc", start, end, n), start, end, n
    )
    assert newest_desc == W(90, 100)
    newest_asc = browse.window(
        browse.ASC, browse.anchor_for("newest", "asc", start, end, n), start, end, n
    )
    assert newest_asc == W(90, 100)
    oldest_desc = browse.window(
        browse.DESC, browse.anchor_for("oldest", "desc", start, end, n), start, end, n
    )
    assert oldest_desc == W(0, 10)
    # The older page of newest-first ends just before this one; the newer one after it.
    older = _page(browse.DESC, browse.older_page(newest_desc))
    assert older == W(80, 90)
    assert _page(browse.DESC, browse.newer_page(older)) == W(90, 100)
    asc = W(20, 30)
    assert _page(browse.ASC, browse.newer_page(asc)) == W(30, 40)
    assert _page(browse.ASC, browse.older_page(asc)) == W(10, 20)


def _page(order: str, link: tuple[int, str]) -> browse.Window:
    """The window a page link (anchor, side) opens in a log of 0..99, 10 a page."""
    anchor, side = link
    return browse.window(order, anchor, 0, 100, 10, side)


def test_paging_toward_a_log_end_repeats_nothing() -> None:
    start, end, n = 0, 100, 50
    # Newest first from 60 shows 11..60; the newer page starts at 61, short of a page.
    w = browse.window(browse.DESC, 60, start, end, n)
    assert w == W(11, 61)
    anchor, side = browse.newer_page(w)
    assert browse.window(browse.DESC, anchor, start, end, n, side) == W(61, 100)
    # Oldest first from 30 shows 30..79; the older page is 0..29.
    w = browse.window(browse.ASC, 30, start, end, n)
    assert w == W(30, 80)
    anchor, side = browse.older_page(w)
    assert browse.window(browse.ASC, anchor, start, end, n, side) == W(0, 30)


def test_a_search_scans_a_bounded_stretch_in_the_order_shown() -> None:
    chunks = list(browse.scan_chunks(browse.DESC, 99_999, 0, 100_000, 1_000))
    assert chunks[0] == W(99_000, 100_000)
    assert chunks[1] == W(98_000, 99_000)
    assert sum(w.hi - w.lo for w in chunks) == browse.SCAN_OFFSETS
    asc = list(browse.scan_chunks(browse.ASC, 0, 0, 2_500, 1_000))
    assert asc == [W(0, 1_000), W(1_000, 2_000), W(2_000, 2_500)]


def test_values_show_as_text_pretty_json_or_hex() -> None:
    assert browse.show(b'{"a":1}', browse.JSON) == ('{\n  "a": 1\n}', 0)
    assert browse.show(b"not json", browse.JSON) == ("not json", 0)
    assert browse.show(b"\x00\xff", browse.HEX) == ("00 ff", 0)
    assert browse.show(None, browse.TEXT) == ("", 0)
    # Nested past the JSON parser's depth: shown as the text it is.
    deep = b"[" * 4000 + b"]" * 4000
    assert browse.show(deep, browse.JSON) == (deep.decode(), 0)
    big = b"x" * (browse.SHOWN_BYTES + 10)
    shown, hidden = browse.show(big, browse.TEXT)
    assert len(shown) == browse.SHOWN_BYTES and hidden == 10


def test_search_matches_keys_and_values_ignoring_case() -> None:
    r = ConsumerRecord("t", 0, 5, 0, b"Order-17", b'{"state":"Paid"}', None)
    assert browse.matches(r, "order-1")
    assert browse.matches(r, "paid")
    assert not browse.matches(r, "refund")
    assert not browse.matches(ConsumerRecord("t", 0, 6, 0, None, None, None), "x")


def _member(topics: tuple[str, ...]) -> GroupMember:
    return GroupMember("m1", None, None, "c", "/127.0.0.1", 3, topics, {}, {})


def test_group_rows_sum_lag_of_commits_and_subscriptions() -> None:
    listings = [
        GroupListing("busy", "Stable", "consumer", "consumer", 1),
        GroupListing("idle", "Empty", "consumer", "consumer", 2),
        GroupListing("gone", "Dead", "consumer", "consumer", 2),
    ]
    described = {
        "busy": GroupDescription("busy", "Stable", 3, 3, "uniform", 1, (_member(("a",)),)),
        "idle": GroupDescription("idle", "Empty", 1, 1, "uniform", 2),
    }
    committed = {"busy": {("a", 0): 5}, "idle": {("a", 0): 12, ("b", 0): 3}}
    ends = {("a", 0): 10, ("a", 1): 4, ("b", 0): 3}
    rows = summarize(listings, described, committed, ends, {"a": 2, "b": 1})
    busy, idle, gone = rows["busy"], rows["idle"], rows["gone"]
    # a-1 is subscribed but never committed: counted as a partition, not as lag.
    assert (busy.members, busy.partitions, busy.lag) == (1, 2, 5)
    # A commit past the log end (a-0 at 12 of 10) counts as no lag.
    assert (idle.members, idle.partitions, idle.lag) == (0, 2, 0)
    assert idle.topics["b"].partitions == 1
    assert (gone.members, gone.partitions, gone.lag, gone.state) == (None, 0, 0, "Dead")


def test_paging_clamps_the_page() -> None:
    p = paginate(list(range(120)), 9, size=50)
    assert (p.page, p.pages, p.total, p.items[0]) == (3, 3, 120, 100)
    assert paginate([], 1).pages == 1


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "headers": raw})


def test_posts_only_from_the_consoles_own_pages() -> None:
    assert same_origin(_request({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}))
    assert same_origin(
        _request({"host": "127.0.0.1:8080", "referer": "http://127.0.0.1:8080/actions/x"})
    )
    assert not same_origin(_request({"host": "127.0.0.1:8080", "origin": "https://evil.test"}))
    assert not same_origin(_request({"host": "127.0.0.1:8080"}))


def test_a_loopback_console_takes_posts_only_under_a_loopback_name() -> None:
    # DNS rebinding: a site's own name made to resolve to 127.0.0.1 sends matching Host
    # and Origin, but names no loopback host.
    rebound = {"host": "evil.test:8080", "origin": "http://evil.test:8080"}
    assert not same_origin(_request(rebound), loopback_names=True)
    assert same_origin(_request(rebound), loopback_names=False)  # bound wide: any name
    local = {"host": "localhost:8080", "origin": "http://localhost:8080"}
    assert same_origin(_request(local), loopback_names=True)
    v6 = {"host": "[::1]:8080", "origin": "http://[::1]:8080"}
    assert same_origin(_request(v6), loopback_names=True)


def test_which_consoles_answer_only_loopback_names() -> None:
    assert ConsoleConfig(host="127.0.0.1").loopback_names
    assert ConsoleConfig(host="::1").loopback_names
    assert not ConsoleConfig(host="0.0.0.0").loopback_names
    # In a container: bound to every address there, published on the host's loopback.
    assert ConsoleConfig(host="0.0.0.0", loopback_names_only=True).loopback_names


def _cli_args(line: str) -> argparse.Namespace:
    words = shlex.split(line)
    assert words[0] == "rillet"
    return build_parser().parse_args(words[1:])


def test_the_produce_command_sends_the_same_record() -> None:
    line = produce_command("127.0.0.1:9092", "orders", "a:b", 'it\'s {"x": 1}', 2)
    stdin, cli = line.split(" | ")
    record = shlex.split(stdin)[2]
    args = _cli_args(cli)
    assert (args.topic, args.partition, args.acks) == ("orders", 2, "all")
    key, _, value = record.partition(args.key_separator)
    assert (key, value) == ("a:b", 'it\'s {"x": 1}')
    assert (
        _cli_args(produce_command("b:1", "t", "", "v", None).split(" | ")[1]).key_separator is None
    )


def test_reset_commands_parse_as_the_cli_would() -> None:
    form = FormData({"group": "g", "topics": "t:0,1 u", "mode": "shift-by", "value": "-5"})
    args = _cli_args(reset_command("b:1", form))
    assert (args.group, args.shift_by, args.execute) == ("g", -5, True)
    assert args.topic == [("t", (0, 1)), ("u", None)]
    args = _cli_args(reset_command("b:1", FormData({"group": "g", "mode": "to-earliest"})))
    assert args.all_topics and args.to_earliest
    when = FormData({"group": "g", "mode": "to-datetime", "value": "2026-01-31T12:00:00Z"})
    assert _cli_args(reset_command("b:1", when)).to_datetime == 1_769_860_800_000


def test_headers_are_name_value_lines() -> None:
    assert parse_headers("a=1\n\nb = x=y\n") == [("a", b"1"), ("b", b" x=y")]
    with pytest.raises(ValueError):
        parse_headers("no separator")
    assert json.dumps(parse_headers("")) == "[]"


def test_a_key_holding_every_separator_has_no_cli_line() -> None:
    assert produce_command("b:1", "t", KEY_SEPARATORS, "v", None) is None


def test_times_past_what_a_datetime_holds_show_as_numbers() -> None:
    assert iso(253_402_300_800_000) == "253402300800000 ms"  # year 10000
    assert iso(0) == "1970-01-01T00:00:00.000+00:00"
    assert iso(-1) == "-"


def test_times_before_1970_are_refused() -> None:
    # -1 and -2 mean latest and earliest to ListOffsets: no time may become them.
    with pytest.raises(argparse.ArgumentTypeError, match="1970 or later"):
        parse_datetime("1969-12-31T23:59:59.999Z")
    with pytest.raises(argparse.ArgumentTypeError, match="ISO-8601|1970 or later"):
        parse_datetime("0001-01-01T00:00:00")  # local time: may not even convert
    assert parse_datetime("1970-01-01T00:00:00Z") == 0
    form = FormData({"group": "g", "mode": "to-datetime", "value": "1960-01-01T00:00:00Z"})
    with pytest.raises(ValueError, match="1970 or later"):
        reset_command("b:1", form)


def test_the_reset_offsets_cli_refuses_times_before_1970(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        _cli_args("rillet group reset-offsets g --all-topics --to-datetime 1969-01-01T00:00:00Z")
    assert "1970 or later" in capsys.readouterr().err


def test_a_stream_names_each_fragment_once_and_only_so_many() -> None:
    fragments = Fragments()
    fragments.add("a", lambda snap: "A")
    fragments.add("b", lambda snap: "B")
    assert fragments.wanted("a,b,a,,a") == ["a", "b"]
    assert fragments.wanted(",".join(["a"] * 3000)) == ["a"]
    for bad in ("", "a,nope", ",".join(f"x{i}" for i in range(MAX_FRAGMENTS + 1))):
        with pytest.raises(ValueError):
            fragments.wanted(bad)


def test_a_fragment_renders_once_per_snapshot_for_every_stream() -> None:
    calls: list[object] = []
    fragments = Fragments()
    fragments.add("a", lambda snap: calls.append(snap) or f"<p>{len(calls)}</p>")
    first, second = _snapshot(), _snapshot()
    # Three streams showing the same fragment, two refreshes.
    assert {fragments.render("a", first) for _ in range(3)} == {"<p>1</p>"}
    assert {fragments.render("a", second) for _ in range(3)} == {"<p>2</p>"}
    assert calls == [first, second]


def test_unknown_log_ends_are_counted_not_guessed() -> None:
    listings = [GroupListing("g", "Empty", "consumer", "consumer", 1)]
    committed = {"g": {("a", 0): 5, ("b", 0): 1}}
    rows = summarize(listings, {}, committed, {("a", 0): 10}, {"a": 1, "b": 1})
    g = rows["g"]
    assert (g.partitions, g.lag, g.unknown) == (2, 5, 1)
    assert g.topics["b"] == TopicLag(1, 0, 1)


def test_the_group_list_follows_the_latest_listing() -> None:
    listing = [GroupListing(g, "Empty", "consumer", "consumer", 1) for g in ("new", "old")]
    cache = SimpleNamespace(rows={"old": GroupRow("old", "Empty", 1, 0, 1, 7)})
    cache.rows["deleted"] = GroupRow("deleted", "Empty", 1, 0, 1, 3)
    ctx = SimpleNamespace(snapshots=SimpleNamespace(latest=_snapshot(tuple(listing))))
    rows = {r.group_id: r for r in list_rows(cache, ctx)}  # type: ignore[arg-type]
    assert set(rows) == {"new", "old"}
    assert rows["old"].lag == 7 and not rows["new"].computed


def _snapshot(groups: tuple[GroupListing, ...] = ()) -> ClusterSnapshot:
    return ClusterSnapshot(0.0, None, (), groups)  # type: ignore[arg-type]
