"""A short-lived cache in front of a store's state reads, for the request hot path.

Every ``/v1/messages`` asks the store for its session's durable state, and most sessions
have none: without this, each request pays a round trip to the store's worker thread (or to
Redis) to learn nothing. Reads — present or absent — are remembered for ``ttl_s``; a write or
delete through this object forgets the session at once, so the admin API of this process is
seen immediately, and a write by another process sharing the store within ``ttl_s``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Final

from compactor import DurableContextState

from .base import StateStore, StoredState

__all__ = ["CachedStateReads"]

DEFAULT_TTL_S: Final = 1.0
DEFAULT_MAX_ENTRIES: Final = 10_000


class CachedStateReads:
    """A :class:`StateStore` that caches ``get_state`` briefly and passes the rest through."""

    def __init__(self, store: StateStore, *, ttl_s: float = DEFAULT_TTL_S,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.inner = store
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._states: OrderedDict[str, tuple[float, StoredState | None]] = OrderedDict()

    async def get_state(self, session_id: str) -> StoredState | None:
        """The session's state, from the cache when read less than ``ttl_s`` ago."""
        now = time.monotonic()
        found = self._states.get(session_id)
        if found is not None and now - found[0] < self._ttl_s:
            return found[1]
        stored = await self.inner.get_state(session_id)
        self._states[session_id] = (now, stored)
        self._states.move_to_end(session_id)
        if len(self._states) > self._max_entries:
            self._states.popitem(last=False)
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

    async def get_summary(self, key: str) -> str | None:
        return await self.inner.get_summary(key)

    async def put_summary(self, key: str, text: str) -> None:
        await self.inner.put_summary(key, text)

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        return await self.inner.get_record(session_id, kind)

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        await self.inner.put_record(session_id, kind, data)

    async def close(self) -> None:
        await self.inner.close()
