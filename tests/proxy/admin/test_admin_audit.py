"""The admin API's audit routes on a real aiohttp server on 127.0.0.1, backed by a real SQLite
store and real source files: the sessions list (paging, order, filter), a session's requests
and state changes, ``?resolve=true`` on the state, and the changes every PUT / DELETE records."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from policies import SourceAccessPolicy
from proxy.admin.api import setup_admin
from proxy.audit.log import LayerSaving, RequestEntry
from proxy.sources.resolvers import ResolverPool
from proxy.store import SQLiteStateStore
from tests.proxy.admin.helpers import AUTH, STATE_PATH, TOKEN, assert_error, with_auth

TENANT = "t0123456789abcdef"
NOW = datetime.now(UTC).replace(microsecond=0)


class Api:
    """A running app with the admin API, its store and source roots, and a client."""

    def __init__(self, base: str, client: aiohttp.ClientSession, store: SQLiteStateStore,
                 roots: tuple[Path, Path]) -> None:
        self.base = base
        self.client = client
        self.store = store
        self.transcripts, self.artifacts = roots

    async def call(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                   body: Any = None) -> tuple[int, Any, Any]:
        """One request; (status, decoded JSON or None, headers)."""
        async with self.client.request(method, self.base + path, headers=headers or {},
                                       json=body) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None, resp.headers

    async def get(self, path: str) -> Any:
        """GET with the token; the JSON body of a 200."""
        status, body, _ = await self.call("GET", path, headers=AUTH)
        assert status == 200, body
        return body


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    """The admin API with the audit log, the resolvers and change recording on."""
    store = await SQLiteStateStore(tmp_path / "state.db", audit_linger_s=0.01).open()
    roots = (tmp_path / "transcripts", tmp_path / "artifacts")
    for root in roots:
        root.mkdir()
    app = web.Application()
    setup_admin(app, store, TOKEN, log=store,
                resolvers=ResolverPool(str(roots[0]), str(roots[1]), SourceAccessPolicy()))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    client = aiohttp.ClientSession()
    try:
        yield Api(str(server.make_url("")).rstrip("/"), client, store, roots)
    finally:
        await client.close()
        await server.close()
        await store.close()


def entry(session: str, seconds: int, *, blocked: bool = False,
          tenant: str = "none") -> RequestEntry:
    """A request of ``session`` ``seconds`` after NOW - 1 h."""
    return RequestEntry(
        at=NOW - timedelta(hours=1) + timedelta(seconds=seconds),
        request_id=f"req-{session}-{seconds}", session_id=session, tenant=tenant,
        route="messages", role="main", model="claude-sonnet-4-5", tokens_before=10_000,
        tokens_after=10_000 if blocked else 4_000, layers=(LayerSaving("L3", 6_000),),
        outcome="blocked" if blocked else "forwarded",
        reason="MessageViewLimitExceeded" if blocked else None,
        hard_limit=8_000 if blocked else None, status=400 if blocked else 200)


async def fill(api: Api) -> None:
    """Five sessions: alpha-1 (2 refused of 3), beta-1, alpha-2 (1 refused), gamma, and a
    tenant's alpha-3; newest last."""
    for item in (entry("alpha-1", 1, blocked=True), entry("alpha-1", 2, blocked=True),
                 entry("alpha-1", 3), entry("beta-1", 4), entry("alpha-2", 5, blocked=True),
                 entry("gamma", 6), entry("alpha-3", 7, tenant=TENANT)):
        await api.store.add_request(item)


# --- the sessions list --------------------------------------------------------------------


async def test_sessions_are_listed_newest_first_with_their_totals(api: Api) -> None:
    """Every tenant's sessions, newest first, each with its totals; the total and the page
    asked for are in the body."""
    await fill(api)
    body = await api.get("/admin/sessions")
    assert [(s["tenant"], s["session_id"]) for s in body["sessions"]] == [
        (TENANT, "alpha-3"), ("none", "gamma"), ("none", "alpha-2"), ("none", "beta-1"),
        ("none", "alpha-1")]
    assert (body["total"], body["offset"], body["limit"], body["order"], body["contains"]) == (
        5, 0, 50, "last_seen", None)
    alpha = body["sessions"][-1]
    assert alpha == {"session_id": "alpha-1", "tenant": "none",
                     "last_seen": (NOW - timedelta(hours=1) + timedelta(seconds=3)).isoformat(
                         timespec="microseconds"),
                     "requests": 3, "tokens_before": 30_000, "tokens_after": 24_000,
                     "saved_ratio": 0.2, "blocked": 2,
                     "requests_path": "/admin/sessions/alpha-1/requests?tenant=none"}
    assert body["sessions"][0]["requests_path"] == (
        f"/admin/sessions/alpha-3/requests?tenant={TENANT}")


async def test_sessions_page_order_and_filter(api: Api) -> None:
    """offset / limit page; order=blocked puts the most refused first; contains filters by id
    in any case, before paging; the tenant route lists that tenant's only."""
    await fill(api)
    body = await api.get("/admin/sessions?offset=1&limit=2")
    assert [s["session_id"] for s in body["sessions"]] == ["gamma", "alpha-2"]
    assert body["total"] == 5
    body = await api.get("/admin/sessions?order=blocked&limit=2")
    assert [(s["session_id"], s["blocked"]) for s in body["sessions"]] == [("alpha-1", 2),
                                                                          ("alpha-2", 1)]
    body = await api.get("/admin/sessions?contains=ALPHA&offset=1")
    assert [s["session_id"] for s in body["sessions"]] == ["alpha-2", "alpha-1"]
    assert (body["total"], body["contains"]) == (3, "ALPHA")
    body = await api.get(f"/admin/tenants/{TENANT}/sessions")
    assert [s["session_id"] for s in body["sessions"]] == ["alpha-3"]
    assert (body["tenant"], body["total"]) == (TENANT, 1)
    assert (await api.get("/admin/sessions?contains=zeta"))["sessions"] == []


@pytest.mark.parametrize(
    ("query", "named"),
    [("offset=-1", "offset"), ("offset=x", "offset"), ("limit=0", "limit"),
     ("limit=1001", "limit"), ("limit=1.5", "limit"), ("limit=", "limit"),
     ("limit=1&limit=2", "limit"), ("order=size", "order"), ("contains=" + "x" * 129, "contains")],
)
async def test_bad_paging_is_400_naming_the_parameter(api: Api, query: str, named: str) -> None:
    """Each bad parameter of the sessions list (and of a session's requests) is a 400 whose
    message starts with its name."""
    for path in ("/admin/sessions", "/admin/sessions/alpha-1/requests"):
        if named in ("order", "contains") and "requests" in path:
            continue
        status, body, _ = await api.call("GET", f"{path}?{query}", headers=AUTH)
        assert status == 400, (path, query)
        assert assert_error(body, "invalid_request_error").startswith(f"{named}: ")


@pytest.mark.parametrize("path", ["/admin/sessions", "/admin/sessions/alpha-1/requests",
                                  "/admin/sessions/alpha-1/changes",
                                  f"/admin/tenants/{TENANT}/sessions",
                                  "/admin/sessions/alpha-1/state?resolve=true"])
async def test_audit_routes_need_the_token(api: Api, path: str) -> None:
    """Without the bearer token: the API's one 401."""
    await fill(api)
    status, body, headers = await api.call("GET", path)
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert_error(body, "authentication_error")
    status, _, _ = await api.call("GET", path, headers={"Authorization": "Bearer wrong"})
    assert status == 401


@pytest.mark.parametrize("path", ["/admin/sessions", "/admin/sessions/alpha-1/requests",
                                  "/admin/sessions/alpha-1/changes"])
async def test_audit_routes_are_404_when_the_admin_api_is_off(tmp_path: Path, path: str) -> None:
    """No token configured: 404 like the rest of /admin, with or without a header."""
    store = await SQLiteStateStore(tmp_path / "state.db", audit_linger_s=0.01).open()
    app = web.Application()
    setup_admin(app, store, None, log=store)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(server.make_url(path), headers=AUTH) as resp:
                assert resp.status == 404
                assert_error(await resp.json(), "not_found_error")
    finally:
        await server.close()
        await store.close()


async def test_only_get_is_allowed_on_the_audit_routes(api: Api) -> None:
    """A POST on the sessions list is 405 naming the methods allowed."""
    status, body, headers = await api.call("POST", "/admin/sessions", headers=AUTH, body={})
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert_error(body, "invalid_request_error")


# --- a session's requests ------------------------------------------------------------------


async def test_a_sessions_requests_page_newest_first(api: Api) -> None:
    """The session's entries, newest first, as RequestEntry.as_json(), paged, with the total;
    the tenant route reads that tenant's session."""
    await fill(api)
    body = await api.get("/admin/sessions/alpha-1/requests?limit=2")
    assert body["session_id"] == "alpha-1" and "tenant" not in body
    assert (body["total"], body["offset"], body["limit"]) == (3, 0, 2)
    assert body["requests"] == [entry("alpha-1", 3).as_json(),
                                entry("alpha-1", 2, blocked=True).as_json()]
    blocked = body["requests"][1]
    assert (blocked["blocked"], blocked["reason"], blocked["hard_limit"], blocked["layers"]) == (
        True, "MessageViewLimitExceeded", 8_000, [{"layer": "L3", "saved": 6_000}])
    body = await api.get("/admin/sessions/alpha-1/requests?offset=2")
    assert [r["request_id"] for r in body["requests"]] == [entry("alpha-1", 1).request_id]
    body = await api.get(f"/admin/tenants/{TENANT}/sessions/alpha-3/requests")
    assert body["tenant"] == TENANT and body["total"] == 1
    assert (await api.get("/admin/sessions/alpha-3/requests"))["total"] == 0


async def test_bad_session_id_or_tenant_is_400(api: Api) -> None:
    """The session id and the tenant are held to the same rules as on the state routes."""
    status, body, _ = await api.call("GET", "/admin/sessions/a..b/requests", headers=AUTH)
    assert status == 400 and "session id" in assert_error(body, "invalid_request_error")
    status, body, _ = await api.call("GET", "/admin/tenants/sk-ant-xyz/sessions", headers=AUTH)
    assert status == 400 and "sk-ant" not in assert_error(body, "invalid_request_error")


# --- state changes --------------------------------------------------------------------------


def state(status: str = "open", content: str = "never say this") -> dict[str, Any]:
    """A state with one fact and one pending item in ``status``."""
    return {
        "facts": [{"fact_id": "keep-api", "content": content,
                   "source_pointer": "transcript:sess-1:1",
                   "last_confirmed_at": "2026-12-01T09:00:00Z"}],
        "pending_items": [{"item_id": "changelog", "description": "add a changelog entry",
                           "source_pointer": "transcript:sess-1:2",
                           "last_confirmed_at": "2026-12-01T09:05:00Z", "status": status}],
    }


async def test_every_put_and_delete_records_who_when_and_what_changed(api: Api) -> None:
    """Each write is a StateChange by admin-api (or admin-api:<X-Compact-Actor>), at the time
    of the write, naming ids and status transitions only; GET .../changes lists them newest
    first."""
    before = datetime.now(UTC)
    assert (await api.call("PUT", STATE_PATH, headers=AUTH, body=state()))[0] == 201
    assert (await api.call("PUT", STATE_PATH, body=state("done"),
                           headers=with_auth(If_Match='"1"', X_Compact_Actor="alice")))[0] == 200
    third = state("blocked", "a new content")
    third["facts"].append({**third["facts"][0], "fact_id": "keep-db"})
    assert (await api.call("PUT", STATE_PATH, body=third,
                           headers=with_auth(If_Match='"2"')))[0] == 200
    assert (await api.call("DELETE", STATE_PATH, headers=with_auth(X_Compact_Actor="bob")))[0] \
        == 204
    after = datetime.now(UTC)
    body = await api.get("/admin/sessions/sess-1/changes")
    changes = body["changes"]
    assert [(c["actor"], c["action"], c["version"]) for c in changes] == [
        ("admin-api:bob", "delete", None), ("admin-api", "put", 3),
        ("admin-api:alice", "put", 2), ("admin-api", "put", 1)]
    assert [c["detail"] for c in changes] == [
        ["fact keep-api removed", "fact keep-db removed", "pending changelog removed"],
        ["fact keep-api changed", "fact keep-db added", "pending changelog: done -> blocked"],
        ["pending changelog: open -> done"],
        ["fact keep-api added", "pending changelog added (open)"],
    ]
    assert all(before <= datetime.fromisoformat(c["at"]) <= after for c in changes)
    assert "never say this" not in json.dumps(body) and "a new content" not in json.dumps(body)
    assert (await api.get("/admin/sessions/sess-1/changes?limit=1"))["changes"] == changes[:1]


async def test_refused_writes_record_nothing(api: Api) -> None:
    """A write that changes nothing (stale If-Match, bad body, bad actor) is not a change."""
    await api.call("PUT", STATE_PATH, headers=AUTH, body=state())
    for headers, body in ((with_auth(If_Match='"7"'), state("done")),
                          (with_auth(If_Match='"1"'), {"facts": "no"}),
                          (with_auth(If_Match='"1"', X_Compact_Actor="two words"), state())):
        status, error, _ = await api.call("PUT", STATE_PATH, headers=headers, body=body)
        assert status in (400, 409), error
    status, error, _ = await api.call("PUT", STATE_PATH, body=state(),
                                      headers=with_auth(If_Match='"1"', X_Compact_Actor="a b"))
    assert assert_error(error, "invalid_request_error").startswith("X-Compact-Actor: ")
    assert len((await api.get("/admin/sessions/sess-1/changes"))["changes"]) == 1


async def test_tenant_route_changes_are_recorded_under_the_tenant(api: Api) -> None:
    """A write on a tenant's route is that tenant's session's change."""
    path = f"/admin/tenants/{TENANT}/sessions/sess-1/state"
    assert (await api.call("PUT", path, headers=AUTH, body=state()))[0] == 201
    body = await api.get(f"/admin/tenants/{TENANT}/sessions/sess-1/changes")
    assert body["tenant"] == TENANT and len(body["changes"]) == 1
    assert body["changes"][0]["tenant"] == TENANT
    assert (await api.get("/admin/sessions/sess-1/changes"))["changes"] == []


async def test_changes_are_not_recorded_when_the_audit_log_is_off(tmp_path: Path) -> None:
    """record_changes False (audit.enabled false): writes work, no change is kept."""
    store = await SQLiteStateStore(tmp_path / "state.db", audit_linger_s=0.01).open()
    app = web.Application()
    setup_admin(app, store, TOKEN, log=store, record_changes=False)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.put(server.make_url(STATE_PATH), json=state(),
                                  headers=AUTH) as resp:
                assert resp.status == 201
        assert await store.state_changes("none", "sess-1") == []
    finally:
        await server.close()
        await store.close()


# --- ?resolve=true ---------------------------------------------------------------------------


def write_sources(api: Api, text: str) -> str:
    """Event 1 of sess-1's transcript says ``text``; an artifact; returns its sha256."""
    event = {"sequence": 1, "session_id": "sess-1", "event_id": "e1", "text": text}
    (api.transcripts / "sess-1.jsonl").write_text(json.dumps(event) + "\n", encoding="utf-8")
    (api.artifacts / "sess-1").mkdir()
    data = ("é" * 900).encode()
    (api.artifacts / "sess-1" / "notes.md").write_bytes(data)
    return hashlib.sha256(data).hexdigest()


async def test_resolve_true_adds_each_pointers_status_and_a_bounded_excerpt(api: Api) -> None:
    """Each distinct pointer once: an available transcript event with its text, an available
    artifact with its first 500 characters, a missing event and another session's pointer
    with no excerpt; without resolve the body is the plain state."""
    digest = write_sources(api, "deploys happen on fridays " + "z" * 1000)
    body = state()
    body["retrieval_evidence"] = [{"memory_id": "m1", "source_id": f"artifact:sess-1:notes.md:"
                                   f"{digest}", "source_type": "doc", "source_title": "notes",
                                   "captured_at": "2026-12-01T09:00:00Z", "score": 0.5,
                                   "source_rank": 1},
                                  {"memory_id": "m2", "source_id": "transcript:other:1",
                                   "source_type": "t", "source_title": "x",
                                   "captured_at": "2026-12-01T09:00:00Z", "score": 0.5,
                                   "source_rank": 2}]
    await api.call("PUT", STATE_PATH, headers=AUTH, body=body)
    plain = await api.get(STATE_PATH)
    assert "sources" not in plain
    resolved = await api.get(STATE_PATH + "?resolve=true")
    assert {key: value for key, value in resolved.items() if key != "sources"} == plain
    sources = {source["pointer"]: source for source in resolved["sources"]}
    assert list(sources) == ["transcript:sess-1:1", "transcript:sess-1:2",
                             f"artifact:sess-1:notes.md:{digest}", "transcript:other:1"]
    event = sources["transcript:sess-1:1"]
    assert event["status"] == "available" and len(event["evidence_sha256"]) == 64
    assert event["excerpt"] == ("deploys happen on fridays " + "z" * 1000)[:500]
    assert sources[f"artifact:sess-1:notes.md:{digest}"]["excerpt"] == "é" * 500
    assert sources[f"artifact:sess-1:notes.md:{digest}"]["evidence_sha256"] == digest
    assert (sources["transcript:sess-1:2"]["status"],
            sources["transcript:sess-1:2"]["excerpt"]) == ("missing", None)
    assert (sources["transcript:other:1"]["status"],
            sources["transcript:other:1"]["excerpt"]) == ("denied", None)
    assert all(len(s["excerpt"] or "") <= 500 for s in sources.values())


async def test_a_resolved_body_can_be_put_back(api: Api) -> None:
    """The sources a resolved GET adds are read-only: PUT takes the body back and ignores
    them."""
    write_sources(api, "x")
    await api.call("PUT", STATE_PATH, headers=AUTH, body=state())
    status, resolved, headers = await api.call("GET", STATE_PATH + "?resolve=1", headers=AUTH)
    status, body, _ = await api.call("PUT", STATE_PATH, body=resolved,
                                     headers=with_auth(If_Match=headers["ETag"]))
    assert status == 200 and "sources" not in body and body["version"] == 2


@pytest.mark.parametrize("value", ["maybe", "", "2"])
async def test_a_bad_resolve_value_is_400(api: Api, value: str) -> None:
    """resolve takes true / false (1 / 0, yes / no) only."""
    await api.call("PUT", STATE_PATH, headers=AUTH, body=state())
    status, body, _ = await api.call("GET", f"{STATE_PATH}?resolve={value}", headers=AUTH)
    assert status == 400
    assert assert_error(body, "invalid_request_error").startswith("resolve: ")
