"""Finding a group's coordinator and talking to it, for the group consumer and Admin.

A group's coordinator is the leader of one ``__consumer_offsets`` partition, so it moves
whenever that partition's leadership does. The lookup (FindCoordinator, to any broker)
is cached until a request to the coordinator shows it moved: a broken connection,
NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE. Then the next call looks it up again and
resends, until the caller's deadline. COORDINATOR_LOAD_IN_PROGRESS (the new leader is
still reading the partition) is retried at the same broker after the backoff.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from rillet.client.metadata import MetadataClient
from rillet.client.wire import errors
from rillet.client.wire import messages as m
from rillet.client.wire.connection import Connection, R, RequestMessage
from rillet.client.wire.errors import NetworkError, RequestTimedOutError, RilletError, error_for

GROUP_KEY = 0

MOVED = frozenset({errors.code_of("NOT_COORDINATOR"), errors.code_of("COORDINATOR_NOT_AVAILABLE")})
"""Codes meaning "ask FindCoordinator again"."""
LOADING = errors.code_of("COORDINATOR_LOAD_IN_PROGRESS")


async def find_coordinators(meta: MetadataClient, keys: Iterable[str]) -> dict[str, m.Coordinator]:
    """One FindCoordinator for several group ids (to any broker): each key's answer,
    errors included (the caller decides what to retry)."""
    wanted = sorted(set(keys))
    response = await meta.request_any(m.FindCoordinatorRequest(wanted, GROUP_KEY))
    return {c.key: c for c in response.coordinators}


class CoordinatorClient:
    """Requests to one group's coordinator, following it when it moves."""

    def __init__(self, meta: MetadataClient, group_id: str, *, retry_backoff_ms: int = 100) -> None:
        self.meta = meta
        self.group_id = group_id
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.node_id: int | None = None
        """The coordinator's node id while known."""
        self._conn: Connection | None = None

    def mark_unknown(self) -> None:
        """The coordinator moved or failed: look it up before the next request."""
        self.node_id = None
        self._conn = None

    async def connection(self) -> Connection:
        """The coordinator's connection, looked up when not known (one attempt: a
        retriable RilletError when there is no coordinator yet)."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        found = (await find_coordinators(self.meta, [self.group_id])).get(self.group_id)
        if found is None:
            raise errors.CoordinatorNotAvailableError(f"no answer for group {self.group_id!r}")
        if found.error_code != errors.NONE:
            raise error_for(found.error_code, found.error_message or f"group {self.group_id!r}")
        self._conn = await self.meta.connect_to(found.node_id, found.host, found.port)
        self.node_id = found.node_id
        return self._conn

    async def call(
        self,
        message: RequestMessage[R],
        error_code: Callable[[R], int],
        *,
        timeout_ms: int,
        request_timeout_ms: int | None = None,
    ) -> R:
        """Send ``message`` to the coordinator and return its response once
        ``error_code(response)`` is neither a moved nor a loading code; those, broken
        connections and retriable lookup errors are retried until ``timeout_ms``, then
        the last error is raised. Other codes are the caller's to handle."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                conn = await self.connection()
                response, _ = await conn.call(message, timeout_ms=request_timeout_ms)
                code = error_code(response)
                if code not in MOVED and code != LOADING:
                    return response
                if code in MOVED:
                    self.mark_unknown()
                last: RilletError = error_for(code, f"group {self.group_id!r}")
            except (NetworkError, RequestTimedOutError) as e:
                if self._conn is not None:
                    self._conn.close()
                self.mark_unknown()
                last = e
            except RilletError as e:
                if not e.retriable:
                    raise
                self.mark_unknown()
                last = e
            if time.monotonic() + self.retry_backoff_s >= deadline:
                raise last
            await asyncio.sleep(self.retry_backoff_s)
