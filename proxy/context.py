"""The per-request audit record and the outermost middleware that opens and closes it.

Every request gets a :class:`RequestRecord` (under ``request[RECORD]``) and a ``request_id``
bound into the structlog context. Handlers fill the record in as they learn things (session,
role, token counts, upstream status); when the request ends, however it ends, the middleware
writes the one ``request_completed`` line of SPEC section 8 and counts the request in the
metrics.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import structlog
from aiohttp import web

from proxy.keys import METRICS

__all__ = ["RECORD", "RequestRecord", "request_context_middleware", "route_name"]

_log = structlog.get_logger("proxy.request")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class RequestRecord:
    """What the proxy learnt about one request; mutable, owned by that request only.

    Attributes:
        request_id: the proxy's id of the request (also sent as ``x-compact-request-id``).
        route: ``messages``, ``count_tokens``, ``passthrough``, ``admin``, ``healthz``, ...
        session_id: the resolved session, once known.
        role: the compaction role, once chosen.
        tokens_before: view size before compaction (``None``: no compaction ran).
        tokens_after: view size as forwarded.
        layers: the layers that ran, in order.
        upstream_status: the provider's status code, when it answered.
        outcome: how the request ended (``forwarded``, ``blocked``, ``upstream_unreachable``,
            ``upstream_timeout``, ``stream_failed``, ``client_gone``, ...); ``None`` until set.
        started: ``time.perf_counter()`` at arrival.
    """

    request_id: str
    route: str
    session_id: str | None = None
    role: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    layers: tuple[str, ...] = field(default=())
    upstream_status: int | None = None
    outcome: str | None = None
    started: float = field(default_factory=time.perf_counter)

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

    def duration_ms(self) -> float:
        """Milliseconds since the request arrived."""
        return round((time.perf_counter() - self.started) * 1000.0, 3)


#: The audit record of the request being served.
RECORD: Final = web.RequestKey("record", RequestRecord)


def route_name(request: web.Request) -> str:
    """The route label of a request: the route's registered name, ``admin`` for the admin
    API, ``other`` when unnamed."""
    name = request.match_info.route.name
    if name:
        return name
    if request.path == "/admin" or request.path.startswith("/admin/"):
        return "admin"
    return "other"


def _outcome(record: RequestRecord, status: int | None) -> str:
    if record.outcome is not None:
        return record.outcome
    if status is None:
        return "cancelled"
    return "ok" if status < 400 else f"http_{status}"


@web.middleware
async def request_context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The outermost middleware: opens the request's record, closes it with one log line."""
    record = RequestRecord(request_id=secrets.token_hex(12), route=route_name(request))
    request[RECORD] = record
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=record.request_id, session_id=None)
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
        record.outcome = record.outcome or "client_gone"
        raise
    finally:
        outcome = _outcome(record, status)
        request.app[METRICS].count_request(record.route, outcome)
        _log.info(
            "request_completed",
            route=record.route,
            method=request.method,
            status=status,
            role=record.role,
            session_id=record.session_id,
            tokens_before=record.tokens_before,
            tokens_after=record.tokens_after,
            layers=list(record.layers),
            upstream_status=record.upstream_status,
            outcome=outcome,
            duration_ms=record.duration_ms(),
        )
