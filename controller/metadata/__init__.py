"""Cluster metadata: records, the immutable image, and the QuorumController over it."""
