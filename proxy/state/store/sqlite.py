"""The embedded store backend: one SQLite file, safe for several processes at once.

Theory of operation
-------------------
*One thread owns the connection.* Every sqlite call runs in a single dedicated worker thread
(a one-worker ``ThreadPoolExecutor``), reached through ``loop.run_in_executor``; the event loop
never blocks on disk I/O or on another process's lock. Because that one thread does all the
work, calls are executed in the order they were made and the connection needs no lock.

*But for two small calls, done at once on the loop.* A worker (``shared``) reads its session's
versions on every request and saves the calibration each answer taught: a hop to the thread
and back costs ~100 µs of CPU, the read ~10 and the commit ~50. Those two run on the event
loop's own connection (:meth:`SQLiteStateStore._now`), which never waits (``timeout=0``: a
busy file sends the call to the thread, which waits), never creates the file and never
checkpoints (every :data:`CHECKPOINT_EVERY` of its commits a write goes to the thread, which
checkpoints after it); a record over :data:`INLINE_WRITE_MAX_BYTES` goes to the thread. In
WAL mode a reader is not blocked by a writer and a commit appends to the log without a sync,
so neither waits on the disk.

*Compare-and-swap in one transaction.* A write opens ``BEGIN IMMEDIATE``, which takes SQLite's
single write lock up front (waiting up to the busy timeout for another writer, in this process
or another), then reads the current version, checks it against the caller's and writes, then
commits. Nobody can write between the check and the write, so of several writers racing from
the same version exactly one wins; the others see the new version and get ``VersionConflict``.
A deleted state leaves a tombstone with its last version, and the change the admin API or the
console records goes in the write's own transaction (:mod:`._sqlite_state`): versions are never
reused, and a write is never kept without its change record.

*Durability.* The file runs in WAL mode (readers never block the writer and vice versa) with
``synchronous=NORMAL``. In WAL mode NORMAL never corrupts the database and loses nothing when
the process crashes; only an OS crash or power cut may roll back the last few commits, because
the WAL is fsynced at checkpoints rather than at every commit. We accept that: the compaction
records and summaries written on the request path are caches, and an admin write that is
rolled back shows up as an older version, so the admin's next ``If-Match`` gets a clean 409
rather than a silent overwrite. FULL would fsync on every commit of the request path.

*The audit log* is three tables: ``audit_request`` (one row per request: its indexed columns
and the entry's JSON), ``audit_session`` (each session's running totals, kept in the same
transaction as the rows they add up, so a page of sessions reads one small table) and
``audit_change`` (the state changes). Request entries that arrive within a few milliseconds of
each other, or while a write is under way, are written together in one transaction, so under
load one commit serves many requests.
Each write inserts, then trims each session it touched in the same transaction: the rows
beyond ``max_requests_per_session`` (oldest first; the totals say when there are any), then
those older than ``retention_days`` (an index range, empty nearly always), subtracting what
it deletes from the totals. Sessions nobody writes to any more are trimmed by
:meth:`SQLiteStateStore.trim`, which the proxy runs at startup and hourly.

*Several processes on one file* (``listen.workers`` > 1: ``shared``). Every write is a
transaction of its own, so the compare-and-swap and the other atomic steps hold across
processes as they do across tasks. For replica consistency
(:class:`~proxy.state.store.base.ReplicaConsistency`) each versioned record's version is a row
of ``record_version`` bumped in the record's own transaction, a session's versions are read in
one read transaction, and a lease is a row of ``store_lock`` (name, token, expiry in wall-clock
seconds, which every process on the machine shares): taken in a write transaction that first
deletes an expired row, renewed and deleted only with its token.

*Never garbage.* Rows are decoded through ``DurableContextState.from_dict`` (memoised, see
:mod:`proxy.state.store._rows`); a row that does not decode raises
:class:`~proxy.state.store.base.CorruptStateError`.

Everything in ``__all__`` gets re-exported by ``proxy.state.store``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Self, TypeVar

from compactor import DurableContextState
from proxy.state.audit_log import (
    DEFAULT_MAX_REQUESTS_PER_SESSION,
    DEFAULT_RETENTION_DAYS,
    RequestEntry,
    SessionOrder,
    SessionSummary,
    StateChange,
)
from proxy.state.private_files import private_companions, private_file
from proxy.state.usage import UsageEntry, UsageRow

from . import _sqlite_state as state_writes
from ._rows import (
    audit_stamp,
    check_bounds,
    check_change,
    decode_change,
    decode_entry,
    decode_state,
    decode_usage_row,
    encode_audit,
    encode_state,
    retention_cutoff,
    usage_stamp,
    utc_now,
)
from .audit_batches import AUDIT_LINGER_S, AuditBatches
from .base import (
    CorruptStateError,
    RecordFetch,
    SessionVersions,
    StoredState,
    StoreError,
)
from .revocations import SQLiteLoginRevocations

__all__ = ["SQLiteStateStore"]

_T = TypeVar("_T")

#: The largest record written on the event loop's own connection (a calibration is a few KB).
INLINE_WRITE_MAX_BYTES: Final = 64 * 1024
#: Commits of the event loop's own connection between two checkpoints of the worker thread's
#: (a calibration record is a few pages: the log stays within a few megabytes).
CHECKPOINT_EVERY: Final = 256

#: Bump together with a migration in ``_SCHEMA`` handling when the table layout changes.
#: A new table (``CREATE TABLE IF NOT EXISTS``) is no such change: a file from before gets it
#: when it is opened, and an older program never looks at it (``session_usage`` came so).
SCHEMA_VERSION = 1

#: The usage counters, one INTEGER column each (names from our own dataclass, not input).
_USAGE_COLUMNS: tuple[str, ...] = UsageEntry.field_names()

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    # One row per session: the durable state as canonical JSON, with its CAS version.
    """CREATE TABLE IF NOT EXISTS session_state (
        session_id TEXT PRIMARY KEY,
        version INTEGER NOT NULL CHECK (version >= 1),
        state_json TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) WITHOUT ROWID""",
    # ``seq`` is the rowid, so it grows with insertion order: the oldest rows have the
    # smallest seq and eviction is a range delete on the primary key.
    """CREATE TABLE IF NOT EXISTS summary_cache (
        seq INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        text TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS session_record (
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        data BLOB NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (session_id, kind)
    ) WITHOUT ROWID""",
    # One row per (session key, model): additive usage counters, see proxy.state.usage.
    "CREATE TABLE IF NOT EXISTS session_usage (\n"
    "    session_key TEXT NOT NULL,\n"
    "    model TEXT NOT NULL,\n"
    + "".join(f"    {name} INTEGER NOT NULL DEFAULT 0,\n" for name in _USAGE_COLUMNS)
    + "    last_seen TEXT NOT NULL,\n"
    "    PRIMARY KEY (session_key, model)\n"
    ") WITHOUT ROWID",
    # The audit log (see proxy.state.audit_log): one row per request, its JSON in ``entry``;
    # the columns are what the queries and the totals need. ``at`` is fixed-width ISO (UTC).
    """CREATE TABLE IF NOT EXISTS audit_request (
        seq INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        at TEXT NOT NULL,
        tokens_before INTEGER NOT NULL,
        tokens_after INTEGER NOT NULL,
        blocked INTEGER NOT NULL,
        entry TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS audit_request_session ON audit_request (tenant, session_id, at)",
    "CREATE INDEX IF NOT EXISTS audit_request_at ON audit_request (at)",
    "CREATE INDEX IF NOT EXISTS audit_request_blocked ON audit_request (at) WHERE blocked = 1",
    # Each session's totals over its rows in audit_request, changed with them.
    """CREATE TABLE IF NOT EXISTS audit_session (
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        last_seen TEXT NOT NULL,
        requests INTEGER NOT NULL,
        tokens_before INTEGER NOT NULL,
        tokens_after INTEGER NOT NULL,
        blocked INTEGER NOT NULL,
        PRIMARY KEY (tenant, session_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS audit_session_last_seen ON audit_session (last_seen)",
    "CREATE INDEX IF NOT EXISTS audit_session_blocked ON audit_session (blocked, last_seen)",
    """CREATE TABLE IF NOT EXISTS audit_change (
        seq INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        at TEXT NOT NULL,
        change TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS audit_change_session ON audit_change (tenant, session_id, at)",
    "CREATE INDEX IF NOT EXISTS audit_change_at ON audit_change (at)",
    # Replica consistency: the version of each versioned record (bumped with the record in
    # one transaction), and leases by name (a row whose expires_at, Unix seconds, has passed
    # is free).
    """CREATE TABLE IF NOT EXISTS record_version (
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        version INTEGER NOT NULL,
        PRIMARY KEY (session_id, kind)
    ) WITHOUT ROWID""",
    state_writes.TOMBSTONE_SCHEMA,
    """CREATE TABLE IF NOT EXISTS store_lock (
        name TEXT PRIMARY KEY,
        token TEXT NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID""",
)

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

# Every counter added to the row's own, in one statement; last_seen only moves forward.
_ADD_USAGE = (
    f"INSERT INTO session_usage (session_key, model, {', '.join(_USAGE_COLUMNS)}, last_seen)"
    f" VALUES (?, ?, {', '.join('?' for _ in _USAGE_COLUMNS)}, ?)"
    " ON CONFLICT (session_key, model) DO UPDATE SET "
    + ", ".join(f"{name} = {name} + excluded.{name}" for name in _USAGE_COLUMNS)
    + ", last_seen = max(last_seen, excluded.last_seen)"
)
_USAGE_ROWS = (
    f"SELECT session_key, model, {', '.join(_USAGE_COLUMNS)}, last_seen FROM session_usage"
    " ORDER BY session_key, model"
)


class SQLiteStateStore(SQLiteLoginRevocations):
    """The :class:`~proxy.state.store.base.StoreBackend` backed by one SQLite file.

    Construction does no I/O; the file (``0600``, and its missing parent directories,
    ``0700``: :mod:`proxy.state.private_files`) is created and the schema checked on first
    use, or up front by :meth:`open`, which is what the service calls at startup so a bad
    path fails before anything is served.

    Args:
        path: the database file.
        max_summaries: how many summaries the cache keeps before evicting the oldest.
        busy_timeout_s: how long a write waits for another writer's lock before failing.
        max_requests_per_session: how many request entries a session keeps in the audit log.
        retention_days: how long audit entries are kept.
        shared: whether other processes serve from the same file (``listen.workers`` > 1):
            then in-memory copies are checked against the file's versions on every request.
        audit_linger_s: how long the first audit entry of a batch waits for others
            (:mod:`~proxy.state.store.audit_batches`).
    """

    def __init__(self, path: str | Path, *, max_summaries: int = 1000,
                 busy_timeout_s: float = 5.0,
                 max_requests_per_session: int = DEFAULT_MAX_REQUESTS_PER_SESSION,
                 retention_days: int = DEFAULT_RETENTION_DAYS, shared: bool = False,
                 audit_linger_s: float = AUDIT_LINGER_S) -> None:
        if max_summaries < 1:
            raise ValueError(f"max_summaries must be >= 1, got {max_summaries}")
        if busy_timeout_s <= 0:
            raise ValueError(f"busy_timeout_s must be > 0, got {busy_timeout_s}")
        check_bounds(max_requests_per_session, retention_days)
        self.path = Path(path)
        self.max_summaries = max_summaries
        self.busy_timeout_s = busy_timeout_s
        self.max_requests_per_session = max_requests_per_session
        self.retention_days = retention_days
        self._shared = shared
        # Audit entries waiting for their transaction (used from the event loop only).
        self._batches = AuditBatches(self._write_requests, linger_s=audit_linger_s)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._closed = False
        # Touched only from the worker thread (the loop only asks whether it is there yet).
        self._conn: sqlite3.Connection | None = None
        # The event loop's own connection, for what is done at once (_now), and its commits
        # since the worker thread last checkpointed.
        self._loop_conn: sqlite3.Connection | None = None
        self._loop_commits = 0

    async def open(self) -> Self:
        """Create the file and its schema now (idempotent); returns the store itself.

        Raises:
            StoreError: the file cannot be opened or its schema is not this program's; the
                store is closed.
        """
        try:
            await self._call(self._connection)
        except BaseException:
            await self.close()
            raise
        return self

    # -- the async interface -------------------------------------------------------------

    async def get_state(self, session_id: str) -> StoredState | None:
        """Return the session's current state, or ``None`` when it has none."""
        return await self._call(self._get_state, session_id)

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None,
                        change: StateChange | None = None) -> StoredState:
        """Compare-and-swap write, with ``change`` in the same transaction; see
        :meth:`proxy.state.store.base.StateStore.put_state`."""
        if not isinstance(state, DurableContextState):
            raise TypeError(f"state must be a DurableContextState, got {type(state).__name__}")
        check_change(session_id, change, "put")
        # Encode on the loop thread: it is CPU work on the caller's object, and a state that
        # cannot be encoded fails here, before any lock is taken.
        return await self._call(self._put_state, session_id, state, encode_state(state),
                                expected_version, change)

    async def delete_state(self, session_id: str, expected_version: int | None = None,
                           change: StateChange | None = None) -> bool:
        """Delete the state, with ``change`` in the same transaction; see
        :meth:`proxy.state.store.base.StateStore.delete_state`."""
        check_change(session_id, change, "delete")
        return await self._call(self._delete_state, session_id, expected_version, change)

    async def get_summary(self, key: str) -> str | None:
        """Return the cached summary stored under ``key``, or ``None``."""
        return await self._call(self._get_summary, key)

    async def put_summary(self, key: str, text: str) -> None:
        """Cache ``text`` under ``key``, evicting the oldest entries beyond ``max_summaries``."""
        await self._call(self._put_summary, key, text)

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        """Return the opaque compaction record ``kind`` of the session, or ``None``."""
        return await self._call(self._get_record, session_id, kind)

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        """Store (replace) the opaque compaction record ``kind`` of the session."""
        await self._call(self._put_record, session_id, kind, bytes(data))

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        """Add ``entry`` to the row of ``(session_key, model)``; see
        :meth:`proxy.state.store.base.UsageLedger.add_usage`."""
        if not isinstance(entry, UsageEntry):
            raise TypeError(f"entry must be a UsageEntry, got {type(entry).__name__}")
        await self._call(self._add_usage, session_key, model, entry)

    async def usage_rows(self) -> list[UsageRow]:
        """Every usage row, ordered by session key, then model."""
        return await self._call(self._usage_rows)

    # -- the audit log (proxy.state.audit_log.RequestLog) ---------------------------------

    def add_request(self, entry: RequestEntry) -> asyncio.Future[None]:
        """Keep ``entry``, then trim its session (bound and retention).

        Entries added within ``audit_linger_s`` (a second) of each other, or while a write is
        under way, go together in one transaction
        (:class:`~proxy.state.store.audit_batches.AuditBatches`): under load one commit serves
        many requests, and the worker thread encodes them in one loop. Returns the batch's
        future, done once its transaction committed (or failed with its error).

        Raises:
            TypeError: ``entry`` is not a :class:`RequestEntry`.
            StoreError: the store is closed.
        """
        if not isinstance(entry, RequestEntry):
            raise TypeError(f"entry must be a RequestEntry, got {type(entry).__name__}")
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        return self._batches.add(entry)

    async def flush(self) -> None:
        """Write the entries :meth:`add_request` still holds back, now."""
        await self._batches.flush()

    async def _write_requests(self, entries: list[RequestEntry]) -> None:
        await self._call(self._add_requests, entries)

    async def add_state_change(self, change: StateChange) -> None:
        """Keep ``change``, then trim the session's changes and the retention."""
        if not isinstance(change, StateChange):
            raise TypeError(f"change must be a StateChange, got {type(change).__name__}")
        await self._call(self._add_state_change, change)

    async def sessions(self, *, offset: int = 0, limit: int = 50, contains: str | None = None,
                       order: SessionOrder = "last_seen",
                       tenant: str | None = None) -> tuple[list[SessionSummary], int]:
        """One page of sessions and how many match; see
        :meth:`proxy.state.audit_log.RequestLog.sessions`."""
        _check_page(offset, limit)
        if order not in _SESSION_ORDERS:
            raise ValueError(f"order must be one of {', '.join(_SESSION_ORDERS)}, got {order!r}")
        await self._batches.flush()  # this process's entries are read too
        return await self._call(self._sessions, offset, limit, contains, order, tenant)

    async def session_requests(self, tenant: str, session_id: str, *, offset: int = 0,
                               limit: int = 100) -> tuple[list[RequestEntry], int]:
        """One page of a session's requests, newest first, and how many it has."""
        _check_page(offset, limit)
        await self._batches.flush()  # this process's entries are read too
        return await self._call(self._session_requests, tenant, session_id, offset, limit)

    async def state_changes(self, tenant: str, session_id: str, *,
                            limit: int = 100) -> list[StateChange]:
        """A session's state changes, newest first."""
        _check_page(0, limit)
        return await self._call(self._state_changes, tenant, session_id, limit)

    async def blocked_since(self, since: datetime, *, limit: int = 1000) -> list[RequestEntry]:
        """Refused requests that arrived at or after ``since``, oldest first."""
        _check_page(0, limit)
        await self._batches.flush()  # this process's entries are read too
        return await self._call(self._blocked_since, audit_stamp(since), limit)

    async def trim(self, now: datetime) -> int:
        """Drop the audit entries older than the retention at ``now``; returns how many."""
        return await self._call(self._trim, audit_stamp(
            retention_cutoff(now, self.retention_days)))

    async def close(self) -> None:
        """Close the connections and stop the worker thread; idempotent."""
        if self._closed:
            return
        await self._batches.flush()
        self._closed = True
        if self._loop_conn is not None:
            self._loop_conn.close()
            self._loop_conn = None
        loop = asyncio.get_running_loop()
        # Queued behind every call already submitted, so those still complete.
        await loop.run_in_executor(self._executor, self._close_connection)
        self._executor.shutdown(wait=False)

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    # -- the event loop's own connection --------------------------------------------------

    def _now(self, call: Callable[..., _T], *args: Any) -> _T | None:
        """``call(connection, *args)`` on the event loop's own connection, or ``None`` when
        it cannot be done at once: the file is not open yet (the worker thread creates it
        and its schema), or SQLite is busy or locked (the worker thread, whose connection
        waits up to ``busy_timeout_s``, does it instead).

        For the few small reads and writes every request of a worker makes (its session's
        versions, the calibration its answer taught): in WAL mode a writer never blocks a
        reader, and a commit appends to the log without a sync (``synchronous = NORMAL``),
        so each takes ~10-50 µs, where the hop to the worker thread and back costs ~100 µs
        of CPU. This connection waits for nothing (``timeout=0``), never creates the file
        (``mode=rw``) and never checkpoints (a checkpoint syncs the file): every
        :data:`CHECKPOINT_EVERY` of its commits, a write goes to the worker thread, which
        checkpoints after it.
        """
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        conn = self._loop_conn
        if conn is None:
            if self._conn is None:  # (set once by the worker thread; read here only)
                return None
            conn = self._loop_conn = self._open_loop_connection()
            if conn is None:
                return None
        try:
            return call(conn, *args)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return None
            raise StoreError(f"state database {self.path}: {call.__name__} failed: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"state database {self.path}: {call.__name__} failed: {exc}") from exc

    def _open_loop_connection(self) -> sqlite3.Connection | None:
        """The loop's own connection to the file the worker thread opened, or ``None`` when
        it cannot be opened (the file was removed or made read-only since: the worker
        thread's connection, still open, does the work, as it did before)."""
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=rw", uri=True,
                                   timeout=0, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error):
            return None
        try:
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except sqlite3.Error:
            conn.close()
            return None
        return conn

    # -- worker-thread side ----------------------------------------------------------------
    # Everything below runs in the single worker thread only.

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            # Private whatever the umask: 0600, in directories made 0700 (SQLite gives the
            # -wal and -shm the database's mode).
            private_file(self.path)
            # isolation_level=None: no implicit transactions; we issue BEGIN IMMEDIATE ourselves.
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open state database {self.path}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"state database {self.path} cannot use WAL journal mode (got {mode!r})"
                )
            conn.execute("PRAGMA synchronous = NORMAL")
            private_companions(self.path)
            with self._immediate(conn):
                for statement in _SCHEMA:
                    conn.execute(statement)
                row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
                if row[0] is None:
                    conn.execute("INSERT INTO schema_version (version) VALUES (?)",
                                 (SCHEMA_VERSION,))
                elif row[0] != SCHEMA_VERSION:
                    raise StoreError(
                        f"state database {self.path} has schema version {row[0]}; "
                        f"this program supports {SCHEMA_VERSION}"
                    )
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot initialise state database {self.path}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _immediate(self, conn: sqlite3.Connection) -> contextlib.AbstractContextManager[None]:
        """One write transaction holding the write lock from its first statement."""
        return state_writes.write_transaction(conn)

    @contextlib.contextmanager
    def _sqlite_errors(self, action: str) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        try:
            yield conn
        except sqlite3.Error as exc:
            raise StoreError(f"state database {self.path}: {action} failed: {exc}") from exc

    def _get_state(self, session_id: str) -> StoredState | None:
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
        when = utc_now()
        with self._sqlite_errors("write state") as conn:
            new_version = state_writes.put_state(conn, session_id, state_json, when.isoformat(),
                                                 expected_version, change,
                                                 *self._change_bounds())
        return StoredState(session_id=session_id, version=new_version, state=state,
                           updated_at=when)

    def _delete_state(self, session_id: str, expected_version: int | None,
                      change: StateChange | None) -> bool:
        with self._sqlite_errors("delete state") as conn:
            return state_writes.delete_state(conn, session_id, expected_version, change,
                                             *self._change_bounds())

    def _change_bounds(self) -> tuple[int, str]:
        """How many changes a session keeps, and the oldest time one may have now."""
        return (self.max_requests_per_session,
                audit_stamp(retention_cutoff(utc_now(), self.retention_days)))

    def _get_summary(self, key: str) -> str | None:
        with self._sqlite_errors("read summary") as conn:
            row = conn.execute("SELECT text FROM summary_cache WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], str):
            raise CorruptStateError(f"<summary {key}>", "summary text is not a string")
        return row[0]

    def _put_summary(self, key: str, text: str) -> None:
        with self._sqlite_errors("write summary") as conn, self._immediate(conn):
            # Content-addressed: a key already cached keeps its text and its age.
            conn.execute(
                "INSERT INTO summary_cache (key, text) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                (key, text),
            )
            # Keep the newest max_summaries rows: delete everything at or below the seq of the
            # (max_summaries + 1)-th newest row, if there is one.
            conn.execute(
                "DELETE FROM summary_cache WHERE seq <= ("
                " SELECT seq FROM summary_cache ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (self.max_summaries,),
            )

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

    def _add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        counters = tuple(getattr(entry, name) for name in _USAGE_COLUMNS)
        with self._sqlite_errors("add usage") as conn:
            # A single statement is its own atomic transaction in autocommit mode.
            conn.execute(_ADD_USAGE, (session_key, model, *counters, usage_stamp()))

    def _usage_rows(self) -> list[UsageRow]:
        with self._sqlite_errors("read usage") as conn:
            rows = conn.execute(_USAGE_ROWS).fetchall()
        return [
            decode_usage_row(str(key), str(model), dict(zip(_USAGE_COLUMNS, counters,
                                                            strict=True)), last_seen)
            for key, model, *counters, last_seen in rows
        ]

    # -- the audit log, worker-thread side --------------------------------------------------

    def _add_requests(self, batch: list[RequestEntry]) -> None:
        """Encode a batch of entries and write them in one transaction, then trim each
        session it touched. An entry that cannot be encoded fails the batch, as a failed
        write does."""
        cutoff = audit_stamp(retention_cutoff(utc_now(), self.retention_days))
        rows = []
        # (tenant, session id) -> [last_seen, requests, tokens_before, tokens_after, blocked]
        totals: dict[tuple[str, str], list[Any]] = {}
        for entry in batch:
            before, after = entry.tokens_before or 0, entry.tokens_after or 0
            blocked, when = int(entry.blocked), audit_stamp(entry.at)
            rows.append((entry.tenant, entry.session_id, when, before, after, blocked,
                         encode_audit(entry)))
            sums = totals.setdefault((entry.tenant, entry.session_id), [when, 0, 0, 0, 0])
            sums[0] = max(sums[0], when)
            for index, value in enumerate((1, before, after, blocked), start=1):
                sums[index] += value
        with self._sqlite_errors("add audit entries") as conn, self._immediate(conn):
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
        with self._sqlite_errors("add state change") as conn, self._immediate(conn):
            state_writes.add_change(conn, change, *self._change_bounds())

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

    def _trim(self, cutoff: str) -> int:
        with self._sqlite_errors("trim the audit log") as conn, self._immediate(conn):
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
        return [decode_entry(row[0]) for row in rows], int(total)

    def _state_changes(self, tenant: str, session_id: str, limit: int) -> list[StateChange]:
        with self._sqlite_errors("read state changes") as conn:
            rows = conn.execute(
                "SELECT change FROM audit_change WHERE tenant = ? AND session_id = ?"
                " ORDER BY at DESC, seq DESC LIMIT ?",
                (tenant, session_id, limit)).fetchall()
        return [decode_change(row[0]) for row in rows]

    def _blocked_since(self, since: str, limit: int) -> list[RequestEntry]:
        with self._sqlite_errors("read blocked requests") as conn:
            rows = conn.execute(
                "SELECT entry FROM audit_request WHERE blocked = 1 AND at >= ?"
                " ORDER BY at, seq LIMIT ?", (since, limit)).fetchall()
        return [decode_entry(row[0]) for row in rows]

    # --- replica consistency ---
    # (proxy.state.store.base.ReplicaConsistency; the loop side first, then the worker side)

    @property
    def shared(self) -> bool:
        """Whether other processes serve from this file (the ``shared`` argument)."""
        return self._shared

    async def session_versions(self, session_id: str,
                               fetch: RecordFetch | None = None) -> SessionVersions:
        """The session's state version, its versioned records' versions and the records
        ``fetch`` wants, in one read transaction. Read on the event loop's own connection
        (:meth:`_now`: every request of a worker asks, and a thread hop costs ten times the
        read); in the worker thread when SQLite cannot answer at once."""
        versions = self._now(_versions_on, session_id, fetch)
        if versions is not None:
            return versions
        return await self._call(self._session_versions, session_id, fetch)

    async def get_versioned_record(self, session_id: str, kind: str
                                   ) -> tuple[int, bytes] | None:
        """The record ``kind`` and its version, read in one transaction."""
        return await self._call(self._get_versioned_record, session_id, kind)

    async def put_versioned_record(self, session_id: str, kind: str, data: bytes) -> int:
        """Replace the record ``kind`` and bump its version in one transaction: on the event
        loop's own connection when the record is small and the write lock is free at once
        (a worker's calibration, saved after every answer; in WAL mode a commit appends to
        the log and does not sync), else in the worker thread, whose connection waits for
        it (a checkpoint's record may be megabytes: no stall of the loop)."""
        data = bytes(data)
        if len(data) <= INLINE_WRITE_MAX_BYTES and self._loop_commits < CHECKPOINT_EVERY:
            version = self._now(_put_versioned_on, session_id, kind, data,
                                utc_now().isoformat())
            if version is not None:
                self._loop_commits += 1
                return version
        # A large record, a busy file, or the turn of the loop's connection to have its log
        # checkpointed (it never does so itself): the worker thread writes, then checkpoints.
        checkpoint = self._loop_commits >= CHECKPOINT_EVERY
        version = await self._call(self._put_versioned_record, session_id, kind, data,
                                   checkpoint)
        if checkpoint:
            self._loop_commits = 0
        return version

    async def acquire_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """Take the lease ``name`` if it is free or expired."""
        return await self._call(self._acquire_lock, name, token, _ttl_s(ttl_ms))

    async def extend_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """Renew the lease if ``token`` holds it."""
        return await self._call(self._extend_lock, name, token, _ttl_s(ttl_ms))

    async def release_lock(self, name: str, token: str) -> bool:
        """Drop the lease if ``token`` holds it."""
        return await self._call(self._release_lock, name, token)

    def _session_versions(self, session_id: str, fetch: RecordFetch | None) -> SessionVersions:
        with self._sqlite_errors("read versions") as conn:
            return _versions_on(conn, session_id, fetch)

    def _get_versioned_record(self, session_id: str, kind: str) -> tuple[int, bytes] | None:
        with self._sqlite_errors("read record") as conn:
            row = conn.execute(
                "SELECT v.version, r.data FROM record_version v JOIN session_record r"
                " ON r.session_id = v.session_id AND r.kind = v.kind"
                " WHERE v.session_id = ? AND v.kind = ?", (session_id, kind)).fetchone()
        if row is None:
            return None
        if not isinstance(row[1], bytes):
            raise CorruptStateError(session_id, f"record {kind!r} is not a blob")
        return int(row[0]), row[1]

    def _put_versioned_record(self, session_id: str, kind: str, data: bytes,
                              checkpoint: bool = False) -> int:
        with self._sqlite_errors("write record") as conn:
            version = _put_versioned_on(conn, session_id, kind, data, utc_now().isoformat())
            if checkpoint:
                # Everything the log holds into the file, and the log emptied (it waits for
                # the readers and writers of the moment); a failure is left to the next one.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return version

    def _acquire_lock(self, name: str, token: str, ttl_s: float) -> bool:
        now = time.time()  # wall clock: the one every process on the machine shares
        with self._sqlite_errors("take lock") as conn, self._immediate(conn):
            conn.execute("DELETE FROM store_lock WHERE name = ? AND expires_at <= ?",
                         (name, now))
            taken = conn.execute(
                "INSERT INTO store_lock (name, token, expires_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING", (name, token, now + ttl_s)).rowcount
        return bool(taken == 1)

    def _extend_lock(self, name: str, token: str, ttl_s: float) -> bool:
        now = time.time()
        with self._sqlite_errors("extend lock") as conn:
            changed = conn.execute(
                "UPDATE store_lock SET expires_at = ? WHERE name = ? AND token = ?"
                " AND expires_at > ?", (now + ttl_s, name, token, now)).rowcount
        return bool(changed == 1)

    def _release_lock(self, name: str, token: str) -> bool:
        with self._sqlite_errors("release lock") as conn:
            changed = conn.execute("DELETE FROM store_lock WHERE name = ? AND token = ?",
                                   (name, token)).rowcount
        return bool(changed == 1)


def _ttl_s(ttl_ms: int) -> float:
    if ttl_ms < 1:
        raise ValueError(f"ttl_ms must be >= 1, got {ttl_ms}")
    return ttl_ms / 1000


def _check_page(offset: int, limit: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")


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
    with state_writes.write_transaction(conn):
        conn.execute(
            "INSERT INTO session_record (session_id, kind, data, updated_at)"
            " VALUES (?, ?, ?, ?)"
            " ON CONFLICT (session_id, kind) DO UPDATE SET data = excluded.data,"
            " updated_at = excluded.updated_at",
            (session_id, kind, data, updated_at))
        row = conn.execute(
            "INSERT INTO record_version (session_id, kind, version) VALUES (?, ?, 1)"
            " ON CONFLICT (session_id, kind) DO UPDATE SET version = version + 1"
            " RETURNING version", (session_id, kind)).fetchone()
    return int(row[0])
