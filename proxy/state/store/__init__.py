"""The per-session store: durable context state with versioned writes, plus the compaction
caches. Callers depend on the part they use (:class:`StateStore`, :class:`SummaryCache`,
:class:`RecordStore`); a backend implements all of them (:class:`StoreBackend`).
:class:`SQLiteStateStore` is the embedded backend, :class:`RedisStateStore` the one several
proxy processes can share; it (and redis-py) is imported only when first named."""

from typing import TYPE_CHECKING, Any

from .base import (
    CorruptStateError,
    RecordStore,
    StateStore,
    StoreBackend,
    StoredState,
    StoreError,
    SummaryCache,
    VersionConflict,
)
from .read_cache import CachedStateReads
from .sqlite import SQLiteStateStore

if TYPE_CHECKING:
    from .redis import RedisStateStore

__all__ = [
    "CachedStateReads",
    "CorruptStateError",
    "RecordStore",
    "RedisStateStore",
    "SQLiteStateStore",
    "StateStore",
    "StoreBackend",
    "StoreError",
    "StoredState",
    "SummaryCache",
    "VersionConflict",
]


def __getattr__(name: str) -> Any:
    # PEP 562: only the redis backend is loaded on demand.
    if name == "RedisStateStore":
        from .redis import RedisStateStore

        globals()[name] = RedisStateStore
        return RedisStateStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
