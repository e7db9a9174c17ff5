"""Work that runs after a response: bookkeeping a request never waits for.

The audit log's records are written here. Each piece of work is held by the app's
:class:`Background` until it ends (so it is not garbage-collected half-way), and the app waits
for what is still running at shutdown (:mod:`proxy.server.app`). A failure is one warning line
naming the error's class; it never reaches the client, whose answer is already on its way.

A store that gathers writes (SQLite's audit log) hands back the batch's future, resolved
once the batch is written: it is watched with one callback from its first entry on, with no
task, no coroutine per request, and a batch that fails is one warning, on the log context of
the request that began it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from proxy.store import StoreUnavailable
from proxy.store.health import StoreHealth

__all__ = ["Background"]

_log = structlog.get_logger("proxy.http.background")


class Background:
    """The work under way after responses, held until it ends (the app waits for it at
    shutdown); a store outage it meets is told to ``health``'s once-a-second line."""

    def __init__(self, health: StoreHealth) -> None:
        self.tasks: set[asyncio.Future[None]] = set()
        self._health = health

    def run(self, start: Callable[[], Awaitable[None]], *, failure_event: str) -> None:
        """Start work that runs after the response, never failing the request; held until
        it ends.

        Args:
            start: starts the work: returns a future (watched as it is) or a coroutine (run
                as a task); what it raises at once is reported like a later failure.
            failure_event: the warning logged when it fails (``audit_not_recorded``, ...).
        """
        try:
            work = start()
        except Exception as exc:  # noqa: BLE001 - bookkeeping never fails a request
            self._report(exc, failure_event)
            return
        if isinstance(work, asyncio.Future):  # (a C check: asyncio.isfuture is Python code)
            future: asyncio.Future[None] = work
        else:
            future = asyncio.get_running_loop().create_task(work)  # type: ignore[arg-type]
        tasks = self.tasks
        if future in tasks:
            return  # a batch's future, watched since its first entry: its failure told once
        tasks.add(future)

        def done(finished: asyncio.Future[None]) -> None:
            tasks.discard(finished)
            if not finished.cancelled():
                exc = finished.exception()
                if isinstance(exc, Exception):
                    self._report(exc, failure_event)

        future.add_done_callback(done)

    def _report(self, exc: Exception, failure_event: str) -> None:
        if isinstance(exc, StoreUnavailable):
            # Fails fast while the store is down: counted in the once-a-second line, not one
            # warning per request.
            self._health.note_unavailable(failure_event, exc)
        else:
            _log.warning(failure_event, error_class=type(exc).__name__)
