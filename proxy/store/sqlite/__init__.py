"""The embedded store backend: one SQLite file, safe for several processes at once.

A worker thread owns the main connection; the two small calls every request makes run on the
event loop's own connection when SQLite can answer at once (:mod:`.connection`). One mixin per
part of ``StoreBackend`` (:mod:`.state`, :mod:`.summaries`, :mod:`.records`, :mod:`.ledger`,
:mod:`.requests`, :mod:`.consistency`), composed in :class:`SQLiteStateStore`; tables in
:mod:`.schema`. WAL, ``BEGIN IMMEDIATE``, durability: docs/operations.md.
"""

from __future__ import annotations

from .connection import CHECKPOINT_EVERY, INLINE_WRITE_MAX_BYTES
from .consistency import SQLiteConsistency
from .ledger import SQLiteLedger
from .records import SQLiteRecords
from .requests import SQLiteRequestLog
from .revocations import SQLiteLoginRevocations
from .schema import SCHEMA_VERSION
from .state import SQLiteState
from .summaries import SQLiteSummaries

__all__ = ["CHECKPOINT_EVERY", "INLINE_WRITE_MAX_BYTES", "SCHEMA_VERSION", "SQLiteStateStore"]


class SQLiteStateStore(SQLiteState, SQLiteSummaries, SQLiteRecords, SQLiteLedger,
                       SQLiteRequestLog, SQLiteConsistency, SQLiteLoginRevocations):
    """The :class:`~proxy.store.base.StoreBackend` backed by one SQLite file, created (private:
    :mod:`proxy.store.private_files`) and its schema checked on first use or by :meth:`open`.

    Args:
        max_summaries: how many summaries the cache keeps before evicting the oldest.
        busy_timeout_s: how long a write waits for another writer's lock before failing.
        max_requests_per_session, retention_days: the audit log's bounds (``audit.*``).
        shared: whether other processes serve from the same file (``listen.workers`` > 1).
        audit_linger_s: how long the first audit entry of a batch waits for others.
    """
