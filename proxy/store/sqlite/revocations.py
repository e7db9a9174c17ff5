"""Console logouts in SQLite (:mod:`proxy.store.revocations`): the ``console_revoked``
table, created on first use; rows past their expiry are deleted with each new logout."""

from __future__ import annotations

import sqlite3
import time

from .connection import SQLiteConnection, in_worker, write_transaction

__all__ = ["SQLiteLoginRevocations"]

_TABLE = """CREATE TABLE IF NOT EXISTS console_revoked (
    nonce TEXT PRIMARY KEY,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID"""


class SQLiteLoginRevocations(SQLiteConnection):
    """:class:`~proxy.store.revocations.LoginRevocations` on SQLite."""

    @in_worker
    def revoke_login(self, nonce: str, expires_at: int) -> None:
        now = int(time.time())
        with self._sqlite_errors("revoke login") as conn, write_transaction(conn):
            conn.execute(_TABLE)
            conn.execute("DELETE FROM console_revoked WHERE expires_at <= ?", (now,))
            conn.execute("INSERT INTO console_revoked (nonce, expires_at) VALUES (?, ?)"
                         " ON CONFLICT (nonce) DO NOTHING", (nonce, int(expires_at)))

    @in_worker
    def login_revoked(self, nonce: str) -> bool:
        with self._sqlite_errors("read revoked logins") as conn:
            try:
                row = conn.execute("SELECT 1 FROM console_revoked WHERE nonce = ?"
                                   " AND expires_at > ?", (nonce, int(time.time()))).fetchone()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # nobody ever logged out
                    return False
                raise
        return row is not None
