"""The pages over every session's requests: the request log (``GET /requests``) and the
overview (``GET /overview``: totals, outcomes and a trend).

Both read the sessions newest first through :class:`~proxy.audit.log.RequestLog` (any
backend), bounded by :data:`SCAN_SESSIONS` and :data:`SCAN_REQUESTS`; the page says when
the bound cut the scan short.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from aiohttp import web

from proxy.admin.console._context import CONSOLE, render
from proxy.admin.console._range import PRESETS, RequestFilter, request_filter
from proxy.admin.console._totals import totals
from proxy.admin.console._trend import trend
from proxy.audit.log import RequestEntry, RequestLog

__all__ = ["SCAN_REQUESTS", "SCAN_SESSIONS", "Gathered", "gather", "overview_page",
           "requests_page"]

#: The most sessions one page reads, and requests of each.
SCAN_SESSIONS: Final = 200
SCAN_REQUESTS: Final = 1000
#: Requests the request log lists (the newest that match).
REQUESTS_LISTED: Final = 500
_PAGE: Final = 50


@dataclass(frozen=True, slots=True)
class Gathered:
    """The requests a filter keeps, newest first; ``cut``: the scan stopped at its bound
    with sessions left unread."""

    entries: list[RequestEntry]
    sessions: int
    cut: bool


async def gather(log: RequestLog, wanted: RequestFilter) -> Gathered:
    """Every request ``wanted`` keeps, over the newest :data:`SCAN_SESSIONS` sessions."""
    entries: list[RequestEntry] = []
    offset = scanned = 0
    cut = False
    while True:
        rows, total = await log.sessions(offset=offset, limit=_PAGE)
        for row in rows:
            if wanted.since is not None and row.last_seen < wanted.since:
                total = 0  # the rest were last seen earlier still
                break
            if scanned >= SCAN_SESSIONS:
                cut = True
                break
            held, _ = await log.session_requests(row.tenant, row.session_id,
                                                 limit=SCAN_REQUESTS)
            scanned += 1
            entries.extend(entry for entry in held if wanted.keeps(entry))
        offset += len(rows)
        if cut or not rows or offset >= total:
            break
    entries.sort(key=lambda entry: entry.at, reverse=True)
    return Gathered(entries, scanned, cut)


async def _scan(request: web.Request, title: str
                ) -> tuple[RequestFilter, Gathered, dict[str, object]]:
    """The filter the query asks for, what it keeps, and what both pages show of it."""
    wanted = request_filter(request.query, default="24h")
    log = request.app[CONSOLE].log
    found = Gathered([], 0, False) if log is None else await gather(log, wanted)
    return wanted, found, {"title": title, "audit_on": log is not None, "filter": wanted,
                           "presets": tuple(PRESETS), "path": request.path, "found": found}


async def requests_page(request: web.Request) -> web.StreamResponse:
    """``GET /requests``: every session's requests in the range, newest first, with their
    usage, cost and totals; ``?rid=`` finds one by its ``x-compact-request-id``."""
    _, found, base = await _scan(request, "Requests")
    total, costs = totals(found.entries, request.app[CONSOLE].price_for)
    return render(request, "requests.html", {
        **base, "entries": found.entries[:REQUESTS_LISTED], "matched": len(found.entries),
        "costs": costs, "totals": total})


async def overview_page(request: web.Request) -> web.StreamResponse:
    """``GET /overview``: totals over the range and their trend by hour or day."""
    console = request.app[CONSOLE]
    wanted, found, base = await _scan(request, "Overview")
    total, _ = totals(found.entries, console.price_for)
    sessions = len({(entry.tenant, entry.session_id) for entry in found.entries})
    outcomes = sorted(total.outcomes.items(), key=lambda item: (-item[1], item[0]))
    return render(request, "overview.html", {
        **base, "totals": total, "sessions": sessions, "outcomes": outcomes,
        "trend": trend(found.entries, console.price_for, since=wanted.since,
                       until=wanted.until, now=datetime.now(UTC))})
