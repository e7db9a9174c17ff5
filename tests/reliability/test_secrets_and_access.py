"""Secrets and access: the admin API refuses every wrong credential the same way, compares in
constant time, and does not exist without a token; the session's log tap is live."""

from __future__ import annotations

import hmac
import json
from typing import Any

import aiohttp
import pytest
import structlog

from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, user_text
from tests.reliability.conftest import LOG_TAP, RELIABILITY_ADMIN_TOKEN, SECRETS

TOKEN = RELIABILITY_ADMIN_TOKEN
STATE = "/admin/sessions/acl/state"
WRONG_AUTH: list[dict[str, str]] = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer "},
    {"Authorization": "Bearer x"},
    {"Authorization": f"Bearer {TOKEN[:-1]}"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Bearer {TOKEN.upper()}"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": TOKEN},
    {"Authorization": f"Token {TOKEN}"},
    {"x-api-key": TOKEN},
]


async def call(base_url: str, method: str, headers: dict[str, str],
               body: Any = None) -> tuple[int, dict[str, Any]]:
    """One admin call; the status and the JSON body."""
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"{base_url}{STATE}", headers=headers,
                                json=body) as resp:
            return resp.status, await resp.json()


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_admin_refuses_missing_wrong_and_empty_tokens_with_one_answer(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, method: str
) -> None:
    """Every wrong credential: the same 401 body; the right one gets through (the lockout
    raised above the count of wrong ones here: see test_admin_guessing_is_locked_out)."""
    proxy = proxy_factory({"admin": {"failed_auth_limit": 100}}, admin_token=TOKEN)
    answers = [await call(proxy.base_url, method, headers, {"facts": []})
               for headers in WRONG_AUTH]
    assert {status for status, _ in answers} == {401}
    assert len({json.dumps(body, sort_keys=True) for _, body in answers}) == 1
    assert answers[0][1]["error"]["type"] == "authentication_error"
    status, _ = await call(proxy.base_url, method, {"Authorization": f"Bearer {TOKEN}"},
                           {"facts": [], "pending_items": [], "retrieval_evidence": []})
    assert status in (200, 201, 404)
    assert upstream_server.upstream.requests == []


async def test_admin_token_is_compared_in_constant_time(
    proxy_factory: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every presented token, of any length, goes through ``hmac.compare_digest`` (no early
    ``==`` that would leak the length or a prefix through timing)."""
    proxy = proxy_factory(admin_token=TOKEN)
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        seen.append((bytes(a), bytes(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    presented = ["x", TOKEN[:-1], TOKEN + "x", "y" * 500, TOKEN]
    for token in presented:
        await call(proxy.base_url, "GET", {"Authorization": f"Bearer {token}"})
    assert [given for given, _ in seen] == [t.encode() for t in presented]
    assert {expected for _, expected in seen} == {TOKEN.encode()}


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "POST", "PATCH"])
async def test_admin_api_is_absent_without_a_token_and_never_forwarded(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, method: str
) -> None:
    """Admin token unset: 404 for every admin call, even one carrying a bearer token, and
    nothing under /admin reaches the provider."""
    proxy = proxy_factory()
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
        status, body = await call(proxy.base_url, method, headers, {"facts": []})
        assert status == 404 and body["error"]["type"] == "not_found_error"
    assert upstream_server.upstream.requests == []


def test_empty_admin_token_variable_means_no_admin_api(proxy_factory: ProxyFactory) -> None:
    """``COMPACT_PROXY_..._TOKEN=""`` is the same as unset: 404, even for ``Bearer ``."""
    import asyncio

    proxy = proxy_factory(admin_token="")
    status, _ = asyncio.run(call(proxy.base_url, "GET", {"Authorization": "Bearer "}))
    assert status == 404


async def test_log_tap_is_live_and_holds_no_secret_so_far(
    proxy_factory: ProxyFactory
) -> None:
    """A request with the API key, the admin bearer token and the prompt marker adds lines to
    the session's tap, and no line of the session so far holds any of them."""
    proxy = proxy_factory(admin_token=TOKEN)
    before = len(LOG_TAP)
    async with aiohttp.ClientSession() as http:
        body = {"model": "claude-sonnet-4-5", "max_tokens": 8,
                "messages": [{"role": "user", "content": user_text("secret prompt")}]}
        async with http.post(f"{proxy.base_url}/v1/messages", json=body,
                             headers={"x-api-key": TEST_API_KEY,
                                      "Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200
        await call(proxy.base_url, "PUT", {"Authorization": f"Bearer {TOKEN}"},
                   {"facts": [{"fact_id": "f", "content": user_text("fact"),
                               "source_pointer": "transcript:acl:1",
                               "last_confirmed_at": "2025-03-01T12:00:00Z"}]})
    import asyncio

    await asyncio.sleep(0.1)
    assert len(LOG_TAP) >= before + 2
    assert LOG_TAP.hits() == []
    assert len(LOG_TAP) >= 3


def test_log_tap_would_catch_a_leak() -> None:
    """The tap sees what the renderer writes, so a secret that slipped through is found."""
    renderer = structlog.processors.JSONRenderer()
    before = len(LOG_TAP)
    renderer(None, "info", {"event": "canary", "detail": "tap-canary-31337"})
    assert len(LOG_TAP) == before + 1
    assert any("tap-canary-31337" in line for line in LOG_TAP.lines[before:])
    assert all(secret not in "tap-canary-31337" for secret in SECRETS)
