"""Sticky-compaction checkpoints per session and lane: in memory first, the store behind.

A *lane* is one conversation within a session: the role plus the conversation's key
(:meth:`compactor.CompactionCheckpoint.conversation_key`), so a subagent — or several in
parallel — sharing its parent's session id keeps a checkpoint of its own.

A checkpoint (:class:`compactor.CompactionCheckpoint`) holds the compacted view of a session's
history so far; while the history only grows, the next request reuses that exact prefix (so
the provider's prompt cache keeps hitting) instead of compacting afresh. The in-memory copy
keeps the checkpoint's fast per-process fingerprints; the store's copy survives a restart.
Checkpoints are an optimisation only: a store failure is logged and compaction starts afresh.
"""

from __future__ import annotations

from typing import Final

import structlog
from cachetools import LRUCache

import compactor
from proxy.state.store import RecordStore, StoreError

__all__ = ["CHECKPOINT_RECORD_PREFIX", "SessionCheckpoints"]

_log = structlog.get_logger("proxy.state.checkpoints")

#: Record kind in the store: ``checkpoint:<lane>``.
CHECKPOINT_RECORD_PREFIX: Final = "checkpoint:"
DEFAULT_MAX_ENTRIES: Final = 1024


class SessionCheckpoints:
    """The latest checkpoint of each recent (session, lane). Used from the event loop only.

    Args:
        store: where checkpoints are persisted (``put_record`` / ``get_record``).
        max_entries: how many checkpoints to keep in memory.
    """

    def __init__(self, store: RecordStore, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self._store = store
        # (session, lane) -> its checkpoint, least recently used evicted. None: the store has
        # no checkpoint for it (asked once; this process writes them).
        self._memory: LRUCache[tuple[str, str], compactor.CompactionCheckpoint | None] = (
            LRUCache(maxsize=max_entries)
        )

    async def load(self, session_id: str, lane: str) -> compactor.CompactionCheckpoint | None:
        """The checkpoint to try for this request, or ``None``."""
        key = (session_id, lane)
        try:
            return self._memory[key]
        except KeyError:
            pass
        try:
            data = await self._store.get_record(session_id, CHECKPOINT_RECORD_PREFIX + lane)
        except StoreError as exc:
            _log.warning("checkpoint_load_failed", error_class=type(exc).__name__)
            return None
        checkpoint = compactor.CompactionCheckpoint.from_bytes(data) if data else None
        self._memory[key] = checkpoint
        return checkpoint

    async def save(self, session_id: str, lane: str,
                   checkpoint: compactor.CompactionCheckpoint) -> None:
        """Keep ``checkpoint`` as the session's latest (memory and store)."""
        self._memory[session_id, lane] = checkpoint
        try:
            await self._store.put_record(session_id, CHECKPOINT_RECORD_PREFIX + lane,
                                         checkpoint.to_bytes())
        except StoreError as exc:
            _log.warning("checkpoint_save_failed", error_class=type(exc).__name__)
