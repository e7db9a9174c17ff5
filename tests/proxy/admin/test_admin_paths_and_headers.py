"""Issue #31, through the real proxy: near-misses of ``/admin`` are answered 404 and never
forwarded; the admin token never reaches the provider; the proxy's own headers, ``Cookie``
and the forwarding headers stay behind; what Claude Code and the SDKs send still arrives."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from proxy.http.admin_gate import is_admin_like
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, user_text

TOKEN = "paths-admin-token-7c1e9a3b5d2f4e6a8c0b"
MODEL = "claude-sonnet-4-5"


def small_messages() -> list[dict[str, Any]]:
    """One short user turn."""
    return [{"role": "user", "content": user_text("hello")}]


async def raw_request(base_url: str, method: str, target: str,
                      headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """Send a request line exactly as given (no client normalises the path); the status and
    the JSON body."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close",
             "Content-Length: 0", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    writer.write("\r\n".join(lines).encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body.startswith(b"{") else {}


NEAR_MISSES = [
    "//admin/sessions/s1/state",
    "/ADMIN/sessions/s1/state",
    "/Admin/ui/",
    "/admin%2fsessions/s1/state",
    "/admin%2Fsessions",
    "/%2fadmin/sessions",
    "/x/../admin/sessions",
    "/%2e%2e/admin/sessions",
    "/admin%252fsessions",
    "/v1/..%2fadmin/sessions",
    "/\\admin/sessions",
    "/adminx",
]


@pytest.mark.parametrize("target", NEAR_MISSES)
async def test_near_miss_admin_paths_are_404_and_never_forwarded(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, target: str
) -> None:
    """``//admin``, ``/ADMIN``, ``/admin%2f``… with the admin bearer token: a 404 in the
    provider's shape, and the provider sees nothing (today: forwarded, token and all)."""
    proxy = proxy_factory(admin_token=TOKEN)
    status, body = await raw_request(proxy.base_url, "GET", target,
                                     {"Authorization": f"Bearer {TOKEN}"})
    assert status == 404
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert upstream_server.upstream.requests == []


async def test_the_real_admin_path_and_other_paths_still_work(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """The exact ``/admin`` prefix is the admin API; ``/v1/models`` is still forwarded."""
    proxy = proxy_factory(admin_token=TOKEN)
    status, _ = await raw_request(proxy.base_url, "GET", "/admin/sessions",
                                  {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    status, _ = await raw_request(proxy.base_url, "GET", "/v1/models",
                                  {"x-api-key": TEST_API_KEY})
    assert status == 200
    assert [r.path for r in upstream_server.upstream.requests] == ["/v1/models"]


@pytest.mark.parametrize("credential", [
    {"Authorization": f"Bearer {TOKEN}"},
    {"authorization": f"bearer  {TOKEN}"},
    {"x-api-key": TOKEN},
])
async def test_the_admin_token_is_never_forwarded(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, credential: dict[str, str]
) -> None:
    """A caller sending the admin token along with its own key: the provider gets the key,
    never the token (on /v1/messages, count_tokens and a path forwarded untouched)."""
    proxy = proxy_factory(admin_token=TOKEN)
    own = ({"x-api-key": TEST_API_KEY} if "x-api-key" not in credential
           else {"Authorization": f"Bearer {TEST_API_KEY}"})
    body = {"model": MODEL, "max_tokens": 16, "messages": small_messages()}
    async with aiohttp.ClientSession() as http:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            async with http.post(f"{proxy.base_url}{path}", json=body,
                                 headers={**own, **credential}) as resp:
                assert resp.status == 200, await resp.text()
        async with http.get(f"{proxy.base_url}/v1/models", headers={**own, **credential}) as r:
            assert r.status == 200
    seen = upstream_server.upstream.requests
    assert len(seen) == 3
    for request in seen:
        assert TOKEN not in json.dumps(dict(request.headers))
        assert request.api_key == TEST_API_KEY


async def test_proxy_headers_cookies_and_forwarding_headers_stay_behind(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """The session header, the tenant header the scope read, other ``x-compact-*``,
    ``Cookie``, ``Forwarded``, ``X-Forwarded-*`` and ``X-Real-IP`` are not sent on; what
    Claude Code and the SDKs send is."""
    proxy = proxy_factory({"session": {"scope": "header:x-team"}})
    kept = {
        "x-api-key": TEST_API_KEY,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219",
        "anthropic-dangerous-direct-browser-access": "true",
        "user-agent": "claude-cli/2.0.0 (external, cli)",
        "x-stainless-lang": "js",
        "x-stainless-retry-count": "0",
        "x-app": "cli",
        "X-Claude-Code-Session-Id": "cc-hdr-1",
        "X-Custom-Thing": "mine",
    }
    dropped = {
        "x-compact-session-id": "hdr-1",
        "x-team": "team-a",
        "x-compact-role": "subagent",
        "Cookie": "compact_console_session=abc; other=1",
        "Forwarded": "for=203.0.113.7;proto=https",
        "X-Forwarded-For": "203.0.113.7",
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Host": "gw.example",
        "X-Real-IP": "203.0.113.7",
    }
    body = {"model": MODEL, "max_tokens": 16, "messages": small_messages()}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", data=json.dumps(body),
                             headers={**kept, **dropped,
                                      "content-type": "application/json"}) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["x-compact-session-id"] == "hdr-1"  # it was read
        async with http.get(f"{proxy.base_url}/v1/models",
                             headers={**kept, **dropped}) as resp:
            assert resp.status == 200
    for seen in upstream_server.upstream.requests:
        for name, value in kept.items():
            assert seen.headers[name.lower()] == value, name
        assert not {name.lower() for name in dropped} & set(seen.headers)


@pytest.mark.parametrize(("path", "admin"), [
    ("/admin", True), ("/admin/sessions?x=1", True), ("//admin", True), ("/ADMIN/x", True),
    ("/admin%2fx", True), ("/%61dmin", True), ("/a/../admin", True), ("/admin%25%32%66", True),
    ("/v1/messages", False), ("/v1/models?after=/admin", False), ("/v1/admin", False),
    ("/", False), ("/healthz", False),
])
def test_admin_like_paths(path: str, admin: bool) -> None:
    """The normalisation the gate applies."""
    assert is_admin_like(path) is admin
