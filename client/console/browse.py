"""Reading one partition for the Messages page: which offsets a page covers, how a key
or value is shown, how a search walks the log, and the one shared reader that fetches a
bounded range.

Every read is bounded twice: by offsets (a page is at most ``limit`` offsets, a search
scans at most ``SCAN_OFFSETS``) and by bytes (``PAGE_BYTES``, ``SCAN_BYTES``), so a page
view costs the same on a partition of ten records as on one of a billion. The reader
talks Fetch straight to the partition's leader (no consumer, no fetch-ahead): one
request per ``FETCH_BYTES`` of log, all through one shared metadata client.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from rillet.client.consumer import ConsumerRecord, TopicPartition, decode_records
from rillet.client.metadata import NO_LEADER, MetadataClient
from rillet.client.wire import messages as m
from rillet.client.wire.errors import LeaderNotAvailableError, RilletError, error_for

NEWEST, OLDEST, OFFSET, TIMESTAMP = "newest", "oldest", "offset", "timestamp"
STARTS = (NEWEST, OLDEST, OFFSET, TIMESTAMP)
DESC, ASC = "desc", "asc"  # newest first, oldest first
TEXT, JSON, HEX = "text", "json", "hex"
FORMATS = (TEXT, JSON, HEX)

PAGE_LIMIT = 50
MAX_LIMIT = 500
PAGE_BYTES = 4 * 1024 * 1024
"""What one page may fetch in all; a page of huge records ends early and says so."""
FETCH_BYTES = 1024 * 1024
SCAN_OFFSETS = 10_000
"""How far one search step looks before it stops and offers to continue."""
SCAN_BYTES = 32 * 1024 * 1024
SHOWN_BYTES = 8 * 1024
"""How much of one key or value a page shows (the rest is counted, not sent)."""
READ_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Window:
    """The offsets [lo, hi) a page covers, inside the log [start, end)."""

    lo: int
    hi: int

    @property
    def empty(self) -> bool:
        return self.hi <= self.lo


# Which end of a page its anchor is: the page runs from the anchor up, or up to and
# including it. The order shown picks the default (oldest first: from; newest first:
# to); the older/newer links name it, so the next page starts right past this one.
FROM, TO = "from", "to"
SIDES = (FROM, TO)


def side_for(order: str, side: str = "") -> str:
    return side if side in SIDES else (FROM if order == ASC else TO)


def window(order: str, anchor: int, start: int, end: int, limit: int, side: str = "") -> Window:
    """``limit`` offsets from ``anchor`` on, or up to and including it (by default
    oldest first reads from it, newest first up to it). Clamped into the log."""
    if side_for(order, side) == FROM:
        lo = max(anchor, start)
        return Window(lo, max(lo, min(end, lo + limit)))
    hi = min(end, anchor + 1)
    return Window(max(start, hi - limit), max(start, hi))


def anchor_for(start_at: str, order: str, start: int, end: int, limit: int) -> int:
    """Where ``newest``/``oldest`` put the anchor for the order shown."""
    if start_at == OLDEST:
        return start if order == ASC else start + limit - 1
    # newest: the last record, or (oldest first) the first of the last page
    return end - 1 if order == DESC else max(start, end - limit)


def older_page(shown: Window) -> tuple[int, str]:
    """The anchor and side of the page just before ``shown``: up to its first offset."""
    return shown.lo - 1, TO


def newer_page(shown: Window) -> tuple[int, str]:
    """The anchor and side of the page just after ``shown``: from its end on."""
    return shown.hi, FROM


def scan_chunks(order: str, anchor: int, start: int, end: int, chunk: int) -> Iterable[Window]:
    """The windows a search reads, in the order shown, up to ``SCAN_OFFSETS`` offsets."""
    budget = SCAN_OFFSETS
    while budget > 0:
        w = window(order, anchor, start, end, min(chunk, budget))
        if w.empty:
            return
        yield w
        budget -= w.hi - w.lo
        anchor = w.hi if order == ASC else w.lo - 1


def show(data: bytes | None, fmt: str) -> tuple[str, int]:
    """A key or value as text, pretty JSON (when it parses; else text) or hex; with the
    number of bytes left out (past ``SHOWN_BYTES``)."""
    if data is None:
        return "", 0
    hidden = max(0, len(data) - SHOWN_BYTES)
    head = data[:SHOWN_BYTES]
    if fmt == HEX:
        return head.hex(" "), hidden
    text = head.decode("utf-8", "replace")
    if fmt == JSON and not hidden:
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False), 0
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            pass
    return text, hidden


def matches(record: ConsumerRecord, needle: str) -> bool:
    """Substring of the key or the value as text, ignoring case."""
    n = needle.lower()
    return any(
        b is not None and n in b.decode("utf-8", "replace").lower()
        for b in (record.key, record.value)
    )


def header_pairs(headers: Any) -> list[tuple[str, str]]:
    return [
        (str(k), "" if v is None else bytes(v).decode("utf-8", "replace")) for k, v in headers or ()
    ]


@dataclass(slots=True)
class Read:
    """What a bounded read returned: records in offset order, the offsets it covered
    [lo, next_offset) (all of them read, even where compaction left no record), and
    whether the byte cap cut it short."""

    records: list[ConsumerRecord]
    next_offset: int
    nbytes: int = 0
    capped: bool = False
    lo: int = 0

    @property
    def covered(self) -> Window:
        return Window(self.lo, self.next_offset)


class PartitionReader:
    """Fetches bounded offset ranges from partition leaders for every page view, over
    one shared metadata client opened on first use (a console service)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._meta: MetadataClient | None = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        if self._meta is not None:
            await self._meta.close()
            self._meta = None

    def _client(self) -> MetadataClient:
        if self._meta is None:
            self._meta = MetadataClient(
                self.bootstrap, client_id="rillet-console", request_timeout_ms=5_000
            )
        return self._meta

    async def read(
        self, topic: str, partition: int, w: Window, max_bytes: int, side: str = FROM
    ) -> Read:
        """The records of [w.lo, w.hi), at most about ``max_bytes`` of batches fetched.
        A cap keeps the anchored end: reading ``FROM`` keeps the oldest records, ``TO``
        the newest; ``covered`` says which offsets were read."""
        if side == TO:
            return await self._read_down(topic, partition, w, max_bytes)
        return await self._read_up(topic, partition, w, max_bytes)

    async def _read_up(
        self, topic: str, partition: int, w: Window, max_bytes: int, fetch_bytes: int = FETCH_BYTES
    ) -> Read:
        out: list[ConsumerRecord] = []
        offset, fetched = w.lo, 0
        while offset < w.hi:
            if fetched >= max_bytes:
                return Read(out, offset, fetched, capped=True, lo=w.lo)
            recs, next_offset, nbytes = await self._fetch(
                topic, partition, offset, min(fetch_bytes, max_bytes - fetched)
            )
            fetched += nbytes
            out += [r for r in recs if r.offset < w.hi]
            if next_offset <= offset:  # nothing more below the high watermark
                break
            offset = next_offset
        return Read(out, min(offset, w.hi), fetched, lo=w.lo)

    async def _read_down(self, topic: str, partition: int, w: Window, max_bytes: int) -> Read:
        """Fetch only reads upward, so walk down from w.hi in steps, each sized by the
        bytes per offset seen so far to fit what is left of the budget, and each fetch
        asks for about that much (the first for one batch), not for what lies above the
        step. A step the cap cuts short is dropped (it would leave a hole), unless it is
        the only one."""
        out: list[ConsumerRecord] = []
        lo, fetched, step, per_offset = w.hi, 0, 1, 0
        while lo > w.lo:
            left = max_bytes - fetched
            if left <= 0:
                return Read(out, w.hi, fetched, capped=True, lo=lo)
            part = Window(max(w.lo, lo - step), lo)
            # A fetch always brings at least one whole batch, so 1 asks for just that.
            ask = min(FETCH_BYTES, max(1, (part.hi - part.lo) * per_offset))
            got = await self._read_up(topic, partition, part, left, ask)
            fetched += got.nbytes
            if got.next_offset < part.hi:  # cut short (or the log ended under us)
                if out:
                    return Read(out, w.hi, fetched, capped=True, lo=lo)
                return Read(got.records, got.next_offset, fetched, capped=True, lo=part.lo)
            out = got.records + out
            lo = part.lo
            per_offset = max(1, fetched // (w.hi - lo))
            step = max(1, (max_bytes - fetched) * 3 // 4 // per_offset)
        return Read(out, w.hi, fetched, lo=w.lo)

    async def scan(
        self, topic: str, partition: int, order: str, chunks: Iterable[Window], max_bytes: int
    ) -> AsyncIterator[tuple[Window, Read]]:
        """Read each window in turn while the byte budget lasts; newest first reads each
        downward, so a cap stops the search at a point it can say."""
        left = max_bytes
        side = side_for(order)
        for w in chunks:
            if left <= 0:
                return
            got = await self.read(topic, partition, w, left, side)
            left -= got.nbytes
            yield w, got
            if got.capped:
                return

    async def _fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[list[ConsumerRecord], int, int]:
        """One Fetch at ``offset``; retried through leader moves for a few seconds."""
        meta = self._client()
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            try:
                await meta.wait_for_topics([topic], 5_000)
                return await self._fetch_once(meta, topic, partition, offset, max_bytes)
            except RilletError as e:
                if not e.retriable or time.monotonic() >= deadline:
                    raise
                meta.request_update()
            await asyncio.sleep(0.1)

    async def _fetch_once(
        self, meta: MetadataClient, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[list[ConsumerRecord], int, int]:
        snap = meta.snapshot
        parts = snap.topics[topic]
        if not 0 <= partition < len(parts):
            raise error_for(3, f"topic {topic!r} has no partition {partition}")
        leader = snap.leader_for(topic, partition)
        if leader == NO_LEADER:
            raise LeaderNotAvailableError(f"{topic}-{partition} has no leader")
        fp = m.FetchPartition(
            partition=partition,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            current_leader_epoch=parts[partition].leader_epoch,
            log_start_offset=-1,
            partition_max_bytes=max_bytes,
        )
        # No wait and no session: a page read answers with what is there now.
        request = m.FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=max_bytes,
            topics=[m.FetchTopic(topic, [fp])],
        )
        conn = await meta.connection(leader)
        response, payload = await conn.call(request, raise_errors=False)
        if response.error_code:
            raise error_for(response.error_code, f"fetch {topic}-{partition}")
        for t in response.topics:
            for r in t.partitions:
                if r.error_code:
                    raise error_for(r.error_code, f"fetch {topic}-{partition} at {offset}")
                data = payload[: r.nbytes]
                if not data:
                    return [], offset, 0
                recs, next_offset = decode_records(TopicPartition(topic, partition), data, offset)
                return recs, next_offset, r.nbytes
        return [], offset, 0
