"""Human output of the CLI on an 80-column terminal: nothing the README shows wraps or
loses digits. Each output is rendered by the function the command uses, on a rich
Console of width 80, and compared line by line with what it should be."""

from __future__ import annotations

import io

from rich.console import Console

from rillet.client.admin import TopicDescription
from rillet.client.cli.common import pack_fields
from rillet.client.cli.topic import print_describe
from rillet.client.metadata import PartitionInfo

WIDTH = 80


def console(width: int = WIDTH) -> Console:
    # A terminal's console: colours and markup on, so the widths are what a user sees.
    return Console(
        file=io.StringIO(), width=width, force_terminal=True, color_system=None, record=True
    )


def lines_of(c: Console) -> list[str]:
    return c.export_text(styles=False).rstrip("\n").split("\n")


def topic(name: str, count: int, *, isr: tuple[int, ...] = (1, 2, 3)) -> dict:
    parts = tuple(
        PartitionInfo(name, i, isr[0] if isr else -1, 7, (1, 2, 3), isr) for i in range(count)
    )
    return TopicDescription(name, parts).as_dict()


def test_topic_describe_fits_80_columns() -> None:
    # The README's topic, healthy, then with one broker out of every ISR.
    for isr in ((1, 2, 3), (1, 3)):
        c = console()
        print_describe([topic("events", 6, isr=isr)], console=c)
        out = lines_of(c)
        # One header line, one table header, one line per partition: nothing wrapped.
        assert len(out) == 2 + 6, out
        under = 0 if len(isr) == 3 else 6
        assert (
            out[0] == f"Topic: events  partitions: 6  RF: 3  under-replicated: {under}  offline: 0"
        )
        assert out[1].split() == ["Partition", "Leader", "Epoch", "Replicas", "Isr"]
        assert out[2].split()[-1] == ("1,2,3" if under == 0 else "under-replicated")
        assert max(len(line) for line in out) <= WIDTH


def test_topic_describe_of_10000_partitions_fits_80_columns() -> None:
    # "wide" from the README with every partition offline and under-replicated: the
    # longest counts and marks there are.
    c = console()
    print_describe([topic("wide", 10_000, isr=())], console=c)
    out = lines_of(c)
    assert len(out) == 2 + 10_000
    assert (
        out[0] == "Topic: wide  partitions: 10000  RF: 3  under-replicated: 10000  offline: 10000"
    )
    assert out[-1].split() == ["9999", "none", "7", "1,2,3", "offline", "under-replicated"]
    assert max(len(line) for line in out) <= WIDTH


def test_topic_describe_header_breaks_only_between_fields() -> None:
    described = topic("t" * 45, 3)  # the header is 78 columns without its last two fields
    c = console()
    print_describe([described], console=c)
    head = lines_of(c)[:2]
    assert head == [
        f"Topic: {described['name']}  partitions: 3  RF: 3",
        "  under-replicated: 0  offline: 0",
    ]


def test_pack_fields_measures_text_not_markup() -> None:
    fields = ["[bold]" + "x" * 30 + "[/bold]", "y" * 30, "z" * 16]
    assert pack_fields(fields, 80).count("\n") == 0  # 30 + 2 + 30 + 2 + 16 = 80
    assert pack_fields(fields, 79).split("\n")[1] == "  " + "z" * 16


def test_cluster_status_and_live_view_fit_80_columns() -> None:
    from rillet.tools.cluster_cli import status_view

    rows = [
        {
            "node_id": i,
            "roles": ["broker"] if i < 100 else ["controller"],
            "address": f"127.0.0.1:{9090 + i}",
            "state": "active controller" if i == 102 else "unfenced",
            "pid": 4_000_000 + i,
        }
        for i in (1, 2, 3, 101, 102, 103)
    ]
    health = {"controller_id": 102, "partitions": 10_010, "under_replicated": 3_337}
    expected = {
        0: ["active controller: 102   partitions: 10010   under-replicated: 3337   offline: 0"],
        10_010: [
            "active controller: 102   partitions: 10010   under-replicated: 3337",
            "  offline: 10010",
        ],
    }
    for offline, health_lines in expected.items():
        c = console()
        c.print(status_view(rows, {**health, "offline": offline}))
        out = lines_of(c)
        assert max(len(line) for line in out) <= WIDTH
        # title, rules, header, rows, health, then the remote tier's line
        assert len(out) == 1 + 3 + 1 + 6 + len(health_lines) + 1, out
        assert out[-len(health_lines) - 1 : -1] == health_lines
        assert out[-1] == "remote tier: off"
    embedded = {
        "endpoint": "http://127.0.0.1:9080",
        "bucket": "rillet-tier",
        "region": "us-east-1",
        "embedded": True,
        "state": "running",
        "pid": 4_000_200,
    }
    external = {**embedded, "endpoint": "https://s3.eu-west-1.amazonaws.com"}
    external.update(embedded=False, state="external", pid=None)
    for s3, tier_lines in {
        "embedded": [
            "remote tier: embedded S3 http://127.0.0.1:9080   bucket: rillet-tier",
            "  running (pid 4000200)",
        ],
        "external": ["remote tier: S3 https://s3.eu-west-1.amazonaws.com   bucket: rillet-tier"],
    }.items():
        c = console()
        c.print(
            status_view(rows, {**health, "offline": 0}, embedded if s3 == "embedded" else external)
        )
        out = lines_of(c)
        assert max(len(line) for line in out) <= WIDTH
        assert out[-len(tier_lines) :] == tier_lines


def test_spark_load_summary_fits_80_columns() -> None:
    from rillet.client.cli.spark import print_load
    from rillet.client.spark.jobs import LoadResult

    per_task = [
        {
            "task": i,
            "records": 250_000_000,
            "bytes": 25_000_000_000,
            "seconds": 1234.5,
            "records_per_s": 202_511,
            "mb_per_s": 19.31,
        }
        for i in range(4)
    ]
    r = LoadResult("load", 10**9, 4, 100, "all", "committed", 1300.2, 1250.0, per_task)
    c = console()
    print_load(r, console=c)
    out = lines_of(c)
    assert max(len(line) for line in out) <= WIDTH
    assert out[-2:] == [
        "Spark job: 1300.2 s in all, scheduling and worker start included",
        "Every record acknowledged: yes",
    ]


def _segment(tmp_path):  # noqa: ANN001, ANN202 - a FileReport
    from rillet.client.wire import records
    from rillet.storage import Log, LogConfig
    from rillet.storage.dump import scan_file

    log = Log.open(tmp_path / "events-0", LogConfig())
    for i in range(3):
        log.append(records.encode_batch([b"v%d" % i] * 1000, timestamp_ms=1795527536524), 7)
    log.close()
    (segment,) = (tmp_path / "events-0").glob("*.log")
    return scan_file(segment, with_records=True)


def test_log_dump_fits_80_columns_by_hiding_columns_it_names(tmp_path) -> None:  # noqa: ANN001
    from rillet.storage.cli import print_report

    report = _segment(tmp_path)
    c = console()
    print_report(report, False, c)
    out = lines_of(c)
    assert max(len(line) for line in out) <= WIDTH
    at = next(i for i, line in enumerate(out) if line.startswith("position"))  # after the path
    assert " ".join(out[at].split()) == "position offset last epoch count bytes fmt max_ts valid"
    size = report.rows[0]["size"]
    assert out[at + 2].split() == f"0 0 999 7 1000 {size} v2 1795527536524 True".split()
    assert out[-1] == "not shown at this width: base_timestamp, crc, compression (--json has them)"

    wide = console(200)  # every column, no note
    print_report(report, False, wide)
    (heading,) = [line for line in lines_of(wide) if line.startswith("position")]
    assert heading.split()[6:] == ["fmt", "first_ts", "max_ts", "codec", "crc", "valid"]
    assert "not shown" not in lines_of(wide)[-1]


def test_log_dump_records_are_lines_under_their_batch(tmp_path) -> None:  # noqa: ANN001
    from rillet.storage.cli import print_report

    report = _segment(tmp_path)
    c = console()
    print_report(report, True, c)
    out = c.file.getvalue().splitlines()
    assert len(out) == 1 + 3 * (1 + 1000)  # the file, then each batch and its records
    assert out[1].startswith("position: 0  offset: 0  last: 999  epoch: 7  count: 1000")
    assert out[2] == "| offset: 0  timestamp: 1795527536524  key: None  value: v0  headers: None"
    assert out[1002].startswith(f"position: {report.rows[1]['position']}  offset: 1000")


def test_leader_elect_summary_of_10000_partitions_is_a_few_short_lines() -> None:
    from rillet.client.cli.leader import print_summary

    summary = {
        "elected": ["wide-1", "wide-4"],
        "not_needed": [f"wide-{i}" for i in range(10_000) if i not in (1, 4)],
        "failed": [],
    }
    c = console()
    print_summary(summary, console=c)
    out = lines_of(c)
    assert max(len(line) for line in out) <= WIDTH
    text = " ".join(" ".join(out).split())  # the lines rejoined, as one would read them
    assert text.startswith("Preferred leader elected for 2 partition(s): wide-1, wide-4 ")
    assert "already leads 9,998 partition(s): wide-0, wide-2, wide-3, wide-5," in text
    assert text.endswith("wide-11 and 9,988 more (--json lists them)")
    assert len(out) <= 4


def test_log_verify_summary_fits_80_columns(tmp_path) -> None:  # noqa: ANN001
    from rillet.storage.cli import print_verify_summary

    report = _segment(tmp_path)
    report.batches, report.records, report.bytes = 26_843, 170_000_096, 1_073_741_824
    c = console()
    print_verify_summary([report] * 12, [], c)
    out = lines_of(c)
    assert max(len(line) for line in out) <= WIDTH
    assert " ".join(" ".join(out).split()) == (
        "OK: 12 segment file(s), 322116 valid batch(es), 2040001152 record(s), "
        "12884901888 bytes checked"
    )


def test_a_tiered_topic_describe_adds_a_tier_table_within_80_columns() -> None:
    described = topic("events", 3)
    for p in described["partitions"]:
        p.update(
            local_log_start_offset=12_345_678_901,
            remote_log_start_offset=0 if p["partition"] else -1,
            remote_size_bytes=987 * 1024**3,
            copy_lag_segments=1234,
            copy_lag_bytes=5 * 1024**3 + 1,
            remote_storage=True,
        )
    described["partitions"][2]["local_log_start_offset"] = None  # its leader did not answer
    c = console()
    print_describe([described], console=c)
    lines = lines_of(c)
    assert all(len(line) <= WIDTH for line in lines)
    tier = lines[lines.index(next(x for x in lines if x.startswith("Partition  LocalStart"))) :]
    assert tier == [
        "Partition  LocalStart   RemoteStart  RemoteSize  CopyLag",
        "0          12345678901  -            987.0 GiB   1234 (5.0 GiB)",
        "1          12345678901  0            987.0 GiB   1234 (5.0 GiB)",
        "2          ?            0            ?           ?",
    ]
    # A topic that does not tier gets no such table.
    c = console()
    print_describe([topic("plain", 2)], console=c)
    assert not any("RemoteStart" in line for line in lines_of(c))
