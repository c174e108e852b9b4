"""The local cluster's embedded S3: moto's S3 server run as one more process of the
cluster (`rillet cluster up`; docs/tiered.md, "Running it locally").

``python -m rillet.tools.local_s3 --port P --data-dir D`` serves moto's S3 API on
127.0.0.1:P and, like a node, prints one JSON readiness line on stdout once it is bound
(``{"event": "listening", "listeners": {"S3": "http://127.0.0.1:P"}}``), so
LocalCluster waits for it as it waits for a node.

moto keeps objects in memory. A local cluster keeps its data across `cluster down` and
`cluster up`, and the brokers' remote segments are named in the controllers' metadata
log, so the objects must outlive the process too: a clean stop (SIGTERM, SIGINT, or the
owning `cluster up` exiting) stops serving first, then writes every object to D, and the
next start loads them back before it serves. A kill -9 loses what was not written, as a
crash of any in-memory store would.

Both go through moto's own S3 API, on a second server bound to an ephemeral loopback
port that only this process knows (moto's backend is per process, shared by both), so
nothing here depends on moto's internals.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

from rillet.client.runtime.shutdown import StopRequests

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


class _Gate:
    """WSGI middleware that can close: from then on every request is refused (503, which
    boto3 retries), and ``close`` returns once no request is inside the app, so nothing
    changes an object after it. (Stopping the server does not wait for its request
    threads, and a keep-alive connection's thread would never end on its own.)"""

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

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._active == 0)


class _Server:
    """moto's WSGI app on one port, served by a thread."""

    def __init__(self, host: str, port: int) -> None:
        from moto.moto_server.threaded_moto_server import MotoRequestHandler
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        self.gate = _Gate(DomainDispatcherApplication(create_backend_app))
        # Bound here, in the caller's thread: a port in use raises at once.
        self._server = make_server(host, port, self.gate, True, request_handler=MotoRequestHandler)
        self.port: int = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.gate.close()
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


SNAPSHOT = "snapshot"  # D/snapshot/objects.json and D/snapshot/<n>, one file per object


def dump(client: Any, data_dir: Path) -> int:
    """Write every object of every bucket (content, user metadata, content type) to
    ``data_dir``; the previous snapshot is replaced only once the new one is whole.
    Returns the number of objects written."""
    new, current, old = (data_dir / f"{SNAPSHOT}{s}" for s in (".new", "", ".old"))
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    entries: list[dict[str, Any]] = []
    buckets = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    for bucket in buckets:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                got = client.get_object(Bucket=bucket, Key=item["Key"])
                name = str(len(entries))
                (new / name).write_bytes(got["Body"].read())
                entries.append(
                    {
                        "bucket": bucket,
                        "key": item["Key"],
                        "file": name,
                        "metadata": got.get("Metadata", {}),
                        "content_type": got.get("ContentType"),
                    }
                )
    index = {"buckets": buckets, "objects": entries}
    (new / "objects.json").write_text(json.dumps(index))
    if current.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(current, old)
    os.replace(new, current)
    shutil.rmtree(old, ignore_errors=True)
    return len(entries)


def restore(client: Any, data_dir: Path) -> int:
    """Load the last whole snapshot (if any) into the server; returns the object count."""
    for name in (SNAPSHOT, f"{SNAPSHOT}.old"):  # .old: a stop died between two renames
        snapshot = data_dir / name
        if (snapshot / "objects.json").exists():
            break
    else:
        return 0
    index = json.loads((snapshot / "objects.json").read_text())
    for bucket in index["buckets"]:
        client.create_bucket(Bucket=bucket)
    for entry in index["objects"]:
        extra = {"ContentType": entry["content_type"]} if entry.get("content_type") else {}
        client.put_object(
            Bucket=entry["bucket"],
            Key=entry["key"],
            Body=(snapshot / entry["file"]).read_bytes(),
            Metadata=entry["metadata"],
            **extra,
        )
    return len(index["objects"])


async def serve(host: str, port: int, data_dir: Path) -> None:
    stops = StopRequests("s3")
    stops.install()  # SIGTERM, SIGINT, and the owner (RILLET_OWNER) exiting
    data_dir.mkdir(parents=True, exist_ok=True)
    private = await asyncio.to_thread(_Server, "127.0.0.1", 0)
    client = _client(private.url)
    restored = await asyncio.to_thread(restore, client, data_dir)
    public = await asyncio.to_thread(_Server, host, port)
    ready = {"event": "listening", "listeners": {"S3": public.url}, "restored_objects": restored}
    print(json.dumps(ready), flush=True)
    log.info("s3: serving %s (%d objects restored from %s)", public.url, restored, data_dir)
    await stops.requested.wait()
    # No request may change an object once the dump has begun: stop serving first
    # (and wait for the requests being served).
    await asyncio.to_thread(public.stop)
    written = await asyncio.to_thread(dump, client, data_dir)
    private.stop()
    log.info("s3: stopped; %d objects written to %s", written, data_dir)


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
