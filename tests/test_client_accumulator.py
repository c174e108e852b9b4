"""The producer's RecordAccumulator alone: no event loop, no network, a hand-driven clock.

Sealing (batch_size, linger, flush), where records land (murmur2 for keys, sticky
otherwise), draining per leader within the request and in-flight limits, the order
of a partition's batches across retries, the memory bound, expiry and abort.
"""

from __future__ import annotations

import random

import pytest

from rillet.client.accumulator import (
    RECORD_OVERHEAD_BYTES,
    ProducerBatch,
    ProducerClosedError,
    RecordAccumulator,
)
from rillet.client.partitioner import StickyPartitioner, partition_for_key
from rillet.client.wire import records

LINGER = 0.005
WALL_MS = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    clock: Clock, *, batch_size: int = 1 << 20, buffer_memory: int = 1 << 24, **kw: object
) -> RecordAccumulator:
    acc = RecordAccumulator(
        batch_size=batch_size,
        linger_s=LINGER,
        buffer_memory=buffer_memory,
        delivery_timeout_s=120.0,
        clock=clock,
        wall_clock_ms=lambda: WALL_MS,
        partitioner=StickyPartitioner(random.Random(7)),
        **kw,  # type: ignore[arg-type]
    )
    acc.add_topic("t", 4)
    return acc


def values(b: ProducerBatch) -> list[bytes]:
    assert b.payload is not None
    return [r.value for r in records.decode_batch(b.payload)]


def values_of_open(tp: object) -> list[bytes]:
    return list(tp.open.values)  # type: ignore[attr-defined]


def decode(b: ProducerBatch) -> list[records.Record]:
    assert b.payload is not None
    return list(records.decode_batch(b.payload))


def leaders(table: dict[int, int]):  # noqa: ANN201
    return lambda topic, partition: table.get(partition, -1)


def test_a_batch_seals_once_it_reaches_batch_size() -> None:
    size = 20 + RECORD_OVERHEAD_BYTES
    acc = make(Clock(), batch_size=5 * size)
    for i in range(12):
        acc.append("t", b"%020d" % i, partition=1)
    sealed = acc.sealed("t", 1)
    assert [len(values(b)) for b in sealed] == [5, 5]
    assert values(sealed[0]) + values(sealed[1]) == [b"%020d" % i for i in range(10)]
    assert acc.topics["t"].parts[1].open is not None  # the last two records still wait


def test_a_batch_seals_once_it_has_lingered() -> None:
    clock = Clock()
    acc = make(clock)
    acc.append("t", b"a", partition=0)
    clock.now += 0.002
    acc.append("t", b"b", partition=1)
    assert acc.ready(clock.now) == pytest.approx(100.0 + LINGER)  # partition 0's deadline
    assert acc.sealed("t", 0) == []
    clock.now = 100.0 + LINGER
    assert acc.ready(clock.now) == pytest.approx(100.002 + LINGER)
    assert [values(b) for b in acc.sealed("t", 0)] == [[b"a"]]
    assert acc.sealed("t", 1) == []
    clock.now = 100.002 + LINGER
    assert acc.ready(clock.now) is None  # nothing open any more
    assert [values(b) for b in acc.sealed("t", 1)] == [[b"b"]]


def test_seal_all_seals_every_open_batch_before_its_linger() -> None:
    acc = make(Clock())
    for p in range(4):
        acc.append("t", b"v%d" % p, partition=p)
    acc.seal_all()
    assert [len(acc.sealed("t", p)) for p in range(4)] == [1, 1, 1, 1]
    assert acc.ready(100.0) is None


def test_the_wakeup_hook_fires_on_a_seal_and_on_an_earlier_linger_deadline() -> None:
    clock = Clock()
    acc = make(clock)
    calls = []
    acc.wakeup = lambda: calls.append(clock.now)
    acc.append("t", b"a", partition=0)  # the first open batch: a deadline to arm
    acc.append("t", b"b", partition=1)  # same time: the earliest deadline holds
    assert calls == [100.0]
    acc.seal_all()
    assert len(calls) == 3


def test_a_plain_record_after_one_with_headers_or_a_timestamp_shares_its_batch() -> None:
    # The per-record fast path appended no header or timestamp for the plain record, so
    # the batch's columns differed in length and the whole batch failed to encode.
    acc = make(Clock())
    acc.append("t", b"h", headers=[("x", b"1")], partition=0)
    acc.append("t", b"plain", partition=0)
    acc.append("t", b"ts", timestamp=5, partition=0)
    acc.append("t", b"plain2", key=b"k", partition=0)
    acc.seal_all()
    assert acc.unencodable == []
    (b,) = acc.sealed("t", 0)
    got = [(r.value, r.key, r.timestamp, [h[0] for h in r.headers or ()]) for r in decode(b)]
    assert got == [
        (b"h", None, WALL_MS, ["x"]),
        (b"plain", None, WALL_MS, []),
        (b"ts", None, 5, []),
        (b"plain2", b"k", WALL_MS, []),
    ]


def add_columns(
    acc: RecordAccumulator, t: object, partition: int | None, values: list, keys: list | None = None
) -> None:
    """What ``Producer.send_many`` does with one partition's records."""
    acc.check_columns(values, keys)
    start = 0
    while start < len(values):
        start = acc.append_columns(t, partition, values, keys, start)  # type: ignore[arg-type]


def test_column_slices_join_the_open_batch_and_linger_like_single_records() -> None:
    # send_many each millisecond made one batch, so one request, per call whatever the
    # linger; now the calls of a linger share a batch.
    clock = Clock()
    acc = make(clock, batch_size=1000)
    t = acc.topics["t"]
    acc.append("t", b"one", partition=1)
    add_columns(acc, t, 1, [b"a", b"b"])
    add_columns(acc, t, 1, [b"c"])
    assert acc.sealed("t", 1) == []  # still lingering
    clock.now += LINGER
    acc.ready(clock.now)
    (b,) = acc.sealed("t", 1)
    assert values(b) == [b"one", b"a", b"b", b"c"]


def test_column_slices_fill_a_batch_to_batch_size_and_seal_it_at_once() -> None:
    acc = make(Clock(), batch_size=100)
    t = acc.topics["t"]
    a, b, c = (bytes([x]) * 52 for x in b"abc")  # 60 bytes each with the overhead
    add_columns(acc, t, 0, [a])
    add_columns(acc, t, 0, [b, c])  # b joins a and fills the batch; c opens the next
    assert [values(x) for x in acc.sealed("t", 0)] == [[a, b]]
    assert list(t.parts[0].open.values) == [c]


def test_column_slices_are_cut_by_each_records_size_not_an_average() -> None:
    # Slices cut by the call's average record size could put many large records in one
    # batch, far over batch_size (and the broker's max.message.bytes).
    acc = make(Clock(), batch_size=1000)
    t = acc.topics["t"]
    small, large = [b"s"] * 500, [b"L" * 400] * 10
    add_columns(acc, t, 0, small + large)
    add_columns(acc, t, 0, large)
    acc.seal_all()
    batches = acc.sealed("t", 0)
    largest_record = 400 + RECORD_OVERHEAD_BYTES
    assert all(x.nbytes < 1000 + largest_record for x in batches)
    assert [r for x in batches for r in values(x)] == small + large + large


def test_unkeyed_column_slices_follow_the_sticky_partition_when_a_batch_seals() -> None:
    acc = make(Clock(), batch_size=100)
    t = acc.topics["t"]
    a, b, c = (bytes([x]) * 52 for x in b"abc")
    add_columns(acc, t, None, [a])
    first = t.sticky
    add_columns(acc, t, None, [b, c])  # b fills first's batch, which seals and moves on
    assert t.sticky != first
    assert [values(x) for x in acc.sealed("t", first)] == [[a, b]]
    assert list(t.parts[t.sticky].open.values) == [c]


def test_a_bad_record_in_a_column_fails_before_any_batch_is_touched() -> None:
    acc = make(Clock())
    t = acc.topics["t"]
    acc.append("t", b"valid", partition=0)
    with pytest.raises(TypeError, match="record 1: a value must be bytes"):
        add_columns(acc, t, 0, [b"ok", "text"])
    with pytest.raises(TypeError, match="record 1: a key must be bytes"):
        add_columns(acc, t, 0, [b"ok", b"ok"], [b"k", 7])
    assert list(t.parts[0].open.values) == [b"valid"]
    # None (a tombstone's value, a null key) and bytes-likes count as append counts them
    add_columns(acc, t, 1, [b"ab", None, bytearray(b"xyz")], [None, b"k", None])
    assert t.parts[1].open.nbytes == 30


def test_out_of_memory_seals_open_batches_before_their_linger() -> None:
    clock = Clock()
    acc = make(clock, buffer_memory=200)
    acc.append("t", b"x" * 150, partition=0)
    acc.ready(clock.now)
    assert acc.sealed("t", 0) == []  # lingering: memory left
    acc.append("t", b"y" * 150, partition=1)  # over buffer_memory now
    acc.ready(clock.now)
    assert [len(acc.sealed("t", p)) for p in (0, 1)] == [1, 1]


def test_column_slices_keep_keys_headers_and_timestamps_aligned() -> None:
    clock = Clock()
    acc = make(clock)
    t = acc.topics["t"]
    acc.append("t", b"h", headers=[("x", b"1")], timestamp=5, partition=0)
    add_columns(acc, t, 0, [b"k1", b"k2"], [b"key1", b"key2"])
    acc.append("t", b"plain", partition=0)
    acc.seal_all()
    (b,) = acc.sealed("t", 0)
    got = [(r.value, r.key, r.timestamp, [h[0] for h in r.headers or ()]) for r in decode(b)]
    assert got == [
        (b"h", None, 5, ["x"]),
        (b"k1", b"key1", WALL_MS, []),
        (b"k2", b"key2", WALL_MS, []),
        (b"plain", None, WALL_MS, []),
    ]


def test_keyed_records_land_on_their_murmur2_partition() -> None:
    acc = make(Clock())
    keys = [b"key-%d" % i for i in range(200)]
    for k in keys:
        acc.append("t", b"v", key=k)
    acc.seal_all()
    for p in range(4):
        got = [r.key for b in acc.sealed("t", p) for r in records.decode_batch(b.payload)]
        assert got == [k for k in keys if partition_for_key(k, 4) == p]


def test_unkeyed_records_stick_to_one_partition_until_its_batch_seals() -> None:
    size = 1 + RECORD_OVERHEAD_BYTES
    acc = make(Clock(), batch_size=10 * size)
    for _ in range(10):
        acc.append("t", b"v")
    first = [p for p in range(4) if acc.sealed("t", p)]
    assert len(first) == 1
    assert [len(values(b)) for b in acc.sealed("t", first[0])] == [10]
    acc.append("t", b"w")  # the next batch goes elsewhere (KIP-480)
    acc.seal_all()
    second = [p for p in range(4) if p != first[0] and acc.sealed("t", p)]
    assert len(second) == 1


def test_unkeyed_records_move_on_to_partitions_that_have_a_leader() -> None:
    """Each new sticky choice is among the partitions with a leader, never the one whose
    batch just closed while another is left; with no leader anywhere, any partition."""
    size = 20 + RECORD_OVERHEAD_BYTES
    acc = make(Clock(), batch_size=2 * size)
    led = {0: 1, 1: -1, 2: -1, 3: 2}  # partitions 1 and 2 have no leader
    acc.leader_of = lambda topic, p: led[p]
    t = acc.topics["t"]

    def partition_of(i: int) -> int:
        return acc.append_record(t, b"%020d" % i, None, None, None, None)[0].partition

    chosen = [partition_of(i) for i in range(40)]
    assert set(chosen) <= {0, 3} and len(set(chosen)) == 2
    runs = [p for i, p in enumerate(chosen) if i == 0 or chosen[i - 1] != p]
    assert all(a != b for a, b in zip(runs, runs[1:], strict=False))  # it switches
    led.update({0: -1, 3: -1})  # now none has a leader: the plain sticky choice
    more = {partition_of(i) for i in range(40)}
    assert len(more) > 1


def test_drain_groups_batches_by_leader_one_per_partition() -> None:
    acc = make(Clock())
    for p in range(4):
        for i in range(2):
            acc.append("t", b"%d-%d" % (p, i), partition=p)
            acc.seal_all()  # two sealed batches per partition
    by_node, leaderless = acc.drain(leaders({0: 1, 1: 2, 2: 1}), 1 << 20)
    assert leaderless  # partition 3 has no leader
    assert {n: [(b.partition, values(b)) for b in bs] for n, bs in by_node.items()} == {
        1: [(0, [b"0-0"]), (2, [b"2-0"])],
        2: [(1, [b"1-0"])],
    }
    by_node, _ = acc.drain(leaders({0: 1, 1: 2, 2: 1}), 1 << 20, busy={2})
    assert {n: [values(b) for b in bs] for n, bs in by_node.items()} == {1: [[b"0-1"], [b"2-1"]]}
    assert acc.sealed("t", 1)[0].partition == 1  # busy leader: left queued


def test_drain_respects_max_request_bytes_but_always_takes_one_batch() -> None:
    acc = make(Clock())
    for p in range(3):
        acc.append("t", b"x" * 100, partition=p)
    acc.seal_all()
    by_node, _ = acc.drain(leaders({0: 1, 1: 1, 2: 1}), 10)
    assert [b.partition for b in by_node[1]] == [0]  # bigger than the limit, alone
    by_node, _ = acc.drain(leaders({0: 1, 1: 1, 2: 1}), 10_000)
    assert [b.partition for b in by_node[1]] == [1, 2]


def test_a_request_to_a_leader_takes_its_other_partitions_open_batches() -> None:
    clock = Clock()
    acc = make(clock)
    table = leaders({0: 1, 1: 1, 2: 2, 3: 1})
    acc.leader_of = table  # the producer's metadata, as the sender's drain sees it
    acc.append("t", b"a", partition=0)
    acc.seal_all()  # partition 0's batch is due
    acc.append("t", b"b", partition=1)  # open, lingering, same leader
    acc.append("t", b"c", partition=2)  # open, another leader
    acc.append("t", b"d", partition=3)  # open, leader 1 too
    by_node, _ = acc.drain(table, 1 << 20)
    # Leader 1's request carries partition 1's open batch, sealed before its linger;
    # leader 2 gets no request of its own for a batch still lingering.
    assert {n: [(b.partition, values(b)) for b in bs] for n, bs in by_node.items()} == {
        1: [(0, [b"a"]), (1, [b"b"]), (3, [b"d"])]
    }
    assert acc.topics["t"].parts[1].open is None
    assert acc.topics["t"].parts[2].open is not None
    acc.append("t", b"b2", partition=1)  # lands in a new batch, sent after the first
    clock.now += LINGER
    acc.ready(clock.now)
    by_node, _ = acc.drain(table, 1 << 20)
    assert {n: [(b.partition, values(b)) for b in bs] for n, bs in by_node.items()} == {
        1: [(1, [b"b2"])],
        2: [(2, [b"c"])],  # lingered out: its own request
    }


def test_a_request_carries_one_batch_per_partition_even_with_one_open_behind() -> None:
    # The answer has one result per partition: two batches of one partition in a request
    # would both get the second's (offsets, and an error reported as a success).
    acc = make(Clock())
    table = leaders({0: 1, 1: 1})
    acc.leader_of = table  # the producer's metadata, as the sender's drain sees it
    acc.append("t", b"sealed", partition=0)
    acc.seal_all()
    acc.append("t", b"open", partition=0)
    acc.append("t", b"other", partition=1)
    by_node, _ = acc.drain(table, 1 << 20)
    assert [(b.partition, values(b)) for b in by_node[1]] == [(0, [b"sealed"]), (1, [b"other"])]
    assert acc.topics["t"].parts[0].open is not None  # the next request takes it


def test_the_sticky_partitions_open_batch_keeps_filling() -> None:
    acc = make(Clock())
    table = leaders({0: 1, 1: 1, 2: 1, 3: 1})
    acc.leader_of = table  # the producer's metadata, as the sender's drain sees it
    acc.append("t", b"keyed", partition=0)
    acc.seal_all()
    acc.append("t", b"unkeyed")  # lands on the sticky partition, opening a batch
    sticky = acc.topics["t"].sticky
    (batches,) = acc.drain(table, 1 << 20)[0].values()
    assert [b.partition for b in batches] == [0]
    assert acc.topics["t"].parts[sticky].open is not None
    assert acc.topics["t"].sticky == sticky


def test_open_batches_ride_along_only_within_the_limits_of_a_sealed_one() -> None:
    acc = make(Clock(), max_in_flight_per_partition=1)
    table = leaders({0: 1, 1: 1, 2: 1, 3: 1})
    acc.leader_of = table  # the producer's metadata, as the sender's drain sees it
    for p in (0, 1):
        acc.append("t", b"%d" % p, partition=p)
        acc.seal_all()
    first, in_flight = acc.drain(table, 1 << 20)[0][1]
    assert acc.delivered(first) is None  # partition 0's is done, partition 1's in flight
    acc.append("t", b"x" * 100, partition=0)
    acc.seal_all()  # partition 0: a sealed batch
    acc.append("t", b"later", partition=0)  # ... and an open one behind it
    acc.append("t", b"1-open", partition=1)  # at its in-flight limit
    acc.append("t", b"y" * 200, partition=2)  # does not fit the request
    acc.append("t", b"3", partition=3)  # fits
    by_node, _ = acc.drain(table, 300)
    assert [(b.partition, values(b)) for b in by_node[1]] == [(0, [b"x" * 100]), (3, [b"3"])]
    parts = acc.topics["t"].parts
    assert parts[0].open is not None and parts[1].open is not None
    assert parts[2].open is not None  # it lingers on, unsealed


def test_an_open_batch_whose_leader_moved_does_not_ride_to_the_old_one() -> None:
    acc = make(Clock())
    table = {0: 1, 1: 1, 2: 1}
    acc.leader_of = leaders(table)
    acc.append("t", b"a", partition=0)
    acc.seal_all()
    acc.append("t", b"b", partition=1)  # opened while 1 led it
    table[1] = 2
    by_node, _ = acc.drain(leaders(table), 1 << 20)
    assert [(b.partition, values(b)) for b in by_node[1]] == [(0, [b"a"])]
    assert acc.topics["t"].parts[1].open is not None  # it lingers out, then goes to 2


def test_a_batch_opened_with_no_leader_rides_along_once_it_has_one() -> None:
    acc = make(Clock(), batch_size=100)
    table = {0: 2, 1: -1}
    acc.leader_of = leaders(table)
    acc.append("t", b"d", partition=1)  # no leader yet (an election, a new topic)
    table[1] = 2
    acc.append("t", b"e" * 100, partition=0)  # sealed for its size
    by_node, _ = acc.drain(leaders(table), 1 << 20)
    assert [(b.partition, values(b)) for b in by_node[2]] == [(0, [b"e" * 100]), (1, [b"d"])]


def test_max_in_flight_per_partition_holds_back_the_next_batch() -> None:
    acc = make(Clock(), max_in_flight_per_partition=1)
    for i in range(2):
        acc.append("t", b"%d" % i, partition=0)
        acc.seal_all()
    leader = leaders({0: 1})
    (first,) = acc.drain(leader, 1 << 20)[0][1]
    assert acc.drain(leader, 1 << 20)[0] == {}
    assert acc.delivered(first) is None
    assert [values(b) for b in acc.drain(leader, 1 << 20)[0][1]] == [[b"1"]]


def test_retried_batches_go_back_in_front_of_newer_ones_in_their_order() -> None:
    acc = make(Clock())
    leader = leaders({0: 1})

    def seal(v: bytes) -> None:
        acc.append("t", v, partition=0)
        acc.seal_all()

    seal(b"b0")
    seal(b"b1")
    seal(b"b2")
    in_flight: list[ProducerBatch] = []
    for _ in range(3):  # pipelined: one batch of the partition per request
        in_flight += acc.drain(leader, 1 << 20)[0][1]
    seal(b"b3")  # newer, queued behind them
    assert [values(b) for b in in_flight] == [[b"b0"], [b"b1"], [b"b2"]]
    # b1's answer comes first: it must be retried; the partition is muted at once
    assert acc.retry(in_flight[1]) is None
    assert acc.drain(leader, 1 << 20)[0] == {}
    assert acc.retry(in_flight[2]) is None
    tp = acc.retry(in_flight[0])  # the last one in flight is back: re-enqueue
    assert tp is not None and tp.partition == 0
    assert [values(b) for b in acc.sealed("t", 0)] == [[b"b0"], [b"b1"], [b"b2"], [b"b3"]]
    assert acc.drain(leader, 1 << 20)[0] == {}  # still muted until the sender's backoff
    acc.unmute(tp)
    # one batch at a time until one succeeds, then pipelined again
    (again,) = acc.drain(leader, 1 << 20)[0][1]
    assert values(again) == [b"b0"]
    assert acc.drain(leader, 1 << 20)[0] == {}
    assert acc.delivered(again) is None
    rest = [values(b) for b in acc.drain(leader, 1 << 20)[0][1]]
    rest += [values(b) for b in acc.drain(leader, 1 << 20)[0][1]]
    rest += [values(b) for b in acc.drain(leader, 1 << 20)[0][1]]
    assert rest == [[b"b1"], [b"b2"], [b"b3"]]


def test_a_partition_whose_leader_moved_waits_for_its_batches_in_flight_to_the_old() -> None:
    # Batches 0 and 1 are in flight to broker 1 when the client learns that broker 2
    # leads: batch 2 must wait until they are back (they fail and are resent first),
    # or it lands ahead of them.
    acc = make(Clock())
    table = {0: 1}
    leader = leaders(table)
    in_flight = []
    for v in (b"0", b"1"):
        acc.append("t", v, partition=0)
        acc.seal_all()
        (b,) = acc.drain(leader, 1 << 20)[0][1]
        in_flight.append(b)
    table[0] = 2
    acc.append("t", b"2", partition=0)
    acc.seal_all()
    assert acc.drain(leader, 1 << 20)[0] == {}
    assert acc.retry(in_flight[0]) is None
    tp = acc.retry(in_flight[1])
    assert tp is not None
    acc.unmute(tp)
    assert [values(b) for b in acc.sealed("t", 0)] == [[b"0"], [b"1"], [b"2"]]
    (again,) = acc.drain(leader, 1 << 20)[0][2]  # to the new leader, in order
    assert values(again) == [b"0"]


def test_a_batch_failed_for_good_still_lets_the_muted_partition_resume() -> None:
    acc = make(Clock())
    leader = leaders({0: 1})
    for v in (b"a", b"b"):
        acc.append("t", v, partition=0)
        acc.seal_all()
    a = acc.drain(leader, 1 << 20)[0][1][0]
    b = acc.drain(leader, 1 << 20)[0][1][0]
    assert acc.retry(a) is None
    tp = acc.failed(b)  # out of retries: the sender completes it with its error
    assert tp is not None
    assert [values(x) for x in acc.sealed("t", 0)] == [[b"a"]]


def test_a_record_refused_with_an_exception_leaves_its_batch_untouched() -> None:
    acc = make(Clock())
    acc.append("t", b"first", partition=0)
    buffered = acc.buffered
    t = acc.topics["t"]
    with pytest.raises(TypeError):
        acc.append("t", 12345, partition=0)  # no len(): the hot path
    with pytest.raises(TypeError):
        acc.append_record(t, 12345, None, None, 0, None)
    with pytest.raises(ValueError):
        acc.append_record(t, b"v", None, [("h",)], 0, None)  # not (key, value) pairs
    with pytest.raises(ValueError):
        acc.append("t", b"v", partition=0, timestamp="soon")  # type: ignore[arg-type]
    assert acc.buffered == buffered
    acc.append_record(t, b"last", None, iter([("h", b"1")]), 0, None)  # any iterable
    acc.seal_all()
    (b,) = acc.sealed("t", 0)
    assert [(r.value, r.headers) for r in records.decode_batch(b.payload)] == [  # type: ignore[arg-type]
        (b"first", None),
        (b"last", [("h", b"1")]),
    ]


def test_the_memory_bound_applies_backpressure_until_batches_complete() -> None:
    size = 100 + RECORD_OVERHEAD_BYTES
    acc = make(Clock(), batch_size=2 * size, buffer_memory=4 * size)
    acc.when_full = lambda: "wait"
    answers = [acc.append("t", b"x" * 100, partition=0) for _ in range(5)]
    assert answers == [True, True, True, "wait", "wait"]
    assert acc.buffered == 5 * size

    def complete_next() -> None:  # what the sender does with a successful answer
        for b in acc.drain(leaders({0: 1}), 1 << 20)[0][1]:
            acc.delivered(b)
            acc.deallocate(b)

    complete_next()
    assert acc.buffered == 3 * size  # one batch still queued, one record in the open one
    assert acc.append("t", b"x" * 100, partition=0) == "wait"
    complete_next()
    assert acc.buffered == 2 * size
    assert acc.append("t", b"x" * 100, partition=0) is True


def test_expire_takes_out_queued_batches_past_their_deadline() -> None:
    clock = Clock()
    acc = make(clock)
    acc.append("t", b"old", partition=0)
    acc.append("t", b"busy", partition=1)
    acc.seal_all()
    (in_flight,) = acc.drain(leaders({1: 1}), 1 << 20)[0][1]
    acc.append("t", b"queued", partition=1)
    acc.seal_all()
    assert acc.expire(clock.now + 119) == []
    expired = acc.expire(clock.now + 120)
    assert [values(b) for b in expired] == [[b"old"]]  # partition 1 has one in flight
    assert acc.sealed("t", 0) == []


def test_unknown_topics_go_to_the_hook_and_count_against_memory() -> None:
    acc = make(Clock())
    held = []
    acc.on_unknown_topic = lambda topic, rec: held.append((topic, rec[0]))
    assert acc.append("other", b"v") is True
    assert held == [("other", b"v")]
    assert acc.buffered == 0  # the hook's owner counts what it holds


def test_abort_refuses_records_and_returns_every_incomplete_batch() -> None:
    acc = make(Clock())
    acc.append("t", b"open", partition=0)
    acc.append("t", b"queued", partition=1)
    acc.seal_all()
    acc.append("t", b"open2", partition=2)
    aborted = acc.abort()
    assert len(aborted) == 3
    with pytest.raises(ProducerClosedError):
        acc.append("t", b"late", partition=0)
    assert acc.drain(leaders({0: 1, 1: 1, 2: 1}), 1 << 20)[0] == {}


def test_an_unencodable_batch_is_set_aside_with_its_error() -> None:
    acc = make(Clock())
    t = acc.topics["t"]
    # A lone surrogate passes the append's type checks but has no UTF-8 form.
    acc.append_record(t, b"v", None, [("\ud800", b"x")], 0, None)
    acc.seal_all()
    (bad,) = acc.unencodable
    assert isinstance(bad.error, TypeError)
    assert acc.sealed("t", 0) == []


# --- a random model: many schedules, the same two promises -------------------------------


@pytest.mark.parametrize("seed", range(300))
def test_random_schedules_keep_each_partitions_order_and_complete_every_batch(
    seed: int,
) -> None:
    """Appends, seals, drains, leader moves and answers in a random order; answers come
    back in order per connection, but the connections interleave freely, so a new
    leader's answer can come before the old leader's. A broker appends a batch only if
    it leads the partition when the batch arrives, and a failure fails every later
    in-flight batch of the partition on that connection (as a leader change or a dropped
    connection does). Every batch completes exactly once, and each partition's delivered
    batches are in their original order."""
    rng = random.Random(seed)
    clock = Clock()
    acc = RecordAccumulator(
        batch_size=rng.choice([20, 60, 1 << 20]),
        linger_s=LINGER,
        buffer_memory=1 << 30,
        delivery_timeout_s=rng.choice([0.05, 1000.0]),
        clock=clock,
        wall_clock_ms=lambda: WALL_MS,
        max_in_flight_per_partition=rng.choice([0, 1, 2, 5]),
    )
    acc.add_topic("t", 3)
    table = {0: 1, 1: 2, 2: 1}
    leader = leaders(table)
    acc.leader_of = leader  # leaders move below: the index of open batches goes stale
    conns: dict[int, list[ProducerBatch]] = {1: [], 2: [], 3: []}  # in flight, in order
    failing: set[tuple[int, int]] = set()  # (partition, node): the rest fail too
    to_unmute: list = []
    delivered: dict[int, list[int]] = {0: [], 1: [], 2: []}
    done: set[ProducerBatch] = set()

    def finish(b: ProducerBatch) -> None:
        assert b not in done
        done.add(b)
        acc.deallocate(b)

    max_request = rng.choice([100, 200, 1 << 20])

    def send() -> None:
        by_node, _ = acc.drain(leader, max_request)
        for node, batches in by_node.items():
            assert node == table[batches[0].partition] > 0
            # One batch per partition (the answer has one result per partition), and
            # within the request bound unless the request is one batch.
            assert len({b.partition for b in batches}) == len(batches)
            assert len(batches) == 1 or sum(len(b.payload) for b in batches) <= max_request
            conns[node] += batches

    def answer(node: int) -> None:
        b = conns[node].pop(0)
        p = b.partition
        if (p, node) in failing or table[p] != node or rng.random() < 0.1:
            failing.add((p, node))
            if rng.random() < 0.8:
                tp = acc.retry(b)
            else:
                tp = acc.failed(b)
                finish(b)
        else:
            tp = acc.delivered(b)
            finish(b)
            delivered[p].append(b.seq)
        if not any(x.partition == p for x in conns[node]):
            failing.discard((p, node))
        if tp is not None:
            to_unmute.append(tp)

    for _step in range(400):
        r = rng.random()
        clock.now += rng.choice([0, 0.001, 0.01])
        if r < 0.35:
            acc.append("t", b"x" * rng.randrange(1, 10), partition=rng.randrange(3))
        elif r < 0.45:
            acc.ready(clock.now)
        elif r < 0.5:
            acc.seal_all()
        elif r < 0.6:
            send()
        elif r < 0.65:
            table[rng.randrange(3)] = rng.choice([1, 2, 3, -1])
        elif r < 0.85:
            busy = [n for n, q in conns.items() if q]
            if busy:
                answer(rng.choice(busy))  # any connection's answer may come first
        elif r < 0.95:
            if to_unmute:
                acc.unmute(to_unmute.pop(rng.randrange(len(to_unmute))))
        else:
            for b in acc.expire(clock.now):
                finish(b)
    # no more moves: everything left is sent to broker 1 and delivered
    for p in table:
        table[p] = 1
    acc.seal_all()
    for _ in range(10_000):
        for tp in to_unmute:
            acc.unmute(tp)
        to_unmute.clear()
        send()
        busy = [n for n, q in conns.items() if q]
        if not busy:
            break
        for node in rng.sample(busy, len(busy)):
            while conns[node]:
                answer(node)
    assert not acc.incomplete, "batches neither delivered nor failed"
    assert acc.buffered == 0
    for p in range(3):
        assert delivered[p] == sorted(delivered[p]), (p, delivered[p])
