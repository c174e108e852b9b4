"""Running the storage layer's coroutines (retention, compaction, log deletion) to the end
inside one simulation event, on a private event loop whose executor runs each job inline.

Production awaits those jobs on its event loop while executor threads do the blocking
part; under simulation the whole coroutine is one event, so a seed replays identically
and a crash can only land between events (before or after the job, never inside it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class InlineExecutor(ThreadPoolExecutor):
    """An executor that runs each job at submission, on the calling thread (asyncio
    accepts only a ThreadPoolExecutor as the default; no thread is ever started)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class SyncRunner:
    """One private loop for a simulation; ``run`` drives a coroutine to completion."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(InlineExecutor())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()
