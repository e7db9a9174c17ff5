"""Logging in and out of the console.

The login form has one field, ``token``, and a CSRF token bound to a nonce cookie; a wrong
token gets the form again (401), a stale form 403, a locked-out address 429 (the throttle is
shared with the admin API). The token is only ever in the POST body: never in a URL, a page
or a log line.
"""

from __future__ import annotations

from typing import Final

import structlog
from aiohttp import web

from proxy.admin.console._auth import LOGIN_FORM_TTL_S, SESSION_TTL_S
from proxy.admin.console._context import (
    CONSOLE,
    LOGIN,
    LOGIN_COOKIE,
    PREFIX,
    SESSION_COOKIE,
    render,
    see_other,
)
from proxy.admin.throttle import client_of
from proxy.store import StoreError

__all__ = ["login_form", "login_submit", "logout"]

_log = structlog.get_logger("proxy.admin.console")
_HOME: Final = f"{PREFIX}/"


def _next_path(raw: object) -> str:
    """Where to go after logging in: a console path, else the sessions page (no open
    redirect: ``//host``, schemes, backslashes and ``..`` are refused)."""
    if (isinstance(raw, str) and raw.startswith(_HOME) and raw.isprintable()
            and not any(bad in raw for bad in ("//", "\\", ".."))):
        return raw
    return _HOME


def _set_cookie(request: web.Request, response: web.StreamResponse, name: str, value: str,
                max_age: int) -> None:
    secure = request.secure or request.app[CONSOLE].cookie_secure
    response.set_cookie(name, value, max_age=max_age, path=PREFIX, httponly=True,
                        samesite="Strict", secure=secure)


def _form_page(request: web.Request, *, error: str | None = None,
               status: int = 200) -> web.Response:
    cookie, csrf = request.app[CONSOLE].signer.new_login_form(
        request.cookies.get(LOGIN_COOKIE))
    response = render(request, "login.html",
                      {"title": "Log in", "login_csrf": csrf, "error": error,
                       "next": _next_path(request.query.get("next"))}, status=status)
    _set_cookie(request, response, LOGIN_COOKIE, cookie, LOGIN_FORM_TTL_S)
    return response


async def login_form(request: web.Request) -> web.StreamResponse:
    """``GET /login``: the form (or the sessions page, when already logged in)."""
    try:
        login = await request.app[CONSOLE].login(request)
    except StoreError:  # the revocations cannot be read: the form, as when logged out
        login = None
    if login is not None:
        raise web.HTTPSeeOther(_next_path(request.query.get("next")))
    return _form_page(request)


async def login_submit(request: web.Request) -> web.StreamResponse:
    """``POST /login``: a session cookie for the admin token, a 401 form otherwise."""
    console = request.app[CONSOLE]
    signer, throttle, client = console.signer, console.throttle, client_of(request)
    form = await request.post()
    csrf, token, next_path = form.get("csrf"), form.get("token"), form.get("next")
    if not signer.login_form_matches(request.cookies.get(LOGIN_COOKIE),
                                     csrf if isinstance(csrf, str) else None):
        _log.warning("console_csrf_refused", path=request.path)
        # A form again (a fresh nonce): the user only types the token once more.
        return _form_page(request, error="The login form expired or did not come from this "
                                         "console: enter the token again.", status=403)
    wait = throttle.retry_after(client)
    if wait is not None:  # locked out: the token is not even looked at
        _log.warning("console_login_locked_out", retry_after_s=wait)
        response = _form_page(request, error=f"Too many wrong tokens from your address: try "
                                              f"again in {wait} s.", status=429)
        response.headers["Retry-After"] = str(wait)
        return response
    if not isinstance(token, str) or not token or not signer.token_matches(token):
        throttle.failed(client)
        _log.warning("console_login_refused")
        return _form_page(request, error="Wrong admin token.", status=401)
    throttle.succeeded(client)
    response = see_other(_next_path(next_path))
    # The form's nonce cookie stays (it expires by itself): another login tab's form, or
    # the form after a logout, still matches it.
    _set_cookie(request, response, SESSION_COOKIE, signer.new_session(), SESSION_TTL_S)
    _log.info("console_login")
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    """``POST /logout``: forget the login (the middleware checked its CSRF token)."""
    await request.app[CONSOLE].logout(request[LOGIN])
    response = see_other(f"{PREFIX}/login")
    response.del_cookie(SESSION_COOKIE, path=PREFIX)
    _log.info("console_logout")
    return response
