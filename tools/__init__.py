"""rillet.tools: operator tooling that drives whole clusters (the local cluster)."""
