"""Fetch sessions (KIP-227 incremental fetch), both pure halves: the broker's
FetchSessionCache (broker/fetch_session.py) and the client's FetchSessionBuilder
(client/fetch_session.py), with no I/O.

The property test drives both against a model of partitions that change at random and
checks that what a client learns from incremental answers is what full fetches would
have told it, through session evictions and broker restarts."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from rillet.broker.fetch_session import (
    FETCH_SESSION_ID_NOT_FOUND,
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_FETCH_SESSION_EPOCH,
    MAX_EPOCH,
    FetchContext,
    FetchSessionCache,
)
from rillet.broker.replica_fetch import FetchPartition, FetchPartitionResult
from rillet.client.fetch_session import FetchSessionBuilder
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.storage import FileSlice

NOT_LEADER = errors.code_of("NOT_LEADER_OR_FOLLOWER")
FOLLOWER = 2
CONSUMER = -1


def fp(partition: int, offset: int = 0, topic: str = "t") -> FetchPartition:
    return FetchPartition(topic, partition, offset, 0, 0, 1 << 20)


def ok(
    p: FetchPartition, hw: int = 0, log_start: int = 0, nbytes: int = 0, idle: bool = False
) -> FetchPartitionResult:
    records = FileSlice(-1, None, 0, nbytes, 0) if nbytes else None
    return FetchPartitionResult(
        p.topic, p.partition, errors.NONE, hw, log_start, records=records, idle=idle
    )


def ctx_of(result: FetchContext | int) -> FetchContext:
    assert isinstance(result, FetchContext), errors.error_name(result)  # type: ignore[arg-type]
    return result


# -- the broker's cache ---------------------------------------------------------------------


def test_full_fetch_opens_a_session_and_answers_everything() -> None:
    cache = FetchSessionCache()
    ctx = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(0), fp(1), fp(2)]))
    assert ctx.session_id != 0 and not ctx.incremental
    results = [ok(p) for p in ctx.partitions]
    assert ctx.answer(results) == results  # a full answer carries every partition
    assert len(cache) == 1


def test_incremental_consumer_fetch_reads_the_whole_session_and_answers_only_news() -> None:
    cache = FetchSessionCache()
    ctx = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0), fp(1), fp(2)]))
    ctx.answer([ok(p, hw=5) for p in ctx.partitions])
    sid = ctx.session_id

    # Nothing listed: the broker still reads all three (the long poll parks on each).
    ctx = ctx_of(cache.new_context(CONSUMER, sid, 1, []))
    assert ctx.incremental and [p.partition for p in ctx.partitions] == [0, 1, 2]
    assert ctx.answer([ok(p, hw=5) for p in ctx.partitions]) == []  # idle: nothing to say

    # Partition 1's HW moved, 2 has records: only they go out.
    ctx = ctx_of(cache.new_context(CONSUMER, sid, 2, []))
    p0, p1, p2 = ctx.partitions
    sent = ctx.answer([ok(p0, hw=5), ok(p1, hw=6), ok(p2, hw=5, nbytes=10)])
    assert [r.partition for r in sent] == [1, 2]
    # The partition that got data goes to the back of the read order (fairness); a
    # listed partition is answered even with nothing new.
    ctx = ctx_of(cache.new_context(CONSUMER, sid, 3, [fp(2, offset=7)]))
    assert [(p.partition, p.fetch_offset) for p in ctx.partitions] == [(0, 0), (1, 0), (2, 7)]
    assert [r.partition for r in ctx.answer([ok(p, hw=6) for p in ctx.partitions])] == [0, 2]


def test_a_follower_session_reads_only_what_was_listed_or_marked_changed() -> None:
    cache = FetchSessionCache()
    ctx = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(p) for p in range(4)]))
    assert [p.partition for p in ctx.partitions] == [0, 1, 2, 3]  # a full fetch reads all
    session = ctx.watched
    assert session is not None
    results = [ok(p, hw=5, idle=p.partition != 1) for p in ctx.partitions]
    session.note_read(results)  # 1 is not idle (behind, or outside the ISR): read again
    ctx.answer(results)
    sid = ctx.session_id

    ctx = ctx_of(cache.new_context(FOLLOWER, sid, 1, []))
    assert [p.partition for p in ctx.partitions] == [1]
    assert ctx.answer([ok(p, hw=5) for p in ctx.partitions]) == []

    # What the broker marked changed, and what is listed, in session order.
    assert session.mark(("t", 3)) and session.mark(("t", 0))
    assert not session.mark(("t", 9))  # not in the session
    ctx = ctx_of(cache.new_context(FOLLOWER, sid, 2, [fp(2, offset=4)]))
    assert [p.partition for p in ctx.partitions] == [0, 1, 2, 3]
    results = [ok(p, hw=5, idle=True) for p in ctx.partitions]
    results[3] = ok(ctx.partitions[3], hw=5, nbytes=10)  # 3 got records: to the back
    session.note_read(results)
    assert [r.partition for r in ctx.answer(results)] == [2, 3]

    # Forgotten and errored partitions leave the changed set with the session.
    session.mark(("t", 0))
    ctx = ctx_of(cache.new_context(FOLLOWER, sid, 3, [], [("t", 3)]))
    assert [p.partition for p in ctx.partitions] == [0]
    ctx.answer([FetchPartitionResult("t", 0, NOT_LEADER)])
    assert session.changed == set()
    ctx = ctx_of(cache.new_context(FOLLOWER, sid, 4, [fp(3), fp(1)]))
    assert [p.partition for p in ctx.partitions] == [1, 3]
    # A closed session takes no marks, and the cache hands it over for unwatching.
    assert cache.take_closed() == []
    ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(1)]))  # replaces it
    assert cache.take_closed() == [session] and not session.mark(("t", 1))


def test_listed_and_forgotten_partitions_update_the_session() -> None:
    cache = FetchSessionCache()
    ctx = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0), fp(1)]))
    ctx.answer([ok(p) for p in ctx.partitions])
    ctx = ctx_of(cache.new_context(CONSUMER, ctx.session_id, 1, [fp(2)], [("t", 0)]))
    assert [p.partition for p in ctx.partitions] == [1, 2]
    # A new partition's first answer always goes out (the client knows nothing of it).
    assert [r.partition for r in ctx.answer([ok(p) for p in ctx.partitions])] == [2]


def test_an_errored_partition_leaves_the_session() -> None:
    cache = FetchSessionCache()
    ctx = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(0), fp(1)]))
    p0, p1 = ctx.partitions
    error = FetchPartitionResult("t", 1, NOT_LEADER)
    assert ctx.watched is not None
    ctx.watched.note_read([ok(p0), error])  # neither idle: both read again if still held
    assert ctx.answer([ok(p0), error]) == [ok(p0), error]
    ctx = ctx_of(cache.new_context(FOLLOWER, ctx.session_id, 1, []))
    assert [p.partition for p in ctx.partitions] == [0]


def test_session_errors() -> None:
    cache = FetchSessionCache()
    ctx = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(0)]))
    sid = ctx.session_id
    assert cache.new_context(FOLLOWER, sid + 1, 1, []) == FETCH_SESSION_ID_NOT_FOUND
    assert cache.new_context(CONSUMER, sid, 1, []) == FETCH_SESSION_ID_NOT_FOUND  # not its own
    assert cache.new_context(FOLLOWER, sid, 2, []) == INVALID_FETCH_SESSION_EPOCH
    assert cache.new_context(FOLLOWER, 0, 1, []) == INVALID_FETCH_SESSION_EPOCH
    ctx_of(cache.new_context(FOLLOWER, sid, 1, []))
    # The same epoch again (a resent request): refused, the client starts over.
    assert cache.new_context(FOLLOWER, sid, 1, []) == INVALID_FETCH_SESSION_EPOCH


def test_final_epoch_is_a_sessionless_full_fetch_and_closes_the_session() -> None:
    cache = FetchSessionCache()
    sid = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)])).session_id
    ctx = ctx_of(cache.new_context(CONSUMER, sid, FINAL_EPOCH, [fp(0), fp(0, topic="u")]))
    assert ctx.session_id == 0 and not ctx.incremental and len(ctx.partitions) == 2
    assert len(cache) == 0
    results = [ok(p) for p in ctx.partitions]
    assert ctx.answer(results) == results


def test_a_followers_new_session_replaces_its_old_one() -> None:
    cache = FetchSessionCache()
    old = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(0)])).session_id
    new = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(0)])).session_id
    assert new != old and len(cache) == 1 and cache.get(old) is None


def test_the_cache_is_bounded_evicting_consumers_least_recently_used_first() -> None:
    cache = FetchSessionCache(max_slots=3, rng=random.Random(1))
    follower = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(0)])).session_id
    c1 = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)])).session_id
    c2 = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)])).session_id
    ctx_of(cache.new_context(CONSUMER, c1, 1, [], now_ms=1))  # c2 is now the LRU consumer
    later = cache.min_eviction_ms  # c2 idle that long: evictable (test below)
    c3 = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)], now_ms=later)).session_id
    assert len(cache) == 3 and cache.evictions == 1
    assert cache.get(c2) is None and cache.get(c1) and cache.get(c3) and cache.get(follower)
    assert cache.new_context(CONSUMER, c2, 1, []) == FETCH_SESSION_ID_NOT_FOUND

    # Only followers left: a consumer gets no session (a sessionless full fetch), a
    # follower evicts the least recently used follower.
    full = FetchSessionCache(max_slots=2)
    f2 = ctx_of(full.new_context(2, 0, INITIAL_EPOCH, [fp(0)])).session_id
    f3 = ctx_of(full.new_context(3, 0, INITIAL_EPOCH, [fp(0)])).session_id
    assert ctx_of(full.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)])).session_id == 0
    f4 = ctx_of(full.new_context(4, 0, INITIAL_EPOCH, [fp(0)])).session_id
    assert full.get(f2) is None and full.get(f3) and full.get(f4)


def test_a_consumer_does_not_evict_a_session_in_use() -> None:
    """More consumers than slots: a new consumer must not evict one fetching right now
    (that one's next fetch is refused, its full fetch evicts the next, and so on: every
    fetch of every consumer becomes a refusal and a full fetch, worse than no sessions).
    It fetches without a session until some session has been idle for
    ``min_eviction_ms`` (Kafka: 2 minutes)."""
    cache = FetchSessionCache(max_slots=2, rng=random.Random(1), min_eviction_ms=1000)
    c1 = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)], now_ms=0)).session_id
    c2 = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)], now_ms=0)).session_id
    ctx_of(cache.new_context(CONSUMER, c1, 1, [], now_ms=500))
    late = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)], now_ms=999))
    assert late.session_id == 0 and cache.get(c1) and cache.get(c2) and cache.evictions == 0
    # c2 idle for min_eviction_ms: it goes (the least recently used), c1 stays.
    c3 = ctx_of(cache.new_context(CONSUMER, 0, INITIAL_EPOCH, [fp(0)], now_ms=1000)).session_id
    assert c3 and cache.get(c2) is None and cache.get(c1) and cache.evictions == 1
    # A follower still evicts a consumer in use (replication depends on its session).
    f = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(0)], now_ms=1000)).session_id
    assert f and len(cache) == 2 and cache.evictions == 2


def test_zero_slots_disables_sessions() -> None:
    cache = FetchSessionCache(max_slots=0)
    ctx = ctx_of(cache.new_context(FOLLOWER, 0, INITIAL_EPOCH, [fp(0)]))
    assert ctx.session_id == 0 and len(cache) == 0


# -- the client's builder ---------------------------------------------------------------------


def row(partition: int, offset: int = 0) -> m.FetchPartition:
    return m.FetchPartition(partition, offset, 0, 0, -1, 1 << 20)


def response(session_id: int, *errored: int, error_code: int = 0) -> m.FetchResponse:
    rows = [m.FetchPartitionResult(p, NOT_LEADER, -1, -1, -1, None, -1, 0) for p in errored]
    return m.FetchResponse([m.FetchTopicResult("t", rows)], 0, error_code, session_id)


BUILDER_STEP = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 5), st.integers(0, 3)),  # want, or move
    st.tuples(st.just("drop"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("fetch"), st.integers(-1, 5), st.just(0)),  # -1: no error
    st.tuples(st.just("refused"), st.just(0), st.just(0)),  # a session error
    st.tuples(st.just("reset"), st.just(0), st.just(0)),
)


def _request_of(s: object) -> tuple[int, int, set, set]:
    assert isinstance(s, tuple)
    session_id, epoch, topics, forgotten = s
    rows = {(t.topic, p) for t in topics for p in t.partitions}
    gone = {(t.topic, p) for t in forgotten for p in t.partitions}
    return session_id, epoch, rows, gone


@settings(max_examples=200, deadline=None)
@given(st.lists(BUILDER_STEP, max_size=40))
def test_build_changes_asks_what_build_asks(steps: list[tuple[str, int, int]]) -> None:
    """A caller that names what changed since its last answered request (the rows it
    set or dropped, and the partitions the last answer carried an error for) gets the
    request ``build`` gets by comparing every row (a follower's fetcher keeps its rows
    and names only those)."""
    full, delta = FetchSessionBuilder(), FetchSessionBuilder()
    wanted: dict[tuple[str, int], m.FetchPartition] = {}
    changed: set[tuple[str, int]] = set()
    for what, p, n in steps:
        key = ("t", p)
        if what == "set":
            wanted[key] = row(p, n)
            changed.add(key)
        elif what == "drop":
            wanted.pop(key, None)
            changed.add(key)
        elif what == "reset":
            full.reset()
            delta.reset()
        else:
            a = full.build(dict(wanted))
            b = delta.build_changes(wanted, changed)
            changed = set()
            assert _request_of(a) == _request_of(b)
            if what == "refused":
                answer = response(a.session_id, error_code=FETCH_SESSION_ID_NOT_FOUND)
            else:
                errored = (p,) if p >= 0 and key in wanted else ()
                answer = response(a.session_id or 7, *errored)
                changed.update(("t", e) for e in errored)
            assert full.on_response(answer) == delta.on_response(answer)


def test_builder_lists_only_changes_after_the_first_full_fetch() -> None:
    b = FetchSessionBuilder()
    wanted = {("t", p): row(p) for p in range(3)}
    first = b.build(wanted)
    assert first.full and first.listed == 3 and first.session_id == 0
    assert b.on_response(response(42))
    idle = b.build(dict(wanted))
    assert (idle.session_id, idle.session_epoch, idle.listed, idle.forgotten) == (42, 1, 0, [])
    assert b.on_response(response(42))
    changed = {("t", 0): row(0, offset=5), ("t", 1): row(1), ("t", 3): row(3)}
    req = b.build(changed)
    assert req.session_epoch == 2
    assert [p.partition for t in req.topics for p in t.partitions] == [0, 3]
    assert req.forgotten == [m.ForgottenTopic("t", [2])]


def test_builder_relists_a_partition_answered_with_an_error() -> None:
    b = FetchSessionBuilder()
    wanted = {("t", p): row(p) for p in range(2)}
    b.build(wanted)
    assert b.on_response(response(7, 1))
    req = b.build(dict(wanted))
    assert [p.partition for t in req.topics for p in t.partitions] == [1]


def test_builder_starts_over_after_a_session_error_or_a_reset() -> None:
    b = FetchSessionBuilder()
    wanted = {("t", 0): row(0)}
    b.build(wanted)
    b.on_response(response(7))
    b.build(wanted)
    assert not b.on_response(response(0, error_code=FETCH_SESSION_ID_NOT_FOUND))
    again = b.build(wanted)
    assert again.full and again.session_id == 0 and again.listed == 1
    b.on_response(response(8))
    b.build(wanted)
    b.reset()  # e.g. the connection broke with the request out
    closing = b.build(wanted)
    assert closing.full and closing.session_id == 8  # closes 8 at the broker, opens anew


def test_builder_without_a_session_from_the_broker_keeps_fetching_in_full() -> None:
    b = FetchSessionBuilder()
    wanted = {("t", 0): row(0)}
    b.build(wanted)
    assert b.on_response(response(0))  # the broker's cache was full
    assert b.build(wanted).full


# -- both halves against a model: incremental answers == full answers -------------------------


@dataclass
class PartitionModel:
    hw: int = 0
    log_start: int = 0
    log_end: int = 0
    error: bool = False

    def read(self, p: FetchPartition) -> FetchPartitionResult:
        if self.error:
            return FetchPartitionResult(p.topic, p.partition, NOT_LEADER)
        nbytes = max(0, self.log_end - p.fetch_offset)
        return ok(p, self.hw, self.log_start, nbytes, idle=nbytes == 0)


def _to_broker(topic: str, r: m.FetchPartition) -> FetchPartition:
    return FetchPartition(
        topic,
        r.partition,
        r.fetch_offset,
        r.last_fetched_epoch,
        r.current_leader_epoch,
        r.partition_max_bytes,
    )


def _wire(r: FetchPartitionResult) -> m.FetchPartitionResult:
    return m.FetchPartitionResult(
        r.partition, r.error_code, r.high_watermark, r.high_watermark, r.log_start_offset,
        None, r.preferred_read_replica, r.nbytes,
    )  # fmt: skip


FETCH = st.tuples(st.just("fetch"), st.just(0), st.just(0))
STEP = st.one_of(
    FETCH,  # fetches as often as all changes together
    FETCH,
    FETCH,
    st.tuples(st.just("append"), st.integers(0, 5), st.integers(1, 3)),
    st.tuples(st.just("hw"), st.integers(0, 5), st.integers(1, 3)),
    st.tuples(st.just("start"), st.integers(0, 5), st.integers(0, 2)),
    st.tuples(st.just("error"), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("want"), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("evict"), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
    st.tuples(st.just("lose"), st.just(0), st.just(0)),  # the broker answers, the client
    # never gets it (a broken connection, a timeout): it resets
    st.tuples(st.just("seek"), st.integers(0, 5), st.integers(0, 3)),  # may be a no-op
    st.tuples(st.just("wrap"), st.just(0), st.just(0)),  # epochs about to wrap
)


@settings(max_examples=200, deadline=None)
@given(st.lists(STEP, max_size=60), st.sampled_from([FOLLOWER, CONSUMER]))
def test_incremental_answers_tell_the_client_what_full_fetches_would(
    steps: list[tuple[str, int, int]], replica_id: int
) -> None:
    model = {p: PartitionModel() for p in range(6)}
    wanted = set(range(4))
    positions = {p: 0 for p in range(6)}
    known: dict[int, tuple[int, int]] = {}  # what the client learnt: partition -> (hw, start)
    cache = FetchSessionCache(max_slots=2, rng=random.Random(0))
    builder = FetchSessionBuilder()

    def fetch(lose: bool = False) -> None:
        rows = {("t", p): row(p, positions[p]) for p in sorted(wanted)}
        full = {p: model[p].read(_to_broker("t", r)) for (_, p), r in rows.items()}
        for _attempt in range(2):  # a session error is followed by a full fetch at once
            req = builder.build(rows)
            listed = [_to_broker(t.topic, r) for t in req.topics for r in t.partitions]
            forgotten = [(t.topic, p) for t in req.forgotten for p in t.partitions]
            context = cache.new_context(
                replica_id, req.session_id, req.session_epoch, listed, forgotten
            )
            if lose:
                if not isinstance(context, int):
                    read = [model[p.partition].read(p) for p in context.partitions]
                    if context.watched is not None:
                        context.watched.note_read(read)
                    context.answer(read)
                builder.reset()
                return
            if isinstance(context, int):
                assert not builder.on_response(m.FetchResponse([], error_code=context))
                continue
            read = [model[p.partition].read(p) for p in context.partitions]
            if context.watched is not None:  # as the broker does after a first read
                context.watched.note_read(read)
            answered = context.answer(read)
            wire = m.FetchTopicResult("t", [_wire(r) for r in answered])
            assert builder.on_response(m.FetchResponse([wire], session_id=context.session_id))
            break
        else:
            raise AssertionError("a full fetch after a session error must succeed")
        by_partition = {r.partition: r for r in answered}
        assert by_partition.keys() <= wanted
        assert {p.partition for p in listed} <= by_partition.keys()  # listed: answered
        for p in wanted:
            expected = full[p]
            got = by_partition.get(p)
            if expected.error_code or expected.records is not None:
                assert got == expected  # errors and data always go out, unchanged
            if got is not None:
                assert got == expected
                if got.error_code:
                    known.pop(p, None)
                    continue
                known[p] = (got.high_watermark, got.log_start_offset)
                positions[p] += got.nbytes  # the model's "bytes" are offsets
            assert known[p] == (expected.high_watermark, expected.log_start_offset)

    def changed(p: int) -> None:
        """What Replica.wake does: mark the partition in the client's session."""
        session = cache.get(builder.session_id)
        if session is not None:
            session.mark(("t", p))

    for what, p, n in steps:
        part = model[p]
        if what in ("append", "hw", "start", "error"):
            changed(p)
        if what == "append":
            part.log_end += n
        elif what == "hw":
            part.hw = min(part.log_end, part.hw + n)
        elif what == "start":
            part.log_start = min(part.hw, part.log_start + n)
            positions[p] = max(positions[p], part.log_start)
        elif what == "error":
            part.error = bool(n)
        elif what == "want":
            # The client keeps what it learnt (a follower's core, a consumer's position):
            # wanted again before the next fetch, the partition was never forgotten at
            # the broker, and its unchanged high watermark is not sent again.
            (wanted.add if n else wanted.discard)(p)
        elif what == "evict":  # other clients take every slot
            for other in (8, 9):  # followers: they evict consumers and followers alike
                cache.new_context(other, 0, INITIAL_EPOCH, [])
        elif what == "restart":
            cache = FetchSessionCache(max_slots=2, rng=random.Random(1))
        elif what == "lose":
            fetch(lose=True)
        elif what == "seek":
            positions[p] = min(part.log_end, part.log_start + n)
        elif what == "wrap":
            session = cache.get(builder.session_id)
            if session is not None and session.epoch == builder.epoch:
                session.epoch = builder.epoch = MAX_EPOCH
        else:
            fetch()
    fetch()
