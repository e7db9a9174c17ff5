"""The admin API (SPEC section 6): the only way a session's durable state changes.

A sub-app at ``/admin``: GET, PUT and DELETE of a session's state (optimistic: ``If-Match``
on the store's version, a stale one 409; each change recorded atomically with the write),
plus the audit log's read routes. Every call without the bearer token gets one 401 before
any route is looked at; nothing under ``/admin`` is ever forwarded. Operators: docs/admin.md.
"""

from __future__ import annotations

import hmac
import re
from datetime import UTC, datetime
from typing import Any, Final, Literal

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from compactor import DurableContextState, SourceExcerpt
from proxy.admin import checks
from proxy.admin.audit_routes import add_audit_routes
from proxy.admin.throttle import AUTH_THROTTLE, AuthThrottle, client_of
from proxy.audit.log import RequestLog, StateChange, state_change_detail
from proxy.http.body import parse_json_object, read_body
from proxy.http.errors import RequestRejected, error_middleware, error_response
from proxy.http.tenants import NO_TENANT, scoped_key
from proxy.sources.resolvers import ResolverPool
from proxy.store import (
    CorruptStateError,
    StateStore,
    StoredState,
    StoreError,
    StoreUnavailable,
    VersionConflict,
)

__all__ = ["ADMIN_ACTOR", "ADMIN_RESOLVERS_KEY", "ADMIN_STORE_KEY", "ADMIN_TOKEN_KEY",
           "MAX_ADMIN_BODY_BYTES", "setup_admin"]

# What the admin sub-app holds (the store's key has no type argument: a Protocol is not a
# concrete class); the token is UTF-8 encoded for the constant-time comparison.
ADMIN_STORE_KEY: Final[web.AppKey[StateStore]] = web.AppKey("admin_store")
ADMIN_TOKEN_KEY: Final[web.AppKey[bytes]] = web.AppKey("admin_token", bytes)
ADMIN_RESOLVERS_KEY: Final = web.AppKey("admin_resolvers", ResolverPool)
_CHANGES_KEY: Final[web.AppKey[RequestLog]] = web.AppKey("admin_changes")

#: Who a change through this API is recorded as (``admin-api:<X-Compact-Actor>``).
ADMIN_ACTOR: Final = "admin-api"
#: Largest accepted PUT body (as sent, and decoded).
MAX_ADMIN_BODY_BYTES: Final = 1024 * 1024

_PREFIX: Final = "/admin"
_STATE_PATH: Final = "/sessions/{sid}/state"
_TENANT_STATE_PATH: Final = "/tenants/{tenant}/sessions/{sid}/state"
_IF_MATCH: Final = re.compile(r'"([1-9][0-9]{0,18})"')
_STORE_ACTIONS: Final = {"GET": "read", "HEAD": "read", "PUT": "write", "DELETE": "delete"}


def setup_admin(app: web.Application, store: StateStore, token: str | None, *,
                log: RequestLog | None = None, resolvers: ResolverPool | None = None,
                record_changes: bool = True, throttle: AuthThrottle | None = None) -> None:
    """Mount the admin API at ``/admin`` (a 404 for all of it when ``token`` is unset).

    ``log`` serves the audit routes (and records each change when ``record_changes``);
    ``resolvers`` enables ``?resolve=true``. A token with surrounding whitespace, which no
    ``Authorization`` header can carry, is a ``ValueError``.
    """
    if not token:
        app.add_subapp(_PREFIX, web.Application(middlewares=[error_middleware, _disabled]))
        return
    if token != token.strip():
        raise ValueError("admin token: must not have leading or trailing whitespace")
    admin = web.Application(middlewares=[error_middleware, _bearer_auth])
    admin[ADMIN_STORE_KEY] = store
    admin[ADMIN_TOKEN_KEY] = token.encode("utf-8")
    admin[AUTH_THROTTLE] = throttle if throttle is not None else AuthThrottle()
    if resolvers is not None:
        admin[ADMIN_RESOLVERS_KEY] = resolvers
    for path in (_STATE_PATH, _TENANT_STATE_PATH):
        admin.router.add_get(path, _get_state)
        admin.router.add_put(path, _put_state)
        admin.router.add_delete(path, _delete_state)
    if log is not None:
        add_audit_routes(admin, log)
        if record_changes:
            admin[_CHANGES_KEY] = log
    app.add_subapp(_PREFIX, admin)


@web.middleware
async def _disabled(request: web.Request, handler: Handler) -> web.StreamResponse:
    raise checks.not_found("not found", "admin_disabled")


@web.middleware
async def _bearer_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The token check for every path under ``/admin``; then 404 / 405 in the Anthropic
    shape, and store failures as a 500 (503 when unavailable) that names no path."""
    throttle, client = request.app[AUTH_THROTTLE], client_of(request)
    wait = throttle.retry_after(client)
    if wait is not None:  # locked out: the token is not even looked at
        raise RequestRejected(429, "rate_limit_error",
                              f"too many failed admin authentications from this address; "
                              f"retry after {wait} s", reason="admin_locked_out",
                              headers={"Retry-After": str(wait)})
    if not _authorized(request):
        throttle.failed(client)
        # One answer for a missing, malformed, empty or wrong token: nothing to tell them apart.
        raise RequestRejected(401, "authentication_error", "invalid or missing admin bearer token",
                              reason="admin_unauthorized", headers={"WWW-Authenticate": "Bearer"})
    throttle.succeeded(client)
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        raise RequestRejected(405, "invalid_request_error",
                              f"method {request.method} not allowed; use {allowed}",
                              reason="method_not_allowed", headers={"Allow": allowed}) from None
    except web.HTTPNotFound:
        raise checks.not_found("not found", "not_found") from None
    except StoreError as exc:
        action = _STORE_ACTIONS.get(request.method, request.method)
        # The store's message may name file paths; it goes to the log, not to the client.
        structlog.get_logger().error("admin_store_failed", action=action,
                                     session_id=request.match_info.get("sid"),
                                     tenant=request.match_info.get("tenant", NO_TENANT),
                                     error=type(exc).__name__, detail=str(exc))
        if isinstance(exc, StoreUnavailable):  # retrying later may succeed
            return error_response(503, "api_error",
                                  f"the session store is unavailable during {action}",
                                  headers={"Retry-After": "1"})
        return error_response(500, "api_error", f"state store failed during {action}")


def _authorized(request: web.Request) -> bool:
    expected = request.app[ADMIN_TOKEN_KEY]
    header = request.headers.get("Authorization", "")
    scheme, _, credentials = header.partition(" ")
    credentials = credentials.strip()
    if scheme.lower() != "bearer" or not credentials:
        return False
    # aiohttp decodes header bytes as UTF-8 with surrogateescape; this gives the bytes back.
    given = credentials.encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, expected)


def _etag(version: int) -> str:
    return f'"{version}"'


def _if_match(request: web.Request) -> int | None:
    """The version named by ``If-Match`` (``None`` when absent); a 400 when malformed."""
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    value = raw.strip()
    if value == "*":
        raise checks.bad_request('If-Match: "*" is not supported; send the ETag of the state',
                                 "bad_if_match")
    match = _IF_MATCH.fullmatch(value)
    if match is None:
        raise checks.bad_request('If-Match: must be one quoted version, like "3"', "bad_if_match")
    return int(match.group(1))


async def _read_state(request: web.Request, session_id: str, tenant: str,
                      if_match: int | None) -> DurableContextState:
    """The PUT body as a state; a 413 when too large, a 400 naming the problem otherwise."""
    data = parse_json_object(await read_body(request, MAX_ADMIN_BODY_BYTES), "body")
    # session_id, tenant and version are what GET returns (and sources, what ?resolve=true
    # adds: read-only); a client may send them back unchanged.
    if "session_id" in data and data.pop("session_id") != session_id:
        raise checks.bad_request("session_id: does not match the session in the URL",
                                 "invalid_state")
    if "tenant" in data and data.pop("tenant") != tenant:
        raise checks.bad_request("tenant: does not match the tenant in the URL", "invalid_state")
    if "version" in data:
        version = data.pop("version")
        if if_match is None or isinstance(version, bool) or version != if_match:
            raise checks.bad_request("version: does not match the If-Match version",
                                     "invalid_state")
    data.pop("sources", None)
    try:
        return DurableContextState.from_dict(data)
    except ValueError as exc:
        raise checks.bad_request(str(exc), "invalid_state") from None


def _conflict(sid: str, if_match: int | None, exc: VersionConflict) -> RequestRejected:
    current = exc.current_version
    headers = {"ETag": _etag(current)} if current is not None else None
    if if_match is None:
        # A create that found an existing state: the client must say which one it replaces.
        return RequestRejected(428, "invalid_request_error",
                               f'If-Match required: session {sid} has state version {current}; '
                               f'send If-Match: "{current}"',
                               reason="if_match_required", headers=headers)
    found = "no state exists" if current is None else f"current version is {current}"
    return RequestRejected(409, "conflict_error",
                           f'If-Match "{if_match}" is stale for session {sid}: {found}',
                           reason="stale_version", headers=headers)


def _state_response(sid: str, tenant: str | None, stored: StoredState, status: int = 200,
                    sources: tuple[SourceExcerpt, ...] | None = None) -> web.Response:
    body: dict[str, Any] = {"session_id": sid}
    if tenant is not None:  # the tenant route; the legacy route's body keeps its shape
        body["tenant"] = tenant
    body["version"] = stored.version
    body.update(stored.state.to_dict())
    if sources is not None:
        body["sources"] = [_source_json(source) for source in sources]
    return web.json_response(body, status=status, headers={"ETag": _etag(stored.version)})


def _source_json(source: SourceExcerpt) -> dict[str, Any]:
    resolution = source.resolution
    return {"pointer": resolution.pointer, "status": resolution.status,
            "evidence_sha256": resolution.evidence_sha256, "detail": resolution.detail,
            "excerpt": source.text}


async def _get_state(request: web.Request) -> web.Response:
    sid, tenant = checks.session_id(request), checks.tenant(request)
    resolve = checks.flag(request, "resolve")
    if resolve and ADMIN_RESOLVERS_KEY not in request.app:
        raise checks.bad_request("resolve: source resolution is not available here",
                                 "bad_query")
    stored = await request.app[ADMIN_STORE_KEY].get_state(scoped_key(tenant or NO_TENANT, sid))
    if stored is None:
        raise checks.not_found(f"no durable state for session {sid}", "no_state")
    sources = None
    if resolve:  # the client's own session authorizes, as on the request path
        sources = await request.app[ADMIN_RESOLVERS_KEY].excerpts(
            sid, stored.state, tenant=tenant or NO_TENANT)
    return _state_response(sid, tenant, stored, sources=sources)


async def _current(store: StateStore, key: str) -> StoredState | None:
    """The state a write would replace (``None``: none, or it does not decode)."""
    try:
        return await store.get_state(key)
    except CorruptStateError:
        return None


def _change(request: web.Request, sid: str, tenant: str, actor: str,
            action: Literal["put", "delete"], detail: tuple[str, ...]) -> StateChange | None:
    """The change a write records (``None`` when changes are not recorded)."""
    if _CHANGES_KEY not in request.app:
        return None
    return StateChange(at=datetime.now(UTC), session_id=sid, tenant=tenant, actor=actor,
                       action=action, version=None, detail=detail)


async def _put_state(request: web.Request) -> web.Response:
    sid, tenant = checks.session_id(request), checks.tenant(request)
    if_match, actor = _if_match(request), checks.actor(request, ADMIN_ACTOR)
    state = await _read_state(request, sid, tenant or NO_TENANT, if_match)
    store = request.app[ADMIN_STORE_KEY]
    key = scoped_key(tenant or NO_TENANT, sid)
    # Compare-and-swap: when the write succeeds, the version it replaced is if_match, so a
    # state read at that version is the one replaced.
    old = await _current(store, key) if if_match is not None else None
    replaced = old.state if old is not None and old.version == if_match else None
    detail = (state_change_detail(replaced, state) if replaced is not None or if_match is None
              else ("state replaced",))
    change = _change(request, sid, tenant or NO_TENANT, actor, "put", detail)
    try:
        stored = await store.put_state(key, state, if_match, change)
    except VersionConflict as exc:
        raise _conflict(sid, if_match, exc) from None
    # (Versions are never reused: a state created again after a delete is not version 1.)
    created = if_match is None
    # Counts only: the state's text and the token never reach the log.
    structlog.get_logger().info(
        "admin_state_written", session_id=sid, tenant=tenant or NO_TENANT,
        version=stored.version, created=created,
        facts=len(state.facts), pending_items=len(state.pending_items),
        retrieval_evidence=len(state.retrieval_evidence),
    )
    response = _state_response(sid, tenant, stored, status=201 if created else 200)
    if created:
        response.headers["Location"] = request.path
    return response


async def _delete_state(request: web.Request) -> web.Response:
    sid, tenant = checks.session_id(request), checks.tenant(request)
    if_match, actor = _if_match(request), checks.actor(request, ADMIN_ACTOR)
    store = request.app[ADMIN_STORE_KEY]
    key = scoped_key(tenant or NO_TENANT, sid)
    old = await _current(store, key)
    detail = ("state deleted",) if old is None else state_change_detail(old.state, None)
    change = _change(request, sid, tenant or NO_TENANT, actor, "delete", detail)
    try:
        deleted = await store.delete_state(key, if_match, change)
    except VersionConflict as exc:
        raise _conflict(sid, if_match, exc) from None
    if not deleted:
        raise checks.not_found(f"no durable state for session {sid}", "no_state")
    structlog.get_logger().info("admin_state_deleted", session_id=sid,
                                tenant=tenant or NO_TENANT, expected_version=if_match)
    return web.Response(status=204)
