"""The SQLite store's opaque per-session records (:class:`~proxy.store.base.RecordStore`):
the ``session_record`` table."""

from __future__ import annotations

from .._rows import utc_now
from ..base import CorruptStateError
from .connection import SQLiteConnection, in_worker

__all__ = ["PUT_RECORD", "SQLiteRecords", "record_data"]

#: Store (replace) a record: ``(session_id, kind, data, updated_at)``.
PUT_RECORD = ("INSERT INTO session_record (session_id, kind, data, updated_at) VALUES (?, ?, ?, ?)"
              " ON CONFLICT (session_id, kind) DO UPDATE SET data = excluded.data,"
              " updated_at = excluded.updated_at")


class SQLiteRecords(SQLiteConnection):
    """:class:`~proxy.store.base.RecordStore` on SQLite."""

    @in_worker
    def get_record(self, session_id: str, kind: str) -> bytes | None:
        with self._sqlite_errors("read record") as conn:
            row = conn.execute(
                "SELECT data FROM session_record WHERE session_id = ? AND kind = ?",
                (session_id, kind),
            ).fetchone()
        return None if row is None else record_data(session_id, kind, row[0])

    @in_worker
    def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        with self._sqlite_errors("write record") as conn:
            # A single statement is its own atomic transaction in autocommit mode.
            conn.execute(PUT_RECORD, (session_id, kind, bytes(data), utc_now().isoformat()))


def record_data(session_id: str, kind: str, data: object) -> bytes:
    """A record's stored data, which must be a blob (else :class:`CorruptStateError`)."""
    if not isinstance(data, bytes):
        raise CorruptStateError(session_id, f"record {kind!r} is not a blob")
    return data
