"""The per-session store interface: what the proxy and the admin API may ask of a backend.

Handlers only ever see :class:`StateStore`; the SQLite backend (``proxy.store.sqlite``) is one
implementation and a Redis one can be added without touching them.

Theory of operation
-------------------
Each session has at most one durable state, stored with an integer ``version``. The first write
creates version 1; every later write must name the version it replaces (compare-and-swap) and
produces ``version + 1``. A writer that names a version other than the current one gets
:class:`VersionConflict` and nothing is written, so of several writers racing from the same
version exactly one wins. This is what backs the admin API's ``ETag``/``If-Match``.

Besides the durable state, the store keeps two caches for the compaction layer. Neither is
durable context; losing them only costs a recomputation:

- a content-addressed summary cache (``key`` -> summary text), bounded: once it holds more
  than the backend's limit, the oldest entries are evicted;
- opaque per-session records (``(session_id, kind)`` -> bytes), overwritten on each put.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from compactor import DurableContextState

__all__ = [
    "CorruptStateError",
    "StateStore",
    "StoreError",
    "StoredState",
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
    """The async interface every store backend implements.

    All methods may raise :class:`StoreError` when the backend fails.
    """

    async def get_state(self, session_id: str) -> StoredState | None:
        """Return the session's current state, or ``None`` when it has none."""
        ...

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None) -> StoredState:
        """Write ``state`` atomically if the stored version is ``expected_version``.

        ``None`` creates the state and conflicts if one exists; an int must equal the current
        version. The new version is the old one plus 1 (1 on creation).

        Raises:
            VersionConflict: the precondition did not hold; nothing was written.
        """
        ...

    async def delete_state(self, session_id: str, expected_version: int | None = None) -> bool:
        """Delete the session's state; ``True`` if one was deleted, ``False`` if none existed.

        When ``expected_version`` is given, an existing state at another version is kept.

        Raises:
            VersionConflict: a state exists at a version other than ``expected_version``.
        """
        ...

    async def get_summary(self, key: str) -> str | None:
        """Return the cached summary stored under ``key``, or ``None``."""
        ...

    async def put_summary(self, key: str, text: str) -> None:
        """Cache ``text`` under ``key``, evicting the oldest entries beyond the bound."""
        ...

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        """Return the opaque compaction record ``kind`` of the session, or ``None``."""
        ...

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        """Store (replace) the opaque compaction record ``kind`` of the session."""
        ...

    async def close(self) -> None:
        """Release the backend's resources; later calls raise :class:`StoreError`."""
        ...


def decode_state(session_id: str, version: int, state_json: str | bytes,
                 updated_at: str) -> StoredState:
    """A stored row turned back into a :class:`StoredState`, or :class:`CorruptStateError`.

    Shared by every backend: whatever the row's encoding, the state must be a JSON object
    that validates as a ``DurableContextState`` and ``updated_at`` an ISO time with a zone.
    """
    try:
        data = json.loads(state_json)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise CorruptStateError(session_id, f"state is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CorruptStateError(session_id, "state is not a JSON object")
    try:
        state = DurableContextState.from_dict(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptStateError(session_id, f"state does not validate: {exc}") from None
    try:
        when = datetime.fromisoformat(updated_at)
    except ValueError:
        raise CorruptStateError(session_id, "updated_at is not an ISO timestamp") from None
    if when.tzinfo is None:
        raise CorruptStateError(session_id, "updated_at has no timezone")
    return StoredState(session_id=session_id, version=version, state=state, updated_at=when)
