"""The console's middlewares, outermost first: the headers every answer carries (a strict
``Content-Security-Policy``: no script, no framing; ``no-store``, no referrer), then the
login check (a ``GET`` without a login is redirected to the login page, anything else 403;
the login page and the stylesheet are public) and the CSRF check of every other method.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlencode

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.admin.console._context import CONSOLE, LOGIN, PREFIX, error_page
from proxy.store import StoreError

__all__ = ["MIDDLEWARES"]

_SAFE_METHODS: Final = frozenset({"GET", "HEAD"})
_PUBLIC_PATHS: Final = frozenset({f"{PREFIX}/login"})
_PUBLIC_PREFIX: Final = f"{PREFIX}/static/"
_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(_HEADERS)
        raise
    response.headers.update(_HEADERS)
    return response


@web.middleware
async def _login_required(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path == PREFIX:
        raise web.HTTPMovedPermanently(f"{PREFIX}/")
    if request.path in _PUBLIC_PATHS or request.path.startswith(_PUBLIC_PREFIX):
        return await handler(request)
    try:
        login = await request.app[CONSOLE].login(request)
    except StoreError as exc:
        return _store_failed(request, exc)
    if login is None:
        if request.method in _SAFE_METHODS:
            raise web.HTTPSeeOther(f"{PREFIX}/login?{urlencode({'next': request.path_qs})}")
        return error_page(request, 403, "Forbidden",
                          "Not logged in (or the login expired): log in again.")
    request[LOGIN] = login
    if request.method not in _SAFE_METHODS:
        form = await request.post()
        given = form.get("csrf")
        if not request.app[CONSOLE].signer.csrf_matches(
                login, given if isinstance(given, str) else None):
            structlog.get_logger().warning("console_csrf_refused", path=request.path)
            return error_page(request, 403, "Forbidden", "The form's CSRF token is missing or "
                                                         "wrong: reload the page and try again.")
    try:
        return await handler(request)
    except StoreError as exc:
        return _store_failed(request, exc)


def _store_failed(request: web.Request, exc: StoreError) -> web.Response:
    # The store's message may name file paths; it goes to the log only.
    structlog.get_logger().error("console_store_failed", path=request.path,
                                 error=type(exc).__name__, detail=str(exc))
    return error_page(request, 500, "State store failed", "The state store failed; try again.")


MIDDLEWARES: Final[tuple[Middleware, ...]] = (_headers, _login_required)
