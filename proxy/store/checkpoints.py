"""Sticky-compaction checkpoints per session and lane: in memory first, the store behind.

A *lane* is one conversation within a session: the role plus the conversation's key
(:meth:`compactor.CompactionCheckpoint.conversation_key`), so a subagent — or several in
parallel — sharing its parent's session id keeps a checkpoint of its own.

A checkpoint (:class:`compactor.CompactionCheckpoint`) holds the compacted view of a session's
history so far; while the history only grows, the next request reuses that exact prefix (so
the provider's prompt cache keeps hitting) instead of compacting afresh. The store's copy
survives a restart and is what every replica sharing the store reuses: it holds the covered
messages' fingerprints, which are the same in every process (any ``PYTHONHASHSEED``).
Checkpoints are an optimisation only: a store failure is logged and compaction starts afresh.

Any replica, the same view
--------------------------
Compaction is deterministic: **the same history, the same policy (after the calibrated
thresholds), the same summaries (the store's summary cache, content-addressed per tenant), the
same calibration inputs (the session's factors and per-message counts, shared through the
store) and the same checkpoint give the same bytes**, in any process. The checkpoint is the
one input a replica could hold privately, so each copy in memory is kept with the store's
*version* of that (session, lane) record (written with
:meth:`~proxy.store.base.ReplicaConsistency.put_versioned_record`, which bumps the
version in the same atomic step) and is used only while the store's current version is that
one. The current versions come with the request's state read
(:func:`proxy.store.read_cache.request_versions`: one round trip for the state, every
lane's checkpoint and the calibration); the checkpoint itself is read only when its version
changed. A miss (no checkpoint) is remembered the same way — against "the store has no
version" — so a checkpoint another replica wrote since is never hidden. When the store is not
shared (SQLite with one worker, :attr:`~proxy.store.base.ReplicaConsistency.shared`),
this process writes every checkpoint and its memory stays authoritative.
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
    """The latest checkpoint of each recent (session, lane). Used from the event loop only.

    Args:
        store: where checkpoints are persisted (versioned records).
        max_entries: how many checkpoints to keep in memory.
    """

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
                versions = request_versions(self._store, session_id)
                if versions is None:
                    versions = await self._store.session_versions(session_id)
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
