"""The health verdict over synthetic descriptions: offline, under min ISR, under-replicated,
no active controller, fenced brokers, the capped problem list."""

from __future__ import annotations

from rillet.client.admin import ClusterDescription, QuorumDescription, QuorumVoter, TopicDescription
from rillet.client.health import OFFLINE, UNDER_MIN_ISR, UNDER_REPLICATED, assess
from rillet.client.metadata import BrokerInfo, PartitionInfo

BROKERS = tuple(BrokerInfo(i, "127.0.0.1", 9090 + i) for i in (1, 2, 3))
QUORUM = QuorumDescription(101, 3, 50, (QuorumVoter(101, 50, 0), QuorumVoter(102, 48, 2, 1000)))


def cluster(fenced: tuple[int, ...] = ()) -> ClusterDescription:
    return ClusterDescription("c1", 101, BROKERS, fenced)


def topic(name: str, *parts: tuple[int, tuple[int, ...]]) -> TopicDescription:
    """Partitions as (leader, isr), replicas always 1, 2, 3."""
    return TopicDescription(
        name,
        tuple(
            PartitionInfo(name, i, leader, 0, (1, 2, 3), isr)
            for i, (leader, isr) in enumerate(parts)
        ),
    )


def test_all_in_sync_is_healthy() -> None:
    h = assess(cluster(), QUORUM, [topic("t", (1, (1, 2, 3)), (2, (2, 3, 1)))], {"t": 2})
    assert h.healthy and h.status == "healthy" and h.problems == () and h.warnings == ()
    assert (h.topics, h.partitions, h.offline, h.under_replicated, h.under_min_isr) == (
        1,
        2,
        0,
        0,
        0,
    )
    assert [(b.id, b.leaders, b.partitions, b.under_replicated) for b in h.brokers] == [
        (1, 1, 2, 0),
        (2, 1, 2, 0),
        (3, 0, 2, 0),
    ]
    assert h.as_dict()["quorum"]["voters"][1]["lag"] == 2


def test_under_replicated_above_min_isr_is_degraded_not_unhealthy() -> None:
    h = assess(cluster(fenced=(3,)), QUORUM, [topic("t", (1, (1, 2)), (2, (1, 2, 3)))], {"t": 2})
    assert h.healthy and h.status == "degraded"
    assert h.under_replicated == 1 and h.under_min_isr == 0
    assert h.brokers[0].under_replicated == 1 and h.brokers[2].fenced
    assert [p.problem for p in h.problem_partitions] == [UNDER_REPLICATED]
    assert any("fenced" in w for w in h.warnings)


def test_under_min_isr_and_offline_are_unhealthy_worst_first() -> None:
    h = assess(
        cluster(),
        QUORUM,
        [topic("a", (1, (1,)), (-1, (2,))), topic("b", (1, (1,)))],
        {"a": 2},  # b: no min ISR known, 1 assumed
    )
    assert not h.healthy and h.status == "unhealthy"
    assert (h.offline, h.under_min_isr, h.under_replicated) == (1, 1, 2)  # offline once
    assert [(p.topic, p.partition, p.problem) for p in h.problem_partitions] == [
        ("a", 1, OFFLINE),
        ("a", 0, UNDER_MIN_ISR),
        ("b", 0, UNDER_REPLICATED),
    ]
    assert h.problems == ("1 offline partition(s)", "1 partition(s) under min ISR")


def test_no_active_controller_is_unhealthy() -> None:
    h = assess(cluster(), None, [topic("t", (1, (1, 2, 3)))], {})
    assert not h.healthy and h.problems == ("no active controller",)
    assert h.controller_id == -1 and h.as_dict()["quorum"] is None


def test_the_problem_list_is_capped_and_counted() -> None:
    parts = [(-1, ())] * 30 + [(1, (1,))] * 30
    h = assess(cluster(), QUORUM, [topic("t", *parts)], {"t": 2}, limit=10)
    assert h.problem_partitions_total == 60 and len(h.problem_partitions) == 10
    assert all(p.problem == OFFLINE for p in h.problem_partitions)


def test_ten_thousand_partitions_in_one_pass() -> None:
    topics = [topic(f"t{i}", *[(1 + j % 3, (1, 2, 3)) for j in range(10)]) for i in range(1000)]
    h = assess(cluster(), QUORUM, topics, {t.name: 2 for t in topics})
    assert (h.topics, h.partitions, h.healthy) == (1000, 10_000, True)
    assert sum(b.leaders for b in h.brokers) == 10_000


def test_the_view_shows_the_verdict_and_the_problem_partitions() -> None:
    from rich.console import Console

    from rillet.client.cli.health import exit_code, health_view

    parts = [(-1, ())] * 3 + [(1, (1,))] * 3
    h = assess(cluster(fenced=(2,)), None, [topic("t", *parts)], {"t": 2}, limit=4)
    console = Console(record=True, width=120)
    console.print(health_view(h, now_ms=0))
    text = console.export_text()
    assert "UNHEALTHY" in text and "no active controller" in text
    assert "3 offline partition(s)" in text and "fenced broker(s): 2" in text
    assert "... and 2 more" in text and "under-min-isr" in text
    assert (exit_code(h), exit_code(None)) == (1, 2)
    healthy = assess(cluster(), QUORUM, [topic("t", (1, (1, 2, 3)))], {})
    assert exit_code(healthy) == 0
    console = Console(record=True, width=120)
    console.print(health_view(healthy, now_ms=3000))
    text = console.export_text()
    assert "HEALTHY" in text and "leader" in text and "2.0 s ago" in text


def test_an_offline_partition_is_counted_once() -> None:
    """A leaderless partition is offline; counting it under min ISR and under-replicated
    too would report one problem as three."""
    offline = TopicDescription("t", (PartitionInfo("t", 0, -1, 0, (1, 2, 3), (1,)),))
    h = assess(cluster(), QUORUM, [offline], {"t": 2})
    assert (h.offline, h.under_min_isr, h.under_replicated) == (1, 0, 0)
    assert h.problems == ("1 offline partition(s)",)
    assert [p.problem for p in h.problem_partitions] == [OFFLINE]
