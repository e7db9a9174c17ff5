"""The durable context state: operator-maintained facts, pending items and frozen retrieval
evidence (:mod:`._state_items`), each tied to a source pointer.

It never passes through the lossy layers and only the admin API replaces it, so the types are
frozen, hold tuples and check everything at construction. Errors are ``ValueError`` whose
message starts with the field path (``facts[1].last_confirmed_at: ...``): the admin API's 400.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ._state_items import DurableFact, PendingItem, RetrievalEvidence

__all__ = ["DurableContextState", "capture_retrieval_evidence"]


# --- the state --------------------------------------------------------------------------

# The state's lists in display order: the type of their items and its id field.
_KINDS: dict[str, tuple[type[Any], str]] = {
    "facts": (DurableFact, "fact_id"),
    "pending_items": (PendingItem, "item_id"),
    "retrieval_evidence": (RetrievalEvidence, "memory_id"),
}


def _as_items(field: str, value: object, kind: type[Any], id_field: str) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{field}: must be a list or tuple, got {type(value).__name__}")
    seen: set[str] = set()
    for index, item in enumerate(value):
        if not isinstance(item, kind):
            raise ValueError(
                f"{field}[{index}]: must be a {kind.__name__}, got {type(item).__name__}"
            )
        item_id = getattr(item, id_field)
        if item_id in seen:
            raise ValueError(f"{field}[{index}].{id_field}: duplicate id {item_id!r}")
        seen.add(item_id)
    return tuple(value)


@dataclass(frozen=True, slots=True, init=False)
class DurableContextState:
    """A session's durable context: facts and pending items in display order, retrieval
    evidence in captured order; stored as tuples, ids unique within each kind (else
    ``ValueError``, e.g. ``facts[2].fact_id: duplicate id 'f1'``)."""

    facts: tuple[DurableFact, ...]
    pending_items: tuple[PendingItem, ...]
    retrieval_evidence: tuple[RetrievalEvidence, ...]

    # Hand-written: the parameters are any sequence, the fields stay tuples.
    def __init__(
        self,
        facts: Sequence[DurableFact] = (),
        pending_items: Sequence[PendingItem] = (),
        retrieval_evidence: Sequence[RetrievalEvidence] = (),
    ) -> None:
        for name, value in zip(_KINDS, (facts, pending_items, retrieval_evidence), strict=True):
            object.__setattr__(self, name, _as_items(name, value, *_KINDS[name]))

    @property
    def is_empty(self) -> bool:
        """True when the state holds no item of any kind (it then renders to ``""``)."""
        return not (self.facts or self.pending_items or self.retrieval_evidence)

    def source_pointers(self) -> tuple[str, ...]:
        """The distinct pointer strings, first-seen order: facts, pending items, evidence."""
        pointers = [*(fact.source_pointer for fact in self.facts),
                    *(item.source_pointer for item in self.pending_items),
                    *(evidence.source_id for evidence in self.retrieval_evidence)]
        return tuple(dict.fromkeys(pointers))

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        """The JSON-ready form (the admin API body), timestamps as ISO 8601 strings."""
        return {
            "facts": [fact.to_dict() for fact in self.facts],
            "pending_items": [item.to_dict() for item in self.pending_items],
            "retrieval_evidence": [ev.to_dict() for ev in self.retrieval_evidence],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DurableContextState:
        """Build from the :meth:`to_dict` shape: missing lists are empty, unknown keys
        refused; a ``ValueError`` starts with the field path."""
        if not isinstance(data, Mapping):
            raise ValueError(f"state: must be an object, got {type(data).__name__}")
        for key in data:
            if key not in _KINDS:
                raise ValueError(f"{key}: unknown field")
        lists: dict[str, tuple[Any, ...]] = {}
        for name, (kind, _) in _KINDS.items():
            raw = data.get(name, [])
            if not isinstance(raw, (list, tuple)):
                raise ValueError(f"{name}: must be a list, got {type(raw).__name__}")
            items: list[Any] = []
            for index, entry in enumerate(raw):
                try:
                    items.append(kind.from_dict(entry))
                except ValueError as exc:
                    message = str(exc)
                    sep = "" if message.startswith(":") else "."
                    raise ValueError(f"{name}[{index}]{sep}{message}") from None
            lists[name] = tuple(items)
        return cls(**lists)


# --- capture ----------------------------------------------------------------------------

_MISSING: Any = object()


def _get(hit: object, name: str, default: Any = _MISSING) -> Any:
    if isinstance(hit, Mapping):
        return hit.get(name, default)
    return getattr(hit, name, default)


def capture_retrieval_evidence(
    hits: Iterable[object], *, now: datetime | None = None
) -> tuple[RetrievalEvidence, ...]:
    """Freeze already-selected retrieval hits, in the retriever's order, into
    :class:`RetrievalEvidence` (ranking and conflicts are recorded, not redone; a hit's text
    is never copied). A hit is an object or a mapping with the evidence's fields (``rank``
    may stand for ``source_rank``); ``now`` (default: now, UTC) dates hits without
    ``captured_at``. A ``ValueError`` starts with ``hits[<index>].<field>``."""
    captured_default = now if now is not None else datetime.now(UTC)
    result: list[RetrievalEvidence] = []
    seen: set[str] = set()
    for index, hit in enumerate(hits):
        prefix = f"hits[{index}]"
        rank = _get(hit, "source_rank")
        alt_rank = _get(hit, "rank")
        if rank is _MISSING or rank is None:
            rank = alt_rank
        elif alt_rank is not _MISSING and alt_rank is not None and alt_rank != rank:
            raise ValueError(
                f"{prefix}.source_rank: {rank!r} disagrees with rank {alt_rank!r}"
            )
        values = {name: _get(hit, name) for name in
                  ("memory_id", "source_id", "source_type", "source_title", "score")}
        values["source_rank"] = rank
        for name, value in values.items():
            if value is _MISSING:
                raise ValueError(f"{prefix}.{name}: missing")
        captured_at = _get(hit, "captured_at", None)
        try:
            evidence = RetrievalEvidence(
                captured_at=captured_default if captured_at is None else captured_at,
                conflict_key=_get(hit, "conflict_key", None), **values)
        except ValueError as exc:
            raise ValueError(f"{prefix}.{exc}") from None
        if evidence.memory_id in seen:
            raise ValueError(f"{prefix}.memory_id: duplicate id {evidence.memory_id!r}")
        seen.add(evidence.memory_id)
        result.append(evidence)
    return tuple(result)
