"""The SQLite store's durable-state writes, each one transaction with the change it records.

*Versions are never reused.* A deleted state leaves a tombstone, ``state_tombstone``: its
session and last version. A state created again starts after it (and the tombstone goes), so
a writer still holding the ETag of the deleted state, or of any earlier one, gets a conflict,
never a silent overwrite of the new state.

*A write and its change record are one transaction.* The admin API and the console hand the
:class:`~proxy.state.audit_log.StateChange` to the write; it is inserted (with the version
written) and the session's changes trimmed in the write's own transaction, so a crash or a
failed insert leaves both or neither.

Every function here runs in the store's worker thread on its connection, inside
:func:`write_transaction` (``BEGIN IMMEDIATE``: the compare-and-swap's read and write under
SQLite's one write lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import Iterator
from typing import Final

from proxy.state.audit_log import StateChange

from ._rows import audit_stamp, encode_audit
from .base import VersionConflict

__all__ = ["TOMBSTONE_SCHEMA", "add_change", "delete_state", "put_state", "write_transaction"]

#: The tombstones of deleted states (a new table: files from before get it when opened).
TOMBSTONE_SCHEMA: Final = """CREATE TABLE IF NOT EXISTS state_tombstone (
        session_id TEXT PRIMARY KEY,
        version INTEGER NOT NULL
    ) WITHOUT ROWID"""


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction holding the write lock from its first statement."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        # SQLite may already have rolled back by itself (e.g. disk full); a second
        # ROLLBACK would raise and hide the original error.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _current(conn: sqlite3.Connection, session_id: str) -> int | None:
    row = conn.execute("SELECT version FROM session_state WHERE session_id = ?",
                       (session_id,)).fetchone()
    return None if row is None else int(row[0])


def put_state(conn: sqlite3.Connection, session_id: str, state_json: str, updated_at: str,
              expected_version: int | None, change: StateChange | None, max_changes: int,
              cutoff: str) -> int:
    """Write the state if its version is ``expected_version``, with ``change`` (its version
    set to the one written) when given; returns the version written.

    Raises:
        VersionConflict: the stored version is another; nothing was written.
    """
    with write_transaction(conn):
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
            (session_id, new_version, state_json, updated_at))
        if change is not None:
            add_change(conn, dataclasses.replace(change, version=new_version), max_changes,
                       cutoff)
    return new_version


def delete_state(conn: sqlite3.Connection, session_id: str, expected_version: int | None,
                 change: StateChange | None, max_changes: int, cutoff: str) -> bool:
    """Delete the state (if at ``expected_version``, when given), leaving its tombstone, with
    ``change`` when given; ``False`` when there was none (nothing recorded).

    Raises:
        VersionConflict: the stored version is another; nothing was deleted.
    """
    with write_transaction(conn):
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
            add_change(conn, change, max_changes, cutoff)
    return True


def add_change(conn: sqlite3.Connection, change: StateChange, max_changes: int,
               cutoff: str) -> None:
    """Insert ``change`` and trim its session's changes to the newest ``max_changes`` and
    those at or after ``cutoff``, in the caller's transaction."""
    conn.execute("INSERT INTO audit_change (tenant, session_id, at, change) VALUES (?, ?, ?, ?)",
                 (change.tenant, change.session_id, audit_stamp(change.at),
                  encode_audit(change)))
    conn.execute(
        "DELETE FROM audit_change WHERE seq IN (SELECT seq FROM audit_change"
        " WHERE tenant = ? AND session_id = ? ORDER BY at DESC, seq DESC LIMIT -1 OFFSET ?)",
        (change.tenant, change.session_id, max_changes))
    conn.execute("DELETE FROM audit_change WHERE tenant = ? AND session_id = ? AND at < ?",
                 (change.tenant, change.session_id, cutoff))
