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
from typing import Any, Final, Literal, get_args

__all__ = [
    "DurableFact",
    "PENDING_STATUSES",
    "PendingItem",
    "PendingStatus",
    "RetrievalEvidence",
]

#: A pending item's lifecycle. It changes only through the admin API (or the console, which
#: writes through the same store): a summary or a model reply saying "done" changes nothing.
PendingStatus = Literal["open", "blocked", "done"]
#: Every status, in lifecycle order (``open`` is the default).
PENDING_STATUSES: Final[tuple[PendingStatus, ...]] = get_args(PendingStatus)


# --- field checks -----------------------------------------------------------------------
# Each returns the (normalized) value or raises ValueError("<field>: <problem>").


def _check_id(field: str, value: object) -> str:
    """A non-empty, not whitespace-only string (ids, pointers)."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{field}: must not be empty or whitespace-only")
    return value


def _check_text(field: str, value: object) -> str:
    """Any string, possibly empty (free provenance text)."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: must be a string, got {type(value).__name__}")
    return value


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
    """A construction-time timestamp: an aware ``datetime``, or an ISO 8601 string with an
    offset or ``Z`` (the seed's form), parsed to one. Either way the result is an aware
    ``datetime``, so there is one representation afterwards."""
    if isinstance(value, str):
        return _parse_timestamp(field, value)
    return _check_timestamp(field, value)


def _iso(value: datetime) -> str:
    return value.isoformat()


# --- the item types ---------------------------------------------------------------------
# Don't subclass these: from_dict and the renderer rely on the exact field lists.


@dataclass(frozen=True, slots=True, init=False)
class DurableFact:
    """A fact the operator asserts, with the source it was confirmed against.

    Args:
        fact_id: unique among the state's facts; non-empty.
        content: the fact itself; non-empty.
        source_pointer: where it comes from (``transcript:...`` or ``artifact:...``).
        last_confirmed_at: when it was last checked: a timezone-aware ``datetime`` or an
            ISO 8601 string with an offset or ``Z`` (``"2026-11-30T10:00:00+00:00"``). The
            attribute always holds the aware ``datetime`` (a string is parsed, its offset
            kept), so both forms give equal items, the same :meth:`to_dict` and the same
            rendering.

    Raises:
        ValueError: a field is invalid (a naive or non-ISO timestamp included); the message
            starts with the field name.
    """

    fact_id: str
    content: str
    source_pointer: str
    last_confirmed_at: datetime

    # Hand-written so the timestamp parameter may be a string while the field stays a
    # datetime (the generated __init__ would type it as the field).
    def __init__(self, fact_id: str, content: str, source_pointer: str,
                 last_confirmed_at: datetime | str) -> None:
        object.__setattr__(self, "fact_id", _check_id("fact_id", fact_id))
        object.__setattr__(self, "content", _check_id("content", content))
        object.__setattr__(self, "source_pointer", _check_id("source_pointer", source_pointer))
        object.__setattr__(self, "last_confirmed_at",
                           _timestamp("last_confirmed_at", last_confirmed_at))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form: the dataclass fields, the timestamp as ISO 8601."""
        return {
            "fact_id": self.fact_id,
            "content": self.content,
            "source_pointer": self.source_pointer,
            "last_confirmed_at": _iso(self.last_confirmed_at),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DurableFact:
        """Build from the :meth:`to_dict` shape; errors name the field."""
        values = _fields_of(cls, data, optional=())
        return cls(
            fact_id=values["fact_id"],
            content=values["content"],
            source_pointer=values["source_pointer"],
            last_confirmed_at=_parse_timestamp("last_confirmed_at", values["last_confirmed_at"]),
        )


@dataclass(frozen=True, slots=True, init=False)
class PendingItem:
    """Something still to be done, with the source that raised it, and how far it got.

    Args:
        item_id: unique among the state's pending items; non-empty.
        description: what is pending; non-empty.
        source_pointer: where it comes from.
        last_confirmed_at: when it was last checked: an aware ``datetime`` or an ISO 8601
            string with an offset or ``Z``; the attribute always holds the aware
            ``datetime`` (see :class:`DurableFact`).
        status: ``open`` (the default), ``blocked`` or ``done``
            (:data:`PENDING_STATUSES`). Set by the operator only: nothing the model or a
            summary says changes it.

    Raises:
        ValueError: a field is invalid (a naive or non-ISO timestamp, an unknown status
            included); the message starts with the field name.
    """

    item_id: str
    description: str
    source_pointer: str
    last_confirmed_at: datetime
    status: PendingStatus

    def __init__(self, item_id: str, description: str, source_pointer: str,
                 last_confirmed_at: datetime | str, status: str = "open") -> None:
        object.__setattr__(self, "item_id", _check_id("item_id", item_id))
        object.__setattr__(self, "description", _check_id("description", description))
        object.__setattr__(self, "source_pointer", _check_id("source_pointer", source_pointer))
        object.__setattr__(self, "last_confirmed_at",
                           _timestamp("last_confirmed_at", last_confirmed_at))
        object.__setattr__(self, "status", _check_status("status", status))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form: the dataclass fields, the timestamp as ISO 8601."""
        return {
            "item_id": self.item_id,
            "description": self.description,
            "source_pointer": self.source_pointer,
            "last_confirmed_at": _iso(self.last_confirmed_at),
            "status": self.status,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingItem:
        """Build from the :meth:`to_dict` shape; errors name the field. A ``status`` that is
        absent (a state stored before pending items had one) is ``open``."""
        values = _fields_of(cls, data, optional=("status",))
        return cls(
            item_id=values["item_id"],
            description=values["description"],
            source_pointer=values["source_pointer"],
            last_confirmed_at=_parse_timestamp("last_confirmed_at", values["last_confirmed_at"]),
            status=values.get("status", "open"),
        )


@dataclass(frozen=True, slots=True, init=False)
class RetrievalEvidence:
    """A retrieval hit frozen at capture time: identity, provenance, score, rank and the
    conflict decision already made, never the recalled text.

    Args:
        memory_id: unique among the state's evidence; non-empty.
        source_id: the evidence's source pointer string (same syntax as ``source_pointer``).
        source_type: free provenance text (e.g. ``"transcript"``, ``"doc"``).
        source_title: free provenance text.
        captured_at: when the hit was captured: an aware ``datetime`` or an ISO 8601 string
            with an offset or ``Z``; the attribute always holds the aware ``datetime`` (see
            :class:`DurableFact`).
        score: the retriever's score, in [0, 1].
        source_rank: the 1-based rank the retriever gave it.
        conflict_key: set when this hit won a conflict under that key; None otherwise.

    Raises:
        ValueError: a field is invalid (a naive or non-ISO timestamp included); the message
            starts with the field name.
    """

    memory_id: str
    source_id: str
    source_type: str
    source_title: str
    captured_at: datetime
    score: float
    source_rank: int
    conflict_key: str | None = None

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

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form: the dataclass fields, the timestamp as ISO 8601."""
        return {
            "memory_id": self.memory_id,
            "source_id": self.source_id,
            "source_type": self.source_type,
            "source_title": self.source_title,
            "captured_at": _iso(self.captured_at),
            "score": self.score,
            "source_rank": self.source_rank,
            "conflict_key": self.conflict_key,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetrievalEvidence:
        """Build from the :meth:`to_dict` shape; ``conflict_key`` may be absent."""
        values = _fields_of(cls, data, optional=("conflict_key",))
        return cls(
            memory_id=values["memory_id"],
            source_id=values["source_id"],
            source_type=values["source_type"],
            source_title=values["source_title"],
            captured_at=_parse_timestamp("captured_at", values["captured_at"]),
            score=values["score"],
            source_rank=values["source_rank"],
            conflict_key=values.get("conflict_key"),
        )


def _fields_of(cls: type[Any], data: object, *, optional: tuple[str, ...]) -> dict[str, Any]:
    """Check ``data`` is a mapping with exactly ``cls``'s fields (``optional`` may be
    absent) and return it as a dict. Errors are ``"<field>: <problem>"`` or ``": <problem>"``
    for the item as a whole, so the caller can prefix the item's path."""
    if not isinstance(data, Mapping):
        raise ValueError(f": must be an object, got {type(data).__name__}")
    names = [f.name for f in fields(cls)]
    for key in data:
        if key not in names:
            raise ValueError(f"{key}: unknown field" if isinstance(key, str) else
                             f": unknown non-string key {key!r}")
    for name in names:
        if name not in data and name not in optional:
            raise ValueError(f"{name}: missing")
    return dict(data)

