"""The admin API (SPEC section 6): the only way a session's durable state changes.

Routes, when an admin token is configured::

    GET    /admin/sessions/{sid}/state   -> 200 state + ETag: "<version>"   | 404
    PUT    /admin/sessions/{sid}/state   -> 201 created | 200 replaced       (+ ETag)
    DELETE /admin/sessions/{sid}/state   -> 204 | 404

Every call needs ``Authorization: Bearer <token>``; anything else gets one and the same 401.
Without a token the routes do not exist, and ``/admin`` and everything under it answers 404,
so the proxy's catch-all forwarder never sends an admin call upstream.

Preconditions (optimistic concurrency on the store's version):

- ``PUT`` of an existing state needs ``If-Match: "<version>"``; without it: 428. A version
  that is not the current one: 409 ``conflict_error``.
- ``PUT`` without ``If-Match`` creates; it gets 428 if a state already exists.
- ``If-Match`` naming a version when no state exists is also a stale version: 409 (we answer
  every failed precondition with 409, as SPEC says for "stale", never 412).
- ``If-Match: *`` is refused (400): it would be a blind overwrite.
- ``DELETE`` honours ``If-Match`` when given (stale: 409) and deletes unconditionally
  otherwise.

All errors use the Anthropic shape ``{"type": "error", "error": {"type", "message"}}``. Logs
name the session, version and item counts, never the state's text or the token.
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any, Final

import structlog
from aiohttp import web

from compactor import SESSION_ID_RULE, DurableContextState, session_id_problem

from .store import StateStore, StoredState, StoreError, VersionConflict

__all__ = [
    "ADMIN_STORE_KEY",
    "ADMIN_TOKEN_KEY",
    "MAX_ADMIN_BODY_BYTES",
    "setup_admin",
]

#: The store the admin handlers write to.
# (No type argument: a Protocol is not a concrete class; the annotation carries the type.)
ADMIN_STORE_KEY: Final[web.AppKey[StateStore]] = web.AppKey("admin_store")
#: The admin token, UTF-8 encoded, for the constant-time comparison.
ADMIN_TOKEN_KEY: Final[web.AppKey[bytes]] = web.AppKey("admin_token", bytes)

#: Largest accepted PUT body.
MAX_ADMIN_BODY_BYTES: Final = 1024 * 1024

_STATE_PATH: Final = "/admin/sessions/{sid}/state"
_IF_MATCH: Final = re.compile(r'"([1-9][0-9]{0,18})"')
_STATE_FIELDS: Final = ("facts", "pending_items", "retrieval_evidence")
_ALLOWED_METHODS: Final = "GET, HEAD, PUT, DELETE"
_STATE_TAIL: Final = re.compile(r"sessions/[^/]+/state")


def setup_admin(app: web.Application, store: StateStore, token: str | None) -> None:
    """Register the admin routes on ``app``, or a 404 for ``/admin/...`` when disabled.

    Call it before the proxy's catch-all route so ``/admin`` paths resolve here first.

    Args:
        app: the application (not yet frozen).
        store: where durable state lives.
        token: the admin bearer token; ``None`` or ``""`` disables the API.

    Raises:
        ValueError: the token has leading or trailing whitespace, which no ``Authorization``
            header can carry, so the API would be enabled yet unusable.
    """
    if not token:
        app.router.add_route("*", "/admin", _disabled)
        app.router.add_route("*", "/admin/{tail:.*}", _disabled)
        return
    if token != token.strip():
        raise ValueError("admin token: must not have leading or trailing whitespace")
    app[ADMIN_STORE_KEY] = store
    app[ADMIN_TOKEN_KEY] = token.encode("utf-8")
    app.router.add_get(_STATE_PATH, _get_state)
    app.router.add_put(_STATE_PATH, _put_state)
    app.router.add_delete(_STATE_PATH, _delete_state)
    # Anything else under /admin (other paths, other methods on the state path) is answered
    # here too, after the token check, so nothing under /admin ever reaches the forwarder.
    app.router.add_route("*", "/admin", _fallback)
    app.router.add_route("*", "/admin/{tail:.*}", _fallback)


# --- responses --------------------------------------------------------------------------


def _error(status: int, error_type: str, message: str,
           headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(
        {"type": "error", "error": {"type": error_type, "message": message}},
        status=status, headers=headers,
    )


def _bad_request(message: str) -> web.Response:
    return _error(400, "invalid_request_error", message)


def _etag(version: int) -> str:
    return f'"{version}"'


def _state_response(stored: StoredState, status: int = 200) -> web.Response:
    body: dict[str, Any] = {"session_id": stored.session_id, "version": stored.version}
    body.update(stored.state.to_dict())
    return web.json_response(body, status=status, headers={"ETag": _etag(stored.version)})


def _store_failed(action: str, session_id: str, exc: StoreError) -> web.Response:
    # The store's message may name file paths; it goes to the log, not to the client.
    structlog.get_logger().error("admin_store_failed", action=action, session_id=session_id,
                                 error=type(exc).__name__, detail=str(exc))
    return _error(500, "api_error", f"state store failed during {action}")


# --- checks -----------------------------------------------------------------------------


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


def _unauthorized() -> web.Response:
    # One answer for a missing, malformed, empty or wrong token: nothing to tell them apart.
    return _error(401, "authentication_error", "invalid or missing admin bearer token",
                  headers={"WWW-Authenticate": "Bearer"})


def _session_id(request: web.Request) -> str | web.Response:
    sid = request.match_info["sid"]
    # The one rule for session ids (compactor.check_session_id): the proxy serves exactly
    # these, and only these can be named by the pointers of the state stored here.
    problem = session_id_problem(sid)
    if problem is not None:
        return _bad_request(f"session id: {problem}; a session id is {SESSION_ID_RULE}")
    return sid


def _if_match(request: web.Request) -> int | web.Response | None:
    """The version named by ``If-Match``: ``None`` when absent, a 400 response if malformed."""
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    value = raw.strip()
    if value == "*":
        return _bad_request('If-Match: "*" is not supported; send the ETag of the state')
    match = _IF_MATCH.fullmatch(value)
    if match is None:
        return _bad_request('If-Match: must be one quoted version, like "3"')
    return int(match.group(1))


async def _read_body(request: web.Request) -> bytes | web.Response:
    """The request body, at most :data:`MAX_ADMIN_BODY_BYTES`, else a 413 response."""
    too_large = _error(413, "request_too_large",
                       f"request body exceeds {MAX_ADMIN_BODY_BYTES} bytes")
    if request.content_length is not None and request.content_length > MAX_ADMIN_BODY_BYTES:
        return too_large
    # Read from the stream ourselves: the app-wide client_max_size is the proxy's (larger).
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(64 * 1024)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_ADMIN_BODY_BYTES:
            return too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_state(body: bytes, session_id: str,
                 if_match: int | None) -> DurableContextState | web.Response:
    """Decode a PUT body into a state; a 400 response naming the problem otherwise."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        return _bad_request("body: must be UTF-8 encoded JSON")
    except ValueError as exc:
        return _bad_request(f"body: not valid JSON ({exc})")
    except RecursionError:
        return _bad_request("body: not valid JSON (nested too deeply)")
    if not isinstance(data, dict):
        return _bad_request(f"body: must be a JSON object, got {type(data).__name__}")
    # session_id and version are what GET returns; a client may send them back unchanged.
    if "session_id" in data and data.pop("session_id") != session_id:
        return _bad_request("session_id: does not match the session in the URL")
    if "version" in data:
        version = data.pop("version")
        if if_match is None or isinstance(version, bool) or version != if_match:
            return _bad_request("version: does not match the If-Match version")
    try:
        return DurableContextState.from_dict(data)
    except ValueError as exc:
        return _bad_request(str(exc))


# --- handlers ---------------------------------------------------------------------------


async def _disabled(request: web.Request) -> web.Response:
    return _error(404, "not_found_error", "not found")


async def _fallback(request: web.Request) -> web.Response:
    if not _authorized(request):
        return _unauthorized()
    tail = request.match_info.get("tail", "")
    if _STATE_TAIL.fullmatch(tail):
        return _error(405, "invalid_request_error",
                      f"method {request.method} not allowed; use {_ALLOWED_METHODS}",
                      headers={"Allow": _ALLOWED_METHODS})
    return _error(404, "not_found_error", "not found")


async def _get_state(request: web.Request) -> web.Response:
    if not _authorized(request):
        return _unauthorized()
    sid = _session_id(request)
    if isinstance(sid, web.Response):
        return sid
    try:
        stored = await request.app[ADMIN_STORE_KEY].get_state(sid)
    except StoreError as exc:
        return _store_failed("read", sid, exc)
    if stored is None:
        return _error(404, "not_found_error", f"no durable state for session {sid}")
    return _state_response(stored)


async def _put_state(request: web.Request) -> web.Response:
    if not _authorized(request):
        return _unauthorized()
    sid = _session_id(request)
    if isinstance(sid, web.Response):
        return sid
    if_match = _if_match(request)
    if isinstance(if_match, web.Response):
        return if_match
    body = await _read_body(request)
    if isinstance(body, web.Response):
        return body
    state = _parse_state(body, sid, if_match)
    if isinstance(state, web.Response):
        return state
    try:
        stored = await request.app[ADMIN_STORE_KEY].put_state(sid, state, if_match)
    except VersionConflict as exc:
        return _conflict(sid, if_match, exc)
    except StoreError as exc:
        return _store_failed("write", sid, exc)
    created = stored.version == 1
    # Counts only: the state's text and the token never reach the log.
    structlog.get_logger().info(
        "admin_state_written", session_id=sid, version=stored.version, created=created,
        facts=len(state.facts), pending_items=len(state.pending_items),
        retrieval_evidence=len(state.retrieval_evidence),
    )
    response = _state_response(stored, status=201 if created else 200)
    if created:
        response.headers["Location"] = request.path
    return response


def _conflict(sid: str, if_match: int | None, exc: VersionConflict) -> web.Response:
    current = exc.current_version
    if if_match is None:
        # A create that found an existing state: the client must say which one it replaces.
        return _error(428, "invalid_request_error",
                      f'If-Match required: session {sid} has state version {current}; '
                      f'send If-Match: "{current}"',
                      headers={"ETag": _etag(current)} if current is not None else None)
    found = "no state exists" if current is None else f"current version is {current}"
    return _error(409, "conflict_error",
                  f'If-Match "{if_match}" is stale for session {sid}: {found}',
                  headers={"ETag": _etag(current)} if current is not None else None)


async def _delete_state(request: web.Request) -> web.Response:
    if not _authorized(request):
        return _unauthorized()
    sid = _session_id(request)
    if isinstance(sid, web.Response):
        return sid
    if_match = _if_match(request)
    if isinstance(if_match, web.Response):
        return if_match
    try:
        deleted = await request.app[ADMIN_STORE_KEY].delete_state(sid, if_match)
    except VersionConflict as exc:
        return _conflict(sid, if_match, exc)
    except StoreError as exc:
        return _store_failed("delete", sid, exc)
    if not deleted:
        return _error(404, "not_found_error", f"no durable state for session {sid}")
    structlog.get_logger().info("admin_state_deleted", session_id=sid, expected_version=if_match)
    return web.Response(status=204)
