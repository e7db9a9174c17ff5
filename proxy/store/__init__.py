"""The per-session store: durable context state with versioned writes, plus the compaction
caches, the usage ledger and the audit log. Callers depend on the part they use
(:class:`StateStore`, :class:`SummaryCache`, :class:`RecordStore`, :class:`UsageLedger`,
:class:`RequestLog`); a backend implements all of them (:class:`StoreBackend`).
:class:`SQLiteStateStore` is the embedded backend, :class:`RedisStateStore` the one several
proxy processes can share; it (and redis-py) is imported only when first named."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    CorruptStateError,
    RecordFetch,
    RecordStore,
    ReplicaConsistency,
    RequestLog,
    SessionVersions,
    StateStore,
    StoreBackend,
    StoredState,
    StoreError,
    StoreUnavailable,
    SummaryCache,
    UsageLedger,
    UsageRow,
    VersionConflict,
)
from .read_cache import CachedStateReads
from .sqlite import SQLiteStateStore

if TYPE_CHECKING:
    from proxy.config import Config

    from .redis import RedisStateStore

__all__ = [
    "CachedStateReads",
    "CorruptStateError",
    "RecordFetch",
    "RecordStore",
    "RedisStateStore",
    "ReplicaConsistency",
    "RequestLog",
    "SQLiteStateStore",
    "SessionVersions",
    "StateStore",
    "StoreBackend",
    "StoreError",
    "StoreUnavailable",
    "StoredState",
    "SummaryCache",
    "UsageLedger",
    "UsageRow",
    "VersionConflict",
    "store_for",
]


def store_for(config: Config) -> StoreBackend:
    """The configured store, not yet opened, keeping the audit log within ``audit.*``'s
    bounds (:class:`~proxy.config.ConfigError` for an unusable ``store.url``)."""
    from proxy.config import ConfigError

    audit = config.audit
    if config.store.backend == "redis":
        from .redis import RedisStateStore

        assert config.store.url is not None  # StoreConfig requires it for redis
        try:
            return RedisStateStore(config.store.url, mode=config.store.redis_mode,
                                   sentinel_service=config.store.sentinel_service,
                                   max_requests_per_session=audit.max_requests_per_session,
                                   retention_days=audit.retention_days)
        except ValueError as exc:
            raise ConfigError("store.url", str(exc)) from None
    return SQLiteStateStore(config.store.path,
                            max_requests_per_session=audit.max_requests_per_session,
                            retention_days=audit.retention_days,
                            # Other workers serve from the same file: check their writes.
                            shared=config.listen.workers > 1)


def __getattr__(name: str) -> Any:
    # PEP 562: only the redis backend is loaded on demand.
    if name == "RedisStateStore":
        from .redis import RedisStateStore

        globals()[name] = RedisStateStore
        return RedisStateStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
