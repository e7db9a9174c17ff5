"""The SQLite store: every part of :class:`~proxy.store.base.StoreBackend`, each from
its module, over one connection (:mod:`.connection`)."""

from __future__ import annotations

from .consistency import SQLiteConsistency
from .ledger import SQLiteLedger
from .records import SQLiteRecords
from .requests import SQLiteRequestLog
from .revocations import SQLiteLoginRevocations
from .state import SQLiteState
from .summaries import SQLiteSummaries

__all__ = ["SQLiteStateStore"]


class SQLiteStateStore(SQLiteState, SQLiteSummaries, SQLiteRecords, SQLiteLedger,
                       SQLiteRequestLog, SQLiteConsistency, SQLiteLoginRevocations):
    """The :class:`~proxy.store.base.StoreBackend` backed by one SQLite file, created (private:
    :mod:`proxy.store.private_files`) and its schema checked on first use or by :meth:`open`.

    Args:
        max_summaries: how many summaries the cache keeps before evicting the oldest.
        busy_timeout_s: how long a write waits for another writer's lock before failing.
        max_requests_per_session, retention_days: the audit log's bounds (``audit.*``).
        shared: whether other processes serve from the same file (``listen.workers`` > 1):
            then in-memory copies are checked against the file's versions on every request.
        audit_linger_s: how long the first audit entry of a batch waits for others.
    """
