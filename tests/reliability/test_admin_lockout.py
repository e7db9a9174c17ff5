"""Issue #31: the admin token cannot be guessed at speed. Wrong tokens from one client address
lock it out (429 ``rate_limit_error`` with ``retry-after``, the token not even checked), for
the admin API and the console login alike (one count for both); the lockout doubles; the
right token works once it is over; the table of clients is bounded."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.admin.throttle import AuthThrottle, client_of
from tests.conftest import ProxyFactory, UpstreamServer
from tests.reliability.conftest import RELIABILITY_ADMIN_TOKEN

TOKEN = RELIABILITY_ADMIN_TOKEN
STATE = "/admin/sessions/lockout/state"
LOGIN = "/admin/ui/login"
LOCKOUT = {"admin": {"failed_auth_limit": 3, "lockout_s": 1, "max_lockout_s": 4}}
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


async def admin_get(http: aiohttp.ClientSession, base_url: str,
                    token: str) -> tuple[int, dict[str, Any], Any]:
    async with http.get(f"{base_url}{STATE}",
                        headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json(), resp.headers


async def console_login(base_url: str, token: str) -> tuple[int, str, Any]:
    """A fresh browser: load the form, submit ``token``."""
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(f"{base_url}{LOGIN}") as resp:
            csrf = _CSRF.search(await resp.text())
        assert csrf is not None
        async with http.post(f"{base_url}{LOGIN}", allow_redirects=False,
                             data={"csrf": csrf.group(1), "token": token}) as resp:
            return resp.status, await resp.text(), resp.headers


async def test_admin_guessing_is_locked_out(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """200 guesses as fast as they go: 3 are checked (401), the rest get 429 with
    ``retry-after`` in the provider's error shape; the right token is refused too while
    locked out, and accepted once the lockout is over."""
    proxy = proxy_factory(LOCKOUT, admin_token=TOKEN)
    async with aiohttp.ClientSession() as http:
        answers = [await admin_get(http, proxy.base_url, f"guess-{n:04d}-{TOKEN[10:]}")
                   for n in range(200)]
        statuses = [status for status, _, _ in answers]
        assert statuses[:3] == [401, 401, 401] and set(statuses[3:]) == {429}
        _, body, headers = answers[-1]
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
        assert 1 <= int(headers["retry-after"]) <= 1
        status, _, _ = await admin_get(http, proxy.base_url, TOKEN)
        assert status == 429  # the right token, but locked out: not even checked
        await asyncio.sleep(1.1)
        status, _, _ = await admin_get(http, proxy.base_url, TOKEN)
        assert status == 404  # through: no state for that session
        # The right token reset the count: three wrong ones again before the next lockout.
        again = [(await admin_get(http, proxy.base_url, "wrong" * 8))[0] for _ in range(4)]
        assert again == [401, 401, 401, 429]
    assert upstream_server.upstream.requests == []


async def test_each_lockout_in_a_row_doubles(proxy_factory: ProxyFactory) -> None:
    """A wrong token right after a lockout ends locks the client again, for twice as long."""
    proxy = proxy_factory(LOCKOUT, admin_token=TOKEN)
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            await admin_get(http, proxy.base_url, "wrong" * 8)
        await asyncio.sleep(1.1)
        status, _, _ = await admin_get(http, proxy.base_url, "wrong" * 8)
        assert status == 401
        status, _, headers = await admin_get(http, proxy.base_url, TOKEN)
        assert status == 429 and int(headers["retry-after"]) == 2


async def test_console_login_guessing_is_locked_out_and_shares_the_count(
    proxy_factory: ProxyFactory
) -> None:
    """Wrong tokens at the console's login form count with the admin API's: after the
    limit, the form answers 429 with ``Retry-After`` and sets no session cookie, even for
    the right token; once the lockout is over the right token logs in."""
    proxy = proxy_factory(LOCKOUT, admin_token=TOKEN)
    async with aiohttp.ClientSession() as http:
        await admin_get(http, proxy.base_url, "wrong" * 8)  # one through the API
    assert (await console_login(proxy.base_url, "wrong" * 8))[0] == 401
    assert (await console_login(proxy.base_url, "wrong" * 8))[0] == 401
    status, html, headers = await console_login(proxy.base_url, TOKEN)
    assert status == 429 and "try again in 1 s" in html
    assert headers["Retry-After"] == "1"
    assert "compact_console=" not in " ".join(headers.getall("Set-Cookie", []))
    async with aiohttp.ClientSession() as http:
        status, body, _ = await admin_get(http, proxy.base_url, TOKEN)
        assert status == 429 and body["error"]["type"] == "rate_limit_error"
    await asyncio.sleep(1.1)
    status, _, headers = await console_login(proxy.base_url, TOKEN)
    assert status == 303
    assert "compact_console=" in " ".join(headers.getall("Set-Cookie", []))


def test_the_client_table_is_bounded() -> None:
    """A million addresses each failing once leave at most ``max_clients`` entries, and the
    newest client's lockout still holds."""
    now = [1000.0]
    throttle = AuthThrottle(limit=2, lockout_s=1, max_lockout_s=8, max_clients=1000,
                            clock=lambda: now[0])
    started = time.perf_counter()
    for n in range(200_000):
        throttle.failed(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
    assert len(throttle) == 1000
    assert time.perf_counter() - started < 5
    throttle.failed("192.0.2.1")
    assert throttle.failed("192.0.2.1") == 1 and throttle.retry_after("192.0.2.1") == 1
    now[0] += 1.5
    assert throttle.retry_after("192.0.2.1") is None
    assert throttle.failed("192.0.2.1") == 2  # doubled
    now[0] += 5000  # quiet long enough: forgotten
    assert throttle.failed("192.0.2.1") is None


@pytest.mark.parametrize("limit", [1, 5])
def test_lockouts_are_capped(limit: int) -> None:
    """The lockout doubles up to ``max_lockout_s``."""
    now = [0.0]
    throttle = AuthThrottle(limit=limit, lockout_s=1, max_lockout_s=8, clock=lambda: now[0])
    lockouts = []
    for _ in range(limit - 1):
        assert throttle.failed("c") is None
    for _ in range(6):
        lockouts.append(throttle.failed("c"))
        now[0] += 10
    assert lockouts == [1, 2, 4, 8, 8, 8]


@pytest.mark.parametrize(("peer", "client"), [
    ("203.0.113.7", "203.0.113.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
    ("::ffff:203.0.113.7", "203.0.113.7"),
])
def test_a_client_is_its_address_an_ipv6_one_by_its_64(peer: str, client: str) -> None:
    """One host holds a whole IPv6 /64: it is one client, not 2^64."""

    class Transport:
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return (peer, 1234) if name == "peername" else default

        def is_closing(self) -> bool:
            return False

    request = make_mocked_request("GET", "/admin/sessions", transport=Transport())
    assert client_of(request) == client
