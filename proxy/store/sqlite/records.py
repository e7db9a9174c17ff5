"""The SQLite store's opaque per-session records (:class:`~proxy.store.base.RecordStore`):
the ``session_record`` table."""

from __future__ import annotations

from .._rows import utc_now
from ..base import CorruptStateError
from .connection import SQLiteConnection

__all__ = ["SQLiteRecords"]


class SQLiteRecords(SQLiteConnection):
    """:class:`~proxy.store.base.RecordStore` on SQLite."""

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        """Return the opaque compaction record ``kind`` of the session, or ``None``."""
        return await self._call(self._get_record, session_id, kind)

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        """Store (replace) the opaque compaction record ``kind`` of the session."""
        await self._call(self._put_record, session_id, kind, bytes(data))

    def _get_record(self, session_id: str, kind: str) -> bytes | None:
        with self._sqlite_errors("read record") as conn:
            row = conn.execute(
                "SELECT data FROM session_record WHERE session_id = ? AND kind = ?",
                (session_id, kind),
            ).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], bytes):
            raise CorruptStateError(session_id, f"record {kind!r} is not a blob")
        return row[0]

    def _put_record(self, session_id: str, kind: str, data: bytes) -> None:
        with self._sqlite_errors("write record") as conn:
            # A single statement is its own atomic transaction in autocommit mode.
            conn.execute(
                "INSERT INTO session_record (session_id, kind, data, updated_at)"
                " VALUES (?, ?, ?, ?)"
                " ON CONFLICT (session_id, kind) DO UPDATE SET data = excluded.data,"
                " updated_at = excluded.updated_at",
                (session_id, kind, data, utc_now().isoformat()),
            )
