"""A randomized fault suite on real processes (tests/test_chaos.py, ``make chaos``).

One seed fixes a schedule of faults (random.Random(seed)); the schedule runs against 3
controllers, 3 brokers and the cluster's embedded S3 server (the brokers' remote tier)
while Writers produce acks=all to four RF=3, min.insync.replicas=2 topics: a plain one,
a compacted one, one that the schedule may delete and re-create, and a tiered one
(``remote.storage.enable``, tiny segments, one segment kept locally: its early history
lives only in S3). Faults, one at a time, each held until the writers have made some
progress (answered produce requests, not a guessed time):

- ``kill``: kill -9 a broker, restart it;
- ``pause``: SIGSTOP a broker, SIGCONT it;
- ``bounce``: SIGTERM a broker (a controlled shutdown), restart it;
- ``controller``: kill -9 the active controller, restart it;
- ``two``: kill -9 two brokers at once (acks=all cannot succeed meanwhile), restart both;
- ``recreate``: delete the re-creatable topic and create it again;
- ``s3-stop``: stop the S3 server (connections refused; it keeps its objects), start it;
- ``s3-pause``: SIGSTOP the S3 server (requests hang), SIGCONT it;
- ``coordinator``: kill -9 the broker coordinating the consumer group (the leader of its
  ``__consumer_offsets`` partition), restart it;
- ``consumer``: kill -9 one of the group's consumer processes, start a new one.

Writes must go on through an S3 fault (the hold counts produce answers), as reads of
recent data must. Then the cluster heals (everything running, every ISR full, writes
succeed again, and on every replica of the tiered topic the first segments have left
local disk, so offset 0 is only in S3) and is checked, Jepsen-style: every
acknowledged record is at its acknowledged offset with its value (on the compacted
topic: or superseded by a later record of its key), no record that was never sent, each
key's records in the order sent; on the tiered topic every offset from 0 to the high
watermark is readable, through the remote tier below the local log start, and every
segment the metadata calls finished has both its objects in the bucket; and, once the
cluster is stopped, every replica of a partition holds the same bytes below the high
watermark (compacted partitions: the same latest record per key, since each replica
runs its own cleaner; tiered ones: from the highest local log start of the replicas).

A consumer group (``GroupWorkload``: CONSUMERS processes of tests/group_member.py, auto
commit) reads a fifth topic, written like the others, through the whole schedule. Its
committed offsets are sampled all along (OffsetFetch through Admin). After healing:
every acknowledged record of that topic was consumed by the group at least once, with
the value acknowledged at its offset, and nothing consumed that was never sent; no
sampled committed offset went backwards, and the last ones are at most the log end; the
group is STABLE with each partition owned by exactly one of the live consumers, which
never died but when killed. Records consumed twice (at-least-once: what a killed
consumer or a moved partition had read past its last commit) are counted, not failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import log_records, wait_until
from replication_cluster import (
    BROKERS,
    Client,
    Writer,
    check_acknowledged,
    committed_image,
    replication_cluster,
    run,
)

from rillet.client.admin import Admin, AdminError
from rillet.client.group_coordinator import find_coordinators
from rillet.client.metadata import MetadataClient
from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection
from rillet.controller.metadata.image import SEGMENT_COPY_FINISHED
from rillet.storage import Log
from rillet.storage.remote.layout import segment_keys
from rillet.storage.remote.store import S3ObjectStore
from rillet.tools.local_cluster import LocalCluster

PLAIN, COMPACT, RECREATED, TIERED = "plain", "compact", "recreated", "tiered"
GROUPED = "grouped"  # read by the consumer group
PARTITIONS = {PLAIN: 3, COMPACT: 2, RECREATED: 2, TIERED: 2, GROUPED: 4}
TOPIC_CONFIGS = {
    PLAIN: {"min.insync.replicas": "2"},
    COMPACT: {
        "min.insync.replicas": "2",
        "cleanup.policy": "compact",
        "segment.bytes": "4096",  # small segments, so the cleaner has closed ones to clean
        "min.compaction.lag.ms": "0",
    },
    RECREATED: {"min.insync.replicas": "2"},
    TIERED: {
        "min.insync.replicas": "2",
        "remote.storage.enable": "true",
        "segment.bytes": "4096",  # many closed segments to upload within a schedule
        "local.retention.bytes": "4096",  # and few kept locally: offset 0 only in S3
        "retention.ms": "-1",
    },
    GROUPED: {"min.insync.replicas": "2"},
}
KEYS = {PLAIN: 16, COMPACT: 8, RECREATED: 0, TIERED: 0, GROUPED: 0}
GROUP = "chaos-group"
CONSUMERS = 3
MEMBER = Path(__file__).parent / "group_member.py"
# A killed consumer's partitions move once its session ends: short, so a schedule
# sees that happen (and the group settles at the end) within seconds.
GROUP_SESSION_MS = 6_000
# The cleaner and local retention run every maintenance round, and the remote-log task
# often, so compaction and tiering happen within a schedule.
BROKER_EXTRA = {
    "log.retention.check.interval.ms": 500,
    "remote.log.manager.task.interval.ms": 200,
    # Few offsets partitions (Kafka's default is 50), replicated on all three brokers.
    "offsets.topic.num.partitions": 3,
    "offsets.topic.replication.factor": 3,
    "group.consumer.session.timeout.ms": GROUP_SESSION_MS,
    "group.consumer.heartbeat.interval.ms": 300,
}
KINDS = (
    "kill", "pause", "bounce", "controller", "two", "recreate", "s3-stop", "s3-pause",
    "coordinator", "consumer",
)  # fmt: skip
WEIGHTS = (3, 2, 2, 2, 1, 1, 1, 1, 2, 2)
NO_BROKER = ("controller", "recreate", "s3-stop", "s3-pause", "coordinator", "consumer")
REPLAY = "RILLET_CHAOS_SEED={seed} pytest -s tests/test_chaos.py::test_chaos_replay"


class ChaosFailure(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class Step:
    kind: str
    brokers: tuple[int, ...]  # the brokers it hits (none for NO_BROKER kinds)
    hold: int  # produce answers the writers must get while the fault lasts
    # Also hold until the cluster has acted on it (the victims fenced or out of every
    # ISR, or a new active controller); otherwise the victims may be back before that.
    # (An S3 fault has nothing the cluster acts on: the brokers just retry.)
    acted_on: bool = False
    consumer: int = -1  # the consumer a ``consumer`` fault kills


def schedule(seed: int, steps: int) -> list[Step]:
    """The fault schedule of ``seed``: the same seed, the same schedule."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        kind = rng.choices(KINDS, WEIGHTS)[0]
        count = 2 if kind == "two" else 0 if kind in NO_BROKER else 1
        brokers = tuple(sorted(rng.sample(BROKERS, count)))
        # Two brokers down: only the survivor's refusals and timeouts answer.
        hold = rng.randint(2, 4) if kind == "two" else rng.randint(10, 60)
        acted_on = rng.random() < 0.6
        consumer = rng.randrange(CONSUMERS) if kind == "consumer" else -1
        out.append(Step(kind, brokers, hold, acted_on=acted_on, consumer=consumer))
    return out


@dataclass
class ChaosResult:
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    acked_checked: int = 0
    records_read: int = 0
    bytes_compared: int = 0  # replica bytes found identical (all replicas together)
    remote_records: int = 0  # tiered records read back that no replica held locally
    group_consumed: int = 0  # records the group's consumers handed out, repeats included
    group_duplicates: int = 0  # of those, repeats of a record already consumed
    commit_samples: int = 0  # committed offsets sampled (partitions x samples)
    violations: int = 0
    seconds: float = 0.0


def run_seed(
    cluster_factory: Callable[..., LocalCluster], seed: int, steps: int, *, keep: bool = False
) -> ChaosResult:
    """Run ``seed``'s schedule on a fresh cluster and check it; raises ChaosFailure with
    the replay command. The cluster's directory is removed after a pass (unless
    ``keep``); after a failure it stays, node logs included."""
    print(f"chaos seed {seed}: {schedule(seed, steps)}", flush=True)
    started = time.monotonic()
    result = ChaosResult(seed)
    cluster = replication_cluster(cluster_factory, s3=True, **BROKER_EXTRA)
    try:
        _run(cluster, schedule(seed, steps), result)
    except Exception as e:  # noqa: BLE001 - every failure is reported with its seed
        result.violations += 1
        raise ChaosFailure(
            f"chaos seed {seed} failed: {type(e).__name__}: {e}\n"
            f"node logs under {cluster.data_dir}\nreplay: {REPLAY.format(seed=seed)}"
        ) from e
    finally:
        cluster.stop(kill=True, timeout_s=20)
    result.seconds = time.monotonic() - started
    print(
        f"chaos seed {seed}: passed in {result.seconds:.0f}s, faults {dict(result.faults)}, "
        f"{result.acked_checked} acknowledged records checked, "
        f"{result.bytes_compared} replica bytes compared, "
        f"{result.remote_records} records read back from S3 only, "
        f"group: {result.group_consumed} records consumed, {result.group_duplicates} "
        f"duplicates, {result.commit_samples} committed offsets sampled",
        flush=True,
    )
    if not keep:
        shutil.rmtree(cluster.data_dir, ignore_errors=True)
    return result


def _run(cluster: LocalCluster, steps: list[Step], result: ChaosResult) -> None:
    for topic in PARTITIONS:
        _create(cluster, topic)
    writers = {t: Writer(cluster, t, PARTITIONS[t], keys=KEYS[t]).start() for t in PARTITIONS}
    group = GroupWorkload(cluster)
    try:
        _run_schedule(cluster, steps, result, writers, group)
    finally:
        group.stop()


def _run_schedule(
    cluster: LocalCluster,
    steps: list[Step],
    result: ChaosResult,
    writers: dict[str, Writer],
    group: GroupWorkload,
) -> None:
    try:
        group.start()
        _progress(writers, 20)
        for step in steps:
            # Each fault starts from a healed cluster: a fault on top of an unhealed one
            # can leave every partition offline (an ISR of victims only), and then no
            # produce answer comes to end the hold.
            _heal(cluster)
            group.check_alive()
            _inject(cluster, step, writers, group)
            result.faults[step.kind] += 1
        _heal(cluster)
        group.check_alive()
        _acks_grow(writers)  # writes succeed again on every topic
        # The writers go on until offset 0 of the tiered topic is only in S3: the check
        # then reads it through the remote tier on whichever broker leads.
        remote_only = wait_until(
            lambda: _remote_only(cluster), timeout=120, message=lambda: _tier_state(cluster)
        )
    finally:
        for w in writers.values():
            w.stop()
    result.remote_records = sum(remote_only.values())
    _check_readable_from_zero(cluster, writers[TIERED])
    _check_finished_segments_stored(cluster)
    for topic, w in writers.items():
        counts = check_acknowledged(cluster, w, compacted=topic == COMPACT)
        result.records_read += sum(counts.values())
        result.acked_checked += sum(len(a.values) for a in w.acks if a.incarnation == w.incarnation)
    hws = _high_watermarks(cluster)
    group.check(writers[GROUPED], hws, result)  # stops the consumers
    cluster.stop()  # SIGTERM: quiet, and the logs closed cleanly
    result.bytes_compared = _check_replicas(cluster, hws)


class GroupWorkload:
    """CONSUMERS group consumers in their own processes (tests/group_member.py: auto
    commit every 300 ms) reading GROUPED, each printing what it consumed to a file kept
    beside the node logs, and a thread sampling the group's committed offsets."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.dir = Path(cluster.data_dir) / "group"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.outputs: list[Path] = []
        self.started: Counter[int] = Counter()
        self.samples: dict[int, list[int]] = {}  # partition -> committed offsets seen
        self.went_back: list[str] = []
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._sampler_failure: BaseException | None = None

    def start(self) -> None:
        _pin_broker_ports(self.cluster)
        self.dir.mkdir(parents=True, exist_ok=True)
        for i in range(CONSUMERS):
            self.start_consumer(i)
        self._sampler = threading.Thread(target=self._sampler_main, name="sampler", daemon=True)
        self._sampler.start()

    def start_consumer(self, i: int) -> None:
        self.started[i] += 1
        out = self.dir / f"consumer-{i}.{self.started[i]}.jsonl"
        self.outputs.append(out)
        args = [MEMBER, self.cluster.bootstrap, GROUPED, GROUP, str(GROUP_SESSION_MS)]
        with out.open("wb") as stdout, out.with_suffix(".err").open("wb") as stderr:
            self.procs[i] = subprocess.Popen(
                [sys.executable, *map(str, args)], stdout=stdout, stderr=stderr
            )

    def kill(self, i: int) -> None:
        proc = self.procs.pop(i)
        proc.kill()
        proc.wait()

    def check_alive(self) -> None:
        """Consumers ride out broker, controller and S3 faults: none exits unkilled."""
        for i, proc in self.procs.items():
            if proc.poll() is not None:
                err = self.dir / f"consumer-{i}.{self.started[i]}.err"
                raise AssertionError(f"consumer {i} exited with {proc.returncode}: see {err}")

    def stop(self) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(30)
        for i in list(self.procs):
            self.kill(i)

    def coordinator(self) -> int | None:
        """The broker coordinating the group now (FindCoordinator), None if none."""

        async def ask() -> int | None:
            meta = MetadataClient(self.cluster.bootstrap, request_timeout_ms=2_000)
            try:
                found = (await find_coordinators(meta, [GROUP]))[GROUP]
            except errors.RilletError:
                return None
            finally:
                await meta.close()
            return found.node_id if found.error_code == errors.NONE else None

        return asyncio.run(ask())

    def _admin(self) -> Admin:
        return Admin(self.cluster.bootstrap, timeout_ms=5_000, request_timeout_ms=2_000)

    def _sampler_main(self) -> None:
        try:
            asyncio.run(self._sample())
        except BaseException as e:  # noqa: BLE001 - reported by check()
            self._sampler_failure = e

    async def _sample(self) -> None:
        """Sample the committed offsets (OffsetFetch) until stopped; a fault may make a
        sample fail (no coordinator for a while): that one is skipped."""
        async with self._admin() as admin:
            while not self._stop.is_set():
                with contextlib.suppress(errors.RilletError, AdminError):
                    self._record(await admin.list_group_offsets(GROUP))
                await asyncio.sleep(0.2)  # the sampling period

    def _record(self, offsets: dict[tuple[str, int], Any]) -> None:
        for (topic, p), committed in offsets.items():
            if topic != GROUPED:
                continue
            past = self.samples.setdefault(p, [])
            if past and committed.offset < past[-1]:
                self.went_back.append(f"{GROUPED}-{p}: {past[-1]} -> {committed.offset}")
            past.append(committed.offset)

    def consumed(self) -> list[tuple[int, int, str]]:
        """(partition, offset, value) of every record handed out, repeats included."""
        rows: list[tuple[int, int, str]] = []
        for out in self.outputs:
            for line in out.read_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:  # a killed consumer's last line, cut short
                    continue
                rows += [(p, o, v) for p, o, v in event.get("records", ())]
        return rows

    def describe(self) -> Any:
        async def ask() -> Any:
            async with self._admin() as admin:
                return (await admin.describe_groups([GROUP]))[0]

        return asyncio.run(ask())

    def _describe_or_error(self) -> object:
        try:
            return self.describe()
        except (errors.RilletError, AdminError) as e:
            return e

    def settled(self) -> bool:
        """STABLE, with the live consumers only, each partition owned by one of them."""
        try:
            group = self.describe()
        except (errors.RilletError, AdminError):
            return False
        owners = Counter(
            (t, p) for mb in group.members for t, ps in mb.assignment.items() for p in ps
        )
        every = Counter({(GROUPED, p): 1 for p in range(PARTITIONS[GROUPED])})
        return (
            group.state.lower() == "stable" and len(group.members) == CONSUMERS and owners == every
        )

    def check(self, writer: Writer, hws: dict[tuple[str, int], int], result: ChaosResult) -> None:
        acked = {
            (a.partition, a.base_offset + i): v.decode()
            for a in writer.acks
            for i, v in enumerate(a.values)
        }
        sent = {v.decode() for v in writer.sent}

        def missing() -> set[tuple[int, int]]:
            self.check_alive()
            return acked.keys() - {(p, o) for p, o, _ in self.consumed()}

        wait_until(
            lambda: not missing(),
            timeout=120,
            message=lambda: (
                f"acknowledged records never consumed: {sorted(missing())[:10]}; "
                f"the group: {self._describe_or_error()}"
            ),
        )
        rows = self.consumed()
        seen: dict[tuple[int, int], str] = {}
        for p, o, v in rows:
            where = f"{GROUPED}-{p} offset {o}"
            assert v in sent, f"{where}: consumed {v!r}, never sent"
            assert acked.get((p, o), v) == v, f"{where}: consumed {v!r}, acked {acked[p, o]!r}"
            assert seen.setdefault((p, o), v) == v, f"{where}: consumed {v!r} and {seen[p, o]!r}"
        result.group_consumed, result.group_duplicates = len(rows), len(rows) - len(seen)
        wait_until(
            self.settled, timeout=60, message=lambda: f"group settled: {self._describe_or_error()}"
        )

        async def last() -> dict[tuple[str, int], Any]:
            async with self._admin() as admin:
                return await admin.list_group_offsets(GROUP)

        final = asyncio.run(last())
        self.stop()
        self._record(final)
        if self._sampler_failure is not None:
            raise self._sampler_failure
        assert not self.went_back, f"committed offsets went back: {self.went_back}"
        for p in range(PARTITIONS[GROUPED]):
            committed = final[GROUPED, p].offset
            assert committed <= hws[GROUPED, p], f"{GROUPED}-{p}: committed {committed} > HW"
        result.commit_samples = sum(map(len, self.samples.values()))


def _pin_broker_ports(cluster: LocalCluster) -> None:
    """Restart each broker on the port it bound first, as a real broker keeps its
    advertised address. A consumer process knows the cluster only through its bootstrap
    list and the addresses in its last metadata: once every broker has restarted on a
    new ephemeral port while it could not refresh, it can reach none again (nor could
    Kafka's client). The writers look the addresses up in ``cluster`` instead."""
    for node in cluster.brokers():
        node.broker_port = int(node.listeners["BROKER"].rsplit(":", 1)[1])


def _inject(
    cluster: LocalCluster, step: Step, writers: dict[str, Writer], group: GroupWorkload
) -> None:
    if step.kind == "consumer":
        group.kill(step.consumer)
        try:
            _progress(writers, step.hold)
        finally:
            group.start_consumer(step.consumer)
        return
    if step.kind == "recreate":
        _recreate(cluster, writers[RECREATED])
        return
    if step.kind.startswith("s3-"):
        _s3_fault(cluster, step, writers)
        return
    if step.kind == "controller":
        active = wait_until(
            lambda: max(_active_controller(cluster), 0), message="an active controller"
        )
        victims: tuple[int, ...] = (active,)
    elif step.kind == "coordinator":
        victims = (group.coordinator(),)
    else:
        victims = step.brokers
    for node in victims:
        if step.kind == "pause":
            cluster.pause_node(node)
        else:
            cluster.stop_node(node, kill=step.kind != "bounce")
    try:
        if step.kind == "coordinator":
            # Hold until another broker coordinates the group: its new coordinator
            # loaded the group from the offsets partition and serves it.
            wait_until(
                lambda: group.coordinator() not in victims,
                timeout=60,
                message="the group coordinated by another broker",
            )
        if step.acted_on and step.kind == "controller":
            wait_until(
                lambda: _active_controller(cluster) not in (-1, *victims),
                timeout=60,
                message="a new active controller",
            )
        elif step.acted_on:
            wait_until(
                lambda: _acted_on(cluster, victims),
                timeout=60,
                message=f"brokers {victims} out of every ISR",
            )
        _progress(writers, step.hold)
    finally:
        for node in victims:
            if step.kind == "pause":
                cluster.resume_node(node)
            else:
                cluster.start_node(node)


def _s3_fault(cluster: LocalCluster, step: Step, writers: dict[str, Writer]) -> None:
    """S3 unreachable (stopped: refused) or hanging (paused) while the writers go on:
    produce never waits for the remote tier. The stopped server keeps its objects (it
    writes them to disk on SIGTERM), as a real S3 does through an outage."""
    if step.kind == "s3-pause":
        cluster.pause_s3()
    else:
        cluster.stop_s3()
    try:
        _progress(writers, step.hold)
    finally:
        if step.kind == "s3-pause":
            cluster.resume_s3()
        else:
            cluster.start_s3()


def _local_start(cluster: LocalCluster, broker: int, topic: str, partition: int) -> int | None:
    """The lowest base offset among the replica's segment files (None: no log yet)."""
    d = Path(cluster.config_for(cluster.nodes[broker])["log.dirs"]) / f"{topic}-{partition}"
    bases = [int(f.name[:20]) for f in d.glob("*.log")] if d.is_dir() else []
    return min(bases) if bases else None


def _remote_only(cluster: LocalCluster) -> dict[int, int] | None:
    """Per tiered partition, the offsets below every replica's local log start (held
    only in S3), once that is at least one on each partition; else None."""
    out = {}
    for p in range(PARTITIONS[TIERED]):
        starts = [_local_start(cluster, b, TIERED, p) for b in BROKERS]
        if any(s is None or s == 0 for s in starts):
            return None
        out[p] = min(starts)  # type: ignore[type-var]
    return out


def _tier_state(cluster: LocalCluster) -> str:
    starts = {
        p: [_local_start(cluster, b, TIERED, p) for b in BROKERS] for p in range(PARTITIONS[TIERED])
    }
    return f"offset 0 of {TIERED} only in S3 on every replica; local log starts {starts}"


def _check_readable_from_zero(cluster: LocalCluster, writer: Writer) -> None:
    """Every offset of the tiered topic from 0 up to the high watermark is readable, in
    order, with no gap (no compaction, no transactions: offsets are dense), through the
    remote tier below the leader's local log start. A remote read may fail with a
    retriable error while the brokers reconnect to a restarted S3; it is tried again."""

    async def body(client: Client) -> dict[int, list[int]]:
        info = await client.partitions(TIERED)
        return {
            p: [r.offset for r in await _read_all_retrying(client, info[p].leader, p)]
            for p in range(writer.partitions)
        }

    offsets = run(cluster, body)
    for p, got in offsets.items():
        assert got == list(range(len(got))), f"{TIERED}-{p}: offsets from 0 not dense"


def _check_finished_segments_stored(cluster: LocalCluster) -> None:
    """Every segment of the tiered topic that the committed metadata calls finished has
    its log object and manifest in the bucket: a finished segment whose objects are gone
    can never be read again once its local copies are deleted. The bucket is listed
    before and after reading the image, so a copy finishing meanwhile is found in one of
    them (this topic has no remote retention: its finished segments are never deleted)."""
    tier = cluster.s3
    assert tier is not None
    store = S3ObjectStore(tier.bucket, endpoint_url=tier.endpoint, region=tier.region)

    def listed() -> set[str]:
        return {o.key for o in store.list(f"{TIERED}-")}

    stored = listed()
    image = committed_image(cluster)
    stored |= listed()
    topic = image.topic(TIERED)
    assert topic is not None
    finished = 0
    for p in range(PARTITIONS[TIERED]):
        for seg in image.remote_segments.get((topic.topic_id, p), {}).values():
            if seg.state == SEGMENT_COPY_FINISHED:
                keys = segment_keys(TIERED, topic.topic_id, p, seg.start_offset, seg.segment_id)
                assert {keys.log, keys.manifest} <= stored, f"objects of {seg} are missing"
                finished += 1
    assert finished, "no finished remote segment"


async def _read_all_retrying(client: Client, leader: int, partition: int) -> list:
    """Every record below the HW from offset 0, through Fetch; retriable errors (S3 not
    answering yet) are tried again, for a bounded time (wait_until's default)."""
    out: list = []
    offset = 0
    deadline = time.monotonic() + 60
    conn = await client.conn(leader)
    while True:
        wanted = m.FetchPartition(partition, offset, -1, -1, 0, 1 << 20)
        request = m.FetchRequest(-1, 0, 0, 1 << 20, [m.FetchTopic(TIERED, [wanted])])
        response, payload = await conn.call(request, timeout_ms=30_000)
        result = response.topics[0].partitions[0]
        if result.error_code != errors.NONE:
            assert errors.is_retriable(result.error_code) and time.monotonic() < deadline, (
                f"{TIERED}-{partition} at offset {offset}: {errors.error_name(result.error_code)}"
            )
            await asyncio.sleep(0.2)  # retry backoff, as a consumer's
            continue
        recs = [r for r in records.decode_all(bytes(payload)) if r.offset >= offset]
        if not recs:
            return out
        out.extend(recs)
        offset = recs[-1].offset + 1


def _active_controller(cluster: LocalCluster) -> int:
    described = cluster.describe()
    return -1 if described is None else described.controller_id


def _acted_on(cluster: LocalCluster, victims: tuple[int, ...]) -> bool:
    """Every other broker sees no partition led by the victims, nor any victim in an
    ISR that has another member. (A partition whose ISR holds only victims keeps its
    last member in the ISR and goes offline, as in Kafka: the ISR never shrinks to
    nothing, so that member, holding every committed record, can lead again.)"""
    for topic in PARTITIONS:
        views = _broker_metadata(cluster, topic, skip=victims)
        for t in views.values():
            if t is None or t.error_code != errors.NONE:
                return False
            for p in t.partitions:
                offline = set(p.isr) <= set(victims)
                if p.leader_id in victims or (set(p.isr) & set(victims) and not offline):
                    return False
    return True


def _progress(writers: dict[str, Writer], answers: int) -> None:
    """Wait until the writers together have had ``answers`` more produce answers."""
    target = sum(w.attempts for w in writers.values()) + answers
    wait_until(
        lambda: sum(w.attempts for w in writers.values()) >= target,
        timeout=120,
        message=lambda: (
            f"{answers} produce answers; errors { {t: w.errors_seen for t, w in writers.items()} }"
        ),
    )


def _acks_grow(writers: dict[str, Writer], by: int = 20) -> None:
    targets = {t: w.acked_count() + by for t, w in writers.items()}
    wait_until(
        lambda: all(w.acked_count() >= targets[t] for t, w in writers.items()),
        timeout=120,
        message=lambda: (
            f"{by} more acks on every topic; errors "
            f"{ {t: w.errors_seen for t, w in writers.items()} }"
        ),
    )


def _broker_metadata(
    cluster: LocalCluster, topic: str, skip: tuple[int, ...] = ()
) -> dict[int, m.MetadataTopic | None]:
    """Each running broker's own view of ``topic`` (None: it did not answer), but
    those in ``skip`` (a paused broker would not answer)."""

    async def body(client: Client) -> dict[int, m.MetadataTopic | None]:
        out: dict[int, m.MetadataTopic | None] = {}
        for b in client.live_brokers():
            if b in skip:
                continue
            try:
                conn = await client.conn(b)
                response, _ = await conn.call(m.MetadataRequest([topic]), timeout_ms=3000)
                out[b] = response.topics[0]
            except errors.RilletError:
                out[b] = None
        return out

    return run(cluster, body)


def _full(topic: str, t: m.MetadataTopic | None) -> bool:
    return (
        t is not None
        and t.error_code == errors.NONE
        and {p.partition for p in t.partitions} == set(range(PARTITIONS[topic]))
        and all(p.leader_id >= 0 and sorted(p.isr) == sorted(p.replicas) for p in t.partitions)
    )


def _all_full(cluster: LocalCluster, topic: str) -> bool:
    """Every broker is running and sees every partition of ``topic`` led, ISR full."""
    views = _broker_metadata(cluster, topic)
    return set(views) == set(BROKERS) and all(_full(topic, t) for t in views.values())


def _create(cluster: LocalCluster, topic: str) -> None:
    async def body(client: Client) -> bool:
        try:
            await client.create_topic(topic, PARTITIONS[topic], 3, TOPIC_CONFIGS[topic])
        except AssertionError:  # e.g. the deletion not yet complete: try again
            return False
        return True

    wait_until(lambda: run(cluster, body), timeout=60, message=f"{topic} created")
    wait_until(lambda: _all_full(cluster, topic), timeout=60, message=f"{topic} on every broker")


def _recreate(cluster: LocalCluster, writer: Writer) -> None:
    """Delete the topic and create it again. Every broker must have seen the deletion
    before the creation, and the creation before the writer's incarnation moves on:
    then no broker can still acknowledge a record into the old incarnation's log."""
    cluster.wait_ready()
    run(cluster, lambda client: client.delete_topic(RECREATED))
    wait_until(
        lambda: all(
            t is not None and t.error_code == errors.code_of("UNKNOWN_TOPIC_OR_PARTITION")
            for t in _broker_metadata(cluster, RECREATED).values()
        ),
        timeout=60,
        message="the deletion seen by every broker",
    )
    _create(cluster, RECREATED)
    writer.incarnation += 1


def _heal(cluster: LocalCluster) -> None:
    """Every node running and every partition's ISR full, as every broker sees it."""
    from rillet.tools.local_cluster import pid_alive

    if cluster.s3 is not None and not cluster.s3_running():
        cluster.start_s3()
    for node in cluster.nodes.values():
        if not pid_alive(node.pid):
            cluster.start_node(node.node_id)
    cluster.wait_ready()
    for topic in PARTITIONS:
        wait_until(lambda t=topic: _all_full(cluster, t), timeout=120, message=f"{topic} healed")


def _high_watermarks(cluster: LocalCluster) -> dict[tuple[str, int], int]:
    """Each partition's HW at its leader, once the leader's log end is committed (no
    writes are in flight: the ISR's followers catch up and the HW reaches it)."""

    async def body(client: Client) -> dict[tuple[str, int], int]:
        out = {}
        for topic, count in PARTITIONS.items():
            info = await client.partitions(topic)
            for p in range(count):
                conn = await client.conn(info[p].leader)
                hw = await _high_watermark(conn, topic, p)
                out[topic, p] = hw
        return out

    return run(cluster, body)


async def _high_watermark(conn: Connection, topic: str, partition: int) -> int:
    wanted = m.FetchPartition(partition, 0, -1, -1, 0, 1)
    request = m.FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1,
        topics=[m.FetchTopic(topic, [wanted])],
    )
    response, _ = await conn.call(request)
    result = response.topics[0].partitions[0]
    assert result.error_code == 0, result
    return result.high_watermark


def _check_replicas(cluster: LocalCluster, hws: dict[tuple[str, int], int]) -> int:
    """Every replica of a partition holds the same bytes below the HW (compacted: the
    same latest record of each key), read from the stopped brokers' log dirs. Returns
    the bytes compared."""
    compared = 0
    for (topic, p), hw in hws.items():
        views = {}
        # Replicas of a tiered partition drop local segments at their own pace: compare
        # what all of them still hold (what only S3 holds was read back from offset 0).
        start = 0
        if topic == TIERED:
            start = max(_local_start(cluster, b, topic, p) or 0 for b in BROKERS)
        for b in BROKERS:
            path = Path(cluster.config_for(cluster.nodes[b])["log.dirs"]) / f"{topic}-{p}"
            log = Log.open(path)
            try:
                assert log.log_end_offset >= hw, f"{topic}-{p} on broker {b}: ends below HW {hw}"
                views[b] = _latest_per_key(log, hw) if topic == COMPACT else _bytes(log, hw, start)
            finally:
                log.close()
        first = views[BROKERS[0]]
        for b, view in views.items():
            assert view == first, (
                f"{topic}-{p}: broker {b} differs from broker {BROKERS[0]} below HW {hw}"
            )
        if isinstance(first, bytes):
            compared += len(first) * len(views)
    return compared


def _bytes(log: Log, hw: int, start: int = 0) -> bytes:
    """The batches from ``start`` (or the log start) below ``hw``, as stored (base
    offset, epoch and CRC included)."""
    out = bytearray()
    offset = max(log.log_start_offset, start)
    while offset < hw:
        data = log.read_bytes(offset, 1 << 20, max_offset=hw)
        kept = [(pos, h) for pos, h in records.iter_batches(data) if h.base_offset < hw]
        if not kept:
            break
        end = kept[-1][0] + kept[-1][1].size
        out += data[:end]
        offset = kept[-1][1].next_offset
    return bytes(out)


def _latest_per_key(log: Log, hw: int) -> dict[bytes | None, tuple[int, bytes | None]]:
    return {r.key: (r.offset, r.value) for r in log_records(log) if r.offset < hw}
