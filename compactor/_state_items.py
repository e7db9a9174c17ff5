"""The items of the durable context state (:mod:`._state`): facts, pending items and frozen
retrieval evidence, each checked field by field at construction.

Validation errors are ``ValueError`` whose message starts with the field (``fact_id: ...``),
which the state prefixes with the item's path (``facts[1].last_confirmed_at: ...``).
Timestamps may be given as an aware ``datetime`` or an ISO 8601 string with an offset or
``Z``; the attribute always holds the aware ``datetime``; a naive one is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Literal, Self, cast, get_args

__all__ = ["DurableFact", "PENDING_STATUSES", "PendingItem", "PendingStatus", "RetrievalEvidence"]

#: A pending item's lifecycle: it changes only through the admin API (docs/admin.md).
PendingStatus = Literal["open", "blocked", "done"]
#: Every status, in lifecycle order (``open`` is the default).
PENDING_STATUSES: Final[tuple[PendingStatus, ...]] = get_args(PendingStatus)


# --- field checks -----------------------------------------------------------------------
# Each returns the (normalized) value or raises ValueError("<field>: <problem>").


def _check_text(field: str, value: object) -> str:
    """Any string, possibly empty (free provenance text)."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: must be a string, got {type(value).__name__}")
    return value


def _check_id(field: str, value: object) -> str:
    """A non-empty, not whitespace-only string (ids, pointers)."""
    text = _check_text(field, value)
    if not text.strip():
        raise ValueError(f"{field}: must not be empty or whitespace-only")
    return text


def _check_status(field: str, value: object) -> PendingStatus:
    if not isinstance(value, str) or value not in PENDING_STATUSES:
        shown = repr(value) if isinstance(value, str) else type(value).__name__
        raise ValueError(f"{field}: must be one of {', '.join(PENDING_STATUSES)}, got {shown}")
    return value  # narrowed to the literals by the check above


def _check_timestamp(field: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise ValueError(
            f"{field}: must be a timezone-aware datetime or an ISO 8601 string with a "
            f"timezone, got {type(value).__name__}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{field}: timestamp has no timezone")
    try:
        # The renderer shows UTC; a year-1 time east of UTC has no UTC equivalent.
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{field}: timestamp is out of range once converted to UTC") from None
    return value


def _check_score(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field}: must be a number in [0, 1], got {type(value).__name__}")
    score = float(value)
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        raise ValueError(f"{field}: must be in [0, 1], got {value!r}")
    return score


def _check_rank(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field}: must be an integer >= 1, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{field}: must be >= 1, got {value}")
    return value


def _parse_timestamp(field: str, value: object) -> datetime:
    """An ISO 8601 string with an offset or ``Z`` (the JSON form of a timestamp)."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: must be an ISO 8601 string, got {type(value).__name__}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{field}: {value!r} is not an ISO 8601 timestamp") from None
    return _check_timestamp(field, parsed)


def _timestamp(field: str, value: object) -> datetime:
    """An aware ``datetime``, given as one or as an ISO 8601 string with an offset."""
    if isinstance(value, str):
        return _parse_timestamp(field, value)
    return _check_timestamp(field, value)


# --- the item types ---------------------------------------------------------------------


class _JsonForm:
    """The JSON form the item types share: the fields by name, the ``_TIMESTAMP`` one as an
    ISO 8601 string; the fields in ``_OPTIONAL`` may be absent from it."""

    __slots__ = ()
    _TIMESTAMP: ClassVar[str] = "last_confirmed_at"
    _OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form: the fields, the timestamp as ISO 8601."""
        values = {f.name: getattr(self, f.name) for f in fields(cast(Any, self))}
        return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in values.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build from the :meth:`to_dict` shape, exactly its fields; errors are
        ``"<field>: <problem>"`` (``": <problem>"`` for the whole item)."""
        if not isinstance(data, Mapping):
            raise ValueError(f": must be an object, got {type(data).__name__}")
        names = [f.name for f in fields(cast(Any, cls))]
        for key in data:
            if key not in names:
                raise ValueError(f"{key}: unknown field" if isinstance(key, str) else
                                 f": unknown non-string key {key!r}")
        for name in names:
            if name not in data and name not in cls._OPTIONAL:
                raise ValueError(f"{name}: missing")
        values = dict(data)
        values[cls._TIMESTAMP] = _parse_timestamp(cls._TIMESTAMP, values[cls._TIMESTAMP])
        return cls(**values)


# Don't subclass these: from_dict and the renderer rely on the exact field lists.
@dataclass(frozen=True, slots=True, init=False)
class DurableFact(_JsonForm):
    """A fact the operator asserts, with the source it was confirmed against.

    ``last_confirmed_at`` may be an aware ``datetime`` or an ISO 8601 string with an offset
    (parsed, offset kept): both give equal items. A bad field is a ``ValueError`` naming it.
    """

    fact_id: str
    content: str
    source_pointer: str
    last_confirmed_at: datetime

    # Hand-written: the timestamp may be given as a string, the field stays a datetime.
    def __init__(self, fact_id: str, content: str, source_pointer: str,
                 last_confirmed_at: datetime | str) -> None:
        object.__setattr__(self, "fact_id", _check_id("fact_id", fact_id))
        object.__setattr__(self, "content", _check_id("content", content))
        object.__setattr__(self, "source_pointer", _check_id("source_pointer", source_pointer))
        object.__setattr__(self, "last_confirmed_at",
                           _timestamp("last_confirmed_at", last_confirmed_at))


@dataclass(frozen=True, slots=True, init=False)
class PendingItem(_JsonForm):
    """Something still to be done, with the source that raised it, and its ``status``
    (:data:`PENDING_STATUSES`, the operator's alone). Fields are checked as
    :class:`DurableFact`'s."""

    item_id: str
    description: str
    source_pointer: str
    last_confirmed_at: datetime
    status: PendingStatus
    _OPTIONAL = ("status",)  # absent in older states: ``open``

    def __init__(self, item_id: str, description: str, source_pointer: str,
                 last_confirmed_at: datetime | str, status: str = "open") -> None:
        object.__setattr__(self, "item_id", _check_id("item_id", item_id))
        object.__setattr__(self, "description", _check_id("description", description))
        object.__setattr__(self, "source_pointer", _check_id("source_pointer", source_pointer))
        object.__setattr__(self, "last_confirmed_at",
                           _timestamp("last_confirmed_at", last_confirmed_at))
        object.__setattr__(self, "status", _check_status("status", status))


@dataclass(frozen=True, slots=True, init=False)
class RetrievalEvidence(_JsonForm):
    """A retrieval hit frozen at capture time: identity, provenance (``source_id`` is a
    pointer), ``score`` in [0, 1], 1-based ``source_rank`` and the ``conflict_key`` it won
    under (None: no conflict), never the recalled text. Fields are checked as
    :class:`DurableFact`'s."""

    memory_id: str
    source_id: str
    source_type: str
    source_title: str
    captured_at: datetime
    score: float
    source_rank: int
    conflict_key: str | None = None
    _TIMESTAMP = "captured_at"
    _OPTIONAL = ("conflict_key",)

    def __init__(self, memory_id: str, source_id: str, source_type: str, source_title: str,
                 captured_at: datetime | str, score: float, source_rank: int,
                 conflict_key: str | None = None) -> None:
        object.__setattr__(self, "memory_id", _check_id("memory_id", memory_id))
        object.__setattr__(self, "source_id", _check_id("source_id", source_id))
        object.__setattr__(self, "source_type", _check_text("source_type", source_type))
        object.__setattr__(self, "source_title", _check_text("source_title", source_title))
        object.__setattr__(self, "captured_at", _timestamp("captured_at", captured_at))
        object.__setattr__(self, "score", _check_score("score", score))
        object.__setattr__(self, "source_rank", _check_rank("source_rank", source_rank))
        if conflict_key is not None:
            _check_id("conflict_key", conflict_key)
        object.__setattr__(self, "conflict_key", conflict_key)
