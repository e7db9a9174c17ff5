"""The threads that parse, count, compact and encode large bodies off the event loop.

A cold multi-megabyte body takes the interpreter seconds; on the loop, every other request
and stream of the process would wait that long. On these threads the loop keeps its turn
(the interpreter switches threads every few milliseconds; token counting releases it).

What still stalls a loop that shares the interpreter is the cyclic garbage collector: a
cold body makes millions of objects that live through the request, so collections walk them
all, holding the interpreter for hundreds of milliseconds each time. Decoded JSON holds no
cycles (it is freed by reference counts), so automatic collection is paused while these
threads work and resumes when none does; cycles made meanwhile are collected then.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

from proxy.allocator import give_back_memory

__all__ = ["COMPUTE_THREADS", "OFFLOAD_FROM_BYTES", "ComputeThreads", "run_on"]

#: Threads. One: the interpreter runs one thread at a time, so a second one adds little but
#: token counting in parallel, and doubles the objects of cold bodies alive at once
#: (bench/README.md, "bench/hostile.py").
COMPUTE_THREADS: Final = 1
#: A body at least this large is worked on by these threads; a smaller one costs less than
#: the hop (bench/README.md, "hostile callers").
OFFLOAD_FROM_BYTES: Final = 256 * 1024

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
        self._trim_lock = threading.Lock()
        self._trim_queued = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return super().submit(self._paused, functools.partial(fn, *args, **kwargs))

    def _paused(self, work: Callable[[], T]) -> T:
        with self._pause:
            return work()

    def give_back_memory(self) -> None:
        """Return the allocator's free pages to the system, on one of these threads (one
        such call queued at a time: a flood of refused bodies asks for it once a turn)."""
        with self._trim_lock:
            if self._trim_queued:
                return
            self._trim_queued = True
        try:
            self.submit(self._trim)
        except RuntimeError:  # (shut down: the process is stopping)
            self._trim_queued = False

    def _trim(self) -> None:
        with self._trim_lock:
            self._trim_queued = False
        give_back_memory()


async def run_on(executor: Executor | None, work: Callable[[], T]) -> T:
    """``work()`` on ``executor``'s threads, or here with none."""
    if executor is None:
        return work()
    return await asyncio.get_running_loop().run_in_executor(executor, work)
