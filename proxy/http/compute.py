"""The threads that parse, count, compact and encode large bodies off the event loop.

A cold multi-megabyte body takes the interpreter seconds; on these threads the loop keeps its
turn. Decoded JSON holds no cycles, so automatic garbage collection (which would walk the
body's millions of objects) is paused while these threads work.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

from proxy.server.allocator import give_back_memory

__all__ = ["COMPUTE_THREADS", "OFFLOAD_FROM_BYTES", "TURNS", "ComputeThreads", "Turn", "run_on"]

#: Threads: a second one adds little but doubles the cold bodies alive at once (bench/README.md).
COMPUTE_THREADS: Final = 1
#: A body at least this large is worked on by these threads (bench/README.md).
OFFLOAD_FROM_BYTES: Final = 256 * 1024
#: Seconds without a large refused body before the free pages go back.
TRIM_AFTER_S: Final = 0.5

#: Large bodies worked on at once (each adds its objects to the peak; bench/README.md).
TURNS: Final = 1

T = TypeVar("T")
P = ParamSpec("P")


class _CollectorPause:
    """Automatic garbage collection off while any thread is inside, back on after the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._resume = False

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._inside += 1

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0 and self._resume:
                gc.enable()


class ComputeThreads(ThreadPoolExecutor):
    """A thread pool whose work runs with automatic garbage collection paused."""

    def __init__(self, threads: int = COMPUTE_THREADS) -> None:
        super().__init__(max_workers=threads, thread_name_prefix="compact")
        self._pause = _CollectorPause()
        self._trim_timer: asyncio.TimerHandle | None = None
        self._turns: asyncio.Semaphore | None = None

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return super().submit(self._paused, functools.partial(fn, *args, **kwargs))

    def _paused(self, work: Callable[[], T]) -> T:
        with self._pause:
            return work()

    def turn(self) -> Turn:
        """A large body's turn at these threads (``async with``), one of :data:`TURNS`."""
        if self._turns is None:  # (made on the event loop that uses it)
            self._turns = asyncio.Semaphore(TURNS)
        return Turn(self._turns, self._pause)

    def give_back_memory(self) -> None:
        """Return the allocator's free pages to the system, on one of these threads,
        :data:`TRIM_AFTER_S` after the last call (one trim for a flood of refused bodies)."""
        if self._trim_timer is not None:
            self._trim_timer.cancel()
        self._trim_timer = asyncio.get_running_loop().call_later(TRIM_AFTER_S, self._queue_trim)

    def _queue_trim(self) -> None:
        self._trim_timer = None
        with contextlib.suppress(RuntimeError):  # (shut down: the process is stopping)
            self.submit(give_back_memory)


class Turn:
    """One request's turn at the compute threads, given up while it waits for a summary
    (:meth:`paused`); the collector stays paused while it is held, between steps too."""

    def __init__(self, turns: asyncio.Semaphore, collector: _CollectorPause) -> None:
        self._turns = turns
        self._collector = collector
        self._holding = False

    async def __aenter__(self) -> Turn:
        await self._take()
        return self

    async def __aexit__(self, *_: object) -> None:
        self._give_up()

    async def _take(self) -> None:
        await self._turns.acquire()
        self._holding = True
        self._collector.__enter__()

    def _give_up(self) -> None:
        if self._holding:
            self._holding = False
            self._collector.__exit__()
            self._turns.release()

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Let other bodies have their turn meanwhile (a summary call takes seconds)."""
        if not self._holding:
            yield
            return
        self._give_up()
        try:
            yield
        finally:
            await self._take()


async def run_on(executor: Executor | None, work: Callable[[], T]) -> T:
    """``work()`` on ``executor``'s threads, or here with none."""
    if executor is None:
        return work()
    return await asyncio.get_running_loop().run_in_executor(executor, work)
