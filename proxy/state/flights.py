"""Single flight: at most one running task per key, awaited by everyone who needs its result.

L4 needs the same summary for every request that crosses the same threshold at the same time
(a client retrying, parallel subagents, a burst). The first request starts the call as a task
of its own; the others find it running and await it. The task is not the starter's: a client
that goes away cancels its own wait, never the call the others are waiting for. A task is
forgotten as soon as it ends — its result lives on in the store, not here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["SingleFlight"]

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """The running tasks by key (one app's; not shared across processes)."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[T]] = {}

    def __len__(self) -> int:
        return len(self._running)

    def running(self, key: str) -> asyncio.Task[T] | None:
        """The task running for ``key``, if any."""
        return self._running.get(key)

    def start(self, key: str, work: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Task[T]:
        """The task for ``key``: the running one, else ``work()`` started now (in the current
        context, so its log lines carry the starter's request id)."""
        task = self._running.get(key)
        if task is not None:
            return task
        task = asyncio.get_running_loop().create_task(work())
        self._running[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        return task

    def _finished(self, key: str, task: asyncio.Task[T]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if not task.cancelled():
            task.exception()  # retrieved: a task nobody awaits any more does not warn

    async def close(self) -> None:
        """Cancel every running task and wait until each has ended."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
