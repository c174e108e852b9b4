"""Partition replication: the sans-I/O core, follower fetchers, HW checkpoints."""
