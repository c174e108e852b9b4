"""The local cluster's embedded S3: moto's S3 server run as one more process of the
cluster (`rillet cluster up`; docs/tiered.md, "Running it locally").

``python -m rillet.tools.local_s3 --port P --data-dir D`` serves moto's S3 API on
127.0.0.1:P and, like a node, prints one JSON readiness line on stdout once it is bound
(``{"event": "listening", "listeners": {"S3": "http://127.0.0.1:P"}}``), so
LocalCluster waits for it as it waits for a node.

moto keeps objects in memory. A local cluster keeps its data across `cluster down` and
`cluster up`, and the brokers' remote segments are named in the controllers' metadata
log, so the objects must outlive the process too, crashes included: a broker deletes
its local copy of a segment once S3 has answered the upload. So every change is written
through to D before it is answered (``Store``: one file per object, fsynced and renamed
into place: storage/checkpoints.py's ``replace_file``), and the next start loads D back
before it serves. A kill -9 loses only changes that were never answered, which their
clients retry.

Reading what a request changed goes through moto's own S3 API, on a second server bound
to an ephemeral loopback port that only this process knows (moto's backend is per
process, shared by both), so nothing here depends on moto's internals. Clients must
address buckets path-style (``http://host:port/bucket/key``), as the brokers' store
does (storage/remote/store.py) and boto3 does for an IP endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import io
import json
import logging
import shutil
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from rillet.client.runtime.shutdown import StopRequests, exit_process
from rillet.storage.checkpoints import replace_file
from rillet.storage.fs import fsync_dir

log = logging.getLogger("rillet.s3")

MODULE = "rillet.tools.local_s3"
CREDENTIALS = {
    # moto accepts any credentials; these keep boto3 from looking for real ones.
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}
# Would take precedence over the keys above in boto3's chain (a named profile wins over
# the environment's keys), or add a session token moto does not need.
MASKED_ENV = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
INSTALL_HINT = "pip install 'rillet[s3]' (or `make install`, whose dev extra has it)"


def moto_server_available() -> bool:
    """Whether moto's S3 server can run here (the ``s3`` extra: moto with its server's
    Flask dependencies), without importing it (a second or more)."""
    return all(importlib.util.find_spec(name) is not None for name in ("moto", "flask"))


def embedded_env(region: str) -> dict[str, str]:
    """The environment changes that point boto3 at the embedded server's credentials."""
    return {**CREDENTIALS, "AWS_DEFAULT_REGION": region}


def command(python: str, port: int, data_dir: Path) -> list[str]:
    return [python, "-m", MODULE, "--port", str(port), "--data-dir", str(data_dir)]


# --- the process -------------------------------------------------------------------


# How long a stop waits for the requests being served: a client stalling its request
# body would otherwise hold the stop (and `cluster down`) until it gives up.
CLOSE_TIMEOUT_S = 10.0


class _Gate:
    """WSGI middleware that can close: from then on every request is refused (503, which
    boto3 retries), and ``close`` returns once no request is inside the app (or its
    bound passed), so nothing changes an object after it. (Stopping the server does not
    wait for its request threads, and a keep-alive connection's thread would never end
    on its own.)"""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._active = 0
        self._closed = False
        self._cond = threading.Condition()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        with self._cond:
            if self._closed:
                start_response("503 Service Unavailable", [("Connection", "close")])
                return [b""]
            self._active += 1
        try:
            return list(self.app(environ, start_response))  # the whole answer, counted
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Refuse from now on; wait up to ``timeout_s`` for the requests inside the app.
        False when some were still inside: never answered, so no client counts on them."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._active == 0, timeout=timeout_s)


class _Server:
    """moto's WSGI app on one port, served by a thread."""

    def __init__(self, host: str, port: int, store: Store | None = None) -> None:
        from moto.moto_server.threaded_moto_server import MotoRequestHandler
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        app: Any = DomainDispatcherApplication(create_backend_app)
        self.gate = _Gate(app if store is None else _WriteThrough(app, store))
        # Bound here, in the caller's thread: a port in use raises at once.
        self._server = make_server(host, port, self.gate, True, request_handler=MotoRequestHandler)
        self.port: int = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if not self.gate.close():
            log.warning("s3: stopping with requests still inside after %.0fs", CLOSE_TIMEOUT_S)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _client(url: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


OBJECTS = "objects"  # D/objects/<sha-256 of bucket and key>: a JSON line, then the content
BUCKETS = "buckets.json"
KEY_LOCKS = 64
# D/snapshot/objects.json and D/snapshot/<n>: what earlier versions wrote at a clean
# stop; loaded once into the store, then removed.
LEGACY_SNAPSHOTS = ("snapshot", "snapshot.old")


class Store:
    """The server's buckets and objects on disk, each change written through (file
    fsynced, renamed into place, directory fsynced) before its request is answered.
    ``client`` reads moto's state (the private server): what is written is what moto
    holds after the change, whatever the request looked like on the wire."""

    def __init__(self, data_dir: Path, client: Any) -> None:
        self.data_dir = data_dir
        self.dir = data_dir / OBJECTS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.client = client
        # Reading a key's state from moto and writing it is one step: two changes of one
        # key racing must leave the later state on disk, not the one read first. Keys
        # spread over several locks, so uploads of different segments write at once.
        self._key_locks = [threading.Lock() for _ in range(KEY_LOCKS)]
        self._buckets_lock = threading.Lock()

    def _path(self, bucket: str, key: str) -> Path:
        name = hashlib.sha256(f"{bucket}\0{key}".encode()).hexdigest()
        return self.dir / name

    def sync(self, bucket: str, key: str) -> None:
        """Write the object as moto now holds it, or remove it when moto has none."""
        with self._key_locks[hash((bucket, key)) % KEY_LOCKS]:
            self._sync(bucket, key)

    def _sync(self, bucket: str, key: str) -> None:
        from botocore.exceptions import ClientError

        try:
            got = self.client.get_object(Bucket=bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("NoSuchKey", "NoSuchBucket"):
                raise
            path = self._path(bucket, key)
            if path.exists():
                path.unlink()
                fsync_dir(self.dir)
            return
        entry = {
            "bucket": bucket,
            "key": key,
            "metadata": got.get("Metadata", {}),
            "content_type": got.get("ContentType"),
        }
        head = json.dumps(entry).encode() + b"\n"
        replace_file(self._path(bucket, key), head + got["Body"].read(), fsync=True)

    def sync_buckets(self) -> None:
        with self._buckets_lock:
            names = [b["Name"] for b in self.client.list_buckets().get("Buckets", [])]
            replace_file(self.data_dir / BUCKETS, json.dumps(names).encode(), fsync=True)

    def load(self) -> int:
        """Put everything on disk into moto (before serving); returns the object count.
        A snapshot of an earlier version is taken into the store first."""
        self._take_legacy_snapshot()
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink()
        path = self.data_dir / BUCKETS
        buckets = json.loads(path.read_text()) if path.exists() else []
        for bucket in buckets:
            self.client.create_bucket(Bucket=bucket)
        count = 0
        for entry, body in stored_objects(self.data_dir):
            if entry["bucket"] not in buckets:  # its bucket's record was lost: recreate
                buckets.append(entry["bucket"])
                self.client.create_bucket(Bucket=entry["bucket"])
            _put(self.client, entry, body)
            count += 1
        return count

    def _take_legacy_snapshot(self) -> None:
        for name in LEGACY_SNAPSHOTS:
            snapshot = self.data_dir / name
            if (snapshot / "objects.json").exists():
                index = json.loads((snapshot / "objects.json").read_text())
                for bucket in index["buckets"]:
                    self.client.create_bucket(Bucket=bucket)
                for entry in index["objects"]:
                    _put(self.client, entry, (snapshot / entry["file"]).read_bytes())
                    self.sync(entry["bucket"], entry["key"])
                self.sync_buckets()
                break
        for name in LEGACY_SNAPSHOTS:
            shutil.rmtree(self.data_dir / name, ignore_errors=True)


def stored_objects(data_dir: Path) -> Iterator[tuple[dict[str, Any], bytes]]:
    """What the store in ``data_dir`` holds: (bucket, key, metadata, content type) and
    the content of each object."""
    objects = data_dir / OBJECTS
    for path in sorted(objects.iterdir()) if objects.exists() else []:
        if path.name.endswith(".tmp"):  # a write that never finished: never answered
            continue
        head, _, body = path.read_bytes().partition(b"\n")
        yield json.loads(head), body


def _put(client: Any, entry: dict[str, Any], body: bytes) -> None:
    extra = {"ContentType": entry["content_type"]} if entry.get("content_type") else {}
    client.put_object(
        Bucket=entry["bucket"], Key=entry["key"], Body=body, Metadata=entry["metadata"], **extra
    )


class _WriteThrough:
    """WSGI middleware: a request that changed a bucket or an object, once moto has
    answered it with success, writes the change to the store before the answer goes out.
    If that write fails the client gets a 500 (retriable) instead of the answer."""

    def __init__(self, app: Any, store: Store) -> None:
        self.app = app
        self.store = store

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        method = environ.get("REQUEST_METHOD", "")
        if method not in ("PUT", "POST", "DELETE"):
            return self.app(environ, start_response)
        # WSGI gives the path percent-decoded, its bytes as latin-1 characters.
        raw = environ.get("PATH_INFO", "").encode("latin-1", "replace")
        bucket, _, key = raw.decode("utf-8", "replace").lstrip("/").partition("/")
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        keys: list[str] = []  # objects whose state is written once moto succeeded
        buckets = False  # the bucket list too
        if bucket and not key:
            if method == "POST" and "delete" in query:  # DeleteObjects: keys in the body
                keys = _keys_to_delete(_read_body(environ))
            else:
                buckets = method in ("PUT", "DELETE")
        elif bucket and (method == "POST") == ("uploadId" in query):
            # Multipart: parts (PUT) and aborts (DELETE) change no object; the completion
            # (POST with uploadId) does, the initiation (POST ?uploads) does not.
            keys = [key]
        if not keys and not buckets:
            return self.app(environ, start_response)
        statuses: list[str] = []

        def record(status: str, headers: Any, exc_info: Any = None) -> Any:
            statuses.append(status)
            return start_response(status, headers, exc_info)

        answer = list(self.app(environ, record))
        if statuses and statuses[-1].startswith("2"):
            if buckets:
                self.store.sync_buckets()
            for k in keys:
                self.store.sync(bucket, k)
        return answer


def _read_body(environ: dict[str, Any]) -> bytes:
    """The request body, read whole; the app then reads it from memory."""
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    body = stream.read(int(length)) if length else stream.read()
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    return body


def _keys_to_delete(body: bytes) -> list[str]:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return []  # moto refuses it too
    return [k.text or "" for k in root.findall("{*}Object/{*}Key")]  # with a namespace or none


async def serve(host: str, port: int, data_dir: Path) -> None:
    stops = StopRequests("s3")
    stops.install()  # SIGTERM, SIGINT, and the owner (RILLET_OWNER) exiting
    data_dir.mkdir(parents=True, exist_ok=True)
    private = await asyncio.to_thread(_Server, "127.0.0.1", 0)
    store = Store(data_dir, _client(private.url))
    restored = await asyncio.to_thread(store.load)
    public = await asyncio.to_thread(_Server, host, port, store)
    ready = {"event": "listening", "listeners": {"S3": public.url}, "restored_objects": restored}
    print(json.dumps(ready), flush=True)
    log.info("s3: serving %s (%d objects restored from %s)", public.url, restored, data_dir)
    await stops.requested.wait()
    # Every answered change is on disk already; stopping only has to stop serving.
    await asyncio.to_thread(public.stop)
    private.stop()
    log.info("s3: stopped; its objects are in %s", store.dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=MODULE, description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    # One line per request would make the log the busiest file of a benchmark run.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if not moto_server_available():
        print(f"moto's S3 server is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    asyncio.run(serve(args.host, args.port, args.data_dir))
    # A request thread still stuck inside moto (past the stop's bound) was never
    # answered: nothing it holds needs saving, and it must not hold the exit.
    exit_process(0)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
