"""The store's availability as the proxy sees it: what ``/healthz`` reports, and the one
``store_unavailable`` log line a second while the store cannot be reached (what a request does
meanwhile is ``store.on_unavailable``'s: docs/operations.md, "Redis").

A backend that can become unreachable (Redis) answers :meth:`Availability.available` cheaply;
one that cannot (SQLite) is always available.
"""

from __future__ import annotations

import time
from typing import Final, Protocol, runtime_checkable

import structlog

__all__ = ["LOG_INTERVAL_S", "Availability", "StoreHealth"]

_log = structlog.get_logger("proxy.store.health")

#: At most one ``store_unavailable`` line per this many seconds.
LOG_INTERVAL_S: Final = 1.0


@runtime_checkable
class Availability(Protocol):
    """A store that can tell whether it is reachable now."""

    async def available(self) -> bool:
        """Whether the store answers now (cheap; never raises)."""


class StoreHealth:
    """The availability of one store (asked only if it is an :class:`Availability`), and the
    rate-limited report of its outages (``on_unavailable`` is named in the log line)."""

    def __init__(self, store: object, *, on_unavailable: str,
                 log_interval_s: float = LOG_INTERVAL_S) -> None:
        self._store = store if isinstance(store, Availability) else None
        self.on_unavailable = on_unavailable
        self._interval_s = log_interval_s
        self._logged_at: float | None = None
        self._unlogged = 0

    async def available(self) -> bool:
        """Whether the store answers now; a store that cannot go away always does."""
        return True if self._store is None else await self._store.available()

    def note_unavailable(self, what: str, exc: BaseException) -> None:
        """Count one thing not done because the store is unavailable (``what``: ``request``,
        ``usage``...), logging ``store_unavailable`` if none was logged for a while."""
        self._unlogged += 1
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < self._interval_s:
            return
        _log.warning("store_unavailable", on_unavailable=self.on_unavailable, what=what,
                     error_class=type(exc).__name__, events=self._unlogged)
        self._logged_at, self._unlogged = now, 0
