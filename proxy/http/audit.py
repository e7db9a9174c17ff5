"""The per-request audit record and the outermost middleware that opens and closes it.

Handlers fill the :class:`RequestRecord` in as they learn things; when the request ends,
however it ends, the middleware writes its ``request_completed`` line (SPEC section 8), counts
it in the metrics and hands its audit entry to the store in the background.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Final

import msgspec
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from compactor import LayerOutcome
from proxy.accounting.usage import ProviderUsage
from proxy.audit.log import LayerSaving, RequestEntry
from proxy.telemetry.logs import start_request_fields

if TYPE_CHECKING:
    from proxy.http.services import Services

__all__ = ["AUDITED_ROUTES", "RECORD", "STICKY", "Outcome", "RequestRecord", "completed_fields",
           "layer_savings", "request_context_middleware", "route_name"]

_log = structlog.get_logger("proxy.request")


#: The routes whose requests the audit log keeps (when they have a session).
AUDITED_ROUTES: Final = frozenset({"messages", "count_tokens"})


class Outcome(StrEnum):
    """How a request ended: the ``outcome`` of its ``request_completed`` line and the label of
    ``compact_proxy_requests_total``. One list, so a dashboard can name every value."""

    OK = "ok"  # answered by the proxy itself (healthz, metrics, the admin API)
    FORWARDED = "forwarded"  # the provider answered below 400, relayed whole
    UPSTREAM_ERROR = "upstream_error"  # the provider's own 4xx/5xx, relayed
    UPSTREAM_ERROR_EVENT = "upstream_error_event"  # a stream carrying the provider's error event
    STREAM_FAILED = "stream_failed"  # the provider's stream broke or ended early
    UPSTREAM_TIMEOUT = "upstream_timeout"  # 504
    UPSTREAM_UNREACHABLE = "upstream_unreachable"  # 502
    UPSTREAM_BUSY = "upstream_busy"  # 529: no upstream connection free within pool_wait_s
    BLOCKED = "blocked"  # refused by a limit of the proxy (request_blocked says why)
    INVALID = "invalid"  # the client's mistake: bad JSON, a wrong shape, a bad admin token
    STORE_ERROR = "store_error"
    INTERNAL_ERROR = "internal_error"  # a bug: 500
    CLIENT_GONE = "client_gone"  # the client hung up first
    CANCELLED = "cancelled"  # the handler was cancelled before any status
    HTTP_ERROR = "http_error"  # any other status of 400 or more


class RequestRecord(msgspec.Struct):
    """What the proxy learnt about one request (SPEC section 8's ``request_completed``
    fields); mutable, owned by that request only."""

    request_id: str
    route: str
    session_id: str | None = None
    tenant: str | None = None
    role: str | None = None
    model: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    layers: tuple[str, ...] = ()  # the layers whose effect is in the view, in order
    layer_savings: tuple[LayerSaving, ...] = ()  # every layer that ran (0: not in the view)
    reason: str | None = None  # why the proxy refused it
    hard_limit: int | None = None
    upstream_status: int | None = None
    outcome: Outcome | None = None
    started: float = msgspec.field(default_factory=time.perf_counter)
    arrived: datetime = msgspec.field(default_factory=functools.partial(datetime.now, UTC))
    usage: ProviderUsage | None = None
    estimate_error: float | None = None  # (estimate - provider's count) / count, in %
    soft_threshold_tokens: int | None = None
    hard_limit_tokens: int | None = None
    summary_key: str | None = None
    protocol_kind: str | None = None
    tool_use_id: str | None = None
    path: str | None = None
    prefix_reused: bool = False
    fixed_tokens: int | None = None  # calibrated tokens of system, tools, durable block
    summary_served: str | None = None
    summary_wait_ms: float | None = None

    def response_headers(self) -> dict[str, str]:
        """The ``x-compact-*`` headers this request's response carries."""
        headers = {"x-compact-request-id": self.request_id}
        if self.session_id is not None:
            headers["x-compact-session-id"] = self.session_id
        if self.tokens_before is not None and self.tokens_after is not None:
            headers["x-compact-tokens-before"] = str(self.tokens_before)
            headers["x-compact-tokens-after"] = str(self.tokens_after)
            headers["x-compact-layers"] = ",".join(self.layers)
        return headers

    def compacted_because(self) -> str:
        """Why the view differs from the history, in a few words: ``42,663 ≥ soft 24,000``
        (the history against the soft threshold), with ``; sticky prefix reused`` when the
        session's kept compaction was carried over; ``""`` when nothing was compacted."""
        if not self.layers or self.tokens_before is None:
            return ""
        soft = self.soft_threshold_tokens
        parts = [] if soft is None else [
            f"{self.tokens_before:,} {'≥' if self.tokens_before >= soft else '<'} soft {soft:,}"]
        if self.prefix_reused:
            parts.append("sticky prefix reused")
        return "; ".join(parts)

    def audit_entry(self, status: int | None, outcome: Outcome,
                    duration_ms: float) -> RequestEntry | None:
        """What the audit log keeps of this request, once it ended with ``status`` (the
        client's) and ``outcome``; ``None`` for a route it does not keep, or before a
        session was known."""
        if self.route not in AUDITED_ROUTES or self.session_id is None:
            return None
        usage = self.usage
        return RequestEntry(
            at=self.arrived, request_id=self.request_id, session_id=self.session_id,
            tenant=self.tenant or "none", route=self.route, role=self.role, model=self.model,
            tokens_before=self.tokens_before, tokens_after=self.tokens_after,
            layers=self.layer_savings, outcome=str(outcome), reason=self.reason,
            hard_limit=self.hard_limit, status=status, upstream_status=self.upstream_status,
            usage_input=None if usage is None else usage.input,
            usage_cache_read=None if usage is None else usage.cache_read,
            usage_cache_write=None if usage is None else usage.cache_write,
            usage_output=None if usage is None else usage.output,
            duration_ms=duration_ms,
            soft_threshold_tokens=self.soft_threshold_tokens,
            hard_limit_tokens=self.hard_limit_tokens, summary_key=self.summary_key,
            protocol_kind=self.protocol_kind, tool_use_id=self.tool_use_id,
        )


#: The name of the reused compacted prefix in a request's savings (sticky compaction).
STICKY: Final = "sticky"


def layer_savings(outcomes: Iterable[LayerOutcome], *,
                  reused_saved: int | None = None) -> tuple[LayerSaving, ...]:
    """Every layer that ran, with what it saved: 0 when its change is not in the view (it
    changed nothing, failed, or a later layer superseded it); then, when the session's kept
    compaction was reused, :data:`STICKY` with ``reused_saved`` (the request's whole saving)
    less what the layers that ran saved."""
    savings = tuple(LayerSaving(o.layer, o.saved if o.applied else 0) for o in outcomes)
    if reused_saved is None:
        return savings
    return (*savings, LayerSaving(STICKY, max(0, reused_saved - sum(s.saved for s in savings))))


#: The audit record of the request being served.
RECORD: Final = web.RequestKey("record", RequestRecord)


def route_name(request: web.Request) -> str:
    """The route label of a request: the route's registered name, ``admin`` for the admin
    API, ``other`` when unnamed."""
    name = request.match_info.route.name
    if name:
        return name.partition(":")[0]  # a provider's route: ``messages:bedrock:r0``
    if request.path == "/admin" or request.path.startswith("/admin/"):
        return "admin"
    return "other"


def request_context_middleware(s: Services) -> Middleware:
    """The outermost middleware: opens the request's record, closes it with one log line
    (and, with ``audit.enabled``, an audit entry)."""
    audit = s.config.audit.enabled

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        record = RequestRecord(request_id=os.urandom(12).hex(), route=route_name(request))
        request[RECORD] = record
        start_request_fields(request_id=record.request_id)
        status: int | None = None
        try:
            response = await handler(request)
            status = response.status
            if not response.prepared:
                response.headers.setdefault("x-compact-request-id", record.request_id)
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            record.outcome = record.outcome or Outcome.CLIENT_GONE
            raise
        finally:
            outcome = record.outcome
            if outcome is None:
                outcome = (Outcome.CANCELLED if status is None
                           else Outcome.OK if status < 400 else Outcome.HTTP_ERROR)
            s.metrics.count_request(record.route, outcome)
            duration_ms = round((time.perf_counter() - record.started) * 1000.0, 3)
            if audit:
                _keep_in_audit_log(s, record, status, outcome, duration_ms)
            _log.info("request_completed", **completed_fields(
                record, request.method, status, outcome, duration_ms))

    return middleware


def completed_fields(record: RequestRecord, method: str, status: int | None, outcome: Outcome,
                     duration_ms: float) -> dict[str, object]:
    """The ``request_completed`` line's fields: only those that have a value (no ``null``),
    ``layers`` once compaction ran, and why it compacted (``compacted_because``)."""
    fields: dict[str, object] = {"route": record.route, "method": method}
    optional = {"path": record.path, "status": status, "role": record.role,
                "session_id": record.session_id, "tenant": record.tenant,
                "tokens_before": record.tokens_before, "tokens_after": record.tokens_after}
    fields.update((k, v) for k, v in optional.items() if v is not None)
    if record.tokens_before is not None:
        fields["layers"] = list(record.layers)
        if record.layer_savings:
            fields["saved"] = [f"{s.layer}={s.saved}" for s in record.layer_savings]
        because = record.compacted_because()
        if because:
            fields["compacted_because"] = because
    if record.reason is not None:
        fields["reason"] = record.reason
    if record.upstream_status is not None:
        fields["upstream_status"] = record.upstream_status
    usage = record.usage
    if usage is not None:
        fields["provider_input_tokens"] = usage.prompt_tokens
        if record.estimate_error is not None:
            fields["estimate_error"] = record.estimate_error
        fields.update(usage_input=usage.input, usage_cache_read=usage.cache_read,
                      usage_cache_write=usage.cache_write, usage_output=usage.output)
    if record.summary_served is not None:
        fields["summary_served"] = record.summary_served
        fields["summary_wait_ms"] = record.summary_wait_ms
    fields["outcome"] = str(outcome)  # (its value: .value is a Python-level property)
    fields["duration_ms"] = duration_ms
    return fields


def _keep_in_audit_log(s: Services, record: RequestRecord, status: int | None,
                       outcome: Outcome, duration_ms: float) -> None:
    """Hand the request's entry to the store's audit log after the response."""
    entry = record.audit_entry(status, outcome, duration_ms)
    if entry is not None:
        s.background.run(functools.partial(s.backend.add_request, entry),
                      failure_event="audit_not_recorded")
