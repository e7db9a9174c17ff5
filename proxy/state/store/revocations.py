"""Console logouts every process sees, and that outlive a restart (issue #31).

A console cookie is signed, not stored (:mod:`proxy.console._auth`), so a logout is kept as
the cookie's nonce, revoked until the cookie would have expired anyway; every worker and
replica reading the same store refuses it from then on, after a restart too. The table (or
the Redis keys, :mod:`proxy.state.store.redis_revocations`) is this module's own: SQLite's
``console_revoked`` is created on first use, and rows past their expiry are deleted with
each new logout, so it holds at most the logins of the last ``SESSION_TTL_S``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

__all__ = ["LoginRevocations", "SQLiteLoginRevocations"]

_T = TypeVar("_T")

_TABLE = """CREATE TABLE IF NOT EXISTS console_revoked (
    nonce TEXT PRIMARY KEY,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID"""


@runtime_checkable
class LoginRevocations(Protocol):
    """Where revoked console logins are kept."""

    async def revoke_login(self, nonce: str, expires_at: int) -> None:
        """Refuse the login ``nonce`` until ``expires_at`` (Unix seconds)."""

    async def login_revoked(self, nonce: str) -> bool:
        """Whether the login ``nonce`` was revoked (and has not expired since)."""


class SQLiteLoginRevocations:
    """:class:`LoginRevocations` for :class:`~proxy.state.store.SQLiteStateStore` (a mixin:
    its worker thread and connection do the work)."""

    if TYPE_CHECKING:
        def _call(self, fn: Callable[..., _T], *args: Any) -> Awaitable[_T]: ...
        def _sqlite_errors(self, action: str
                           ) -> AbstractContextManager[sqlite3.Connection]: ...
        def _immediate(self, conn: sqlite3.Connection) -> AbstractContextManager[None]: ...

    async def revoke_login(self, nonce: str, expires_at: int) -> None:
        """Keep the revocation; drop the ones whose cookies have expired."""
        await self._call(self._revoke_login, nonce, int(expires_at), int(time.time()))

    async def login_revoked(self, nonce: str) -> bool:
        """One indexed read."""
        return await self._call(self._login_revoked, nonce, int(time.time()))

    def _revoke_login(self, nonce: str, expires_at: int, now: int) -> None:
        with self._sqlite_errors("revoke login") as conn, self._immediate(conn):
            conn.execute(_TABLE)
            conn.execute("DELETE FROM console_revoked WHERE expires_at <= ?", (now,))
            conn.execute("INSERT INTO console_revoked (nonce, expires_at) VALUES (?, ?)"
                         " ON CONFLICT (nonce) DO NOTHING", (nonce, expires_at))

    def _login_revoked(self, nonce: str, now: int) -> bool:
        with self._sqlite_errors("read revoked logins") as conn:
            try:
                row = conn.execute("SELECT 1 FROM console_revoked WHERE nonce = ?"
                                   " AND expires_at > ?", (nonce, now)).fetchone()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # nobody ever logged out
                    return False
                raise
        return row is not None
