"""A voter that lost its disk (wiped metadata.log.dir) rejoins: its answers carry the new
storage's id, so the leader knows the log that acknowledged its match index is gone and
replicates it afresh, through a snapshot when the entries it needs were compacted. Driven
by hand with the Raft tests' harness."""

from __future__ import annotations

from test_raft import T_MS, Harness

from rillet.controller.raft.core import StorageState


def wipe(h: Harness, node_id: int) -> None:
    """The node restarts with empty storage (as a controller whose dir was deleted), which
    has a storage id of its own."""
    h.restart(node_id, StorageState(storage_id=h.nodes[node_id].storage_id + 1))


def test_wiped_follower_is_replicated_again_from_the_start() -> None:
    h = Harness()
    h.elect(1)
    for i in range(5):
        h.nodes[1].propose(b"%d" % i)
    h.run(200)
    assert h.nodes[3].commit_index == h.nodes[1].commit_index
    wipe(h, 3)
    h.run(T_MS)
    assert h.nodes[3].log.last_index() == h.nodes[1].log.last_index()
    assert h.applied[3] == [b"%d" % i for i in range(5)]
    assert any("lost its log" in e for e in h.events)


def test_wiped_follower_gets_a_snapshot_when_its_entries_were_compacted() -> None:
    h = Harness()
    h.elect(1)
    for i in range(5):
        h.nodes[1].propose(b"%d" % i)
    h.run(200)
    leader = h.nodes[1]
    leader.compact(leader.applied_index, b"state")
    wipe(h, 3)
    h.run(2 * T_MS)
    assert h.nodes[3].log.snapshot_index == leader.log.snapshot_index
    assert h.nodes[3].commit_index == leader.commit_index
