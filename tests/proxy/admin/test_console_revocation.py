"""Issue #31, through real proxies: a console logout is refused by every process serving
from the same store and by one started afresh (a restart), with SQLite and with Redis; and the
console's cookies are ``Secure`` when the operator says TLS ends in front."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory

TOKEN = "revocation-admin-token-4b8e1c7a9d3f5e2b6c0a"
UI = "/admin/ui"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = _CSRF.search(html)
    assert match is not None
    return match.group(1)


async def log_in(base_url: str) -> tuple[str, str]:
    """A fresh browser logs in: its session cookie and a page's CSRF token."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{base_url}{UI}/login") as resp:
            csrf = csrf_of(await resp.text())
        async with http.post(f"{base_url}{UI}/login", allow_redirects=False,
                             data={"csrf": csrf, "token": TOKEN}) as resp:
            assert resp.status == 303
        async with http.get(f"{base_url}{UI}/") as resp:
            assert resp.status == 200
            page_csrf = csrf_of(await resp.text())
        cookie = next(c.value for c in http.cookie_jar if c.key == "compact_console")
    return cookie, page_csrf


async def with_cookie(base_url: str, cookie: str, method: str = "GET", path: str = "/",
                      data: Any = None) -> int:
    """One request carrying the session cookie; its status (redirects not followed)."""
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"{base_url}{UI}{path}", data=data,
                                allow_redirects=False,
                                headers={"Cookie": f"compact_console={cookie}"}) as resp:
            return resp.status


def store_overrides(backend: str, tmp_path: Any, redis_url: str | None) -> dict[str, Any]:
    if backend == "redis":
        return {"store": {"backend": "redis", "url": redis_url}}
    return {"store": {"path": str(tmp_path / "shared-state.db")}}


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_a_logout_is_refused_by_every_process_and_after_a_restart(
    proxy_factory: ProxyFactory, tmp_path: Any, backend: str, request: pytest.FixtureRequest
) -> None:
    """Two proxies on one store (as two workers, or replicas): a cookie logged out on one is
    refused by the other, and by a third started afterwards (a restart); a login that did
    not log out is untouched."""
    redis_url = request.getfixturevalue("redis_url") if backend == "redis" else None
    overrides = store_overrides(backend, tmp_path, redis_url)
    first = proxy_factory(overrides, admin_token=TOKEN)
    second = proxy_factory(overrides, admin_token=TOKEN)
    cookie, csrf = await log_in(first.base_url)
    kept, _ = await log_in(first.base_url)
    assert await with_cookie(second.base_url, cookie) == 200  # one login, valid everywhere
    assert await with_cookie(first.base_url, cookie, "POST", "/logout",
                             data={"csrf": csrf}) == 303
    assert await with_cookie(first.base_url, cookie) == 303  # back to the login form
    assert await with_cookie(second.base_url, cookie) == 303
    restarted = proxy_factory(overrides, admin_token=TOKEN)
    assert await with_cookie(restarted.base_url, cookie) == 303
    assert await with_cookie(restarted.base_url, kept) == 200


@pytest.mark.parametrize(("secure", "expected"), [(True, True), (False, False)])
async def test_cookies_are_secure_when_tls_ends_in_front(
    proxy_factory: ProxyFactory, secure: bool, expected: bool
) -> None:
    """``admin.cookie_secure``: the login form's and the session's cookies carry ``Secure``
    although the proxy itself sees plain HTTP."""
    proxy = proxy_factory({"admin": {"cookie_secure": secure}}, admin_token=TOKEN)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.get(f"{proxy.base_url}{UI}/login") as resp:
            form_cookies = resp.headers.getall("Set-Cookie")
            csrf = csrf_of(await resp.text())
        login_cookie = SimpleCookie()
        for value in form_cookies:
            login_cookie.load(value)
        nonce = login_cookie["compact_console_login"].value
        async with http.post(f"{proxy.base_url}{UI}/login", allow_redirects=False,
                             data={"csrf": csrf, "token": TOKEN},
                             headers={"Cookie": f"compact_console_login={nonce}"}) as resp:
            assert resp.status == 303
            session_cookies = resp.headers.getall("Set-Cookie")
    for value in (*form_cookies, *session_cookies):
        jar = SimpleCookie()
        jar.load(value)
        for morsel in jar.values():
            if morsel.value:  # (a deletion carries no value)
                assert bool(morsel["secure"]) is expected, value
    assert any("compact_console=" in value for value in session_cookies)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_revocations_expire_with_their_cookie(
    tmp_path: Any, backend: str, request: pytest.FixtureRequest
) -> None:
    """A revocation is kept until the cookie's own expiry and no longer: Redis keys carry that
    TTL, SQLite drops expired rows with the next logout (the table stays bounded)."""
    import time

    from proxy.store import RedisStateStore, SQLiteStateStore

    now = int(time.time())
    if backend == "redis":
        store: Any = RedisStateStore(request.getfixturevalue("redis_url"),
                                     key_prefix=f"revocation-{now}:")
    else:
        store = SQLiteStateStore(tmp_path / "revoked.db")
    await store.open()
    try:
        assert await store.login_revoked("nonce-a") is False  # nothing yet (no table)
        await store.revoke_login("nonce-a", now + 100)
        await store.revoke_login("nonce-old", now - 1)  # already expired: nothing to keep
        assert await store.login_revoked("nonce-a") is True
        assert await store.login_revoked("nonce-old") is False
        assert await store.login_revoked("nonce-b") is False
        if backend == "redis":
            ttl = await store.client.ttl(store.revoked_login_key("nonce-a"))
            assert 95 <= ttl <= 100
        else:
            await store.revoke_login("nonce-b", now + 100)
            rows = await store._call(lambda: store._connection().execute(
                "SELECT nonce FROM console_revoked ORDER BY nonce").fetchall())
            assert [row[0] for row in rows] == ["nonce-a", "nonce-b"]
    finally:
        await store.close()
