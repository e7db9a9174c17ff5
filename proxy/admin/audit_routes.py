"""The admin API's read side of the audit log: ``GET /admin/sessions`` and a session's
``/requests`` and ``/changes``, addressed as the state routes are. Each item is the
``as_json()`` of its :mod:`proxy.audit.log` type. The bodies: docs/admin.md, "Reading the
audit log".
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from proxy.admin import checks
from proxy.audit.log import SESSION_ORDERS, RequestLog, SessionOrder
from proxy.http.tenants import NO_TENANT

__all__ = ["ADMIN_LOG_KEY", "add_audit_routes"]

#: The audit log the read routes serve (held by the admin sub-app).
ADMIN_LOG_KEY: Final[web.AppKey[RequestLog]] = web.AppKey("admin_audit_log")

SESSIONS_PAGE: Final = 50
REQUESTS_PAGE: Final = 100
#: The longest ``contains`` filter (a session id is at most 128 characters).
MAX_CONTAINS: Final = 128


def add_audit_routes(admin: web.Application, log: RequestLog) -> None:
    """Register the read routes on the admin sub-app, serving ``log``."""
    admin[ADMIN_LOG_KEY] = log
    for prefix in ("", "/tenants/{tenant}"):
        admin.router.add_get(f"{prefix}/sessions", _sessions)
        admin.router.add_get(f"{prefix}/sessions/{{sid}}/requests", _requests)
        admin.router.add_get(f"{prefix}/sessions/{{sid}}/changes", _changes)


def _order(request: web.Request) -> SessionOrder:
    raw = checks.one_value(request, "order")
    if raw is None:
        return "last_seen"
    for order in SESSION_ORDERS:
        if raw == order:
            return order
    raise checks.bad_request(f"order: must be one of {', '.join(SESSION_ORDERS)}", "bad_query")


def _contains(request: web.Request) -> str | None:
    raw = checks.one_value(request, "contains")
    if raw is not None and len(raw) > MAX_CONTAINS:
        raise checks.bad_request(f"contains: at most {MAX_CONTAINS} characters", "bad_query")
    return raw or None


def _scoped(body: dict[str, Any], sid: str | None, tenant: str | None) -> dict[str, Any]:
    """The start of a body: the session (and the tenant, on a tenant route)."""
    if sid is not None:
        body["session_id"] = sid
    if tenant is not None:
        body["tenant"] = tenant
    return body


async def _sessions(request: web.Request) -> web.Response:
    tenant = checks.tenant(request)
    offset, limit = checks.page(request, default_limit=SESSIONS_PAGE)
    order, contains = _order(request), _contains(request)
    summaries, total = await request.app[ADMIN_LOG_KEY].sessions(
        offset=offset, limit=limit, contains=contains, order=order, tenant=tenant)
    return web.json_response(_scoped({
        # Each with the path that addresses it, its tenant included (any tenant's).
        "sessions": [{**summary.as_json(),
                      "requests_path": f"/admin/sessions/{summary.session_id}/requests"
                                       f"?tenant={summary.tenant}"}
                     for summary in summaries], "total": total,
        "offset": offset, "limit": limit, "order": order, "contains": contains,
    }, None, tenant))


async def _requests(request: web.Request) -> web.Response:
    sid, tenant = checks.session_id(request), checks.tenant(request)
    offset, limit = checks.page(request, default_limit=REQUESTS_PAGE)
    entries, total = await request.app[ADMIN_LOG_KEY].session_requests(
        tenant or NO_TENANT, sid, offset=offset, limit=limit)
    return web.json_response(_scoped({}, sid, tenant) | {
        "requests": [entry.as_json() for entry in entries], "total": total,
        "offset": offset, "limit": limit,
    })


async def _changes(request: web.Request) -> web.Response:
    sid, tenant = checks.session_id(request), checks.tenant(request)
    limit = checks.limit(request, default=REQUESTS_PAGE)
    changes = await request.app[ADMIN_LOG_KEY].state_changes(tenant or NO_TENANT, sid,
                                                             limit=limit)
    return web.json_response(_scoped({}, sid, tenant) | {
        "changes": [change.as_json() for change in changes]})
