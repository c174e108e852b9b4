"""Typed wire messages, generated from client/wire/schemas.py: do not edit.

Regenerate with `python -m rillet.client.wire.schemas` (tests/test_schemas.py fails when
this file is stale, and importing it checks it against the declarations).

Every struct is a NamedTuple in wire order, so msgpack packs it as the array it is on the
wire; every request and response is a NamedTuple of its header fields, required fields
first. ``to_header()`` gives the header map; ``from_header(header, version)`` the message
(a request is validated first, see ``schemas.decode``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Self

from rillet.client.wire import schemas


class ProducePartitionResult(NamedTuple):
    """On the wire: ``[partition, error_code, base_offset, log_append_time, log_start_offset,
    error_message]``.
    """

    partition: int
    error_code: int
    base_offset: int
    log_append_time: int
    log_start_offset: int
    error_message: str | None


class ProduceTopicResult(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[ProducePartitionResult]


class ProducePartition(NamedTuple):
    """On the wire: ``[partition, nbytes]``."""

    partition: int
    nbytes: int


class ProduceTopic(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[ProducePartition]


class EpochEndOffset(NamedTuple):
    """On the wire: ``[epoch, end_offset]``."""

    epoch: int
    end_offset: int


class FetchPartitionResult(NamedTuple):
    """On the wire: ``[partition, error_code, high_watermark, last_stable_offset,
    log_start_offset, diverging_epoch, preferred_read_replica, nbytes]``.
    """

    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    # the first offset in either tier (local or remote)
    log_start_offset: int
    diverging_epoch: EpochEndOffset | None
    preferred_read_replica: int
    nbytes: int


class FetchTopicResult(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[FetchPartitionResult]


class FetchPartition(NamedTuple):
    """On the wire: ``[partition, fetch_offset, last_fetched_epoch, current_leader_epoch,
    log_start_offset, partition_max_bytes, topic_id]``.
    """

    partition: int
    fetch_offset: int
    last_fetched_epoch: int
    current_leader_epoch: int
    log_start_offset: int
    partition_max_bytes: int
    # a follower's: its replica's topic id (KIP-516)
    topic_id: str = ""


class FetchTopic(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[FetchPartition]


class ForgottenTopic(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[int]


class ListOffsetsPartitionResult(NamedTuple):
    """On the wire: ``[partition, error_code, timestamp, offset, leader_epoch]``."""

    partition: int
    error_code: int
    timestamp: int
    offset: int
    leader_epoch: int


class ListOffsetsTopicResult(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[ListOffsetsPartitionResult]


class ListOffsetsPartition(NamedTuple):
    """On the wire: ``[partition, current_leader_epoch, timestamp]``."""

    partition: int
    current_leader_epoch: int
    # -1 latest, -2 earliest (the remote log start when the tier holds older records), -4
    # earliest local (the local log start), else a timestamp in ms
    timestamp: int


class ListOffsetsTopic(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[ListOffsetsPartition]


class MetadataBroker(NamedTuple):
    """On the wire: ``[node_id, host, port, rack]``."""

    node_id: int
    host: str
    port: int
    rack: str | None


class MetadataPartition(NamedTuple):
    """On the wire: ``[error_code, partition, leader_id, leader_epoch, replicas, isr,
    offline_replicas]``.
    """

    error_code: int
    partition: int
    leader_id: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline_replicas: list[int]


class MetadataTopic(NamedTuple):
    """On the wire: ``[error_code, name, is_internal, partitions, topic_id]``."""

    error_code: int
    name: str
    is_internal: bool
    partitions: list[MetadataPartition]
    # KIP-516; consumer groups name topics by id
    topic_id: str = ""


class RemainingPartition(NamedTuple):
    """On the wire: ``[topic, partition]``."""

    topic: str
    partition: int


class OffsetCommitPartitionResult(NamedTuple):
    """On the wire: ``[partition, error_code]``."""

    partition: int
    error_code: int


class OffsetCommitTopicResult(NamedTuple):
    """On the wire: ``[name, partitions]``."""

    name: str
    partitions: list[OffsetCommitPartitionResult]


class OffsetCommitPartition(NamedTuple):
    """On the wire: ``[partition, committed_offset, committed_leader_epoch,
    committed_metadata]``.
    """

    partition: int
    committed_offset: int
    committed_leader_epoch: int = -1
    committed_metadata: str | None = None


class OffsetCommitTopic(NamedTuple):
    """On the wire: ``[name, partitions]``."""

    name: str
    partitions: list[OffsetCommitPartition]


class OffsetFetchPartitionResult(NamedTuple):
    """On the wire: ``[partition, committed_offset, committed_leader_epoch, metadata,
    error_code]``.
    """

    partition: int
    # -1 when the group committed none
    committed_offset: int
    committed_leader_epoch: int
    metadata: str | None
    error_code: int


class OffsetFetchTopicResult(NamedTuple):
    """On the wire: ``[name, partitions]``."""

    name: str
    partitions: list[OffsetFetchPartitionResult]


class OffsetFetchGroupResult(NamedTuple):
    """On the wire: ``[group_id, topics, error_code]``."""

    group_id: str
    topics: list[OffsetFetchTopicResult]
    error_code: int


class OffsetFetchTopic(NamedTuple):
    """On the wire: ``[name, partition_indexes]``."""

    name: str
    partition_indexes: list[int]


class OffsetFetchGroup(NamedTuple):
    """On the wire: ``[group_id, member_id, member_epoch, topics]``."""

    group_id: str
    # nil from outside the group
    member_id: str | None
    # -1 from outside the group
    member_epoch: int
    # nil for every partition the group committed
    topics: list[OffsetFetchTopic] | None


class Coordinator(NamedTuple):
    """On the wire: ``[key, node_id, host, port, error_code, error_message]``."""

    key: str
    # -1 when there is none
    node_id: int
    host: str
    port: int
    error_code: int
    error_message: str | None


class ListedGroup(NamedTuple):
    """On the wire: ``[group_id, protocol_type, group_state, group_type]``."""

    group_id: str
    protocol_type: str
    group_state: str
    group_type: str


class ApiVersionRange(NamedTuple):
    """On the wire: ``[api_key, min_version, max_version]``."""

    api_key: int
    min_version: int
    max_version: int


class CreatableTopicResult(NamedTuple):
    """On the wire: ``[name, error_code, error_message, num_partitions, replication_factor]``."""

    name: str
    error_code: int
    error_message: str | None
    num_partitions: int
    replication_factor: int


class ReplicaAssignment(NamedTuple):
    """On the wire: ``[partition, broker_ids]``."""

    partition: int
    broker_ids: list[int]


class CreatableTopic(NamedTuple):
    """On the wire: ``[name, num_partitions, replication_factor, assignments, configs]``."""

    name: str
    # -1: the broker default
    num_partitions: int
    # -1: the broker default
    replication_factor: int
    assignments: list[ReplicaAssignment]
    configs: dict[str, str]


class DeletableTopicResult(NamedTuple):
    """On the wire: ``[name, error_code, error_message]``."""

    name: str
    error_code: int
    error_message: str | None


class DescribeConfigsResourceResult(NamedTuple):
    """On the wire: ``[name, value, read_only, is_default, config_source, is_sensitive,
    config_type, documentation]``.
    """

    name: str
    # nil for a sensitive key
    value: str | None
    read_only: bool
    is_default: bool
    # 1: the topic's own, 4: the broker's file, 5: a default
    config_source: int
    is_sensitive: bool
    # 1 boolean, 2 string, 3 int, 5 long, 7 list
    config_type: int
    documentation: str | None


class DescribeConfigsResult(NamedTuple):
    """On the wire: ``[error_code, error_message, resource_type, resource_name, configs]``."""

    error_code: int
    error_message: str | None
    resource_type: int
    resource_name: str
    configs: list[DescribeConfigsResourceResult]


class DescribeConfigsResource(NamedTuple):
    """On the wire: ``[resource_type, resource_name, configuration_keys]``."""

    resource_type: int
    resource_name: str
    # nil: every key
    configuration_keys: list[str] | None


class DescribeLogDirsPartition(NamedTuple):
    """On the wire: ``[partition, error_code, log_start_offset, local_log_start_offset,
    log_end_offset, size_bytes, remote_log_start_offset, remote_end_offset,
    remote_size_bytes, remote_segments, copy_lag_bytes, copy_lag_segments,
    remote_storage]``.
    """

    partition: int
    error_code: int
    # the first offset in either tier
    log_start_offset: int
    local_log_start_offset: int
    log_end_offset: int
    # on local disk
    size_bytes: int
    # -1: nothing in the remote tier
    remote_log_start_offset: int
    # the highest offset safely remote, -1 if none
    remote_end_offset: int
    remote_size_bytes: int
    remote_segments: int
    # closed, committed local segments not yet remote
    copy_lag_bytes: int
    copy_lag_segments: int
    # the topic's remote.storage.enable, on this broker
    remote_storage: bool


class DescribeLogDirsTopicResult(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[DescribeLogDirsPartition]


class DescribeLogDirsTopic(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[int]


class DeletableGroupResult(NamedTuple):
    """On the wire: ``[group_id, error_code]``."""

    group_id: str
    error_code: int


class PartitionResult(NamedTuple):
    """On the wire: ``[topic, partition, error_code, error_message]``."""

    topic: str
    partition: int
    error_code: int
    error_message: str | None


class AlterConfigsResourceResponse(NamedTuple):
    """On the wire: ``[error_code, error_message, resource_type, resource_name]``."""

    error_code: int
    error_message: str | None
    resource_type: int
    resource_name: str


class AlterableConfig(NamedTuple):
    """On the wire: ``[name, config_operation, value]``."""

    name: str
    # 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT
    config_operation: int
    value: str | None


class AlterConfigsResource(NamedTuple):
    """On the wire: ``[resource_type, resource_name, configs]``."""

    resource_type: int
    resource_name: str
    configs: list[AlterableConfig]


class ReassignablePartition(NamedTuple):
    """On the wire: ``[topic, partition, replicas]``."""

    topic: str
    partition: int
    # target replicas; nil cancels
    replicas: list[int] | None


class OffsetDeletePartitionResult(NamedTuple):
    """On the wire: ``[partition, error_code]``."""

    partition: int
    error_code: int


class OffsetDeleteTopicResult(NamedTuple):
    """On the wire: ``[name, partitions]``."""

    name: str
    partitions: list[OffsetDeletePartitionResult]


class OffsetDeleteTopic(NamedTuple):
    """On the wire: ``[name, partitions]``."""

    name: str
    partitions: list[int]


class ReplicaState(NamedTuple):
    """On the wire: ``[replica_id, log_end_offset, last_fetch_timestamp,
    last_caught_up_timestamp]``.
    """

    replica_id: int
    # the leader's match index for it (its own last index)
    log_end_offset: int
    # wall-clock ms the leader last heard from it; -1
    last_fetch_timestamp: int
    # wall-clock ms it last matched the leader; -1
    last_caught_up_timestamp: int


class IsrResult(NamedTuple):
    """On the wire: ``[partition, error_code, leader_id, leader_epoch, isr, partition_epoch]``."""

    partition: int
    error_code: int
    leader_id: int
    leader_epoch: int
    isr: list[int]
    partition_epoch: int


class AlterPartitionTopicResult(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[IsrResult]


class IsrProposal(NamedTuple):
    """On the wire: ``[partition, leader_epoch, new_isr, partition_epoch]``."""

    partition: int
    leader_epoch: int
    new_isr: list[int]
    partition_epoch: int


class AlterPartitionTopic(NamedTuple):
    """On the wire: ``[topic, partitions]``."""

    topic: str
    partitions: list[IsrProposal]


class DescribeClusterBroker(NamedTuple):
    """On the wire: ``[broker_id, host, port, rack, is_fenced]``."""

    broker_id: int
    host: str
    port: int
    rack: str | None
    is_fenced: bool


class Listener(NamedTuple):
    """On the wire: ``[name, host, port]``."""

    name: str
    host: str
    port: int


class GroupTopicPartitions(NamedTuple):
    """On the wire: ``[topic_id, partitions]``."""

    topic_id: str
    partitions: list[int]


class DescribedTopicPartitions(NamedTuple):
    """On the wire: ``[topic_id, topic_name, partitions]``."""

    topic_id: str
    topic_name: str
    partitions: list[int]


class DescribedMember(NamedTuple):
    """On the wire: ``[member_id, instance_id, rack_id, member_epoch, client_id, client_host,
    subscribed_topic_names, subscribed_topic_regex, assignment, target_assignment]``.
    """

    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    assignment: list[DescribedTopicPartitions]
    target_assignment: list[DescribedTopicPartitions]


class DescribedGroup(NamedTuple):
    """On the wire: ``[error_code, error_message, group_id, group_state, group_epoch,
    assignment_epoch, assignor_name, members, authorized_operations]``.
    """

    error_code: int
    error_message: str | None
    group_id: str
    group_state: str
    group_epoch: int
    assignment_epoch: int
    assignor_name: str
    members: list[DescribedMember]
    # -2^31: not asked for
    authorized_operations: int


class SnapshotId(NamedTuple):
    """On the wire: ``[end_offset, epoch]``."""

    end_offset: int
    epoch: int


class RemoteSegmentResult(NamedTuple):
    """On the wire: ``[segment_id, error_code, error_message]``."""

    segment_id: str
    error_code: int
    error_message: str | None


class EpochStart(NamedTuple):
    """On the wire: ``[epoch, start_offset]``."""

    epoch: int
    start_offset: int


class RemoteSegmentState(NamedTuple):
    """On the wire: ``[topic_id, partition, segment_id, start_offset, end_offset, state,
    leader_epoch, size_bytes, max_timestamp_ms, leader_epochs]``.
    """

    topic_id: str
    partition: int
    segment_id: str
    start_offset: int
    end_offset: int
    # 0 COPY_STARTED, 1 COPY_FINISHED, 2 DELETE_STARTED, 3 DELETE_FINISHED
    state: int
    # the proposer's leader epoch of the partition
    leader_epoch: int
    size_bytes: int
    max_timestamp_ms: int
    # the leader-epoch entries the segment covers
    leader_epochs: list[EpochStart]


class ErrorResponse(NamedTuple):
    """A request-level error."""

    error_code: int = 0
    error_message: str | None = None
    # NOT_CONTROLLER: the active controller
    leader_id: int = -1
    leader_host: str = ""
    leader_port: int = -1

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ProduceResponse(NamedTuple):
    """Produce response (key 0)."""

    topics: list[ProduceTopicResult]
    throttle_time_ms: int = 0
    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ProduceRequest(NamedTuple):
    """Produce request (key 0). Append batches; the payload is each partition's batches back to
    back, in order.
    """

    # 0: no response, 1: leader append, -1: all in-sync replicas
    acks: int
    timeout_ms: int
    topics: list[ProduceTopic]
    transactional_id: str | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[ProduceResponse]:
        return ProduceResponse


class FetchResponse(NamedTuple):
    """Fetch response (key 1)."""

    topics: list[FetchTopicResult]
    throttle_time_ms: int = 0
    error_code: int = 0
    # the session this fetch opened or used; 0: none
    session_id: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class FetchRequest(NamedTuple):
    """Fetch request (key 1). Read batches; the payload is each partition's `nbytes` of
    batches, in order.
    """

    # -1 for consumers, the broker id for followers
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    topics: list[FetchTopic]
    # the follower's broker epoch
    replica_epoch: int = -1
    isolation_level: int = 0
    rack_id: str = ""
    # the fetch session (KIP-227); 0: none, or ask for one (epoch 0)
    session_id: int = 0
    # 0: full fetch opening a session; n > 0: the n-th incremental fetch, listing only changed
    # partitions; -1: no session (full fetch; closes session_id)
    session_epoch: int = -1
    # incremental: partitions to drop from the session
    forgotten: list[ForgottenTopic] = []

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[FetchResponse]:
        return FetchResponse


class ListOffsetsResponse(NamedTuple):
    """ListOffsets response (key 2)."""

    topics: list[ListOffsetsTopicResult]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ListOffsetsRequest(NamedTuple):
    """ListOffsets request (key 2)."""

    topics: list[ListOffsetsTopic]
    replica_id: int = -1
    isolation_level: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[ListOffsetsResponse]:
        return ListOffsetsResponse


class MetadataResponse(NamedTuple):
    """Metadata response (key 3)."""

    cluster_id: str | None
    controller_id: int
    brokers: list[MetadataBroker]
    topics: list[MetadataTopic]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class MetadataRequest(NamedTuple):
    """Metadata request (key 3)."""

    # nil for all topics
    topics: list[str] | None
    allow_auto_topic_creation: bool = False

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[MetadataResponse]:
        return MetadataResponse


class ControlledShutdownResponse(NamedTuple):
    """ControlledShutdown response (key 7)."""

    remaining_partitions: list[RemainingPartition]
    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ControlledShutdownRequest(NamedTuple):
    """ControlledShutdown request (key 7)."""

    broker_id: int
    broker_epoch: int

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[ControlledShutdownResponse]:
        return ControlledShutdownResponse


class OffsetCommitResponse(NamedTuple):
    """OffsetCommit response (key 8)."""

    topics: list[OffsetCommitTopicResult]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class OffsetCommitRequest(NamedTuple):
    """OffsetCommit request (key 8). Acknowledged once the commit is committed in the group's
    offsets partition.
    """

    group_id: str
    topics: list[OffsetCommitTopic]
    # the member epoch; -1 for a commit from outside the group (admin, manual)
    generation_id_or_member_epoch: int = -1
    member_id: str = ""
    group_instance_id: str | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[OffsetCommitResponse]:
        return OffsetCommitResponse


class OffsetFetchResponse(NamedTuple):
    """OffsetFetch response (key 9)."""

    groups: list[OffsetFetchGroupResult]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class OffsetFetchRequest(NamedTuple):
    """OffsetFetch request (key 9)."""

    groups: list[OffsetFetchGroup]
    require_stable: bool = False

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[OffsetFetchResponse]:
        return OffsetFetchResponse


class FindCoordinatorResponse(NamedTuple):
    """FindCoordinator response (key 10)."""

    coordinators: list[Coordinator]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class FindCoordinatorRequest(NamedTuple):
    """FindCoordinator request (key 10). Who coordinates each key: the leader of the
    `__consumer_offsets` partition its hash maps to.
    """

    # group ids (or transactional ids) to look up
    coordinator_keys: list[str]
    # 0: group, 1: transaction
    key_type: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[FindCoordinatorResponse]:
        return FindCoordinatorResponse


class ListGroupsResponse(NamedTuple):
    """ListGroups response (key 16)."""

    groups: list[ListedGroup]
    throttle_time_ms: int = 0
    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ListGroupsRequest(NamedTuple):
    """ListGroups request (key 16). Sent to every broker: each lists the groups it coordinates."""

    # empty for every state
    states_filter: list[str] = []
    # consumer or classic; empty for both
    types_filter: list[str] = []

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[ListGroupsResponse]:
        return ListGroupsResponse


class ApiVersionsResponse(NamedTuple):
    """ApiVersions response (key 18)."""

    api_keys: list[ApiVersionRange]
    error_code: int = 0
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ApiVersionsRequest(NamedTuple):
    """ApiVersions request (key 18). Built into every RpcServer: the APIs and versions this
    node serves.
    """

    client_software_name: str = ""
    client_software_version: str = ""

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[ApiVersionsResponse]:
        return ApiVersionsResponse


class CreateTopicsResponse(NamedTuple):
    """CreateTopics response (key 19)."""

    topics: list[CreatableTopicResult]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class CreateTopicsRequest(NamedTuple):
    """CreateTopics request (key 19)."""

    topics: list[CreatableTopic]
    timeout_ms: int
    validate_only: bool = False

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[CreateTopicsResponse]:
        return CreateTopicsResponse


class DeleteTopicsResponse(NamedTuple):
    """DeleteTopics response (key 20)."""

    responses: list[DeletableTopicResult]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class DeleteTopicsRequest(NamedTuple):
    """DeleteTopics request (key 20)."""

    topic_names: list[str]
    timeout_ms: int

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[DeleteTopicsResponse]:
        return DeleteTopicsResponse


class DescribeConfigsResponse(NamedTuple):
    """DescribeConfigs response (key 32)."""

    results: list[DescribeConfigsResult]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class DescribeConfigsRequest(NamedTuple):
    """DescribeConfigs request (key 32). Any broker answers for topics from its metadata image
    (keys without an override show the broker's default, `is_default`), and for itself as a
    BROKER resource. A resource named twice is answered once (its key lists merged); a
    request naming more than 1,000 distinct resources has each refused INVALID_REQUEST.
    """

    resources: list[DescribeConfigsResource]
    # accepted; no synonyms are sent
    include_synonyms: bool = False
    include_documentation: bool = False

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[DescribeConfigsResponse]:
        return DescribeConfigsResponse


class DescribeLogDirsResponse(NamedTuple):
    """DescribeLogDirs response (key 35)."""

    topics: list[DescribeLogDirsTopicResult]
    throttle_time_ms: int = 0
    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class DescribeLogDirsRequest(NamedTuple):
    """DescribeLogDirs request (key 35). Answered by each partition's leader (others:
    NOT_LEADER_OR_FOLLOWER): its local and remote log (rillet's shape, not Kafka's). Feeds
    `rillet topic describe`.
    """

    # nil: every partition this broker leads
    topics: list[DescribeLogDirsTopic] | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[DescribeLogDirsResponse]:
        return DescribeLogDirsResponse


class DeleteGroupsResponse(NamedTuple):
    """DeleteGroups response (key 42)."""

    results: list[DeletableGroupResult]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class DeleteGroupsRequest(NamedTuple):
    """DeleteGroups request (key 42). Only empty groups are deleted (NON_EMPTY_GROUP
    otherwise), with their offsets.
    """

    groups_names: list[str]

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[DeleteGroupsResponse]:
        return DeleteGroupsResponse


class ElectLeadersResponse(NamedTuple):
    """ElectLeaders response (key 43)."""

    results: list[PartitionResult]
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ElectLeadersRequest(NamedTuple):
    """ElectLeaders request (key 43). Served by the active controller: move leadership to each
    partition's first replica.
    """

    # 0: preferred leader (the only type)
    election_type: int = 0
    # nil for every topic
    topics: list[str] | None = None
    timeout_ms: int = 30000

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[ElectLeadersResponse]:
        return ElectLeadersResponse


class IncrementalAlterConfigsResponse(NamedTuple):
    """IncrementalAlterConfigs response (key 44)."""

    responses: list[AlterConfigsResourceResponse]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class IncrementalAlterConfigsRequest(NamedTuple):
    """IncrementalAlterConfigs request (key 44). Brokers forward it to the active controller,
    which commits the topic's Config records; a resource is changed whole or not at all.
    """

    resources: list[AlterConfigsResource]
    validate_only: bool = False

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[IncrementalAlterConfigsResponse]:
        return IncrementalAlterConfigsResponse


class AlterPartitionReassignmentsResponse(NamedTuple):
    """AlterPartitionReassignments response (key 45)."""

    results: list[PartitionResult]
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class AlterPartitionReassignmentsRequest(NamedTuple):
    """AlterPartitionReassignments request (key 45). Served by the active controller (KIP-455)."""

    partitions: list[ReassignablePartition]
    timeout_ms: int = 30000

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[AlterPartitionReassignmentsResponse]:
        return AlterPartitionReassignmentsResponse


class OffsetDeleteResponse(NamedTuple):
    """OffsetDelete response (key 47)."""

    topics: list[OffsetDeleteTopicResult]
    error_code: int = 0
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class OffsetDeleteRequest(NamedTuple):
    """OffsetDelete request (key 47). Drops committed offsets of topics the group is not
    subscribed to.
    """

    group_id: str
    topics: list[OffsetDeleteTopic]

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[OffsetDeleteResponse]:
        return OffsetDeleteResponse


class DescribeQuorumResponse(NamedTuple):
    """DescribeQuorum response (key 55)."""

    node_id: int
    # follower, pre-candidate, candidate or leader
    role: str
    term: int
    # -1 when unknown
    leader_id: int
    # this node is the active controller
    active: bool
    cluster_id: str | None
    commit_index: int
    # offset of the newest record in this node's image
    applied_offset: int
    # last index of the local snapshot, 0 if none
    snapshot_index: int
    last_index: int
    # the committed offset, as the leader knows it
    high_watermark: int
    # the leader's view of every voter; only itself on another node
    current_voters: list[ReplicaState]
    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class DescribeQuorumRequest(NamedTuple):
    """DescribeQuorum request (key 55). Any controller answers with its own view of the quorum
    (rillet's shape, not Kafka's): for tooling, tests and status pages. Brokers forward it
    to the active controller, asking with `leader_only`.
    """

    # a controller that is not active answers NOT_CONTROLLER (with a redirect)
    leader_only: bool = False

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[DescribeQuorumResponse]:
        return DescribeQuorumResponse


class AlterPartitionResponse(NamedTuple):
    """AlterPartition response (key 56)."""

    topics: list[AlterPartitionTopicResult]
    throttle_time_ms: int = 0
    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class AlterPartitionRequest(NamedTuple):
    """AlterPartition request (key 56)."""

    broker_id: int
    broker_epoch: int
    topics: list[AlterPartitionTopic]

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[AlterPartitionResponse]:
        return AlterPartitionResponse


class DescribeClusterResponse(NamedTuple):
    """DescribeCluster response (key 60)."""

    cluster_id: str
    controller_id: int
    brokers: list[DescribeClusterBroker]
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class DescribeClusterRequest(NamedTuple):
    """DescribeCluster request (key 60)."""

    pass

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[DescribeClusterResponse]:
        return DescribeClusterResponse


class BrokerRegistrationResponse(NamedTuple):
    """BrokerRegistration response (key 62)."""

    broker_epoch: int
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class BrokerRegistrationRequest(NamedTuple):
    """BrokerRegistration request (key 62)."""

    broker_id: int
    cluster_id: str
    # a fresh uuid per process start
    incarnation_id: str
    listeners: list[Listener]
    rack: str | None = None
    # -1, or the epoch before a clean stop
    previous_broker_epoch: int = -1

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[BrokerRegistrationResponse]:
        return BrokerRegistrationResponse


class BrokerHeartbeatResponse(NamedTuple):
    """BrokerHeartbeat response (key 63)."""

    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class BrokerHeartbeatRequest(NamedTuple):
    """BrokerHeartbeat request (key 63)."""

    broker_id: int
    broker_epoch: int
    current_metadata_offset: int
    want_fence: bool = False
    want_shut_down: bool = False

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[BrokerHeartbeatResponse]:
        return BrokerHeartbeatResponse


class ConsumerGroupHeartbeatResponse(NamedTuple):
    """ConsumerGroupHeartbeat response (key 68)."""

    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    # the member's target partitions; nil: unchanged
    assignment: list[GroupTopicPartitions] | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ConsumerGroupHeartbeatRequest(NamedTuple):
    """ConsumerGroupHeartbeat request (key 68). KIP-848: join, stay alive, learn the assignment
    and leave, in one request.
    """

    group_id: str
    # chosen by the client (a UUID) when it joins
    member_id: str
    # 0 joins, -1 leaves, -2 leaves a static member
    member_epoch: int
    # static membership
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    # nil: unchanged since the last heartbeat
    subscribed_topic_names: list[str] | None = None
    subscribed_topic_regex: str | None = None
    # uniform or range; nil: default
    server_assignor: str | None = None
    # what the member owns now; nil: unchanged
    topic_partitions: list[GroupTopicPartitions] | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[ConsumerGroupHeartbeatResponse]:
        return ConsumerGroupHeartbeatResponse


class ConsumerGroupDescribeResponse(NamedTuple):
    """ConsumerGroupDescribe response (key 69)."""

    groups: list[DescribedGroup]
    throttle_time_ms: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class ConsumerGroupDescribeRequest(NamedTuple):
    """ConsumerGroupDescribe request (key 69)."""

    group_ids: list[str]
    include_authorized_operations: bool = False

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[ConsumerGroupDescribeResponse]:
        return ConsumerGroupDescribeResponse


class FetchMetadataResponse(NamedTuple):
    """FetchMetadata response (key 1001)."""

    leader_id: int
    leader_epoch: int
    # the committed metadata offset
    high_watermark: int
    log_start_offset: int
    diverging_epoch: EpochEndOffset | None
    # set when the broker must load this snapshot first
    snapshot_id: SnapshotId | None
    nbytes: int
    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class FetchMetadataRequest(NamedTuple):
    """FetchMetadata request (key 1001). Brokers follow the committed metadata log (long poll);
    records in the payload.
    """

    broker_id: int
    broker_epoch: int
    # the next metadata log offset the broker needs
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int
    max_bytes: int

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[FetchMetadataResponse]:
        return FetchMetadataResponse


class RaftMessageResponse(NamedTuple):
    """RaftMessage response (key 1004)."""

    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class RaftMessageRequest(NamedTuple):
    """RaftMessage request (key 1004). One-way (never answered): one message of the Raft core,
    msgpack of `Message.to_dict()` in the payload. Replies travel as RaftMessages the other
    way.
    """

    # sending voter
    src: int
    # receiving voter
    dst: int
    # nil until the cluster id is known
    cluster_id: str | None = None

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[RaftMessageResponse]:
        return RaftMessageResponse


class AlterRemoteSegmentsResponse(NamedTuple):
    """AlterRemoteSegments response (key 1010)."""

    # one per segment, in the request's order
    results: list[RemoteSegmentResult]
    throttle_time_ms: int = 0
    error_code: int = 0

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]


class AlterRemoteSegmentsRequest(NamedTuple):
    """AlterRemoteSegments request (key 1010). A partition leader records remote (tiered)
    segment state changes in the metadata log (docs/tiered.md); answered once the records
    are committed.
    """

    broker_id: int
    broker_epoch: int
    segments: list[RemoteSegmentState]

    def to_header(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_header(cls, header: dict[str, Any], version: int = 0) -> Self:
        return schemas.decode(cls, header, version)  # type: ignore[no-any-return]

    def response_type(self) -> type[AlterRemoteSegmentsResponse]:
        return AlterRemoteSegmentsResponse


schemas.bind(globals())
