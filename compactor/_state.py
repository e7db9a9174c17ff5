"""The durable context state: operator-maintained facts, pending items and frozen
retrieval evidence, each tied to a source pointer.

This state never passes through the lossy compaction layers and a summary can never change
it; only the admin API replaces it (SPEC section 6). So the types here are frozen, hold
tuples, and check everything at construction: a value that exists is a valid value.

Validation errors are ``ValueError`` whose message starts with the field path (``fact_id:
...`` from a single item, ``facts[1].last_confirmed_at: ...`` from the state or from
:meth:`DurableContextState.from_dict`), because the admin API answers 400 with that message.

Timestamps (``last_confirmed_at``, ``captured_at``) may be given as an aware ``datetime`` or
as an ISO 8601 string with an offset or ``Z``; the attribute always holds the aware
``datetime``, so the two forms give equal items, the same JSON and the same rendering. A
naive timestamp (a ``datetime`` or a string without an offset) is refused.

Source pointers are stored as given (non-empty strings); their syntax is checked when they
are resolved, where a bad one becomes a ``denied`` or ``unsupported`` status instead of an
error, so a state written today still loads when a new scheme appears tomorrow.

Its items are in :mod:`._state_items`. Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from ._state_items import DurableFact, PendingItem, RetrievalEvidence

__all__ = [
    "DurableContextState",
    "capture_retrieval_evidence",
]


# --- the state --------------------------------------------------------------------------

_Item = TypeVar("_Item", DurableFact, PendingItem, RetrievalEvidence)


def _as_items(field: str, value: object, kind: type[_Item], id_field: str) -> tuple[_Item, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
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
    """A session's durable context: facts, pending items and retrieval evidence.

    Lists (any list or tuple) are stored as tuples; ids are unique within each kind.

    Args:
        facts: the :class:`DurableFact` items, in display order.
        pending_items: the :class:`PendingItem` items, in display order.
        retrieval_evidence: the :class:`RetrievalEvidence` items, in captured order.

    Raises:
        ValueError: an item of the wrong type or a duplicate id, e.g.
            ``facts[2].fact_id: duplicate id 'f1'``.
    """

    facts: tuple[DurableFact, ...]
    pending_items: tuple[PendingItem, ...]
    retrieval_evidence: tuple[RetrievalEvidence, ...]

    # A hand-written __init__ so the parameters can be typed as any sequence while the
    # fields stay tuples (the generated one would type the parameters as tuples).
    def __init__(
        self,
        facts: Sequence[DurableFact] = (),
        pending_items: Sequence[PendingItem] = (),
        retrieval_evidence: Sequence[RetrievalEvidence] = (),
    ) -> None:
        object.__setattr__(self, "facts", _as_items("facts", facts, DurableFact, "fact_id"))
        object.__setattr__(
            self, "pending_items",
            _as_items("pending_items", pending_items, PendingItem, "item_id"),
        )
        object.__setattr__(
            self, "retrieval_evidence",
            _as_items("retrieval_evidence", retrieval_evidence, RetrievalEvidence,
                      "memory_id"),
        )

    @property
    def is_empty(self) -> bool:
        """True when the state holds no item of any kind (it then renders to ``""``)."""
        return not (self.facts or self.pending_items or self.retrieval_evidence)

    def source_pointers(self) -> tuple[str, ...]:
        """The distinct pointer strings, first-seen order: facts, pending items, evidence."""
        seen: dict[str, None] = {}
        for fact in self.facts:
            seen.setdefault(fact.source_pointer, None)
        for item in self.pending_items:
            seen.setdefault(item.source_pointer, None)
        for evidence in self.retrieval_evidence:
            seen.setdefault(evidence.source_id, None)
        return tuple(seen)

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        """The JSON-ready form (the admin API body): field names as in the dataclasses,
        timestamps as ISO 8601 strings."""
        return {
            "facts": [fact.to_dict() for fact in self.facts],
            "pending_items": [item.to_dict() for item in self.pending_items],
            "retrieval_evidence": [ev.to_dict() for ev in self.retrieval_evidence],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DurableContextState:
        """Build from the :meth:`to_dict` shape.

        Missing lists are empty; unknown keys are refused; timestamps are ISO 8601 strings
        with an offset or ``Z``.

        Raises:
            ValueError: the message starts with the field path, e.g.
                ``facts[1].last_confirmed_at: timestamp has no timezone``.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"state: must be an object, got {type(data).__name__}")
        for key in data:
            if key not in _ITEM_PARSERS:
                raise ValueError(f"{key}: unknown field")
        lists: dict[str, tuple[Any, ...]] = {}
        for name, parse in _ITEM_PARSERS.items():
            raw = data.get(name, [])
            if not isinstance(raw, (list, tuple)):
                raise ValueError(f"{name}: must be a list, got {type(raw).__name__}")
            items: list[Any] = []
            for index, entry in enumerate(raw):
                try:
                    items.append(parse(entry))
                except ValueError as exc:
                    message = str(exc)
                    sep = "" if message.startswith(":") else "."
                    raise ValueError(f"{name}[{index}]{sep}{message}") from None
            lists[name] = tuple(items)
        return cls(**lists)


# The state's lists and how each entry is read from JSON, in display order.
_ITEM_PARSERS: dict[str, Callable[[Any], object]] = {
    "facts": DurableFact.from_dict,
    "pending_items": PendingItem.from_dict,
    "retrieval_evidence": RetrievalEvidence.from_dict,
}


# --- capture ----------------------------------------------------------------------------

_MISSING: Any = object()


def _get(hit: object, name: str) -> Any:
    if isinstance(hit, Mapping):
        return hit.get(name, _MISSING)
    return getattr(hit, name, _MISSING)


def capture_retrieval_evidence(
    hits: Iterable[object], *, now: datetime | None = None
) -> tuple[RetrievalEvidence, ...]:
    """Freeze already-selected retrieval hits into :class:`RetrievalEvidence`.

    Each hit is an object with attributes or a mapping with keys ``memory_id``,
    ``source_id``, ``source_type``, ``source_title``, ``score``, ``source_rank`` (or
    ``rank``), and optionally ``captured_at`` (a datetime or an ISO 8601 string) and
    ``conflict_key``. Text a hit carries (``text``, ``content``, ``excerpt``, ...) is never
    copied. The hits keep the order given: ranking and conflict decisions were made by the
    retriever and are recorded, not redone.

    Args:
        hits: the selected hits, in the retriever's order.
        now: the capture time for hits without ``captured_at``; default: now, in UTC.

    Returns:
        One :class:`RetrievalEvidence` per hit, same order.

    Raises:
        ValueError: a hit lacks a field, has an invalid one, disagrees between ``rank`` and
            ``source_rank``, or repeats a ``memory_id``; the message starts with
            ``hits[<index>].<field>``.
    """
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
        captured_at = _get(hit, "captured_at")
        conflict_key = _get(hit, "conflict_key")
        try:
            if captured_at is _MISSING or captured_at is None:
                captured_at = captured_default
            evidence = RetrievalEvidence(
                captured_at=captured_at,
                conflict_key=None if conflict_key is _MISSING else conflict_key,
                **values,
            )
        except ValueError as exc:
            raise ValueError(f"{prefix}.{exc}") from None
        if evidence.memory_id in seen:
            raise ValueError(f"{prefix}.memory_id: duplicate id {evidence.memory_id!r}")
        seen.add(evidence.memory_id)
        result.append(evidence)
    return tuple(result)
