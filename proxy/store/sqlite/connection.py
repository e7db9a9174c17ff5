"""What every part of the SQLite store shares: the worker thread that owns the connection, the
event loop's own connection, the lifecycle, the write transaction and how a failure becomes a
:class:`~proxy.store.base.StoreError`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, Final, ParamSpec, Self, TypeVar

from proxy.audit.log import (
    DEFAULT_MAX_REQUESTS_PER_SESSION,
    DEFAULT_RETENTION_DAYS,
    RequestEntry,
    utc_iso,
)
from proxy.store.private_files import private_companions, private_file

from .._rows import check_bounds, retention_cutoff, utc_now
from ..audit_batches import AUDIT_LINGER_S, AuditBatches
from ..base import StoreError
from .schema import SCHEMA, SCHEMA_VERSION

__all__ = ["CHECKPOINT_EVERY", "INLINE_WRITE_MAX_BYTES", "SQLiteConnection", "in_worker",
           "write_transaction"]

_T = TypeVar("_T")
_S = TypeVar("_S", bound="SQLiteConnection")
_P = ParamSpec("_P")

#: The largest record written on the event loop's own connection (a calibration is a few KB).
INLINE_WRITE_MAX_BYTES: Final = 64 * 1024
#: Commits of the event loop's own connection between two checkpoints of the worker thread's
#: (a calibration record is a few pages: the log stays within a few megabytes).
CHECKPOINT_EVERY: Final = 256


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction holding the write lock from its first statement."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled back by itself (disk full): a second ROLLBACK would raise.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def in_worker(method: Callable[Concatenate[_S, _P], _T]
              ) -> Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]]:
    """The store method ``method``, written as the worker thread runs it, as a coroutine
    method that runs it there (:meth:`SQLiteConnection._call`)."""

    @functools.wraps(method)
    async def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await self._call(functools.partial(method, self, *args, **kwargs))

    return call


class SQLiteConnection:
    """What every part of :class:`~proxy.store.SQLiteStateStore` works on (arguments there)."""

    if TYPE_CHECKING:
        async def _write_requests(self, entries: list[RequestEntry]) -> None: ...

    def __init__(self, path: str | Path, *, max_summaries: int = 1000,
                 busy_timeout_s: float = 5.0,
                 max_requests_per_session: int = DEFAULT_MAX_REQUESTS_PER_SESSION,
                 retention_days: int = DEFAULT_RETENTION_DAYS, shared: bool = False,
                 audit_linger_s: float = AUDIT_LINGER_S) -> None:
        check_bounds(max_summaries, max_requests_per_session, retention_days)
        if busy_timeout_s <= 0:
            raise ValueError(f"busy_timeout_s must be > 0, got {busy_timeout_s}")
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
        # Set by the worker thread (the loop only asks whether it is there yet).
        self._conn: sqlite3.Connection | None = None
        # The event loop's own connection (_now), and its commits since the last checkpoint.
        self._loop_conn: sqlite3.Connection | None = None
        self._loop_commits = 0

    async def open(self) -> Self:
        """Create the file and its schema now (idempotent); returns the store itself
        (:class:`StoreError`, the store closed, when the file or its schema is unusable)."""
        try:
            await self._call(self._connection)
        except BaseException:
            await self.close()
            raise
        return self

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
        """``call(connection, *args)`` on the event loop's own connection (which waits for
        nothing, never creates the file and never checkpoints), or ``None`` when that cannot
        be done at once: the file is not open yet, or SQLite is busy or locked (then the
        worker thread, whose connection waits, does it)."""
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
        except sqlite3.Error as exc:
            if (isinstance(exc, sqlite3.OperationalError) and exc.sqlite_errorcode & 0xFF
                    in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)):
                return None
            raise StoreError(f"state database {self.path}: {call.__name__} failed: {exc}") from exc

    def _open_loop_connection(self) -> sqlite3.Connection | None:
        """The loop's own connection to the file the worker thread opened, or ``None`` (the
        file was removed or made read-only since: the worker thread's connection does it)."""
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

    # -- worker-thread side (everything below) -----------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            private_file(self.path)  # (SQLite gives the -wal and -shm the file's mode)
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
            with write_transaction(conn):
                for statement in SCHEMA:
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
    def _sqlite_errors(self, action: str) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        try:
            yield conn
        except sqlite3.Error as exc:
            raise StoreError(f"state database {self.path}: {action} failed: {exc}") from exc

    def _change_bounds(self) -> tuple[int, str]:
        """How many changes a session keeps, and the oldest time one may have now."""
        return (self.max_requests_per_session,
                utc_iso(retention_cutoff(utc_now(), self.retention_days)))
