"""Creating partition logs through `LogManager` over `SimFileSystem`, crashed anywhere.

Each round creates a few new partitions, one by one (``get_or_create``) or as one
batch (``open_unregistered_many``, then ``register``, as a broker does for a metadata
delta), with a crash armed somewhere inside it or an I/O error injected, then uses
some of the created logs (an append and a flush). A creation that failed is retried in
a later round, as the next metadata delta would; a crash restarts the node: a new
manager opens the data dir (sometimes crashing inside that too), and the broker
re-creates the partitions it was given (an unclaimed directory is claimed).

Checked after every restart:
- start-up opens every directory left (any error is a failure);
- every directory belongs to a partition the broker was given, and records that
  partition's topic id or none;
- every log whose creation returned is there with its topic id (the promise a broker
  relies on before it uses the log), and every flushed record is in its log.
"""

from __future__ import annotations

import errno
import random
import traceback
from dataclasses import dataclass, field
from typing import Any

from rillet.client.wire import records
from rillet.storage import Log, LogManager, fs

from .simfs import SimCrash, SimFileSystem
from .storage_model import NODE, SimulationFailure

REPLAY_COMMAND = (
    "RILLET_SIM_SEED={seed} .venv/bin/pytest tests/test_storage_sim.py -k replay_creation -s"
)
FAULT_OPS = ("create", "write", "fsync", "fsync_dir", "replace", "mkdir")


@dataclass
class CreationModel:
    seed: int
    fsync_persists_entry: bool = False
    echo_trace: bool = False
    rounds: int = 25
    rng: random.Random = field(init=False)
    sim: SimFileSystem = field(init=False)
    manager: LogManager = field(init=False)
    given: set[int] = field(default_factory=set)  # partitions the broker was given
    created: set[int] = field(default_factory=set)  # creation returned (and registered)
    flushed: dict[int, int] = field(default_factory=dict)  # partition -> records flushed
    pending: list[int] = field(default_factory=list)  # given, creation not returned yet
    trace: list[str] = field(default_factory=list)
    next_partition: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.sim = SimFileSystem(
            fsync_persists_entry=self.fsync_persists_entry,
            rng=random.Random(self.seed * 7919 + 3),
        )

    @staticmethod
    def topic_id(partition: int) -> str:
        return f"id-{partition}"

    def note(self, line: str) -> None:
        self.trace.append(line)
        if self.echo_trace:
            print(line)

    def fail(self, message: str) -> None:
        mode = "ext4" if self.fsync_persists_entry else "strict"
        tail = "\n".join(self.trace[-60:])
        raise SimulationFailure(
            f"log creation sim seed {self.seed} ({mode} mode): {message}\n"
            f"replay: {REPLAY_COMMAND.format(seed=self.seed)}\n"
            f"trace (last 60 lines):\n{tail}"
        )

    # -- running ---------------------------------------------------------------------

    def run(self) -> None:
        self.sim.makedirs(NODE)
        self.sim.sync_all()  # the node's data dir exists, durably
        self.manager = LogManager(NODE, recovery_threads=1, create_threads=1)
        self.manager.startup()
        for n in range(self.rounds):
            self.note(f"[{n}]")
            try:
                self.round()
            except SimCrash:
                self.note("  -> crashed inside the round")
                self.restart()
                continue
            except OSError as exc:
                self.note(f"  -> {exc!r} escaped: retried next round")
            self.sim.cancel_crash()
            self.sim.clear_faults()
            if self.rng.random() < 0.25:
                self.note("crash")
                self.restart()
        self.restart()

    def round(self) -> None:
        new = list(range(self.next_partition, self.next_partition + self.rng.randint(1, 5)))
        self.next_partition = new[-1] + 1
        self.given.update(new)
        self.pending.extend(new)
        r = self.rng.random()
        if r < 0.4:
            n = self.rng.randint(1, 12)
            self.note(f"crash before the {n}th next mutating file operation")
            self.sim.crash_after(n, NODE, self.rng)
        elif r < 0.6:
            op = self.rng.choice(FAULT_OPS)
            self.note(f"next {op} fails")
            self.sim.fail_next(op, NODE, errno.EIO)
        self.create_pending()
        for p in sorted(self.created):
            if self.rng.random() < 0.3:
                self.use(p)

    def create_pending(self) -> None:
        todo = sorted(self.pending)
        if not todo:
            return
        if self.rng.random() < 0.5:
            self.note(f"create {todo} one by one")
            for p in todo:
                self.manager.get_or_create("t", p, topic_id=self.topic_id(p))
                self.done(p)
            return
        self.note(f"create {todo} as one batch")
        unclaimed = [p for p in todo if self.manager.get("t", p) is not None]
        for p in unclaimed:  # a directory a restart found without an id
            self.manager.get_or_create("t", p, topic_id=self.topic_id(p))
            self.done(p)
        fresh = [p for p in todo if p not in unclaimed]
        specs = [("t", p, None, self.topic_id(p)) for p in fresh]
        logs = self.manager.open_unregistered_many(specs)
        for p, log in zip(fresh, logs, strict=True):
            self.manager.register("t", p, log)
            self.done(p)

    def done(self, p: int) -> None:
        self.created.add(p)
        self.pending.remove(p)

    def use(self, p: int) -> None:
        log = self.manager.get("t", p)
        assert log is not None
        if log.failure is not None:
            return
        log.append(bytearray(records.encode_batch([b"v%d" % p])), 0)
        log.flush()
        self.flushed[p] = log.log_end_offset
        self.note(f"  t-{p}: appended and flushed to {log.log_end_offset}")

    # -- crashes -----------------------------------------------------------------------

    def restart(self) -> None:
        if not self.sim.down(NODE):
            self.sim.crash(NODE, self.rng)
        self.sim.restart(NODE)
        self.sim.cancel_crash()
        self.sim.clear_faults()
        if self.rng.random() < 0.2:  # crash inside start-up too
            self.sim.crash_after(self.rng.randint(1, 6), NODE, self.rng)
            try:
                self.start()
                self.sim.crash(NODE, self.rng)
            except SimCrash:
                self.note("  crashed inside start-up")
            self.sim.restart(NODE)
            self.sim.cancel_crash()
        self.manager = self.start()
        self.check()
        # The broker is given its partitions again: what is missing or has no id yet
        # is (re-)created in the next round.
        self.pending = sorted(
            p
            for p in self.given
            if (log := self.manager.get("t", p)) is None or log.topic_id is None
        )
        self.created = set(self.given) - set(self.pending)

    def start(self) -> LogManager:
        try:
            manager = LogManager(NODE, recovery_threads=1, create_threads=1)
            manager.startup()
        except SimCrash:
            raise
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.fail(f"start-up raised {exc!r} at {where.filename}:{where.lineno}")
        return manager

    def check(self) -> None:
        logs: dict[int, Log] = {}
        for (topic, p), log in self.manager.logs.items():
            if topic != "t" or p not in self.given:
                self.fail(f"a directory {log.name} for a partition never given")
            if log.topic_id not in (None, self.topic_id(p)):
                self.fail(f"{log.name} records topic id {log.topic_id}")
            logs[p] = log
        self.note(f"  restarted: {len(logs)} log(s), unclaimed {self.unclaimed(logs)}")
        for p in sorted(self.created):
            log = logs.get(p)
            if log is None:
                self.fail(f"t-{p} was created, and is gone")
            if log.topic_id != self.topic_id(p):
                self.fail(f"t-{p} was created, and lost its topic id ({log.topic_id})")
        for p, end in self.flushed.items():
            if logs[p].log_end_offset < end:
                self.fail(f"t-{p} lost flushed records: ends at {logs[p].log_end_offset}")

    @staticmethod
    def unclaimed(logs: dict[int, Log]) -> list[int]:
        return sorted(p for p, log in logs.items() if log.topic_id is None)


def run_creation_seed(seed: int, echo_trace: bool = False, **kwargs: Any) -> CreationModel:
    """Both directory-entry modes of `SimFileSystem`, strict then ext4-like."""
    for persists in (False, True):
        model = CreationModel(seed, fsync_persists_entry=persists, echo_trace=echo_trace, **kwargs)
        with fs.install(model.sim):
            model.run()
    return model
