"""The admin API (SPEC section 6): the only way a session's durable state changes.

A sub-application mounted at ``/admin``. Routes, when an admin token is configured::

    GET    /admin/sessions/{sid}/state   -> 200 state + ETag: "<version>"   | 404
    PUT    /admin/sessions/{sid}/state   -> 201 created | 200 replaced       (+ ETag)
    DELETE /admin/sessions/{sid}/state   -> 204 | 404

    GET | PUT | DELETE /admin/tenants/{tenant}/sessions/{sid}/state   (the same, per tenant)

``/admin/sessions/{sid}/state`` is tenant ``none``'s session (``session.scope`` none, and
every store written before tenants existed); the tenant route names any tenant
(``none``, ``t<16 hex>``, ``h<16 hex>``: :mod:`proxy.http.tenants`; ``compact-proxy
tenant-id`` prints a caller's) and reads and writes the store key
:func:`~proxy.http.tenants.scoped_key` gives. A tenant is a hash, so there is no credential
here to reveal; a tenant never seen yet may be written. Its bodies carry ``"tenant"`` next to
``"session_id"``; the legacy route's bodies keep their shape.

Every call needs ``Authorization: Bearer <token>``; anything else gets one and the same 401,
from the sub-app's middleware, before any route (known or not) is looked at. Without a token
the sub-app has no routes and answers 404 to ``/admin`` and everything under it. Either way
the sub-app owns the whole ``/admin`` prefix, so the proxy's catch-all forwarder never sends
an admin call upstream.

Preconditions (optimistic concurrency on the store's version):

- ``PUT`` of an existing state needs ``If-Match: "<version>"``; without it: 428. A version
  that is not the current one: 409 ``conflict_error``.
- ``PUT`` without ``If-Match`` creates; it gets 428 if a state already exists.
- ``If-Match`` naming a version when no state exists is also a stale version: 409 (we answer
  every failed precondition with 409, as SPEC says for "stale", never 412).
- ``If-Match: *`` is refused (400): it would be a blind overwrite.
- ``DELETE`` honours ``If-Match`` when given (stale: 409) and deletes unconditionally
  otherwise.

Refusals are raised as :class:`~proxy.http.errors.RequestRejected` and answered, in the Anthropic
shape, by :func:`~proxy.http.errors.error_middleware`: the sub-app carries its own, so it answers
the same wherever it is mounted (under the proxy, the parent's middlewares wrap it: the
request record and its ``request_completed`` line). Bodies are read and parsed by
:mod:`proxy.http.body` (size limit, content codings, strict JSON). Logs name the session, version
and item counts, never the state's text or the token.
"""

from __future__ import annotations

import hmac
import re
from typing import Any, Final

import structlog
from aiohttp import web

from compactor import SESSION_ID_RULE, DurableContextState, session_id_problem
from proxy.http.body import parse_json_object, read_body
from proxy.http.errors import Handler, RequestRejected, error_middleware, error_response
from proxy.http.tenants import NO_TENANT, is_tenant, scoped_key
from proxy.state.store import StateStore, StoredState, StoreError, VersionConflict

__all__ = [
    "ADMIN_STORE_KEY",
    "ADMIN_TOKEN_KEY",
    "MAX_ADMIN_BODY_BYTES",
    "setup_admin",
]

#: The store the admin handlers write to (held by the admin sub-app).
# (No type argument: a Protocol is not a concrete class; the annotation carries the type.)
ADMIN_STORE_KEY: Final[web.AppKey[StateStore]] = web.AppKey("admin_store")
#: The admin token, UTF-8 encoded, for the constant-time comparison (held by the sub-app).
ADMIN_TOKEN_KEY: Final[web.AppKey[bytes]] = web.AppKey("admin_token", bytes)

#: Largest accepted PUT body (as sent, and decoded).
MAX_ADMIN_BODY_BYTES: Final = 1024 * 1024

_PREFIX: Final = "/admin"
_STATE_PATH: Final = "/sessions/{sid}/state"  # under _PREFIX
_TENANT_STATE_PATH: Final = "/tenants/{tenant}/sessions/{sid}/state"  # under _PREFIX
_IF_MATCH: Final = re.compile(r'"([1-9][0-9]{0,18})"')
_ALLOWED_METHODS: Final = "GET, HEAD, PUT, DELETE"
_STORE_ACTIONS: Final = {"GET": "read", "HEAD": "read", "PUT": "write", "DELETE": "delete"}


def setup_admin(app: web.Application, store: StateStore, token: str | None) -> None:
    """Mount the admin API on ``app`` at ``/admin``, or a 404 for all of ``/admin`` when off.

    Args:
        app: the application (not yet frozen).
        store: where durable state lives.
        token: the admin bearer token; ``None`` or ``""`` disables the API.

    Raises:
        ValueError: the token has leading or trailing whitespace, which no ``Authorization``
            header can carry, so the API would be enabled yet unusable.
    """
    if not token:
        app.add_subapp(_PREFIX, web.Application(middlewares=[error_middleware, _disabled]))
        return
    if token != token.strip():
        raise ValueError("admin token: must not have leading or trailing whitespace")
    admin = web.Application(middlewares=[error_middleware, _bearer_auth])
    admin[ADMIN_STORE_KEY] = store
    admin[ADMIN_TOKEN_KEY] = token.encode("utf-8")
    for path in (_STATE_PATH, _TENANT_STATE_PATH):
        admin.router.add_get(path, _get_state)
        admin.router.add_put(path, _put_state)
        admin.router.add_delete(path, _delete_state)
    app.add_subapp(_PREFIX, admin)


# --- middlewares ------------------------------------------------------------------------


@web.middleware
async def _disabled(request: web.Request, handler: Handler) -> web.StreamResponse:
    raise _not_found("not found", "admin_disabled")


@web.middleware
async def _bearer_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The token check for every path and method under ``/admin``; then the router's own
    404 / 405 in the Anthropic shape, and store failures as a 500 that names no path."""
    if not _authorized(request):
        # One answer for a missing, malformed, empty or wrong token: nothing to tell them apart.
        raise RequestRejected(401, "authentication_error", "invalid or missing admin bearer token",
                              reason="admin_unauthorized", headers={"WWW-Authenticate": "Bearer"})
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        raise RequestRejected(405, "invalid_request_error",
                              f"method {request.method} not allowed; use {_ALLOWED_METHODS}",
                              reason="method_not_allowed",
                              headers={"Allow": _ALLOWED_METHODS}) from None
    except web.HTTPNotFound:
        raise _not_found("not found", "not_found") from None
    except StoreError as exc:
        action = _STORE_ACTIONS.get(request.method, request.method)
        # The store's message may name file paths; it goes to the log, not to the client.
        structlog.get_logger().error("admin_store_failed", action=action,
                                     session_id=request.match_info.get("sid"),
                                     tenant=request.match_info.get("tenant", NO_TENANT),
                                     error=type(exc).__name__, detail=str(exc))
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


# --- checks -----------------------------------------------------------------------------


def _bad_request(message: str, reason: str) -> RequestRejected:
    return RequestRejected(400, "invalid_request_error", message, reason=reason)


def _not_found(message: str, reason: str) -> RequestRejected:
    return RequestRejected(404, "not_found_error", message, reason=reason)


def _etag(version: int) -> str:
    return f'"{version}"'


def _session_id(request: web.Request) -> str:
    sid = request.match_info["sid"]
    # The one rule for session ids (compactor.check_session_id): the proxy serves exactly
    # these, and only these can be named by the pointers of the state stored here.
    problem = session_id_problem(sid)
    if problem is not None:
        raise _bad_request(f"session id: {problem}; a session id is {SESSION_ID_RULE}",
                           "bad_session_id")
    return sid


def _tenant(request: web.Request) -> str | None:
    """The tenant named in the URL (``None``: the legacy route, tenant ``none``'s session)."""
    tenant = request.match_info.get("tenant")
    # The value is not repeated: it may be a credential pasted in by mistake.
    if tenant is not None and not is_tenant(tenant):
        raise _bad_request("tenant: not a tenant; a tenant is none, t<16 hex> or h<16 hex> "
                           "(compact-proxy tenant-id prints one)", "bad_tenant")
    return tenant


def _if_match(request: web.Request) -> int | None:
    """The version named by ``If-Match`` (``None`` when absent); a 400 when malformed."""
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    value = raw.strip()
    if value == "*":
        raise _bad_request('If-Match: "*" is not supported; send the ETag of the state',
                           "bad_if_match")
    match = _IF_MATCH.fullmatch(value)
    if match is None:
        raise _bad_request('If-Match: must be one quoted version, like "3"', "bad_if_match")
    return int(match.group(1))


async def _read_state(request: web.Request, session_id: str, tenant: str,
                      if_match: int | None) -> DurableContextState:
    """The PUT body as a state; a 413 when too large, a 400 naming the problem otherwise."""
    data = parse_json_object(await read_body(request, MAX_ADMIN_BODY_BYTES), "body")
    # session_id, tenant and version are what GET returns; a client may send them back
    # unchanged.
    if "session_id" in data and data.pop("session_id") != session_id:
        raise _bad_request("session_id: does not match the session in the URL", "invalid_state")
    if "tenant" in data and data.pop("tenant") != tenant:
        raise _bad_request("tenant: does not match the tenant in the URL", "invalid_state")
    if "version" in data:
        version = data.pop("version")
        if if_match is None or isinstance(version, bool) or version != if_match:
            raise _bad_request("version: does not match the If-Match version", "invalid_state")
    try:
        return DurableContextState.from_dict(data)
    except ValueError as exc:
        raise _bad_request(str(exc), "invalid_state") from None


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


# --- handlers ---------------------------------------------------------------------------


def _state_response(sid: str, tenant: str | None, stored: StoredState,
                    status: int = 200) -> web.Response:
    body: dict[str, Any] = {"session_id": sid}
    if tenant is not None:  # the tenant route; the legacy route's body keeps its shape
        body["tenant"] = tenant
    body["version"] = stored.version
    body.update(stored.state.to_dict())
    return web.json_response(body, status=status, headers={"ETag": _etag(stored.version)})


async def _get_state(request: web.Request) -> web.Response:
    sid = _session_id(request)
    tenant = _tenant(request)
    stored = await request.app[ADMIN_STORE_KEY].get_state(scoped_key(tenant or NO_TENANT, sid))
    if stored is None:
        raise _not_found(f"no durable state for session {sid}", "no_state")
    return _state_response(sid, tenant, stored)


async def _put_state(request: web.Request) -> web.Response:
    sid = _session_id(request)
    tenant = _tenant(request)
    if_match = _if_match(request)
    state = await _read_state(request, sid, tenant or NO_TENANT, if_match)
    try:
        stored = await request.app[ADMIN_STORE_KEY].put_state(
            scoped_key(tenant or NO_TENANT, sid), state, if_match)
    except VersionConflict as exc:
        raise _conflict(sid, if_match, exc) from None
    created = stored.version == 1
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
    sid = _session_id(request)
    tenant = _tenant(request)
    if_match = _if_match(request)
    try:
        deleted = await request.app[ADMIN_STORE_KEY].delete_state(
            scoped_key(tenant or NO_TENANT, sid), if_match)
    except VersionConflict as exc:
        raise _conflict(sid, if_match, exc) from None
    if not deleted:
        raise _not_found(f"no durable state for session {sid}", "no_state")
    structlog.get_logger().info("admin_state_deleted", session_id=sid,
                                tenant=tenant or NO_TENANT, expected_version=if_match)
    return web.Response(status=204)
