"""What an admin call names, read from its URL, query and headers: the session, the tenant,
a page of results, a yes/no flag, who is acting. A bad value is a 400
(:class:`~proxy.http.errors.RequestRejected`) whose message names the parameter; a value that
may be a credential pasted in by mistake is never repeated.
"""

from __future__ import annotations

import re
from typing import Final

from aiohttp import web

from compactor import SESSION_ID_RULE, session_id_problem
from proxy.http.errors import RequestRejected
from proxy.http.tenants import is_tenant

__all__ = ["ACTOR_HEADER", "MAX_PAGE", "actor", "bad_request", "flag", "limit",
           "not_found", "one_value", "page", "session_id", "tenant"]

#: The header naming who makes a change (recorded as ``admin-api:<value>``).
ACTOR_HEADER: Final = "X-Compact-Actor"
#: The largest ``limit`` a page may ask for.
MAX_PAGE: Final = 1000
#: The largest offset accepted (far beyond any bounded audit log).
_MAX_OFFSET: Final = 10**9
_ACTOR: Final = re.compile(r"[A-Za-z0-9._@+-]{1,64}")
_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no"})


def bad_request(message: str, reason: str) -> RequestRejected:
    """A 400 ``invalid_request_error``."""
    return RequestRejected(400, "invalid_request_error", message, reason=reason)


def not_found(message: str, reason: str) -> RequestRejected:
    """A 404 ``not_found_error``."""
    return RequestRejected(404, "not_found_error", message, reason=reason)


def session_id(request: web.Request) -> str:
    """The session id in the URL (``{sid}``), held to the one rule for session ids: only
    these can be named by the pointers of the state stored here."""
    sid = request.match_info["sid"]
    problem = session_id_problem(sid)
    if problem is not None:
        raise bad_request(f"session id: {problem}; a session id is {SESSION_ID_RULE}",
                          "bad_session_id")
    return sid


def tenant(request: web.Request) -> str | None:
    """The tenant ``/tenants/{tenant}/…`` or ``?tenant=`` names (both, and different: a
    400); ``None`` when neither: tenant ``none`` (the legacy routes' bodies keep their shape)."""
    value = request.match_info.get("tenant")
    query = one_value(request, "tenant")
    if query is not None:
        if value is not None and query != value:
            raise bad_request("tenant: the query and the path name different tenants",
                              "bad_tenant")
        value = query
    # The value is not repeated: it may be a credential pasted in by mistake.
    if value is not None and not is_tenant(value):
        raise bad_request("tenant: not a tenant; a tenant is none, t<16 hex> or h<16 hex> "
                          "(compact-proxy tenant-id prints one)", "bad_tenant")
    return value


def one_value(request: web.Request, name: str) -> str | None:
    """The query parameter ``name`` (``None`` when absent); given twice, a 400."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise bad_request(f"{name}: given more than once", "bad_query")
    return values[0] if values else None


def _integer(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = one_value(request, name)
    if raw is None:
        return default
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or not low <= int(text) <= high:
        raise bad_request(f"{name}: must be an integer from {low} to {high}", "bad_page")
    return int(text)


def limit(request: web.Request, *, default: int) -> int:
    """``?limit=``: from 1 to :data:`MAX_PAGE`."""
    return _integer(request, "limit", default, 1, MAX_PAGE)


def page(request: web.Request, *, default_limit: int) -> tuple[int, int]:
    """``(offset, limit)`` from ``?offset=&limit=``."""
    return (_integer(request, "offset", 0, 0, _MAX_OFFSET), limit(request, default=default_limit))


def flag(request: web.Request, name: str) -> bool:
    """A yes/no query parameter (``true``/``false``, ``1``/``0``, ``yes``/``no``); absent: no."""
    raw = one_value(request, name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise bad_request(f"{name}: must be true or false", "bad_query")


def actor(request: web.Request, base: str) -> str:
    """Who makes a change: ``base``, or ``base:<X-Compact-Actor>`` when the caller names it."""
    raw = request.headers.get(ACTOR_HEADER)
    if raw is None:
        return base
    value = raw.strip()
    if _ACTOR.fullmatch(value) is None:
        raise bad_request(f"{ACTOR_HEADER}: must be 1 to 64 characters of A-Z a-z 0-9 . _ @ + -",
                          "bad_actor")
    return f"{base}:{value}"
