"""Process limits a node raises for itself at start-up."""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger(__name__)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (an unprivileged process may) and
    log both; returns the (soft, hard) now in force.

    A broker holds a descriptor per connection, per open segment file (bounded by its
    log manager's descriptor cache) and per Raft or checkpoint file it writes; the common
    default soft limit of 1024 is far below what thousands of partitions and clients
    need, while the hard limit usually is not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:  # e.g. macOS caps it below an infinite hard
            logger.warning("open files limit: could not raise soft %d to %d: %r", soft, hard, e)
        else:
            logger.info("open files limit: soft %d raised to the hard limit %d", soft, hard)
            return hard, hard
    logger.info("open files limit: soft %d, hard %d", soft, hard)
    return soft, hard
