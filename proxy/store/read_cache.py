"""A cache in front of a store's state reads, for the request hot path, never stale.

Each read asks the store for the session's *versions* (one small round trip, no state text;
none at all for a store no other process writes) and re-reads the state only when its version
changed. The versions are kept for the rest of the request (:func:`request_versions`), so the
checkpoints and the listeners given here (the shared calibration, fed the records the same
round trip brought) check their copies without another round trip.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Final

from cachetools import LRUCache

from compactor import DurableContextState
from proxy.audit.log import StateChange

from .base import RecordFetch, ReplicaConsistency, SessionVersions, StateStore, StoredState

__all__ = ["CachedStateReads", "RecordsWanted", "VersionsListener", "request_versions"]

DEFAULT_MAX_ENTRIES: Final = 10_000

#: Told each session's versions as read for a request (before the state is returned).
VersionsListener = Callable[[str, SessionVersions], Awaitable[None]]
#: The versioned records of a session to read with its versions (``None``: none).
RecordsWanted = Callable[[str], RecordFetch | None]

# The versions the current task (a request) read: (store, session id, versions).
_READ: ContextVar[tuple[object, str, SessionVersions] | None] = ContextVar(
    "compact_proxy_session_versions", default=None)


def request_versions(store: object, session_id: str) -> SessionVersions | None:
    """The versions of ``session_id`` this request (task) read from ``store``, or ``None``."""
    read = _READ.get()
    if read is None or read[0] is not store or read[1] != session_id:
        return None
    return read[2]


class CachedStateReads:
    """A :class:`StateStore` that checks its cached ``get_state`` against the store's version
    on every read (telling ``listeners``, with the records ``fetch`` wants), and writes
    through; a store without versions is read every time. Used from the event loop only."""

    def __init__(self, store: StateStore, *, max_entries: int = DEFAULT_MAX_ENTRIES,
                 listeners: Sequence[VersionsListener] = (),
                 fetch: RecordsWanted | None = None) -> None:
        self.inner = store
        self.listeners = list(listeners)
        self._fetch = fetch
        self._versioned = store if isinstance(store, ReplicaConsistency) else None
        self._states: LRUCache[str, StoredState | None] = LRUCache(max_entries)

    async def get_state(self, session_id: str) -> StoredState | None:
        """The cached state while the store's version is its; a store no other process
        writes is written only through here, so what it cached is current."""
        if self._versioned is None:
            return await self.inner.get_state(session_id)
        if self._versioned.shared:
            versions = await self._versioned.session_versions(
                session_id, None if self._fetch is None else self._fetch(session_id))
            _READ.set((self._versioned, session_id, versions))
            for listener in self.listeners:
                await listener(session_id, versions)
            if session_id in self._states:
                cached = self._states[session_id]
                if versions.same_state(cached):
                    return cached
            if versions.state is None:
                self._states[session_id] = None
                return None
        elif session_id in self._states:
            return self._states[session_id]
        stored = await self.inner.get_state(session_id)
        self._states[session_id] = stored
        return stored

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None,
                        change: StateChange | None = None) -> StoredState:
        self._states.pop(session_id, None)
        stored = await self.inner.put_state(session_id, state, expected_version, change)
        self._states[session_id] = stored
        return stored

    async def delete_state(self, session_id: str, expected_version: int | None = None,
                           change: StateChange | None = None) -> bool:
        self._states.pop(session_id, None)
        try:
            return await self.inner.delete_state(session_id, expected_version, change)
        finally:
            self._states.pop(session_id, None)
