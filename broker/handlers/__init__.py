"""Request handlers: decode, call the ReplicaManager or the image, encode."""
