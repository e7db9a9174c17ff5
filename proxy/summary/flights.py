"""Single flight: at most one running task per key, awaited by everyone who needs its result.

Requests crossing the same threshold at once need the same summary: the first starts the call
as a task of its own, the others await it; a client that goes away cancels only its own wait.
Across processes sharing a store, :func:`fleet_single_flight` puts a lease of the store in
front (docs/operations.md, "Replicas"); :class:`SingleFlight` stays in front of that, so a
process waits for the fleet once per key, not once per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Generic, Literal, TypeVar

import structlog

from proxy.store import ReplicaConsistency, StoreError

__all__ = ["LEASE_TTL_S", "FleetOutcome", "SingleFlight", "fleet_single_flight"]

T = TypeVar("T")

_log = structlog.get_logger("proxy.summary.flights")

#: A lease's lifetime (seconds): renewed every third of it while its holder works, so a holder
#: that died is taken over this long after its last renewal at most.
LEASE_TTL_S: Final = 10.0
#: How often a waiter polls for the result, at first and at most (seconds); doubling between.
POLL_FIRST_S: Final = 0.02
POLL_MAX_S: Final = 0.25

#: How :func:`fleet_single_flight` got its result: ``made`` here, ``joined`` (another process
#: made it), ``found`` (made before this process took the lease), ``timeout``, or ``alone``
#: (the store failed: made without a lease).
FleetOutcome = Literal["made", "joined", "found", "timeout", "alone"]


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


async def fleet_single_flight(locks: ReplicaConsistency, name: str,
                              poll: Callable[[], Awaitable[T | None]],
                              work: Callable[[], Awaitable[T | None]], *, timeout_s: float,
                              ttl_s: float = LEASE_TTL_S) -> tuple[T | None, FleetOutcome]:
    """``work()`` done by one process of the fleet at a time, under the lease ``name``; the
    others poll until ``poll()`` answers, the lease is free again (they take over), or
    ``timeout_s`` passed. The holder polls once more, then works, renewing the lease every
    third of ``ttl_s``, and releases it with its token."""
    token = uuid.uuid4().hex
    ttl_ms = max(1, round(ttl_s * 1000))
    deadline = time.monotonic() + timeout_s
    delay = POLL_FIRST_S
    while True:
        try:
            taken = await locks.acquire_lock(name, token, ttl_ms)
        except StoreError as exc:
            _log.warning("lease_failed", error_class=type(exc).__name__)
            return await work(), "alone"
        if taken:
            break
        if time.monotonic() >= deadline:
            return None, "timeout"
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, POLL_MAX_S)
        found = await poll()
        if found is not None:
            return found, "joined"
    try:
        found = await poll()
        if found is not None:
            return found, "found"
        keeper = asyncio.get_running_loop().create_task(_renew(locks, name, token, ttl_s))
        try:
            return await work(), "made"
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
    finally:
        try:
            await asyncio.shield(locks.release_lock(name, token))
        except StoreError as exc:  # it expires by itself
            _log.warning("lease_release_failed", error_class=type(exc).__name__)


async def _renew(locks: ReplicaConsistency, name: str, token: str, ttl_s: float) -> None:
    ttl_ms = max(1, round(ttl_s * 1000))
    while True:
        await asyncio.sleep(ttl_s / 3)
        try:
            if not await locks.extend_lock(name, token, ttl_ms):
                _log.warning("lease_lost", lease=name)
                return
        except StoreError as exc:
            _log.warning("lease_renew_failed", error_class=type(exc).__name__)
