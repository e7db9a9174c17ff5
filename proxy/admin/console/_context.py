"""What the console's handlers share: its dependencies (one typed app key), the login of the
request being served, its paths and the rendering helper. Everything in ``__all__`` gets
re-exported.
"""

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

__all__ = [
    "CONSOLE",
    "LOGIN",
    "LOGIN_COOKIE",
    "PREFIX",
    "SESSION_COOKIE",
    "Console",
    "render",
    "see_other",
    "session_path",
]

#: Where the console is mounted.
PREFIX: Final = "/admin/ui"
#: The login session's cookie, and the login form's nonce cookie.
SESSION_COOKIE: Final = "compact_console"
LOGIN_COOKIE: Final = "compact_console_login"


@dataclass(frozen=True, slots=True)
class Console:
    """The console's dependencies.

    Attributes:
        store: the durable state, the very object the request path and the admin API use
            (so a change is seen by the next request at once).
        log: the audit log (``None``: the store keeps none; the pages say so).
        resolvers: the source-pointer resolvers of the request path.
        policies: the roles' thresholds, for the chart.
        signer: cookies and CSRF tokens.
        record_changes: whether each change is kept in ``log`` (``audit.enabled``).
        throttle: the failed-auth lockouts, shared with the admin API.
        revocations: where logouts are kept for every process (``None``: this one only).
        cookie_secure: mark the cookies ``Secure`` whatever the scheme seen here.
        price_for: a model's price (``prices``), for the cost columns; none by default.
        summaries: the summary cache, where the L4 summaries' text is read (``None``: not
            shown).
    """

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
        """The login the request's cookie proves: signed, unexpired and not revoked here or
        in the store (which may raise :class:`~proxy.store.StoreError`)."""
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


#: The console's dependencies (held by its sub-app).
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
    """Render ``template`` (autoescaped) with ``context`` plus what every page uses: the
    prefix, the login and its CSRF token."""
    login = request.get(LOGIN)
    console = request.app[CONSOLE]
    full = {"prefix": PREFIX, "logged_in": login is not None,
            "csrf": console.signer.csrf(login) if login is not None else "",
            "session_path": session_path, **context}
    return aiohttp_jinja2.render_template(template, request, full, status=status)


def see_other(location: str) -> web.Response:
    """A 303 to ``location`` (what a form's answer is: the browser then GETs it)."""
    return web.Response(status=303, headers={"Location": location})
