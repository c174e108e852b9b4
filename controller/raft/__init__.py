"""The Raft quorum: the sans-I/O core, its durable store, its driver and transport."""
