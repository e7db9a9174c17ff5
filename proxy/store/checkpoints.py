"""Sticky-compaction checkpoints per session and lane: in memory first, the store behind.

A *lane* is one conversation within a session (its role and conversation key), so subagents
sharing their parent's session id keep their own. A store failure is logged and compaction
starts afresh; a copy in memory is used only while the store's version of its record is the
one it was kept with (:func:`proxy.store.read_cache.request_versions`), or the store unshared.
"""

from __future__ import annotations

from typing import Final, Protocol

import structlog
from cachetools import LRUCache

import compactor
from proxy.store import RecordStore, ReplicaConsistency, StoreError, StoreUnavailable
from proxy.store.read_cache import request_versions

__all__ = ["CHECKPOINT_RECORD_PREFIX", "CheckpointStore", "SessionCheckpoints"]

_log = structlog.get_logger("proxy.store.checkpoints")

#: Record kind in the store: ``checkpoint:<lane>``.
CHECKPOINT_RECORD_PREFIX: Final = "checkpoint:"
DEFAULT_MAX_ENTRIES: Final = 1024


class CheckpointStore(RecordStore, ReplicaConsistency, Protocol):
    """What the checkpoints need of a store: versioned records."""


class SessionCheckpoints:
    """The latest checkpoint of each recent (session, lane). Used from the event loop only."""

    def __init__(self, store: CheckpointStore, *,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self._store = store
        # (session, lane) -> (the store's version of it, 0: none; its checkpoint or None),
        # least recently used evicted.
        self._memory: LRUCache[tuple[str, str],
                               tuple[int, compactor.CompactionCheckpoint | None]] = LRUCache(
            max_entries)

    async def load(self, session_id: str, lane: str) -> compactor.CompactionCheckpoint | None:
        """The checkpoint to try for this request, or ``None``: the store's current one."""
        key = (session_id, lane)
        kind = CHECKPOINT_RECORD_PREFIX + lane
        held = self._memory.get(key)
        try:
            if not self._store.shared:
                if held is not None:
                    return held[1]
            else:
                versions = (request_versions(self._store, session_id)
                            or await self._store.session_versions(session_id))
                current = versions.records.get(kind, 0)
                if held is not None and held[0] == current:
                    return held[1]
                if current == 0:
                    self._memory[key] = (0, None)
                    return None
            found = await self._store.get_versioned_record(session_id, kind)
        except StoreError as exc:
            if not isinstance(exc, StoreUnavailable):  # that is logged once a second
                _log.warning("checkpoint_load_failed", error_class=type(exc).__name__)
            return None
        if found is None:
            self._memory[key] = (0, None)
            return None
        version, data = found
        checkpoint = compactor.CompactionCheckpoint.from_bytes(data)
        self._memory[key] = (version, checkpoint)
        return checkpoint

    async def save(self, session_id: str, lane: str,
                   checkpoint: compactor.CompactionCheckpoint) -> None:
        """Keep ``checkpoint`` as the session's latest (memory and store)."""
        key = (session_id, lane)
        try:
            version = await self._store.put_versioned_record(
                session_id, CHECKPOINT_RECORD_PREFIX + lane, checkpoint.to_bytes())
        except StoreError as exc:
            if not isinstance(exc, StoreUnavailable):  # that is logged once a second
                _log.warning("checkpoint_save_failed", error_class=type(exc).__name__)
            # Not in the store: kept only where nobody else writes.
            if not self._store.shared:
                self._memory[key] = (0, checkpoint)
            else:
                self._memory.pop(key, None)
            return
        self._memory[key] = (version, checkpoint)
