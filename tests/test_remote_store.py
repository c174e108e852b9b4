"""The remote tier's object stores: S3 (moto's server, a real process) and the in-memory
one behave alike, and every failure comes out as RemoteStorageError with ``retriable``
telling an outage from a request that can never succeed."""

from __future__ import annotations

import base64
import io
import struct
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import botocore.exceptions
import crc32c
import pytest
from s3_server import S3Endpoint, S3Server

from rillet.storage.remote.store import (
    MemoryObjectStore,
    ObjectStore,
    RemoteStorageError,
    S3ObjectStore,
    _map_error,
    store_from_config,
)


class FakeClient:
    """A stand-in for the boto3 S3 client at its method boundary: records the calls,
    and answers DeleteObjects with ``delete_objects_error`` when set."""

    def __init__(self, delete_objects_error: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.delete_objects_error = delete_objects_error

    def put_object(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("put_object", kwargs))
        return {}

    def delete_objects(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("delete_objects", kwargs))
        if self.delete_objects_error:
            raise _client_error(400, self.delete_objects_error)
        return {}

    def delete_object(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("delete_object", kwargs))
        return {}


def _fake_store(client: FakeClient, prefix: str = "p/") -> S3ObjectStore:
    store = S3ObjectStore(
        "b", prefix=prefix, endpoint_url="http://127.0.0.1:9", create_bucket=False
    )
    store._s3 = client  # type: ignore[assignment]
    return store


@dataclass
class Backend:
    """A store and its outage switch."""

    store: ObjectStore
    kind: str
    endpoint: S3Endpoint | None = None

    def outage(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
        else:
            assert isinstance(self.store, MemoryObjectStore)
            self.store.unavailable = True

    def recover(self) -> None:
        if self.endpoint is not None:
            self.endpoint.restart()
        else:
            assert isinstance(self.store, MemoryObjectStore)
            self.store.unavailable = False


@pytest.fixture(params=["s3", "memory"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        yield Backend(MemoryObjectStore(), "memory")
        return
    s3: S3Endpoint = request.getfixturevalue("s3")
    # One attempt: an outage shows at once instead of after botocore's backoff.
    store = S3ObjectStore("tier-test", prefix="cluster-a/", endpoint_url=s3.url, max_attempts=1)
    yield Backend(store, "s3", s3)


def test_put_then_get_whole_and_ranges(backend: Backend) -> None:
    store = backend.store
    data = bytes(range(256)) * 40
    store.put("t-x/0/a.log", data, {"rillet-crc32c": "0badcafe"})
    assert store.get("t-x/0/a.log") == data
    assert store.get("t-x/0/a.log", 100, 1100) == data[100:1100]
    assert store.get("t-x/0/a.log", 5000) == data[5000:]
    assert store.get("t-x/0/a.log", 10_000, 20_000) == data[10_000:]  # cut at the end
    assert store.get("t-x/0/a.log", 7, 7) == b""


def test_put_streams_a_file_body(backend: Backend) -> None:
    data = b"segment bytes " * 5000
    backend.store.put("k", io.BytesIO(data))
    assert backend.store.get("k") == data


def test_put_replaces_the_whole_object(backend: Backend) -> None:
    backend.store.put("k", b"first version, longer")
    backend.store.put("k", b"second")
    assert backend.store.get("k") == b"second"


def test_head_gives_size_and_lowercased_metadata(backend: Backend) -> None:
    backend.store.put("a", b"12345", {"Rillet-CRC32C": "00000001"})
    info = backend.store.head("a")
    assert info is not None
    assert (info.key, info.size, info.metadata) == ("a", 5, {"rillet-crc32c": "00000001"})
    assert info.last_modified_ms > 0
    assert backend.store.head("missing") is None


def test_list_by_prefix_in_key_order(backend: Backend) -> None:
    store = backend.store
    for key in ("t-1/0/00000000000000000010-b.log", "t-1/0/00000000000000000000-a.log",
                "t-1/1/00000000000000000000-c.log", "t-2/0/x.log"):  # fmt: skip
        store.put(key, key.encode(), {"m": "v"})
    listed = list(store.list("t-1/0/"))
    assert [i.key for i in listed] == [
        "t-1/0/00000000000000000000-a.log",
        "t-1/0/00000000000000000010-b.log",
    ]
    assert [i.size for i in listed] == [len(i.key) for i in listed]
    assert all(i.metadata == {} for i in listed)  # as S3: list carries no user metadata
    assert len(list(store.list(""))) == 4
    assert list(store.list("nothing/")) == []


def test_delete_tolerates_missing_keys(backend: Backend) -> None:
    store = backend.store
    store.put("a", b"1")
    store.put("b", b"2")
    store.delete(["a", "never-existed"])
    store.delete([])
    assert store.head("a") is None
    assert store.get("b") == b"2"


def test_missing_key_and_bad_range_are_not_retriable(backend: Backend) -> None:
    backend.store.put("short", b"abc")
    with pytest.raises(RemoteStorageError) as missing:
        backend.store.get("no/such/key")
    assert missing.value.retriable is False
    assert missing.value.code == "NoSuchKey"
    assert "no/such/key" in str(missing.value)
    with pytest.raises(RemoteStorageError) as bad_range:
        backend.store.get("short", 10)
    assert bad_range.value.retriable is False


def test_an_outage_is_retriable_and_the_data_outlives_it(backend: Backend) -> None:
    store = backend.store
    store.put("kept", b"before the outage")
    backend.outage()
    calls: list[Any] = [
        lambda: store.get("kept"),
        lambda: store.get("kept", 1, 5),
        lambda: store.put("new", b"x"),
        lambda: store.head("kept"),
        lambda: list(store.list("")),
        lambda: store.delete(["kept"]),
    ]
    for call in calls:
        with pytest.raises(RemoteStorageError) as down:
            call()
        assert down.value.retriable is True
    backend.recover()
    assert store.get("kept") == b"before the outage"


def test_s3_keys_live_under_the_store_prefix(s3: S3Endpoint) -> None:
    prefixed = S3ObjectStore("tier-test", prefix="cluster-a/", endpoint_url=s3.url)
    whole = S3ObjectStore("tier-test", endpoint_url=s3.url)
    prefixed.put("t-1/0/x.log", b"data")
    assert [i.key for i in whole.list("")] == ["cluster-a/t-1/0/x.log"]
    assert [i.key for i in prefixed.list("")] == ["t-1/0/x.log"]
    assert whole.get("cluster-a/t-1/0/x.log") == b"data"


def test_s3_reads_before_the_bucket_exists(s3: S3Endpoint) -> None:
    store = S3ObjectStore("not-yet-created", endpoint_url=s3.url)
    assert store.head("a") is None
    assert list(store.list("")) == []
    store.put("a", b"1")  # creates the bucket
    assert store.get("a") == b"1"


def test_s3_store_starts_while_s3_is_down(s3: S3Endpoint) -> None:
    s3.stop()
    store = S3ObjectStore("late-bucket", endpoint_url=s3.url, max_attempts=1)
    with pytest.raises(RemoteStorageError) as down:
        store.put("a", b"1")
    assert down.value.retriable
    s3.restart()
    store.put("a", b"1")  # the bucket is made once S3 is back
    assert store.get("a") == b"1"


def _client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "GetObject")


@pytest.mark.parametrize(
    ("exc", "retriable"),
    [
        (_client_error(503, "SlowDown"), True),
        (_client_error(500, "InternalError"), True),
        (_client_error(429, "TooManyRequests"), True),
        (_client_error(400, "RequestTimeout"), True),
        (_client_error(400, "ThrottlingException"), True),
        (_client_error(404, "NoSuchKey"), False),
        (_client_error(403, "AccessDenied"), False),
        (_client_error(400, "InvalidRequest"), False),
        (_client_error(416, "InvalidRange"), False),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), True),
        (botocore.exceptions.ConnectTimeoutError(endpoint_url="http://x"), True),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), True),
        (botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"), True),
        # Credentials missing for now, their provider failing, expired or refused for
        # a clock skew: boto3's chain (or NTP) recovers, so a later try works.
        (botocore.exceptions.NoCredentialsError(), True),
        (botocore.exceptions.CredentialRetrievalError(provider="iam-role", error_msg="t"), True),
        (_client_error(400, "ExpiredToken"), True),
        (_client_error(403, "RequestTimeTooSkewed"), True),
        (_client_error(409, "OperationAborted"), True),
        (_client_error(503, "SlowDown"), True),
        (_client_error(400, "RequestLimitExceeded"), True),
        (_client_error(403, "InvalidAccessKeyId"), False),
        (_client_error(400, "BucketAlreadyExists"), False),
    ],
)
def test_error_mapping(exc: Exception, retriable: bool) -> None:
    mapped = _map_error(exc, "get k")
    assert mapped.retriable is retriable
    assert str(mapped).startswith("get k: ")


def test_store_from_config() -> None:
    off = {"remote.log.storage.system.enable": False}
    assert store_from_config(off) is None
    on = {
        "remote.log.storage.system.enable": True,
        "remote.log.storage.s3.bucket": "b-tier",
        "remote.log.storage.s3.prefix": "prod/",
        "remote.log.storage.s3.endpoint.url": "http://127.0.0.1:1",
        "remote.log.storage.s3.region": "eu-west-1",
    }
    store = store_from_config(on)
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix, store.endpoint_url, store.region) == (
        "b-tier",
        "prod/",
        "http://127.0.0.1:1",
        "eu-west-1",
    )
    on["remote.log.storage.s3.endpoint.url"] = ""
    aws = store_from_config(on)
    assert isinstance(aws, S3ObjectStore) and aws.endpoint_url is None


def test_memory_fault_hooks() -> None:
    store = MemoryObjectStore()
    store.put("k", b"abcdef")
    store.fail_next(2)
    for _ in range(2):
        with pytest.raises(RemoteStorageError) as failed:
            store.get("k")
        assert failed.value.retriable
    assert store.get("k") == b"abcdef"
    store.fail_next(1, retriable=False)
    with pytest.raises(RemoteStorageError) as fatal:
        store.head("k")
    assert not fatal.value.retriable
    store.corrupt("k", 1)
    assert store.get("k") == b"a\x9dcdef"
    store.truncate("k", 3)
    assert store.get("k") == b"a\x9dc"
    info = store.head("k")
    assert info is not None and info.size == 3
    assert store.ops["get"] == 3 and store.gets[-1] == ("k", 0, None)


def test_a_stopped_server_process_is_retriable_and_restarts_on_its_port(tmp_path) -> None:
    from s3_server import moto_server

    with moto_server(tmp_path / "moto.log") as server:
        store = S3ObjectStore("restart-test", endpoint_url=server.url, max_attempts=1)
        store.put("a", b"1")
        url = server.url
        server.stop()
        assert not server.running
        with pytest.raises(RemoteStorageError) as down:
            store.get("a")
        assert down.value.retriable is True
        server.start()
        assert server.url == url
        assert store.head("a") is None  # moto keeps objects in memory: a restart loses them
        store.put("b", b"2")  # the bucket went with the objects: the store makes it again
        assert store.get("b") == b"2"
    assert not server.running


def test_delete_falls_back_to_one_key_at_a_time_without_content_md5() -> None:
    """Older MinIO/Ceph refuse DeleteObjects without Content-MD5 (which botocore >= 1.36
    no longer sends): the store deletes key by key there, and keeps doing so."""
    client = FakeClient(delete_objects_error="MissingContentMD5")
    store = _fake_store(client)
    store.delete(["a", "b"])
    assert [c[0] for c in client.calls] == ["delete_objects", "delete_object", "delete_object"]
    assert [c[1]["Key"] for c in client.calls[1:]] == ["p/a", "p/b"]
    client.calls.clear()
    store.delete(["c"])
    assert client.calls == [("delete_object", {"Bucket": "b", "Key": "p/c"})]


def test_delete_objects_other_errors_are_not_swallowed() -> None:
    store = _fake_store(FakeClient(delete_objects_error="AccessDenied"))
    with pytest.raises(RemoteStorageError) as caught:
        store.delete(["a"])
    assert caught.value.code == "AccessDenied"


def test_delete_splits_into_requests_of_1000_keys() -> None:
    client = FakeClient()
    _fake_store(client).delete([f"k{i}" for i in range(2500)])
    sizes = [len(c[1]["Delete"]["Objects"]) for c in client.calls]
    assert sizes == [1000, 1000, 500]


def test_put_sends_the_crc32c_as_the_request_checksum() -> None:
    """S3 checks the body against x-amz-checksum-crc32c and refuses a damaged one."""
    client = FakeClient()
    data = b"segment bytes"
    _fake_store(client).put("k.log", data, {"rillet-crc32c": f"{crc32c.crc32c(data):08x}"})
    [(_, kwargs)] = client.calls
    assert base64.b64decode(kwargs["ChecksumCRC32C"]) == struct.pack(">I", crc32c.crc32c(data))
    client.calls.clear()
    _fake_store(client).put("other", data)
    assert "ChecksumCRC32C" not in client.calls[0][1]


def test_a_prefix_is_a_folder() -> None:
    assert _fake_store(FakeClient(), prefix="prod").prefix == "prod/"
    assert _fake_store(FakeClient(), prefix="prod/").prefix == "prod/"
    assert _fake_store(FakeClient(), prefix="").prefix == ""


def test_prefix_never_lists_a_sibling_folder(s3: S3Endpoint) -> None:
    S3ObjectStore("tier-test", prefix="prod2/", endpoint_url=s3.url).put("x", b"other")
    prod = S3ObjectStore("tier-test", prefix="prod", endpoint_url=s3.url)
    prod.put("y", b"mine")
    assert [i.key for i in prod.list("")] == ["y"]
    assert S3ObjectStore("tier-test", endpoint_url=s3.url).get("prod/y") == b"mine"


def test_list_and_delete_more_than_a_page(s3: S3Endpoint) -> None:
    """Listings page at 1000 keys and DeleteObjects takes at most 1000: both split."""
    store = S3ObjectStore("tier-test", prefix="many/", endpoint_url=s3.url)
    keys = [f"k{i:05d}" for i in range(1005)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, b""), keys))
    assert [i.key for i in store.list("")] == keys
    store.delete(keys)
    assert list(store.list("")) == []


def test_memory_store_behaves_as_s3_at_the_edges() -> None:
    store = MemoryObjectStore()
    assert store.get("missing", 5, 5) == b""  # an empty range sends nothing, as on S3
    store.put("empty", b"")
    assert store.get("empty") == b""
    with pytest.raises(RemoteStorageError) as caught:
        store.get("empty", 0, 10)  # S3: 416 for any range of an empty object
    assert caught.value.code == "InvalidRange"
    store.put("x", b"1")
    store.fail_next(2)
    with pytest.raises(RemoteStorageError):
        store.delete([f"k{i}" for i in range(1500)])  # two requests: both fail
    with pytest.raises(RemoteStorageError):
        store.delete(["x"])
    store.delete(["x"])
    assert store.keys() == ["empty"]


def test_a_server_that_never_prints_its_port_fails_the_fixture_in_time() -> None:
    """A moto that hangs before its start-up line must fail the fixture, not block
    the whole run on a pipe's readline."""
    silent = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], stderr=subprocess.PIPE
    )
    try:
        with pytest.raises(RuntimeError, match="no port line"):
            S3Server()._read_port(silent, timeout_s=0.1)
    finally:
        silent.kill()
        silent.wait()
