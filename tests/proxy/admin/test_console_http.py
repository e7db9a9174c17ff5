"""The audit console at /admin/ui over plain HTTP (no browser), through the real proxy: the
login, its cookie and the CSRF checks, the console's absence when the admin API is off, the
If-Match semantics of its forms; and its pure parts (the signer, the edits, the chart)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from http.cookies import SimpleCookie
from typing import Any

import aiohttp
import pytest

from compactor import DurableContextState, DurableFact
from proxy.admin.console._auth import SESSION_TTL_S, Signer
from proxy.admin.console._chart import token_chart
from proxy.admin.console._edits import FormError, apply_edit, parse_version
from proxy.admin.console._login import _next_path
from proxy.audit.log import LayerSaving, RequestEntry
from tests.conftest import ProxyFactory

TOKEN = "console-token-5d1e9a7c3b2f4e6a8c0d1b3f"
UI = "/admin/ui"
SESSION = f"{UI}/tenants/none/sessions/sess-1"
ADMIN_STATE = "/admin/sessions/sess-1/state"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FACT = {"fact_id": "f1", "content": "The API is frozen.", "source_pointer": "transcript:sess-1:1",
        "last_confirmed_at": "2026-12-01T09:00:00+00:00"}
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The first CSRF token of a page."""
    match = _CSRF.search(html)
    assert match is not None, "the page has no form with a CSRF token"
    return match.group(1)


class Browserless:
    """An HTTP client with its own cookie jar (loopback cookies allowed), no redirects
    followed unless asked."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def request(self, method: str, path: str, *, data: Any = None, follow: bool = False,
                      headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
        """One request: (status, text, response headers)."""
        async with self.http.request(method, self.base + path, data=data,
                                     allow_redirects=follow, headers=headers) as resp:
            return resp.status, await resp.text(), resp.headers

    async def login(self, token: str = TOKEN) -> tuple[int, str, Any]:
        """Load the login form, then submit ``token`` with its CSRF token."""
        _, html, _ = await self.request("GET", f"{UI}/login")
        return await self.request("POST", f"{UI}/login",
                                  data={"csrf": csrf_of(html), "token": token, "next": f"{UI}/"})

    async def page_csrf(self, path: str = SESSION) -> tuple[str, str]:
        """A page's HTML and its CSRF token."""
        status, html, _ = await self.request("GET", path)
        assert status == 200, html
        return html, csrf_of(html)

    def cookie(self, name: str) -> str | None:
        """The jar's value of cookie ``name``."""
        for cookie in self.http.cookie_jar:
            if cookie.key == name:
                return cookie.value
        return None

    async def close(self) -> None:
        """Close the session."""
        await self.http.close()


@pytest.fixture
async def console(proxy_factory: ProxyFactory) -> Any:
    """A logged-out client of a proxy whose admin token is TOKEN."""
    client = Browserless(proxy_factory(admin_token=TOKEN).base_url)
    yield client
    await client.close()


async def logged_in(console: Browserless) -> Browserless:
    """``console``, logged in."""
    status, _, headers = await console.login()
    assert status == 303 and headers["Location"] == f"{UI}/"
    return console


def set_cookies(headers: Any) -> SimpleCookie:
    """Every ``Set-Cookie`` of a response, parsed."""
    jar: SimpleCookie = SimpleCookie()
    for value in headers.getall("Set-Cookie", []):
        jar.load(value)
    return jar


# --- login and its cookie -------------------------------------------------------------------


@pytest.mark.parametrize("path", [f"{UI}/", SESSION, f"{UI}/?q=sess&sort=blocked",
                                  f"{UI}/tenants/t0123456789abcdef/sessions/other"])
async def test_every_page_redirects_to_login_without_the_cookie(console: Browserless,
                                                                path: str) -> None:
    """A GET without a login is a 303 to the login form, the asked path in ``next``."""
    status, _, headers = await console.request("GET", path)
    assert status == 303
    assert headers["Location"].startswith(f"{UI}/login?next=")
    status, html, _ = await console.request("GET", path, follow=True)
    assert status == 200 and 'name="token"' in html and 'type="password"' in html


async def test_the_bare_prefix_leads_to_the_console(console: Browserless) -> None:
    """``/admin/ui`` goes to ``/admin/ui/`` (and so to the login form)."""
    status, _, headers = await console.request("GET", UI)
    assert status == 301 and headers["Location"] == f"{UI}/"


async def test_a_post_without_the_cookie_is_refused(console: Browserless) -> None:
    """A form posted without a login is refused (403) and writes nothing."""
    status, html, _ = await console.request("POST", f"{SESSION}/fact/add",
                                            data={**FACT, "version": "", "csrf": "x"})
    assert status == 403 and "log in" in html.lower()
    status, _, _ = await console.request("GET", ADMIN_STATE, headers=AUTH)
    assert status == 404


async def test_the_right_token_sets_a_signed_session_cookie(console: Browserless) -> None:
    """The cookie is HttpOnly, SameSite=Strict, scoped to the console, expiring, not the
    token; the token is in no URL; the sessions page then loads."""
    status, html, headers = await console.request("GET", f"{UI}/login")
    assert status == 200 and TOKEN not in html
    pre = set_cookies(headers)["compact_console_login"]
    assert pre["httponly"] and pre["samesite"] == "Strict" and pre["path"] == UI
    status, _, headers = await console.request(
        "POST", f"{UI}/login", data={"csrf": csrf_of(html), "token": TOKEN, "next": f"{UI}/"})
    assert status == 303 and TOKEN not in headers["Location"]
    cookie = set_cookies(headers)["compact_console"]
    assert cookie["httponly"] is True
    assert cookie["samesite"] == "Strict"
    assert cookie["path"] == UI
    assert int(cookie["max-age"]) == SESSION_TTL_S
    assert TOKEN not in cookie.value and len(cookie.value) > 64
    status, html, _ = await console.request("GET", f"{UI}/")
    assert status == 200 and "<h1>Sessions</h1>" in html and TOKEN not in html


@pytest.mark.parametrize("token", ["wrong", TOKEN + "x", TOKEN[:-1], ""])
async def test_a_wrong_token_is_refused_without_a_cookie(console: Browserless,
                                                         token: str) -> None:
    """A wrong (or empty) token gets the form again, 401, and no session cookie."""
    status, html, headers = await console.login(token)
    assert status == 401 and "Wrong admin token" in html
    assert "compact_console" not in set_cookies(headers)
    assert console.cookie("compact_console") is None
    status, _, _ = await console.request("GET", f"{UI}/")
    assert status == 303


async def test_a_login_post_without_its_csrf_token_is_refused(console: Browserless) -> None:
    """The login form's CSRF token is bound to its nonce cookie: missing or foreign, 403."""
    status, _, _ = await console.request("POST", f"{UI}/login", data={"token": TOKEN})
    assert status == 403
    await console.request("GET", f"{UI}/login")  # a nonce cookie, but no token posted
    status, _, headers = await console.request("POST", f"{UI}/login",
                                               data={"token": TOKEN, "csrf": "0" * 64})
    assert status == 403 and "compact_console" not in set_cookies(headers)


async def test_a_forged_or_tampered_cookie_is_refused(console: Browserless) -> None:
    """Only a cookie the console signed, unchanged, is a login."""
    await logged_in(console)
    good = console.cookie("compact_console")
    assert good is not None
    expires, nonce, signature = good.split(".")
    forged = [TOKEN, f"{int(expires) + 999}.{nonce}.{signature}",
              f"{expires}.{nonce}.{'0' * 64}", f"{expires}.x{nonce}.{signature}"]
    for value in forged:
        console.http.cookie_jar.clear()
        console.http.cookie_jar.update_cookies({"compact_console": value})
        status, _, _ = await console.request("GET", f"{UI}/")
        assert status == 303, value


async def test_logout_ends_the_login(console: Browserless) -> None:
    """Logging out clears the cookie, and the old cookie no longer works here."""
    await logged_in(console)
    old = console.cookie("compact_console")
    _, csrf = await console.page_csrf(f"{UI}/")
    status, _, headers = await console.request("POST", f"{UI}/logout", data={"csrf": csrf})
    assert status == 303 and headers["Location"] == f"{UI}/login"
    assert set_cookies(headers)["compact_console"].value == ""
    assert old is not None
    console.http.cookie_jar.update_cookies({"compact_console": old})
    status, _, _ = await console.request("GET", f"{UI}/")
    assert status == 303


async def test_pages_carry_a_strict_content_security_policy(console: Browserless) -> None:
    """No script may run on any console page, and none may be framed."""
    for path in (f"{UI}/login", f"{UI}/"):
        _, _, headers = await console.request("GET", path)
        policy = headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
        assert "script-src" not in policy
        assert headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("raw", ["//evil.example/x", "https://evil.example/", "/admin/x",
                                 "/admin/ui/\\evil", None, "/admin/ui//evil.example",
                                 "/admin/ui/../sessions"])
def test_next_never_leaves_the_console(raw: str | None) -> None:
    """``next`` is a console path or the sessions page: no open redirect."""
    assert _next_path(raw) == f"{UI}/"
    assert _next_path(f"{UI}/tenants/none/sessions/s?q=1") == f"{UI}/tenants/none/sessions/s?q=1"


# --- the console is absent when the admin API is off ---------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("GET", f"{UI}/"), ("GET", f"{UI}/login"), ("POST", f"{UI}/login"), ("GET", UI),
    ("GET", f"{UI}/static/console.css"), ("GET", SESSION), ("POST", f"{SESSION}/fact/add"),
])
async def test_the_console_is_404_when_the_admin_api_is_off(
    proxy_factory: ProxyFactory, method: str, path: str
) -> None:
    """Without an admin token, /admin/ui and everything under it is 404."""
    client = Browserless(proxy_factory().base_url)
    try:
        status, _, _ = await client.request(method, path, data={"token": "x"})
    finally:
        await client.close()
    assert status == 404


async def test_the_admin_api_still_answers_beside_the_console(console: Browserless) -> None:
    """Mounting /admin/ui leaves /admin to the admin API (bearer, JSON)."""
    status, _, _ = await console.request("GET", ADMIN_STATE)
    assert status == 401
    status, _, _ = await console.request("PUT", ADMIN_STATE, headers=AUTH,
                                         data=b'{"facts": []}')
    assert status == 201


# --- forms: CSRF, If-Match, validation ------------------------------------------------------


async def test_a_form_without_its_csrf_token_is_refused(console: Browserless) -> None:
    """Logged in, a POST whose CSRF token is missing, wrong or another login's is 403."""
    other = Browserless(console.base)
    try:
        await logged_in(other)
        _, foreign = await other.page_csrf()
    finally:
        await other.close()
    await logged_in(console)
    for extra in ({}, {"csrf": ""}, {"csrf": "0" * 64}, {"csrf": foreign}):
        status, html, _ = await console.request("POST", f"{SESSION}/fact/add",
                                                data={**FACT, "version": "", **extra})
        assert status == 403 and "CSRF" in html
    status, _, _ = await console.request("GET", ADMIN_STATE, headers=AUTH)
    assert status == 404  # nothing was written


async def test_an_edit_with_the_loaded_version_is_saved(console: Browserless) -> None:
    """Add then edit a fact: each write names the version the page had; the admin API sees
    the result."""
    await logged_in(console)
    _, csrf = await console.page_csrf()
    status, _, headers = await console.request("POST", f"{SESSION}/fact/add",
                                               data={**FACT, "version": "", "csrf": csrf})
    assert status == 303 and headers["Location"].startswith(f"{SESSION}?done=fact-add")
    edited = {**FACT, "content": "The API may change in v2."}
    status, _, _ = await console.request("POST", f"{SESSION}/fact/edit",
                                         data={**edited, "version": "1", "csrf": csrf})
    assert status == 303
    async with console.http.get(console.base + ADMIN_STATE, headers=AUTH) as resp:
        body = await resp.json()
    assert body["version"] == 2
    assert body["facts"][0]["content"] == "The API may change in v2."
    async with console.http.get(f"{console.base}/admin/sessions/sess-1/changes",
                                headers=AUTH) as resp:
        changes = (await resp.json())["changes"]
    assert [(c["actor"], c["action"], c["version"], c["detail"]) for c in changes] == [
        ("console", "put", 2, ["fact f1 changed"]), ("console", "put", 1, ["fact f1 added"])]


async def test_no_change_is_recorded_when_the_audit_log_is_off(
    proxy_factory: ProxyFactory
) -> None:
    """``audit.enabled: false``: the console still writes, and records nothing."""
    console = Browserless(proxy_factory({"audit": {"enabled": False}},
                                        admin_token=TOKEN).base_url)
    try:
        await logged_in(console)
        _, csrf = await console.page_csrf()
        status, _, _ = await console.request("POST", f"{SESSION}/fact/add",
                                             data={**FACT, "version": "", "csrf": csrf})
        assert status == 303
        async with console.http.get(f"{console.base}/admin/sessions/sess-1/changes",
                                    headers=AUTH) as resp:
            assert (await resp.json())["changes"] == []
        status, _, _ = await console.request("GET", ADMIN_STATE, headers=AUTH)
        assert status == 200
    finally:
        await console.close()


async def test_a_stale_version_is_a_409_conflict(console: Browserless) -> None:
    """A form loaded at version 1 after someone wrote version 2: 409, nothing overwritten."""
    await logged_in(console)
    _, csrf = await console.page_csrf()
    await console.request("POST", f"{SESSION}/fact/add", data={**FACT, "version": "",
                                                               "csrf": csrf})
    await console.request("PUT", ADMIN_STATE, headers={**AUTH, "If-Match": '"1"'},
                          data=b'{"facts": []}')
    status, html, _ = await console.request(
        "POST", f"{SESSION}/fact/edit",
        data={**FACT, "content": "stale", "version": "1", "csrf": csrf})
    assert status == 409
    assert "Changed since you loaded it" in html and "version 2" in html
    async with console.http.get(console.base + ADMIN_STATE, headers=AUTH) as resp:
        assert (await resp.json())["facts"] == []


async def test_a_bad_value_is_a_400_naming_the_field(console: Browserless) -> None:
    """An empty content, a naive timestamp, an unknown status: 400, the field named."""
    await logged_in(console)
    _, csrf = await console.page_csrf()
    cases = [("fact/add", {**FACT, "content": "  "}, "content"),
             ("fact/add", {**FACT, "last_confirmed_at": "2026-12-01T09:00:00"},
              "last_confirmed_at"),
             ("pending/add", {"item_id": "p1", "description": "d", "status": "later",
                              "source_pointer": "transcript:sess-1:2"}, "status")]
    for path, form, field in cases:
        status, html, _ = await console.request("POST", f"{SESSION}/{path}",
                                                data={**form, "version": "", "csrf": csrf})
        assert status == 400, html
        assert f'data-field="{field}"' in html and f"{field}: " in html
        assert 'aria-invalid="true"' in html


# --- the pure parts -------------------------------------------------------------------------


def test_the_signer_refuses_expired_and_foreign_values() -> None:
    """A cookie expires; one signed with another token is refused; CSRF tokens are per login."""
    now = [1_000_000.0]
    signer = Signer(TOKEN, clock=lambda: now[0])
    cookie = signer.new_session()
    login = signer.session(cookie)
    assert login is not None
    assert Signer("other-token").session(cookie) is None
    other = signer.session(signer.new_session())
    assert other is not None and signer.csrf(login) != signer.csrf(other)
    assert signer.csrf_matches(login, signer.csrf(login))
    assert not signer.csrf_matches(login, signer.csrf(other))
    assert not signer.csrf_matches(login, None)
    now[0] += SESSION_TTL_S
    assert signer.session(cookie) is None


def test_edits_build_the_next_state() -> None:
    """Each operation changes one item; unknown and duplicate ids name their field."""
    now = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    state = DurableContextState(facts=[DurableFact(**FACT)])
    pending = {"item_id": "p1", "description": "ship it", "source_pointer": "transcript:s:2"}
    state = apply_edit(state, "pending", "add", pending, now=now)
    assert state.pending_items[0].last_confirmed_at == now
    assert state.pending_items[0].status == "open"
    state = apply_edit(state, "pending", "status", {"item_id": "p1", "status": "done"})
    assert state.pending_items[0].status == "done"
    assert state.pending_items[0].last_confirmed_at == now
    state = apply_edit(state, "pending", "edit", {**pending, "description": "shipped"})
    assert (state.pending_items[0].description, state.pending_items[0].status) == (
        "shipped", "done")
    state = apply_edit(state, "fact", "delete", {"fact_id": "f1"})
    assert state.facts == () and len(state.pending_items) == 1
    with pytest.raises(FormError) as caught:
        apply_edit(state, "pending", "add", pending)
    assert caught.value.field == "item_id"
    with pytest.raises(FormError) as caught:
        apply_edit(state, "fact", "edit", {**FACT, "fact_id": "gone"})
    assert caught.value.field == "fact_id"
    with pytest.raises(FormError) as caught:
        apply_edit(state, "fact", "add", {**FACT, "source_pointer": " "})
    assert caught.value.field == "source_pointer"
    assert parse_version("") is None and parse_version("7") == 7
    for bad in ("0", "-1", "x", "\uff11", None):
        with pytest.raises(FormError):
            parse_version(bad)


def test_the_chart_puts_thresholds_and_points_on_one_scale() -> None:
    """Higher counts are higher on the chart; the hard line is above the soft one; a refused
    request is marked; an unknown figure breaks the line."""
    at = datetime(2026, 12, 3, tzinfo=UTC)
    entries = [
        RequestEntry(at=at, request_id="r1", session_id="s", tenant="none", route="messages",
                     tokens_before=1000, tokens_after=1000),
        RequestEntry(at=at, request_id="r2", session_id="s", tenant="none", route="messages",
                     tokens_before=5000, tokens_after=2000,
                     layers=(LayerSaving("L1", 3000),)),
        RequestEntry(at=at, request_id="r3", session_id="s", tenant="none", route="count_tokens"),
        RequestEntry(at=at, request_id="r4", session_id="s", tenant="none", route="messages",
                     tokens_before=12000, tokens_after=9500, reason="MessageViewLimitExceeded",
                     hard_limit=8000),
    ]
    chart = token_chart(entries, soft=3000, hard=8000)
    assert chart.y_hard_label < chart.y_soft_label < chart.bottom
    first, second, unknown, blocked = chart.points
    assert first.y_before is not None and second.y_before is not None
    assert second.y_before < first.y_before
    assert unknown.y_before is None and blocked.blocked and not second.blocked
    assert chart.before_path.count("M") == 2  # broken at the unknown figure
    assert [tick.label for tick in chart.x_ticks] == ["1", "2", "3", "4"]
    assert token_chart([], soft=3000, hard=8000).points == ()
