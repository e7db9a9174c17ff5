"""The embedded store backend: one SQLite file, safe for several processes at once.

Theory of operation
-------------------
*One thread owns the connection.* Every sqlite call runs in a single dedicated worker thread
(a one-worker ``ThreadPoolExecutor``), reached through ``loop.run_in_executor``; the event loop
never blocks on disk I/O or on another process's lock. Because that one thread does all the
work, calls are executed in the order they were made and the connection needs no lock.

*Compare-and-swap in one transaction.* A write opens ``BEGIN IMMEDIATE``, which takes SQLite's
single write lock up front (waiting up to the busy timeout for another writer, in this process
or another), then reads the current version, checks it against the caller's and writes, then
commits. Nobody can write between the check and the write, so of several writers racing from
the same version exactly one wins; the others see the new version and get ``VersionConflict``.

*Durability.* The file runs in WAL mode (readers never block the writer and vice versa) with
``synchronous=NORMAL``. In WAL mode NORMAL never corrupts the database and loses nothing when
the process crashes; only an OS crash or power cut may roll back the last few commits, because
the WAL is fsynced at checkpoints rather than at every commit. We accept that: the compaction
records and summaries written on the request path are caches, and an admin write that is
rolled back shows up as an older version, so the admin's next ``If-Match`` gets a clean 409
rather than a silent overwrite. FULL would fsync on every commit of the request path.

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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self, TypeVar

from compactor import DurableContextState
from proxy.state.usage import UsageEntry, UsageRow

from ._rows import decode_state, decode_usage_row, encode_state, usage_stamp, utc_now
from .base import CorruptStateError, StoredState, StoreError, VersionConflict

__all__ = ["SQLiteStateStore"]

_T = TypeVar("_T")

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
)

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


class SQLiteStateStore:
    """The :class:`~proxy.state.store.base.StoreBackend` backed by one SQLite file.

    Construction does no I/O; the file (and its parent directories) is created and the schema
    checked on first use, or up front by :meth:`open`, which is what the service calls at
    startup so a bad path fails before anything is served.

    Args:
        path: the database file.
        max_summaries: how many summaries the cache keeps before evicting the oldest.
        busy_timeout_s: how long a write waits for another writer's lock before failing.
    """

    def __init__(self, path: str | Path, *, max_summaries: int = 1000,
                 busy_timeout_s: float = 5.0) -> None:
        if max_summaries < 1:
            raise ValueError(f"max_summaries must be >= 1, got {max_summaries}")
        if busy_timeout_s <= 0:
            raise ValueError(f"busy_timeout_s must be > 0, got {busy_timeout_s}")
        self.path = Path(path)
        self.max_summaries = max_summaries
        self.busy_timeout_s = busy_timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._closed = False
        # Touched only from the worker thread.
        self._conn: sqlite3.Connection | None = None

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
                        expected_version: int | None) -> StoredState:
        """Compare-and-swap write; see :meth:`proxy.state.store.base.StateStore.put_state`."""
        if not isinstance(state, DurableContextState):
            raise TypeError(f"state must be a DurableContextState, got {type(state).__name__}")
        # Encode on the loop thread: it is CPU work on the caller's object, and a state that
        # cannot be encoded fails here, before any lock is taken.
        return await self._call(self._put_state, session_id, state, encode_state(state),
                                expected_version)

    async def delete_state(self, session_id: str, expected_version: int | None = None) -> bool:
        """Delete the state; see :meth:`proxy.state.store.base.StateStore.delete_state`."""
        return await self._call(self._delete_state, session_id, expected_version)

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

    async def close(self) -> None:
        """Close the connection and stop the worker thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        # Queued behind every call already submitted, so those still complete.
        await loop.run_in_executor(self._executor, self._close_connection)
        self._executor.shutdown(wait=False)

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    # -- worker-thread side ----------------------------------------------------------------
    # Everything below runs in the single worker thread only.

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
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

    @contextlib.contextmanager
    def _immediate(self, conn: sqlite3.Connection) -> Iterator[None]:
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
                   expected_version: int | None) -> StoredState:
        when = utc_now()
        with self._sqlite_errors("write state") as conn, self._immediate(conn):
            row = conn.execute(
                "SELECT version FROM session_state WHERE session_id = ?", (session_id,)
            ).fetchone()
            current = None if row is None else int(row[0])
            if current != expected_version:
                raise VersionConflict(session_id, expected_version, current)
            new_version = 1 if current is None else current + 1
            conn.execute(
                "INSERT INTO session_state (session_id, version, state_json, updated_at)"
                " VALUES (?, ?, ?, ?)"
                " ON CONFLICT (session_id) DO UPDATE SET version = excluded.version,"
                " state_json = excluded.state_json, updated_at = excluded.updated_at",
                (session_id, new_version, state_json, when.isoformat()),
            )
        return StoredState(session_id=session_id, version=new_version, state=state,
                           updated_at=when)

    def _delete_state(self, session_id: str, expected_version: int | None) -> bool:
        with self._sqlite_errors("delete state") as conn, self._immediate(conn):
            row = conn.execute(
                "SELECT version FROM session_state WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is None:
                deleted = False
            elif expected_version is not None and int(row[0]) != expected_version:
                raise VersionConflict(session_id, expected_version, int(row[0]))
            else:
                conn.execute("DELETE FROM session_state WHERE session_id = ?", (session_id,))
                deleted = True
        return deleted

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
