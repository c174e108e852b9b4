"""Deterministic simulation of rillet's sans-I/O cores (docs/design.md, "Testing").

Generic parts, shared by every kind of simulated node:
- `scheduler.SimClock` / `scheduler.Scheduler`: simulated time and a seeded event queue;
- `network.SimNetwork`: delay, loss, duplication, reordering, symmetric and one-way
  partitions between any registered `network.Actor`s;
- `trace.Trace`: a bounded log of what happened, printed when an invariant breaks.

`raft_cluster` plugs Raft controller nodes in as one kind of actor. A partition-replication
simulation adds its own actor kind on the same network and clock.
"""
