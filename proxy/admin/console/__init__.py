"""The audit console: server-rendered pages at ``/admin/ui/`` over the audit log and the
durable state, mounted when the admin token is set.

Jinja2 templates with autoescaping on and no JavaScript (charts are inline SVG drawn on the
server). What operators see: docs/admin.md, "The audit console".
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import aiohttp_jinja2
import jinja2
from aiohttp import web

from policies import RolePolicies
from proxy.admin.console._auth import Signer
from proxy.admin.console._context import CONSOLE, PREFIX, Console
from proxy.admin.console._edits import EDITS
from proxy.admin.console._login import login_form, login_submit, logout
from proxy.admin.console._middleware import MIDDLEWARES
from proxy.admin.console._overview import overview_page, requests_page
from proxy.admin.console._pages import edit_handler, session_page, sessions_page
from proxy.admin.console._totals import PriceFor
from proxy.admin.throttle import AuthThrottle
from proxy.audit.log import RequestLog
from proxy.sources.resolvers import ResolverPool
from proxy.store import StateStore, SummaryCache
from proxy.store.revocations import LoginRevocations

__all__ = ["PREFIX", "setup_console"]

_HERE: Final = Path(__file__).parent
_SESSION: Final = "/tenants/{tenant}/sessions/{sid}"


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _tokens(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _usd(value: float | None) -> str:
    if value is None:
        return "—"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


_FILTERS: Final[dict[str, Callable[..., str]]] = {
    "when": _when, "tokens": _tokens, "percent": _percent, "usd": _usd}


def setup_console(app: web.Application, *, token: str | None, store: StateStore,
                  log: RequestLog | None, resolvers: ResolverPool, policies: RolePolicies,
                  record_changes: bool = True, throttle: AuthThrottle | None = None,
                  revocations: LoginRevocations | None = None,
                  cookie_secure: bool = False, price_for: PriceFor | None = None,
                  summaries: SummaryCache | None = None) -> None:
    """Mount the console on ``app`` at ``/admin/ui`` (nothing when ``token`` is unset); this
    prefix is resolved before the admin API's ``/admin``. The arguments are
    :class:`~proxy.admin.console._context.Console`'s (``token``: the login's secret)."""
    if not token:
        return
    console = web.Application(middlewares=MIDDLEWARES)
    console[CONSOLE] = Console(store=store, log=log, resolvers=resolvers, policies=policies,
                               signer=Signer(token), record_changes=record_changes,
                               throttle=throttle if throttle is not None else AuthThrottle(),
                               revocations=revocations, cookie_secure=cookie_secure,
                               summaries=summaries,
                               **({} if price_for is None else {"price_for": price_for}))
    aiohttp_jinja2.setup(
        console, loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        default_helpers=False, filters=_FILTERS,
    )
    router = console.router
    router.add_get("/login", login_form)
    router.add_post("/login", login_submit)
    router.add_post("/logout", logout)
    router.add_get("/", sessions_page)
    router.add_get("/overview", overview_page)
    router.add_get("/requests", requests_page)
    router.add_get(_SESSION, session_page)
    for kind, operation in EDITS:
        router.add_post(f"{_SESSION}/{kind}/{operation}", edit_handler(kind, operation))
    router.add_static("/static/", _HERE / "static")
    app.add_subapp(PREFIX, console)
