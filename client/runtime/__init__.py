"""What every rillet node process shares: the RPC server, node config, task policies."""
