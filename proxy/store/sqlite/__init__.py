"""The embedded store backend: one SQLite file, safe for several processes at once.

A worker thread owns the main connection; the two small calls every request makes run on the
event loop's own connection when SQLite can answer at once (:mod:`.connection`). One mixin per
part of ``StoreBackend`` (:mod:`.state`, :mod:`.summaries`, :mod:`.records`, :mod:`.ledger`,
:mod:`.requests`, :mod:`.consistency`), composed in :class:`SQLiteStateStore`; tables in
:mod:`.schema`. WAL, ``BEGIN IMMEDIATE``, durability: docs/operations.md.
"""

from __future__ import annotations

from .connection import CHECKPOINT_EVERY, INLINE_WRITE_MAX_BYTES
from .schema import SCHEMA_VERSION
from .store import SQLiteStateStore

__all__ = ["CHECKPOINT_EVERY", "INLINE_WRITE_MAX_BYTES", "SCHEMA_VERSION", "SQLiteStateStore"]
