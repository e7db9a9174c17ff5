"""The per-session store interfaces, one per kind of caller, and the errors they raise.

A backend (``proxy.store.sqlite``, ``proxy.store.redis``) implements them all
(:class:`StoreBackend`, plus ``open`` and ``close``); each caller depends only on its part:
:class:`StateStore` (the durable state), :class:`SummaryCache`, :class:`RecordStore` (the
sticky checkpoints), :class:`UsageLedger`, :class:`~proxy.audit.log.RequestLog` (the audit
log) and :class:`ReplicaConsistency` (versions and leases across processes).

The durable state is versioned with compare-and-swap: a write names the version it replaces,
and of several racing writers exactly one wins (:class:`VersionConflict` for the others);
this backs the admin API's ``If-Match``. Versions are never reused, and a write's audit
record is kept in the same atomic step. Summaries and records are caches (losing them costs a
recomputation); usage rows are only added to, atomically; the audit log is bounded per
session, with running totals kept alongside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, Self, runtime_checkable

from compactor import DurableContextState
from proxy.accounting.usage import UsageEntry, UsageRow
from proxy.audit.log import RequestLog, StateChange

__all__ = [
    "CorruptStateError",
    "RecordFetch",
    "RecordStore",
    "ReplicaConsistency",
    "RequestLog",
    "SessionVersions",
    "StateStore",
    "StoreBackend",
    "StoreError",
    "StoreUnavailable",
    "StoredState",
    "SummaryCache",
    "UsageLedger",
    "UsageRow",
    "VersionConflict",
]


@dataclass(frozen=True)
class StoredState:
    """One session's durable state as stored: the state plus its version and write time.

    Attributes:
        session_id: the session the state belongs to.
        version: 1 for the first write, incremented by each later write.
        state: the durable context state itself.
        updated_at: when this version was written (timezone-aware, UTC).
    """

    session_id: str
    version: int
    state: DurableContextState
    updated_at: datetime


class VersionConflict(Exception):
    """A write or delete named a version that is not the current one; nothing was changed.

    Attributes:
        session_id: the session written to.
        expected_version: the version the caller named (``None``: "must not exist yet").
        current_version: the version actually stored (``None``: no state exists).
    """

    def __init__(self, session_id: str, expected_version: int | None,
                 current_version: int | None) -> None:
        self.session_id = session_id
        self.expected_version = expected_version
        self.current_version = current_version
        expected = "no state" if expected_version is None else f"version {expected_version}"
        current = "no state" if current_version is None else f"version {current_version}"
        super().__init__(
            f"version conflict for session {session_id!r}: expected {expected}, found {current}"
        )


class StoreError(Exception):
    """The backend failed (unreachable, locked for too long, closed, unsupported schema)."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached for now (refused, timed out, failing over); nothing was
    done, and the same call may succeed later. ``store.on_unavailable`` says what a request
    does then."""


class CorruptStateError(StoreError):
    """A stored row cannot be decoded; raised instead of ever returning garbage.

    Attributes:
        session_id: the session whose row is broken.
        detail: what is wrong with it (never the row's content).
    """

    def __init__(self, session_id: str, detail: str) -> None:
        self.session_id = session_id
        self.detail = detail
        super().__init__(f"stored state for session {session_id!r} is corrupt: {detail}")


@runtime_checkable
class StateStore(Protocol):
    """Durable per-session state with compare-and-swap writes.

    All methods may raise :class:`StoreError` when the backend fails.
    """

    async def get_state(self, session_id: str) -> StoredState | None:
        """Return the session's current state, or ``None`` when it has none."""
        ...

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None,
                        change: StateChange | None = None) -> StoredState:
        """Write ``state`` atomically if the stored version is ``expected_version``.

        ``None`` creates the state and conflicts if one exists; an int must equal the current
        version. The new version is the old one plus 1; on creation, 1 plus the version of
        the session's last deleted state (1 when it never had one). ``change`` (a ``put`` of
        this session) is recorded in the audit log with the version written, in the same
        atomic step.

        Raises:
            VersionConflict: the precondition did not hold; nothing was written.
        """
        ...

    async def delete_state(self, session_id: str, expected_version: int | None = None,
                           change: StateChange | None = None) -> bool:
        """Delete the session's state; ``True`` if one was deleted, ``False`` if none existed.

        When ``expected_version`` is given, an existing state at another version is kept.
        ``change`` (a ``delete`` of this session) is recorded with the delete, atomically.

        Raises:
            VersionConflict: a state exists at a version other than ``expected_version``.
        """
        ...


@runtime_checkable
class SummaryCache(Protocol):
    """The bounded, content-addressed summary cache; may raise :class:`StoreError`."""

    async def get_summary(self, key: str) -> str | None:
        """Return the cached summary stored under ``key``, or ``None``."""
        ...

    async def put_summary(self, key: str, text: str) -> None:
        """Cache ``text`` under ``key``, evicting the oldest entries beyond the bound.

        A key already cached keeps its first text and its age.
        """
        ...


@runtime_checkable
class RecordStore(Protocol):
    """Opaque per-session records by ``(session_id, kind)``; may raise :class:`StoreError`."""

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        """Return the opaque compaction record ``kind`` of the session, or ``None``."""
        ...

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        """Store (replace) the opaque compaction record ``kind`` of the session."""
        ...


@runtime_checkable
class UsageLedger(Protocol):
    """Additive usage counters per ``(session_key, model)``; may raise :class:`StoreError`.

    ``session_key`` is the session's store key, opaque here (it may hold ``/`` and ``:``);
    ``model`` is the model billed (for a summary call: the summary model), so each row has
    one price.
    """

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        """Add each counter of ``entry`` to the row of ``(session_key, model)`` atomically,
        creating the row at zero first, and set its ``last_seen`` to now."""
        ...

    async def usage_rows(self) -> list[UsageRow]:
        """Every row, ordered by session key, then model."""
        ...


@dataclass(frozen=True)
class SessionVersions:
    """What a replica checks its in-memory copies of one session against: the store's current
    version of each, read in one round trip (:meth:`ReplicaConsistency.session_versions`).

    Attributes:
        state: the durable state's version, ``None`` when the session has none.
        state_updated_at: when that version was written (ISO text, as stored); a state
            written before versions outlived a delete may share its version with an older
            one, and the time tells them apart.
        records: the version of each versioned record (``put_versioned_record``) by kind; a
            kind absent here has no such record. A version only grows (1 for the first write).
        fetched: the records a :class:`RecordFetch` asked for, read with the versions (the
            same snapshot): ``(version, data)`` by kind. A record it wanted may be missing
            here (one whose data the store cannot read as bytes): read it on its own.
    """

    state: int | None = None
    state_updated_at: str | None = None
    records: Mapping[str, int] = field(default_factory=dict)
    fetched: Mapping[str, tuple[int, bytes]] = field(default_factory=dict)

    def same_state(self, stored: StoredState | None) -> bool:
        """Whether ``stored`` (a state read earlier, ``None``: none) is still the current one."""
        if stored is None:
            return self.state is None
        return (stored.version == self.state
                and stored.updated_at.isoformat() == self.state_updated_at)


@dataclass(frozen=True)
class RecordFetch:
    """The versioned records a versions read also brings back, in the same round trip: each
    one whose kind starts with ``prefix`` and whose version is not the one the caller holds
    (``held``: version by kind; a kind not in it is not held). A replica that served the
    session's previous request holds its records already; one that did not gets what the
    other wrote without a second round trip.

    Attributes:
        prefix: the kinds wanted (``calibration:``).
        held: the version of each such record the caller holds.
    """

    prefix: str
    held: Mapping[str, int] = field(default_factory=dict)

    def wants(self, kind: str, version: int) -> bool:
        """Whether the record ``kind``, at ``version`` in the store, is to be read."""
        return kind.startswith(self.prefix) and self.held.get(kind) != version


@runtime_checkable
class ReplicaConsistency(Protocol):
    """What lets several processes share the store and give the same answers: versioned
    per-session records, one cheap read of a session's versions, and leases (locks with a
    token and an expiry). May raise :class:`StoreError`.

    Versioned records are the opaque records of :class:`RecordStore` (the same
    ``(session_id, kind)`` space) written with :meth:`put_versioned_record`, which also bumps
    the record's version in the same atomic step; a replica keeps ``(version, record)`` and
    re-reads the record only when :meth:`session_versions` shows another version.
    """

    @property
    def shared(self) -> bool:
        """Whether other processes may write this store while this one runs (Redis: always;
        SQLite: when configured so). When not, a process's in-memory copies of what it wrote
        stay authoritative."""
        ...

    async def session_versions(self, session_id: str,
                               fetch: RecordFetch | None = None) -> SessionVersions:
        """The session's state version and every versioned record's version, in one round
        trip; with ``fetch``, the records it wants too (:attr:`SessionVersions.fetched`),
        in the same one."""
        ...

    async def get_versioned_record(self, session_id: str, kind: str
                                   ) -> tuple[int, bytes] | None:
        """The record ``kind`` and its version, read together (``None``: no such record)."""
        ...

    async def put_versioned_record(self, session_id: str, kind: str, data: bytes) -> int:
        """Store (replace) the record ``kind`` and bump its version atomically; returns the
        new version."""
        ...

    async def acquire_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """Take the lease ``name`` for ``ttl_ms`` milliseconds if nobody holds it (or its
        holder's lease expired); ``True`` when taken. ``token`` identifies the holder."""
        ...

    async def extend_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """Renew the lease to ``ttl_ms`` from now if ``token`` still holds it."""
        ...

    async def release_lock(self, name: str, token: str) -> bool:
        """Drop the lease if ``token`` still holds it (never another holder's)."""
        ...


@runtime_checkable
class StoreBackend(StateStore, SummaryCache, RecordStore, UsageLedger, RequestLog,
                   ReplicaConsistency, Protocol):
    """One engine's store: every part above, plus its lifecycle.

    Construction does no I/O; the backend connects lazily on first use, or now with
    :meth:`open`.
    """

    async def open(self) -> Self:
        """Connect and verify the backend now (idempotent); returns the store itself.

        This is what startup calls, so a bad location fails before anything is served.
        On failure the store is closed and :class:`StoreError` raised.
        """
        ...

    async def close(self) -> None:
        """Release the backend's resources (idempotent); later calls raise :class:`StoreError`."""
        ...
