"""The audit log: what the proxy did to each session's requests, and who changed its state.

One :class:`RequestEntry` per ``/v1/messages`` and ``count_tokens`` request (never message
text), one :class:`StateChange` per durable-state change made through the admin API or the
console, kept per session within ``audit.*`` bounds by the store (:class:`RequestLog`).
Each type's JSON form (``as_json``, read back by ``from_json``) is what the admin API answers
and ``--json`` prints: field names as declared, times ISO 8601 in UTC. Operators:
docs/operations.md, "The audit log".
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol, get_args, runtime_checkable

import msgspec

from compactor import DurableContextState

__all__ = ["DEFAULT_MAX_REQUESTS_PER_SESSION", "DEFAULT_RETENTION_DAYS", "SESSION_ORDERS",
           "LayerSaving", "RequestEntry", "RequestLog", "SessionOrder", "SessionSummary",
           "StateChange", "state_change_detail", "utc_iso"]

#: The bounds a store keeps when none are configured (``audit.*``).
DEFAULT_MAX_REQUESTS_PER_SESSION: Final = 1000
DEFAULT_RETENTION_DAYS: Final = 14


def utc_iso(when: datetime) -> str:
    """``when.astimezone(UTC).isoformat(timespec="microseconds")`` (fixed width, so later
    times compare greater as text too), written by msgspec's RFC 3339 encoder."""
    utc = when.astimezone(UTC)
    text = _RFC3339.encode(utc)[1:-2].decode("ascii")  # (without the quotes and the Z)
    return text + (".000000+00:00" if utc.microsecond == 0 else "+00:00")


_RFC3339: Final = msgspec.json.Encoder()


def _time(name: str, value: object) -> datetime:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            when = datetime.fromisoformat(value)
            if when.tzinfo is not None:
                return when
    raise ValueError(f"{name}: not an ISO time with a zone")


def _text(name: str, value: object, *, optional: bool = False) -> Any:
    if (value is None and optional) or isinstance(value, str):
        return value
    raise ValueError(f"{name}: not a string")


def _count(name: str, value: object, *, optional: bool = True) -> Any:
    if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError(f"{name}: not an integer")


@dataclass(frozen=True, slots=True)
class LayerSaving:
    """One layer that ran on a request, and the tokens it saved (0 when it saved none)."""

    layer: str
    saved: int


class RequestEntry(msgspec.Struct, frozen=True):
    """One request as the audit log keeps it; the fields are the admin API's (docs/admin.md).

    ``layers``: each layer that ran with the tokens it saved (0 included), then ``sticky``
    when the session's kept compaction was reused. ``outcome`` is
    ``proxy.http.audit.Outcome``'s value; ``reason`` names a refusal. The thresholds are the
    role's as they were for this request (``None`` in older entries); ``summary_key`` names the
    L4 summary in the summary cache; ``protocol_kind`` / ``tool_use_id`` a tool-protocol refusal.
    """

    at: datetime
    request_id: str
    session_id: str
    tenant: str
    route: str
    role: str | None = None
    model: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    layers: tuple[LayerSaving, ...] = ()
    outcome: str = ""
    reason: str | None = None
    hard_limit: int | None = None
    status: int | None = None
    upstream_status: int | None = None
    usage_input: int | None = None
    usage_cache_read: int | None = None
    usage_cache_write: int | None = None
    usage_output: int | None = None
    duration_ms: float = 0.0
    soft_threshold_tokens: int | None = None
    hard_limit_tokens: int | None = None
    summary_key: str | None = None
    protocol_kind: str | None = None
    tool_use_id: str | None = None

    @property
    def blocked(self) -> bool:
        """Whether a limit of the proxy refused it (a client's mistake is ``invalid``; an
        older entry without an outcome is blocked when it has a reason)."""
        return self.outcome == "blocked" or (self.outcome == "" and self.reason is not None)

    def as_json(self) -> dict[str, Any]:
        """Every field by name (``at`` as ISO 8601 in UTC, ``layers`` as
        ``[{"layer", "saved"}]``), plus ``blocked``."""
        out: dict[str, Any] = msgspec.structs.asdict(self)  # (every field, in order: C)
        out["at"] = utc_iso(self.at)
        out["layers"] = [{"layer": saving.layer, "saved": saving.saved}
                         for saving in self.layers]
        out["blocked"] = self.blocked
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestEntry:
        """Read :meth:`as_json`'s form back; a bad field is a ValueError naming it."""
        layers = data.get("layers", [])
        if not isinstance(layers, list) or not all(
                isinstance(item, Mapping) and isinstance(item.get("layer"), str)
                and _count("layers", item.get("saved"), optional=False) is not None
                for item in layers):
            raise ValueError("layers: not a list of {layer, saved}")
        duration = data.get("duration_ms", 0.0)
        if isinstance(duration, bool) or not isinstance(duration, int | float):
            raise ValueError("duration_ms: not a number")
        values: dict[str, Any] = {
            "layers": tuple(LayerSaving(item["layer"], item["saved"]) for item in layers),
            "duration_ms": float(duration)}
        for info in msgspec.structs.fields(cls):  # (declaration order: the first bad one)
            value = data.get(info.name, None if info.required else info.default)
            if info.name == "at":
                values["at"] = _time("at", value)
            elif info.type == int | None:
                values[info.name] = _count(info.name, value)
            elif info.name not in values:
                values[info.name] = _text(info.name, value, optional=info.type is not str)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class StateChange:
    """One change of a session's durable state, made through the admin API or the console.

    ``actor`` is ``admin-api`` or ``console``, with the ``X-Compact-Actor`` header's value when
    sent (``console:alice``); ``version`` is ``None`` for a delete; ``detail`` says what changed
    as ids and statuses only (:func:`state_change_detail`), never the content.
    """

    at: datetime
    session_id: str
    tenant: str
    actor: str
    action: Literal["put", "delete"]
    version: int | None
    detail: tuple[str, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        """Every field by name, ``at`` as ISO 8601 in UTC, ``detail`` as a list."""
        return {**asdict(self), "at": utc_iso(self.at), "detail": list(self.detail)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateChange:
        """Read :meth:`as_json`'s form back; a bad field is a ValueError naming it."""
        action = data.get("action")
        if action not in ("put", "delete"):
            raise ValueError("action: not put or delete")
        detail = data.get("detail", [])
        if not isinstance(detail, list) or not all(isinstance(line, str) for line in detail):
            raise ValueError("detail: not a list of strings")
        return cls(at=_time("at", data.get("at")),
                   session_id=_text("session_id", data.get("session_id")),
                   tenant=_text("tenant", data.get("tenant")),
                   actor=_text("actor", data.get("actor")), action=action,
                   version=_count("version", data.get("version")), detail=tuple(detail))


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A session's totals over the requests the audit log holds for it (``last_seen``: its
    newest request; ``blocked``: how many were refused)."""

    session_id: str
    tenant: str
    last_seen: datetime
    requests: int
    tokens_before: int
    tokens_after: int
    blocked: int

    @property
    def saved_ratio(self) -> float | None:
        """``1 - after / before``; ``None`` when nothing was counted."""
        if self.tokens_before <= 0:
            return None
        return 1 - self.tokens_after / self.tokens_before

    def as_json(self) -> dict[str, Any]:
        """Every field by name, ``last_seen`` as ISO 8601 in UTC, plus ``saved_ratio``."""
        ratio = self.saved_ratio
        return {"session_id": self.session_id, "tenant": self.tenant,
                "last_seen": utc_iso(self.last_seen), "requests": self.requests,
                "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
                "saved_ratio": None if ratio is None else round(ratio, 4),
                "blocked": self.blocked}


SessionOrder = Literal["last_seen", "blocked"]
#: Every order :meth:`RequestLog.sessions` takes.
SESSION_ORDERS: Final[tuple[SessionOrder, ...]] = get_args(SessionOrder)


def _without_status(item: Any) -> dict[str, Any]:
    data: dict[str, Any] = item.to_dict()
    data.pop("status", None)
    return data


def state_change_detail(old: DurableContextState | None,
                        new: DurableContextState | None) -> tuple[str, ...]:
    """What replacing ``old`` by ``new`` changed (``None``: no state), as ids and statuses
    (``fact keep-api added``, ``pending changelog: open -> done``, ``evidence m1 removed``):
    items in ``new``'s order, then the removed ones in ``old``'s."""
    before = old or DurableContextState()
    after = new or DurableContextState()
    detail: list[str] = []
    kinds = (("fact", "fact_id", before.facts, after.facts),
             ("pending", "item_id", before.pending_items, after.pending_items),
             ("evidence", "memory_id", before.retrieval_evidence, after.retrieval_evidence))
    for noun, id_field, old_items, new_items in kinds:
        previous: dict[str, Any] = {getattr(item, id_field): item for item in old_items}
        kept: set[str] = set()
        for item in new_items:
            item_id = getattr(item, id_field)
            was = previous.get(item_id)
            if was is None:
                status = getattr(item, "status", None)
                detail.append(f"{noun} {item_id} added" + (f" ({status})" if status else ""))
                continue
            kept.add(item_id)
            if was == item:
                continue
            was_status, status = getattr(was, "status", None), getattr(item, "status", None)
            if was_status == status or _without_status(was) != _without_status(item):
                detail.append(f"{noun} {item_id} changed")
            if was_status != status:
                detail.append(f"{noun} {item_id}: {was_status} -> {status}")
        detail.extend(f"{noun} {item_id} removed" for item_id in previous if item_id not in kept)
    return tuple(detail)


@runtime_checkable
class RequestLog(Protocol):
    """The store's audit log; every method may raise ``StoreError``.

    Bounds: a session keeps at most ``max_requests_per_session`` request entries (the oldest
    go first) and nothing older than ``retention_days`` (trimmed on write and by :meth:`trim`).
    """

    def add_request(self, entry: RequestEntry) -> Awaitable[None]:
        """Keep ``entry`` (dropping what the bounds no longer allow); the awaitable (a future
        or a coroutine) is done once it is written. A bad argument may raise at once."""
        ...

    async def add_state_change(self, change: StateChange) -> None:
        """Keep ``change`` (within the same retention)."""
        ...

    async def flush(self) -> None:
        """Write the entries :meth:`add_request` still holds back (its own reads see them)."""
        ...

    async def sessions(self, *, offset: int = 0, limit: int = 50, contains: str | None = None,
                       order: SessionOrder = "last_seen",
                       tenant: str | None = None) -> tuple[list[SessionSummary], int]:
        """One page of sessions, newest (or most blocked, then newest) first, and how many
        match in all; ``contains`` keeps the sessions whose id contains it (ignoring ASCII
        case), ``tenant`` those of that tenant."""
        ...

    async def session_requests(self, tenant: str, session_id: str, *, offset: int = 0,
                               limit: int = 100) -> tuple[list[RequestEntry], int]:
        """One page of a session's requests, newest first, and how many it has in all."""
        ...

    async def state_changes(self, tenant: str, session_id: str, *,
                            limit: int = 100) -> list[StateChange]:
        """A session's state changes, newest first."""
        ...

    async def blocked_since(self, since: datetime, *, limit: int = 1000) -> list[RequestEntry]:
        """Refused requests that arrived at or after ``since``, oldest first."""
        ...

    async def trim(self, now: datetime) -> int:
        """Drop what is older than the retention; returns how many entries went."""
        ...
