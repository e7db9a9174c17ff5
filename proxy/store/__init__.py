"""The per-session store: durable context state with versioned writes, plus the compaction
caches. Handlers depend on :class:`StateStore` only; :class:`SQLiteStateStore` is the
embedded backend."""

from .base import CorruptStateError, StateStore, StoredState, StoreError, VersionConflict
from .sqlite import SQLiteStateStore

__all__ = [
    "CorruptStateError",
    "SQLiteStateStore",
    "StateStore",
    "StoreError",
    "StoredState",
    "VersionConflict",
]
