"""The console's edits of a durable state: one form in, the next state out (no I/O).

Each form names one operation (:data:`EDITS`) on one fact or pending item. A bad value is a
:class:`FormError` naming the field, with the message the item types give, so the page can
show it next to the form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Final, TypeVar

from compactor import DurableContextState, DurableFact, PendingItem

__all__ = ["EDITS", "FormError", "apply_edit", "parse_version"]

_Item = TypeVar("_Item", DurableFact, PendingItem)


class FormError(ValueError):
    """A form value the console refuses; ``field`` names it (``content``, ``version``...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def parse_version(raw: str | None) -> int | None:
    """The ``version`` a form was loaded with (``""``: no state yet); a :class:`FormError`
    when not a positive integer."""
    if raw is None:
        raise FormError("version", "version: missing; reload the page")
    value = raw.strip()
    if not value:
        return None
    if not value.isascii() or not value.isdigit() or int(value) < 1 or len(value) > 19:
        raise FormError("version", "version: must be the version the page was loaded with")
    return int(value)


def _field(form: Mapping[str, str], name: str) -> str:
    value = form.get(name)
    if value is None:
        raise FormError(name, f"{name}: missing")
    return value


def _timestamp(form: Mapping[str, str], now: datetime) -> datetime | str:
    """``last_confirmed_at`` as typed (checked by the item), or now when left blank."""
    raw = form.get("last_confirmed_at", "").strip()
    return raw if raw else now


def _status(form: Mapping[str, str]) -> str:
    """The form's ``status`` (checked by the item: ``status: must be one of ...``)."""
    return form.get("status", "open").strip() or "open"


def _index(items: tuple[object, ...], id_field: str, item_id: str, noun: str) -> int:
    for index, item in enumerate(items):
        if getattr(item, id_field) == item_id:
            return index
    raise FormError(id_field, f"{id_field}: no {noun} {item_id!r} in this state")


def _fact(form: Mapping[str, str], fact_id: str, now: datetime) -> DurableFact:
    return DurableFact(fact_id=fact_id, content=_field(form, "content"),
                       source_pointer=_field(form, "source_pointer").strip(),
                       last_confirmed_at=_timestamp(form, now))


def _pending(form: Mapping[str, str], item_id: str, status: str, now: datetime) -> PendingItem:
    return PendingItem(item_id=item_id, description=_field(form, "description"),
                       source_pointer=_field(form, "source_pointer").strip(),
                       last_confirmed_at=_timestamp(form, now), status=status)


def _with(items: tuple[_Item, ...], index: int, *new: _Item) -> tuple[_Item, ...]:
    """``items`` with the one at ``index`` replaced by ``new`` (removed when none given)."""
    return items[:index] + new + items[index + 1:]


def _add_fact(state: DurableContextState, form: Mapping[str, str],
              now: datetime) -> DurableContextState:
    fact = _fact(form, _field(form, "fact_id").strip(), now)
    if any(existing.fact_id == fact.fact_id for existing in state.facts):
        raise FormError("fact_id", f"fact_id: a fact {fact.fact_id!r} already exists")
    return replace(state, facts=(*state.facts, fact))


def _edit_fact(state: DurableContextState, form: Mapping[str, str],
               now: datetime) -> DurableContextState:
    fact_id = _field(form, "fact_id")
    index = _index(state.facts, "fact_id", fact_id, "fact")
    return replace(state, facts=_with(state.facts, index, _fact(form, fact_id, now)))


def _delete_fact(state: DurableContextState, form: Mapping[str, str],
                 now: datetime) -> DurableContextState:
    index = _index(state.facts, "fact_id", _field(form, "fact_id"), "fact")
    return replace(state, facts=_with(state.facts, index))


def _add_pending(state: DurableContextState, form: Mapping[str, str],
                 now: datetime) -> DurableContextState:
    item = _pending(form, _field(form, "item_id").strip(), _status(form), now)
    if any(existing.item_id == item.item_id for existing in state.pending_items):
        raise FormError("item_id", f"item_id: a pending item {item.item_id!r} already exists")
    return replace(state, pending_items=(*state.pending_items, item))


def _edit_pending(state: DurableContextState, form: Mapping[str, str],
                  now: datetime) -> DurableContextState:
    item_id = _field(form, "item_id")
    index = _index(state.pending_items, "item_id", item_id, "pending item")
    status = _status(form) if "status" in form else state.pending_items[index].status
    item = _pending(form, item_id, status, now)
    return replace(state, pending_items=_with(state.pending_items, index, item))


def _delete_pending(state: DurableContextState, form: Mapping[str, str],
                    now: datetime) -> DurableContextState:
    index = _index(state.pending_items, "item_id", _field(form, "item_id"), "pending item")
    return replace(state, pending_items=_with(state.pending_items, index))


def _set_status(state: DurableContextState, form: Mapping[str, str],
                now: datetime) -> DurableContextState:
    index = _index(state.pending_items, "item_id", _field(form, "item_id"), "pending item")
    old = state.pending_items[index]
    item = PendingItem(item_id=old.item_id, description=old.description,
                       source_pointer=old.source_pointer,
                       last_confirmed_at=old.last_confirmed_at, status=_status(form))
    return replace(state, pending_items=_with(state.pending_items, index, item))


_Apply = Callable[[DurableContextState, Mapping[str, str], datetime], DurableContextState]

#: Every edit the console offers, by (kind, operation): the routes are built from this table.
EDITS: Final[Mapping[tuple[str, str], _Apply]] = {
    ("fact", "add"): _add_fact,
    ("fact", "edit"): _edit_fact,
    ("fact", "delete"): _delete_fact,
    ("pending", "add"): _add_pending,
    ("pending", "edit"): _edit_pending,
    ("pending", "delete"): _delete_pending,
    ("pending", "status"): _set_status,
}


def apply_edit(state: DurableContextState | None, kind: str, operation: str,
               form: Mapping[str, str], *, now: datetime | None = None) -> DurableContextState:
    """The state after one console edit of ``state`` (``None``: no state yet); a bad value,
    an unknown item or a duplicate id is a :class:`FormError` naming the field."""
    apply = EDITS[(kind, operation)]
    try:
        return apply(state or DurableContextState(), form, now or datetime.now(UTC))
    except FormError:
        raise
    except ValueError as exc:  # an item type's "<field>: <problem>"
        message = str(exc)
        field = message.partition(":")[0].rsplit(".", 1)[-1].split("[", 1)[0] or "form"
        raise FormError(field, message) from None
