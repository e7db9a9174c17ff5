"""The SQLite store's summary cache (:class:`~proxy.store.base.SummaryCache`): the
``summary_cache`` table, whose rowid orders the entries by age."""

from __future__ import annotations

from ..base import CorruptStateError
from .connection import SQLiteConnection, in_worker, write_transaction

__all__ = ["SQLiteSummaries"]


class SQLiteSummaries(SQLiteConnection):
    """:class:`~proxy.store.base.SummaryCache` on SQLite."""

    @in_worker
    def get_summary(self, key: str) -> str | None:
        with self._sqlite_errors("read summary") as conn:
            row = conn.execute("SELECT text FROM summary_cache WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], str):
            raise CorruptStateError(f"<summary {key}>", "summary text is not a string")
        return row[0]

    @in_worker
    def put_summary(self, key: str, text: str) -> None:
        with self._sqlite_errors("write summary") as conn, write_transaction(conn):
            # Content-addressed: a key already cached keeps its text and its age.
            conn.execute(
                "INSERT INTO summary_cache (key, text) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                (key, text),
            )
            # Everything at or below the seq of the (max_summaries + 1)-th newest row goes.
            conn.execute(
                "DELETE FROM summary_cache WHERE seq <= ("
                " SELECT seq FROM summary_cache ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (self.max_summaries,),
            )
