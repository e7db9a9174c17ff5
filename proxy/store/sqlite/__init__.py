"""The embedded store backend: one SQLite file, safe for several processes at once.

Theory of operation
-------------------
*One thread owns the connection.* Every sqlite call runs in a single dedicated worker thread
(a one-worker ``ThreadPoolExecutor``), reached through ``loop.run_in_executor``; the event loop
never blocks on disk I/O or on another process's lock. Because that one thread does all the
work, calls are executed in the order they were made and the connection needs no lock.

*But for two small calls, done at once on the loop.* A worker (``shared``) reads its session's
versions on every request and saves the calibration each answer taught: a hop to the thread and
back costs more than the read or the commit (bench/README.md, "Twins in the stores"). Those two
run on the event loop's own connection (:meth:`~.connection.SQLiteConnection._now`), which never
waits (``timeout=0``: a busy file sends the call to the thread, which waits), never creates the
file and never checkpoints (every :data:`CHECKPOINT_EVERY` of its commits a write goes to the
thread, which checkpoints after it); a record over :data:`INLINE_WRITE_MAX_BYTES` goes to the
thread. In WAL mode a reader is not blocked by a writer and a commit appends to the log without
a sync, so neither waits on the disk.

*Compare-and-swap in one transaction.* A write opens ``BEGIN IMMEDIATE``, which takes SQLite's
single write lock up front (waiting up to the busy timeout for another writer, in this process
or another), then reads the current version, checks it against the caller's and writes, then
commits. Nobody can write between the check and the write, so of several writers racing from
the same version exactly one wins; the others see the new version and get ``VersionConflict``.
A deleted state leaves a tombstone with its last version, and the change the admin API or the
console records goes in the write's own transaction (:mod:`.state`): versions are never
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
(:class:`~proxy.store.base.ReplicaConsistency`) each versioned record's version is a row
of ``record_version`` bumped in the record's own transaction, a session's versions are read in
one read transaction, and a lease is a row of ``store_lock`` (name, token, expiry in wall-clock
seconds, which every process on the machine shares): taken in a write transaction that first
deletes an expired row, renewed and deleted only with its token.

*Never garbage.* Rows are decoded through ``DurableContextState.from_dict`` (memoised, see
:mod:`proxy.store._rows`); a row that does not decode raises
:class:`~proxy.store.base.CorruptStateError`.

One module per part of :class:`~proxy.store.base.StoreBackend`, each a mixin over the
shared :class:`~.connection.SQLiteConnection` (:mod:`.state`, :mod:`.summaries`,
:mod:`.records`, :mod:`.ledger`, :mod:`.requests`, :mod:`.consistency`), composed in
:class:`SQLiteStateStore`; the tables are in :mod:`.schema`. ``proxy.store``
re-exports :class:`SQLiteStateStore`.
"""

from __future__ import annotations

from .connection import CHECKPOINT_EVERY, INLINE_WRITE_MAX_BYTES
from .schema import SCHEMA_VERSION
from .store import SQLiteStateStore

__all__ = ["CHECKPOINT_EVERY", "INLINE_WRITE_MAX_BYTES", "SCHEMA_VERSION", "SQLiteStateStore"]
