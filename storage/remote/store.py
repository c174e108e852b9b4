"""The object store under the remote tier: a small blocking interface, on S3 or in memory.

Every method blocks (network I/O through boto3): callers run them in threads, never on
the event loop. Errors come out as one type, ``RemoteStorageError``, whose ``retriable``
says what a caller should do: an unreachable endpoint, a timeout, a 5xx or throttling
is worth retrying later (the data is fine, the service is not); a missing key, a refused
credential or a bad request will fail the same way again.
"""

from __future__ import annotations

import base64
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, NamedTuple, Protocol

import boto3
import botocore.config
import botocore.exceptions

# Object metadata carrying the object's whole-content CRC-32C (8 hex digits); on S3 the
# same CRC also goes as the request's own checksum, so S3 refuses a body damaged on the
# way instead of storing it.
CRC_METADATA = "rillet-crc32c"
DELETE_BATCH = 1000  # S3's DeleteObjects limit per request


class RemoteStorageError(Exception):
    """An object-store operation failed; ``retriable`` tells whether trying later helps."""

    def __init__(self, message: str, *, retriable: bool, code: str = "") -> None:
        super().__init__(message)
        self.retriable = retriable
        self.code = code  # the service's error code when it gave one (e.g. "NoSuchKey")


class ObjectInfo(NamedTuple):
    key: str  # relative to the store's prefix
    size: int
    last_modified_ms: int
    metadata: dict[str, str]  # user metadata; empty from ``list`` (S3 lists none)


# A whole object in memory, or a seekable binary file positioned at its start (a segment
# being uploaded: streamed, not loaded).
Body = bytes | bytearray | memoryview | IO[bytes]


class ObjectStore(Protocol):
    """Blocking object-store operations; keys are relative to the store's prefix."""

    def put(self, key: str, data: Body, metadata: Mapping[str, str] | None = None) -> None: ...

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) (to the object's end when ``end`` is None), one ranged GET.
        A missing key raises RemoteStorageError(retriable=False)."""
        ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def delete(self, keys: Sequence[str]) -> None:
        """Delete these keys; missing ones are fine."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""
        ...


def _body_bytes(data: Body) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    return data.read()


# -- S3 ------------------------------------------------------------------------------------

# Error codes S3 (and S3-compatible stores) answer when they are overloaded or briefly
# failing: retrying later succeeds. Everything else in the 4xx range will not.
_RETRIABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "InternalFailure",
        "503",
        "500",
        # Credentials that expired or a clock that drifted: a refresh (boto3 refreshes
        # temporary credentials itself) or NTP fixes them without anyone's help.
        "ExpiredToken",
        "ExpiredTokenException",
        "TokenRefreshRequired",
        "RequestExpired",
        "RequestTimeTooSkewed",
        # A conflicting operation on the bucket is still in progress (409).
        "OperationAborted",
    }
)
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound", "NoSuchBucket"})
_NO_BATCH_DELETE_CODES = frozenset({"MissingContentMD5", "InvalidDigest", "NotImplemented"})


def _crc_of(metadata: Mapping[str, str]) -> int | None:
    value = {k.lower(): v for k, v in metadata.items()}.get(CRC_METADATA)
    try:
        return None if value is None else int(value, 16)
    except ValueError:
        return None


def _map_error(exc: Exception, what: str) -> RemoteStorageError:
    """A boto3/botocore exception as a RemoteStorageError with the right ``retriable``."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        retriable = status >= 500 or status == 429 or code in _RETRIABLE_CODES
        return RemoteStorageError(
            f"{what}: {code or status} {error.get('Message', '')}".rstrip(),
            retriable=retriable,
            code=code,
        )
    # Connection refused or reset, DNS, timeouts, a body cut short: the service, not the
    # request, is at fault.
    transient: tuple[type[BaseException], ...] = (
        # No credentials yet, or their provider (instance metadata, SSO) failed to answer:
        # a credential chain that works again later, not a bad request.
        botocore.exceptions.NoCredentialsError,
        botocore.exceptions.CredentialRetrievalError,
        botocore.exceptions.TokenRetrievalError,
        botocore.exceptions.ConnectionError,  # refused, DNS, connect timeout
        botocore.exceptions.HTTPClientError,  # read timeout, reset, closed
        botocore.exceptions.IncompleteReadError,
        botocore.exceptions.ResponseStreamingError,
        ConnectionError,
        TimeoutError,
    )
    return RemoteStorageError(f"{what}: {exc}", retriable=isinstance(exc, transient))


class S3ObjectStore:
    """An ``ObjectStore`` on an S3 bucket (AWS, moto, MinIO, Ceph) through boto3.

    Credentials come from boto3's usual chain; against an explicit endpoint with no
    credentials anywhere (a local moto), placeholder ones are used so a fresh machine
    works. The bucket is created on the first write when ``create_bucket`` (not in the
    constructor: a broker must start while S3 is down). botocore retries throttling,
    5xx and connection errors itself (``max_attempts`` in all), with jittered backoff.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        create_bucket: bool = True,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        max_attempts: int = 4,
        max_connections: int = 32,
    ) -> None:
        self.bucket = bucket
        # A prefix names a folder: "prod" must never see "prod2/...".
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self._single_deletes = False  # the service refused DeleteObjects (see delete)
        self.endpoint_url = endpoint_url or None
        self.region = region
        self._create_bucket = create_bucket
        self._bucket_ready = not create_bucket
        self._bucket_lock = threading.Lock()
        session = boto3.session.Session()
        credentials: dict[str, str] = {}
        if self.endpoint_url is not None and session.get_credentials() is None:
            credentials = {"aws_access_key_id": "rillet", "aws_secret_access_key": "rillet"}
        config = botocore.config.Config(
            region_name=region,
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"mode": "standard", "max_attempts": max_attempts},
            max_pool_connections=max_connections,
            # Our own CRC-32C (object metadata, manifest) checks what we read back; an
            # extra SDK checksum per request is CPU the 2-core brokers can use better.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"addressing_style": "path"},  # works for moto/MinIO and AWS alike
        )
        self._s3 = session.client(
            "s3", endpoint_url=self.endpoint_url, config=config, **credentials
        )

    def __repr__(self) -> str:
        where = self.endpoint_url or "aws"
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix} at {where})"

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _map_error(exc, what) from exc
        except (ConnectionError, TimeoutError) as exc:
            raise _map_error(exc, what) from exc

    def _ensure_bucket(self) -> None:
        if self._bucket_ready:
            return
        with self._bucket_lock:
            if self._bucket_ready:
                return
            try:
                self._s3.head_bucket(Bucket=self.bucket)
            except botocore.exceptions.ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status != 404 and exc.response.get("Error", {}).get("Code") != "404":
                    raise _map_error(exc, f"head bucket {self.bucket}") from exc
                kwargs: dict[str, Any] = {"Bucket": self.bucket}
                if self.region != "us-east-1":
                    kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
                try:
                    self._s3.create_bucket(**kwargs)
                except botocore.exceptions.ClientError as create_exc:
                    code = create_exc.response.get("Error", {}).get("Code")
                    if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise _map_error(create_exc, f"create bucket {self.bucket}") from exc
                except botocore.exceptions.BotoCoreError as create_exc:
                    raise _map_error(create_exc, f"create bucket {self.bucket}") from exc
            except botocore.exceptions.BotoCoreError as exc:
                raise _map_error(exc, f"head bucket {self.bucket}") from exc
            self._bucket_ready = True

    def put(self, key: str, data: Body, metadata: Mapping[str, str] | None = None) -> None:
        self._ensure_bucket()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": data}
        if metadata:
            kwargs["Metadata"] = dict(metadata)
            crc = _crc_of(metadata)
            if crc is not None:  # S3 checks the body against it and refuses a mismatch
                kwargs["ChecksumCRC32C"] = base64.b64encode(struct.pack(">I", crc)).decode()
        try:
            self._call(f"put {key}", self._s3.put_object, **kwargs)
        except RemoteStorageError as exc:
            # The bucket went away after we made it (deleted, or a local S3 restarted
            # empty): make it again, once, rather than fail every upload from now on.
            if exc.code != "NoSuchBucket" or not self._create_bucket:
                raise
            self._bucket_ready = False
            self._ensure_bucket()
            if not isinstance(data, bytes | bytearray | memoryview):
                data.seek(0)
            self._call(f"put {key}", self._s3.put_object, **kwargs)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if end is not None and end <= start:
            return b""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        what = f"get {key} [{start}, {'' if end is None else end})"
        response = self._call(what, self._s3.get_object, **kwargs)
        try:
            return response["Body"].read()
        except (botocore.exceptions.BotoCoreError, ConnectionError, TimeoutError) as exc:
            raise _map_error(exc, what) from exc
        finally:
            response["Body"].close()

    def head(self, key: str) -> ObjectInfo | None:
        try:
            r = self._s3.head_object(Bucket=self.bucket, Key=self._key(key))
        except botocore.exceptions.ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in _MISSING_CODES:
                return None
            raise _map_error(exc, f"head {key}") from exc
        except (botocore.exceptions.BotoCoreError, ConnectionError, TimeoutError) as exc:
            raise _map_error(exc, f"head {key}") from exc
        return ObjectInfo(
            key,
            int(r["ContentLength"]),
            int(r["LastModified"].timestamp() * 1000),
            dict(r.get("Metadata", {})),
        )

    def delete(self, keys: Sequence[str]) -> None:
        keys = list(keys)
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i : i + DELETE_BATCH]
            if not self._single_deletes:
                try:
                    self._delete_batch(batch)
                    continue
                except RemoteStorageError as exc:
                    if exc.code not in _NO_BATCH_DELETE_CODES:
                        raise
                # Older MinIO and Ceph want Content-MD5 on DeleteObjects, which botocore
                # (>= 1.36) no longer sends (it sends a CRC header instead): delete one
                # key at a time there, from now on.
                self._single_deletes = True
            for key in batch:
                try:
                    self._call(
                        f"delete {key}",
                        self._s3.delete_object,
                        Bucket=self.bucket,
                        Key=self._key(key),
                    )
                except RemoteStorageError as exc:
                    if exc.code not in _MISSING_CODES:
                        raise

    def _delete_batch(self, keys: Sequence[str]) -> None:
        objects = [{"Key": self._key(k)} for k in keys]
        r = self._call(
            f"delete {keys[0]}..",
            self._s3.delete_objects,
            Bucket=self.bucket,
            Delete={"Objects": objects, "Quiet": True},
        )
        errors = [e for e in r.get("Errors", []) if e.get("Code") not in _MISSING_CODES]
        if errors:
            first = errors[0]
            raise RemoteStorageError(
                f"delete {first.get('Key')}: {first.get('Code')} {first.get('Message', '')}",
                retriable=first.get("Code") in _RETRIABLE_CODES,
                code=str(first.get("Code", "")),
            )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self._s3.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        n = len(self.prefix)
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    yield ObjectInfo(
                        item["Key"][n:],
                        int(item["Size"]),
                        int(item["LastModified"].timestamp() * 1000),
                        {},
                    )
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchBucket":
                return  # nothing written yet
            raise _map_error(exc, f"list {prefix}") from exc
        except (botocore.exceptions.BotoCoreError, ConnectionError, TimeoutError) as exc:
            raise _map_error(exc, f"list {prefix}") from exc


def store_from_config(values: Any) -> ObjectStore | None:
    """The S3 store the broker's ``remote.log.storage.*`` keys describe (``values`` is
    the broker's Config or BrokerConfig); None when the remote tier is off."""
    if not values["remote.log.storage.system.enable"]:
        return None
    return S3ObjectStore(
        values["remote.log.storage.s3.bucket"],
        prefix=values["remote.log.storage.s3.prefix"],
        endpoint_url=values["remote.log.storage.s3.endpoint.url"] or None,
        region=values["remote.log.storage.s3.region"],
    )


# -- in memory -----------------------------------------------------------------------------


class MemoryObjectStore:
    """An ``ObjectStore`` in a dict, with S3's semantics as far as callers can see them
    (ranged reads, lower-cased metadata keys, no metadata from ``list``), for unit tests
    and the simulator. Thread-safe.

    Fault hooks: ``fail_next(n, retriable)`` fails the next ``n`` operations;
    ``unavailable`` fails every operation (retriable) while set; ``corrupt(key, pos)``
    flips a stored byte and ``truncate(key, size)`` cuts an object, both behind the
    store's back (its metadata keeps describing the original). ``ops`` counts the
    operations that reached the store, by name; ``gets`` lists every GET's
    (key, start, end).
    """

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self._objects: dict[str, tuple[bytes, int, dict[str, str]]] = {}
        self._lock = threading.Lock()
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._failures: list[bool] = []
        self.unavailable = False
        self.ops: Counter[str] = Counter()
        self.gets: list[tuple[str, int, int | None]] = []

    def fail_next(self, n: int = 1, retriable: bool = True) -> None:
        with self._lock:
            self._failures.extend([retriable] * n)

    def corrupt(self, key: str, position: int) -> None:
        with self._lock:
            data, modified, metadata = self._objects[key]
            flipped = bytearray(data)
            flipped[position] ^= 0xFF
            self._objects[key] = (bytes(flipped), modified, metadata)

    def truncate(self, key: str, size: int) -> None:
        with self._lock:
            data, modified, metadata = self._objects[key]
            self._objects[key] = (data[:size], modified, metadata)

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._objects)

    def _enter(self, op: str, key: str) -> None:
        """Count the operation and raise an injected failure; called under the lock."""
        if self.unavailable:
            raise RemoteStorageError(f"{op} {key}: store unavailable", retriable=True)
        if self._failures:
            retriable = self._failures.pop(0)
            raise RemoteStorageError(f"{op} {key}: injected failure", retriable=retriable)
        self.ops[op] += 1

    def put(self, key: str, data: Body, metadata: Mapping[str, str] | None = None) -> None:
        body = _body_bytes(data)
        with self._lock:
            self._enter("put", key)
            meta = {k.lower(): v for k, v in (metadata or {}).items()}
            self._objects[key] = (body, self._clock(), meta)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if end is not None and end <= start:
            return b""  # as S3ObjectStore: an empty range sends no request at all
        with self._lock:
            self._enter("get", key)
            self.gets.append((key, start, end))
            if key not in self._objects:
                raise RemoteStorageError(f"get {key}: NoSuchKey", retriable=False, code="NoSuchKey")
            data = self._objects[key][0]
        ranged = start > 0 or end is not None
        if ranged and start >= len(data):
            # S3 answers 416 for a range starting past the end, and for any range at
            # all on an empty object; a plain GET of an empty object is fine.
            raise RemoteStorageError(
                f"get {key}: InvalidRange {start}", retriable=False, code="InvalidRange"
            )
        return data[start:end]

    def head(self, key: str) -> ObjectInfo | None:
        with self._lock:
            self._enter("head", key)
            if key not in self._objects:
                return None
            data, modified, metadata = self._objects[key]
            return ObjectInfo(key, len(data), modified, dict(metadata))

    def delete(self, keys: Sequence[str]) -> None:
        keys = list(keys)
        for i in range(0, len(keys), DELETE_BATCH):  # one request per batch, as on S3
            batch = keys[i : i + DELETE_BATCH]
            with self._lock:
                self._enter("delete", ",".join(batch))
                for key in batch:
                    self._objects.pop(key, None)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        with self._lock:
            self._enter("list", prefix)
            found = [
                ObjectInfo(k, len(v[0]), v[1], {})
                for k, v in sorted(self._objects.items())
                if k.startswith(prefix)
            ]
        return iter(found)
