"""The sans-I/O controller logic (Kafka's QuorumController): requests -> records + response.

Every operation takes the current ``MetadataImage``, the request's arguments and, where
time matters, ``now_ms``, and returns ``Result(records, response)``. It never changes
the image: state changes only when the driver replays the records. What the controller
keeps in memory is soft state the log does not need (as in Kafka): the last heartbeat
time of each broker, which brokers are in controlled shutdown, the next leader-rebalance
check. A new active controller starts with none of it and rebuilds it from heartbeats.

How a driver uses it (the seam; the driver owns asyncio, Raft and RPC)::

    ctl = QuorumController(ControllerConfig(...), rng=random.Random(seed))
    images = PendingImages(committed_image)        # committed + proposed-but-uncommitted

    # a request arrives (only on the active controller):
    records, response = ctl.create_topics(images.pending, topics, validate_only)
    if records:
        offset = raft.propose(encode_records(records))      # one Raft entry per operation
        images.propose(records, offset, raft.epoch)
        ...wait until raft commits `offset`...
    send(response)                                          # never before the commit

    # every ~100 ms (and at least once per heartbeat interval):
    records, _ = ctl.tick(images.pending, now_ms)          # session expiry, rebalance
    # as Raft commits entries:
    delta, image = images.commit([(offset, epoch, decode_records(data))])  # -> listeners
    # on losing leadership: images.reset(); ctl = QuorumController(...) afresh.

Operations must see every record proposed before them, so pass ``images.pending``
(or run one operation at a time against the committed image). Responses describe the
state after the records; they are true once the records commit.
"""

from __future__ import annotations

import base64
import logging
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from rillet.client.wire.errors import PolicyViolationError, code_of
from rillet.controller.metadata.election import (
    Eligible,
    change_of,
    complete_reassignment,
    elect_offline,
    elect_preferred,
    remove_brokers,
)
from rillet.controller.metadata.image import (
    NO_LEADER,
    RESOURCE_TOPIC,
    SEGMENT_COPY_FINISHED,
    SEGMENT_COPY_STARTED,
    SEGMENT_DELETE_FINISHED,
    SEGMENT_DELETE_STARTED,
    Config,
    Endpoint,
    FenceBroker,
    MetadataDelta,
    MetadataImage,
    MetadataRecord,
    Partition,
    RegisterBroker,
    RemoteSegment,
    RemoveTopic,
    Topic,
    TopicImage,
    UnfenceBroker,
    UnregisterBroker,
    apply_partition_change,
    check,
    replay_records,
)
from rillet.controller.metadata.placement import (
    BrokerSlot,
    PlacementError,
    leader_imbalance,
    place_replicas,
    reassignment_plan,
    validate_assignment,
)
from rillet.controller.metadata.topic_config import (
    TOPIC_CONFIGS,
    tiering_error,
    unclean_election_enabled,
    validate_topic_config,
)

log = logging.getLogger(__name__)

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = code_of("UNKNOWN_TOPIC_OR_PARTITION")
NOT_LEADER_OR_FOLLOWER = code_of("NOT_LEADER_OR_FOLLOWER")
INVALID_TOPIC = code_of("INVALID_TOPIC_EXCEPTION")
TOPIC_ALREADY_EXISTS = code_of("TOPIC_ALREADY_EXISTS")
INVALID_PARTITIONS = code_of("INVALID_PARTITIONS")
INVALID_REPLICATION_FACTOR = code_of("INVALID_REPLICATION_FACTOR")
INVALID_REPLICA_ASSIGNMENT = code_of("INVALID_REPLICA_ASSIGNMENT")
INVALID_CONFIG = code_of("INVALID_CONFIG")
INVALID_REQUEST = code_of("INVALID_REQUEST")
POLICY_VIOLATION = code_of("POLICY_VIOLATION")
FENCED_LEADER_EPOCH = code_of("FENCED_LEADER_EPOCH")
UNKNOWN_LEADER_EPOCH = code_of("UNKNOWN_LEADER_EPOCH")
STALE_BROKER_EPOCH = code_of("STALE_BROKER_EPOCH")
PREFERRED_LEADER_NOT_AVAILABLE = code_of("PREFERRED_LEADER_NOT_AVAILABLE")
ELECTION_NOT_NEEDED = code_of("ELECTION_NOT_NEEDED")
NO_REASSIGNMENT_IN_PROGRESS = code_of("NO_REASSIGNMENT_IN_PROGRESS")
INVALID_UPDATE_VERSION = code_of("INVALID_UPDATE_VERSION")
BROKER_ID_NOT_REGISTERED = code_of("BROKER_ID_NOT_REGISTERED")
INELIGIBLE_REPLICA = code_of("INELIGIBLE_REPLICA")
DUPLICATE_BROKER_REGISTRATION = code_of("DUPLICATE_BROKER_REGISTRATION")

TOPIC_NAME_MAX = 249
# A broker registration's fields come from the network: bounded, so its record is small
# (a rack of megabytes once made a record too large for the Raft log, fatally).
REGISTRATION_TEXT_MAX = 255  # characters of an incarnation id, rack, listener or host
REGISTRATION_ENDPOINTS_MAX = 16
BROKER_ID_MAX = 2**31 - 1
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Controller settings (Kafka's names with dots as underscores).

    broker_session_timeout_ms defaults to 3000 (Kafka: 9000) with 500 ms heartbeats
    (Kafka: 2000): a crashed leader's partitions stay unavailable until its session
    expires, so this timeout dominates failover time; six missed heartbeats still ride
    out a GC pause or a slow fsync without fencing a healthy broker.
    """

    broker_session_timeout_ms: int = 3000
    broker_heartbeat_interval_ms: int = 500
    default_num_partitions: int = 1  # num.partitions
    default_replication_factor: int = 1  # default.replication.factor
    max_partitions_per_topic: int = 100_000
    max_partitions: int = 200_000  # max.partitions: in the cluster, each counted once
    max_broker_partitions: int = 100_000  # max.broker.partitions: replicas on one broker
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_per_broker_percentage: int = 10
    leader_imbalance_check_interval_ms: int = 300_000
    # The topic defaults brokers apply (their log.* keys, mirrored in the controller's
    # config): tiering checks and APPEND/SUBTRACT start from these, not built-in ones.
    topic_defaults: Mapping[str, str] = field(default_factory=dict)


class Result(NamedTuple):
    records: list[MetadataRecord]
    response: Any


# ---------------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class RegisterBrokerResponse:
    error_code: int
    broker_epoch: int = -1
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class BrokerHeartbeatResponse:
    error_code: int
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shut_down: bool = False
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class CreateTopicResult:
    name: str
    error_code: int
    error_message: str = ""
    topic_id: str = ""
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicResult:
    """Per-topic outcome of delete_topics."""

    name: str
    error_code: int
    error_message: str = ""
    topic_id: str = ""


@dataclass(frozen=True, slots=True)
class AlterPartitionResponse:
    error_code: int
    error_message: str = ""
    topic: str = ""
    partition: int = -1
    leader: int = NO_LEADER
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    partition_epoch: int = -1


@dataclass(frozen=True, slots=True)
class RemoteSegmentResult:
    """Outcome of one RemoteSegment state change a partition leader proposed."""

    segment_id: str
    error_code: int
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """Per-partition outcome of elect_preferred_leaders and reassign_partitions."""

    topic: str
    partition: int
    error_code: int
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class CreatableTopic:
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, Any] = field(default_factory=dict)
    assignments: Mapping[int, Sequence[int]] | None = None


class BrokerState(Enum):
    FENCED = "fenced"
    ACTIVE = "active"
    SHUTTING_DOWN = "shutting_down"


class HeartbeatEvent(Enum):
    BEHIND = "behind"  # metadata offset below the registration record's
    CAUGHT_UP = "caught_up"
    WANT_FENCE = "want_fence"
    WANT_SHUTDOWN = "want_shutdown"


@dataclass(frozen=True, slots=True)
class _Beat:
    """One heartbeat's inputs, handed to a lifecycle transition."""

    image: MetadataImage
    reg: RegisterBroker
    current_metadata_offset: int
    now_ms: int

    @property
    def caught_up(self) -> bool:
        return self.current_metadata_offset >= self.reg.broker_epoch


class QuorumController:
    """The active controller's decisions. Pure: no clock, no I/O, seeded randomness."""

    def __init__(self, config: ControllerConfig | None = None, rng: random.Random | None = None):
        self.config = config or ControllerConfig()
        self.rng = rng or random.Random(0)
        self._last_heartbeat_ms: dict[int, int] = {}
        self._shutting_down: set[int] = set()
        self._shutdown_ready_offset: dict[int, int] = {}
        self._next_rebalance_ms: int | None = None
        # Ids of building topics whose records an operation of this controller is still
        # proposing (docs/controller.md, "Large operations"); the others are orphans.
        self.building: set[str] = set()

    # -- soft state ------------------------------------------------------------------

    def session_alive(self, broker_id: int, now_ms: int) -> bool:
        last = self._last_heartbeat_ms.get(broker_id)
        return last is not None and now_ms - last <= self.config.broker_session_timeout_ms

    def broker_state(self, image: MetadataImage, broker_id: int) -> BrokerState | None:
        reg = image.brokers.get(broker_id)
        if reg is None:
            return None
        if reg.fenced:
            return BrokerState.FENCED
        if broker_id in self._shutting_down:
            return BrokerState.SHUTTING_DOWN
        return BrokerState.ACTIVE

    def eligible(
        self, image: MetadataImage, include: Iterable[int] = (), exclude: Iterable[int] = ()
    ) -> Eligible:
        """Who may lead or be in an ISR: unfenced and not shutting down (+/- overrides)."""
        ok = {b for b, reg in image.brokers.items() if not reg.fenced}
        ok -= self._shutting_down
        ok |= set(include)
        ok -= set(exclude)
        return ok.__contains__

    def _forget(self, broker_id: int) -> None:
        self._shutting_down.discard(broker_id)
        self._shutdown_ready_offset.pop(broker_id, None)

    # -- broker registration -----------------------------------------------------------

    def register_broker(
        self,
        image: MetadataImage,
        broker_id: int,
        incarnation_id: str,
        endpoints: Sequence[Endpoint | tuple[str, str, int]],
        rack: str | None,
        now_ms: int,
    ) -> Result:
        """Register (fenced) and hand out a broker epoch: above every offset seen so far."""
        error = _registration_error(broker_id, incarnation_id, endpoints, rack)
        if error is not None:
            return Result([], RegisterBrokerResponse(INVALID_REQUEST, -1, error))
        eps = tuple(Endpoint(*e) for e in endpoints)
        cur = image.brokers.get(broker_id)
        if cur is not None and cur.incarnation_id == incarnation_id:
            if cur.endpoints == eps and cur.rack == rack:  # a retry: same answer
                self._last_heartbeat_ms[broker_id] = now_ms
                return Result([], RegisterBrokerResponse(NONE, cur.broker_epoch))
        elif cur is not None and self.session_alive(broker_id, now_ms):
            msg = f"broker {broker_id} is registered by a live incarnation {cur.incarnation_id}"
            return Result([], RegisterBrokerResponse(DUPLICATE_BROKER_REGISTRATION, -1, msg))
        epoch = max(image.offset + 1, cur.broker_epoch + 1 if cur is not None else 0)
        records: list[MetadataRecord] = []
        if cur is not None and not cur.fenced:
            records += self._moves_off(image, {broker_id})
        records.append(RegisterBroker(broker_id, incarnation_id, epoch, eps, rack, fenced=True))
        self._forget(broker_id)
        self._last_heartbeat_ms[broker_id] = now_ms
        return Result(records, RegisterBrokerResponse(NONE, epoch))

    def unregister_broker(self, image: MetadataImage, broker_id: int) -> Result:
        """Remove a (decommissioned) broker: its leaderships move away first."""
        cur = image.brokers.get(broker_id)
        if cur is None:
            return Result([], BROKER_ID_NOT_REGISTERED)
        records = self._moves_off(image, {broker_id})
        records.append(UnregisterBroker(broker_id, cur.broker_epoch))
        self._forget(broker_id)
        self._last_heartbeat_ms.pop(broker_id, None)
        return Result(records, NONE)

    # -- heartbeats and the broker lifecycle ---------------------------------------------

    def broker_heartbeat(
        self,
        image: MetadataImage,
        broker_id: int,
        broker_epoch: int,
        current_metadata_offset: int,
        want_fence: bool,
        want_shutdown: bool,
        now_ms: int,
    ) -> Result:
        reg = image.brokers.get(broker_id)
        if reg is None:
            return Result([], BrokerHeartbeatResponse(BROKER_ID_NOT_REGISTERED))
        if reg.broker_epoch != broker_epoch:
            msg = f"broker epoch {broker_epoch} is not the current {reg.broker_epoch}"
            return Result([], BrokerHeartbeatResponse(STALE_BROKER_EPOCH, error_message=msg))
        self._last_heartbeat_ms[broker_id] = now_ms
        beat = _Beat(image, reg, current_metadata_offset, now_ms)
        if want_shutdown:
            event = HeartbeatEvent.WANT_SHUTDOWN
        elif want_fence:
            event = HeartbeatEvent.WANT_FENCE
        else:
            event = HeartbeatEvent.CAUGHT_UP if beat.caught_up else HeartbeatEvent.BEHIND
        state = self.broker_state(image, broker_id)
        check(state is not None, f"registered broker {broker_id} without a state")
        transition = LIFECYCLE.get((state, event))  # type: ignore[arg-type]
        check(transition is not None, f"no lifecycle transition for {state} on {event}")
        return transition(self, beat)  # type: ignore[misc]

    def _reply(self, beat: _Beat, fenced: bool, shut_down: bool = False) -> BrokerHeartbeatResponse:
        return BrokerHeartbeatResponse(NONE, beat.caught_up, fenced, shut_down)

    def _stay(self, beat: _Beat) -> Result:
        return Result([], self._reply(beat, fenced=beat.reg.fenced))

    def _unfence(self, beat: _Beat) -> Result:
        b = beat.reg.broker_id
        records: list[MetadataRecord] = [UnfenceBroker(b, beat.reg.broker_epoch)]
        records += self._elect_offline(beat.image, self.eligible(beat.image, include={b}))
        return Result(records, self._reply(beat, fenced=False))

    def _fence(self, beat: _Beat) -> Result:
        records = self._fence_records(beat.image, [beat.reg.broker_id])
        return Result(records, self._reply(beat, fenced=True))

    def _shut_down_now(self, beat: _Beat) -> Result:
        """Fenced already: nothing to move, so it may go at once."""
        self._last_heartbeat_ms.pop(beat.reg.broker_id, None)
        self._forget(beat.reg.broker_id)
        return Result([], self._reply(beat, fenced=True, shut_down=True))

    def _begin_shutdown(self, beat: _Beat) -> Result:
        self._shutting_down.add(beat.reg.broker_id)
        return self._continue_shutdown(beat)

    def _continue_shutdown(self, beat: _Beat) -> Result:
        """Move leaderships and ISR seats away; once none are left and the broker has seen
        that, fence it and tell it to shut down (Kafka's controlled shutdown)."""
        b, image = beat.reg.broker_id, beat.image
        moves = self._moves_off(image, {b})
        if moves:
            self._shutdown_ready_offset.pop(b, None)
            return Result(moves, self._reply(beat, fenced=False))
        ready_at = self._shutdown_ready_offset.setdefault(b, image.offset)
        if beat.current_metadata_offset < ready_at:
            return Result([], self._reply(beat, fenced=False))
        self._last_heartbeat_ms.pop(b, None)
        self._forget(b)
        fence = FenceBroker(b, beat.reg.broker_epoch)
        return Result([fence], self._reply(beat, fenced=True, shut_down=True))

    # -- fencing, session expiry, elections -----------------------------------------------

    def _moves_off(self, image: MetadataImage, gone: set[int]) -> list[MetadataRecord]:
        """PartitionChanges taking leadership and ISR seats off ``gone`` brokers."""
        eligible = self.eligible(image, exclude=gone)
        out: list[MetadataRecord] = []
        for t, p in _controller_partitions(image):
            if p.leader in gone or any(b in gone for b in p.isr):
                unclean = unclean_election_enabled(image.topic_config(t.name))
                change = remove_brokers(p, gone, eligible, unclean)
                if change is not None:
                    out.append(change)
        return out

    def _fence_records(
        self, image: MetadataImage, broker_ids: Sequence[int]
    ) -> list[MetadataRecord]:
        records = self._moves_off(image, set(broker_ids))
        for b in broker_ids:
            records.append(FenceBroker(b, image.brokers[b].broker_epoch))
            self._forget(b)
        return records

    def _elect_offline(self, image: MetadataImage, eligible: Eligible) -> list[MetadataRecord]:
        out: list[MetadataRecord] = []
        for t, p in _controller_partitions(image):
            if p.leader == NO_LEADER:
                unclean = unclean_election_enabled(image.topic_config(t.name))
                change = elect_offline(p, eligible, unclean)
                if change is not None:
                    out.append(change)
        return out

    def maybe_fence_stale_brokers(self, image: MetadataImage, now_ms: int) -> list[MetadataRecord]:
        """Fence unfenced brokers silent for longer than the session timeout.

        A broker with no heartbeat on record (this controller just became active) gets a
        full session starting now, as in Kafka.
        """
        stale = []
        for b in image.unfenced_broker_ids():
            last = self._last_heartbeat_ms.setdefault(b, now_ms)
            if now_ms - last > self.config.broker_session_timeout_ms:
                stale.append(b)
        return self._fence_records(image, stale) if stale else []

    def tick(self, image: MetadataImage, now_ms: int) -> Result:
        """Time passes: session expiry first; a leader rebalance only on a quiet tick;
        building topics no operation of this controller is still writing are removed."""
        records = self.maybe_fence_stale_brokers(image, now_ms)
        if not records:
            records = self.maybe_rebalance_leaders(image, now_ms)
        return Result(self.abort_orphan_topics(image) + records, None)

    def planner(self) -> QuorumController:
        """A copy to plan with on another thread (`create_topics` reads the immutable
        image, the config, the rng and who is shutting down): its own rng, drawn from
        this one, and its own copy of the soft state it reads."""
        copy = QuorumController(self.config, random.Random(self.rng.getrandbits(64)))
        copy._shutting_down = set(self._shutting_down)
        return copy

    def plan_still_holds(self, planned_on: MetadataImage, image: MetadataImage) -> bool:
        """Whether a `create_topics` plan made by `planner` on ``planned_on`` is what this
        controller would plan on ``image`` now, up to its random choices: the same
        topic names are taken and the same brokers are eligible."""
        if image is planned_on:
            return True
        then, now = self.eligible(planned_on), self.eligible(image)
        return (
            image.topics_by_name.keys() == planned_on.topics_by_name.keys()
            and image.building_topics.keys() == planned_on.building_topics.keys()
            and image.brokers.keys() == planned_on.brokers.keys()
            and all(then(b) == now(b) for b in image.brokers)
        )

    def abort_orphan_topics(self, image: MetadataImage) -> list[MetadataRecord]:
        """RemoveTopic for each building topic not in ``self.building``: an earlier leader,
        or a failed proposal of this one, left it with part of its partitions. Nobody
        outside the controller ever saw it, so removing it is an abort (the client got
        an error or a timeout and may retry)."""
        orphans = sorted(set(image.building_topics) - self.building)
        for topic_id in orphans:
            log.warning(
                "removing topic %r: its creation did not finish (%d of %d partitions)",
                image.building_topics[topic_id].name,
                len(image.building_topics[topic_id].partitions),
                image.building_topics[topic_id].partition_count,
            )
        return [RemoveTopic(topic_id) for topic_id in orphans]

    # -- topics -----------------------------------------------------------------------------

    def create_topics(
        self,
        image: MetadataImage,
        topics: Sequence[CreatableTopic | tuple[Any, ...]],
        validate_only: bool = False,
    ) -> Result:
        """Topic + Config + Partition records per valid topic; a result per topic.

        ``topics`` holds CreatableTopic or tuples (name, num_partitions,
        replication_factor, configs, assignments); -1 means the controller's default.
        """
        requests = creatable(topics)
        self.check_partition_limits(image, requests)
        counts: dict[str, int] = {}
        for t in requests:
            counts[t.name] = counts.get(t.name, 0) + 1
        records: list[MetadataRecord] = []
        results: list[CreateTopicResult] = []
        taken_ids: set[str] = set()
        replicas = self._replica_counter(image, requests)
        metric_names = MetricNames(image)
        for t in requests:
            if counts[t.name] > 1:
                results.append(CreateTopicResult(t.name, INVALID_REQUEST, "duplicate topic name"))
                continue
            recs, result = self._create_topic(image, t, taken_ids, replicas, metric_names)
            results.append(result)
            if not validate_only:
                records += recs
        return Result(records, results)

    # -- partition limits (KIP-578's max.partitions and max.broker.partitions) ---------

    def _requested(self, t: CreatableTopic) -> tuple[int, int]:
        """(partitions, replication factor) a topic asks for, defaults filled in; 0 for
        counts that are invalid anyway (refused later, topic by topic)."""
        if t.assignments is not None:
            first = next(iter(t.assignments.values()), ())
            return len(t.assignments), len(first)
        n = self.config.default_num_partitions if t.num_partitions == -1 else t.num_partitions
        rf = (
            self.config.default_replication_factor
            if t.replication_factor == -1
            else t.replication_factor
        )
        return max(n, 0), max(rf, 0)

    def check_partition_limits(
        self, image: MetadataImage, topics: Sequence[CreatableTopic]
    ) -> None:
        """Refuse a whole CreateTopics (PolicyViolationError) that would take the cluster
        past ``max.partitions``, or put more new replicas on the live brokers than
        ``max.broker.partitions`` lets them all take. Cheap (no placement, no walk over
        partitions), so a request for millions of partitions costs nothing to refuse;
        `_broker_limit_error` checks each topic's placement exactly."""
        asked = [self._requested(t) for t in topics]
        new = sum(n for n, _ in asked)
        held = total_partitions(image)
        limit = self.config.max_partitions
        if held + new > limit:
            raise PolicyViolationError(
                f"creating {new:,} partitions would bring the cluster to {held + new:,}; "
                f"max.partitions is {limit:,} (nothing was created)"
            )
        per_broker = self.config.max_broker_partitions
        eligible = self.eligible(image)
        live = sum(1 for b in image.brokers if eligible(b))
        # A factor over the live brokers is INVALID_REPLICATION_FACTOR, topic by topic.
        replicas = sum(n * min(rf, live) for n, rf in asked)
        if replicas > per_broker * live:
            raise PolicyViolationError(
                f"{replicas:,} new replicas do not fit on {live} live broker(s) of at most "
                f"{per_broker:,} each (max.broker.partitions; nothing was created)"
            )

    def counts_replicas(self, image: MetadataImage, new_partitions: int) -> bool:
        """Whether a create of ``new_partitions`` must count each broker's replicas (a walk
        over every partition): a broker holds at most one replica of each partition, so
        below ``max.broker.partitions`` partitions in all no broker can pass it."""
        return total_partitions(image) + new_partitions > self.config.max_broker_partitions

    def _replica_counter(
        self, image: MetadataImage, topics: Sequence[CreatableTopic]
    ) -> dict[int, int] | None:
        """Replicas each broker holds (building topics too), when the limit could bind."""
        if not self.counts_replicas(image, sum(self._requested(t)[0] for t in topics)):
            return None
        held: dict[int, int] = {}
        for _, p in _controller_partitions(image):
            for b in p.replicas:
                held[b] = held.get(b, 0) + 1
        return held

    def _broker_limit_error(
        self, placed: Sequence[Sequence[int]], held: dict[int, int] | None
    ) -> str | None:
        """Adds ``placed`` to ``held`` (this request's topics so far included), or names a
        broker it would take past ``max.broker.partitions`` and adds nothing."""
        if held is None:
            return None
        adding: dict[int, int] = {}
        for replicas in placed:
            for b in replicas:
                adding[b] = adding.get(b, 0) + 1
        limit = self.config.max_broker_partitions
        for b, n in sorted(adding.items()):
            if held.get(b, 0) + n > limit:
                return (
                    f"broker {b} would hold {held.get(b, 0) + n:,} replicas; "
                    f"max.broker.partitions is {limit:,}"
                )
        for b, n in adding.items():
            held[b] = held.get(b, 0) + n
        return None

    def _create_topic(
        self,
        image: MetadataImage,
        t: CreatableTopic,
        taken_ids: set[str],
        replicas: dict[int, int] | None = None,
        metric_names: MetricNames | None = None,
    ) -> tuple[list[MetadataRecord], CreateTopicResult]:
        def fail(code: int, msg: str) -> tuple[list[MetadataRecord], CreateTopicResult]:
            return [], CreateTopicResult(t.name, code, msg)

        name_error = topic_name_error(t.name)
        if name_error:
            return fail(INVALID_TOPIC, name_error)
        if image.topic(t.name) is not None:
            return fail(TOPIC_ALREADY_EXISTS, f"topic {t.name!r} already exists")
        if any(b.name == t.name for b in image.building_topics.values()):
            return fail(TOPIC_ALREADY_EXISTS, f"topic {t.name!r} is being created")
        metric_names = metric_names or MetricNames(image)
        clash = metric_names.clash(t.name)
        if clash:
            return fail(INVALID_TOPIC, f"{t.name!r} collides with {clash!r} ('.' vs '_')")
        configs, config_error = validate_topic_config(t.configs or {})
        config_error = config_error or tiering_error(None, configs, self.config.topic_defaults)
        if config_error:
            return fail(INVALID_CONFIG, config_error)
        placed = self._assign(image, t)
        if isinstance(placed, tuple):
            return fail(*placed)
        over = self._broker_limit_error(placed, replicas)
        if over is not None:
            return fail(POLICY_VIOLATION, over)
        topic_id = self._new_topic_id(image, taken_ids)
        metric_names.add(t.name)  # the request's later topics must not collide with it
        eligible = self.eligible(image)
        # partition_count: the records may be split over several entries (the server's
        # propose); the topic stays invisible until its last partition is applied.
        records: list[MetadataRecord] = [Topic(t.name, topic_id, len(placed))]
        records += [Config(RESOURCE_TOPIC, t.name, k, v) for k, v in sorted(configs.items())]
        for p, replicas in enumerate(placed):
            isr = tuple(b for b in replicas if eligible(b))
            records.append(Partition(topic_id, p, replicas, isr, isr[0]))
        return records, CreateTopicResult(
            t.name, NONE, "", topic_id, len(placed), len(placed[0]), configs
        )

    def _assign(
        self, image: MetadataImage, t: CreatableTopic
    ) -> list[tuple[int, ...]] | tuple[int, str]:
        """Replica lists for a new topic, or (error code, message)."""
        eligible = self.eligible(image)
        if t.assignments is not None:
            if t.num_partitions != -1 or t.replication_factor != -1:
                return INVALID_REQUEST, "give assignments or counts, not both"
            if len(t.assignments) > self.config.max_partitions_per_topic:
                return (
                    INVALID_PARTITIONS,
                    f"{len(t.assignments)} partitions: must be "
                    f"1..{self.config.max_partitions_per_topic}",
                )
            return _check_assignments(image, t.assignments, eligible)
        n = self.config.default_num_partitions if t.num_partitions == -1 else t.num_partitions
        rf = (
            self.config.default_replication_factor
            if t.replication_factor == -1
            else t.replication_factor
        )
        if not 1 <= n <= self.config.max_partitions_per_topic:
            return (
                INVALID_PARTITIONS,
                f"{n} partitions: must be 1..{self.config.max_partitions_per_topic}",
            )
        live = [BrokerSlot(b, reg.rack) for b, reg in sorted(image.brokers.items()) if eligible(b)]
        if rf < 1 or rf > len(live):
            return INVALID_REPLICATION_FACTOR, f"replication factor {rf}: {len(live)} live brokers"
        try:
            return place_replicas(live, n, rf, self.rng)
        except PlacementError as exc:
            return INVALID_REPLICATION_FACTOR, str(exc)

    def _new_topic_id(self, image: MetadataImage, taken: set[str]) -> str:
        for _ in range(100):
            raw = base64.urlsafe_b64encode(self.rng.randbytes(16)).decode().rstrip("=")
            if raw not in image.topics_by_id and raw not in taken:
                taken.add(raw)
                return raw
        raise RuntimeError("100 random topic ids in a row were taken: the rng is broken")

    def delete_topics(self, image: MetadataImage, names: Sequence[str]) -> Result:
        records: list[MetadataRecord] = []
        results: list[TopicResult] = []
        # Counted once (names.count per name was quadratic: minutes on the loop for a
        # request of a few MiB).
        counts = Counter(names)
        for name in names:
            t = image.topic(name)
            if counts[name] > 1:
                results.append(TopicResult(name, INVALID_REQUEST, "duplicate topic name"))
            elif t is None:
                results.append(TopicResult(name, UNKNOWN_TOPIC_OR_PARTITION, "no such topic"))
            else:
                records.append(RemoveTopic(t.topic_id))
                results.append(TopicResult(name, NONE, "", t.topic_id))
        return Result(records, results)

    def alter_topic_configs(
        self, image: MetadataImage, name: str, changes: Mapping[str, Any | None]
    ) -> Result:
        """Incremental alter: a value sets a key, None deletes it (back to the default)."""
        if image.topic(name) is None:
            return Result([], TopicResult(name, UNKNOWN_TOPIC_OR_PARTITION, "no such topic"))
        sets = {k: v for k, v in changes.items() if v is not None}
        canonical_sets, error = validate_topic_config(sets)
        unknown = [k for k, v in changes.items() if v is None and k not in TOPIC_CONFIGS]
        if error or unknown:
            return Result([], TopicResult(name, INVALID_CONFIG, error or f"unknown {unknown}"))
        before = image.topic_config(name)
        after = {k: v for k, v in before.items() if k not in changes} | canonical_sets
        error = tiering_error(before, after, self.config.topic_defaults)
        if error:
            return Result([], TopicResult(name, INVALID_CONFIG, error))
        records: list[MetadataRecord] = [
            Config(RESOURCE_TOPIC, name, k, canonical_sets.get(k)) for k in sorted(changes)
        ]
        return Result(records, TopicResult(name, NONE, "", image.topics_by_name[name].topic_id))

    def record_remote_segment(
        self, image: MetadataImage, broker_id: int, broker_epoch: int, segment: RemoteSegment
    ) -> Result:
        """A partition leader records a tiered segment's state change (KIP-405's
        lifecycle; docs/tiered.md, "Remote metadata"). Only the partition's current
        leader, in its current leader epoch, may write, so a deposed leader's late
        upload is never recorded as finished; the legal transitions are::

            (none)                          -> COPY_STARTED
            COPY_STARTED (same writer)      -> COPY_FINISHED
            COPY_STARTED / COPY_FINISHED /
            DELETE_STARTED (any writer)     -> DELETE_STARTED
            DELETE_STARTED                  -> DELETE_FINISHED (removes it from the image)

        Any writer's COPY_STARTED may be deleted: a new leader cleans up what its
        predecessor left unfinished. A retry of a change already made (its answer was
        lost) succeeds and writes nothing. The response is a ``RemoteSegmentResult``."""

        def fail(code: int, msg: str) -> Result:
            return Result([], RemoteSegmentResult(segment.segment_id, code, msg))

        reg = image.brokers.get(broker_id)
        if reg is None or reg.broker_epoch != broker_epoch:
            return fail(STALE_BROKER_EPOCH, f"broker {broker_id} epoch {broker_epoch} is stale")
        t = image.topics_by_id.get(segment.topic_id)
        p = None if t is None else t.partitions.get(segment.partition)
        if p is None:
            return fail(UNKNOWN_TOPIC_OR_PARTITION, "unknown topic id or partition")
        if p.leader != broker_id:
            return fail(NOT_LEADER_OR_FOLLOWER, f"broker {broker_id} does not lead it")
        if segment.leader_epoch < p.leader_epoch:
            return fail(
                FENCED_LEADER_EPOCH, f"leader epoch {segment.leader_epoch} < {p.leader_epoch}"
            )
        if segment.leader_epoch > p.leader_epoch:
            return fail(
                UNKNOWN_LEADER_EPOCH, f"leader epoch {segment.leader_epoch} > {p.leader_epoch}"
            )
        if segment.broker_id != broker_id:
            return fail(INVALID_REQUEST, f"segment names writer {segment.broker_id}")
        if not segment.segment_id or not 0 <= segment.start_offset <= segment.end_offset:
            return fail(INVALID_REQUEST, "a segment needs an id and 0 <= start <= end")
        segs = image.remote_segments.get((segment.topic_id, segment.partition), {})
        error = _remote_transition_error(segs.get(segment.segment_id), segment)
        if error == "retry":
            return Result([], RemoteSegmentResult(segment.segment_id, NONE))
        if error is not None:
            return fail(INVALID_REQUEST, error)
        return Result([segment], RemoteSegmentResult(segment.segment_id, NONE))

    # -- partitions -------------------------------------------------------------------------

    def alter_partition(
        self,
        image: MetadataImage,
        broker_id: int,
        broker_epoch: int,
        topic: str,
        partition: int,
        leader_epoch: int,
        partition_epoch: int,
        new_isr: Sequence[int],
    ) -> Result:
        """Kafka's AlterPartition: the leader proposes a new ISR for one partition."""

        def fail(code: int, msg: str) -> Result:
            return Result([], AlterPartitionResponse(code, msg, topic, partition))

        reg = image.brokers.get(broker_id)
        if reg is None or reg.broker_epoch != broker_epoch:
            return fail(STALE_BROKER_EPOCH, f"broker {broker_id} epoch {broker_epoch} is stale")
        p = image.partition(topic, partition)
        if p is None:
            return fail(UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} is unknown")
        if p.leader != broker_id:
            return fail(NOT_LEADER_OR_FOLLOWER, f"broker {broker_id} does not lead it")
        if leader_epoch < p.leader_epoch:
            return fail(FENCED_LEADER_EPOCH, f"leader epoch {leader_epoch} < {p.leader_epoch}")
        if leader_epoch > p.leader_epoch:
            return fail(UNKNOWN_LEADER_EPOCH, f"leader epoch {leader_epoch} > {p.leader_epoch}")
        isr = tuple(new_isr)
        if partition_epoch != p.partition_epoch:
            if set(isr) == set(p.isr):  # a retry whose answer was lost: already done
                return Result([], _partition_response(topic, p))
            return fail(
                INVALID_UPDATE_VERSION, f"partition epoch {partition_epoch} != {p.partition_epoch}"
            )
        error = self._isr_error(image, p, isr)
        if error is not None:
            return fail(*error)
        records: list[MetadataRecord] = []
        change = change_of(p, isr=isr)
        if change is not None:
            records.append(change)
            p = apply_partition_change(p, change)
        done = complete_reassignment(p, self.eligible(image))
        if done is not None:
            records.append(done)
            p = apply_partition_change(p, done)
        return Result(records, _partition_response(topic, p))

    def _isr_error(
        self, image: MetadataImage, p: Partition, isr: tuple[int, ...]
    ) -> tuple[int, str] | None:
        if not isr or len(set(isr)) != len(isr) or p.leader not in isr:
            return INVALID_REQUEST, f"ISR {list(isr)} must be distinct and hold the leader"
        if not set(isr) <= set(p.replicas):
            return INELIGIBLE_REPLICA, f"ISR {list(isr)} holds non-replicas"
        eligible = self.eligible(image)
        bad = [b for b in isr if not eligible(b)]
        if bad:
            return INELIGIBLE_REPLICA, f"brokers {bad} are fenced or shutting down"
        return None

    def elect_preferred_leaders(
        self, image: MetadataImage, topics: Sequence[str] | None = None
    ) -> Result:
        """Move leadership to each partition's first replica (all topics when None)."""
        # Each name once: a request naming a topic N times planned N changes of each of
        # its partitions, on the loop.
        names = sorted(image.topics_by_name) if topics is None else list(dict.fromkeys(topics))
        eligible = self.eligible(image)
        records: list[MetadataRecord] = []
        results: list[PartitionResult] = []
        for name in names:
            t = image.topic(name)
            if t is None:
                results.append(PartitionResult(name, -1, UNKNOWN_TOPIC_OR_PARTITION))
                continue
            for p in (t.partitions[i] for i in sorted(t.partitions)):
                change = elect_preferred(p, eligible)
                if change is not None:
                    records.append(change)
                    results.append(PartitionResult(name, p.partition, NONE))
                elif p.leader == p.replicas[0]:
                    results.append(PartitionResult(name, p.partition, ELECTION_NOT_NEEDED))
                else:
                    results.append(
                        PartitionResult(name, p.partition, PREFERRED_LEADER_NOT_AVAILABLE)
                    )
        return Result(records, results)

    def maybe_rebalance_leaders(self, image: MetadataImage, now_ms: int) -> list[MetadataRecord]:
        """auto.leader.rebalance.enable: every check interval, move leaders back to their
        preferred broker for each broker whose imbalance exceeds the threshold."""
        if not self.config.auto_leader_rebalance_enable:
            return []
        if self._next_rebalance_ms is None:
            self._next_rebalance_ms = now_ms + self.config.leader_imbalance_check_interval_ms
        if now_ms < self._next_rebalance_ms:
            return []
        self._next_rebalance_ms = now_ms + self.config.leader_imbalance_check_interval_ms
        eligible = self.eligible(image)
        pairs = ((p.replicas, p.leader) for _, p in image.iter_partitions())
        ratios = leader_imbalance(pairs, [b for b in image.brokers if eligible(b)])
        limit = self.config.leader_imbalance_per_broker_percentage / 100
        imbalanced = {b for b, ratio in ratios.items() if ratio > limit}
        out: list[MetadataRecord] = []
        for _, p in image.iter_partitions():
            if p.replicas[0] in imbalanced:
                change = elect_preferred(p, eligible)
                if change is not None:
                    out.append(change)
        return out

    def reassign_partitions(
        self,
        image: MetadataImage,
        moves: Sequence[tuple[str, int, Sequence[int] | None]],
    ) -> Result:
        """(topic, partition, target replicas, or None to cancel) per partition (KIP-455).

        The partition first replicates to target + current; AlterPartition completes it
        once every target replica is in the ISR (``complete_reassignment``).
        """
        records: list[MetadataRecord] = []
        results: list[PartitionResult] = []
        # A partition named again is judged on the image with this request's earlier
        # moves applied (as if sent in a second request): planned on the request's
        # image, a later move undid half of an earlier one and the records did not
        # apply. Replayed only then, and only what is new since the last replay.
        unapplied: list[MetadataRecord] = []
        changed: set[tuple[str, int]] = set()
        for topic, partition, target in moves:
            if (topic, partition) in changed:
                image = replay_records(image, unapplied)
                unapplied, changed = [], set()
            p = image.partition(topic, partition)
            if p is None:
                results.append(PartitionResult(topic, partition, UNKNOWN_TOPIC_OR_PARTITION))
                continue
            recs, code, msg = self._reassign_one(image, p, target)
            if recs:
                records += recs
                unapplied += recs
                changed.add((topic, partition))
            results.append(PartitionResult(topic, partition, code, msg))
        return Result(records, results)

    def _reassign_one(
        self, image: MetadataImage, p: Partition, target: Sequence[int] | None
    ) -> tuple[list[MetadataRecord], int, str]:
        original = tuple(r for r in p.replicas if r not in p.adding_replicas)
        if target is None:
            if not p.is_reassigning:
                return [], NO_REASSIGNMENT_IN_PROGRESS, "nothing to cancel"
            target = original
        error = validate_assignment(target, image.brokers)
        if error:
            return [], INVALID_REPLICA_ASSIGNMENT, error
        plan = reassignment_plan(original, target)
        isr = tuple(b for b in p.isr if b in plan.replicas)
        if not isr:
            return [], INVALID_REPLICA_ASSIGNMENT, "no in-sync replica would remain"
        eligible = self.eligible(image)
        leader = p.leader
        if leader not in plan.replicas:
            leader = next((b for b in plan.replicas if b in isr and eligible(b)), NO_LEADER)
        change = change_of(p, leader, isr, plan.replicas, plan.adding, plan.removing)
        if change is None:
            return [], NONE, ""
        records: list[MetadataRecord] = [change]
        after = apply_partition_change(p, change)
        done = complete_reassignment(after, eligible)
        if done is not None:
            records.append(done)
        return records, NONE, ""


# The broker lifecycle as a transition table: (state, heartbeat event) -> transition. A pair
# missing here is a bug, reported by the invariant check in broker_heartbeat. Registration,
# session expiry and unregistering are not heartbeats; docs/metadata.md has the full table.
_T = QuorumController
LIFECYCLE: dict[tuple[BrokerState, HeartbeatEvent], Callable[[QuorumController, _Beat], Result]] = {
    (BrokerState.FENCED, HeartbeatEvent.BEHIND): _T._stay,
    (BrokerState.FENCED, HeartbeatEvent.CAUGHT_UP): _T._unfence,
    (BrokerState.FENCED, HeartbeatEvent.WANT_FENCE): _T._stay,
    (BrokerState.FENCED, HeartbeatEvent.WANT_SHUTDOWN): _T._shut_down_now,
    (BrokerState.ACTIVE, HeartbeatEvent.BEHIND): _T._stay,
    (BrokerState.ACTIVE, HeartbeatEvent.CAUGHT_UP): _T._stay,
    (BrokerState.ACTIVE, HeartbeatEvent.WANT_FENCE): _T._fence,
    (BrokerState.ACTIVE, HeartbeatEvent.WANT_SHUTDOWN): _T._begin_shutdown,
    # Controlled shutdown cannot be called off: every heartbeat moves it on.
    (BrokerState.SHUTTING_DOWN, HeartbeatEvent.BEHIND): _T._continue_shutdown,
    (BrokerState.SHUTTING_DOWN, HeartbeatEvent.CAUGHT_UP): _T._continue_shutdown,
    (BrokerState.SHUTTING_DOWN, HeartbeatEvent.WANT_FENCE): _T._continue_shutdown,
    (BrokerState.SHUTTING_DOWN, HeartbeatEvent.WANT_SHUTDOWN): _T._continue_shutdown,
}


def topic_name_error(name: str) -> str | None:
    """Kafka's topic name rules; None when the name is legal."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > TOPIC_NAME_MAX:
        return f"topic name is longer than {TOPIC_NAME_MAX} characters"
    if not _TOPIC_NAME.match(name):
        return f"topic name {name!r} may hold only ASCII letters, digits, '.', '_' and '-'"
    return None


def creatable(topics: Sequence[CreatableTopic | tuple[Any, ...]]) -> list[CreatableTopic]:
    return [t if isinstance(t, CreatableTopic) else CreatableTopic(*t) for t in topics]


def total_partitions(image: MetadataImage) -> int:
    """Partitions in the cluster, building topics' full counts included."""
    building = sum(t.partition_count for t in image.building_topics.values())
    return image.partition_count() + building


def _registration_error(
    broker_id: int,
    incarnation_id: str,
    endpoints: Sequence[Endpoint | tuple[str, str, int]],
    rack: str | None,
) -> str | None:
    if not 0 <= broker_id <= BROKER_ID_MAX:
        # Kafka's broker ids are int32 and never negative; -1 is NO_LEADER here.
        return f"broker id {broker_id} must be in 0..{BROKER_ID_MAX}"
    texts = [("incarnation id", incarnation_id), ("rack", rack or "")]
    if len(endpoints) > REGISTRATION_ENDPOINTS_MAX:
        return f"{len(endpoints)} listeners: at most {REGISTRATION_ENDPOINTS_MAX}"
    for e in endpoints:
        texts += [("listener name", e[0]), ("host", e[1])]
    for what, text in texts:
        if not isinstance(text, str) or len(text) > REGISTRATION_TEXT_MAX:
            size = len(text) if isinstance(text, str) else type(text).__name__
            return f"{what} ({size}) must be a string of at most {REGISTRATION_TEXT_MAX} chars"
    return None


class MetricNames:
    """Topic names by their metric name ('.' read as '_'), to refuse a topic whose name
    differs from another's only by '.' vs '_' (their metrics collide): the image's
    topics, indexed on first use, then those a request creates. Comparing each new name
    with every topic made a create of N topics in a cluster of T cost N x T."""

    def __init__(self, image: MetadataImage) -> None:
        self._image = image
        self._names: dict[str, str] | None = None

    def _index(self) -> dict[str, str]:
        if self._names is None:
            self._names = {}
            for name in self._image.topics_by_name:
                self.add(name)
        return self._names

    def clash(self, name: str) -> str | None:
        """The topic ``name`` would collide with, if any."""
        if "." not in name and "_" not in name:
            return None  # only the same name has its metric name
        other = self._index().get(name.replace(".", "_"))
        return other if other != name else None

    def add(self, name: str) -> None:
        if "." in name or "_" in name:
            self._index().setdefault(name.replace(".", "_"), name)


def _check_assignments(
    image: MetadataImage, assignments: Mapping[int, Sequence[int]], eligible: Eligible
) -> list[tuple[int, ...]] | tuple[int, str]:
    if sorted(assignments) != list(range(len(assignments))) or not assignments:
        return INVALID_PARTITIONS, "assignments must cover partitions 0..n-1"
    rf = len(assignments[0])
    out: list[tuple[int, ...]] = []
    for p in range(len(assignments)):
        replicas = tuple(assignments[p])
        error = validate_assignment(replicas, image.brokers, rf)
        if error:
            return INVALID_REPLICA_ASSIGNMENT, f"partition {p}: {error}"
        if not any(eligible(b) for b in replicas):
            return INVALID_REPLICA_ASSIGNMENT, f"partition {p}: every replica is fenced"
        out.append(replicas)
    return out


def _controller_partitions(image: MetadataImage) -> Iterator[tuple[TopicImage, Partition]]:
    """Every partition, building topics' too: fencing and elections must cover a topic
    whose creation is under way, or it would complete with a fenced leader."""
    yield from image.iter_partitions()
    for t in image.building_topics.values():
        for p in t.partitions.values():
            yield t, p


_SEGMENT_STATES = {
    SEGMENT_COPY_STARTED: "COPY_STARTED",
    SEGMENT_COPY_FINISHED: "COPY_FINISHED",
    SEGMENT_DELETE_STARTED: "DELETE_STARTED",
    SEGMENT_DELETE_FINISHED: "DELETE_FINISHED",
}


def _remote_transition_error(cur: RemoteSegment | None, new: RemoteSegment) -> str | None:
    """Why ``new`` may not follow ``cur`` (the segment's state in the image, None when
    it has none); "retry" when ``new`` is a change already made; None when legal."""
    state = _SEGMENT_STATES.get(new.state)
    if state is None:
        return f"unknown segment state {new.state}"
    have = "none" if cur is None else _SEGMENT_STATES[cur.state]
    if cur is not None and cur == new:
        return "retry"
    if cur is not None and (cur.start_offset, cur.end_offset) != (new.start_offset, new.end_offset):
        return f"segment {new.segment_id} spans {cur.start_offset}..{cur.end_offset}"
    if new.state == SEGMENT_COPY_STARTED:
        ok = cur is None
    elif new.state == SEGMENT_COPY_FINISHED:
        ok = (
            cur is not None
            and cur.state == SEGMENT_COPY_STARTED
            and (cur.broker_id, cur.leader_epoch) == (new.broker_id, new.leader_epoch)
        )
    elif new.state == SEGMENT_DELETE_STARTED:
        ok = cur is not None and cur.state != SEGMENT_DELETE_FINISHED
    else:  # DELETE_FINISHED; none: the segment is gone already (a retry)
        if cur is None:
            return "retry"
        ok = cur.state == SEGMENT_DELETE_STARTED
    if ok:
        return None
    writer = "" if cur is None else f" by broker {cur.broker_id} epoch {cur.leader_epoch}"
    return f"segment {new.segment_id}: {have}{writer} cannot become {state}"


def _partition_response(topic: str, p: Partition) -> AlterPartitionResponse:
    return AlterPartitionResponse(
        NONE, "", topic, p.partition, p.leader, p.leader_epoch, p.isr, p.partition_epoch
    )


# ---------------------------------------------------------------------------- driver aid


class PendingImages:
    """The committed image plus the image with every proposed record (for the driver).

    ``propose`` replays an operation's records onto ``pending`` right away, so the next
    operation sees them. ``commit`` takes entries as Raft commits them (on any controller,
    proposed here or not), replays them onto ``committed`` and returns the delta for
    listeners; ``pending`` is rebuilt from the new committed image plus the proposals not
    yet committed. ``reset`` drops uncommitted proposals (leadership lost: Raft may
    truncate them).
    """

    def __init__(self, committed: MetadataImage) -> None:
        self.committed = committed
        self.pending = committed
        # (offset, epoch, records) of each proposal not yet committed, and the image once
        # it and every earlier one applied: committing a head of them takes that image.
        self._proposed: list[tuple[int, int, list[MetadataRecord]]] = []
        self._images_after: list[MetadataImage] = []

    def propose(self, records: list[MetadataRecord], offset: int, epoch: int) -> None:
        self.add(records, offset, epoch, self.prepare(records, offset, epoch))

    def prepare(self, records: list[MetadataRecord], offset: int, epoch: int) -> MetadataImage:
        """The pending image with ``records`` replayed at ``offset``, changing nothing:
        raises MetadataInvariantError when they do not apply to it."""
        check(offset > self.pending.offset, f"offset {offset} not past {self.pending.offset}")
        delta = MetadataDelta(self.pending)
        delta.replay_all(records, offset, epoch)
        return delta.apply()

    def add(
        self, records: list[MetadataRecord], offset: int, epoch: int, image: MetadataImage
    ) -> None:
        """Take a proposal whose `prepare` gave ``image`` (nothing proposed since)."""
        self.pending = image
        self._proposed.append((offset, epoch, records))
        self._images_after.append(image)

    def commit(
        self,
        entries: Sequence[tuple[int, int, list[MetadataRecord]]],
        want_delta: bool = True,
    ) -> tuple[MetadataDelta | None, MetadataImage]:
        """Apply committed (offset, epoch, records) entries, in log order.

        Without ``want_delta``, entries that are exactly every proposal still pending
        are not replayed at all: the pending image already is their result (the active
        controller's common case, which made it replay a large operation twice).
        """
        ours = len(entries) <= len(self._proposed) and all(
            e[:2] == p[:2] for e, p in zip(entries, self._proposed, strict=False)
        )  # the entries are the head of our own proposals, in order
        if ours and not want_delta and entries:
            # Their result is already built: Raft hands commits over in slices, and
            # replaying each slice again would double the active controller's work.
            self.committed = self._images_after[len(entries) - 1]
            del self._proposed[: len(entries)], self._images_after[: len(entries)]
            return None, self.committed
        delta = MetadataDelta(self.committed)
        for offset, epoch, records in entries:
            delta.replay_all(records, offset, epoch)
            delta.offset, delta.epoch = offset, epoch  # an entry may hold no records
        self.committed = delta.apply()
        kept = [i for i, e in enumerate(self._proposed) if e[0] > self.committed.offset]
        self._proposed = [self._proposed[i] for i in kept]
        self._images_after = [self._images_after[i] for i in kept]
        if not self._proposed:
            self.pending = self.committed
        elif not ours:
            image = self.committed
            self._images_after = []
            for offset, epoch, records in self._proposed:
                image = replay_records(image, records, offset, epoch)
                self._images_after.append(image)
            self.pending = image
        # else: the entries were our proposals, so pending (committed + all proposals)
        # is already right; replaying the rest again on every commit made a long run of
        # proposals (a large operation's entries) cost quadratic time.
        return delta, self.committed

    def reset(self) -> None:
        self._proposed.clear()
        self._images_after.clear()
        self.pending = self.committed
