"""Anthropic-shaped error responses, and the one middleware that produces them.

Every failure a client can see (a refused request, an unreachable upstream, a bug) leaves as
``{"type": "error", "error": {"type": ..., "message": ...}}``, so SDKs raise their usual
exception classes; never with a traceback or message text.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

import compactor
from proxy.audit.log import LayerSaving
from proxy.http.audit import RECORD, Outcome, RequestRecord, layer_savings
from proxy.http.keys import SERVICES
from proxy.http.refusals import LIMIT_REASONS, ROUTINE_REASONS, tool_protocol_message
from proxy.store import StoreError, StoreUnavailable

__all__ = [
    "STORE_UNAVAILABLE_MESSAGE",
    "ProxyError",
    "RequestRejected",
    "UpstreamFailure",
    "error_body",
    "error_middleware",
    "error_response",
]

_log = structlog.get_logger("proxy.http.errors")


#: The message of the 503 answered while the session store cannot be reached.
STORE_UNAVAILABLE_MESSAGE = ("the session store is unavailable; the request was not forwarded "
                             "(retry shortly)")


class ProxyError(Exception):
    """A failure the proxy answers itself: ``status``, the Anthropic ``error_type``, the
    client-facing ``message`` (never message text or a credential), a ``reason`` for logs and
    metrics, an optional ``error.compaction`` object and extra response ``headers``."""

    def __init__(self, status: int, error_type: str, message: str, *, reason: str,
                 compaction: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.error_type = error_type
        self.message = message
        self.reason = reason
        self.compaction = dict(compaction) if compaction is not None else None
        self.headers = dict(headers) if headers is not None else {}
        super().__init__(message)

    @property
    def outcome(self) -> Outcome:
        """How a request that ends in this error ended."""
        return Outcome.INTERNAL_ERROR


class RequestRejected(ProxyError):
    """The request itself is unacceptable; it is never forwarded (its outcome:
    :mod:`proxy.http.refusals`)."""

    @property
    def outcome(self) -> Outcome:
        if self.reason in LIMIT_REASONS:
            return Outcome.BLOCKED
        return Outcome.HTTP_ERROR if self.reason in ROUTINE_REASONS else Outcome.INVALID


class UpstreamFailure(ProxyError):
    """The provider could not be reached or did not answer in time (502 / 504), or no
    connection to it was free in time (529)."""

    @property
    def outcome(self) -> Outcome:
        if self.status == 529:
            return Outcome.UPSTREAM_BUSY
        return Outcome.UPSTREAM_TIMEOUT if self.status == 504 else Outcome.UPSTREAM_UNREACHABLE


@dataclass(frozen=True)
class _Blocked:
    """The audit fields of one rejection (SPEC section 8, ``request_blocked``)."""

    reason: str
    tokens_before: int | None = None
    tokens_after: int | None = None
    hard_limit: int | None = None
    layers: tuple[str, ...] = field(default=())
    savings: tuple[LayerSaving, ...] = field(default=())
    fixed_tokens: int | None = None
    protocol: Mapping[str, Any] = field(default_factory=dict)


def error_body(error_type: str, message: str,
               compaction: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Anthropic error object: ``{"type": "error", "error": {...}}``."""
    error: dict[str, Any] = {"type": error_type, "message": message}
    if compaction is not None:
        error["compaction"] = dict(compaction)
    return {"type": "error", "error": error}


def error_response(status: int, error_type: str, message: str, *,
                   compaction: Mapping[str, Any] | None = None,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    """A JSON response holding :func:`error_body`."""
    return web.Response(
        status=status,
        body=json.dumps(error_body(error_type, message, compaction)).encode("utf-8"),
        content_type="application/json",
        headers=headers,
    )


def _from_tool_protocol(exc: compactor.ToolProtocolError) -> tuple[RequestRejected, _Blocked]:
    rejected = RequestRejected(
        400, "invalid_request_error", tool_protocol_message(exc), reason="ToolProtocolError",
        compaction={"error": "ToolProtocolError", "kind": exc.kind,
                    "tool_use_id": exc.tool_use_id})
    return rejected, _Blocked("ToolProtocolError", protocol={
        "kind": exc.kind, "tool_use_id": exc.tool_use_id, "message_index": exc.message_index})


def _from_limit(exc: compactor.MessageViewLimitExceeded,
                fixed: int | None) -> tuple[RequestRejected, _Blocked]:
    """The refusal over the hard limit, ``fixed`` (system + tools + durable block) named
    apart from the messages."""
    layers = tuple(sorted({o.layer for o in exc.outcomes if o.applied}))
    savings = layer_savings(exc.outcomes)
    compaction: dict[str, Any] = {
        "error": "MessageViewLimitExceeded", "tokens_before": exc.tokens_before,
        "tokens_after": exc.tokens_after, "hard_limit": exc.hard_limit, "layers": list(layers),
        "saved": [{"layer": s.layer, "saved": s.saved} for s in savings]}
    if fixed is not None:
        messages = max(0, exc.tokens_after - fixed)
        compaction.update(fixed_tokens=fixed, messages_tokens=messages, detail=(
            f"after compaction: system + tools {fixed:,} tokens, messages {messages:,} tokens"
            f"; hard limit {exc.hard_limit:,}"
            + (" (the fixed part alone is over it: raise compaction.hard_limit_tokens)"
               if fixed >= exc.hard_limit else "")))
    rejected = RequestRejected(
        400, "invalid_request_error",  # the provider's own pattern, exactly: clients parse it
        f"prompt is too long: {exc.tokens_after} tokens > {exc.hard_limit} maximum",
        reason="MessageViewLimitExceeded", compaction=compaction)
    blocked = _Blocked("MessageViewLimitExceeded", exc.tokens_before, exc.tokens_after,
                       exc.hard_limit, layers, savings, fixed)
    return rejected, blocked


def _location(exc: BaseException) -> str:
    """``file:line`` of the innermost frame: enough to find a bug, holds no data."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    last = frames[-1]
    parts = last.filename.replace("\\", "/").rsplit("/", 2)[-2:]
    return f"{'/'.join(parts)}:{last.lineno}"


def _answer(record: RequestRecord | None, outcome: Outcome, error: ProxyError) -> web.Response:
    """``error``'s response with the request's ``x-compact-*`` headers; its outcome noted."""
    headers = error.headers
    if record is not None:
        record.outcome = outcome
        headers = {**record.response_headers(), **headers}
    return error_response(error.status, error.error_type, error.message,
                          compaction=error.compaction, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every proxy-level failure into the Anthropic error response (aiohttp's own
    ``web.HTTPException`` answers and cancellation pass)."""
    record: RequestRecord | None = request.get(RECORD)
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except compactor.ToolProtocolError as exc:
        error, blocked = _from_tool_protocol(exc)
        if record is not None:
            record.protocol_kind, record.tool_use_id = exc.kind, exc.tool_use_id[:128]
    except compactor.MessageViewLimitExceeded as exc:
        error, blocked = _from_limit(exc, None if record is None else record.fixed_tokens)
    except RequestRejected as exc:
        error, blocked = exc, _Blocked(exc.reason)
    except RecursionError:
        # JSON nested deeper than a step that walks it can follow: the client's body.
        error = RequestRejected(400, "invalid_request_error",
                                "request body is nested too deeply to process",
                                reason="too_deep")
        blocked = _Blocked(error.reason)
    except ProxyError as exc:
        _log.warning("upstream_failed", reason=exc.reason, status=exc.status)
        return _answer(record, exc.outcome, exc)
    except StoreUnavailable as exc:
        # Nothing was forwarded; a load balancer retries elsewhere.
        services = request.config_dict.get(SERVICES)
        if services is not None:
            services.store_health.note_unavailable("request", exc)
        return _answer(record, Outcome.STORE_ERROR, ProxyError(
            503, "api_error", STORE_UNAVAILABLE_MESSAGE, reason="store_unavailable",
            headers={"Retry-After": "1"}))
    except StoreError as exc:
        _log.error("store_failed", error_class=type(exc).__name__)
        return _answer(record, Outcome.STORE_ERROR, ProxyError(
            500, "api_error", f"compact-proxy session store failed ({type(exc).__name__})",
            reason="store_failed"))
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a traceback
        # A bug, never blamed on the client: the traceback goes to the log only, as frames.
        _log.error("request_failed", error_class=type(exc).__name__,
                   error_location=_location(exc), exc_info=exc)
        return _answer(record, Outcome.INTERNAL_ERROR, ProxyError(
            500, "api_error", f"compact-proxy internal error ({type(exc).__name__})",
            reason="internal_error"))
    if record is not None:
        record.reason, record.hard_limit = blocked.reason, blocked.hard_limit
        if blocked.tokens_before is not None:
            record.tokens_before = blocked.tokens_before
            record.tokens_after = blocked.tokens_after
            record.layers = blocked.layers
            record.layer_savings = blocked.savings
    outcome = error.outcome
    if outcome is Outcome.INVALID:
        _log.warning("request_invalid", reason=blocked.reason, status=error.status,
                     **blocked.protocol)
    elif outcome is Outcome.BLOCKED:
        _log_blocked(blocked, error.status)
    return _answer(record, outcome, error)


def _log_blocked(blocked: _Blocked, status: int) -> None:
    fields: dict[str, Any] = {
        "reason": blocked.reason, "tokens_before": blocked.tokens_before,
        "tokens_after": blocked.tokens_after, "hard_limit": blocked.hard_limit,
        "layers": list(blocked.layers), "status": status}
    if blocked.fixed_tokens is not None and blocked.tokens_after is not None:
        fields["fixed_tokens"] = blocked.fixed_tokens
        fields["messages_tokens"] = max(0, blocked.tokens_after - blocked.fixed_tokens)
    _log.warning("request_blocked", **fields)
