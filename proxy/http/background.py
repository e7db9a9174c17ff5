"""Work that runs after a response (the audit log's records): held until it ends, awaited at
shutdown, and a failure is one warning, never the client's. A store that gathers writes hands
back its batch's future, watched once from its first entry on.
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
        """Run what ``start`` starts (a future, or a coroutine run as a task), never failing
        the request; a failure, even at once, is logged as ``failure_event``."""
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
            # Counted in the once-a-second line, not one warning per request.
            self._health.note_unavailable(failure_event, exc)
        else:
            _log.warning(failure_event, error_class=type(exc).__name__)
