"""The console's middlewares: the headers every page carries, the login check and the CSRF
check, in that order (outermost first). Everything in ``__all__`` gets re-exported.

- Every answer (pages, redirects, refusals) carries a strict ``Content-Security-Policy`` (no
  script at all, styles and forms from the console only, no framing), ``no-store`` and no
  referrer.
- Without a valid login cookie a ``GET`` or ``HEAD`` is redirected to the login page (the
  path it asked for rides along in ``next``; never the token), anything else is refused
  with 403. The login page and the stylesheet need no login.
- Every other method needs the form field ``csrf`` to be the login's CSRF token: 403
  otherwise, before the handler runs (the login form checks its own).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlencode

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.admin.console._context import CONSOLE, LOGIN, PREFIX, render
from proxy.store import StoreError

__all__ = ["console_middlewares", "forbidden"]


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


def forbidden(request: web.Request, message: str) -> web.Response:
    """The 403 page."""
    return render(request, "error.html", {"title": "Forbidden", "message": message},
                  status=403)


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
        return forbidden(request, "Not logged in (or the login expired): log in again.")
    request[LOGIN] = login
    if request.method not in _SAFE_METHODS:
        form = await request.post()
        given = form.get("csrf")
        if not request.app[CONSOLE].signer.csrf_matches(
                login, given if isinstance(given, str) else None):
            structlog.get_logger().warning("console_csrf_refused", path=request.path)
            return forbidden(request, "The form's CSRF token is missing or wrong: reload the "
                                      "page and try again.")
    try:
        return await handler(request)
    except StoreError as exc:
        return _store_failed(request, exc)


def _store_failed(request: web.Request, exc: StoreError) -> web.Response:
    # The store's message may name file paths; it goes to the log only.
    structlog.get_logger().error("console_store_failed", path=request.path,
                                 error=type(exc).__name__, detail=str(exc))
    return render(request, "error.html", {"title": "State store failed",
                                          "message": "The state store failed; try again."},
                  status=500)


def console_middlewares() -> list[Middleware]:
    """The console's middlewares, outermost first."""
    return [_headers, _login_required]
