"""The SQLite store's replica consistency (:class:`~proxy.store.base.ReplicaConsistency`):
the ``record_version`` and ``store_lock`` tables. The two calls every request of a worker
makes (its versions read, its calibration save) run on the event loop's own connection when
SQLite can answer at once (:meth:`~.connection.SQLiteConnection._now`)."""

from __future__ import annotations

import contextlib
import sqlite3
import time

from .._rows import lease_ms, utc_now
from ..base import RecordFetch, SessionVersions
from .connection import (
    CHECKPOINT_EVERY,
    INLINE_WRITE_MAX_BYTES,
    SQLiteConnection,
    in_worker,
    write_transaction,
)
from .records import PUT_RECORD, record_data

__all__ = ["SQLiteConsistency"]


class SQLiteConsistency(SQLiteConnection):
    """:class:`~proxy.store.base.ReplicaConsistency` on SQLite."""

    @property
    def shared(self) -> bool:
        return self._shared

    async def session_versions(self, session_id: str,
                               fetch: RecordFetch | None = None) -> SessionVersions:
        """In one read transaction, on the event loop's own connection when SQLite can
        answer at once (every request of a worker asks)."""
        versions = self._now(_versions_on, session_id, fetch)
        if versions is not None:
            return versions
        return await self._call(self._session_versions, session_id, fetch)

    async def put_versioned_record(self, session_id: str, kind: str, data: bytes) -> int:
        """On the event loop's own connection when the record is small (a calibration,
        saved after every answer) and the write lock is free at once, else in the worker
        thread (a checkpoint's record may be megabytes)."""
        data = bytes(data)
        if len(data) <= INLINE_WRITE_MAX_BYTES and self._loop_commits < CHECKPOINT_EVERY:
            version = self._now(_put_versioned_on, session_id, kind, data,
                                utc_now().isoformat())
            if version is not None:
                self._loop_commits += 1
                return version
        # A large record, a busy file, or the turn of the log to be checkpointed (the loop's
        # connection never does it): the worker thread writes, then checkpoints.
        checkpoint = self._loop_commits >= CHECKPOINT_EVERY
        version = await self._call(self._put_versioned_record, session_id, kind, data,
                                   checkpoint)
        if checkpoint:
            self._loop_commits = 0
        return version

    def _session_versions(self, session_id: str, fetch: RecordFetch | None) -> SessionVersions:
        with self._sqlite_errors("read versions") as conn:
            return _versions_on(conn, session_id, fetch)

    @in_worker
    def get_versioned_record(self, session_id: str, kind: str) -> tuple[int, bytes] | None:
        with self._sqlite_errors("read record") as conn:
            row = conn.execute(
                "SELECT v.version, r.data FROM record_version v JOIN session_record r"
                " ON r.session_id = v.session_id AND r.kind = v.kind"
                " WHERE v.session_id = ? AND v.kind = ?", (session_id, kind)).fetchone()
        return None if row is None else (int(row[0]), record_data(session_id, kind, row[1]))

    def _put_versioned_record(self, session_id: str, kind: str, data: bytes,
                              checkpoint: bool = False) -> int:
        with self._sqlite_errors("write record") as conn:
            version = _put_versioned_on(conn, session_id, kind, data, utc_now().isoformat())
            if checkpoint:
                # The log into the file and emptied; a failure is left to the next one.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return version

    @in_worker
    def acquire_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        ttl_s = lease_ms(ttl_ms) / 1000
        now = time.time()  # wall clock: the one every process on the machine shares
        with self._sqlite_errors("take lock") as conn, write_transaction(conn):
            conn.execute("DELETE FROM store_lock WHERE name = ? AND expires_at <= ?",
                         (name, now))
            taken = conn.execute(
                "INSERT INTO store_lock (name, token, expires_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING", (name, token, now + ttl_s)).rowcount
        return bool(taken == 1)

    @in_worker
    def extend_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        ttl_s = lease_ms(ttl_ms) / 1000
        now = time.time()
        with self._sqlite_errors("extend lock") as conn:
            changed = conn.execute(
                "UPDATE store_lock SET expires_at = ? WHERE name = ? AND token = ?"
                " AND expires_at > ?", (now + ttl_s, name, token, now)).rowcount
        return bool(changed == 1)

    @in_worker
    def release_lock(self, name: str, token: str) -> bool:
        with self._sqlite_errors("release lock") as conn:
            changed = conn.execute("DELETE FROM store_lock WHERE name = ? AND token = ?",
                                   (name, token)).rowcount
        return bool(changed == 1)


def _versions_on(conn: sqlite3.Connection, session_id: str,
                 fetch: RecordFetch | None) -> SessionVersions:
    """:meth:`SQLiteStateStore.session_versions` on ``conn``, in one read transaction (every
    answer from the same snapshot of the file)."""
    fetched: dict[str, tuple[int, bytes]] = {}
    conn.execute("BEGIN")
    try:
        row = conn.execute(
            "SELECT version, updated_at FROM session_state WHERE session_id = ?",
            (session_id,)).fetchone()
        records = {str(kind): int(version) for kind, version in conn.execute(
            "SELECT kind, version FROM record_version WHERE session_id = ?", (session_id,))}
        for kind, version in records.items():
            if fetch is not None and fetch.wants(kind, version):
                data = conn.execute(
                    "SELECT data FROM session_record WHERE session_id = ? AND kind = ?",
                    (session_id, kind)).fetchone()
                if data is not None and isinstance(data[0], bytes):
                    fetched[kind] = (version, data[0])
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
    return SessionVersions(None if row is None else int(row[0]),
                           None if row is None else str(row[1]), records, fetched)


def _put_versioned_on(conn: sqlite3.Connection, session_id: str, kind: str, data: bytes,
                      updated_at: str) -> int:
    """:meth:`SQLiteStateStore.put_versioned_record` on ``conn``: the record and its bumped
    version in one write transaction; returns the new version."""
    with write_transaction(conn):
        conn.execute(PUT_RECORD, (session_id, kind, data, updated_at))
        row = conn.execute(
            "INSERT INTO record_version (session_id, kind, version) VALUES (?, ?, 1)"
            " ON CONFLICT (session_id, kind) DO UPDATE SET version = version + 1"
            " RETURNING version", (session_id, kind)).fetchone()
    return int(row[0])
