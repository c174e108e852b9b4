"""Numbered error codes, named after Kafka's where one fits, each retriable or not.

Every error that crosses the wire is a code in a response; the client turns a non-zero
code back into the matching exception with ``raise_for(code, message)``. Local misuse of
the API raises ordinary ValueError/TypeError instead, so a reader can tell whose fault an
error is (the peer's protocol breach or the caller's mistake).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ErrorCode:
    code: int
    name: str
    retriable: bool
    description: str


class RilletError(Exception):
    """Base of every error rillet raises for a wire error code."""

    code: int = -1
    retriable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or ERRORS_BY_CODE.get(self.code, UNKNOWN).description)
        self.message = message

    @property
    def name(self) -> str:
        return ERRORS_BY_CODE.get(self.code, UNKNOWN).name


_TABLE: list[tuple[int, str, bool, str]] = [
    (-1, "UNKNOWN_SERVER_ERROR", False, "The server hit an unexpected error."),
    (0, "NONE", False, "No error."),
    (1, "OFFSET_OUT_OF_RANGE", False, "The offset is outside the log's range."),
    (2, "CORRUPT_MESSAGE", True, "A batch failed its CRC or length check."),
    (3, "UNKNOWN_TOPIC_OR_PARTITION", True, "This server does not host this topic-partition."),
    (4, "INVALID_FETCH_SIZE", False, "The requested fetch size is invalid."),
    (5, "LEADER_NOT_AVAILABLE", True, "The partition has no leader right now."),
    (6, "NOT_LEADER_OR_FOLLOWER", True, "This server is not the leader of the partition."),
    (7, "REQUEST_TIMED_OUT", True, "The request timed out."),
    (8, "BROKER_NOT_AVAILABLE", True, "The broker is not available."),
    (9, "REPLICA_NOT_AVAILABLE", True, "The replica is not available."),
    (10, "MESSAGE_TOO_LARGE", False, "The batch is larger than the server accepts."),
    (12, "OFFSET_METADATA_TOO_LARGE", False, "The committed offset's metadata is too large."),
    (13, "NETWORK_EXCEPTION", True, "The connection closed before a response arrived."),
    (14, "COORDINATOR_LOAD_IN_PROGRESS", True, "The coordinator is loading."),
    (15, "COORDINATOR_NOT_AVAILABLE", True, "The coordinator is not available."),
    (16, "NOT_COORDINATOR", True, "This server is not the coordinator."),
    (17, "INVALID_TOPIC_EXCEPTION", False, "The topic name is invalid."),
    (18, "RECORD_LIST_TOO_LARGE", False, "The request holds more bytes than allowed."),
    (19, "NOT_ENOUGH_REPLICAS", True, "Fewer in-sync replicas than min.insync.replicas."),
    (20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", True, "Written, but to too few in-sync replicas."),
    (21, "INVALID_REQUIRED_ACKS", False, "acks must be 0, 1 or -1 (all)."),
    (22, "ILLEGAL_GENERATION", False, "The group generation is not current."),
    (23, "INCONSISTENT_GROUP_PROTOCOL", False, "The member's protocol does not match the group's."),
    (24, "INVALID_GROUP_ID", False, "The group id is empty or invalid."),
    (25, "UNKNOWN_MEMBER_ID", False, "The group member is not known."),
    (26, "INVALID_SESSION_TIMEOUT", False, "The session timeout is outside the allowed range."),
    (27, "REBALANCE_IN_PROGRESS", False, "The group is rebalancing."),
    (28, "INVALID_COMMIT_OFFSET_SIZE", False, "The commit request is too large."),
    (35, "UNSUPPORTED_VERSION", False, "The API version is not supported."),
    (36, "TOPIC_ALREADY_EXISTS", False, "The topic already exists."),
    (37, "INVALID_PARTITIONS", False, "The number of partitions is invalid."),
    (38, "INVALID_REPLICATION_FACTOR", False, "The replication factor is invalid."),
    (39, "INVALID_REPLICA_ASSIGNMENT", False, "The replica assignment is invalid."),
    (40, "INVALID_CONFIG", False, "The configuration is invalid."),
    (41, "NOT_CONTROLLER", True, "This node is not the active controller."),
    (42, "INVALID_REQUEST", False, "The request is malformed."),
    (44, "POLICY_VIOLATION", False, "The request breaks a configured limit or policy."),
    (55, "OPERATION_NOT_ATTEMPTED", False, "The server did not attempt the operation."),
    (56, "KAFKA_STORAGE_ERROR", True, "The disk holding the log failed."),
    (68, "NON_EMPTY_GROUP", False, "The group still has members."),
    (69, "GROUP_ID_NOT_FOUND", False, "The group does not exist."),
    (70, "FETCH_SESSION_ID_NOT_FOUND", True, "The fetch session is not in the broker's cache."),
    (71, "INVALID_FETCH_SESSION_EPOCH", True, "The fetch session epoch is not the expected one."),
    (74, "FENCED_LEADER_EPOCH", True, "The request's leader epoch is older than the broker's."),
    (75, "UNKNOWN_LEADER_EPOCH", True, "The request's leader epoch is newer than the broker's."),
    (77, "STALE_BROKER_EPOCH", False, "The broker epoch is not current."),
    (78, "OFFSET_NOT_AVAILABLE", True, "The leader's high watermark has not caught up yet."),
    (79, "MEMBER_ID_REQUIRED", False, "The member must rejoin with a member id."),
    (80, "PREFERRED_LEADER_NOT_AVAILABLE", True, "The preferred leader is not live and in sync."),
    (81, "GROUP_MAX_SIZE_REACHED", False, "The group has reached its maximum size."),
    (82, "FENCED_INSTANCE_ID", False, "Another member took this static instance id."),
    (83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", True, "No in-sync replica is alive to lead."),
    (84, "ELECTION_NOT_NEEDED", False, "The partition already has the wanted leader."),
    (85, "NO_REASSIGNMENT_IN_PROGRESS", False, "No reassignment is in progress to cancel."),
    (86, "GROUP_SUBSCRIBED_TO_TOPIC", False, "The group is subscribed to the topic."),
    (87, "INVALID_RECORD", False, "A batch or record failed the leader's validation."),
    (88, "UNSTABLE_OFFSET_COMMIT", True, "A pending transactional commit holds the offsets."),
    (89, "THROTTLING_QUOTA_EXCEEDED", True, "A quota was exceeded."),
    (95, "INVALID_UPDATE_VERSION", False, "The partition epoch in the request is not current."),
    (100, "UNKNOWN_TOPIC_ID", True, "This server does not know the topic id."),
    (102, "BROKER_ID_NOT_REGISTERED", False, "The broker id is not registered."),
    (103, "INCONSISTENT_TOPIC_ID", True, "The topic id does not match the replica's."),
    (104, "INCONSISTENT_CLUSTER_ID", False, "The cluster id does not match."),
    (107, "INELIGIBLE_REPLICA", False, "A new ISR member is not a live, unfenced replica."),
    (108, "NEW_LEADER_ELECTED", False, "The ISR was updated but the leader has changed."),
    (109, "OFFSET_MOVED_TO_TIERED_STORAGE", False, "The offset is only in remote storage."),
    (110, "FENCED_MEMBER_EPOCH", False, "The member epoch is fenced: rejoin with epoch 0."),
    (111, "UNRELEASED_INSTANCE_ID", False, "The static instance id is still held by a member."),
    (112, "UNSUPPORTED_ASSIGNOR", False, "The group does not support this server assignor."),
    (113, "STALE_MEMBER_EPOCH", False, "The member epoch is older than the current one."),
    (1000, "DUPLICATE_BROKER_REGISTRATION", False, "Another live broker holds this id."),
    (1001, "TOO_MANY_CONNECTIONS", True, "The server has reached its connection limit."),
]

ERRORS_BY_CODE: dict[int, ErrorCode] = {c: ErrorCode(c, n, r, d) for c, n, r, d in _TABLE}
ERRORS_BY_NAME: dict[str, ErrorCode] = {e.name: e for e in ERRORS_BY_CODE.values()}
UNKNOWN = ERRORS_BY_CODE[-1]
EXCEPTIONS: dict[int, type[RilletError]] = {}


def _exception_name(name: str) -> str:
    return "".join(p.capitalize() for p in name.lower().split("_")) + "Error"


for _e in ERRORS_BY_CODE.values():
    if _e.code == 0:
        continue
    EXCEPTIONS[_e.code] = type(
        _exception_name(_e.name),
        (RilletError,),
        {"code": _e.code, "retriable": _e.retriable, "__doc__": _e.description},
    )

# Names used in code; exported explicitly so static tools see them.
NONE = 0
UnknownServerError = EXCEPTIONS[-1]
OffsetOutOfRangeError = EXCEPTIONS[1]
CorruptRecordError = EXCEPTIONS[2]
CorruptMessageError = CorruptRecordError
UnknownTopicOrPartitionError = EXCEPTIONS[3]
LeaderNotAvailableError = EXCEPTIONS[5]
NotLeaderOrFollowerError = EXCEPTIONS[6]
RequestTimedOutError = EXCEPTIONS[7]
MessageTooLargeError = EXCEPTIONS[10]
NetworkError = EXCEPTIONS[13]
CoordinatorLoadInProgressError = EXCEPTIONS[14]
CoordinatorNotAvailableError = EXCEPTIONS[15]
NotCoordinatorError = EXCEPTIONS[16]
InvalidTopicError = EXCEPTIONS[17]
RecordListTooLargeError = EXCEPTIONS[18]
NotEnoughReplicasError = EXCEPTIONS[19]
NotEnoughReplicasAfterAppendError = EXCEPTIONS[20]
InvalidRequiredAcksError = EXCEPTIONS[21]
IllegalGenerationError = EXCEPTIONS[22]
UnknownMemberIdError = EXCEPTIONS[25]
RebalanceInProgressError = EXCEPTIONS[27]
UnsupportedVersionError = EXCEPTIONS[35]
TopicAlreadyExistsError = EXCEPTIONS[36]
InvalidPartitionsError = EXCEPTIONS[37]
InvalidReplicationFactorError = EXCEPTIONS[38]
InvalidReplicaAssignmentError = EXCEPTIONS[39]
InvalidConfigError = EXCEPTIONS[40]
NotControllerError = EXCEPTIONS[41]
InvalidRequestError = EXCEPTIONS[42]
PolicyViolationError = EXCEPTIONS[44]
StorageError = EXCEPTIONS[56]
NonEmptyGroupError = EXCEPTIONS[68]
GroupIdNotFoundError = EXCEPTIONS[69]
GroupMaxSizeReachedError = EXCEPTIONS[81]
FencedInstanceIdError = EXCEPTIONS[82]
GroupSubscribedToTopicError = EXCEPTIONS[86]
FencedLeaderEpochError = EXCEPTIONS[74]
UnknownLeaderEpochError = EXCEPTIONS[75]
StaleBrokerEpochError = EXCEPTIONS[77]
PreferredLeaderNotAvailableError = EXCEPTIONS[80]
EligibleLeadersNotAvailableError = EXCEPTIONS[83]
ElectionNotNeededError = EXCEPTIONS[84]
NoReassignmentInProgressError = EXCEPTIONS[85]
InvalidRecordError = EXCEPTIONS[87]
InvalidUpdateVersionError = EXCEPTIONS[95]
UnknownTopicIdError = EXCEPTIONS[100]
BrokerIdNotRegisteredError = EXCEPTIONS[102]
IneligibleReplicaError = EXCEPTIONS[107]
OffsetMovedToTieredStorageError = EXCEPTIONS[109]
FencedMemberEpochError = EXCEPTIONS[110]
UnreleasedInstanceIdError = EXCEPTIONS[111]
UnsupportedAssignorError = EXCEPTIONS[112]
StaleMemberEpochError = EXCEPTIONS[113]
DuplicateBrokerRegistrationError = EXCEPTIONS[1000]
TooManyConnectionsError = EXCEPTIONS[1001]


def code_of(name: str) -> int:
    return ERRORS_BY_NAME[name].code


def error_name(code: int) -> str:
    return ERRORS_BY_CODE.get(code, UNKNOWN).name


def is_retriable(code: int) -> bool:
    return ERRORS_BY_CODE.get(code, UNKNOWN).retriable


def error_for(code: int, message: str = "") -> RilletError:
    """The exception for a wire error code (an unknown code maps to UnknownServerError)."""
    cls = EXCEPTIONS.get(code, UnknownServerError)
    return cls(message)


def raise_for(code: int, message: str = "") -> None:
    if code != 0:
        raise error_for(code, message)
