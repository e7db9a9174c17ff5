"""The audit log: what the proxy did to each session's requests, and who changed its state.

One :class:`RequestEntry` per ``/v1/messages`` and ``count_tokens`` request (figures, ids and
names only — never message text), one :class:`StateChange` per change of a session's durable
state made through the admin API or the console. Both are kept per session within bounds
(``audit.max_requests_per_session``, ``audit.retention_days``) by the store
(:class:`RequestLog`), written after the response (a request never waits for its record), and
read by the admin API, the console at ``/admin/ui/`` and the ``sessions`` / ``session`` /
``blocked`` commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "LayerSaving",
    "RequestEntry",
    "RequestLog",
    "SessionOrder",
    "SessionSummary",
    "StateChange",
]


@dataclass(frozen=True, slots=True)
class LayerSaving:
    """One layer that ran on a request, and the tokens it saved (0 when it saved none)."""

    layer: str
    saved: int


@dataclass(frozen=True, slots=True)
class RequestEntry:
    """One request as the audit log keeps it.

    Attributes:
        at: when it arrived (UTC).
        request_id: the proxy's id of the request (``x-compact-request-id``).
        session_id: the client's session id.
        tenant: whose session it is (``none``, ``t…``, ``h…``).
        route: ``messages`` or ``count_tokens``.
        role: the compaction role (``main``, ``subagent``, …), once chosen.
        model: the model the client asked for.
        tokens_before: the history's size as the provider would count it.
        tokens_after: the forwarded view's size.
        layers: the layers that ran, with what each saved.
        outcome: how the request ended (``proxy.http.audit.Outcome``'s value).
        reason: why it was refused (``MessageViewLimitExceeded``, ``ToolProtocolError``, …).
        hard_limit: the hard limit it was judged by, when it was refused for size.
        status: the status the client got.
        upstream_status: the provider's status, when it answered.
        usage_input, usage_cache_read, usage_cache_write, usage_output: the provider's
            ``usage`` of its answer, when it reported one.
        duration_ms: the time from arrival to the end of the response.
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
    layers: tuple[LayerSaving, ...] = field(default=())
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

    @property
    def blocked(self) -> bool:
        """Whether the proxy refused it (it never reached the provider)."""
        return self.reason is not None


@dataclass(frozen=True, slots=True)
class StateChange:
    """One change of a session's durable state, made through the admin API or the console.

    Attributes:
        at: when (UTC).
        session_id: the client's session id.
        tenant: whose session it is.
        actor: who made it: ``admin-api`` or ``console``, with the ``X-Compact-Actor`` header's
            value when the caller sent one (``console:alice``).
        action: ``put`` (created or replaced) or ``delete``.
        version: the version written (``None`` for a delete).
        detail: what changed, as ids and statuses only (``pending changelog: open -> done``,
            ``fact keep-api added``); never the content.
    """

    at: datetime
    session_id: str
    tenant: str
    actor: str
    action: Literal["put", "delete"]
    version: int | None
    detail: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A session's totals over the requests the audit log holds for it.

    Attributes:
        session_id: the client's session id.
        tenant: whose session it is.
        last_seen: when its newest request arrived.
        requests: requests held.
        tokens_before: sum of their ``tokens_before``.
        tokens_after: sum of their ``tokens_after``.
        blocked: how many were refused.
    """

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


SessionOrder = Literal["last_seen", "blocked"]


@runtime_checkable
class RequestLog(Protocol):
    """The store's audit log; every method may raise ``StoreError``.

    Bounds: a session keeps at most ``max_requests_per_session`` request entries (the oldest
    go first) and nothing older than ``retention_days`` (trimmed on write and by :meth:`trim`).
    """

    async def add_request(self, entry: RequestEntry) -> None:
        """Keep ``entry`` (and drop what the bounds no longer allow)."""
        ...

    async def add_state_change(self, change: StateChange) -> None:
        """Keep ``change`` (within the same retention)."""
        ...

    async def sessions(self, *, offset: int = 0, limit: int = 50, contains: str | None = None,
                       order: SessionOrder = "last_seen") -> tuple[list[SessionSummary], int]:
        """One page of sessions, newest (or most blocked) first, and how many match in all;
        ``contains`` keeps the sessions whose id contains it."""
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
