"""The SQLite store's durable-state writes, each one transaction with the change it records.

A deleted state leaves a tombstone (``state_tombstone``: its last version), and a state created
again starts after it, so versions are never reused (docs/admin.md). Every ``*_on`` function
runs in the worker thread inside :func:`~.connection.write_transaction`.
"""

from __future__ import annotations

import dataclasses
import sqlite3

from compactor import DurableContextState
from proxy.audit.log import StateChange, utc_iso

from .._rows import check_change, check_type, decode_state, encode_audit, encode_state, utc_now
from ..base import CorruptStateError, StoredState, VersionConflict
from .connection import SQLiteConnection, in_worker, write_transaction

__all__ = ["SQLiteState", "add_change_on"]


class SQLiteState(SQLiteConnection):
    """:class:`~proxy.store.base.StateStore` on SQLite."""

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None,
                        change: StateChange | None = None) -> StoredState:
        check_type("state", state, DurableContextState)
        check_change(session_id, change, "put")
        # Encoded here: a state that cannot be encoded fails before any lock is taken.
        return await self._call(self._put_state, session_id, state, encode_state(state),
                                expected_version, change)

    async def delete_state(self, session_id: str, expected_version: int | None = None,
                           change: StateChange | None = None) -> bool:
        check_change(session_id, change, "delete")
        return await self._call(self._delete_state, session_id, expected_version, change)

    @in_worker
    def get_state(self, session_id: str) -> StoredState | None:
        with self._sqlite_errors("read state") as conn:
            row = conn.execute(
                "SELECT version, state_json, updated_at FROM session_state WHERE session_id = ?",
                (session_id,),
            ).fetchone()
        if row is None:
            return None
        version, state_json, updated_at = row
        if not isinstance(version, int) or version < 1:
            raise CorruptStateError(session_id, f"version is {version!r}, not an integer >= 1")
        if not isinstance(state_json, str):
            raise CorruptStateError(session_id, f"state_json is {type(state_json).__name__}")
        return decode_state(session_id, version, state_json, str(updated_at))

    def _put_state(self, session_id: str, state: DurableContextState, state_json: str,
                   expected_version: int | None, change: StateChange | None) -> StoredState:
        """Write the state if its version is ``expected_version`` (else :class:`VersionConflict`),
        with ``change`` at the version written, in one transaction."""
        when = utc_now()
        with self._sqlite_errors("write state") as conn, write_transaction(conn):
            current = _current(conn, session_id)
            if current != expected_version:
                raise VersionConflict(session_id, expected_version, current)
            if current is None:
                row = conn.execute("DELETE FROM state_tombstone WHERE session_id = ?"
                                   " RETURNING version", (session_id,)).fetchone()
                new_version = 1 if row is None else int(row[0]) + 1
            else:
                new_version = current + 1
            conn.execute(
                "INSERT INTO session_state (session_id, version, state_json, updated_at)"
                " VALUES (?, ?, ?, ?)"
                " ON CONFLICT (session_id) DO UPDATE SET version = excluded.version,"
                " state_json = excluded.state_json, updated_at = excluded.updated_at",
                (session_id, new_version, state_json, when.isoformat()))
            if change is not None:
                add_change_on(conn, dataclasses.replace(change, version=new_version),
                              *self._change_bounds())
        return StoredState(session_id=session_id, version=new_version, state=state,
                           updated_at=when)

    def _delete_state(self, session_id: str, expected_version: int | None,
                      change: StateChange | None) -> bool:
        """Delete the state (if at ``expected_version``, when given, else
        :class:`VersionConflict`), leaving its tombstone; ``False`` when there was none."""
        with self._sqlite_errors("delete state") as conn, write_transaction(conn):
            current = _current(conn, session_id)
            if current is None:
                return False
            if expected_version is not None and current != expected_version:
                raise VersionConflict(session_id, expected_version, current)
            conn.execute("DELETE FROM session_state WHERE session_id = ?", (session_id,))
            conn.execute("INSERT INTO state_tombstone (session_id, version) VALUES (?, ?)"
                         " ON CONFLICT (session_id) DO UPDATE SET"
                         " version = max(version, excluded.version)", (session_id, current))
            if change is not None:
                add_change_on(conn, change, *self._change_bounds())
        return True


def _current(conn: sqlite3.Connection, session_id: str) -> int | None:
    row = conn.execute("SELECT version FROM session_state WHERE session_id = ?",
                       (session_id,)).fetchone()
    return None if row is None else int(row[0])


def add_change_on(conn: sqlite3.Connection, change: StateChange, max_changes: int,
                  cutoff: str) -> None:
    """Insert ``change`` and trim its session's changes to the newest ``max_changes`` and
    those at or after ``cutoff``, in the caller's transaction."""
    conn.execute("INSERT INTO audit_change (tenant, session_id, at, change) VALUES (?, ?, ?, ?)",
                 (change.tenant, change.session_id, utc_iso(change.at),
                  encode_audit(change)))
    conn.execute(
        "DELETE FROM audit_change WHERE seq IN (SELECT seq FROM audit_change"
        " WHERE tenant = ? AND session_id = ? ORDER BY at DESC, seq DESC LIMIT -1 OFFSET ?)",
        (change.tenant, change.session_id, max_changes))
    conn.execute("DELETE FROM audit_change WHERE tenant = ? AND session_id = ? AND at < ?",
                 (change.tenant, change.session_id, cutoff))
