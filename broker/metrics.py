"""Broker metrics, kept in memory as prometheus-client types in the broker's own registry
(so two brokers in one process, as in tests or combined mode, never share counters).
The node serves them at ``/metrics`` (client/runtime/metrics_http.py) beside the same
events under Kafka's names (broker/kafka_metrics.py); ``snapshot()`` gives these as a dict.

What is counted, all per batch or per request, never per record:

- bytes in / out, messages in: counters; ``snapshot()`` turns them into per-second rates
  over the last ``RATE_WINDOW_S`` seconds from samples ``sample()`` takes each second;
- request latency per API: a histogram from handler start to handler return (queueing
  behind earlier requests on the connection and the socket write are not in it);
- request handler idle percent: 100 * (1 - process CPU seconds / wall seconds) over the
  window. One event loop runs every handler, so the process's CPU share is how busy the
  handlers are (executor threads doing fsyncs count as busy too, which errs safe);
- under-replicated partitions: led partitions whose ISR is smaller than their replica
  set, read from the replica manager when sampled;
- failed partitions: followed partitions the fetcher stopped fetching after an
  unexpected error (docs/broker.md, "Faults"), read from the fetcher manager;
- the remote tier's writes (KIP-958's names where they fit; broker/remote_log_manager.py):
  copy bytes, copy requests (segments copied), copy errors, delete requests (segments
  or topic prefixes deleted) and errors: counters; copy lag in segments and bytes
  (closed, committed, not yet remote) and remote log size over the partitions this
  broker leads: gauges the remote log manager sets at each of its passes;
- event-loop lag: the largest lag and a histogram from the broker's `LoopLagMonitor`
  (how long some callback held the loop; docs/design.md, "Event-loop stalls");
- remote fetches (KIP-405/KIP-958's RemoteFetchBytesPerSec, RemoteFetchRequestsPerSec,
  RemoteFetchErrorsPerSec): counters of bytes read from the remote tier for fetches,
  partition reads sent there, and those that answered an error (broker/remote_fetch.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rillet.broker.kafka_metrics import KafkaBrokerStats
from rillet.client.runtime.looplag import LoopLagMonitor

RATE_WINDOW_S = 10.0
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class BrokerMetrics:
    def __init__(
        self,
        under_replicated: Callable[[], int] = lambda: 0,
        failed_partitions: Callable[[], int] = lambda: 0,
        loop_lag: LoopLagMonitor | None = None,
    ) -> None:
        self.loop_lag = loop_lag
        # The same events under Kafka's names, per topic (broker/kafka_metrics.py).
        self.kafka = KafkaBrokerStats()
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.bytes_in = Counter("rillet_broker_bytes_in", "Produced bytes appended", registry=r)
        self.bytes_out = Counter("rillet_broker_bytes_out", "Fetched bytes sent", registry=r)
        self.messages_in = Counter("rillet_broker_messages_in", "Records appended", registry=r)
        self.latency = Histogram(
            "rillet_broker_request_latency_seconds",
            "Handler time per request",
            ["api"],
            registry=r,
            buckets=LATENCY_BUCKETS_S,
        )
        self.under_replicated = Gauge(
            "rillet_broker_under_replicated_partitions",
            "Led partitions with ISR < replicas",
            registry=r,
        )
        self.under_replicated.set_function(lambda: float(under_replicated()))
        self.failed_partitions = Gauge(
            "rillet_broker_failed_partitions",
            "Followed partitions not fetched after an error",
            registry=r,
        )
        self.failed_partitions.set_function(lambda: float(failed_partitions()))
        self.loop_lag_max = Gauge(
            "rillet_broker_event_loop_lag_max_ms",
            "Largest event-loop lag since start",
            registry=r,
        )
        self.loop_lag_max.set_function(lambda: loop_lag.max_lag_ms if loop_lag else 0.0)
        self.idle = Gauge(
            "rillet_broker_request_handler_idle_percent",
            "100 * (1 - CPU share of the process)",
            registry=r,
        )
        self.remote_counters = {
            name: Counter(f"rillet_broker_{name}", doc, registry=r)
            for name, doc in (
                ("remote_copy_bytes", "Bytes of segments copied to remote storage"),
                ("remote_copy_requests", "Segments copied to remote storage"),
                ("remote_copy_errors", "Failed remote segment uploads (tries)"),
                ("remote_delete_requests", "Remote segments or topic prefixes deleted"),
                ("remote_delete_errors", "Failed remote deletes (tries)"),
                ("remote_fetch_bytes", "Bytes read from the remote tier for fetches"),
                ("remote_fetch_requests", "Partition reads served from the remote tier"),
                ("remote_fetch_errors", "Remote partition reads that answered an error"),
            )
        }
        self.remote_gauges = {
            name: Gauge(f"rillet_broker_{name}", doc, registry=r)
            for name, doc in (
                ("remote_copy_lag_segments", "Closed committed segments not yet remote"),
                ("remote_copy_lag_bytes", "Bytes of closed committed segments not yet remote"),
                ("remote_log_size_bytes", "Remote log size of the partitions led here"),
            )
        }
        self._samples: deque[tuple[float, float, float, float, float]] = deque()
        self._latency_children: dict[str, Histogram] = {}
        self.sample()

    def observe_latency(self, api_name: str, seconds: float, kafka_name: str = "") -> None:
        """``kafka_name``: the request's name in Kafka's RequestMetrics, when not the
        API's (a Fetch is FetchConsumer or FetchFollower there)."""
        child = self._latency_children.get(api_name)
        if child is None:
            child = self._latency_children[api_name] = self.latency.labels(api_name)
        child.observe(seconds)
        self.kafka.observe_request(kafka_name or api_name, seconds * 1000)

    def record_append(self, topic: str, nbytes: int, messages: int) -> None:
        self.bytes_in.inc(nbytes)
        self.messages_in.inc(messages)
        self.kafka.record_in(topic, nbytes, messages)

    def count(self, counter: str, amount: float = 1) -> None:
        """Add to one of the remote tier's counters (``remote_copy_bytes``...)."""
        self.remote_counters[counter].inc(amount)

    def set_remote_gauges(self, lag_segments: int, lag_bytes: int, size_bytes: int) -> None:
        self.remote_gauges["remote_copy_lag_segments"].set(lag_segments)
        self.remote_gauges["remote_copy_lag_bytes"].set(lag_bytes)
        self.remote_gauges["remote_log_size_bytes"].set(size_bytes)

    def record_remote_fetch(self, reads: int, nbytes: int, failed: int) -> None:
        self.count("remote_fetch_requests", reads)
        self.count("remote_fetch_bytes", nbytes)
        self.count("remote_fetch_errors", failed)

    def sample(self) -> None:
        """Take a sample for the rates (the broker calls this about once a second)."""
        now = time.monotonic()
        self._samples.append(
            (
                now,
                time.process_time(),
                self.total("bytes_in"),
                self.total("bytes_out"),
                self.total("messages_in"),
            )
        )
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()
        self.idle.set(self.rates()["request_handler_idle_percent"])

    def rates(self) -> dict[str, float]:
        if len(self._samples) < 2:
            return {
                "bytes_in_per_sec": 0.0,
                "bytes_out_per_sec": 0.0,
                "messages_in_per_sec": 0.0,
                "request_handler_idle_percent": 100.0,
            }
        (t0, c0, bi0, bo0, m0), (t1, c1, bi1, bo1, m1) = self._samples[0], self._samples[-1]
        wall = max(t1 - t0, 1e-9)
        return {
            "bytes_in_per_sec": (bi1 - bi0) / wall,
            "bytes_out_per_sec": (bo1 - bo0) / wall,
            "messages_in_per_sec": (m1 - m0) / wall,
            "request_handler_idle_percent": max(0.0, 100.0 * (1.0 - (c1 - c0) / wall)),
        }

    def total(self, counter: str) -> float:
        """A counter's total, e.g. ``total("bytes_in")``."""
        return self.registry.get_sample_value(f"rillet_broker_{counter}_total") or 0.0

    def snapshot(self) -> dict[str, object]:
        """Every metric as plain numbers (rates, totals, latency count/sum per API)."""
        get = self.registry.get_sample_value
        name = "rillet_broker_request_latency_seconds"
        latency = {
            api: {
                "count": int(get(f"{name}_count", {"api": api}) or 0),
                "sum_s": get(f"{name}_sum", {"api": api}) or 0.0,
            }
            for api in self._latency_children
        }
        return {
            **self.rates(),
            "bytes_in_total": self.total("bytes_in"),
            "bytes_out_total": self.total("bytes_out"),
            "messages_in_total": self.total("messages_in"),
            "under_replicated_partitions": int(
                get("rillet_broker_under_replicated_partitions") or 0
            ),
            "failed_partitions": int(get("rillet_broker_failed_partitions") or 0),
            "request_latency": latency,
            **{f"{name}_total": self.total(name) for name in self.remote_counters},
            **{name: int(get(f"rillet_broker_{name}") or 0) for name in self.remote_gauges},
            **(self.loop_lag.snapshot() if self.loop_lag is not None else {}),
        }
