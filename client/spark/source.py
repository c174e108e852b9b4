"""The ``rillet`` PySpark data source (docs/spark.md): batch read, write, stream read.

Register it once per session, then use it like Spark's Kafka source::

    from rillet.client.spark.source import register
    register(spark)
    df = (spark.read.format("rillet").option("bootstrap", "127.0.0.1:9092")
          .option("topic", "events").load())

Reading: the driver asks each partition leader for its offsets (ListOffsets) and plans
one Spark input partition per topic-partition offset range ``[start, end)``, cut into
pieces of ``maxRecordsPerPartition`` when that option is set. Each Spark task opens its
own client inside ``read()`` (clients are not picklable and must not outlive the task),
fetches exactly its range from the leader and yields Arrow record batches, so no Python
object is built per record. Reads stop at the high watermark: only committed records.

Writing: each task produces its rows through the rillet producer and returns a commit
message only after ``flush()`` saw every send acknowledged; any failure fails the task.
The streaming sink (``writeStream.format("rillet")``) does the same per micro-batch:
at-least-once, since a retried task or a micro-batch re-run after a restart from its
checkpoint sends its rows again (docs/spark.md, "Stream write").

Streaming: the source offset is ``{"<partition>": next offset}`` (JSON keys are strings),
so Spark's checkpoint records exactly where each partition stopped and a restarted
query resumes there, skipping and repeating nothing.

pyspark (>= 4.1, for the Arrow stream writer) and pyarrow are the optional extra
``rillet[spark]``; importing this module without them raises ImportError saying what
to install.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rillet.client.metadata import NO_LEADER, MetadataClient
from rillet.client.partitioner import partition_for_key
from rillet.client.producer import Producer
from rillet.client.wire import messages as m
from rillet.client.wire import records
from rillet.client.wire.errors import (
    OffsetOutOfRangeError,
    RilletError,
    UnknownTopicOrPartitionError,
    error_for,
    is_retriable,
)

MISSING_SPARK = (
    "the rillet Spark data source needs pyspark>=4.1 and pyarrow: "
    "pip install 'rillet[spark]' (and Java 17 on the machine)"
)
try:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.types import StructType
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(MISSING_SPARK) from e

log = logging.getLogger(__name__)
T = TypeVar("T")

SOURCE_NAME = "rillet"
SCHEMA_DDL = (
    "topic string, partition int, offset bigint, timestamp timestamp, key binary, "
    "value binary, headers array<struct<key: string, value: binary>>"
)
EARLIEST = -2  # ListOffsets' special timestamps, also accepted in offsets JSON
LATEST = -1
FETCH_MAX_BYTES = 8 * 1024 * 1024
TOPIC_WAIT_MS = 15_000  # a topic must exist (with leaders) within this long
REQUEST_DEADLINE_S = 60.0  # how long one range read keeps retrying leader changes
RETRY_BACKOFF_S = 0.05  # the first pause before a retry, doubled up to the max
RETRY_BACKOFF_MAX_S = 1.0

HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(HEADER_TYPE)),
    ]
)


# --- options and planning (pure) ---------------------------------------------------


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[start, end)`` of one topic-partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


class RangePartition(InputPartition):
    """The picklable plan a Spark task receives; ``value`` is an ``OffsetRange``."""

    def __init__(self, value: OffsetRange) -> None:
        super().__init__(value)


def parse_offsets(text: str | None, topic: str, default: str) -> str | dict[int, int]:
    """``"earliest"``, ``"latest"``, or per-partition JSON, as Spark's Kafka source takes.

    JSON may be ``{"0": 12, "1": -2}`` or nested under the topic, ``{"T": {"0": 12}}``;
    -2 means earliest and -1 latest. Returns the keyword or ``{partition: offset}``.
    """
    text = (text or default).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"offsets must be earliest, latest or JSON, not {text!r}") from e
    if isinstance(spec, dict) and topic in spec and isinstance(spec[topic], dict):
        spec = spec[topic]
    if not isinstance(spec, dict):
        raise ValueError(f"offsets JSON must map partition -> offset, not {text!r}")
    try:
        return {int(p): int(o) for p, o in spec.items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"offsets JSON must map partition -> offset, not {text!r}") from e


def resolve(
    spec: str | dict[int, int],
    default: str,
    earliest: dict[int, int],
    latest: dict[int, int],
) -> dict[int, int]:
    """Concrete offsets for every partition; partitions missing from JSON get ``default``."""
    known = {"earliest": earliest, "latest": latest}
    base = known[spec] if isinstance(spec, str) else known[default]
    out = dict(base)
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - set(earliest))
        if unknown:
            raise ValueError(f"offsets name partitions the topic does not have: {unknown}")
        for p, o in spec.items():
            out[p] = earliest[p] if o == EARLIEST else latest[p] if o == LATEST else o
    return out


def plan_ranges(
    topic: str,
    start: dict[int, int],
    end: dict[int, int],
    *,
    earliest: dict[int, int] | None = None,
    latest: dict[int, int] | None = None,
    max_records: int | None = None,
    fail_on_data_loss: bool = True,
) -> list[OffsetRange]:
    """One range per partition with records, split into ``max_records`` pieces.

    ``end`` is clamped to ``latest`` (the high watermark: nothing beyond it is readable).
    A ``start`` below ``earliest`` means records were deleted (retention) before we
    read them: an error by default, since a verifier would otherwise miss it.
    """
    if max_records is not None and max_records <= 0:
        raise ValueError("maxRecordsPerPartition must be > 0")
    ranges: list[OffsetRange] = []
    for p in sorted(start):
        lo, hi = start[p], end.get(p, start[p])
        if latest is not None:
            hi = min(hi, latest[p])
        if earliest is not None and lo < earliest[p]:
            if fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"{topic}-{p}: start offset {lo} is below the log start {earliest[p]} "
                    "(records deleted); set failOnDataLoss=false to skip them"
                )
            lo = earliest[p]
        step = max_records or max(hi - lo, 1)
        for s in range(lo, hi, step):
            ranges.append(OffsetRange(topic, p, s, min(s + step, hi)))
    return ranges


def stream_offset(offsets: dict[int, int]) -> dict[str, int]:
    """A streaming source offset: JSON needs string keys, sorted for stable checkpoints."""
    return {str(p): offsets[p] for p in sorted(offsets)}


def parse_stream_offset(offset: dict[str, int]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offset.items()}


@dataclass
class SourceOptions:
    """The options of one ``format("rillet")`` reader or writer, checked once."""

    bootstrap: str
    topic: str
    starting: str | dict[int, int] = "earliest"
    ending: str | dict[int, int] = "latest"
    starting_ts: int | None = None
    ending_ts: int | None = None
    max_records: int | None = None
    fail_on_data_loss: bool = True
    acks: str = "all"
    producer: dict[str, Any] = field(default_factory=dict)
    report_path: str | None = None

    @classmethod
    def parse(cls, options: dict[str, str], *, streaming: bool = False) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        topic = opts.get("topic") or opts.get("path")
        if not topic:
            raise ValueError("the rillet data source needs .option('topic', ...)")
        start_default = "latest" if streaming else "earliest"
        max_records = opts.get("maxrecordsperpartition")
        return cls(
            bootstrap=opts.get("bootstrap") or opts.get("bootstrap.servers") or "127.0.0.1:9092",
            topic=topic,
            starting=parse_offsets(opts.get("startingoffsets"), topic, start_default),
            ending=parse_offsets(opts.get("endingoffsets"), topic, "latest"),
            starting_ts=_opt_int(opts.get("startingtimestamp")),
            ending_ts=_opt_int(opts.get("endingtimestamp")),
            max_records=_opt_int(max_records),
            fail_on_data_loss=opts.get("failondataloss", "true").lower() != "false",
            acks=opts.get("acks", "all"),
            producer=_producer_options(opts),
            report_path=opts.get("reportpath"),
        )


def _opt_int(text: str | None) -> int | None:
    return None if text is None or text == "" else int(text)


# Writer options passed on to the Producer, by their Spark option name (lower case).
PRODUCER_OPTIONS = {
    "lingerms": ("linger_ms", float),
    "batchsize": ("batch_size", int),
    "compression": ("compression", str),
    "maxinflight": ("max_in_flight", int),
    "maxinflightperpartition": ("max_in_flight_per_partition", int),
    "deliverytimeoutms": ("delivery_timeout_ms", int),
    "requesttimeoutms": ("request_timeout_ms", int),
}


def _producer_options(opts: dict[str, str]) -> dict[str, Any]:
    return {name: conv(opts[k]) for k, (name, conv) in PRODUCER_OPTIONS.items() if k in opts}


# --- talking to the cluster (runs on the driver and in Spark's Python workers) ----


def run_with_client(bootstrap: str, fn: Callable[[MetadataClient], Awaitable[T]]) -> T:
    """Run ``fn(client)`` on a fresh event loop with a fresh client, then close both.

    Spark calls the data source from plain threads and worker processes with no loop;
    one loop per call keeps no client alive between calls (nothing to leak or pickle).
    """

    async def main() -> T:
        meta = MetadataClient(bootstrap, client_id="rillet-spark")
        try:
            return await fn(meta)
        finally:
            await meta.close()

    return asyncio.run(main())


async def leader_request(
    meta: MetadataClient,
    topic: str,
    partition: int,
    message: m.FetchRequest | m.ListOffsetsRequest,
    *,
    deadline_s: float = REQUEST_DEADLINE_S,
) -> tuple[Any, memoryview]:
    """Send a one-partition Fetch or ListOffsets to its leader, following leader changes.

    Returns ``(partition result, payload)``; retriable errors (no leader, not leader,
    broken connection) refresh metadata and try again until ``deadline_s`` passes.
    """
    meta.add_topics([topic])
    deadline = time.monotonic() + deadline_s
    backoff = RETRY_BACKOFF_S
    while True:
        try:
            snap = await meta.refresh()
            code = snap.topic_errors.get(topic)
            if code is not None and not is_retriable(code):
                raise error_for(code, f"topic {topic!r}")
            leader = snap.leader_for(topic, partition)
            if leader == NO_LEADER:
                raise UnknownTopicOrPartitionError(f"{topic}-{partition} has no leader yet")
            conn = await meta.connection(leader)
            response, body = await conn.call(message)
            result = response.topics[0].partitions[0]
            if result.error_code:
                raise error_for(result.error_code, f"{topic}-{partition}")
            return result, body
        except RilletError as e:
            if not e.retriable or time.monotonic() > deadline:
                raise
            meta.request_update()
            # A leader whose answer is "not yet" (OFFSET_NOT_AVAILABLE, a new leader's
            # HW catching up) answers at once: without a pause this would be a busy loop.
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)


async def check_topic(meta: MetadataClient, topic: str) -> None:
    """A missing topic fails at once (rather than after a metadata wait), so a typo in
    an option is reported quickly."""
    meta.add_topics([topic])
    snap = await meta.refresh(force=True)
    if snap.topic_errors.get(topic) == UnknownTopicOrPartitionError.code:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")


async def topic_partitions(meta: MetadataClient, topic: str) -> dict[str, tuple]:
    """The topic's partitions once each has a leader (``check_topic`` first)."""
    await check_topic(meta, topic)
    return await meta.wait_for_topics([topic], timeout_ms=TOPIC_WAIT_MS)


async def list_offsets(meta: MetadataClient, topic: str, timestamp: int) -> dict[int, int]:
    """Each partition's offset for ``timestamp`` (EARLIEST, LATEST or ms since epoch).

    For a time, the first offset whose timestamp is >= it, or the partition's latest
    offset when no record is that new (so a range ending there reads to the end).
    """
    parts = await topic_partitions(meta, topic)

    def request(p: int, at: int) -> m.ListOffsetsRequest:
        return m.ListOffsetsRequest(
            [m.ListOffsetsTopic(topic, [m.ListOffsetsPartition(p, -1, at)])]
        )

    async def one(p: int) -> tuple[int, int]:
        result, _ = await leader_request(meta, topic, p, request(p, timestamp))
        offset = result.offset
        if offset < 0:  # no record at or after the timestamp
            latest, _ = await leader_request(meta, topic, p, request(p, LATEST))
            offset = latest.offset
        return p, offset

    pairs = await asyncio.gather(*(one(info.partition) for info in parts[topic]))
    return dict(pairs)


async def fetch_chunks(
    meta: MetadataClient, rng: OffsetRange, *, max_bytes: int = FETCH_MAX_BYTES
) -> Any:
    """Yield the records of ``rng`` as Arrow-ready buffers (``records.decode_arrow``),
    one tuple per fetched batch, exactly ``[start, end)``: records before ``start`` in
    the first batch and at or after ``end`` in the last are cut off while decoding."""
    offset = rng.start
    while offset < rng.end:
        wanted = m.FetchPartition(rng.partition, offset, -1, -1, -1, max_bytes)
        request = m.FetchRequest(
            replica_id=-1,
            max_wait_ms=500,
            min_bytes=1,
            max_bytes=max_bytes,
            topics=[m.FetchTopic(rng.topic, [wanted])],
        )
        result, body = await leader_request(meta, rng.topic, rng.partition, request)
        if result.high_watermark < rng.end:  # moved back: a leader lost data we planned
            log.warning(
                "%s-%d: high watermark %d below planned end %d",
                rng.topic,
                rng.partition,
                result.high_watermark,
                rng.end,
            )
        progressed = False
        for pos, _ in records.iter_batches(body, validate=False):
            h = records.validate_batch(body, pos)  # CRC: consumers check it too (docs/design.md)
            if h.next_offset <= offset:
                continue
            chunk = records.decode_arrow(body, pos, h, offset, rng.end)
            if chunk[0]:
                last = int.from_bytes(chunk[1][-8:], "little", signed=True)
                offset = last + 1
                progressed = True
                yield chunk
            if h.next_offset >= rng.end:
                offset = max(offset, rng.end)
                break
            offset = max(offset, h.next_offset)  # compaction may leave gaps: skip them
            progressed = True
        if not progressed and result.high_watermark <= offset:
            raise OffsetOutOfRangeError(
                f"{rng.topic}-{rng.partition}: planned to read to {rng.end} but the "
                f"high watermark is {result.high_watermark}"
            )


def _binary(n: int, validity: bytes, offsets: bytes, data: bytes) -> pa.Array:
    return pa.Array.from_buffers(
        pa.binary(), n, [pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def to_arrow(topic: str, partition: int, chunk: tuple) -> pa.RecordBatch:
    """One ``records.decode_arrow`` chunk -> one Arrow batch of the source's schema.

    The codec lays offsets, timestamps, keys and values out as Arrow's own buffers, so
    they become columns without a Python object per record; only headers (rare) are
    converted record by record. The ms -> us timestamp scaling is an Arrow cast.
    """
    n, offsets, timestamps, kv, ko, kd, vv, vo, vd, headers = chunk
    if headers is not None:
        header_col = pa.array([_headers(h) for h in headers], pa.list_(HEADER_TYPE))
    else:
        header_col = pa.nulls(n, pa.list_(HEADER_TYPE))
    ms = pa.timestamp("ms", tz="UTC")
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            pa.Array.from_buffers(ms, n, [None, pa.py_buffer(timestamps)]).cast(
                ARROW_SCHEMA[3].type
            ),
            _binary(n, kv, ko, kd),
            _binary(n, vv, vo, vd),
            header_col,
        ],
        schema=ARROW_SCHEMA,
    )


def _as_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def _headers(h: Any) -> list[dict[str, Any]] | None:
    """Record headers as stored ([[k, v], ...] or {k: v}) -> Arrow list of structs."""
    if not h:
        return None
    pairs = h.items() if isinstance(h, dict) else h
    return [{"key": _as_str(k), "value": _as_bytes(v)} for k, v in pairs]


def _as_str(k: Any) -> str:
    return k.decode() if isinstance(k, bytes | bytearray) else str(k)


def read_range(bootstrap: str, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches for one planned range, from a client that lives only for this read."""
    loop = asyncio.new_event_loop()
    meta: MetadataClient | None = None
    try:

        async def start() -> Any:
            nonlocal meta
            meta = MetadataClient(bootstrap, client_id="rillet-spark-reader")
            return fetch_chunks(meta, rng)

        chunks = loop.run_until_complete(start())
        while True:
            try:
                chunk = loop.run_until_complete(chunks.__anext__())
            except StopAsyncIteration:
                break
            yield to_arrow(rng.topic, rng.partition, chunk)
    finally:
        if meta is not None:
            loop.run_until_complete(meta.close())
        loop.close()


# --- the Spark data source ---------------------------------------------------------


async def _bounds(meta: MetadataClient, o: SourceOptions) -> tuple[dict, dict, dict, dict]:
    """(earliest, latest, start, end) offsets per partition for a batch read."""
    earliest = await list_offsets(meta, o.topic, EARLIEST)
    latest = await list_offsets(meta, o.topic, LATEST)
    if o.starting_ts is not None:
        start = await list_offsets(meta, o.topic, o.starting_ts)
    else:
        start = resolve(o.starting, "earliest", earliest, latest)
    if o.ending_ts is not None:
        end = await list_offsets(meta, o.topic, o.ending_ts)
    else:
        end = resolve(o.ending, "latest", earliest, latest)
    return earliest, latest, start, end


class RilletReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        o = self.options
        earliest, latest, start, end = run_with_client(o.bootstrap, lambda m: _bounds(m, o))
        ranges = plan_ranges(
            o.topic,
            start,
            end,
            earliest=earliest,
            latest=latest,
            max_records=o.max_records,
            fail_on_data_loss=o.fail_on_data_loss,
        )
        # Spark wants at least one partition; an empty range reads nothing.
        empty = OffsetRange(o.topic, 0, 0, 0)
        return [RangePartition(r) for r in ranges] or [RangePartition(empty)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rng: OffsetRange = partition.value
        if rng.count > 0:
            yield from read_range(self.options.bootstrap, rng)


class KeptClient:
    """An event loop and a client kept across calls on the driver.

    A stream reader answers ``latestOffset`` every trigger (every few ms when idle with
    the default trigger); a fresh client per call would open a connection each time.
    """

    def __init__(self, bootstrap: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.meta = MetadataClient(bootstrap, client_id="rillet-spark-stream")

    def run(self, fn: Callable[[MetadataClient], Awaitable[T]]) -> T:
        return self.loop.run_until_complete(fn(self.meta))

    def close(self) -> None:
        self.loop.run_until_complete(self.meta.close())
        self.loop.close()


class RilletStreamReader(DataSourceStreamReader):
    """Offsets are ``{"<partition>": next offset to read}``; see the module docstring."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: KeptClient | None = None
        self._reported: dict[int, int] = {}  # the highest offsets latestOffset returned

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # a loop and sockets do not pickle

    def _run(self, fn: Callable[[MetadataClient], Awaitable[T]]) -> T:
        if self._client is None:
            self._client = KeptClient(self.options.bootstrap)
        return self._client.run(fn)

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's method name
        o = self.options

        async def initial(meta: MetadataClient) -> dict[int, int]:
            if o.starting_ts is not None:
                return await list_offsets(meta, o.topic, o.starting_ts)
            earliest = await list_offsets(meta, o.topic, EARLIEST)
            latest = await list_offsets(meta, o.topic, LATEST)
            return resolve(o.starting, "latest", earliest, latest)

        return stream_offset(self._run(initial))

    # Spark >= 4.2 passes (start, limit); 4.0 and 4.1 call it with no arguments. The
    # default read limit is "everything available", so ``limit`` needs no handling.
    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:  # noqa: N802
        o = self.options
        latest = self._run(lambda m: list_offsets(m, o.topic, LATEST))
        # Never report an offset behind one already planned or reported (a new leader
        # can show a lower high watermark for a moment); Spark needs offsets to advance.
        for floor in (self._reported, parse_stream_offset(start or {})):
            for p, off in floor.items():
                latest[p] = max(latest.get(p, off), off)
        self._reported = dict(latest)
        return stream_offset(latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        lo, hi = parse_stream_offset(start), parse_stream_offset(end)
        for p in hi:
            lo.setdefault(p, 0)  # a partition added since the last batch: read it all
        ranges = plan_ranges(self.options.topic, lo, hi, max_records=self.options.max_records)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.options.bootstrap, partition.value)

    def commit(self, end: dict) -> None:
        """Nothing to do: the position lives in Spark's checkpoint, not in the cluster."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@dataclass
class WriteReport(WriterCommitMessage):
    """What one write task produced; returned only once every record was acknowledged."""

    task: int
    records: int
    bytes: int
    started_at: float  # wall clock (time.time()), comparable across executors
    finished_at: float
    partitions: dict[int, int] = field(default_factory=dict)  # partition -> records, where known


class RilletWriter(DataSourceArrowWriter):
    def __init__(self, options: SourceOptions, columns: list[str]) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return asyncio.run(produce_batches(self.options, iterator, _task_id()))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        write_report(self.options.report_path, "committed", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(1 for m in messages if m is not None)
        log.error(
            "rillet write to %s aborted: %d of %d tasks had every record acknowledged; "
            "the others may have written some records",
            self.options.topic,
            done,
            len(messages),
        )
        write_report(self.options.report_path, "aborted", messages)


def write_report(path: str | None, status: str, messages: list, **extra: Any) -> None:
    """The writer's commit messages as JSON, for jobs that want per-task figures."""
    if not path:
        return
    tasks = [asdict(m) for m in messages if isinstance(m, WriteReport)]
    tmp = Path(path).with_suffix(".tmp")
    body = {"status": status, "tasks": tasks, "at": time.time(), **extra}
    tmp.write_text(json.dumps(body))
    tmp.replace(path)  # atomic: a reader never sees half a report


class RilletStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("rillet")``: each micro-batch's tasks produce as the batch
    writer's do; ``commit`` and ``abort`` run on the driver's machine once per batch.

    With ``reportPath`` (a directory here) each committed micro-batch leaves
    ``batch-<id>.json`` with its tasks' figures, and each aborted one an
    ``abort-<id>-<ms>.json``; a batch re-run after a restart from the checkpoint
    rewrites its own file, so summing the files counts every acknowledged row once.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return asyncio.run(produce_batches(self.options, iterator, _task_id()))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        if self.options.report_path:
            path = Path(self.options.report_path) / f"batch-{batchId:012d}.json"
            write_report(str(path), "committed", messages, batch=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        done = sum(1 for m in messages if m is not None)
        log.error(
            "rillet stream write to %s: micro-batch %d aborted (%d of %d tasks had every "
            "record acknowledged); it is re-run from the checkpoint when the query restarts",
            self.options.topic,
            batchId,
            done,
            len(messages),
        )
        if self.options.report_path:
            name = f"abort-{batchId:012d}-{int(time.time() * 1000)}.json"
            path = Path(self.options.report_path) / name
            write_report(str(path), "aborted", messages, batch=batchId)


def task_attempt() -> int:
    """This Spark task's attempt number (0 the first time; 0 outside a task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else 0


def _task_id() -> int:
    """This Spark task's partition id (-1 outside a task)."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.partitionId() if ctx is not None else -1
    except ImportError:  # pragma: no cover
        return -1


async def produce_batches(
    o: SourceOptions, batches: Iterator[pa.RecordBatch], task: int
) -> WriteReport:
    """Produce every row, flush, and report; any failed send raises (fails the task)."""
    started = time.time()
    report = WriteReport(task, 0, 0, started, started)
    meta = MetadataClient(o.bootstrap, client_id="rillet-spark-writer")
    try:
        num_partitions = len((await topic_partitions(meta, o.topic))[o.topic])
        async with Producer(acks=o.acks, metadata=meta, **o.producer) as producer:
            for batch in batches:
                await _produce_batch(producer, o.topic, batch, num_partitions, report)
            await producer.flush()  # raises DeliveryError unless every record was acked
    finally:
        await meta.close()
    report.finished_at = time.time()
    return report


def _column_bytes(batch: pa.RecordBatch, name: str) -> list[bytes | None]:
    col = batch.column(batch.schema.get_field_index(name))
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return col.to_pylist()  # bytes already: no per-record Python work
    return [_as_bytes(v) for v in col.to_pylist()]


async def _produce_batch(
    producer: Producer,
    topic: str,
    batch: pa.RecordBatch,
    num_partitions: int,
    report: WriteReport,
) -> None:
    names = batch.schema.names
    values = _column_bytes(batch, "value")
    keys = _column_bytes(batch, "key") if "key" in names else None
    parts = batch.column(names.index("partition")).to_pylist() if "partition" in names else None
    headers = batch.column(names.index("headers")).to_pylist() if "headers" in names else None
    report.records += len(values)
    report.bytes += pc.sum(pc.binary_length(batch.column(names.index("value")))).as_py() or 0
    if keys is not None and batch.column(names.index("key")).null_count == len(keys):
        keys = None
    if headers is None and parts is None:
        if keys is None:
            await producer.send_many(topic, values)  # the bulk path: whole batches
            return
        key_col = batch.column(names.index("key"))
        if key_col.null_count == 0:
            if len(pc.unique(key_col)) == 1:
                # One key (a load task's records): its partition once, not per record.
                p = partition_for_key(keys[0], num_partitions)
                report.partitions[p] = report.partitions.get(p, 0) + len(values)
                await producer.send_many(topic, values, keys, partition=p)
            else:
                await producer.send_many(topic, values, keys)
            return
    for i, value in enumerate(values):  # per record: null keys, headers, partitions
        h = headers[i] if headers is not None else None
        p = parts[i] if parts is not None else None
        if p is not None:
            report.partitions[p] = report.partitions.get(p, 0) + 1
        await producer.produce(
            topic,
            value,
            key=keys[i] if keys is not None else None,
            headers=[[e["key"], e["value"]] for e in h] if h else None,
            partition=p,
        )


class RilletDataSource(DataSource):
    """``format("rillet")``: batch read and write, stream read and write of one topic."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return RilletReader(SourceOptions.parse(dict(self.options)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return RilletStreamReader(SourceOptions.parse(dict(self.options), streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> RilletWriter:
        return RilletWriter(self._write_options(schema), [f.name for f in schema.fields])

    def streamWriter(self, schema: StructType, overwrite: bool) -> RilletStreamWriter:  # noqa: N802
        # Every output mode appends, as Spark's Kafka sink does: a log has no overwrite.
        o = self._write_options(schema)
        if o.report_path:
            Path(o.report_path).mkdir(parents=True, exist_ok=True)
        return RilletStreamWriter(o)

    def _write_options(self, schema: StructType) -> SourceOptions:
        if "value" not in [f.name for f in schema.fields]:
            raise ValueError("writing to rillet needs a 'value' column (binary or string)")
        o = SourceOptions.parse(dict(self.options))
        run_with_client(o.bootstrap, lambda m: topic_partitions(m, o.topic))  # fail fast
        return o


def register(spark: Any) -> None:
    """Make ``format("rillet")`` available in this SparkSession."""
    spark.dataSource.register(RilletDataSource)
