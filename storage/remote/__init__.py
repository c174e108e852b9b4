"""rillet.storage.remote: the remote (S3) tier's storage side (see docs/tiered.md).

``store`` is the object store (S3 or in memory), ``layout`` the object keys and the
per-segment manifest, ``copier`` the blocking upload and delete of a closed segment,
``reader`` the asynchronous, cached, checked reads that serve fetches below the local
log start.
"""

from rillet.storage.remote.layout import RemoteManifest, SegmentKeys, segment_keys
from rillet.storage.remote.store import (
    MemoryObjectStore,
    ObjectInfo,
    ObjectStore,
    RemoteStorageError,
    S3ObjectStore,
    store_from_config,
)

__all__ = [
    "MemoryObjectStore",
    "ObjectInfo",
    "ObjectStore",
    "RemoteManifest",
    "RemoteStorageError",
    "S3ObjectStore",
    "SegmentKeys",
    "segment_keys",
    "store_from_config",
]
