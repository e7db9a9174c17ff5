"""The console's pages and forms: the sessions table, one session's page, and its edits.

Every edit form carries the state's version as the page loaded it and writes through the
store's compare-and-swap with it (the admin API's ``If-Match``): a state changed since is never
overwritten (409), a bad value is a 400 naming the field. Changes are audited as ``console``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import structlog
from aiohttp import web

from compactor import PENDING_STATUSES, DurableContextState, session_id_problem
from proxy.admin.console._chart import token_chart
from proxy.admin.console._context import CONSOLE, error_page, render, see_other, session_path
from proxy.admin.console._edits import FormError, apply_edit, parse_version
from proxy.admin.console._overview import SCAN_REQUESTS
from proxy.admin.console._range import PRESETS, request_filter
from proxy.admin.console._totals import totals
from proxy.audit.log import (
    RequestEntry,
    SessionOrder,
    SessionSummary,
    StateChange,
    state_change_detail,
)
from proxy.http.tenants import is_tenant, scoped_key
from proxy.store import StoredState, SummaryCache, VersionConflict

__all__ = ["edit_handler", "session_page", "sessions_page"]

_log = structlog.get_logger("proxy.admin.console")

#: Sessions per page of the sessions table.
SESSIONS_PER_PAGE: Final = 50
#: Requests a session's page shows (newest), and state changes.
REQUESTS_SHOWN: Final = 200
CHANGES_SHOWN: Final = 50
#: Distinct L4 summaries read for one page.
SUMMARIES_SHOWN: Final = 20
#: The actor a console change is recorded under.
ACTOR: Final = "console"
#: What a redirect after a change says (the query names one of these, never free text).
_DONE: Final = {
    "fact-add": "Fact added.",
    "fact-edit": "Fact saved.",
    "fact-delete": "Fact deleted.",
    "pending-add": "Pending item added.",
    "pending-edit": "Pending item saved.",
    "pending-delete": "Pending item deleted.",
    "pending-status": "Status set.",
}
_ANCHORS: Final = {"fact": "facts", "pending": "pending"}


@dataclass(frozen=True, slots=True)
class Problem:
    """Why an edit was not saved, shown next to its form: the form (``item_id`` ``""`` for an
    add), the field at fault (``version`` for a ``conflict``), and for a 400 what the form sent
    (``draft``, ``version``) to put back in it."""

    kind: str
    operation: str
    item_id: str
    field: str
    message: str
    conflict: bool = False
    draft: Mapping[str, str] = dataclasses.field(default_factory=dict)
    version: str = ""

    def about(self, kind: str, operation: str, item_id: str = "") -> bool:
        """Whether this is the problem of that form (the template asks)."""
        return (self.kind, self.operation, self.item_id) == (kind, operation, item_id)


def _no_such_session(request: web.Request) -> web.Response:
    return error_page(request, 404, "Not found",
                      "No such session: not a tenant or a session id.")


def _session_of(request: web.Request) -> tuple[str, str] | None:
    tenant, sid = request.match_info["tenant"], request.match_info["sid"]
    if not is_tenant(tenant) or session_id_problem(sid) is not None:
        return None
    return tenant, sid


def _page_number(raw: str | None) -> int:
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 6:
        return 1
    return max(1, int(raw))


async def sessions_page(request: web.Request) -> web.StreamResponse:
    """``GET /``: the sessions, newest (or most blocked) first, filtered by id."""
    log = request.app[CONSOLE].log
    query = request.query.get("q", "").strip()[:128]
    order: SessionOrder = "blocked" if request.query.get("sort") == "blocked" else "last_seen"
    page = _page_number(request.query.get("page"))
    rows: list[SessionSummary] = []
    total = 0
    if log is not None:
        rows, total = await log.sessions(offset=(page - 1) * SESSIONS_PER_PAGE,
                                         limit=SESSIONS_PER_PAGE, contains=query or None,
                                         order=order)
    pages = max(1, -(-total // SESSIONS_PER_PAGE))
    return render(request, "sessions.html", {
        "title": "Sessions", "audit_on": log is not None, "rows": rows, "total": total,
        "query": query, "order": order, "page": page, "pages": pages,
    })


@dataclass(frozen=True, slots=True)
class SummaryView:
    """One request's L4 summary: its text, or ``None`` when the cache no longer holds it."""

    request_id: str
    key: str
    text: str | None


async def summary_views(cache: SummaryCache | None,
                        entries: Sequence[RequestEntry]) -> list[SummaryView]:
    """The L4 summaries of ``entries`` (newest first), read from the summary cache by the key
    the audit record keeps (never the text): one the cache has since evicted shows as gone."""
    if cache is None:
        return []
    texts: dict[str, str | None] = {}
    views: list[SummaryView] = []
    for entry in entries:
        key = entry.summary_key
        if key is None:
            continue
        if key not in texts:
            if len(texts) >= SUMMARIES_SHOWN:
                continue
            texts[key] = await cache.get_summary(key)
        views.append(SummaryView(entry.request_id, key, texts[key]))
    return views


async def _session_response(request: web.Request, tenant: str, sid: str, *,
                            problem: Problem | None = None, status: int = 200) -> web.Response:
    console = request.app[CONSOLE]
    stored = await console.store.get_state(scoped_key(tenant, sid))
    wanted = request_filter(request.query if request.method == "GET" else {})
    entries: list[RequestEntry] = []
    total = matched = 0
    changes: list[StateChange] = []
    if console.log is not None:
        # Filtered, every request the session keeps is read and the newest matches shown.
        entries, total = await console.log.session_requests(
            tenant, sid, limit=SCAN_REQUESTS if wanted.active else REQUESTS_SHOWN)
        entries = [entry for entry in entries if wanted.keeps(entry)]
        matched = len(entries)
        entries = entries[:REQUESTS_SHOWN]
        changes = await console.log.state_changes(tenant, sid, limit=CHANGES_SHOWN)
    role = next((entry.role for entry in entries if entry.role), None) or "main"
    try:
        policy = console.policies.policy_for(role)
    except KeyError:
        role, policy = "main", console.policies.policy_for("main")
    chart = token_chart(list(reversed(entries)), soft=policy.soft_threshold_tokens,
                        hard=policy.hard_limit_tokens)
    shown, costs = totals(entries, console.price_for)
    summaries = await summary_views(console.summaries, entries)
    # Each pointer's status and excerpt, as the admin API's ?resolve=true shows them.
    excerpts = (() if stored is None
                else await console.resolvers.excerpts(sid, stored.state, tenant=tenant))
    sources = {excerpt.resolution.pointer: excerpt for excerpt in excerpts}
    done = _DONE.get(request.query.get("done", "")) if problem is None else None
    return render(request, "session.html", {
        "title": f"Session {sid}", "audit_on": console.log is not None,
        "tenant": tenant, "sid": sid, "stored": stored, "sources": sources,
        "entries": entries, "total": total,
        # A client's mistake (outcome ``invalid``) is no limit refusal: listed apart.
        "blocked": [e for e in entries if e.blocked and e.outcome != "invalid"],
        "invalid": [e for e in entries if e.outcome == "invalid"],
        "changes": changes, "chart": chart, "role": role,
        "before": shown.tokens_before, "after": shown.tokens_after, "totals": shown,
        "costs": costs, "summaries": summaries, "filter": wanted, "presets": tuple(PRESETS),
        "matched": matched,
        "statuses": PENDING_STATUSES, "problem": problem, "done": done,
        "version": "" if stored is None else str(stored.version),
    }, status=status)


async def session_page(request: web.Request) -> web.StreamResponse:
    """``GET /tenants/{tenant}/sessions/{sid}``: chart, requests, blocks, state, forms."""
    session = _session_of(request)
    if session is None:
        return _no_such_session(request)
    return await _session_response(request, *session)


def _change(request: web.Request, tenant: str, sid: str, old: StoredState | None,
            state: DurableContextState) -> StateChange | None:
    """The change an edit records, in the admin API's words (``None``: not recorded)."""
    console = request.app[CONSOLE]
    if console.log is None or not console.record_changes:
        return None
    detail = state_change_detail(None if old is None else old.state, state)
    return StateChange(at=datetime.now(UTC), session_id=sid, tenant=tenant, actor=ACTOR,
                       action="put", version=None, detail=detail)


def _conflict_message(loaded: int | None, current: int | None) -> str:
    had = "no state" if loaded is None else f"version {loaded}"
    now = "it has been deleted" if current is None else f"it is now version {current}"
    return (f"Changed since you loaded it: your page had {had}; {now}. Nothing was saved: "
            f"the page now shows the current state, make your change again.")


def edit_handler(kind: str, operation: str
                 ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of ``POST /tenants/{tenant}/sessions/{sid}/{kind}/{operation}``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        session = _session_of(request)
        if session is None:
            return _no_such_session(request)
        tenant, sid = session
        form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
        item_id = form.get("fact_id" if kind == "fact" else "item_id", "")
        item_id = "" if operation == "add" else item_id
        store = request.app[CONSOLE].store
        key = scoped_key(tenant, sid)
        version: int | None = None
        try:
            version = parse_version(form.get("version"))
            current = await store.get_state(key)
            current_version = None if current is None else current.version
            if current_version != version:
                raise VersionConflict(key, version, current_version)
            state = apply_edit(None if current is None else current.state, kind, operation,
                               form)
            stored = await store.put_state(key, state, version,
                                           _change(request, tenant, sid, current, state))
        except FormError as exc:
            problem = Problem(kind, operation, item_id, exc.field, exc.message, draft=form,
                              version=form.get("version", ""))
            return await _session_response(request, tenant, sid, problem=problem, status=400)
        except VersionConflict as exc:
            problem = Problem(kind, operation, item_id, "version",
                              _conflict_message(version, exc.current_version), conflict=True)
            _log.info("console_state_conflict", session_id=sid, tenant=tenant,
                      expected_version=version, current_version=exc.current_version)
            return await _session_response(request, tenant, sid, problem=problem, status=409)
        # Ids and counts only: the state's text never reaches the log.
        _log.info("console_state_written", session_id=sid, tenant=tenant,
                  version=stored.version, edit=f"{kind}-{operation}")
        target = session_path(tenant, sid, query={"done": f"{kind}-{operation}"})
        return see_other(f"{target}#{_ANCHORS[kind]}")

    return handler

