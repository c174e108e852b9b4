"""Partition replication in the deterministic simulator, on the production storage.

Three brokers each run what a real broker runs for one partition: the production
``LogManager`` and ``Log`` (storage/) in a data directory of their own on one
``SimFileSystem`` (tests/sim/simfs.py, installed through storage/fs.py), the ``Replica``
and ``LogStorage`` of broker/replica.py around the ``PartitionState`` core and its
``PartitionDriver``, fetches served by the broker's ``FetchReader`` (record batches read
from segment files, as bytes) and fetched bytes handed to the driver through the
fetcher's ``fetch_response``; producers send real record batches built by the client
encoder, with keys.

Their metadata comes from a quorum of three Raft controllers (controller_quorum.py): the
production ``RaftDriver``, ``RaftNode`` and ``ControllerStateMachine`` of the Raft
simulation, answering registrations, heartbeats, AlterPartition and metadata fetches with
the production handlers; topics are created and deleted through the production
CreateTopics and DeleteTopics handlers on the active controller (topic ids come from the
controllers' seeded rngs, so a seed replays). A broker reaches the active controller as
the real broker link does, trying voters, following NOT_CONTROLLER hints and backing off,
registers again when a new controller no longer knows it, and acts on metadata only once
caught up with the controller's high watermark. Everything travels over ``SimNetwork``
with seeded loss, delay, duplication and reordering.

Broker faults: process crashes (kill -9: the process state is lost, the files keep what
the page cache held; the broker restarts by reopening its logs, recovery included, and
its high-watermark checkpoint); power cuts (only what was fsynced survives, maybe with a
torn tail), either between events or armed to strike just before one of the node's next
file-system mutations (between a write and its fsync, a truncation and its checkpoint,
inside a roll's deferred job); I/O errors on a chosen write, fsync or rename (a log that
turns read-only, or an error that escapes, ends the process as ``fatal_fault`` does);
pauses (SIGSTOP), controlled shutdowns, isolation, and the topic deleted and re-created
while a broker is down (it comes back to a metadata image that never shows the delete,
as after a snapshot, and must notice by the topic id its log directory records).
Retention and compaction run on every broker's logs now and then through
``LogManager.run_maintenance``, bounded by the high watermark the driver stores on the
log, as in production; a roll's fsync and index write are deferred to a later event.
Each maintenance round sweeps the broker's fd cache (storage/fdcache.py); with
``max_open_segments`` 1 or 2 it closes and reopens segment descriptors all the time
(dirty and active ones too), and a closed descriptor used (EBADF, never injected) fails
the seed.

With ``fetch_sessions`` followers fetch through fetch sessions: the production
``FetchHandler`` and ``FetchSessionCache`` at the leader over the ReplicaManager's own
fetch, unwatch and tick (``SimReplicaManager``), a ``FetchSessionBuilder`` and a kept
request row at the follower (``SessionFetcher``); caches are lost on restart, dropped
now and then, or one slot for two followers, drawn from a random stream of their own.

Controller faults: controllers crash (the active one often: at any write, right after
proposing a broker's registration or AlterPartition, between a Raft append and its
commit), are cut from the other controllers or from the brokers for a while, pause, and
now and then two of the three go down for a while (no quorum). Every node reads its own
clock (clocks.py): a rate within 2 % of the simulated time, an offset of its own,
occasional leaps forward (and, for brokers, back); a broker's replication timers and its
logs' clock run on it.

Power cuts keep to what acks=all without fsync can survive (as in Kafka): one at a time,
on a fully replicated partition, and the node comes back only after the controller
fenced its old incarnation (so it is out of every ISR until it catches up again, unless
it was the ISR's last member: elected then, it loses committed records by design, and
the checks take them as lost; see ReplicationInvariants.lost_by_design).

Invariants, checked after every event (per topic incarnation):
- a replica's high watermark never moves back within one incarnation of it;
- a replica's log start never passes its high watermark;
- records below any leader's HW are committed, and a leader commits only records it
  holds (never a hole); once committed, an offset's record never changes on any replica
  below that replica's HW, nor on a newly elected leader (which holds every committed
  record, but for the power-cut window above). A committed record may be missing from
  a replica only below its log start (retention) or when a later committed record has
  the same key (compaction);
- batches in the committed range keep their base offset, leader epoch and, unless
  compaction dropped records from them, their bytes (CRC) on every replica;
- every acknowledged acks=all record is committed at the offset it was acknowledged at;
- the controllers keep the Raft simulation's checks (raft_cluster.py): one leader per
  term, log matching, committed entries never change, the same image at every offset,
  an active controller is a leader, messages only carry what is already durable;
- after the faults heal, a controller is active again, the ISR refills and a new write
  is acknowledged (liveness); then the writes stop, every follower reaches the leader's
  log end, high watermark and log start, and the ISR does not change while they idle,
  nor when one more write ends the idle spell.
"""

from __future__ import annotations

import bisect
import errno
import functools
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rillet.broker import replica_manager
from rillet.broker.config import topic_log_config
from rillet.broker.fetch_session import FetchSessionCache
from rillet.broker.handlers.fetch import FetchHandler
from rillet.broker.metrics import BrokerMetrics
from rillet.broker.replica import LogStorage, Replica
from rillet.broker.replica_fetch import FetchParams, FetchPartition, FetchReader
from rillet.broker.replica_manager import ReplicaManager, isr_check_every
from rillet.broker.replication import hw_checkpoint
from rillet.broker.replication.fetcher import fetch_response
from rillet.broker.replication.partition_state import PartitionState, Role
from rillet.broker.replication.types import (
    ACKS_ALL,
    AlterPartitionResponse,
    FetchRequest,
    ProposeAlterPartition,
    ReplicationConfig,
    ReplicationInvariantError,
)
from rillet.client.fetch_session import SESSION_ERRORS, FetchSessionBuilder
from rillet.client.runtime.rpc_server import FileRange, Request
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.errors import RilletError
from rillet.controller.metadata.image import (
    EMPTY_IMAGE,
    NO_LEADER,
    MetadataDelta,
    MetadataImage,
    TopicPartition,
)
from rillet.controller.metadata.quorum import ControllerConfig
from rillet.storage import Log, LogConfig, LogManager, fs

from .aio import SyncRunner
from .clocks import DriftingClock
from .controller_quorum import CONTROLLER_IDS, ControllerAnswer, ControllerLink, ControllerQuorum
from .network import LinkFaults, SimNetwork
from .raft_cluster import SimulationFailure
from .scheduler import Scheduler, SimClock
from .simfs import SimCrash, SimFileSystem
from .trace import Trace

REPLAY_COMMAND = (
    "RILLET_SIM_SEED={seed} .venv/bin/pytest tests/test_replication_sim.py -k replay -s"
)
BROKER_IDS = (1, 2, 3)
CONTROLLER_FAULTS = frozenset(
    {"crash_controller", "crash_active", "cut_controller", "pause_controller"}
    | {"clock_step", "lose_quorum"}
)
TOPIC = "t"
TP = TopicPartition(TOPIC, 0)
MIN_ISR = 2
FETCH_MAX_BYTES = 400  # a few batches per fetch: followers catch up in several rounds
REQUEST_TIMEOUT_MS = 300
SESSION_TIMEOUT_MS = 600  # broker.session.timeout.ms of the controller here
FETCH_BACKOFF_MS = 100  # replica.fetch.backoff.ms, scaled to the simulation
LAG_MS = 400  # replica.lag.time.max.ms, scaled to the simulation
TICK_MS = 10  # replica.tick.interval.ms, scaled to the simulation
KEYS = 16  # few keys: compaction finds superseded records in every segment
# Small segments so logs roll, retention drops segments and compaction rewrites them;
# each topic incarnation draws its cleanup policy.
TOPIC_CONFIGS = {
    "segment.bytes": "1024",
    "retention.bytes": "2500",
    "min.insync.replicas": str(MIN_ISR),
}
CLEANUP_POLICIES = ("compact,delete", "compact,delete", "delete", "compact")
LOG_DEFAULTS = LogConfig(segment_bytes=1024, file_delete_delay_ms=100)


# ---------------------------------------------------------------------------
# messages


@dataclass(frozen=True, slots=True)
class Fetch:
    """One partition of a follower's Fetch request, as on the wire."""

    incarnation: int
    fetch_id: int
    partition: m.FetchPartition


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """The leader's answer: the wire row and the record batches read from its log."""

    incarnation: int
    fetch_id: int
    result: m.FetchPartitionResult
    data: bytes


@dataclass(frozen=True, slots=True)
class SessionFetch:
    """A follower's whole Fetch request through a fetch session (``fetch_sessions``)."""

    incarnation: int
    fetch_id: int
    request: m.FetchRequest


@dataclass(frozen=True, slots=True)
class SessionFetchAnswer:
    """The FetchHandler's response and its payload, read into bytes."""

    incarnation: int
    fetch_id: int
    response: m.FetchResponse
    data: bytes


# ---------------------------------------------------------------------------
# a broker with one partition


class SimLogStorage(LogStorage):
    """The production LogStorage; a cut also tells the invariants which part of the log
    they have to compare again."""

    __slots__ = ("broker",)

    def __init__(self, log: Log, broker: BrokerActor) -> None:
        super().__init__(log)
        self.broker = broker

    def truncate_to(self, offset: int) -> None:
        end = self.log.log_end_offset
        super().truncate_to(offset)
        self.broker.checked_end = min(self.broker.checked_end, self.log.log_end_offset)
        self.broker.may_hold_lost = False
        self.broker.note(f"truncates to {offset}: log end {end} -> {self.log.log_end_offset}")

    def truncate_fully_and_start_at(self, offset: int) -> None:
        super().truncate_fully_and_start_at(offset)
        self.broker.checked_end = offset
        self.broker.may_hold_lost = False
        self.broker.note(f"truncates fully, starts at {offset}")


class SimReplica(Replica):
    """The broker's Replica (log, core, driver); acks=all answers go to the simulation
    instead of futures, and AlterPartition to the broker's controller link; its timers
    run on the broker's own clock."""

    __slots__ = ("broker", "serial")

    def __init__(self, broker: BrokerActor, topic_id: str, log: Log, state: PartitionState):
        super().__init__(
            TOPIC,
            0,
            topic_id,
            log,
            state,
            MIN_ISR,
            broker.clock,
            broker.send_alter_partition,  # type: ignore[arg-type]
            ticking=broker.manager._ticking if broker.manager is not None else None,  # noqa: SLF001
        )
        self.broker = broker
        broker.cluster.replica_serial += 1
        self.serial = broker.cluster.replica_serial
        self.driver.storage = SimLogStorage(log, broker)

    def complete_produce(self, produce_id: Hashable, error_code: int) -> None:
        self.broker.complete_produce(self, produce_id, error_code)

    def high_watermark_updated(self, high_watermark: int) -> None:
        """A leader's HW commits records the moment it moves: one event (a paused broker
        handling its queued messages) may move it and then lose the leadership."""
        super().high_watermark_updated(high_watermark)
        if self.state.is_leader and self is self.broker.replica:
            self.broker.cluster.invariants.on_leader_hw(self.broker, high_watermark)


class SimReplicaManager:
    """The part of ReplicaManager a follower's session fetch and the tick go through,
    as its own methods (borrowed, not copied) over the broker's replicas, FetchReader
    and clock: ``fetch_messages`` (a session's watched read: FetchWatch, note_read,
    the session's FetchClock), ``unwatch`` of closed sessions, and ``tick`` of only the
    replicas activated since their core was last idle. The leader's FetchHandler
    calls it as it calls the real one."""

    fetch_messages = ReplicaManager.fetch_messages
    _fetch_watched = ReplicaManager._fetch_watched  # noqa: SLF001
    unwatch = ReplicaManager.unwatch
    tick = ReplicaManager.tick
    tick_replicas = ReplicaManager.tick_replicas

    def __init__(self, broker: BrokerActor, reader: FetchReader) -> None:
        self.replicas = broker.replicas
        self._reader = reader
        self._ticking: dict[Replica, None] = {}
        self.now_ms = broker.clock  # the clock the replicas' drivers read


class SessionFetcher:
    """SourceFetcher's row keeping (broker/replication/fetcher.py) for the partition, on
    one leader: the request row is kept from fetch to fetch and rebuilt only when stale
    (answered, backed off, new, or marked by its replica through ``Replica.wake``: a
    role or epoch change, a log-start move), and ``FetchSessionBuilder.build_changes``
    lists it only when it differs from what the leader's session holds. A new leader
    gets a new fetcher, so a new session (the old one stays at the old leader until the
    follower's next full fetch there replaces it)."""

    def __init__(self, broker: BrokerActor, source: int) -> None:
        self.broker = broker
        self.source = source
        self.session = FetchSessionBuilder()
        self.row: m.FetchPartition | None = None
        self.entry: tuple[SimReplica, FetchRequest] | None = None
        self.stale = True

    def mark(self, key: tuple[str, int], wake: bool = True) -> bool:
        """SourceFetcher.mark: False once this fetcher is gone (the replica drops it)."""
        if self.broker.fetcher is not self:
            return False
        self.stale = True
        return True

    def build(self, replica: SimReplica) -> m.FetchRequest | None:
        """SourceFetcher._build_request: None when the partition has no row."""
        changed: set[tuple[str, int]] = set()
        if self.stale:
            self.stale, changed = False, {(TOPIC, 0)}
            self.row = self.entry = None
            replica.watchers.add(self)
            request = replica.state.fetch_request()
            if request is not None:
                self.entry = (replica, request)
                self.row = m.FetchPartition(
                    0,
                    request.fetch_offset,
                    request.last_fetched_epoch,
                    request.current_leader_epoch,
                    replica.log.log_start_offset,
                    FETCH_MAX_BYTES,
                    replica.topic_id,
                )
        if self.row is None:
            return None
        session = self.session.build_changes({(TOPIC, 0): self.row}, changed)
        return m.FetchRequest(
            replica_id=self.broker.actor_id,
            max_wait_ms=0,  # no long poll here: the simulation's events stand for it
            min_bytes=1,
            max_bytes=FETCH_MAX_BYTES,
            topics=session.topics,
            session_id=session.session_id,
            session_epoch=session.session_epoch,
            forgotten=session.forgotten,
        )


def guarded(method: Callable[..., None]) -> Callable[..., None]:
    """A broker event, with the ways a process dies inside one: the file system crashed
    the node mid-call (an armed crash: SimCrash), or an I/O error escaped or turned a log
    read-only, which the broker treats as fatal (``fatal_fault``: it exits, and restarts
    later with recovery)."""

    @functools.wraps(method)
    def event(self: BrokerActor, *args: Any) -> None:
        try:
            method(self, *args)
        except SimCrash as e:
            self.cluster.armed = False
            self.die(f"crashed inside a storage call ({e})", power_cut=True)
        except OSError as e:
            if self.logs is None:
                raise
            self.cluster.check_descriptor(e)
            self.die(f"fatal I/O error {e!r}")
        if self.log_failure is not None and self.logs is not None:
            self.cluster.check_descriptor(self.log_failure)
            self.die(f"a log turned read-only ({self.log_failure!r})")

    return event


class BrokerActor:
    """One broker: its LogManager over its own data directory, and for the partition a
    production Replica (log, PartitionState, PartitionDriver); around them what
    ReplicaManager and the fetcher do (metadata, fetch loop, AlterPartition answers,
    high-watermark checkpoints), and a `ControllerLink` for what broker/link does."""

    def __init__(self, cluster: ReplicationCluster, broker_id: int) -> None:
        self.actor_id = broker_id
        self.cluster = cluster
        self.clock = cluster.clocks[broker_id]  # its own, drifting: timeouts run on it
        self.link: ControllerLink | None = None  # broker/link: lost in a crash
        self.data_dir = cluster.root / f"broker-{broker_id}"  # survives crashes
        self.logs: LogManager | None = None  # the process: lost in a crash
        self.log_failure: BaseException | None = None  # a log turned read-only
        self.restart_not_before = 0  # after losing power: not before its session expired
        self.lost_power = False  # and not before the controller fenced the old incarnation
        # Lost power, and not yet in an ISR beside another member since: its log may lack
        # records it had acknowledged (see ReplicationInvariants.lost_by_design).
        self.may_lack_acked = False
        self.hw_may_fall_to: int | None = None  # once, after committed records were lost
        self.may_hold_lost = False  # batches of the lost history, until it truncates
        self.replica: SimReplica | None = None
        self.replicas: dict[TopicPartition, Replica] = {}  # what the FetchReader serves
        self.reader: FetchReader | None = None
        # With fetch sessions (the cluster's ``fetch_sessions``): the leader's FetchHandler
        # and session cache over the ReplicaManager's own fetch and tick, and the
        # follower's fetcher of the current leader. Lost in a crash.
        self.manager: SimReplicaManager | None = None
        self.handler: FetchHandler | None = None
        self.fetcher: SessionFetcher | None = None
        self.ticks = 0  # the ReplicaManager's tick count (ISR checks every few)
        self.checkpointed_hw: dict[TopicPartition, int] = {}
        self.incarnation = 0
        self.image: MetadataImage = EMPTY_IMAGE
        self.seen_hw = 0
        self.fetch_out: tuple[int, SimReplica, FetchRequest] | None = None  # in flight
        self.fetch_ids = 0
        self.fetch_sent_ms = 0
        self.fetch_source = 0  # the leader the fetch in flight went to
        self.fetch_backoff_until = 0
        self.fetch_error = ""  # why the last fetch answer could not be applied
        # (replica serial, proposal id) -> the replica that proposed, awaiting its answer
        self.alter_out: dict[tuple[int, int], SimReplica] = {}
        self.checked_end = 0  # the log below this was compared with the committed records
        self.paused_until = 0  # SIGSTOP: nothing runs, messages queue up, the clock jumps
        self.inbox: list[tuple[int, object]] = []
        self.shutting_down = False  # controlled shutdown asked (SIGTERM)

    @property
    def alive(self) -> bool:
        return self.logs is not None

    @property
    def state(self) -> PartitionState | None:
        return self.replica.state if self.replica is not None else None

    @property
    def log(self) -> Log:
        assert self.replica is not None
        return self.replica.log

    @property
    def driver(self):  # noqa: ANN201 - the replica's PartitionDriver, or None
        return self.replica.driver if self.replica is not None else None

    @property
    def broker_epoch(self) -> int:
        return self.link.broker_epoch if self.link is not None else -1

    def now(self) -> int:
        """The simulated time (pauses, the trace); the broker's timers read ``clock``."""
        return self.cluster.clock.now_ms

    def note(self, text: str) -> None:
        self.cluster.trace.add(self.now(), f"broker {self.actor_id}: {text}")

    @guarded
    def start(self) -> None:
        """Start the process: open every log (recovery after a crash) and read the
        high-watermark checkpoint, as the broker does before it hears from metadata."""
        self.incarnation += 1
        self.log_failure, self.lost_power = None, False
        self.cluster.fs.restart(str(self.data_dir))
        self.logs = LogManager(
            self.data_dir,
            LOG_DEFAULTS,
            clock=self.clock,
            recovery_threads=1,
            on_log_failure=self.on_log_failure,
            background=self.background,
            max_open_segments=self.cluster.max_open_segments,
        )
        # One thread: opening past the bound closes others, as on the event loop.
        self.logs.fd_cache.on_loop_thread = lambda: True
        self.logs.startup()
        self.checkpointed_hw = hw_checkpoint.read(self.data_dir)
        self.replica, self.replicas = None, {}
        self.reader = FetchReader(
            self.actor_id, self.replicas, lambda: self.image, self.partition_error
        )
        self.image = EMPTY_IMAGE
        if self.cluster.fetch_sessions:
            cluster = self.cluster
            self.manager = SimReplicaManager(self, self.reader)
            sessions = FetchSessionCache(
                cluster.session_slots, rng=random.Random(cluster.session_rng.getrandbits(64))
            )
            self.handler = FetchHandler(self.manager, BrokerMetrics(), sessions)  # type: ignore[arg-type]
        self.fetcher, self.ticks = None, 0
        self.fetch_out, self.alter_out, self.fetch_backoff_until = None, {}, 0
        self.paused_until, self.inbox, self.shutting_down = 0, [], False
        log = self.logs.get(TOPIC, 0)
        self.cluster.trace.add(
            self.now(),
            f"broker {self.actor_id} starts (incarnation {self.incarnation}, "
            + (
                f"log [{log.log_start_offset}, {log.log_end_offset}) of topic {log.topic_id}, "
                f"HW checkpoint {self.checkpointed_hw.get(TP)})"
                if log is not None
                else "no log)"
            ),
        )
        self.link = self.cluster.new_link(self)
        self.link.start()
        incarnation = self.incarnation
        self.cluster.scheduler.after(TICK_MS, lambda: self.tick(incarnation), "tick")
        self.cluster.scheduler.after(
            self.cluster.rng.randint(50, 400), lambda: self.maintain(incarnation), "maintenance"
        )

    def status(self) -> str:
        s = self.state
        if self.logs is None:
            return f"broker {self.actor_id}: down"
        if s is None:
            return f"broker {self.actor_id}: no replica, image offset {self.image.offset}"
        reg = self.image.brokers.get(self.actor_id)
        return (
            f"broker {self.actor_id}: {s.role.value} epoch {s.leader_epoch} isr {s.isr} "
            f"pending {s.pending_isr_change} log [{self.log.log_start_offset}, "
            f"{self.log.log_end_offset}) HW {s.high_watermark} broker epoch "
            f"{self.broker_epoch} registered {reg}, image offset {self.image.offset}, "
            f"alter out {list(self.alter_out)}, last fetch error {self.fetch_error or None}, "
            f"controller {self.link.leader_id if self.link else None}"
        )

    def crash(self, power_cut: bool = False) -> None:
        """kill -9: the process state goes, its files stay as the page cache holds them.
        With ``power_cut`` the machine goes down too: of its files only what was fsynced
        survives (plus, maybe, part of what was not, torn), as after an armed crash."""
        if self.logs is None:
            return
        prefix = str(self.data_dir)
        down = self.cluster.fs.down(prefix)  # an armed crash already took the files
        self.note("loses power" if power_cut or down else "crashes")
        if not down:
            abandon(self.logs)
            if power_cut:
                self.cluster.fs.crash(prefix, self.cluster.rng)
        if power_cut or down:  # see ReplicationCluster.restart_delay
            self.restart_not_before = self.now() + SESSION_TIMEOUT_MS + 100
            self.lost_power = self.may_lack_acked = True
        self.logs = self.replica = self.reader = self.link = None
        self.manager = self.handler = self.fetcher = None
        self.replicas = {}

    def die(self, why: str, power_cut: bool = False) -> None:
        """The process ended inside an event; it is restarted a little later."""
        self.note(why)
        self.crash(power_cut)
        self.cluster.scheduler.after(
            self.cluster.restart_delay(power_cut), lambda: self.cluster.restart(self), "restart"
        )

    def on_log_failure(self, log: Log, error: BaseException) -> None:
        """LogManager's failure listener (the broker's ``_log_dir_failed``): fatal, but
        only once the current event is over (the guard sees it). A deleted log's roll job
        that the simulation deferred past the delete fails harmlessly: production's
        delete waits for the executor's jobs, which the deferral hook does not track."""
        if not log.closed:
            self.log_failure = error

    def background(self, run: Callable[[], None], after: Callable[[], None]) -> None:
        """The logs' background jobs (a roll's fsync and index write, a flush): deferred
        to a later event, or lost in a crash. Inside a maintenance coroutine (which awaits
        its flushes) they run at once."""
        if self.cluster.aio.loop.is_running():
            run()
            after()
            return
        incarnation = self.incarnation
        self.cluster.scheduler.after(
            self.cluster.rng.randint(1, 60),
            lambda: self.run_background(incarnation, run, after),
            "background job",
        )

    @guarded
    def run_background(
        self, incarnation: int, run: Callable[[], None], after: Callable[[], None]
    ) -> None:
        if self.logs is None or incarnation != self.incarnation:
            return  # the process died: its executor's queue died with it
        run()
        after()

    def send(self, dst: int, payload: object) -> None:
        self.cluster.network.send(self.actor_id, dst, payload)

    # -- time ------------------------------------------------------------------------

    @guarded
    def tick(self, incarnation: int) -> None:
        if self.logs is None or incarnation != self.incarnation:
            return
        if self.now() < self.paused_until:
            self.cluster.scheduler.at(self.paused_until, lambda: self.tick(incarnation), "tick")
            return
        if self.inbox:
            self.resume()
            if self.logs is None:
                return
        assert self.link is not None
        self.link.want_shut_down = self.shutting_down
        self.link.tick()
        if self.logs is None:
            return  # the link's answer ended the process (controlled shutdown)
        if self.manager is not None:
            # As run_ticks: only the replicas activated since they were last idle, and
            # ISR shrink checks every half lag time.
            self.ticks += 1
            self.manager.tick(self.ticks % isr_check_every(TICK_MS, LAG_MS) == 0)
        elif self.replica is not None:
            self.replica.driver.tick()
        if self.replica is not None:
            self.maybe_fetch(self.clock())
        if self.cluster.rng.random() < 0.05:
            self.checkpoint_high_watermarks()
        self.cluster.scheduler.after(TICK_MS, lambda: self.tick(incarnation), "tick")

    def checkpoint_high_watermarks(self) -> None:
        """ReplicaManager.hw_entries, written by the production checkpoint writer."""
        assert self.logs is not None
        entries = {
            tp: hw
            for tp, hw in self.checkpointed_hw.items()
            if tp not in self.replicas and (tp.topic, tp.partition) in self.logs.logs
        }
        for tp, replica in self.replicas.items():
            entries[tp] = replica.state.high_watermark
        try:
            hw_checkpoint.write(self.data_dir, entries)
        except OSError as e:  # ReplicaManager logs it; the next write may succeed
            self.note(f"high-watermark checkpoint failed: {e!r}")

    @guarded
    def maintain(self, incarnation: int) -> None:
        """The LogManager's maintenance round: retention, compaction, purge, flushes."""
        if self.logs is None or incarnation != self.incarnation:
            return
        if self.now() >= self.paused_until:
            self.logs.fd_cache.sweep()  # the LogManager's maintenance loop does, each second
            stats = self.cluster.aio.run(self.logs.run_maintenance(self.clock()))
            if stats["segments_compacted"] and self.replica is not None:
                self.checked_end = 0  # compare the whole log again: records went
        self.cluster.scheduler.after(
            self.cluster.rng.randint(100, 600), lambda: self.maintain(incarnation), "maintenance"
        )

    def maybe_fetch(self, now: int) -> None:
        replica = self.replica
        assert replica is not None
        state = replica.state
        if state.role is not Role.FOLLOWER or state.leader_id in (None, NO_LEADER):
            return
        if now < self.fetch_backoff_until:
            return
        # A fetch still out to an old leader does not hold back the new leader's: the
        # broker's FetcherManager moves the partition to the new leader's fetcher.
        if (
            self.fetch_out is not None
            and self.fetch_source == state.leader_id
            and now - self.fetch_sent_ms < REQUEST_TIMEOUT_MS
        ):
            return
        if self.cluster.fetch_sessions:
            self.maybe_fetch_in_session(now, replica, state.leader_id)
            return
        request = state.fetch_request()
        if request is not None:
            self.fetch_ids += 1
            self.fetch_out, self.fetch_sent_ms = (self.fetch_ids, replica, request), now
            self.fetch_source = state.leader_id
            partition = m.FetchPartition(
                0,
                request.fetch_offset,
                request.last_fetched_epoch,
                request.current_leader_epoch,
                replica.log.log_start_offset,
                FETCH_MAX_BYTES,
                replica.topic_id,
            )
            self.send(state.leader_id, Fetch(self.incarnation, self.fetch_ids, partition))

    def maybe_fetch_in_session(self, now: int, replica: SimReplica, leader: int) -> None:
        """The fetcher's loop, one request at a time: a request left unanswered may or
        may not have arrived, so the session starts over (as on a connection error)."""
        fetcher = self.fetcher
        if fetcher is None or fetcher.source != leader:
            fetcher = self.fetcher = SessionFetcher(self, leader)  # the leader's fetcher
        elif self.fetch_out is not None:
            self.note(f"fetch {self.fetch_out[0]} unanswered: the session starts over")
            fetcher.session.reset()
        self.fetch_out = None
        request = fetcher.build(replica)
        if request is None:
            return
        self.fetch_ids += 1
        assert fetcher.entry is not None
        self.fetch_out, self.fetch_sent_ms = (self.fetch_ids, *fetcher.entry), now
        self.fetch_source = leader
        self.send(leader, SessionFetch(self.incarnation, self.fetch_ids, request))

    # -- messages --------------------------------------------------------------------

    def pause(self, duration_ms: int) -> None:
        self.paused_until = self.now() + duration_ms
        self.cluster.trace.add(self.now(), f"broker {self.actor_id} paused for {duration_ms} ms")

    def resume(self) -> None:
        """SIGCONT: what arrived meanwhile is handled in arrival order, late."""
        inbox, self.inbox = self.inbox, []
        for src, payload in inbox:
            self.deliver(src, payload)

    @guarded
    def deliver(self, src: int, payload: object) -> None:
        if self.logs is None:
            return
        if self.now() < self.paused_until or self.inbox:
            self.inbox.append((src, payload))
            if self.now() >= self.paused_until:
                self.resume()
            return
        match payload:
            case ControllerAnswer(link_id) if self.link and link_id == self.link.link_id:
                self.link.on_answer(payload)
            case Fetch(incarnation, fetch_id, partition):
                self.serve_fetch(src, incarnation, fetch_id, partition)
            case FetchAnswer(incarnation, fetch_id, result, data) if (
                incarnation == self.incarnation
            ):
                self.on_fetch_answer(fetch_id, result, data)
            case SessionFetch(incarnation, fetch_id, request):
                self.serve_session_fetch(src, incarnation, fetch_id, request)
            case SessionFetchAnswer(incarnation, fetch_id, response, data) if (
                incarnation == self.incarnation
            ):
                self.on_session_answer(fetch_id, response, data)

    def on_shut_down(self) -> None:
        """The controller says the controlled shutdown is done: the process exits."""
        self.note("controlled shutdown done")
        self.crash()
        broker = self
        self.cluster.scheduler.after(
            self.cluster.rng.randint(50, 1000), lambda: self.cluster.restart(broker), "restart"
        )

    # -- metadata (ReplicaManager.on_metadata, for the one partition) -----------------

    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """What ReplicaManager.on_metadata does with one published (delta, image)."""
        if self.logs is None or image.offset <= self.image.offset:
            return
        old, self.image = self.image, image
        was, p = old.partition(TOPIC, 0), image.partition(TOPIC, 0)
        # The delta's local deletes: the partition was here and its topic is gone or
        # replaced. A broker whose first image is a snapshot never sees this.
        if (
            was is not None
            and self.actor_id in was.replicas
            and (p is None or p.topic_id != was.topic_id)
        ):
            self.remove(delete_log=True, why=f"topic {was.topic_id} deleted")
        if self.replica is not None and delta.changed_brokers:
            # Every broker a record touched, even one fenced and unfenced in one batch.
            self.replica.driver.on_brokers_changed(delta.changed_brokers.keys())
        if p is not None and self.actor_id in p.replicas:
            self.remove_if_recreated(p.topic_id)
            self.become(p)
        if old is EMPTY_IMAGE:
            self.delete_strays(image)

    def remove_if_recreated(self, topic_id: str) -> None:
        """ReplicaManager._remove_if_recreated: a replica or log of a deleted topic of the
        same name goes, judged by the topic id the log directory records."""
        assert self.logs is not None
        replica = self.replica
        if (replica is None or replica.topic_id == topic_id) and not self.logs.is_stale(
            TOPIC, 0, topic_id
        ):
            return
        self.remove(delete_log=True, why=f"the log belongs to a deleted topic, not {topic_id}")

    def delete_strays(self, image: MetadataImage) -> None:
        assert self.logs is not None
        p = image.partition(TOPIC, 0)
        if self.logs.get(TOPIC, 0) is not None and (p is None or self.actor_id not in p.replicas):
            self.remove(delete_log=True, why="stray log")

    def remove(self, *, delete_log: bool, why: str) -> None:
        """ReplicaManager.remove: stop the role, forget the HW, delete the log."""
        assert self.logs is not None
        replica, self.replica = self.replica, None
        self.replicas.pop(TP, None)
        if replica is not None:
            replica.driver.shutdown()
            replica.wake()
        self.checkpointed_hw.pop(TP, None)
        self.fetch_out = self.fetcher = None
        self.cluster.trace.add(self.now(), f"broker {self.actor_id}: removes its replica ({why})")
        if delete_log:
            self.checkpoint_high_watermarks()  # first: no HW of a deleted log on disk
            self.cluster.aio.run(self.logs.delete(TOPIC, 0))

    def become(self, p) -> None:  # noqa: ANN001 - an image Partition
        if self.replica is None:
            self.open(p.topic_id)
        driver = self.driver
        assert driver is not None
        if p.leader == self.actor_id:
            driver.become_leader(p.leader_epoch, p.partition_epoch, p.replicas, p.isr)
            self.cluster.invariants.on_become_leader(self)
        else:
            driver.become_follower(p.leader, p.leader_epoch, p.partition_epoch, p.replicas, p.isr)
        assert self.replica is not None
        self.replica.wake()  # as ReplicaManager: fetches and sessions see the new role

    def open(self, topic_id: str) -> None:
        """ReplicaManager._open: the log (created with the topic id, or reopened), its HW
        from the checkpoint clamped to what recovery left."""
        assert self.logs is not None
        config = topic_log_config(self.logs.default_config, self.image.topic_config(TOPIC))
        log = self.logs.get_or_create(TOPIC, 0, config, topic_id=topic_id)
        hw = self.checkpointed_hw.get(TP, 0)
        hw = max(min(hw, log.log_end_offset), log.log_start_offset)
        log.high_watermark = hw
        state = PartitionState(
            self.actor_id,
            log,
            ReplicationConfig(LAG_MS),
            high_watermark=hw,
            is_isr_eligible=lambda b: self.image.is_unfenced(b),
        )
        self.replica = SimReplica(self, topic_id, log, state)
        self.replicas[TP] = self.replica
        self.cluster.invariants.check_epochs(self, "after opening its log")
        self.seen_hw, self.checked_end = hw, log.log_start_offset
        self.cluster.trace.add(
            self.now(),
            f"broker {self.actor_id}: opens topic {topic_id} log "
            f"[{log.log_start_offset}, {log.log_end_offset}) HW {hw}",
        )

    def partition_error(self, topic: str, partition: int) -> int:
        return replica_manager.partition_error(self.image, topic, partition)

    def on_alter_answer(self, key: tuple[int, int], response: AlterPartitionResponse) -> None:
        replica = self.alter_out.pop(key, None)
        # As ReplicaManager: not for a removed replica's core.
        if replica is not None and replica is self.replica:
            replica.driver.on_alter_partition_response(key[1], response)

    # -- fetch: the leader's side through the broker's FetchReader ----------------------

    def serve_fetch(self, src: int, incarnation: int, fetch_id: int, p: m.FetchPartition) -> None:
        assert self.reader is not None
        params = FetchParams(src, 0, 1, FETCH_MAX_BYTES)
        wanted = FetchPartition(
            TOPIC,
            0,
            p.fetch_offset,
            p.last_fetched_epoch,
            p.current_leader_epoch,
            p.partition_max_bytes,
            p.topic_id,
        )
        r = self.reader.read_all(params, [wanted]).partitions[0]
        # Read the range now: the handler's response pins it before the next event.
        data = r.records.read() if r.records is not None else b""
        d = r.diverging_epoch
        row = m.FetchPartitionResult(
            0,
            r.error_code,
            r.high_watermark,
            r.high_watermark,
            r.log_start_offset,
            m.EpochEndOffset(d.epoch, d.end_offset) if d is not None else None,
            r.preferred_read_replica,
            len(data),
        )
        self.send(src, FetchAnswer(incarnation, fetch_id, row, data))

    def serve_session_fetch(
        self, src: int, incarnation: int, fetch_id: int, request: m.FetchRequest
    ) -> None:
        """The production FetchHandler, sessions and all; the payload is read at once
        (the RPC server preads it before the next event)."""
        assert self.handler is not None  # every broker has sessions, or none
        req = Request(None, 0, fetch_id, "", {}, memoryview(b""), str(src), request)  # type: ignore[arg-type]
        response = self.cluster.aio.run(self.handler(req))
        data = b"".join(
            fs.pread(part.file, part.length, part.offset)  # type: ignore[arg-type]
            if isinstance(part, FileRange)
            else bytes(part)
            for part in response.payload
        )
        self.send(src, SessionFetchAnswer(incarnation, fetch_id, response.message, data))

    def on_session_answer(self, fetch_id: int, response: m.FetchResponse, data: bytes) -> None:
        """SourceFetcher's answer handling: a refused session means a full fetch at once;
        every partition answered has its row rebuilt; an error backs off."""
        fetcher = self.fetcher
        if self.fetch_out is None or self.fetch_out[0] != fetch_id or fetcher is None:
            return  # a duplicate or an answer we stopped waiting for
        _, replica, request = self.fetch_out
        self.fetch_out = None
        if response.error_code and response.error_code not in SESSION_ERRORS:
            self.cluster.fail(f"broker {self.actor_id}: fetch answered {response.error_code}")
        if not fetcher.session.on_response(response):
            self.note(f"fetch session refused ({errors.error_name(response.error_code)})")
            self.maybe_fetch(self.clock())
            return
        view, position = memoryview(data), 0
        for t in response.topics:
            for result in t.partitions:
                part = view[position : position + result.nbytes]
                position += result.nbytes
                fetcher.stale = True  # its log, epoch or back-off may move: a new row
                if replica is not self.replica or (t.topic, result.partition) != (TOPIC, 0):
                    continue  # removed or re-created while the fetch was out
                if not self.apply_fetched(replica, request, result, part):
                    return
        self.maybe_fetch(self.clock())

    # -- fetch: the follower's side, as the fetcher hands the bytes to the driver ------

    def apply_fetched(
        self,
        replica: SimReplica,
        request: FetchRequest,
        result: m.FetchPartitionResult,
        view: memoryview,
    ) -> bool:
        """Hand one partition's answer to the driver; False: backing off."""
        try:
            effects = replica.driver.on_fetch_response(fetch_response(request, result, view), view)
        except (ReplicationInvariantError, RilletError, OSError) as e:
            self.fetch_error = repr(e)
            self.note(f"applying a fetch failed: {e!r}")
            self.fetch_backoff_until = self.clock() + FETCH_BACKOFF_MS
            return False
        if result.error_code != errors.NONE and not effects:
            self.fetch_backoff_until = self.clock() + FETCH_BACKOFF_MS
            return False
        return True

    def on_fetch_answer(self, fetch_id: int, result: m.FetchPartitionResult, data: bytes) -> None:
        if self.fetch_out is None or self.fetch_out[0] != fetch_id:
            return  # a duplicate or an answer we stopped waiting for
        _, replica, request = self.fetch_out
        self.fetch_out = None
        if replica is not self.replica:
            return  # removed or re-created while the fetch was out
        if self.apply_fetched(replica, request, result, memoryview(data)):
            self.maybe_fetch(self.clock())

    # -- produce ----------------------------------------------------------------------

    @guarded
    def produce(self, batch: bytes, values: Sequence[bytes]) -> None:
        """An acks=all produce from a client: refused, or appended and awaited."""
        replica = self.replica
        if replica is None:
            return
        pid = values[0]
        # Registered first: the driver may answer it before append_as_leader returns.
        self.cluster.pending[pid] = (replica, replica.log.log_end_offset, tuple(values))
        try:
            outcome = replica.driver.append_as_leader(
                bytearray(batch), ACKS_ALL, MIN_ISR, pid, self.clock() + 1000
            )
            code = outcome.error_code
        except OSError:
            code = errors.code_of("KAFKA_STORAGE_ERROR")
        if code != errors.NONE:
            self.cluster.pending.pop(pid, None)

    def complete_produce(self, replica: SimReplica, produce_id: Hashable, code: int) -> None:
        pending = self.cluster.pending.pop(produce_id, None)
        if code == errors.NONE and pending is not None:
            self.cluster.invariants.on_ack(replica.topic_id, pending[1], pending[2])

    # -- what the Replica's driver sends to the controller -----------------------------

    def send_alter_partition(self, replica: SimReplica, proposal: ProposeAlterPartition) -> None:
        """Queued in the link's AlterPartitionQueue, as the ReplicaManager queues it (a
        failed request answers with its error)."""
        assert self.link is not None
        key = (replica.serial, proposal.proposal_id)
        self.alter_out[key] = replica
        self.link.alter_partition(TOPIC, 0, proposal, lambda r: self.on_alter_answer(key, r))


def abandon(logs: LogManager) -> None:
    """What kill -9 does to a LogManager: every descriptor closes, nothing is flushed,
    no checkpoint or marker is written, and the data-dir lock goes with the process."""
    for log in logs.logs.values():
        for retired in log.due_retired(None):
            retired.segment.close()
        for seg in log.segments:
            seg.close()
        log.closed = True
    if logs._lock_fd is not None:  # noqa: SLF001 - the process's lock dies with it
        fs.close(logs._lock_fd)  # noqa: SLF001
        logs._lock_fd = None  # noqa: SLF001
    logs.logs.clear()


# ---------------------------------------------------------------------------
# invariants


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    last_offset: int
    leader_epoch: int
    crc: int
    record_count: int


class ReplicationInvariants:
    """The committed records of the current topic incarnation, and the checks."""

    def __init__(self, cluster: ReplicationCluster) -> None:
        self.cluster = cluster
        self.reset(None)

    def reset(self, topic_id: str | None) -> None:
        """A new topic incarnation starts with nothing committed."""
        self.topic_id = topic_id
        self.committed: dict[int, tuple[bytes | None, bytes | None]] = {}  # offset -> (k, v)
        self.committed_end = 0
        self.latest: dict[bytes | None, int] = {}  # key -> its last committed offset
        self.batches: dict[int, CommittedBatch] = {}  # committed batches by base offset
        self.lost_batches: dict[int, CommittedBatch] = {}  # see lost_by_design
        for broker in self.cluster.brokers.values():
            broker.hw_may_fall_to, broker.may_hold_lost = None, False
        self.acked = 0
        self.unverified: dict[int, bytes] = {}  # acked above the committed end: offset -> v

    def replicas(self):  # noqa: ANN201 - the brokers holding the current topic's replica
        for broker in self.cluster.brokers.values():
            r = broker.replica
            if r is not None and self.topic_id is not None and r.topic_id == self.topic_id:
                yield broker, r

    def check(self) -> None:
        p = self.cluster.quorum.newest_image().partition(TOPIC, 0)
        for broker in self.cluster.brokers.values():
            if broker.may_lack_acked and broker.alive and p is not None:
                # Back in the ISR beside another member: it caught up with a leader (or,
                # elected as the last member, another caught up with it).
                broker.may_lack_acked = not (broker.actor_id in p.isr and len(p.isr) > 1)
        for broker, replica in self.replicas():
            state, log = replica.state, replica.log
            hw = state.high_watermark
            floor = broker.seen_hw
            if broker.hw_may_fall_to is not None:
                floor = min(floor, broker.hw_may_fall_to)
                if hw <= broker.hw_may_fall_to:
                    broker.hw_may_fall_to = None
            if hw < floor:
                self.cluster.fail(
                    f"broker {broker.actor_id}: HW went back {broker.seen_hw} -> {hw}"
                )
            broker.seen_hw = hw
            if log.log_start_offset > hw:
                self.cluster.fail(
                    f"broker {broker.actor_id} ({state.role.value}): log start "
                    f"{log.log_start_offset} passed its HW {hw} (records above the HW removed)"
                )
            if state.is_leader:
                self.commit_up_to(broker, hw)
                self.check_latest(broker)
            self.check_prefix(broker, min(hw, self.committed_end), "below its HW")
        for offset, value in list(self.unverified.items()):
            if offset < self.committed_end:
                held = self.committed.get(offset)
                if held is None or held[1] != value:
                    self.cluster.fail(f"acknowledged {value!r} at {offset}, committed {held} there")
                del self.unverified[offset]

    def check_latest(self, leader: BrokerActor) -> None:
        """What the leader would answer ListOffsets latest with covers every committed
        record: a reader taking it as "everything acknowledged so far" misses none. A
        new leader whose HW (the one it knew as a follower) is behind its epoch start
        answers OFFSET_NOT_AVAILABLE instead, until its followers catch up. Only the
        controller's current leader is held to it: a deposed leader that has not heard
        yet (partitioned away) answers from its old epoch, and a client that knows the
        new epoch is refused there (FENCED_LEADER_EPOCH)."""
        state = leader.replica.state
        if state.high_watermark_behind_epoch_start or leader.hw_may_fall_to is not None:
            return
        if not self.recognized_leader(leader):
            return
        if state.high_watermark < self.committed_end:
            self.cluster.fail(
                f"leader {leader.actor_id} would answer latest = {state.high_watermark}, "
                f"below the committed end {self.committed_end}"
            )

    def on_leader_hw(self, leader: BrokerActor, hw: int) -> None:
        replica = leader.replica
        if replica is not None and replica.topic_id == self.topic_id:
            self.commit_up_to(leader, hw)

    def commit_up_to(self, leader: BrokerActor, hw: int) -> None:
        """A leader's HW commits its records below it; it must hold every one of them."""
        self.check_prefix(leader, min(hw, self.committed_end), "leader below its HW")
        start = self.committed_end
        if hw <= start:
            return
        if leader.log.log_start_offset > start:
            self.cluster.fail(
                f"leader {leader.actor_id} commits up to {hw} but its log starts at "
                f"{leader.log.log_start_offset}, past the committed end {start}"
            )
        expected = start
        end = start
        for h, recs in read_batches(leader.log, start, hw):
            self.batches[h.base_offset] = CommittedBatch(
                h.last_offset, h.partition_leader_epoch, h.crc, h.record_count
            )
            for r in recs:
                if r.offset != expected:
                    self.cluster.fail(
                        f"leader {leader.actor_id} commits up to {hw} but holds no record "
                        f"at [{expected}, {r.offset})"
                    )
                self.committed[r.offset] = (r.key, r.value)
                self.latest[r.key] = r.offset
                expected = r.offset + 1
            end = h.last_offset + 1
        if end != expected:
            self.cluster.fail(
                f"leader {leader.actor_id} commits up to {hw} but holds no record at "
                f"[{expected}, {end})"
            )
        self.committed_end = end

    def check_prefix(self, broker: BrokerActor, end: int, where: str) -> None:
        """The broker's records below ``end`` are the committed ones, or legitimately
        gone. Incremental: records only change by truncation (which lowers
        ``checked_end``) and compaction (which resets it)."""
        log = broker.log
        start = max(log.log_start_offset, broker.checked_end)
        if end <= start:
            return
        expected = start
        for h, recs in read_batches(log, start, end):
            ref = self.batches.get(h.base_offset)
            if (
                ref is None
                or ref.leader_epoch != h.partition_leader_epoch
                or (h.last_offset > ref.last_offset)
            ):
                lost = self.lost_batches.get(h.base_offset)
                if (
                    broker.may_hold_lost
                    and lost is not None
                    and lost.leader_epoch == h.partition_leader_epoch
                    and h.last_offset <= lost.last_offset
                ):
                    break  # from here on its log is the lost history: it truncates next
                self.cluster.fail(
                    f"broker {broker.actor_id} ({where}) holds batch {h.base_offset}.."
                    f"{h.last_offset} epoch {h.partition_leader_epoch}; committed {ref}"
                )
            if h.record_count == ref.record_count and h.crc != ref.crc:
                self.cluster.fail(
                    f"broker {broker.actor_id} ({where}): batch at {h.base_offset} has "
                    f"CRC {h.crc:#x}, committed {ref.crc:#x}: not byte-identical"
                )
            for r in recs:
                if r.offset < expected:
                    continue
                self.check_gone(broker, expected, r.offset, where)
                held = self.committed.get(r.offset)
                if held != (r.key, r.value):
                    self.cluster.fail(
                        f"broker {broker.actor_id} ({where}) holds {(r.key, r.value)} at "
                        f"{r.offset}, committed {held}"
                    )
                expected = r.offset + 1
            self.check_gone(broker, expected, h.last_offset + 1, where)
            expected = max(expected, h.last_offset + 1)
        broker.checked_end = max(broker.checked_end, expected)

    def check_gone(self, broker: BrokerActor, start: int, end: int, where: str) -> None:
        """Committed records in [start, end) that the broker lacks: only a later
        committed record of the same key may have replaced them (compaction)."""
        for offset in range(start, end):
            held = self.committed.get(offset)
            if held is None or self.latest[held[0]] <= offset:
                self.cluster.fail(
                    f"broker {broker.actor_id} ({where}) lacks committed offset {offset} "
                    f"({held}), which no later committed record of its key replaced"
                )

    def recognized_leader(self, broker: BrokerActor) -> bool:
        """The controller's current leader in its current epoch. A broker that was paused
        (SIGSTOP) handles the metadata that queued up meanwhile, oldest first, so it may
        apply an old image naming it leader in an old epoch: that is not an election, and
        "a new leader holds every committed record" is about elections."""
        p = self.cluster.quorum.newest_image().partition(TOPIC, 0)
        state = broker.state
        return (
            p is not None
            and state is not None
            and p.topic_id == self.topic_id
            and p.leader == broker.actor_id
            and p.leader_epoch == state.leader_epoch
        )

    def check_epochs(self, broker: BrokerActor, where: str) -> None:
        """The replica's leader-epoch cache agrees with its batch headers: the entry at
        or below each batch's base offset names that batch's epoch. A leader answers
        followers' divergence checks from this cache; a wrong entry makes it name the
        wrong truncation point (an unclean restart that trusted stale checkpoints)."""
        log = broker.log
        entries = log.epochs.entries()
        starts = [s for _, s in entries]
        for h, _ in read_batches(log, log.log_start_offset, log.log_end_offset):
            i = bisect.bisect_right(starts, h.base_offset) - 1
            cached = entries[i][0] if i >= 0 else None
            if cached != h.partition_leader_epoch:
                self.cluster.fail(
                    f"broker {broker.actor_id} ({where}): batch {h.base_offset}.."
                    f"{h.last_offset} is in epoch {h.partition_leader_epoch}, its epoch "
                    f"cache says {cached}: {entries}"
                )

    def on_become_leader(self, broker: BrokerActor) -> None:
        """A new leader holds every committed record (no committed record is lost),
        except in the window ``lost_by_design`` describes."""
        if not self.recognized_leader(broker):
            return
        self.check_epochs(broker, "as new leader")
        self.lost_by_design(broker)
        if broker.log.log_end_offset < self.committed_end:
            self.cluster.fail(
                f"new leader {broker.actor_id} ends at {broker.log.log_end_offset}"
                f", below the committed {self.committed_end}"
            )
        self.check_prefix(broker, self.committed_end, "as new leader")

    def lost_by_design(self, broker: BrokerActor) -> None:
        """The window acks=all without fsync leaves, in Kafka too (KIP-966 closes it with
        eligible leader replicas): a replica that lost unsynced records in a power cut is
        elected as the ISR's last member. Fencing takes a replica out of the ISR except
        its last member, so a power cut on a fully replicated partition can still end
        there when the other members leave the ISR (fenced, shut down) before the
        controllers fence it. What it lacks of the committed records is lost: the
        committed records end where its log stops agreeing with them, acknowledgements
        past that point are void, and every replica's HW may fall back to it once (a
        follower truncates to the new leader's log; one that was down meanwhile when it
        fetches again, and until its first truncation it may hold batches of the lost
        history below its HW). A later committed record of a key stays in ``latest``: a
        replica may have compacted older records of the key on its account."""
        p = self.cluster.quorum.newest_image().partition(TOPIC, 0)
        if not broker.may_lack_acked or p is None or tuple(p.isr) != (broker.actor_id,):
            return
        log = broker.log
        agreed = min(log.log_end_offset, self.committed_end)
        for h, _ in read_batches(log, log.log_start_offset, agreed):
            ref = self.batches.get(h.base_offset)
            if (
                ref is None
                or ref.leader_epoch != h.partition_leader_epoch
                or h.last_offset > ref.last_offset
            ):
                agreed = h.base_offset
                break
        if agreed >= self.committed_end:
            return
        self.cluster.trace.add(
            self.cluster.clock.now_ms,
            f"broker {broker.actor_id}, which lost unsynced records in a power cut, is "
            f"elected as the ISR's last member: committed records [{agreed}, "
            f"{self.committed_end}) are lost (acks=all without fsync: not checked)",
        )
        self.cluster.lost_by_design += 1
        self.committed = {o: kv for o, kv in self.committed.items() if o < agreed}
        self.lost_batches.update({b: c for b, c in self.batches.items() if b >= agreed})
        self.batches = {b: c for b, c in self.batches.items() if b < agreed}
        self.unverified = {o: v for o, v in self.unverified.items() if o < agreed}
        self.committed_end = agreed
        for other in self.cluster.brokers.values():
            other.hw_may_fall_to = agreed
            other.checked_end = min(other.checked_end, agreed)
            other.may_hold_lost = other is not broker

    def on_ack(self, topic_id: str, first_offset: int, values: Sequence[bytes]) -> None:
        if topic_id != self.topic_id:
            return
        self.acked += len(values)
        for i, value in enumerate(values):
            self.unverified[first_offset + i] = value


def read_batches(log: Log, start: int, end: int):  # noqa: ANN201
    """(header, records) of every whole batch of ``log`` in [start, end), read through
    ``Log.read_bytes`` as a fetch reads them."""
    offset = start
    while offset < end:
        data = log.read_bytes(offset, 1 << 16, end)
        if not data:
            return
        for pos, h in records.iter_batches(data):
            yield h, records.decode_batch(data, pos, h)
            offset = h.last_offset + 1


# ---------------------------------------------------------------------------
# the cluster and its faults


class ReplicationCluster:
    def __init__(
        self,
        seed: int,
        chaos_ms: int = 8000,
        echo_trace: bool = False,
        max_open_segments: int | None = None,
        fetch_sessions: bool = False,
    ) -> None:
        self.seed = seed
        self.chaos_ms = chaos_ms
        # Every broker's fd cache bound (storage/fdcache.py); None: the default, which
        # never closes anything here. Draws nothing from the seed's random streams.
        self.max_open_segments = max_open_segments
        # Followers fetch through fetch sessions (the production FetchHandler and
        # session cache at the leader, FetchSessionBuilder and kept rows at the
        # follower). What only sessions draw (session ids, the cache's size, dropped
        # caches) comes from a stream of its own: the main streams' seeds stay as they
        # are, and a seed without sessions replays as before.
        self.fetch_sessions = fetch_sessions
        self.session_rng = random.Random(f"fetch-sessions-{seed}")
        # One slot: the two followers' sessions evict each other at every full fetch.
        self.session_slots = self.session_rng.choice([1, 2, 1000, 1000])
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.scheduler = Scheduler(self.clock)
        self.network = SimNetwork(
            self.scheduler, random.Random(self.rng.getrandbits(64)), self.random_link_faults()
        )
        self.trace = Trace(echo=echo_trace)
        # Every broker's files live in one simulated file system, installed for the run.
        self.fs = SimFileSystem(rng=random.Random(self.rng.getrandbits(64)))
        self.root = Path("/sim")
        self.aio = SyncRunner()
        # Controllers' clocks only leap forward: the Raft core refuses one going back.
        self.clocks = {
            n: DriftingClock.random(self.clock, self.rng, monotonic=n in CONTROLLER_IDS)
            for n in (*BROKER_IDS, *CONTROLLER_IDS)
        }
        self.quorum = ControllerQuorum(
            seed,
            self.rng,
            self.clock,
            self.scheduler,
            self.network,
            self.trace,
            self.fail,
            dict(self.clocks),
            ControllerConfig(
                broker_session_timeout_ms=SESSION_TIMEOUT_MS, broker_heartbeat_interval_ms=100
            ),
        )
        self.brokers = {b: BrokerActor(self, b) for b in BROKER_IDS}
        for broker in self.brokers.values():
            self.network.register(broker)
        self.invariants = ReplicationInvariants(self)
        self.pending: dict[object, tuple[SimReplica, int, tuple[bytes, ...]]] = {}
        self.writes = 0
        self.quiet = False  # the last phase: no more writes
        self.recreations = 0
        self.power_cut: int | None = None  # a broker that lost unsynced writes, not yet whole
        self.lost_by_design = 0  # elections in the window of ReplicationInvariants.lost_by_design
        self.armed = False  # a crash is armed in the file system
        self.replica_serial = 0
        self.links = 0
        # At the heal, per broker: its link and the heartbeat calls that link had started.
        self.heartbeats_at_heal: dict[int, tuple[int, int]] = {}
        self.creating = self.recreating = False  # an admin's CreateTopics/DeleteTopics out
        self._chaos = True

    @property
    def chaos(self) -> bool:
        return self._chaos

    @chaos.setter
    def chaos(self, on: bool) -> None:
        self._chaos = self.quorum.chaos = on

    def close(self) -> None:
        self.aio.close()

    def check_descriptor(self, error: BaseException) -> None:
        """EBADF is never injected: a closed descriptor used is a bug (on a real system
        its number may name another file by then, and a write through it lands there)."""
        if isinstance(error, OSError) and error.errno == errno.EBADF:
            self.fail(f"a closed descriptor was used: {error!r}")

    def fail(self, text: str) -> NoReturn:
        replay = REPLAY_COMMAND.format(seed=self.seed)
        if self.max_open_segments is not None:
            replay = f"RILLET_SIM_FD_BOUND={self.max_open_segments} {replay}"
            text = f"(fd bound {self.max_open_segments}) {text}"
        if self.fetch_sessions:
            replay = f"RILLET_SIM_SESSIONS=1 {replay}"
            text = f"(fetch sessions, {self.session_slots} slots) {text}"
        raise SimulationFailure(
            f"seed {self.seed}, {self.clock.now_ms} ms: {text}\n"
            f"replay: {replay}\n"
            f"--- trace tail ---\n{self.trace.tail()}"
        )

    def random_link_faults(self) -> LinkFaults:
        return LinkFaults(
            loss_rate=self.rng.choice([0.0, 0.02, 0.1]),
            duplicate_rate=self.rng.choice([0.0, 0.05]),
            min_delay_ms=1,
            max_delay_ms=self.rng.choice([3, 20, 60]),
        )

    def new_link(self, broker: BrokerActor) -> ControllerLink:
        """broker/link for a broker process that starts now."""
        self.links += 1
        return ControllerLink(
            self.links,
            broker.actor_id,
            broker.send,
            broker.clock,
            random.Random(self.rng.getrandbits(64)),
            broker.on_metadata,
            broker.on_shut_down,
            broker.note,
        )

    def run(self) -> None:
        with fs.install(self.fs):
            self.fs.makedirs(str(self.root))
            self.run_installed()

    def run_installed(self) -> None:
        self.quorum.start()
        for broker in self.brokers.values():
            broker.start()
        self.scheduler.after(300, self.create_topic, "create topic")
        self.scheduler.after(500, self.ensure_topic, "ensure topic")
        self.scheduler.after(400, self.write, "write")
        self.scheduler.after(self.rng.randint(500, 1500), self.inject_fault, "fault")
        self.scheduler.run_until(self.chaos_ms, self.after_event)
        self.heal()
        self.check_liveness()

    def create_topic(self, then: Callable[[], None] | None = None) -> None:
        """An admin's CreateTopics through the active controller, retried until it
        succeeds (or finds the topic made by an attempt whose answer was lost); the new
        topic id starts a new incarnation for the invariants. ``then`` runs once it is
        there."""
        replicas = list(self.brokers)
        self.rng.shuffle(replicas)  # the first is the preferred leader
        configs = {**TOPIC_CONFIGS, "cleanup.policy": self.rng.choice(CLEANUP_POLICIES)}
        topic = m.CreatableTopic(TOPIC, -1, -1, [m.ReplicaAssignment(0, replicas)], configs)
        self.creating = True

        def done(code: int) -> None:
            p = self.quorum.newest_image().partition(TOPIC, 0)
            if code not in (errors.NONE, errors.code_of("TOPIC_ALREADY_EXISTS")) or p is None:
                self.trace.add(
                    self.clock.now_ms, f"create topic {TOPIC}: {errors.error_name(code)}"
                )
                self.scheduler.after(100, lambda: self.create_topic(then), "create topic")
                return
            self.creating = False
            if p.topic_id != self.invariants.topic_id:
                self.trace.add(
                    self.clock.now_ms,
                    f"topic {TOPIC} created: id {p.topic_id} on {list(p.replicas)}, "
                    f"{self.quorum.newest_image().topic_config(TOPIC)}",
                )
                self.invariants.reset(p.topic_id)
            if then is not None:
                then()

        self.quorum.create_topic(topic, done)

    def recreate_topic(self, down: BrokerActor | None) -> None:
        """Delete the topic (DeleteTopics through the active controller) and create it
        again (same name, new id) a little later; a broker that is down meanwhile
        restarts after that, so the first image it gets already holds the new topic and
        never the delete. A delete that fails (no active controller, or no answer in
        time) is not retried: the broker comes back as from any crash."""
        self.recreations += 1  # an attempt counts: few topic incarnations per seed
        self.recreating = True

        def deleted(code: int) -> None:
            if self.quorum.newest_image().partition(TOPIC, 0) is not None:
                self.recreating = False
                self.trace.add(
                    self.clock.now_ms, f"delete topic {TOPIC}: {errors.error_name(code)}"
                )
                if down is not None:
                    self.scheduler.after(
                        self.restart_delay(False), lambda: self.restart(down), "restart"
                    )
                return
            self.trace.add(
                self.clock.now_ms,
                f"topic {TOPIC} deleted"
                + (f" while broker {down.actor_id} is down" if down is not None else ""),
            )
            self.invariants.reset(None)

            def restart_down() -> None:
                if down is not None:
                    self.scheduler.after(
                        self.rng.randint(50, 600), lambda: self.restart(down), "restart"
                    )

            def create() -> None:
                self.recreating = False
                self.create_topic(restart_down)

            self.scheduler.after(self.rng.randint(20, 300), create, "re-create topic")

        self.quorum.delete_topic(TOPIC, deleted)

    def ensure_topic(self) -> None:
        """A delete whose answer never came (its controller died) may still commit later,
        under a new leader: the topic is then created again."""
        if (
            not self.creating
            and not self.recreating
            and self.quorum.newest_image().partition(TOPIC, 0) is None
        ):
            self.trace.add(self.clock.now_ms, f"topic {TOPIC} is gone: creating it again")
            self.invariants.reset(None)
            self.create_topic()
        self.scheduler.after(200, self.ensure_topic, "ensure topic")

    def write(self) -> None:
        if self.quiet:
            return
        self.produce_one()
        self.scheduler.after(self.rng.randint(2, 30), self.write, "write")

    def produce_one(self) -> None:
        """One acks=all produce of 1-3 records to a leader, if one takes requests."""
        leaders = [
            b
            for b, r in self.invariants.replicas()
            if r.state.is_leader and b.now() >= b.paused_until and not b.inbox
        ]  # a stopped process reads no requests
        if leaders:
            n = self.rng.choice([1, 1, 1, 2, 3])
            values = [f"w{self.writes + i + 1}".encode() for i in range(n)]
            keys = [f"k{self.rng.randrange(KEYS)}".encode() for _ in range(n)]
            self.writes += n
            batch = records.encode_batch(values, keys, timestamp_ms=self.clock.now_ms)
            self.rng.choice(leaders).produce(batch, values)

    def inject_fault(self) -> None:
        if not self.chaos:
            return
        action = self.rng.choice(
            [
                "crash",
                "crash_leader",
                "isolate",
                "link_faults",
                "heal",
                "pause",
                "shutdown",
                "recreate",
                "power_cut",
                "crash_inside",
                "crash_inside",
                "disk_error",
            ]
            + ["crash_controller", "crash_active", "crash_active", "cut_controller"]
            + ["pause_controller", "clock_step", "clock_step", "heal"]
            + (["lose_quorum"] if self.rng.random() < 0.2 else [])
        )
        if action in CONTROLLER_FAULTS:
            self.inject_controller_fault(action)
        else:
            self.inject_broker_fault(action)
        if self.fetch_sessions and self.session_rng.random() < 0.3:
            self.drop_fetch_sessions()
        self.scheduler.after(self.rng.randint(100, 1000), self.inject_fault, "fault")

    def inject_broker_fault(self, action: str) -> None:
        broker = self.brokers[self.rng.choice(list(self.brokers))]
        if action == "crash_leader":
            broker = next((b for b, r in self.invariants.replicas() if r.state.is_leader), broker)
        self.maybe_clear_power_cut()
        power = action in ("power_cut", "crash_inside")
        if power and (self.power_cut is not None or not self.fully_replicated()):
            action = "crash"  # one unsynced loss at a time, on a fully replicated partition
        if action in ("crash", "crash_leader", "power_cut") and broker.alive:
            if action == "power_cut":
                self.power_cut = broker.actor_id
            broker.crash(power_cut=action == "power_cut")
            delay = self.restart_delay(action == "power_cut")
            self.scheduler.after(delay, lambda: self.restart(broker), "restart")
        elif action == "recreate" and self.recreations < 2:
            down = broker if self.rng.random() < 0.8 else None
            if down is not None:
                if not down.alive:
                    down = None  # already down: its own restart is scheduled
                else:
                    down.crash()
            self.recreate_topic(down)
        elif action == "crash_inside" and broker.alive:
            # The node dies just before one of its next file-system mutations: between a
            # write and its fsync, a truncation and its checkpoint, inside a roll's job.
            n = self.rng.randint(1, 40)
            self.power_cut = broker.actor_id
            self.fs.crash_after(n, str(broker.data_dir), self.rng)
            self.armed = True
            self.trace.add(
                self.clock.now_ms, f"broker {broker.actor_id} will crash in {n} fs mutations"
            )
        elif action == "disk_error" and broker.alive:
            op = self.rng.choice(["write", "fsync", "fsync", "replace"])
            self.fs.fail_next(op, str(broker.data_dir), errno.EIO)
            self.trace.add(self.clock.now_ms, f"broker {broker.actor_id}: next {op} fails EIO")
        elif action == "isolate":
            self.network.isolate(broker.actor_id)
            self.trace.add(self.clock.now_ms, f"isolate broker {broker.actor_id}")
        elif action == "link_faults":
            self.network.faults = self.random_link_faults()
        elif action == "pause" and broker.alive and not broker.inbox:
            broker.pause(self.rng.randint(100, 1500))
        elif action == "shutdown" and broker.alive:
            broker.shutting_down = True
            self.trace.add(self.clock.now_ms, f"broker {broker.actor_id}: controlled shutdown")
        elif action == "heal":
            self.network.heal()
            self.trace.add(self.clock.now_ms, "network healed")

    def drop_fetch_sessions(self) -> None:
        """A broker's session cache forgets every session (as an eviction would): each
        follower's next incremental fetch there is refused and it fetches in full."""
        broker = self.brokers[self.session_rng.choice(BROKER_IDS)]
        if broker.handler is None or broker.manager is None:
            return
        sessions = broker.handler.sessions
        sessions.clear()
        broker.manager.unwatch(sessions.take_closed())
        self.trace.add(self.clock.now_ms, f"broker {broker.actor_id}: fetch sessions dropped")

    def inject_controller_fault(self, action: str) -> None:
        """Controllers crash (the active one often), lose their links to the other
        controllers or to the brokers, pause; now and then a majority goes down for a
        while; a node's clock leaps (a broker's back, too)."""
        quorum, now_ms = self.quorum, self.clock.now_ms
        actor = quorum.actors[self.rng.choice(CONTROLLER_IDS)]
        if action == "crash_active":
            actor = quorum.active() or actor
        if action in ("crash_controller", "crash_active"):
            quorum.crash(actor, "fault injection", self.rng.randint(50, 1000))
        elif action == "lose_quorum":
            down_ms = self.rng.randint(500, 3000)
            for victim in self.rng.sample(list(quorum.actors.values()), 2):
                quorum.crash(victim, "quorum lost", down_ms + self.rng.randint(0, 300))
        elif action == "cut_controller":
            others = [n for n in CONTROLLER_IDS if n != actor.actor_id]
            cut_from = self.rng.choice([others, list(BROKER_IDS), others + list(BROKER_IDS)])
            pairs = self.network.cut_between([actor.actor_id], cut_from)
            self.trace.add(now_ms, f"controller {actor.actor_id} cut from {cut_from}")
            self.scheduler.after(
                self.rng.randint(200, 2500), lambda: self.network.mend(pairs), "mend"
            )
        elif action == "pause_controller" and actor.node is not None and not actor.paused:
            actor.pause(self.rng.randint(100, 1500))
        elif action == "clock_step":
            node = self.rng.choice(sorted(self.clocks))
            step_ms = self.clocks[node].random_step(self.rng)
            self.trace.add(now_ms, f"node {node}: clock steps {step_ms:+} ms")

    def after_event(self) -> None:
        if self.armed and not self.fully_replicated():
            self.fs.cancel_crash()  # the power cut would no longer keep to the rule
            self.armed = False
        self.invariants.check()
        self.quorum.check()

    def restart_delay(self, power_cut: bool) -> int:
        """A node that lost unsynced writes comes back only after the controller fenced
        its old incarnation (and so took it out of every ISR but one it is the last member
        of): while that registration lives it may still be elected, and holds less than
        it acknowledged. Kafka has the same window without fsync (KIP-966's
        unclean-shutdown handling closes it); it is a limit of acks=all without fsync, not
        what this simulation looks for."""
        return (
            self.rng.randint(SESSION_TIMEOUT_MS + 100, 1500)
            if power_cut
            else (self.rng.randint(50, 1500))
        )

    def fully_replicated(self) -> bool:
        p = self.quorum.newest_image().partition(TOPIC, 0)
        return (
            p is not None
            and len(p.isr) == len(self.brokers)
            and all(b.alive for b in self.brokers.values())
        )

    def maybe_clear_power_cut(self) -> None:
        """A node that lost unsynced writes is whole again once back in the ISR: only
        then may another lose power (two at once can lose committed records, as in
        Kafka without fsync)."""
        if self.power_cut is None:
            return
        p = self.quorum.newest_image().partition(TOPIC, 0)
        broker = self.brokers[self.power_cut]
        if p is None or (broker.alive and self.power_cut in p.isr and not self.armed):
            self.power_cut = None

    def restart(self, broker: BrokerActor) -> None:
        """A node that lost power comes back once the controllers fenced its old
        registration (see restart_delay): with failovers that may take longer than one
        session timeout, so it waits for the fence itself."""
        if broker.alive or self.clock.now_ms < broker.restart_not_before:
            return
        if broker.lost_power and self.quorum.newest_image().is_unfenced(broker.actor_id):
            self.scheduler.after(100, lambda: self.restart(broker), "restart")
            return
        broker.start()

    def heal(self) -> None:
        self.chaos = False
        self.armed = False
        self.fs.cancel_crash()
        self.fs.clear_faults()
        self.network.heal()
        self.network.faults = LinkFaults(min_delay_ms=1, max_delay_ms=5)
        self.trace.add(self.clock.now_ms, "=== faults healed: liveness phase ===")
        self.heartbeats_at_heal = {
            b.actor_id: (b.link.link_id, b.link.heartbeats_sent)
            for b in self.brokers.values()
            if b.link is not None
        }
        for actor in self.quorum.actors.values():
            self.quorum.restart(actor)
        for broker in self.brokers.values():
            self.restart(broker)

    def check_quiet(self, bound_ms: int = 5_000) -> None:
        """Then the writes stop: every follower learns the leader's log end and high
        watermark (through a session only if the leader marks the partition for it when
        the HW moves), and, idle and caught up, stays in the ISR for several
        replica.lag.time.max.ms, and also when one write comes after that idle spell (a
        follower its session's fetches left unread is caught up as of its session's last
        fetch, not of its last read: its empty fetches only move the session's clock)."""
        self.quiet = True
        self.run_until_settled(bound_ms, None)
        p = self.quorum.newest_image().partition(TOPIC, 0)
        assert p is not None
        self.trace.add(self.clock.now_ms, f"=== quiet and caught up: {p} ===")
        self.run_checking_isr(3 * LAG_MS, p)
        self.produce_one()
        self.run_until_settled(bound_ms, p)
        self.run_checking_isr(LAG_MS, p)
        self.run_until_settled(bound_ms, p)

    def run_until_settled(self, bound_ms: int, isr_of: Any) -> None:
        deadline = self.clock.now_ms + bound_ms
        while not self.settled():
            if self.clock.now_ms >= deadline:
                self.fail(f"quiet: replicas still apart after {bound_ms} ms\n{self.states()}")
            self.run_checking_isr(20, isr_of)

    def run_checking_isr(self, duration_ms: int, p: Any) -> None:
        """Run ``duration_ms``; with ``p`` (an image Partition), no ISR change on the
        way: none committed, none proposed."""
        until = self.clock.now_ms + duration_ms
        while self.clock.now_ms < until:
            self.scheduler.run_until(min(until, self.clock.now_ms + 20), self.after_event)
            if p is None:
                continue
            now = self.quorum.newest_image().partition(TOPIC, 0)
            leaders = [r.state for _, r in self.invariants.replicas() if r.state.is_leader]
            if now != p or any(s.isr != p.isr or s.pending_isr_change for s in leaders):
                self.fail(
                    f"quiet: idle caught-up followers' ISR changed: {p} -> {now}\n{self.states()}"
                )

    def settled(self) -> bool:
        """Three live replicas of the current topic at one log end and high watermark,
        all in the ISR, and no ISR change in flight, every node running and no
        controlled shutdown under way (what the faults set going before they healed is
        not the quiet phase's)."""
        held = list(self.invariants.replicas())
        ends = {(r.log.log_end_offset, r.state.high_watermark) for _, r in held}
        # A follower learns the leader's log start (retention) from its fetches.
        start = max((r.log.log_start_offset for _, r in held if r.state.is_leader), default=0)
        p = self.quorum.newest_image().partition(TOPIC, 0)
        return (
            len(held) == 3
            and len(ends) == 1
            and p is not None
            and len(p.isr) == 3
            and next(iter(ends))[0] == next(iter(ends))[1]
            and not any(r.state.pending_isr_change for _, r in held)
            and all(r.log.log_start_offset >= start for _, r in held)
            and all(
                b.alive and not b.shutting_down and b.now() >= b.paused_until
                for b in self.brokers.values()
            )
            and not any(a.paused for a in self.quorum.actors.values())
            and all(self.heartbeat_since_heal(b) for b in self.brokers.values())
            and all(self.leader_heard_at_its_end(r.state) for _, r in held)
        )

    @staticmethod
    def leader_heard_at_its_end(state: PartitionState) -> bool:
        """A leader's own view: every follower fetched at its log end in this leader epoch.
        Equal logs are not enough: with no writes, a follower that has not fetched from a
        new leader yet (its metadata fetch lost to a cut just before the heal holds the
        next one back for a request timeout) holds the same log, and the leader, which
        never heard from it, shrinks it out of the ISR a lag time later."""
        if not state.is_leader:
            return True
        end = state.log_end_offset()
        return all(
            state.follower_log_end_offset(r) == end for r in state.replicas if r != state.broker_id
        )

    def heartbeat_since_heal(self, broker: BrokerActor) -> bool:
        """The controller answered a heartbeat ``broker`` sent after the heal. Until then
        its session may be lapsing from the faults: a heartbeat lost to a cut just before
        the heal holds the next one back for a request timeout, and the controller fences
        the broker though it is caught up and reachable now."""
        link = broker.link
        if link is None:
            return False
        link_id, sent = self.heartbeats_at_heal.get(broker.actor_id, (None, 0))
        return link.link_id != link_id or link.heartbeat_answered > sent

    def states(self) -> str:
        return "\n".join(b.status() for b in self.brokers.values())

    def check_liveness(self, bound_ms: int = 10_000) -> None:
        """After healing, a controller is active again, the ISR refills and a new write is
        acknowledged."""
        deadline = self.clock.now_ms + bound_ms
        acked_before = self.invariants.acked
        while self.clock.now_ms < deadline:
            self.scheduler.run_until(self.clock.now_ms + 50, self.after_event)
            p = self.quorum.newest_image().partition(TOPIC, 0)
            if p is not None and len(p.isr) == 3 and self.invariants.acked > acked_before:
                self.check_quiet()
                return
        p = self.quorum.newest_image().partition(TOPIC, 0)
        states = "\n".join(b.status() for b in self.brokers.values())
        controllers = "\n".join(
            f"controller {a.actor_id}: {a.node.status() if a.node else 'down'}"
            for a in self.quorum.actors.values()
        )
        self.fail(
            f"liveness: after healing, partition {p} and "
            f"{self.invariants.acked - acked_before} new acks in {bound_ms} ms;"
            f"\n{states}\n{controllers}"
        )


def run_seed(
    seed: int,
    echo_trace: bool = False,
    max_open_segments: int | None = None,
    fetch_sessions: bool = False,
) -> ReplicationCluster:
    cluster = ReplicationCluster(
        seed,
        echo_trace=echo_trace,
        max_open_segments=max_open_segments,
        fetch_sessions=fetch_sessions,
    )
    try:
        cluster.run()
    finally:
        cluster.close()
    return cluster
