"""Bytes out per broker, from the brokers' Prometheus endpoints when the console is told
where they are (``rillet console --metrics 1=HOST:PORT,...``).

The Kafka protocol has no request that says how much a broker sent to consumers; its
metrics do (``kafka_server_brokertopicmetrics_bytesout_total``, the all-topics series).
The rate is the counter's growth between two scrapes. Without endpoints, or while one
does not answer, the console shows the figure as unknown rather than guessing.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

BYTES_OUT = "kafka_server_brokertopicmetrics_bytesout"
SCRAPE_TIMEOUT_S = 2.0
SCRAPE_LIMIT = 8 << 20  # bytes read from one endpoint (10,000 partitions' series fit)


def parse_targets(spec: str) -> dict[int, str]:
    """``"1=127.0.0.1:9401,2=http://h:9402/metrics"`` -> {1: "http://127.0.0.1:9401/metrics",
    ...}. ValueError names a malformed entry."""
    out: dict[int, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        node, sep, where = item.partition("=")
        if not sep or not node.strip().isdigit() or not where.strip():
            raise ValueError(f"--metrics wants BROKER_ID=HOST:PORT[,...], not {item!r}")
        url = where.strip()
        if "://" not in url:
            url = f"http://{url}"
        if url.count("/") < 3:
            url += "/metrics"
        out[int(node)] = url
    return out


def bytes_out_total(text: str) -> float | None:
    """The all-topics bytes-out counter of one exposition (no ``topic`` label)."""
    # A broker with 1,000 topics exposes tens of thousands of lines: only the ones of
    # this counter are worth parsing.
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(BYTES_OUT))
    # Matched by sample name: how the parser groups a counter's samples into families
    # depends on the TYPE line, which exporters spell either way.
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            if sample.name == BYTES_OUT + "_total" and "topic" not in sample.labels:
                return float(sample.value)
    return None


def _scrape(url: str) -> float | None:
    """Fetch and parse in a worker thread: neither may hold the console's event loop."""
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:  # noqa: S310 - http only, given by the operator
        return bytes_out_total(response.read(SCRAPE_LIMIT).decode("utf-8", "replace"))


class BytesOutMeter:
    """Scrapes each endpoint once per log pass; ``rates`` holds bytes out per second per
    broker for the brokers measured twice in a row."""

    def __init__(self, targets: Mapping[int, str]) -> None:
        self.targets = dict(targets)
        self.rates: dict[int, float] = {}
        self._last: dict[int, tuple[float, float]] = {}  # node -> (monotonic, counter)

    async def scrape(self) -> None:
        if not self.targets:
            return
        nodes = list(self.targets)
        totals = await asyncio.gather(
            *(asyncio.to_thread(_scrape, self.targets[n]) for n in nodes), return_exceptions=True
        )
        now = time.monotonic()
        rates: dict[int, float] = {}
        for node, answer in zip(nodes, totals, strict=True):
            total = None if isinstance(answer, BaseException) else answer
            if total is None:
                self._last.pop(node, None)
                continue
            before = self._last.get(node)
            if before is not None and now > before[0] and total >= before[1]:
                rates[node] = (total - before[1]) / (now - before[0])
            self._last[node] = (now, total)
        self.rates = rates
