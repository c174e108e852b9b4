"""rillet.storage: segmented partition logs on local disk (see docs/storage.md)."""

from rillet.storage.config import LogConfig
from rillet.storage.fileslice import FileSlice
from rillet.storage.invariants import InvariantError
from rillet.storage.log import Log, TimestampOffset
from rillet.storage.manager import LogManager

__all__ = ["FileSlice", "InvariantError", "Log", "LogConfig", "LogManager", "TimestampOffset"]
