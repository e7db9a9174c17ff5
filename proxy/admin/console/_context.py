"""What the console's handlers share: its dependencies (one typed app key), the login of the
request being served, its paths and the rendering helper."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlencode

import aiohttp_jinja2
from aiohttp import web

from policies import RolePolicies
from proxy.admin.console._auth import LoginSession, Signer
from proxy.admin.console._totals import PriceFor
from proxy.admin.throttle import AuthThrottle
from proxy.audit.log import RequestLog
from proxy.sources.resolvers import ResolverPool
from proxy.store import StateStore, SummaryCache
from proxy.store.revocations import LoginRevocations

__all__ = ["CONSOLE", "LOGIN", "LOGIN_COOKIE", "PREFIX", "SESSION_COOKIE", "Console",
           "error_page", "render", "see_other", "session_path"]

#: Where the console is mounted.
PREFIX: Final = "/admin/ui"
#: The login session's cookie, and the login form's nonce cookie.
SESSION_COOKIE: Final = "compact_console"
LOGIN_COOKIE: Final = "compact_console_login"


@dataclass(frozen=True, slots=True)
class Console:
    """The console's dependencies: the very store, audit log (``None``: none kept), resolvers
    and policies the request path uses; the throttle shared with the admin API; where logouts
    are kept for every process (``None``: this one only); ``cookie_secure``: ``Secure``
    cookies even over plain HTTP (TLS ends in front); ``price_for`` (``prices``) for the cost
    columns; the summary cache for the L4 summaries' text (``None``: not shown)."""

    store: StateStore
    log: RequestLog | None
    resolvers: ResolverPool
    policies: RolePolicies
    signer: Signer
    record_changes: bool = True
    throttle: AuthThrottle = field(default_factory=AuthThrottle)
    revocations: LoginRevocations | None = None
    cookie_secure: bool = False
    price_for: PriceFor = lambda model: None  # noqa: E731 - no prices: no costs
    summaries: SummaryCache | None = None

    async def login(self, request: web.Request) -> LoginSession | None:
        """The login the request's cookie proves: signed, unexpired, not revoked (here or in
        the store, which may raise :class:`~proxy.store.StoreError`)."""
        login = self.signer.session(request.cookies.get(SESSION_COOKIE))
        if login is not None and self.revocations is not None and (
                await self.revocations.login_revoked(login.nonce)):
            return None
        return login

    async def logout(self, login: LoginSession) -> None:
        """End ``login`` here and, through the store, in every process."""
        self.signer.revoke(login)
        if self.revocations is not None:
            await self.revocations.revoke_login(login.nonce, login.expires)


CONSOLE: Final = web.AppKey("console", Console)
#: The login of the request being served (set by the login middleware).
LOGIN: Final = web.RequestKey("console_login", LoginSession)


def session_path(tenant: str, session_id: str, suffix: str = "",
                 query: Mapping[str, str] | None = None) -> str:
    """The console path of one session's page (or of ``suffix`` under it)."""
    path = f"{PREFIX}/tenants/{quote(tenant, safe='')}/sessions/{quote(session_id, safe='')}"
    path += suffix
    return f"{path}?{urlencode(query)}" if query else path


def render(request: web.Request, template: str, context: Mapping[str, Any], *,
           status: int = 200) -> web.Response:
    """Render ``template`` with ``context`` plus the prefix, the login and its CSRF token."""
    login = request.get(LOGIN)
    console = request.app[CONSOLE]
    full = {"prefix": PREFIX, "logged_in": login is not None,
            "csrf": console.signer.csrf(login) if login is not None else "",
            "session_path": session_path, **context}
    return aiohttp_jinja2.render_template(template, request, full, status=status)


def error_page(request: web.Request, status: int, title: str, message: str) -> web.Response:
    """The error page."""
    return render(request, "error.html", {"title": title, "message": message}, status=status)


def see_other(location: str) -> web.Response:
    """A 303 to ``location`` (what a form's answer is: the browser then GETs it)."""
    return web.Response(status=303, headers={"Location": location})
