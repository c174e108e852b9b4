"""Deterministic simulation of rillet's sans-I/O cores (docs/design.md, "Testing").

Generic parts, shared by every kind of simulated node:
- `scheduler.SimClock` / `scheduler.Scheduler`: simulated time and a seeded event queue;
- `network.SimNetwork`: delay, loss, duplication, reordering, symmetric and one-way
  partitions between any registered `network.Actor`s;
- `trace.Trace`: a bounded log of what happened, printed when an invariant breaks;
- `clocks.DriftingClock`: a node's own clock, drifting and leaping.

`raft_cluster` plugs Raft controller nodes in as one kind of actor. `controller_quorum`
makes those actors answer brokers as the controller server does, and gives brokers the
link to them; `replication_cluster` runs broker actors against such a quorum.
"""
