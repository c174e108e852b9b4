"""The Spark data source's option parsing and range planning, and the load record format.

Pure functions: no SparkSession, no Java, no cluster (pyspark must import, though,
since the planning lives next to the data source classes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="needs the spark extra: pip install 'rillet[spark]'")
pytest.importorskip("pyarrow", reason="needs the spark extra: pip install 'rillet[spark]'")

from rillet.client.cli.spark import format_report, spark_error_cause  # noqa: E402
from rillet.client.spark import jobs  # noqa: E402
from rillet.client.spark.jobs import (  # noqa: E402
    LoadShapeError,
    VerifyReport,
    _manifest,
    acked_counts,
    load_shape,
    make_value,
    make_values,
    parse_conf,
    parse_value,
    task_records,
)
from rillet.client.spark.source import (  # noqa: E402
    OffsetRange,
    SourceOptions,
    parse_offsets,
    parse_stream_offset,
    plan_ranges,
    resolve,
    stream_offset,
    to_arrow,
)
from rillet.client.spark.streaming import (  # noqa: E402
    PLAN_FILE,
    CommitReader,
    final,
    rows_per_batch,
    trigger_ms,
)
from rillet.client.wire import records  # noqa: E402
from rillet.client.wire.errors import OffsetOutOfRangeError  # noqa: E402

EARLIEST = {0: 0, 1: 5, 2: 0}
LATEST = {0: 10, 1: 20, 2: 0}


def test_offsets_keywords_and_json_forms() -> None:
    assert parse_offsets(None, "t", "earliest") == "earliest"
    assert parse_offsets(" Latest ", "t", "earliest") == "latest"
    assert parse_offsets('{"0": 3, "1": -2}', "t", "earliest") == {0: 3, 1: -2}
    # Spark's Kafka source nests partitions under the topic name: accepted too.
    assert parse_offsets('{"t": {"0": 7}}', "t", "earliest") == {0: 7}


@pytest.mark.parametrize("text", ["soon", '["0", 1]', '{"zero": 1}'])
def test_offsets_garbage_is_refused_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="offsets"):
        parse_offsets(text, "t", "earliest")


def test_resolve_fills_missing_partitions_and_special_offsets() -> None:
    start = resolve({0: 4, 1: -1}, "earliest", EARLIEST, LATEST)
    assert start == {0: 4, 1: 20, 2: 0}  # -1 = latest, partition 2 from the default
    assert resolve("latest", "earliest", EARLIEST, LATEST) == LATEST
    with pytest.raises(ValueError, match=r"\[7\]"):
        resolve({7: 0}, "earliest", EARLIEST, LATEST)


def test_one_range_per_partition_with_records_and_end_clamped_to_latest() -> None:
    ranges = plan_ranges("t", {0: 2, 1: 5, 2: 0}, {0: 99, 1: 20, 2: 0}, latest=LATEST)
    assert ranges == [OffsetRange("t", 0, 2, 10), OffsetRange("t", 1, 5, 20)]


def test_large_ranges_split_into_max_records_pieces_without_gaps() -> None:
    ranges = plan_ranges("t", {0: 0, 1: 5}, {0: 10, 1: 20}, max_records=4)
    assert [(r.partition, r.start, r.end) for r in ranges] == [
        (0, 0, 4),
        (0, 4, 8),
        (0, 8, 10),
        (1, 5, 9),
        (1, 9, 13),
        (1, 13, 17),
        (1, 17, 20),
    ]
    assert sum(r.count for r in ranges) == 25


def test_start_below_log_start_is_data_loss_unless_allowed() -> None:
    with pytest.raises(OffsetOutOfRangeError, match="failOnDataLoss"):
        plan_ranges("t", {1: 0}, {1: 20}, earliest=EARLIEST)
    kept = plan_ranges("t", {1: 0}, {1: 20}, earliest=EARLIEST, fail_on_data_loss=False)
    assert kept == [OffsetRange("t", 1, 5, 20)]


def test_stream_offsets_round_trip_through_json_keys() -> None:
    offset = stream_offset({10: 3, 2: 0})
    assert offset == {"2": 0, "10": 3} and list(offset) == ["2", "10"]
    assert parse_stream_offset(offset) == {2: 0, 10: 3}


def test_options_are_case_insensitive_and_need_a_topic() -> None:
    o = SourceOptions.parse(
        {
            "Topic": "t",
            "STARTINGOFFSETS": '{"0": 1}',
            "acks": "1",
            "maxRecordsPerPartition": "100",
            "lingerMs": "2",
        }
    )
    assert (o.topic, o.starting, o.ending, o.acks) == ("t", {0: 1}, "latest", "1")
    assert o.max_records == 100 and o.producer == {"linger_ms": 2.0}
    assert SourceOptions.parse({"topic": "t"}, streaming=True).starting == "latest"
    with pytest.raises(ValueError, match="topic"):
        SourceOptions.parse({"bootstrap": "h:1"})


def test_arrow_batch_has_the_source_schema_and_converts_headers() -> None:
    data = records.encode_batch(
        [b"text", b"raw", b"late"],
        [b"k", None, None],
        headers=[[("h", b"v")], None, None],
        timestamps=[1000, 2000, 3000],
        base_offset=4,
    )
    batch = to_arrow("t", 3, records.decode_arrow(data, 0, records.read_header(data), 5, 7))
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [5, 6]
    assert rows[0]["value"] == b"raw" and rows[0]["key"] is None and rows[1]["value"] == b"late"
    assert rows[0]["headers"] is None and rows[1]["headers"] is None
    assert rows[1]["timestamp"].timestamp() == 3.0
    whole = to_arrow("t", 3, records.decode_arrow(data, 0, records.read_header(data), 0, 9))
    first = whole.to_pylist()[0]
    assert first["headers"] == [{"key": "h", "value": b"v"}] and first["key"] == b"k"
    assert [r["topic"] for r in whole.to_pylist()] == ["t"] * 3


def test_load_values_round_trip_and_every_byte_is_checked() -> None:
    value = make_value(3, 12345, 64)
    assert len(value) == 64 and parse_value(value) == (3, 12345)
    assert parse_value(make_value(0, 0, 20)) == (0, 0)  # header only
    for i in range(len(value)):  # flip any byte: magic, ids, checksum or payload
        damaged = bytearray(value)
        damaged[i] ^= 0x01
        assert parse_value(bytes(damaged)) is None, i
    assert parse_value(None) is None and parse_value(b"RLT1") is None


@given(
    task=st.integers(0, 2**32 - 1),
    first=st.integers(0, 2**64 - 1),
    count=st.integers(0, 5),
    size=st.integers(20, 300),
)
def test_make_values_in_c_are_make_value_byte_for_byte(
    task: int, first: int, count: int, size: int
) -> None:
    """The load task's C generator against the format's Python definition, at the edges
    of task and seq (the last seqs) and for sizes that cut the payload pattern anywhere."""
    count = min(count, 2**64 - first)
    want = [make_value(task, seq, size) for seq in range(first, first + count)]
    assert make_values(task, first, count, size) == want
    assert all(parse_value(v) == (task, first + i) for i, v in enumerate(want))


@pytest.mark.parametrize("native", [True, False])
def test_make_values_refuses_what_the_format_cannot_hold(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not native:  # the Python twin, as where the codec was not built
        monkeypatch.setattr(jobs, "_native_make_values", None)
        assert make_values(3, 7, 2, 64) == [make_value(3, 7, 64), make_value(3, 8, 64)]
    elif jobs._native_make_values is None:
        pytest.skip("the C extension was not built here")
    for task, first, count, size, error in [
        (2**32, 0, 1, 40, OverflowError),
        (-1, 0, 1, 40, OverflowError),
        (0, 2**64 - 1, 2, 40, OverflowError),
        (0, 2**64, 0, 40, OverflowError),
        (0, 0, 1, 19, ValueError),
        (0, 0, -1, 40, ValueError),
    ]:
        with pytest.raises(error):
            make_values(task, first, count, size)


def test_task_record_counts_cover_all_records() -> None:
    assert [task_records(10, 4, t) for t in range(4)] == [3, 3, 2, 2]
    assert sum(task_records(1_000_003, 7, t) for t in range(7)) == 1_000_003


def test_conf_pairs() -> None:
    assert parse_conf(["spark.a=1", "spark.b=x=y"]) == {"spark.a": "1", "spark.b": "x=y"}
    with pytest.raises(ValueError, match="key=value"):
        parse_conf(["novalue"])


def test_report_names_each_violation_with_examples() -> None:
    r = VerifyReport("t", 10, 10, 11, lost=1, duplicates=1, reordered=1)
    r.examples = {
        "lost": [{"task": 0, "seq": 3}],
        "duplicate": [{"task": 0, "seq": 5, "copies": 2, "at": ["0@4", "0@5"]}],
        "reordered": [{"partition": 0, "task": 0, "seq": 6, "offset": 7, "after_seq": 7}],
    }
    text = format_report(r)
    assert "FAIL lost" in text and "task 0 seq 3" in text
    assert "2 copies at 0@4, 0@5" in text
    assert "after seq 7 of the same task" in text
    assert text.endswith("FAIL: the log lost, duplicated, reordered or corrupted data")
    assert format_report(VerifyReport("t", 1, 1, 1)).endswith("PASS")
    # After an at-least-once (streamed) load, duplicates are reported but pass.
    dup = VerifyReport("t", 10, 10, 11, duplicates=1, duplicates_allowed=True)
    text = format_report(dup)
    assert dup.ok and "duplicates" in text and text.endswith("PASS")


def test_spark_errors_are_reduced_to_their_python_cause() -> None:
    text = (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to plan: Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "rillet.client.wire.errors.UnknownTopicOrPartitionError: topic 'x' does not exist\n"
        "\tat org.apache.spark.Foo(Foo.scala:1)\n"
    )
    assert spark_error_cause(text) == (
        "rillet.client.wire.errors.UnknownTopicOrPartitionError: topic 'x' does not exist"
    )
    assert spark_error_cause("plain failure\nmore") == "plain failure"


def test_without_pyspark_the_cli_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None\n"  # an import of pyspark now fails
        "from rillet.client.cli import main\n"
        "sys.exit(main(['spark', 'verify', '--topic', 't', '--records', '1']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert "pip install 'rillet[spark]'" in out.stderr and "Traceback" not in out.stderr


def test_the_load_shape_comes_from_the_manifest_and_is_never_guessed() -> None:
    committed = {"records": 300, "tasks": 2, "status": "committed", "per_task": []}
    shape = load_shape("t", [committed], 300, None)
    assert (shape.records, shape.tasks, shape.acked) == (300, 2, None)
    assert load_shape("t", [committed], None, None).tasks == 2
    assert load_shape("t", [], 10, 1).source == "given"  # told both: no manifest needed
    with pytest.raises(LoadShapeError, match="no load manifest"):
        load_shape("t", [], 300, None)
    with pytest.raises(LoadShapeError, match="--tasks 4 contradicts"):
        load_shape("t", [committed], 300, 4)
    with pytest.raises(LoadShapeError, match="different shapes"):
        load_shape("t", [committed, {**committed, "tasks": 3}], None, None)
    aborted = {**committed, "status": "aborted", "per_task": [{"task": 1, "records": 150}]}
    assert load_shape("t", [aborted], None, None).acked == {1: 150}
    # The same load twice (its records then show as duplicates): committed once is all.
    assert load_shape("t", [aborted, committed], None, None).acked is None
    # A streamed load acknowledges a prefix of each task, and is at-least-once.
    streamed = {**aborted, "mode": "stream", "per_task": [{"task": 0, "records": 7}]}
    shape = load_shape("t", [streamed], None, None)
    assert shape.acked == {0: 7} and shape.at_least_once
    assert load_shape("t", [streamed, aborted], None, None).acked == {0: 7, 1: 150}
    # A file manifest given with the topic's narrows it (min per task).
    assert load_shape("t", [streamed], None, None, {0: 5, 1: 3}).acked == {0: 5}
    assert acked_counts(300, 2, {0: 7}) == {0: 7, 1: 0}
    assert acked_counts(301, 2, None) == {0: 151, 1: 150}


def test_stream_load_batches_are_multiples_of_the_task_count() -> None:
    # Spark partition p of a micro-batch starting at row b holds rows b + p + k * tasks:
    # task p's rows only when b is a multiple of tasks, so every batch size must be.
    assert rows_per_batch(3000, 2) == 3000
    assert rows_per_batch(10, 3) == 12
    assert rows_per_batch(1, 4) == 4
    for rate, tasks in ((7, 3), (20_001, 4), (5, 5)):
        assert rows_per_batch(rate, tasks) % tasks == 0 and rows_per_batch(rate, tasks) >= rate
    # ... and the interval stretches with the batch, so the rate asked for holds.
    assert (trigger_ms(3000, 2), trigger_ms(10, 3), trigger_ms(1, 4)) == (1000, 1200, 4000)


def test_a_manifest_must_be_well_formed_to_count() -> None:
    good = {
        "records": 10,
        "tasks": 2,
        "status": "committed",
        "per_task": [{"task": 0, "records": 5}],
    }
    assert _manifest(json.dumps(good).encode()) == good
    for bad in (
        {**good, "tasks": 0},
        {**good, "records": 1},  # fewer records than tasks
        {**good, "tasks": True},
        {**good, "per_task": [{"task": "0", "records": 5}]},
        {**good, "per_task": [{"task": 0}]},
        {**good, "per_task": {"0": 5}},
        [good],
    ):
        assert _manifest(json.dumps(bad).encode()) is None, bad
    assert _manifest(b"not json") is None


def test_which_manifests_end_a_streaming_verification() -> None:
    stream = {"records": 10, "tasks": 2, "mode": "stream"}
    assert final({**stream, "status": "committed", "resumable": True})
    assert final({**stream, "status": "interrupted", "resumable": False})  # cannot resume
    assert not final({**stream, "status": "failed", "resumable": True})  # may resume
    assert final({"records": 10, "tasks": 2, "status": "aborted"})  # a batch load


def test_commit_reader_sums_each_batch_once_and_sees_rewrites(tmp_path: Path) -> None:
    def batch(name: str, tasks: list[tuple[int, int]], at: float) -> None:
        rows = [{"task": t, "records": n, "started_at": at - 1} for t, n in tasks]
        (tmp_path / name).write_text(json.dumps({"status": "committed", "tasks": rows, "at": at}))

    (tmp_path / PLAN_FILE).write_text(json.dumps({"topic": "t"}))  # not a batch
    batch("batch-000000000000.json", [(0, 5), (1, 5)], 10.0)
    batch("batch-000000000001.json", [(0, 5), (1, 0)], 11.0)
    (tmp_path / "abort-000000000002-1.json").write_text('{"status": "aborted", "tasks": []}')
    assert CommitReader(tmp_path / "not-yet").read().total == 0  # before the query starts
    reader = CommitReader(tmp_path)
    log = reader.read()
    assert (log.acked, log.batches, log.aborted, log.total) == ({0: 10, 1: 5}, 2, 1, 15)
    assert (log.first_start, log.last_commit) == (9.0, 11.0)
    batch("batch-000000000002.json", [(0, 5), (1, 5)], 12.0)
    assert reader.read().acked == {0: 15, 1: 10}
    # A batch re-run after a restart rewrites its own file; the restarted run's reader
    # counts it once, as rewritten.
    batch("batch-000000000001.json", [(0, 5), (1, 5)], 13.0)
    assert CommitReader(tmp_path).read().acked == {0: 15, 1: 15}
