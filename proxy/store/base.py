"""The per-session store interfaces, one per kind of caller, and the errors they raise.

A backend (``proxy.store.sqlite``, ``proxy.store.redis``) implements them all
(:class:`StoreBackend`). The durable state is versioned with compare-and-swap (of several
racing writers exactly one wins; versions are never reused), a write's audit record kept in
the same atomic step. Summaries and records are caches (losing them costs a recomputation);
usage rows are only added to; the audit log is bounded per session.
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
    """One session's durable state as stored: ``version`` is 1 for the first write, plus 1
    for each later one; ``updated_at`` is when it was written (timezone-aware, UTC)."""

    session_id: str
    version: int
    state: DurableContextState
    updated_at: datetime


class VersionConflict(Exception):
    """A write or delete named a version (``expected_version``, ``None``: none) that is not
    the current one (``current_version``, ``None``: none); nothing was changed."""

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
    done, and the same call may succeed later (``store.on_unavailable`` says what then)."""


class CorruptStateError(StoreError):
    """A stored row cannot be decoded; raised instead of ever returning garbage (``detail``
    says what is wrong with it, never the row's content)."""

    def __init__(self, session_id: str, detail: str) -> None:
        self.session_id = session_id
        self.detail = detail
        super().__init__(f"stored state for session {session_id!r} is corrupt: {detail}")


@runtime_checkable
class StateStore(Protocol):
    """Durable per-session state with compare-and-swap writes; may raise :class:`StoreError`."""

    async def get_state(self, session_id: str) -> StoredState | None:
        """Return the session's current state, or ``None`` when it has none."""

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None,
                        change: StateChange | None = None) -> StoredState:
        """Write ``state`` atomically if the stored version is ``expected_version`` (``None``:
        none may exist), else raise :class:`VersionConflict`. The new version is the old one
        plus 1; on creation, 1 plus the session's last deleted version (or 1). ``change`` (a
        ``put`` of this session) is recorded with the version written, in the same step."""

    async def delete_state(self, session_id: str, expected_version: int | None = None,
                           change: StateChange | None = None) -> bool:
        """Delete the session's state (``False``: none existed); a state at another version
        than ``expected_version``, when given, is kept (:class:`VersionConflict`). ``change``
        (a ``delete`` of this session) is recorded with the delete, atomically."""


@runtime_checkable
class SummaryCache(Protocol):
    """The bounded, content-addressed summary cache; may raise :class:`StoreError`."""

    async def get_summary(self, key: str) -> str | None:
        """Return the cached summary stored under ``key``, or ``None``."""

    async def put_summary(self, key: str, text: str) -> None:
        """Cache ``text`` under ``key`` (a key already cached keeps its first text and its
        age), evicting the oldest entries beyond the bound."""


@runtime_checkable
class RecordStore(Protocol):
    """Opaque per-session records by ``(session_id, kind)``; may raise :class:`StoreError`."""

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        """Return the opaque compaction record ``kind`` of the session, or ``None``."""

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        """Store (replace) the opaque compaction record ``kind`` of the session."""


@runtime_checkable
class UsageLedger(Protocol):
    """Additive usage counters per ``(session_key, model)``: the session's store key (opaque)
    and the model billed (so each row has one price); may raise :class:`StoreError`."""

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        """Add each counter of ``entry`` to the row of ``(session_key, model)`` atomically,
        creating the row at zero first, and set its ``last_seen`` to now."""

    async def usage_rows(self) -> list[UsageRow]:
        """Every row, ordered by session key, then model."""


@dataclass(frozen=True)
class SessionVersions:
    """The store's current versions of one session, read in one round trip: its state's
    (``None``: none) and when it was written (ISO text: a state written before versions
    outlived a delete may share its version with an older one); each versioned record's by
    kind; and ``(version, data)`` of the records a :class:`RecordFetch` asked for, from the
    same snapshot (one whose data is not bytes is missing: read it alone)."""

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
    one whose kind starts with ``prefix`` (``calibration:``) and whose version is not the one
    the caller holds (``held``: version by kind)."""

    prefix: str
    held: Mapping[str, int] = field(default_factory=dict)

    def wants(self, kind: str, version: int) -> bool:
        """Whether the record ``kind``, at ``version`` in the store, is to be read."""
        return kind.startswith(self.prefix) and self.held.get(kind) != version


@runtime_checkable
class ReplicaConsistency(Protocol):
    """What lets several processes share the store and give the same answers: versioned
    records (those of :class:`RecordStore`, their version bumped with each write), one cheap
    read of a session's versions, and leases (locks with a token and an expiry). May raise
    :class:`StoreError`."""

    @property
    def shared(self) -> bool:
        """Whether other processes may write this store while this one runs (Redis: always;
        SQLite: when configured so); when not, in-memory copies stay authoritative."""

    async def session_versions(self, session_id: str,
                               fetch: RecordFetch | None = None) -> SessionVersions:
        """The session's versions, and the records ``fetch`` wants, in one round trip."""

    async def get_versioned_record(self, session_id: str, kind: str
                                   ) -> tuple[int, bytes] | None:
        """The record ``kind`` and its version, read together (``None``: no such record)."""

    async def put_versioned_record(self, session_id: str, kind: str, data: bytes) -> int:
        """Store (replace) the record ``kind`` and bump its version atomically; returns the
        new version."""

    async def acquire_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """Take the lease ``name`` for ``ttl_ms`` milliseconds for the holder ``token`` if it
        is free or expired; ``True`` when taken."""

    async def extend_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """Renew the lease to ``ttl_ms`` from now if ``token`` still holds it."""

    async def release_lock(self, name: str, token: str) -> bool:
        """Drop the lease if ``token`` still holds it (never another holder's)."""


@runtime_checkable
class StoreBackend(StateStore, SummaryCache, RecordStore, UsageLedger, RequestLog,
                   ReplicaConsistency, Protocol):
    """One engine's store: every part above, plus its lifecycle (construction does no I/O)."""

    async def open(self) -> Self:
        """Connect and verify the backend now, as startup does (idempotent); on failure the
        store is closed and :class:`StoreError` raised."""

    async def close(self) -> None:
        """Release the backend's resources (idempotent); later calls raise :class:`StoreError`."""
