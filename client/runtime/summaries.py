"""Summaries with quantiles, as Kafka's timers show them (``...RateAndTimeMs``,
``TotalTimeMs``): a count and a sum over the node's life, and the 50th to 99.9th
percentiles of a bounded window of the latest samples (prometheus-client's Summary has
no quantiles). Observing is a deque append; sorting happens at scrape time only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.metrics_core import Metric

# Kafka's histogram percentiles: 50th, 75th, 95th, 98th, 99th and 99.9th.
QUANTILES = (0.5, 0.75, 0.95, 0.98, 0.99, 0.999)
WINDOW = 1028  # as many samples as Kafka's reservoir keeps


class RecentSummary:
    __slots__ = ("count", "sum", "recent")

    def __init__(self, window: int = WINDOW) -> None:
        self.count = 0
        self.sum = 0.0
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        self.recent.append(value)

    def quantiles(self, qs: Iterable[float] = QUANTILES) -> list[tuple[float, float]]:
        """(q, value) by nearest rank over the window; empty when nothing was observed."""
        ordered = sorted(self.recent)
        if not ordered:
            return []
        last = len(ordered) - 1
        return [(q, ordered[min(last, int(q * len(ordered)))]) for q in qs]


def summary_family(
    name: str,
    doc: str,
    summaries: Mapping[tuple[str, ...], RecentSummary],
    labelnames: Sequence[str] = (),
) -> Metric:
    """One exposition family: per label set, a sample per quantile plus _count and _sum."""
    family = Metric(name, doc, "summary")
    for values, summary in summaries.items():
        labels = dict(zip(labelnames, values, strict=True))
        for q, value in summary.quantiles():
            family.add_sample(name, {**labels, "quantile": str(q)}, value)
        family.add_sample(f"{name}_count", labels, summary.count)
        family.add_sample(f"{name}_sum", labels, summary.sum)
    return family
