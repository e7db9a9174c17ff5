"""The SQLite store's audit log (:class:`~proxy.audit.log.RequestLog`): the
``audit_request``, ``audit_session`` and ``audit_change`` tables, written in batches and
trimmed in the same transaction (see :mod:`proxy.store.sqlite`)."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import datetime
from typing import Any

from proxy.audit.log import RequestEntry, SessionOrder, SessionSummary, StateChange, utc_iso

from .._rows import check_page, check_type, decode_audit, encode_audit, retention_cutoff
from ..base import CorruptStateError, StoreError
from .connection import SQLiteConnection, in_worker, write_transaction
from .state import add_change_on

__all__ = ["SQLiteRequestLog"]

_INSERT_REQUEST = (
    "INSERT INTO audit_request (tenant, session_id, at, tokens_before, tokens_after, blocked,"
    " entry) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_ADD_SESSION_TOTALS = (
    "INSERT INTO audit_session (tenant, session_id, last_seen, requests, tokens_before,"
    " tokens_after, blocked) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (tenant, session_id) DO UPDATE SET"
    " last_seen = max(last_seen, excluded.last_seen), requests = requests + excluded.requests,"
    " tokens_before = tokens_before + excluded.tokens_before,"
    " tokens_after = tokens_after + excluded.tokens_after, blocked = blocked + excluded.blocked"
    " RETURNING requests"
)
_SUBTRACT_SESSION_TOTALS = (
    "UPDATE audit_session SET requests = requests - ?, tokens_before = tokens_before - ?,"
    " tokens_after = tokens_after - ?, blocked = blocked - ? WHERE tenant = ? AND session_id = ?"
)
_SESSION_COLUMNS = "tenant, session_id, last_seen, requests, tokens_before, tokens_after, blocked"
#: ORDER BY of each session order; ties go the same way every time.
_SESSION_ORDERS: dict[str, str] = {
    "last_seen": "last_seen DESC, tenant DESC, session_id DESC",
    "blocked": "blocked DESC, last_seen DESC, tenant DESC, session_id DESC",
}


class SQLiteRequestLog(SQLiteConnection):
    """:class:`~proxy.audit.log.RequestLog` on SQLite."""

    def add_request(self, entry: RequestEntry) -> asyncio.Future[None]:
        """Batched (:class:`~proxy.store.audit_batches.AuditBatches`): one transaction, and
        one encoding loop in the worker thread, serve many requests."""
        check_type("entry", entry, RequestEntry)
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        return self._batches.add(entry)

    async def flush(self) -> None:
        await self._batches.flush()

    async def _write_requests(self, entries: list[RequestEntry]) -> None:
        await self._call(self._add_requests, entries)

    async def add_state_change(self, change: StateChange) -> None:
        check_type("change", change, StateChange)
        await self._call(self._add_state_change, change)

    async def sessions(self, *, offset: int = 0, limit: int = 50, contains: str | None = None,
                       order: SessionOrder = "last_seen",
                       tenant: str | None = None) -> tuple[list[SessionSummary], int]:
        check_page(offset, limit, order)
        await self._batches.flush()  # this process's entries are read too
        return await self._call(self._sessions, offset, limit, contains, order, tenant)

    async def session_requests(self, tenant: str, session_id: str, *, offset: int = 0,
                               limit: int = 100) -> tuple[list[RequestEntry], int]:
        check_page(offset, limit)
        await self._batches.flush()  # this process's entries are read too
        return await self._call(self._session_requests, tenant, session_id, offset, limit)

    async def state_changes(self, tenant: str, session_id: str, *,
                            limit: int = 100) -> list[StateChange]:
        check_page(0, limit)
        return await self._call(self._state_changes, tenant, session_id, limit)

    async def blocked_since(self, since: datetime, *, limit: int = 1000) -> list[RequestEntry]:
        check_page(0, limit)
        await self._batches.flush()  # this process's entries are read too
        return await self._call(self._blocked_since, utc_iso(since), limit)

    # -- worker-thread side -------------------------------------------------------------------

    def _add_requests(self, batch: list[RequestEntry]) -> None:
        """Write a batch in one transaction, trimming each session it touched (an entry that
        cannot be encoded fails the batch, as a failed write does)."""
        cutoff = self._change_bounds()[1]
        rows = []
        # (tenant, session id) -> [last_seen, requests, tokens_before, tokens_after, blocked]
        totals: dict[tuple[str, str], list[Any]] = {}
        for entry in batch:
            before, after = entry.tokens_before or 0, entry.tokens_after or 0
            blocked, when = int(entry.blocked), utc_iso(entry.at)
            rows.append((entry.tenant, entry.session_id, when, before, after, blocked,
                         encode_audit(entry)))
            sums = totals.setdefault((entry.tenant, entry.session_id), [when, 0, 0, 0, 0])
            sums[0] = max(sums[0], when)
            for index, value in enumerate((1, before, after, blocked), start=1):
                sums[index] += value
        with self._sqlite_errors("add audit entries") as conn, write_transaction(conn):
            conn.executemany(_INSERT_REQUEST, rows)
            for (tenant, session_id), sums in totals.items():
                (held,) = conn.execute(_ADD_SESSION_TOTALS,
                                       (tenant, session_id, *sums)).fetchone()
                if held > self.max_requests_per_session:
                    self._trim_excess(conn, tenant, session_id,
                                      held - self.max_requests_per_session)
                self._trim_older(conn, cutoff, tenant, session_id)

    def _trim_excess(self, conn: sqlite3.Connection, tenant: str, session_id: str,
                     count: int) -> None:
        """Delete the session's ``count`` oldest rows, subtracting them from its totals."""
        excess = conn.execute(
            "SELECT seq, tokens_before, tokens_after, blocked FROM audit_request"
            " WHERE tenant = ? AND session_id = ? ORDER BY at, seq LIMIT ?",
            (tenant, session_id, count)).fetchall()
        conn.execute(_SUBTRACT_SESSION_TOTALS, (
            len(excess), sum(row[1] for row in excess), sum(row[2] for row in excess),
            sum(row[3] for row in excess), tenant, session_id))
        conn.executemany("DELETE FROM audit_request WHERE seq = ?", [(row[0],) for row in excess])

    def _add_state_change(self, change: StateChange) -> None:
        with self._sqlite_errors("add state change") as conn, write_transaction(conn):
            add_change_on(conn, change, *self._change_bounds())

    def _trim_older(self, conn: sqlite3.Connection, cutoff: str,
                    tenant: str | None = None, session_id: str | None = None) -> int:
        """Delete the audit rows older than ``cutoff`` (in the caller's transaction) of one
        session, or of every session, keeping the totals right; returns how many went."""
        scope, args = ("tenant = ? AND session_id = ? AND ", (tenant, session_id)
                       ) if session_id is not None else ("", ())
        gone = conn.execute(
            "SELECT tenant, session_id, COUNT(*), SUM(tokens_before), SUM(tokens_after),"
            f" SUM(blocked) FROM audit_request WHERE {scope}at < ? GROUP BY tenant, session_id",
            (*args, cutoff)).fetchall()
        removed = 0
        if gone:
            conn.executemany(_SUBTRACT_SESSION_TOTALS,
                             [(count, before, after, blocked, tenant, session_id)
                              for tenant, session_id, count, before, after, blocked in gone])
            removed += conn.execute(f"DELETE FROM audit_request WHERE {scope}at < ?",
                                    (*args, cutoff)).rowcount
            conn.execute("DELETE FROM audit_session WHERE requests <= 0")
        removed += conn.execute(f"DELETE FROM audit_change WHERE {scope}at < ?",
                                (*args, cutoff)).rowcount
        return removed

    @in_worker
    def trim(self, now: datetime) -> int:
        cutoff = utc_iso(retention_cutoff(now, self.retention_days))
        with self._sqlite_errors("trim the audit log") as conn, write_transaction(conn):
            return self._trim_older(conn, cutoff)

    def _sessions(self, offset: int, limit: int, contains: str | None, order: str,
                  tenant: str | None) -> tuple[list[SessionSummary], int]:
        where, args = [], []
        if contains:
            where.append("instr(lower(session_id), lower(?)) > 0")
            args.append(contains)
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._sqlite_errors("read audit sessions") as conn:
            total = conn.execute(f"SELECT COUNT(*) FROM audit_session{clause}",
                                 args).fetchone()[0]
            rows = conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM audit_session{clause}"
                f" ORDER BY {_SESSION_ORDERS[order]} LIMIT ? OFFSET ?",
                (*args, limit, offset)).fetchall()
        return [_summary(row) for row in rows], int(total)

    def _session_requests(self, tenant: str, session_id: str, offset: int,
                          limit: int) -> tuple[list[RequestEntry], int]:
        with self._sqlite_errors("read audit entries") as conn:
            total = conn.execute(
                "SELECT COUNT(*) FROM audit_request WHERE tenant = ? AND session_id = ?",
                (tenant, session_id)).fetchone()[0]
            rows = conn.execute(
                "SELECT entry FROM audit_request WHERE tenant = ? AND session_id = ?"
                " ORDER BY at DESC, seq DESC LIMIT ? OFFSET ?",
                (tenant, session_id, limit, offset)).fetchall()
        return [decode_audit(RequestEntry, row[0]) for row in rows], int(total)

    def _state_changes(self, tenant: str, session_id: str, limit: int) -> list[StateChange]:
        with self._sqlite_errors("read state changes") as conn:
            rows = conn.execute(
                "SELECT change FROM audit_change WHERE tenant = ? AND session_id = ?"
                " ORDER BY at DESC, seq DESC LIMIT ?",
                (tenant, session_id, limit)).fetchall()
        return [decode_audit(StateChange, row[0]) for row in rows]

    def _blocked_since(self, since: str, limit: int) -> list[RequestEntry]:
        with self._sqlite_errors("read blocked requests") as conn:
            rows = conn.execute(
                "SELECT entry FROM audit_request WHERE blocked = 1 AND at >= ?"
                " ORDER BY at, seq LIMIT ?", (since, limit)).fetchall()
        return [decode_audit(RequestEntry, row[0]) for row in rows]


def _summary(row: tuple[Any, ...]) -> SessionSummary:
    tenant, session_id, last_seen, requests, before, after, blocked = row
    try:
        when = datetime.fromisoformat(last_seen)
    except (TypeError, ValueError):
        raise CorruptStateError("<audit log>", "a session's last_seen is not an ISO time"
                                ) from None
    return SessionSummary(session_id=str(session_id), tenant=str(tenant), last_seen=when,
                          requests=int(requests), tokens_before=int(before),
                          tokens_after=int(after), blocked=int(blocked))
