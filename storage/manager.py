"""``LogManager``: every partition log under one data dir.

Opens all ``<topic>-<partition>`` dirs at start in a thread pool (recovery scans are
I/O-bound and release the GIL in reads and CRC), hands logs out by topic-partition,
deletes them Kafka's way (rename to ``<topic>-<partition>.<id>-delete``, remove in the
background), and runs retention, compaction, flush.ms and recovery-point checkpoints on
a schedule. ``close`` leaves a clean-shutdown marker in every log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rillet.client.wire.errors import InvalidTopicError
from rillet.storage import checkpoints, cleaner, fs, retention
from rillet.storage.config import LogConfig
from rillet.storage.fdcache import FdCache, default_max_open
from rillet.storage.invariants import invariant
from rillet.storage.log import Background, Clock, Log, wall_clock_ms

logger = logging.getLogger(__name__)

DELETE_SUFFIX = "-delete"
_DIR_RE = re.compile(r"^(?P<topic>[A-Za-z0-9._-]+)-(?P<partition>\d+)$")
TopicPartition = tuple[str, int]


def partition_dir_name(topic: str, partition: int) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic) or topic in (".", ".."):
        raise InvalidTopicError(f"invalid topic name {topic!r}")
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    m = _DIR_RE.match(name)
    return (m["topic"], int(m["partition"])) if m else None


class LogManager:
    def __init__(
        self,
        data_dir: str | os.PathLike,
        default_config: LogConfig | Mapping[str, Any] | None = None,
        *,
        clock: Clock | None = None,
        retention_check_interval_ms: int = 300_000,  # Kafka: log.retention.check.interval.ms
        flush_check_interval_ms: int = 1000,  # Kafka: log.flush.scheduler.interval.ms
        recovery_threads: int = 4,
        on_log_failure: Callable[[Log, BaseException], None] | None = None,
        background: Background | None = None,
        max_open_segments: int | None = None,
        create_threads: int = 8,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.default_config = _as_config(default_config, LogConfig())
        self.clock = clock or wall_clock_ms
        self.retention_check_interval_ms = retention_check_interval_ms
        self.flush_check_interval_ms = flush_check_interval_ms
        self.recovery_threads = recovery_threads
        # Threads that create a batch of new logs (open_unregistered_many); 1: in order,
        # on the caller's thread (a deterministic simulation).
        self.create_threads = create_threads
        # Called when any log turns read-only (a failed write or fsync): the broker treats
        # it as its log directory failing.
        self.on_log_failure = on_log_failure
        self.background = background  # every log's (see Log.open); None: the executor
        self.logs: dict[TopicPartition, Log] = {}
        # Segment descriptors held open beyond this are closed when idle and clean
        # (fdcache): a broker of 10,000 partitions must not need 10,000 descriptors.
        self.fd_cache = FdCache(
            default_max_open() if max_open_segments is None else max_open_segments
        )
        # Logs a maintenance walk visits per event-loop turn: a broker of 50,000
        # partitions walked them all in one turn every flush tick (about 0.2 s).
        self.logs_per_turn = 1000
        self._lock_fd: int | None = None
        self._task: asyncio.Task | None = None
        self._last_retention_ms = 0

    # -- start-up ----------------------------------------------------------------------

    def startup(self) -> None:
        """Lock the data dir and open every partition log. Blocks (use ``start``)."""
        fs.makedirs(self.data_dir)
        self._lock_data_dir()
        dirs, doomed = [], []
        for entry in sorted(fs.scandir(self.data_dir)):
            if not entry.is_dir:
                continue
            if entry.name.endswith(DELETE_SUFFIX):
                doomed.append(Path(entry.path))
            elif (tp := parse_partition_dir(entry.name)) is not None:
                dirs.append((tp, Path(entry.path)))
        with ThreadPoolExecutor(max_workers=max(1, self.recovery_threads)) as pool:
            opened = pool.map(lambda d: self._open_log(d[1]), dirs)
            for (tp, _), log in zip(dirs, opened, strict=True):
                log.use_fd_cache(self.fd_cache)
                # Unknown until the replica opens it (Kafka starts the HW at the log
                # start): no retention or compaction before that.
                log.high_watermark = log.log_start_offset
                log.failure_listener = self._log_failed
                self.logs[tp] = log
        for path in doomed:  # deletes interrupted by a crash
            fs.rmtree(path)
        logger.info("opened %d log(s) in %s", len(self.logs), self.data_dir)

    def _open_log(
        self, path: Path, config: LogConfig | None = None, *, sync_parent: bool = True
    ) -> Log:
        log = Log.open(
            path,
            config or self.default_config,
            clock=self.clock,
            background=self.background,
            sync_parent=sync_parent,
        )
        # Recovery left the log's descriptors open; nobody else has the log yet, so they
        # close now, before the next log opens its own: opening 10,000 logs in a thread
        # never holds 10,000 descriptors. The loop's fd cache adopts the log at
        # ``register`` (start-up: once opened) and it reopens what it uses.
        log.release_descriptors()
        return log

    async def start(self, *, schedule: bool = True) -> None:
        """``startup`` in the default executor, then the maintenance task."""
        await asyncio.get_running_loop().run_in_executor(None, self.startup)
        if schedule:
            self._task = asyncio.create_task(self._maintenance_loop(), name="log-maintenance")

    def _lock_data_dir(self) -> None:
        try:
            self._lock_fd = fs.lock_file(self.data_dir / ".lock")
        except BlockingIOError:
            raise RuntimeError(f"{self.data_dir} is in use by another process") from None

    # -- logs ----------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> Log | None:
        return self.logs.get((topic, partition))

    def get_or_create(
        self,
        topic: str,
        partition: int,
        config: LogConfig | Mapping[str, Any] | None = None,
        *,
        topic_id: str | None = None,
    ) -> Log:
        """The log of a topic-partition, created empty if new. A given ``config`` (Kafka
        names over the manager's defaults) replaces the log's current one.

        With ``topic_id``, a directory with no id yet records this one, and a directory
        of another id is refused: it belongs to a topic deleted and re-created under the
        same name, and the caller deletes it first (``is_stale``, then ``delete``, which
        waits for the old log's background work; replacing it here, synchronously,
        would let that work write into the new directory). Blocks (mkdir, fsyncs)."""
        log = self.logs.get((topic, partition))
        cfg = _as_config(config, self.default_config) if config is not None else None
        if log is None:
            log = self.open_unregistered(topic, partition, cfg)
            self.register(topic, partition, log)
        elif cfg is not None:
            log.config = cfg
        if topic_id is not None:
            self._claim(log, topic_id)
        return log

    def open_unregistered(
        self,
        topic: str,
        partition: int,
        config: LogConfig | None = None,
        *,
        topic_id: str | None = None,
    ) -> Log:
        """The blocking part of ``get_or_create`` for a log not open yet (mkdir, recovery,
        partition.metadata), touching no shared state: run it in a thread, then
        ``register`` the log on the loop. For many logs at once use
        ``open_unregistered_many``."""
        return self.open_unregistered_many([(topic, partition, config, topic_id)])[0]

    def open_unregistered_many(
        self,
        specs: Sequence[tuple[str, int, LogConfig | None, str | None]],
        on_open: Callable[[Log], None] | None = None,
    ) -> list[Log]:
        """``open_unregistered`` for each (topic, partition, config, topic id), with one
        fsync of the data dir for the whole batch instead of one per new directory,
        opened by ``create_threads`` threads. A
        broker given thousands of new partitions in one metadata delta creates them this
        way, in a thread, so its loop keeps heartbeating; ``on_open`` is told of each.

        Crash safety: each new directory is made, its partition.metadata written (file
        fsync, rename, directory fsync), and nothing else is made durable (an empty log
        needs no checkpoint: see recovery._persist_after_load). The data dir's fsync at
        the end makes every new directory's entry durable; it runs even when no
        directory was new, since an earlier batch that failed part way may have left
        directories whose entries were never synced. Until it returns no log of the
        batch is registered, so none has been written to: a crash before it leaves
        some of the directories or none, each empty and opening with the right topic
        id or none (claimed again when the partition is next created). A directory
        such a failed attempt left with its partition.metadata also holds a segment, so
        it does not load as fresh: loading it fsyncs the directory, entry included."""

        def open_one(spec: tuple[str, int, LogConfig | None, str | None]) -> Log:
            topic, partition, config, topic_id = spec
            path = self.data_dir / partition_dir_name(topic, partition)
            log = self._open_log(path, config, sync_parent=False)
            log.failure_listener = self._log_failed
            if topic_id is not None:
                self._claim(log, topic_id)
            return log

        opened = []
        workers = min(self.create_threads, len(specs))
        with contextlib.ExitStack() as stack:
            if workers > 1:
                # The file system commits concurrent fsyncs together (ext4's and xfs's
                # journals): about ten times the logs a second of one thread.
                pool = stack.enter_context(ThreadPoolExecutor(max_workers=workers))
                results = pool.map(open_one, specs)
            else:
                results = map(open_one, specs)
            for log in results:
                opened.append(log)
                if on_open is not None:
                    on_open(log)
        if opened:
            fs.fsync_dir(self.data_dir)
        return opened

    def register(self, topic: str, partition: int, log: Log) -> None:
        invariant((topic, partition) not in self.logs, f"{log.name}: registered twice")
        log.use_fd_cache(self.fd_cache)
        self.logs[(topic, partition)] = log

    @staticmethod
    def _claim(log: Log, topic_id: str) -> None:
        invariant(
            log.topic_id in (None, topic_id),
            f"{log.name}: directory belongs to topic id {log.topic_id}, not {topic_id}",
        )
        if log.topic_id is None:
            checkpoints.write_topic_id(log.directory, topic_id)
            log.topic_id = topic_id

    def _log_failed(self, log: Log, error: BaseException) -> None:
        if self.on_log_failure is not None:
            self.on_log_failure(log, error)

    def is_stale(self, topic: str, partition: int, topic_id: str) -> bool:
        """Whether the local log of this name belongs to another topic id: the topic was
        deleted and re-created while this broker did not see the delete."""
        log = self.logs.get((topic, partition))
        return log is not None and log.topic_id not in (None, topic_id)

    async def delete(self, topic: str, partition: int) -> None:
        """Remove a partition's log: rename the dir aside, then delete it.

        Background work on the log (retention, compaction, rolls, flushes) addresses its
        files by path; it finishes first, under the maintenance lock, so none of it can
        land in a new log created at the same path afterwards."""
        log = self.logs.pop((topic, partition), None)
        if log is None:
            return
        loop = asyncio.get_running_loop()
        target = log.directory.with_name(f"{log.directory.name}.{uuid.uuid4().hex}{DELETE_SUFFIX}")
        async with log.maintenance_lock:
            await log.wait_background()
            await loop.run_in_executor(None, _close_and_rename, log, target)
        await loop.run_in_executor(None, fs.rmtree, target)

    # -- maintenance ----------------------------------------------------------------------

    async def run_maintenance(self, now_ms: int | None = None) -> dict[str, int]:
        """One round: retention, compaction, purge of retired files, checkpoints."""
        now = self.clock() if now_ms is None else now_ms
        stats = {"segments_deleted": 0, "segments_compacted": 0, "files_purged": 0}
        async for log in self._walk_logs():
            if log.closed or log.failure is not None:
                continue
            try:
                stats["segments_deleted"] += await retention.apply_retention(log, now)
                stats["segments_compacted"] += (await cleaner.compact(log, now)).rewritten
                stats["files_purged"] += await retention.purge_retired(log, now)
            except Exception:  # one bad log must not stop maintenance of the others
                logger.exception("%s: maintenance failed", log.name)
        await self.checkpoint_recovery_points()
        return stats

    async def checkpoint_recovery_points(self) -> None:
        """Flush logs with unflushed data so their recovery points advance (executor)."""
        async for log in self._walk_logs():
            if not log.closed and log.failure is None and log.recovery_point < log.log_end_offset:
                await log.flush_async()

    async def _walk_logs(self) -> AsyncIterator[Log]:
        """Every log open when the walk starts, ``logs_per_turn`` per event-loop turn (a
        log closed meanwhile is still handed out: callers skip closed logs)."""
        for n, log in enumerate(list(self.logs.values())):
            if n and n % self.logs_per_turn == 0:
                await asyncio.sleep(0)
            yield log

    async def _maintenance_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_check_interval_ms / 1000)
            async for log in self._walk_logs():
                if not log.closed:
                    log.maybe_flush_by_time()
            self.fd_cache.sweep()
            now = self.clock()
            if now - self._last_retention_ms >= self.retention_check_interval_ms:
                self._last_retention_ms = now
                await self.run_maintenance(now)

    # -- shutdown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and close every log (clean-shutdown markers) and unlock. Blocks."""
        if self._task is not None:
            self._task.cancel()
        with ThreadPoolExecutor(max_workers=max(1, self.recovery_threads)) as pool:
            list(pool.map(Log.close, list(self.logs.values())))
        self.logs.clear()
        if self._lock_fd is not None:
            fs.close(self._lock_fd)
            self._lock_fd = None

    async def close_async(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for log in list(self.logs.values()):
            await log.wait_background()
        await asyncio.get_running_loop().run_in_executor(None, self.close)


def _close_and_rename(log: Log, target: Path) -> None:
    log.close()
    fs.replace(log.directory, target)


def _as_config(config: LogConfig | Mapping[str, Any] | None, base: LogConfig) -> LogConfig:
    if config is None:
        return base
    if isinstance(config, LogConfig):
        return config
    return LogConfig.from_dict(config, base)
