"""The embedded store backend: one SQLite file, safe for several processes at once.

One dedicated thread owns the main connection, so the event loop never blocks on disk or on
another process's lock, and calls run in order without a lock. Two small calls each request
makes (its session's versions read, the calibration's save) run on the loop's own connection,
which never waits: a busy file, a large record or a due checkpoint sends them to the thread.
Every write opens ``BEGIN IMMEDIATE`` (the write lock up front), so a compare-and-swap has one
winner per version across tasks and processes; a deleted state leaves a tombstone, so versions
are never reused. WAL with ``synchronous=NORMAL``: the request path's writes are caches, and a
rolled-back admin write reads as an older version (a clean 409).

One mixin per part of ``StoreBackend`` over :class:`~.connection.SQLiteConnection` (:mod:`.state`,
:mod:`.summaries`, :mod:`.records`, :mod:`.ledger`, :mod:`.requests`, :mod:`.consistency`),
composed in :class:`SQLiteStateStore`; tables in :mod:`.schema`. For operators: docs/operations.md.
"""

from __future__ import annotations

from .connection import CHECKPOINT_EVERY, INLINE_WRITE_MAX_BYTES
from .schema import SCHEMA_VERSION
from .store import SQLiteStateStore

__all__ = ["CHECKPOINT_EVERY", "INLINE_WRITE_MAX_BYTES", "SCHEMA_VERSION", "SQLiteStateStore"]
