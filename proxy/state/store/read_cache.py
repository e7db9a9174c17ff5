"""A short-lived cache in front of a store's state reads, for the request hot path.

Every ``/v1/messages`` asks the store for its session's durable state, and most sessions
have none: without this, each request pays a round trip to the store's worker thread (or to
Redis) to learn nothing. Reads — present or absent — are remembered for ``ttl_s``; a write or
delete through this object forgets the session at once, so the admin API of this process is
seen immediately, and a write by another process sharing the store within ``ttl_s``.

Only the durable state goes through here: the summary cache and the records are reached on
the backend itself, and the backend's owner opens and closes it.
"""

from __future__ import annotations

from typing import Final

from cachetools import TTLCache

from compactor import DurableContextState

from .base import StateStore, StoredState

__all__ = ["CachedStateReads"]

DEFAULT_TTL_S: Final = 1.0
DEFAULT_MAX_ENTRIES: Final = 10_000


class CachedStateReads:
    """A :class:`StateStore` that caches another's ``get_state`` briefly and writes through.

    Used from the event loop only. Beyond ``max_entries`` sessions the least recently used
    entry goes.
    """

    def __init__(self, store: StateStore, *, ttl_s: float = DEFAULT_TTL_S,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.inner = store
        self._states: TTLCache[str, StoredState | None] = TTLCache(maxsize=max_entries,
                                                                    ttl=ttl_s)

    async def get_state(self, session_id: str) -> StoredState | None:
        """The session's state, from the cache when read less than ``ttl_s`` ago."""
        try:
            return self._states[session_id]
        except KeyError:
            pass
        stored = await self.inner.get_state(session_id)
        self._states[session_id] = stored
        return stored

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None) -> StoredState:
        """Write through, forgetting the cached read."""
        self._states.pop(session_id, None)
        try:
            return await self.inner.put_state(session_id, state, expected_version)
        finally:
            self._states.pop(session_id, None)

    async def delete_state(self, session_id: str, expected_version: int | None = None) -> bool:
        """Delete through, forgetting the cached read."""
        self._states.pop(session_id, None)
        try:
            return await self.inner.delete_state(session_id, expected_version)
        finally:
            self._states.pop(session_id, None)
