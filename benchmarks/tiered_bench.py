"""The remote tier against local disk, in one run on one cluster.

Starts a local cluster (1 controller, 1 broker by default) with its embedded S3 server
(moto, a real process) and the remote tier on, tuned so tiering shows within seconds:
the remote-log task every 500 ms and tiny segments. Creates two topics of the same
shape. ``tiered`` has ``remote.storage.enable=true`` and keeps little locally
(``local.retention.bytes``); ``plain`` is the baseline and keeps everything locally.
Then it produces the same records to both, waits until every closed segment of
``tiered`` is in S3 and its early segments have left local disk, and prints one JSON
object:

- ``upload``: bytes of log objects uploaded, and ``mb_per_s`` from the first object
  seen in the bucket until the copy caught up (the segment before the active one
  uploaded on every partition). Uploads run while the producer writes, so when the copy
  keeps up this rate is the produce rate: ``caught_up_after_produce_s`` says how far
  behind it was when the producer finished;
- ``remote_read`` / ``local_read``: consumer throughput of the offsets below ``tiered``'s
  local log start (served only from S3, with a cold chunk cache) and of the same offsets
  of ``plain`` (local disk, page cache warm from the produce). Both are read the same
  way, through raw Fetch requests for every partition at once (``fetch.max.bytes``
  50 MiB, 1 MiB a partition, as a Kafka consumer's defaults), so the ratio
  ``remote_vs_local_ratio`` compares the broker's two read paths and nothing else;
- ``s3_direct_read``: the ceiling the S3 server sets: the same log objects fetched
  straight from it with boto3, in ranged GETs of the chunk size on as many threads as
  the broker's remote readers (``remote.log.reader.threads``, 4), and
  ``remote_vs_s3_direct_ratio``: the broker's remote read against it (moto is a Python
  server on the same cores, so on a small machine it, not the broker, may bound the
  remote read);
- ``broker_rss_mb``: the broker's resident set after the produce, and after the remote
  read, when the chunk cache (``--cache-mb``) is full; its peak (VmHWM); the S3
  server's resident set.

    python benchmarks/tiered_bench.py --num-records 300000 --record-size 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster_bench import create_topic, perf_produce, run_started

from rillet.client.wire import errors, records
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, parse_address
from rillet.tools.local_cluster import LocalCluster

MIB = 1024 * 1024
TIERED, PLAIN = "tiered", "plain"
FETCH_MAX_BYTES = 50 * MIB  # a Kafka consumer's fetch.max.bytes
PARTITION_MAX_BYTES = MIB  # and max.partition.fetch.bytes
POLL_S = 0.2


class BenchError(Exception):
    """The run could not measure what it measures; the message says what is missing."""


def rss_mb(pid: int | None, field: str = "VmRSS") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-records", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--segment-mb", type=float, default=1.0)
    parser.add_argument("--local-segments", type=int, default=2, help="kept locally (bytes)")
    parser.add_argument("--cache-mb", type=int, default=32, help="the remote chunk cache")
    parser.add_argument("--chunk-kb", type=int, default=1024, help="the remote chunk size")
    parser.add_argument("--batch-size", type=int, default=64 * 1024)
    parser.add_argument("--timeout-s", type=float, default=300, help="for the copy to catch up")
    parser.add_argument("--data-dir", help="keep the cluster's files here (default: a temp dir)")
    args = parser.parse_args()
    overrides = {
        "remote.log.manager.task.interval.ms": 500,
        "log.retention.check.interval.ms": 500,
        "remote.fetch.chunk.cache.size.bytes": args.cache_mb * MIB,
        "remote.fetch.chunk.size.bytes": args.chunk_kb * 1024,
    }
    with tempfile.TemporaryDirectory(prefix="rillet-tiered-bench-") as tmp:
        cluster = LocalCluster(
            Path(args.data_dir or tmp),
            controllers=1,
            brokers=args.brokers,
            ephemeral_ports=True,
            overrides=overrides,
            s3=True,
        )
        try:
            result = run_started(cluster, lambda: run(cluster, args))
        except BenchError as e:
            raise SystemExit(f"tiered_bench: {e}") from None
        print(json.dumps(result, indent=2))
        if any("error" in result[k] for k in ("remote_read", "local_read")):
            raise SystemExit(1)


def run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    boot = cluster.bootstrap
    segment_bytes = int(args.segment_mb * MIB)
    shape = [f"segment.bytes={segment_bytes}", "retention.ms=-1", "retention.bytes=-1"]
    local_bytes = args.local_segments * segment_bytes
    tiered_configs = ["remote.storage.enable=true", f"local.retention.bytes={local_bytes}"]
    create_topic(boot, TIERED, args.partitions, 1, *shape, *tiered_configs)
    create_topic(boot, PLAIN, args.partitions, 1, *shape)

    watcher = TierWatcher(cluster, TIERED, args.partitions)
    watcher.start()
    started = time.monotonic()
    produce = perf_produce(boot, TIERED, args, "1")
    produced = time.monotonic()
    caught_up = watcher.wait(args.timeout_s)
    perf_produce(boot, PLAIN, args, "1")  # the baseline's records: the same count and size
    broker = cluster.brokers()[0]
    rss_after_produce = rss_mb(broker.pid)

    targets = watcher.local_starts()  # below these, partition p is only in S3
    if not any(targets.values()):
        raise BenchError(f"no segment of {TIERED} left local disk: {watcher.describe()}")
    remote = measured(lambda: asyncio.run(read_below(cluster, TIERED, targets)))
    local = measured(lambda: asyncio.run(read_below(cluster, PLAIN, targets)))
    direct = s3_direct_read(cluster, watcher.log_objects, args.chunk_kb * 1024)
    upload_s = caught_up - watcher.first_object_at  # type: ignore[operator]
    return {
        "setup": {
            "brokers": args.brokers,
            "partitions": args.partitions,
            "records": args.num_records,
            "record_size": args.record_size,
            "segment_bytes": segment_bytes,
            "local_retention_bytes": local_bytes,
            "chunk_cache_mb": args.cache_mb,
            "chunk_kb": args.chunk_kb,
            "cpus": os.cpu_count(),
        },
        "produce": {"mb_per_s": produce.get("mb_per_s"), "seconds": round(produced - started, 2)},
        "upload": {
            "segments": watcher.uploaded_segments,
            "bytes": watcher.uploaded_bytes,
            "seconds": round(upload_s, 2),
            "mb_per_s": round(watcher.uploaded_bytes / upload_s / MIB, 2),
            "caught_up_after_produce_s": round(caught_up - produced, 2),
        },
        "remote_read": remote,
        "local_read": local,
        "s3_direct_read": direct,
        "remote_vs_local_ratio": _ratio(remote, local),
        "remote_vs_s3_direct_ratio": _ratio(remote, direct),
        "broker_rss_mb": {
            "after_produce": rss_after_produce,
            "after_remote_read": rss_mb(broker.pid),
            "peak": rss_mb(broker.pid, "VmHWM"),
            "s3_server": rss_mb(cluster.s3.pid if cluster.s3 else None),
        },
    }


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if "mb_per_s" not in a or "mb_per_s" not in b:
        return None
    return round(a["mb_per_s"] / b["mb_per_s"], 3)


READER_THREADS = 4  # the broker's remote.log.reader.threads default


def s3_direct_read(cluster: LocalCluster, keys: list[str], chunk: int) -> dict[str, Any]:
    """GET ``keys`` whole from the S3 server in ranged GETs of ``chunk`` bytes on
    READER_THREADS threads: what the server can give, with no broker in between."""
    from concurrent.futures import ThreadPoolExecutor

    assert cluster.s3 is not None
    client = _s3_client(cluster.s3.endpoint, cluster.s3.region)
    bucket = cluster.s3.bucket
    ranges = []
    for key in keys:
        size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        ranges += [(key, start, min(start + chunk, size)) for start in range(0, size, chunk)]

    def get(item: tuple[str, int, int]) -> int:
        key, start, end = item
        got = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        return len(got["Body"].read())

    started = time.perf_counter()
    with ThreadPoolExecutor(READER_THREADS) as pool:
        total = sum(pool.map(get, ranges))
    seconds = time.perf_counter() - started
    return {
        "bytes": total,
        "gets": len(ranges),
        "seconds": round(seconds, 3),
        "mb_per_s": round(total / seconds / MIB, 2),
    }


def measured(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``body()``'s figures, or what stopped it: the other figures are still worth having."""
    try:
        return body()
    except BenchError as e:
        return {"error": str(e)}


class TierWatcher:
    """Polls the bucket and the brokers' log directories while the producer runs: when
    the first log object of the topic appeared, and when the copy caught up."""

    def __init__(self, cluster: LocalCluster, topic: str, partitions: int) -> None:
        assert cluster.s3 is not None
        self.cluster, self.topic, self.partitions = cluster, topic, partitions
        self.first_object_at: float | None = None
        self.caught_up_at: float | None = None
        self.uploaded_bytes = 0
        self.uploaded_segments = 0
        self.log_objects: list[str] = []  # keys of the topic's log objects, last poll
        self._manifests: dict[int, set[int]] = {}
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="tier-watcher", daemon=True)
        self._client = _s3_client(cluster.s3.endpoint, cluster.s3.region)
        self._bucket = cluster.s3.bucket

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout_s: float) -> float:
        self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join()
        if self._failure is not None:
            raise BenchError(f"watching the bucket failed: {self._failure!r}")
        if self.caught_up_at is None:
            raise BenchError(
                f"the copy of {self.topic} did not catch up within {timeout_s:.0f}s "
                f"({self.describe()}); is the remote log manager (broker/remote_log_manager.py) "
                "in this tree, and did it upload? See the broker's node.log"
            )
        return self.caught_up_at

    def describe(self) -> str:
        manifests = {p: sorted(s)[-3:] for p, s in self._manifests.items()}
        return (
            f"objects seen: {self.uploaded_segments} log objects, {self.uploaded_bytes} "
            f"bytes; newest manifest start offsets per partition {manifests}; local "
            f"segment base offsets per partition {self._local_bases()}"
        )

    def local_starts(self) -> dict[int, int]:
        """Each partition's local log start: its lowest local segment's base offset
        (on the partition's leader: the one broker, or the lowest broker holding it)."""
        return {p: bases[0] if bases else 0 for p, bases in self._local_bases().items()}

    def _local_bases(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for p in range(self.partitions):
            for broker in self.cluster.brokers():
                d = Path(self.cluster.config_for(broker)["log.dirs"]) / f"{self.topic}-{p}"
                if d.is_dir():
                    out[p] = sorted(int(f.name[:20]) for f in d.glob("*.log"))
                    break
        return out

    def _main(self) -> None:
        try:
            while not self._stop.is_set():
                self._poll()
                if self.caught_up_at is not None:
                    return
                time.sleep(POLL_S)
        except BaseException as e:  # noqa: BLE001 - reported by wait()
            self._failure = e

    def _poll(self) -> None:
        now = time.monotonic()
        manifests: dict[int, set[int]] = {}
        log_bytes = logs = 0
        log_objects = []
        try:
            items = [
                item
                for page in self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self._bucket
                )
                for item in page.get("Contents", [])
            ]
        except self._client.exceptions.NoSuchBucket:
            items = []  # the brokers create it when they first need it
        for item in items:
            parsed = _segment_key(item["Key"], self.topic)
            if parsed is None:
                continue
            partition, start, kind = parsed
            if kind == "log":
                logs += 1
                log_bytes += item["Size"]
                log_objects.append(item["Key"])
            elif kind == "manifest":
                manifests.setdefault(partition, set()).add(start)
        if logs and self.first_object_at is None:
            self.first_object_at = now
        self._manifests, self.uploaded_bytes, self.uploaded_segments = manifests, log_bytes, logs
        self.log_objects = log_objects
        bases = self._local_bases()
        # Caught up: on every partition the segment before the active one is uploaded
        # (its manifest, written last, exists), and the early ones have left local disk.
        if len(bases) == self.partitions and all(
            len(b) >= 2 and b[0] > 0 and b[-2] in manifests.get(p, ()) for p, b in bases.items()
        ):
            self.caught_up_at = now


def _s3_client(endpoint: str, region: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _segment_key(key: str, topic: str) -> tuple[int, int, str] | None:
    """(partition, start offset, "log" or "manifest") of a segment object of ``topic``
    ("{topic}-{topic_id}/{partition}/{start:020d}-{segment_id}.{kind}"), else None."""
    parts = key.split("/")
    if len(parts) < 3 or not parts[-3].startswith(f"{topic}-"):
        return None
    name, _, kind = parts[-1].rpartition(".")
    if kind not in ("log", "manifest") or not parts[-2].isdigit():
        return None
    start = name.partition("-")[0]
    return (int(parts[-2]), int(start), kind) if start.isdigit() else None


async def read_below(cluster: LocalCluster, topic: str, targets: dict[int, int]) -> dict[str, Any]:
    """Read every partition of ``topic`` from offset 0 up to its target offset through
    raw Fetch requests for all partitions at once, as a consumer would; the throughput."""
    address = cluster.broker_address(cluster.brokers()[0].node_id)
    offsets = {p: 0 for p, t in targets.items() if t > 0}
    total_bytes = total_records = fetches = 0
    async with await Connection.open(*parse_address(address), request_timeout_ms=120_000) as conn:
        started = time.perf_counter()
        while offsets:
            wanted = [
                m.FetchPartition(p, offset, -1, -1, 0, PARTITION_MAX_BYTES)
                for p, offset in sorted(offsets.items())
            ]
            request = m.FetchRequest(
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=FETCH_MAX_BYTES,
                topics=[m.FetchTopic(topic, wanted)],
            )
            response, payload = await conn.call(request, timeout_ms=120_000)
            fetches += 1
            view = memoryview(payload)
            position = 0
            for result in response.topics[0].partitions:
                data = view[position : position + result.nbytes]
                position += result.nbytes
                if result.error_code != errors.NONE:
                    raise BenchError(
                        f"fetch of {topic}-{result.partition} at offset "
                        f"{offsets[result.partition]} failed: "
                        f"{errors.error_name(result.error_code)} (remote reads, "
                        "broker/handlers fetch, in this tree?)"
                    )
                batches = list(records.iter_batches(bytes(data)))
                if not batches:
                    raise BenchError(f"{topic}-{result.partition}: empty answer at "
                                     f"{offsets[result.partition]}")  # fmt: skip
                total_bytes += result.nbytes
                offset = offsets[result.partition]
                end = batches[-1][1].next_offset
                target = targets[result.partition]
                total_records += min(end, target) - offset
                if end >= target:
                    del offsets[result.partition]
                else:
                    offsets[result.partition] = end
        seconds = time.perf_counter() - started
    return {
        "records": total_records,
        "bytes": total_bytes,
        "seconds": round(seconds, 3),
        "mb_per_s": round(total_bytes / seconds / MIB, 2),
        "records_per_s": round(total_records / seconds),
        "fetches": fetches,
    }


if __name__ == "__main__":
    main()
