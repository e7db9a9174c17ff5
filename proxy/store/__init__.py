"""The per-session store: durable context state with versioned writes, plus the compaction
caches. Handlers depend on :class:`StateStore` only; :class:`SQLiteStateStore` is the
embedded backend, :class:`RedisStateStore` the one several proxy processes can share."""

from .base import CorruptStateError, StateStore, StoredState, StoreError, VersionConflict
from .read_cache import CachedStateReads
from .redis import RedisStateStore
from .sqlite import SQLiteStateStore

__all__ = [
    "CachedStateReads",
    "CorruptStateError",
    "RedisStateStore",
    "SQLiteStateStore",
    "StateStore",
    "StoreError",
    "StoredState",
    "VersionConflict",
]
