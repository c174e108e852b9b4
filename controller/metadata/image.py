"""Metadata records, the immutable MetadataImage, and the MetadataDelta that replays records.

The metadata log is a sequence of records (this module's frozen dataclasses). Applying
them in order yields a ``MetadataImage``; nothing else ever changes an image. The shape is
Kafka's (MetadataImage / MetadataDelta, docs/design.md)::

    delta = MetadataDelta(image)
    for offset, epoch, record in committed:
        delta.replay(record, offset, epoch)
    image = delta.apply()          # the next image; untouched topics are the same objects
    listener(delta, image)         # e.g. delta.local_changes(my_broker_id)

Wire encoding of one record: a msgpack array ``[type_tag, version, field, field, ...]``
(``encode_record`` / ``decode_record``). A newer version may append fields; a decoder
fills fields missing from an older version with their defaults and refuses a version
newer than it knows. A snapshot is the image written as records (``image_to_records``),
packed in one msgpack call and zstd-compressed (``encode_snapshot`` / ``decode_snapshot``).
"""

from __future__ import annotations

import dataclasses
import operator
import struct
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeVar

import crc32c as _crc32c
import msgpack
import zstandard

_T = TypeVar("_T")

NO_LEADER = -1  # a partition with no leader (offline)
NO_LEADER_CHANGE = -2  # PartitionChange.leader: leave the leader as it is

# Config resource types, Kafka's numbers.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

# RemoteSegment.state, KIP-405's lifecycle.
SEGMENT_COPY_STARTED = 0
SEGMENT_COPY_FINISHED = 1
SEGMENT_DELETE_STARTED = 2
SEGMENT_DELETE_FINISHED = 3


class MetadataInvariantError(RuntimeError):
    """A record or image broke an invariant that guards metadata: a bug or corruption."""


class MetadataFormatError(ValueError):
    """Bytes that do not decode as a metadata record or snapshot."""


def check(condition: bool, message: str) -> None:
    """An invariant check that, unlike ``assert``, survives ``python -O``."""
    if not condition:
        raise MetadataInvariantError(message)


def require(value: _T | None, message: str) -> _T:
    """``value``, which an invariant says exists."""
    if value is None:
        raise MetadataInvariantError(message)
    return value


class Endpoint(NamedTuple):
    listener: str
    host: str
    port: int


class TopicPartition(NamedTuple):
    topic: str
    partition: int


# ---------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class NoOp:
    """Written by a new Raft leader to commit its term; changes nothing but the offset."""

    TYPE: ClassVar[int] = 0
    VERSION: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    """A broker (re)registers; also the image's record of that broker (with ``fenced``)."""

    TYPE: ClassVar[int] = 1
    VERSION: ClassVar[int] = 0
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    endpoints: tuple[Endpoint, ...] = ()
    rack: str | None = None
    fenced: bool = True

    def endpoint(self, listener: str | None = None) -> Endpoint | None:
        for ep in self.endpoints:
            if listener is None or ep.listener == listener:
                return ep
        return None


@dataclass(frozen=True, slots=True)
class UnregisterBroker:
    TYPE: ClassVar[int] = 2
    VERSION: ClassVar[int] = 0
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class FenceBroker:
    TYPE: ClassVar[int] = 3
    VERSION: ClassVar[int] = 0
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class UnfenceBroker:
    TYPE: ClassVar[int] = 4
    VERSION: ClassVar[int] = 0
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic is created. ``partition_count`` > 0: it has that many partitions, whose
    records may follow in later entries; until the last one is applied the topic is
    *building*: in the image's ``building_topics`` only, invisible to brokers and clients
    (docs/controller.md, "Large operations"). 0 (version 0): complete at once."""

    TYPE: ClassVar[int] = 5
    VERSION: ClassVar[int] = 1
    name: str
    topic_id: str
    partition_count: int = 0


@dataclass(frozen=True, slots=True)
class Partition:
    """A partition's full state; also the image's record of that partition."""

    TYPE: ClassVar[int] = 6
    VERSION: ClassVar[int] = 0
    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER

    @property
    def is_reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """Only the changed fields of a partition (None / NO_LEADER_CHANGE = unchanged).

    Applying it bumps partition_epoch; it bumps leader_epoch too when the leader changes
    or the replica set loses a member (so a removed replica's fetches are fenced).
    """

    TYPE: ClassVar[int] = 7
    VERSION: ClassVar[int] = 0
    topic_id: str
    partition: int
    leader: int = NO_LEADER_CHANGE
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Config:
    """Set (value) or delete (value None) one config key of a resource."""

    TYPE: ClassVar[int] = 8
    VERSION: ClassVar[int] = 0
    resource_type: int
    resource_name: str
    key: str
    value: str | None


@dataclass(frozen=True, slots=True)
class RemoveTopic:
    """Deletes a topic with its partitions, configs and remote segment list."""

    TYPE: ClassVar[int] = 9
    VERSION: ClassVar[int] = 0
    topic_id: str


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    """A tiered (S3) segment's metadata; DELETE_FINISHED removes it from the image."""

    TYPE: ClassVar[int] = 10
    VERSION: ClassVar[int] = 0
    topic_id: str
    partition: int
    segment_id: str
    start_offset: int
    end_offset: int
    leader_epochs: tuple[tuple[int, int], ...] = ()  # (epoch, start offset) pairs
    state: int = SEGMENT_COPY_STARTED
    size_bytes: int = 0
    max_timestamp_ms: int = -1
    # Who wrote this state: the partition leader's broker id and leader epoch. The
    # controller accepts a transition only from the current leader in its current epoch,
    # so a deposed leader's late upload can never be recorded as finished.
    broker_id: int = -1
    leader_epoch: int = -1


MetadataRecord = (
    NoOp
    | RegisterBroker
    | UnregisterBroker
    | FenceBroker
    | UnfenceBroker
    | Topic
    | Partition
    | PartitionChange
    | Config
    | RemoveTopic
    | RemoteSegment
)

RECORD_TYPES: dict[int, type] = {
    cls.TYPE: cls
    for cls in (
        NoOp,
        RegisterBroker,
        UnregisterBroker,
        FenceBroker,
        UnfenceBroker,
        Topic,
        Partition,
        PartitionChange,
        Config,
        RemoveTopic,
        RemoteSegment,
    )
}
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in RECORD_TYPES.values()
}
_DEFAULTS: dict[type, tuple[Any, ...]] = {
    cls: tuple(f.default for f in dataclasses.fields(cls)) for cls in RECORD_TYPES.values()
}
_GETTERS: dict[type, Any] = {
    cls: operator.attrgetter(*names) for cls, names in _FIELDS.items() if len(names) > 1
}
_INT_TUPLE_FIELDS = frozenset({"replicas", "isr", "adding_replicas", "removing_replicas"})
# Classes whose decoded msgpack values (use_list=False) are already the field values.
_PLAIN = frozenset(cls for cls, names in _FIELDS.items() if "endpoints" not in names)


# ---------------------------------------------------------------------------- encoding


def record_to_wire(rec: MetadataRecord) -> list[Any]:
    """The msgpack-able array for one record: [type, version, fields...]."""
    cls = type(rec)
    getter = _GETTERS.get(cls)
    if getter is not None:
        return [cls.TYPE, cls.VERSION, *getter(rec)]
    return [cls.TYPE, cls.VERSION, *[getattr(rec, f) for f in _FIELDS[cls]]]


def record_from_wire(arr: list[Any] | tuple[Any, ...]) -> MetadataRecord:
    if len(arr) < 2:
        raise MetadataFormatError(f"record array too short: {arr!r}")
    cls = RECORD_TYPES.get(arr[0])
    if cls is None:
        raise MetadataFormatError(f"unknown metadata record type {arr[0]!r}")
    if not 0 <= arr[1] <= cls.VERSION:
        raise MetadataFormatError(f"{cls.__name__} version {arr[1]} is newer than {cls.VERSION}")
    names, defaults = _FIELDS[cls], _DEFAULTS[cls]
    if cls in _PLAIN and isinstance(arr, tuple) and len(arr) == len(names) + 2:
        return cls(*arr[2:])  # the fast path snapshots take
    values = list(arr[2 : 2 + len(names)])
    for i in range(len(values), len(names)):
        if defaults[i] is dataclasses.MISSING:
            raise MetadataFormatError(f"{cls.__name__} lacks required field {names[i]}")
        values.append(defaults[i])
    return cls(*[_from_wire_value(n, v) for n, v in zip(names, values, strict=True)])


def _from_wire_value(name: str, value: Any) -> Any:
    if value is None or isinstance(value, int | str | bool):
        return value
    if name in _INT_TUPLE_FIELDS:
        return tuple(value)
    if name == "endpoints":
        return tuple(Endpoint(*ep) for ep in value)
    if name == "leader_epochs":
        return tuple((int(e), int(o)) for e, o in value)
    return value


def encode_record(rec: MetadataRecord) -> bytes:
    return msgpack.packb(record_to_wire(rec), use_bin_type=True)


def decode_record(data: bytes) -> MetadataRecord:
    try:
        arr = msgpack.unpackb(data, use_list=False, raw=False)
    except (ValueError, msgpack.ExtraData) as exc:
        raise MetadataFormatError(f"undecodable metadata record: {exc}") from exc
    if not isinstance(arr, tuple):
        raise MetadataFormatError("a metadata record is a msgpack array")
    return record_from_wire(arr)


def encode_records(records: Iterable[MetadataRecord]) -> bytes:
    """Several records as one msgpack array (one Raft entry holds one operation's records)."""
    return msgpack.packb([record_to_wire(r) for r in records], use_bin_type=True)


def decode_records(data: bytes) -> list[MetadataRecord]:
    try:
        arrs = msgpack.unpackb(data, use_list=False, raw=False)
    except (ValueError, msgpack.ExtraData) as exc:
        raise MetadataFormatError(f"undecodable metadata records: {exc}") from exc
    if not isinstance(arrs, tuple):
        raise MetadataFormatError("a metadata record list is a msgpack array")
    return [record_from_wire(a) for a in arrs]


# ---------------------------------------------------------------------------- partitions


def check_partition(p: Partition) -> None:
    """The invariants every partition state in an image holds."""
    where = f"{p.topic_id}-{p.partition}"
    check(len(p.replicas) > 0, f"{where}: no replicas")
    check(len(set(p.replicas)) == len(p.replicas), f"{where}: duplicate replicas {p.replicas}")
    check(len(p.isr) > 0, f"{where}: empty ISR")
    check(len(set(p.isr)) == len(p.isr), f"{where}: duplicate ISR members {p.isr}")
    check(set(p.isr) <= set(p.replicas), f"{where}: ISR {p.isr} not within {p.replicas}")
    check(p.leader == NO_LEADER or p.leader in p.isr, f"{where}: leader {p.leader} not in ISR")
    check(set(p.adding_replicas) <= set(p.replicas), f"{where}: adding not within replicas")
    check(set(p.removing_replicas) <= set(p.replicas), f"{where}: removing not within replicas")
    check(not set(p.adding_replicas) & set(p.removing_replicas), f"{where}: adding and removing")
    check(p.leader_epoch >= 0 and p.partition_epoch >= 0, f"{where}: negative epoch")


def apply_partition_change(p: Partition, c: PartitionChange) -> Partition:
    """The partition after a change: the one rule the controller and every image share."""
    check(c.topic_id == p.topic_id and c.partition == p.partition, "change for another partition")
    leader = p.leader if c.leader == NO_LEADER_CHANGE else c.leader
    replicas = p.replicas if c.replicas is None else c.replicas
    shrunk = not set(p.replicas) <= set(replicas)
    new = Partition(
        topic_id=p.topic_id,
        partition=p.partition,
        replicas=replicas,
        isr=p.isr if c.isr is None else c.isr,
        leader=leader,
        leader_epoch=p.leader_epoch + 1 if (leader != p.leader or shrunk) else p.leader_epoch,
        partition_epoch=p.partition_epoch + 1,
        adding_replicas=p.adding_replicas if c.adding_replicas is None else c.adding_replicas,
        removing_replicas=(
            p.removing_replicas if c.removing_replicas is None else c.removing_replicas
        ),
    )
    check_partition(new)
    return new


# ---------------------------------------------------------------------------- the image

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _empty() -> Any:
    return dataclasses.field(default_factory=lambda: _EMPTY)


def _frozen(d: dict[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(d) if d else _EMPTY


class PartitionMap(Mapping[int, Partition]):
    """A topic's partitions by number, read-only, in pages of ``PAGE`` partitions.

    A new image shares every page a delta did not touch with the image before it, so a
    change to one partition of a 10,000-partition topic copies one page and the page
    index (about 300 references), not all 10,000. With a flat dict per topic, every
    AlterPartition proposal made a full copy, and an active controller holding the
    pending images of a few thousand in-flight requests grew past a GiB.
    """

    __slots__ = ("_pages", "_len")
    PAGE_BITS = 8
    PAGE = 1 << PAGE_BITS

    def __init__(self, pages: dict[int, dict[int, Partition]], length: int) -> None:
        self._pages = pages  # page number -> {partition: Partition}; never mutated
        self._len = length

    @classmethod
    def of(cls, partitions: Mapping[int, Partition]) -> PartitionMap:
        if isinstance(partitions, PartitionMap):
            return partitions
        return EMPTY_PARTITIONS.updated(partitions)

    def updated(self, changes: Mapping[int, Partition]) -> PartitionMap:
        """This map with ``changes`` set (copying only the pages they touch)."""
        if not changes:
            return self
        pages = dict(self._pages)
        copied: set[int] = set()
        length = self._len
        bits = self.PAGE_BITS
        for number, partition in changes.items():
            key = number >> bits
            page = pages.get(key)
            if key not in copied:
                page = pages[key] = dict(page) if page is not None else {}
                copied.add(key)
            assert page is not None
            if number not in page:
                length += 1
            page[number] = partition
        return PartitionMap(pages, length)

    def __getitem__(self, number: int) -> Partition:
        page = self._pages.get(number >> self.PAGE_BITS)
        if page is None:
            raise KeyError(number)
        return page[number]

    def get(self, number: int, default: Any = None) -> Any:
        page = self._pages.get(number >> self.PAGE_BITS)
        return default if page is None else page.get(number, default)

    def __contains__(self, number: object) -> bool:
        if not isinstance(number, int):
            return False
        page = self._pages.get(number >> self.PAGE_BITS)
        return page is not None and number in page

    def __iter__(self) -> Iterator[int]:
        for key in sorted(self._pages):
            yield from self._pages[key]

    def __len__(self) -> int:
        return self._len

    def values(self) -> ValuesView[Partition]:
        return _PartitionValues(self)

    def items(self) -> ItemsView[int, Partition]:
        return _PartitionItems(self)

    def __repr__(self) -> str:
        return f"PartitionMap({dict(self.items())!r})"


class _PartitionValues(ValuesView[Partition]):
    _mapping: PartitionMap

    def __iter__(self) -> Iterator[Partition]:
        pages = self._mapping._pages
        for key in sorted(pages):
            yield from pages[key].values()


class _PartitionItems(ItemsView[int, Partition]):
    _mapping: PartitionMap

    def __iter__(self) -> Iterator[tuple[int, Partition]]:
        pages = self._mapping._pages
        for key in sorted(pages):
            yield from pages[key].items()


EMPTY_PARTITIONS = PartitionMap({}, 0)


@dataclass(frozen=True, slots=True)
class TopicImage:
    name: str
    topic_id: str
    partitions: Mapping[int, Partition]
    partition_count: int = 0  # a building topic's full count (Topic.partition_count)

    @property
    def complete(self) -> bool:
        return len(self.partitions) >= self.partition_count


@dataclass(frozen=True, slots=True)
class MetadataImage:
    """Everything the metadata log says, as of record ``offset`` (Raft ``epoch``).

    Immutable: every mapping is read-only and shared with the images before and after it
    where the records between them did not touch it.
    """

    offset: int = -1
    epoch: int = -1
    brokers: Mapping[int, RegisterBroker] = _empty()
    topics_by_id: Mapping[str, TopicImage] = _empty()
    topics_by_name: Mapping[str, TopicImage] = _empty()
    configs: Mapping[tuple[int, str], Mapping[str, str]] = _empty()
    remote_segments: Mapping[tuple[str, int], Mapping[str, RemoteSegment]] = _empty()
    # Topics whose partitions are still arriving, by id: only the controller reads them.
    building_topics: Mapping[str, TopicImage] = _empty()

    def topic(self, name: str) -> TopicImage | None:
        return self.topics_by_name.get(name)

    def partition(self, topic: str, partition: int) -> Partition | None:
        t = self.topics_by_name.get(topic)
        return None if t is None else t.partitions.get(partition)

    def is_unfenced(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and not b.fenced

    def unfenced_broker_ids(self) -> list[int]:
        return sorted(b for b, reg in self.brokers.items() if not reg.fenced)

    def topic_config(self, name: str) -> Mapping[str, str]:
        """The keys set explicitly on a topic (defaults live in ``topic_config``)."""
        return self.configs.get((RESOURCE_TOPIC, name), _EMPTY)

    def iter_partitions(self) -> Iterator[tuple[TopicImage, Partition]]:
        for t in self.topics_by_name.values():
            for p in t.partitions.values():
                yield t, p

    def partitions_led_by(self, broker_id: int) -> list[tuple[TopicImage, Partition]]:
        return [(t, p) for t, p in self.iter_partitions() if p.leader == broker_id]

    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics_by_id.values())


EMPTY_IMAGE = MetadataImage()


@dataclass(frozen=True, slots=True)
class LocalChanges:
    """What one broker must do after a delta (Kafka's LocalReplicaChanges).

    Apply ``deletes`` first: a topic deleted and re-created under the same name within
    one delta shows up in ``deletes`` (old id) and in leaders/followers (new id).
    """

    leaders: Mapping[TopicPartition, Partition]
    followers: Mapping[TopicPartition, Partition]
    deletes: frozenset[TopicPartition]


@dataclass(slots=True)
class _TopicDelta:
    name: str
    topic_id: str
    created: bool  # not complete in the base image: created here, or building there
    partitions: dict[int, Partition] = dataclasses.field(default_factory=dict)
    partition_count: int = 0
    building: TopicImage | None = None  # the base image's building topic, if any

    def all_partitions(self) -> dict[int, Partition]:
        """Its partitions after this delta, for a topic not complete in the base image."""
        if self.building is None:
            return self.partitions
        return {**self.building.partitions, **self.partitions}

    @property
    def complete(self) -> bool:
        return not self.created or len(self.all_partitions()) >= self.partition_count


class MetadataDelta:
    """Replays records on top of an image; ``apply()`` yields the next image.

    Also what listeners read to learn what changed: ``changed_brokers``,
    ``changed_partitions()``, ``created_topics``, ``deleted_topics``, ``changed_configs``,
    ``local_changes(broker_id)``.
    """

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self.offset = image.offset
        self.epoch = image.epoch
        self.record_count = 0
        self.changed_brokers: dict[int, RegisterBroker | None] = {}  # None: unregistered
        self._topics: dict[str, _TopicDelta] = {}  # by topic id: created or touched
        # Names of the created entries of _topics (name -> their ids): a snapshot is one
        # delta, and a scan of _topics per Topic record made loading it quadratic.
        self._created_names: dict[str, set[str]] = {}
        self.deleted_topics: dict[str, str] = {}  # topic id -> name, of the base image
        self.aborted_topics: set[str] = set()  # building topics of the base image removed
        self._configs: dict[tuple[int, str], dict[str, str]] = {}  # touched resources
        self._remote: dict[tuple[str, int], dict[str, RemoteSegment]] = {}

    # -- replay --------------------------------------------------------------------

    def replay(self, rec: MetadataRecord, offset: int = -1, epoch: int = -1) -> None:
        """Apply one committed record (``offset``/``epoch``: where it sits in the log)."""
        handler = _REPLAY.get(type(rec))
        if handler is None:
            raise MetadataInvariantError(f"cannot replay {type(rec).__name__}")
        handler(self, rec)
        self.record_count += 1
        if offset >= 0:
            check(offset >= self.offset, f"offset went back: {offset} < {self.offset}")
            self.offset, self.epoch = offset, epoch

    def replay_all(self, records: Iterable[MetadataRecord], offset: int, epoch: int) -> None:
        for rec in records:
            self.replay(rec, offset, epoch)

    def _broker(self, broker_id: int) -> RegisterBroker | None:
        if broker_id in self.changed_brokers:
            return self.changed_brokers[broker_id]
        return self.image.brokers.get(broker_id)

    def _replay_register(self, rec: RegisterBroker) -> None:
        self.changed_brokers[rec.broker_id] = rec

    def _replay_broker_state(self, rec: UnregisterBroker | FenceBroker | UnfenceBroker) -> None:
        cur = require(
            self._broker(rec.broker_id), f"{type(rec).__name__} for unknown broker {rec.broker_id}"
        )
        check(
            cur.broker_epoch == rec.broker_epoch,
            f"{type(rec).__name__} epoch {rec.broker_epoch} != {cur.broker_epoch}",
        )
        if isinstance(rec, UnregisterBroker):
            self.changed_brokers[rec.broker_id] = None
        else:
            fenced = isinstance(rec, FenceBroker)
            if cur.fenced != fenced:
                self.changed_brokers[rec.broker_id] = dataclasses.replace(cur, fenced=fenced)

    def _topic_name(self, topic_id: str) -> str | None:
        td = self._topics.get(topic_id)
        if td is not None:
            return td.name
        if topic_id in self.deleted_topics or topic_id in self.aborted_topics:
            return None
        t = self.image.topics_by_id.get(topic_id) or self.image.building_topics.get(topic_id)
        return None if t is None else t.name

    def _name_taken(self, name: str) -> bool:
        if self._created_names.get(name):
            return True
        if any(
            t.name == name and t.topic_id not in self.aborted_topics
            for t in self.image.building_topics.values()
        ):
            return True
        t = self.image.topics_by_name.get(name)
        return t is not None and t.topic_id not in self.deleted_topics

    def _replay_topic(self, rec: Topic) -> None:
        check(self._topic_name(rec.topic_id) is None, f"topic id {rec.topic_id} exists")
        check(rec.topic_id not in self.image.topics_by_id, f"topic id {rec.topic_id} reused")
        check(rec.topic_id not in self.image.building_topics, f"topic id {rec.topic_id} reused")
        check(not self._name_taken(rec.name), f"topic {rec.name} exists")
        self._topics[rec.topic_id] = _TopicDelta(
            rec.name, rec.topic_id, created=True, partition_count=rec.partition_count
        )
        self._created_names.setdefault(rec.name, set()).add(rec.topic_id)

    def _touch_topic(self, topic_id: str) -> _TopicDelta:
        td = self._topics.get(topic_id)
        if td is None:
            name = require(self._topic_name(topic_id), f"record for unknown topic id {topic_id}")
            building = self.image.building_topics.get(topic_id)
            if building is None:
                td = _TopicDelta(name, topic_id, created=False)
            else:
                td = _TopicDelta(name, topic_id, True, {}, building.partition_count, building)
                self._created_names.setdefault(name, set()).add(topic_id)
            self._topics[topic_id] = td
        return td

    def current_partition(self, topic_id: str, partition: int) -> Partition | None:
        td = self._topics.get(topic_id)
        if td is not None and partition in td.partitions:
            return td.partitions[partition]
        if td is not None and td.created and td.building is None:
            return None
        if topic_id in self.deleted_topics or topic_id in self.aborted_topics:
            return None
        t = self.image.topics_by_id.get(topic_id) or self.image.building_topics.get(topic_id)
        return None if t is None else t.partitions.get(partition)

    def _replay_partition(self, rec: Partition) -> None:
        check_partition(rec)
        self._touch_topic(rec.topic_id).partitions[rec.partition] = rec

    def _replay_partition_change(self, rec: PartitionChange) -> None:
        cur = require(
            self.current_partition(rec.topic_id, rec.partition),
            f"change for unknown partition {rec.topic_id}-{rec.partition}",
        )
        self._touch_topic(rec.topic_id).partitions[rec.partition] = apply_partition_change(cur, rec)

    def _config(self, resource: tuple[int, str]) -> dict[str, str]:
        cur = self._configs.get(resource)
        if cur is None:
            cur = self._configs[resource] = dict(self.image.configs.get(resource, _EMPTY))
        return cur

    def _replay_config(self, rec: Config) -> None:
        cur = self._config((rec.resource_type, rec.resource_name))
        if rec.value is None:
            cur.pop(rec.key, None)
        else:
            cur[rec.key] = rec.value

    def _replay_remove_topic(self, rec: RemoveTopic) -> None:
        name = require(self._topic_name(rec.topic_id), f"RemoveTopic of unknown {rec.topic_id}")
        td = self._topics.pop(rec.topic_id, None)
        if td is not None and td.created:
            self._created_names[td.name].discard(rec.topic_id)
        if rec.topic_id in self.image.building_topics:
            self.aborted_topics.add(rec.topic_id)  # never visible: nothing for listeners
        elif td is None or not td.created:
            self.deleted_topics[rec.topic_id] = name
        self._config((RESOURCE_TOPIC, name)).clear()
        for key in [k for k in self._remote if k[0] == rec.topic_id]:
            self._remote[key].clear()

    def _replay_remote_segment(self, rec: RemoteSegment) -> None:
        check(self._topic_name(rec.topic_id) is not None, f"segment of unknown {rec.topic_id}")
        key = (rec.topic_id, rec.partition)
        segs = self._remote.get(key)
        if segs is None:
            segs = self._remote[key] = dict(self.image.remote_segments.get(key, _EMPTY))
        if rec.state == SEGMENT_DELETE_FINISHED:
            segs.pop(rec.segment_id, None)
        else:
            segs[rec.segment_id] = rec

    def _replay_noop(self, rec: NoOp) -> None:
        pass

    # -- apply ---------------------------------------------------------------------

    def apply(self) -> MetadataImage:
        """The next image. Mappings the records did not touch are the base image's own."""
        img = self.image
        brokers = img.brokers
        if self.changed_brokers:
            merged = dict(img.brokers)
            for broker_id, reg in self.changed_brokers.items():
                if reg is None:
                    merged.pop(broker_id, None)
                else:
                    merged[broker_id] = reg
            brokers = _frozen(merged)
        by_id, by_name, building = self._apply_topics()
        return MetadataImage(
            offset=self.offset,
            epoch=self.epoch,
            brokers=brokers,
            topics_by_id=by_id,
            topics_by_name=by_name,
            configs=_merge_nested(img.configs, self._configs, ()),
            remote_segments=_merge_nested(
                img.remote_segments, self._remote, (*self.deleted_topics, *self.aborted_topics)
            ),
            building_topics=building,
        )

    def _apply_topics(
        self,
    ) -> tuple[Mapping[str, TopicImage], Mapping[str, TopicImage], Mapping[str, TopicImage]]:
        """(by id, by name, building): a topic whose partitions are not all there yet goes
        to ``building`` and stays out of the maps everyone else reads."""
        img = self.image
        if not self._topics and not self.deleted_topics and not self.aborted_topics:
            return img.topics_by_id, img.topics_by_name, img.building_topics
        by_id, by_name = dict(img.topics_by_id), dict(img.topics_by_name)
        building = dict(img.building_topics)
        for topic_id in self.aborted_topics:
            del building[topic_id]
        for topic_id, name in self.deleted_topics.items():
            del by_id[topic_id]
            if by_name.get(name) is not None and by_name[name].topic_id == topic_id:
                del by_name[name]
        for topic_id, td in self._topics.items():
            if td.created:
                base = PartitionMap.of(td.building.partitions) if td.building else EMPTY_PARTITIONS
            else:
                base = PartitionMap.of(img.topics_by_id[topic_id].partitions)
            parts = base.updated(td.partitions)
            if len(parts) >= td.partition_count:  # complete: the count has done its job
                building.pop(topic_id, None)
                by_id[topic_id] = by_name[td.name] = TopicImage(td.name, topic_id, parts)
            else:
                building[topic_id] = TopicImage(td.name, topic_id, parts, td.partition_count)
        check(len(by_id) == len(by_name), "topic maps by id and by name disagree")
        return _frozen(by_id), _frozen(by_name), _frozen(building)

    # -- what changed, for listeners -------------------------------------------------

    @property
    def created_topics(self) -> dict[str, str]:
        """Topic id -> name of topics created by this delta (and not deleted again); a topic
        built over several entries is created by the delta that completes it."""
        return {tid: td.name for tid, td in self._topics.items() if td.created and td.complete}

    @property
    def changed_remote_partitions(self) -> frozenset[tuple[str, int]]:
        """(topic id, partition) of every partition whose remote segments a record of
        this delta changed (a removed topic's included)."""
        return frozenset(self._remote)

    @property
    def changed_configs(self) -> frozenset[tuple[int, str]]:
        return frozenset(self._configs)

    def changed_partitions(self) -> Iterator[tuple[str, Partition]]:
        """(topic name, new state) of every partition a record set or changed; a topic
        completed by this delta yields all its partitions, one still building none."""
        for td in self._topics.values():
            if not td.complete:
                continue
            parts = td.all_partitions() if td.created else td.partitions
            for p in parts.values():
                yield td.name, p

    def local_changes(self, broker_id: int) -> LocalChanges:
        leaders: dict[TopicPartition, Partition] = {}
        followers: dict[TopicPartition, Partition] = {}
        deletes: set[TopicPartition] = set()
        for topic_id in self.deleted_topics:
            t = self.image.topics_by_id[topic_id]
            for p in t.partitions.values():
                if broker_id in p.replicas:
                    deletes.add(TopicPartition(t.name, p.partition))
        for name, p in self.changed_partitions():
            tp = TopicPartition(name, p.partition)
            if p.leader == broker_id:
                leaders[tp] = p
            elif broker_id in p.replicas:
                followers[tp] = p
            else:
                before = self.image.topics_by_id.get(p.topic_id)
                old = None if before is None else before.partitions.get(p.partition)
                if old is not None and broker_id in old.replicas:
                    deletes.add(tp)
        return LocalChanges(_frozen(leaders), _frozen(followers), frozenset(deletes))


def _merge_nested(
    base: Mapping[Any, Mapping[Any, Any]],
    touched: dict[Any, dict[Any, Any]],
    dropped_topic_ids: tuple[str, ...],
) -> Mapping[Any, Mapping[Any, Any]]:
    """Replace touched entries (empty ones vanish); drop keys of deleted topics."""
    if not touched and not dropped_topic_ids:
        return base
    merged = dict(base)
    if dropped_topic_ids:
        gone = set(dropped_topic_ids)
        for key in [k for k in merged if k[0] in gone]:
            del merged[key]
    for key, value in touched.items():
        if value:
            merged[key] = MappingProxyType(dict(value))
        else:
            merged.pop(key, None)
    return _frozen(merged)


_REPLAY: dict[type, Any] = {
    NoOp: MetadataDelta._replay_noop,
    RegisterBroker: MetadataDelta._replay_register,
    UnregisterBroker: MetadataDelta._replay_broker_state,
    FenceBroker: MetadataDelta._replay_broker_state,
    UnfenceBroker: MetadataDelta._replay_broker_state,
    Topic: MetadataDelta._replay_topic,
    Partition: MetadataDelta._replay_partition,
    PartitionChange: MetadataDelta._replay_partition_change,
    Config: MetadataDelta._replay_config,
    RemoveTopic: MetadataDelta._replay_remove_topic,
    RemoteSegment: MetadataDelta._replay_remote_segment,
}


def replay_records(
    image: MetadataImage, records: Iterable[MetadataRecord], offset: int = -1, epoch: int = -1
) -> MetadataImage:
    """Shorthand: one delta over ``image`` with every record at ``offset``, applied."""
    delta = MetadataDelta(image)
    delta.replay_all(records, offset, epoch)
    return delta.apply()


# ---------------------------------------------------------------------------- snapshots


def image_to_records(image: MetadataImage) -> list[MetadataRecord]:
    """The image written as records; replaying them onto an empty image gives it back."""
    out: list[MetadataRecord] = [image.brokers[b] for b in sorted(image.brokers)]
    for name in sorted(image.topics_by_name):
        t = image.topics_by_name[name]
        out.append(Topic(t.name, t.topic_id))
        out.extend(t.partitions[p] for p in sorted(t.partitions))
    for topic_id in sorted(image.building_topics):
        t = image.building_topics[topic_id]
        out.append(Topic(t.name, t.topic_id, t.partition_count))
        out.extend(t.partitions[p] for p in sorted(t.partitions))
    for (rtype, rname), kv in sorted(image.configs.items()):
        out.extend(Config(rtype, rname, k, v) for k, v in sorted(kv.items()))
    for key in sorted(image.remote_segments):
        segs = image.remote_segments[key]
        out.extend(segs[s] for s in sorted(segs))
    return out


def records_to_image(
    records: Iterable[MetadataRecord], offset: int = -1, epoch: int = -1
) -> MetadataImage:
    delta = MetadataDelta(EMPTY_IMAGE)
    for rec in records:
        delta.replay(rec)
    delta.offset, delta.epoch = offset, epoch
    return delta.apply()


SNAPSHOT_MAGIC = b"RLMS"
SNAPSHOT_VERSION = 1
_SNAPSHOT_HEADER = struct.Struct(">4sBqiII")  # magic, version, offset, epoch, count, crc32c


def encode_snapshot(image: MetadataImage, level: int = 3) -> bytes:
    """The image as compact bytes: header + zstd(msgpack array of record arrays)."""
    wire = [record_to_wire(r) for r in image_to_records(image)]
    body = zstandard.ZstdCompressor(level=level).compress(msgpack.packb(wire, use_bin_type=True))
    header = _SNAPSHOT_HEADER.pack(
        SNAPSHOT_MAGIC,
        SNAPSHOT_VERSION,
        image.offset,
        image.epoch,
        len(wire),
        _crc32c.crc32c(body),
    )
    return header + body


def decode_snapshot(data: bytes) -> MetadataImage:
    offset, epoch, records = snapshot_records(data)
    return records_to_image(records, offset, epoch)


def snapshot_records(data: bytes) -> tuple[int, int, Iterator[MetadataRecord]]:
    """A snapshot's offset, epoch and records (checked: magic, CRC, count), unreplayed."""
    if len(data) < _SNAPSHOT_HEADER.size:
        raise MetadataFormatError("snapshot shorter than its header")
    magic, version, offset, epoch, count, crc = _SNAPSHOT_HEADER.unpack_from(data)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise MetadataFormatError(f"not a metadata snapshot (magic {magic!r} v{version})")
    body = memoryview(data)[_SNAPSHOT_HEADER.size :]
    if _crc32c.crc32c(body) != crc:
        raise MetadataFormatError("snapshot CRC mismatch")
    try:
        arrs = msgpack.unpackb(
            zstandard.ZstdDecompressor().decompress(body), use_list=False, raw=False
        )
    except (ValueError, zstandard.ZstdError, msgpack.ExtraData) as exc:
        raise MetadataFormatError(f"undecodable snapshot body: {exc}") from exc
    if len(arrs) != count:
        raise MetadataFormatError(f"snapshot holds {len(arrs)} records, header says {count}")
    return offset, epoch, (record_from_wire(a) for a in arrs)
