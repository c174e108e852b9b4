"""`rillet group`: argument rules and offset resolution (pure), then the commands run
in-process against fake brokers with the group APIs (tests/fake_groups.py). The same
commands as subprocesses against a real cluster are in test_group_admin_cluster.py."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fake_groups import ThreadedCluster, member, threaded_cluster

from rillet.client.cli import build_parser, main
from rillet.client.cli.common import CliError
from rillet.client.cli.group import (
    CURRENT,
    DATETIME,
    EARLIEST,
    LATEST,
    OFFSET,
    SHIFT,
    ResetMode,
    clamp,
    expand_topics,
    format_table,
    parse_datetime,
    parse_topic,
    plan_reset,
    requested_offset,
    reset_mode,
)

# --- arguments ----------------------------------------------------------------------


def test_topic_argument_syntax() -> None:
    assert parse_topic("t") == ("t", None)
    assert parse_topic("t:2,0,2") == ("t", (0, 2))
    assert parse_topic("a.b-c:7") == ("a.b-c", (7,))
    for bad in (":1", "t:", "t:x", "t:1,,2", "t:-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_topic(bad)


def test_datetime_argument() -> None:
    assert parse_datetime("2026-01-31T12:00:00Z") == 1_769_860_800_000
    assert parse_datetime("2026-01-31T13:00:00.250+01:00") == 1_769_860_800_250
    local = datetime(2026, 1, 31, 12, 0).astimezone()  # no zone: local time, as Kafka
    assert parse_datetime("2026-01-31T12:00:00") == int(local.timestamp() * 1000)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_datetime("yesterday")


def reset_args(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(["group", "reset-offsets", "g", *args])


def test_reset_needs_exactly_one_mode_and_one_partition_choice() -> None:
    for args in (
        ["--topic", "t"],  # no mode
        ["--topic", "t", "--to-earliest", "--to-latest"],  # two modes
        ["--topic", "t", "--to-offset", "3", "--shift-by", "1"],
        ["--to-earliest"],  # neither --topic nor --all-topics
        ["--topic", "t", "--all-topics", "--to-earliest"],
        ["--topic", "t:x", "--to-earliest"],
        ["--topic", "t", "--to-earliest", "--execute", "--dry-run"],
        ["--topic", "t", "--to-datetime", "soon"],
    ):
        with pytest.raises(SystemExit) as exited:
            reset_args(*args)
        assert exited.value.code == 2, args


def test_each_mode_option_gives_its_mode() -> None:
    cases = {
        ("--to-earliest",): ResetMode(EARLIEST),
        ("--to-latest",): ResetMode(LATEST),
        ("--to-offset", "42"): ResetMode(OFFSET, 42),
        ("--shift-by", "-5"): ResetMode(SHIFT, -5),
        ("--to-current",): ResetMode(CURRENT),
        ("--to-datetime", "1970-01-01T00:00:01Z"): ResetMode(DATETIME, 1000),
    }
    for args, mode in cases.items():
        parsed = reset_args("--topic", "t:0", "--topic", "u", *args)
        assert reset_mode(parsed) == mode
        assert parsed.topic == [("t", (0,)), ("u", None)] and not parsed.execute


# --- offset resolution --------------------------------------------------------------

START, END = 10, 50


def resolve(mode: ResetMode, current: int | None = 30, at_time: int | None = None) -> int:
    wanted = requested_offset(mode, current=current, start=START, end=END, at_time=at_time)
    return clamp(wanted, START, END)


def test_earliest_and_latest_are_the_log_ends() -> None:
    assert resolve(ResetMode(EARLIEST)) == START
    assert resolve(ResetMode(LATEST)) == END
    assert resolve(ResetMode(EARLIEST), current=None) == START


def test_to_offset_is_clamped_into_the_log() -> None:
    assert resolve(ResetMode(OFFSET, 25)) == 25
    assert resolve(ResetMode(OFFSET, 3)) == START
    assert resolve(ResetMode(OFFSET, 99)) == END
    assert resolve(ResetMode(OFFSET, END)) == END


def test_shift_by_moves_from_the_commit_and_stops_at_the_ends() -> None:
    assert resolve(ResetMode(SHIFT, 5)) == 35
    assert resolve(ResetMode(SHIFT, -5)) == 25
    assert resolve(ResetMode(SHIFT, 1000)) == END
    assert resolve(ResetMode(SHIFT, -1000)) == START
    with pytest.raises(CliError, match="committed offset"):
        resolve(ResetMode(SHIFT, 1), current=None)


def test_to_current_keeps_the_commit_inside_the_log() -> None:
    assert resolve(ResetMode(CURRENT)) == 30
    assert resolve(ResetMode(CURRENT), current=2) == START  # retention passed the commit
    assert resolve(ResetMode(CURRENT), current=None) == END  # no commit: the log end, as Kafka


def test_to_datetime_uses_the_offset_found_else_the_log_end() -> None:
    assert resolve(ResetMode(DATETIME, 123), at_time=17) == 17
    assert resolve(ResetMode(DATETIME, 123), at_time=-1) == END  # a time past the end
    assert resolve(ResetMode(DATETIME, 123), at_time=None) == END


def test_plan_marks_clamped_partitions_and_refuses_a_shift_without_commit() -> None:
    parts = [("t", 1), ("t", 0), ("t", 0)]
    starts = {("t", 0): 0, ("t", 1): 5}
    ends = {("t", 0): 8, ("t", 1): 9}
    rows = plan_reset(
        ResetMode(SHIFT, -3), parts, committed={("t", 0): 6, ("t", 1): 6}, starts=starts, ends=ends
    )
    assert [(r.partition, r.current_offset, r.new_offset) for r in rows] == [(0, 6, 3), (1, 6, 5)]
    assert [r.as_dict()["clamped"] for r in rows] == [False, True]
    assert rows[1].as_dict() == {
        "topic": "t",
        "partition": 1,
        "current_offset": 6,
        "new_offset": 5,
        "log_start_offset": 5,
        "log_end_offset": 9,
        "clamped": True,
    }
    with pytest.raises(CliError, match="cannot shift t-1"):
        plan_reset(ResetMode(SHIFT, 1), parts, committed={("t", 0): 1}, starts=starts, ends=ends)


def test_topic_specs_expand_to_partitions() -> None:
    counts = {"t": 3, "u": 1}
    assert expand_topics([("t", None), ("u", (0,)), ("t", (1,))], counts) == [
        ("t", 0),
        ("t", 1),
        ("t", 2),
        ("u", 0),
    ]
    with pytest.raises(CliError, match="topic 'u' has no partition 4 \\(it has 1\\)"):
        expand_topics([("u", (0, 4))], counts)


def test_table_shows_missing_values_as_dashes() -> None:
    assert format_table(("A", "LONGER"), [(1, None), ("xyz", 2), ("", 0)]).splitlines() == [
        "A    LONGER",
        "1    -",
        "xyz  2",
        "-    0",
    ]


# --- the commands against fake brokers ----------------------------------------------


@pytest.fixture
def fake() -> Iterator[ThreadedCluster]:
    yield from threaded_cluster()


def rillet(
    fake: ThreadedCluster, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    code = main([*args, "--bootstrap", fake.cluster.bootstrap])
    out = capsys.readouterr()
    return code, out.out, out.err


def setup_topic(fake: ThreadedCluster, ends: tuple[int, ...]) -> None:
    def make(c) -> None:  # noqa: ANN001
        c.create("t", len(ends))
        for p, end in enumerate(ends):
            c.topics["t"][p].end_offset = end

    fake.call(make)


def offsets(fake: ThreadedCluster, group: str) -> dict[tuple[str, int], int]:
    return fake.call(lambda c: dict(c.groups[group].offsets) if group in c.groups else {})


def test_reset_dry_run_writes_nothing_and_execute_writes(
    fake: ThreadedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_topic(fake, (10, 20))
    fake.call(lambda c: c.group("g").offsets.update({("t", 0): 4, ("t", 1): 5}))
    code, out, _ = rillet(
        fake, capsys, "group", "reset-offsets", "g", "--topic", "t", "--to-latest"
    )
    assert code == 0
    assert out.splitlines()[0].split() == [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "NEW-OFFSET",
    ]
    assert out.splitlines()[1].split() == ["g", "t", "0", "4", "10"]
    assert "Dry run" in out
    assert offsets(fake, "g") == {("t", 0): 4, ("t", 1): 5}

    code, out, err = rillet(
        fake,
        capsys,
        "group",
        "reset-offsets",
        "g",
        "--topic",
        "t:1",
        "--shift-by",
        "100",
        "--execute",
        "--json",
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["executed"] is True and doc["mode"] == "shift-by"
    assert [(p["partition"], p["new_offset"], p["clamped"]) for p in doc["partitions"]] == [
        (1, 20, True)
    ]
    assert offsets(fake, "g") == {("t", 0): 4, ("t", 1): 20}


def test_reset_is_refused_while_the_group_has_members(
    fake: ThreadedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_topic(fake, (10,))
    fake.call(lambda c: setattr(c.group("g"), "members", [member("m1", {"t": [0]})]))
    for extra in ([], ["--execute"]):
        code, out, err = rillet(
            fake, capsys, "group", "reset-offsets", "g", "--all-topics", "--to-earliest", *extra
        )
        assert code == 1 and out == ""
        assert (
            err.strip()
            == "error: group 'g' has active members; stop them first (1 member(s), state Stable)"
        )
    assert offsets(fake, "g") == {}


def test_reset_of_a_new_group_and_unknown_topics(
    fake: ThreadedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_topic(fake, (10, 20))
    # A group that does not exist yet: its offsets may be set before its consumers start.
    code, _, _ = rillet(
        fake,
        capsys,
        "group",
        "reset-offsets",
        "new",
        "--topic",
        "t",
        "--to-offset",
        "15",
        "--execute",
    )
    assert code == 0 and offsets(fake, "new") == {("t", 0): 10, ("t", 1): 15}
    code, _, err = rillet(
        fake, capsys, "group", "reset-offsets", "new", "--topic", "nope", "--to-earliest"
    )
    assert code == 1 and err.startswith("error:") and "'nope' does not exist" in err
    code, _, err = rillet(
        fake, capsys, "group", "reset-offsets", "new", "--topic", "t:7", "--to-earliest"
    )
    assert code == 1 and "topic 't' has no partition 7 (it has 2)" in err
    code, _, err = rillet(
        fake, capsys, "group", "reset-offsets", "empty", "--all-topics", "--to-earliest"
    )
    assert code == 1 and "no committed offsets" in err


def test_describe_list_and_delete(
    fake: ThreadedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_topic(fake, (10, 20))

    def groups(c) -> None:  # noqa: ANN001
        c.group("busy").members = [member("m1", {"t": [0, 1]}, client_id="c1")]
        c.group("busy").offsets.update({("t", 0): 7})
        c.group("idle").offsets.update({("t", 1): 20})

    fake.call(groups)
    code, out, _ = rillet(fake, capsys, "group", "describe", "busy")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split() == ["busy", "t", "0", "7", "10", "3", "m1", "/127.0.0.1", "c1"]
    assert lines[2].split() == ["busy", "t", "1", "-", "20", "-", "m1", "/127.0.0.1", "c1"]
    assert "MEMBER-ID" in out and "Stable" in out

    code, out, _ = rillet(fake, capsys, "group", "describe", "busy", "idle", "--json")
    docs = json.loads(out)["groups"]
    assert [(d["group_id"], d["state"], d["total_lag"]) for d in docs] == [
        ("busy", "Stable", 3),
        ("idle", "Empty", 0),
    ]
    code, out, _ = rillet(fake, capsys, "group", "describe", "idle", "--members")
    assert out.strip() == "Consumer group 'idle' has no active members."
    code, out, _ = rillet(fake, capsys, "group", "describe", "busy", "--state", "--json")
    (state,) = json.loads(out)["groups"]
    assert state["state"] == "Stable" and len(state["members"]) == 1 and "partitions" not in state

    code, out, _ = rillet(fake, capsys, "group", "list", "--json")
    assert [g["group_id"] for g in json.loads(out)["groups"]] == ["busy", "idle"]
    code, out, _ = rillet(fake, capsys, "group", "list", "--state", "empty")
    assert out.splitlines()[1].split()[:2] == ["idle", "Empty"] and len(out.splitlines()) == 2

    code, out, err = rillet(fake, capsys, "group", "delete", "busy", "idle")
    assert code == 1
    assert out.strip() == "Deleted group idle."
    assert err.strip() == (
        "error: NON_EMPTY_GROUP: group 'busy' has active members; stop them first"
    )
    code, out, err = rillet(fake, capsys, "group", "describe", "idle", "busy")
    assert code == 1 and "group 'idle' does not exist" in err and "busy" in out
    assert "Traceback" not in err


def test_delete_offsets(fake: ThreadedCluster, capsys: pytest.CaptureFixture[str]) -> None:
    setup_topic(fake, (10, 20))

    def group(c) -> None:  # noqa: ANN001
        c.create("old", 1)
        c.group("g").offsets.update({("t", 0): 1, ("old", 0): 2})
        c.group("g").members = [member("m1", {"t": [0, 1]})]

    fake.call(group)
    code, out, _ = rillet(fake, capsys, "group", "delete-offsets", "g", "--topic", "old", "--json")
    assert code == 0 and json.loads(out) == {
        "group": "g",
        "deleted": [{"topic": "old", "partition": 0}],
    }
    code, _, err = rillet(fake, capsys, "group", "delete-offsets", "g", "--topic", "t:0")
    assert code == 1 and "subscribed to topic 't'" in err
    assert offsets(fake, "g") == {("t", 0): 1}


def test_to_datetime_reads_offsets_by_time(
    fake: ThreadedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_topic(fake, (10,))
    when = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    code, out, _ = rillet(
        fake,
        capsys,
        "group",
        "reset-offsets",
        "g",
        "--topic",
        "t",
        "--to-datetime",
        when,
        "--json",
    )
    # The fake answers any time lookup with the log end.
    assert code == 0 and json.loads(out)["partitions"][0]["new_offset"] == 10


def test_an_unreachable_cluster_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (
        ["list"],
        ["describe", "g"],
        ["reset-offsets", "g", "--all-topics", "--to-earliest"],
        ["delete", "g"],
    ):
        assert main(["group", *args, "--bootstrap", "127.0.0.1:1"]) == 1, args
        err = capsys.readouterr().err
        assert err.startswith("error: NETWORK_EXCEPTION") and err.count("\n") == 1, err
