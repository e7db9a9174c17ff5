"""End to end: what the proxy forwards and relays, with the real SDK against the fake upstream."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.fake_upstream import Reply
from tests.conftest import TEST_API_KEY, RunningProxy, UpstreamServer, first_text, user_text

MODEL = "claude-sonnet-4-5"


def small_messages() -> list[Any]:
    """A one-turn conversation."""
    return [{"role": "user", "content": user_text("say hello")}]


def test_small_request_passes_through_with_the_sync_sdk(
    sdk: anthropic.Anthropic, upstream_server: UpstreamServer
) -> None:
    """A request under the soft threshold reaches the provider as sent and its answer comes back."""
    raw = sdk.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                messages=small_messages())
    message = raw.parse()
    assert first_text(message) == "Fake upstream reply: I saw 1 message."
    seen = upstream_server.upstream.message_requests
    assert len(seen) == 1
    assert seen[0].body["messages"] == small_messages()
    assert raw.headers["x-compact-layers"] == ""
    assert raw.headers["x-compact-tokens-before"] == raw.headers["x-compact-tokens-after"]
    assert raw.headers["request-id"] == seen[0].request_id


async def test_small_request_passes_through_with_the_async_sdk(
    async_sdk: anthropic.AsyncAnthropic, upstream_server: UpstreamServer
) -> None:
    """The async SDK gets the same pass-through as the sync one."""
    message = await async_sdk.messages.create(model=MODEL, max_tokens=64,
                                              messages=small_messages())
    assert first_text(message) == "Fake upstream reply: I saw 1 message."
    assert upstream_server.upstream.message_requests[0].body["messages"] == small_messages()


async def test_unchanged_body_is_forwarded_byte_for_byte(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """When nothing is compacted or injected, the provider gets the client's exact bytes."""
    raw = ('{ "max_tokens": 16,  "model": "' + MODEL + '", "messages": [ {"role": "user", '
           '"content": "' + user_text("spaces kept") + '"} ] }').encode()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", data=raw,
                             headers={"x-api-key": TEST_API_KEY,
                                      "content-type": "application/json"}) as resp:
            assert resp.status == 200
    seen = upstream_server.upstream.message_requests[0]
    assert seen.raw_length == len(raw)
    assert seen.body == json.loads(raw)


async def test_headers_and_query_string_arrive_upstream_exactly(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """Every end-to-end header arrives unchanged, hop-by-hop ones are dropped, none is added."""
    sent = {
        "x-api-key": TEST_API_KEY,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219, interleaved-thinking-2025-05-14",
        "content-type": "application/json",
        "x-stainless-retry-count": "0",
        "X-Custom-Thing": "Mixed Case  value",
    }
    hop_by_hop = {"Connection": "keep-alive, X-Hop-Only", "X-Hop-Only": "1", "TE": "trailers",
                  "Keep-Alive": "timeout=5", "Proxy-Authorization": "Basic abc"}
    body = {"model": MODEL, "max_tokens": 16, "messages": small_messages()}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{proxy.base_url}/v1/messages?beta=true&trace=on", data=json.dumps(body),
            headers={**sent, **hop_by_hop},
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
        ) as resp:
            assert resp.status == 200
    seen = upstream_server.upstream.message_requests[0]
    assert seen.query_string == "beta=true&trace=on"
    for name, value in sent.items():
        assert seen.headers[name.lower()] == value
    for name in ("x-hop-only", "te", "keep-alive", "proxy-authorization"):
        assert name not in seen.headers
    # Nothing the client did not send: no User-Agent, Accept or Accept-Encoding of aiohttp's.
    assert not {"user-agent", "accept", "accept-encoding"} & set(seen.headers)


@pytest.mark.parametrize(("header", "value"), [
    ("x-api-key", TEST_API_KEY),
    ("Authorization", f"Bearer {TEST_API_KEY}"),
])
async def test_both_auth_styles_reach_the_provider_unchanged(
    proxy: RunningProxy, upstream_server: UpstreamServer, header: str, value: str
) -> None:
    """``x-api-key`` (Claude Code) and ``Authorization: Bearer`` are forwarded byte for byte."""
    body = {"model": MODEL, "max_tokens": 16, "messages": small_messages()}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", json=body,
                             headers={header: value}) as resp:
            assert resp.status == 200
    headers = upstream_server.upstream.message_requests[0].headers
    assert headers[header.lower()] == value
    other = "authorization" if header == "x-api-key" else "x-api-key"
    assert other not in headers


def test_sdk_credentials_reach_the_provider_unchanged(
    sdk: anthropic.Anthropic, upstream_server: UpstreamServer
) -> None:
    """The SDK's own auth header (and ``anthropic-version``) arrive as the SDK sent them."""
    raw = sdk.messages.with_raw_response.create(model=MODEL, max_tokens=16,
                                                messages=small_messages())
    sent = raw.http_request.headers
    seen = upstream_server.upstream.message_requests[0].headers
    for name in ("authorization", "anthropic-version", "x-stainless-retry-count", "user-agent"):
        assert seen[name] == sent[name]


def test_other_paths_and_methods_are_forwarded_untouched(
    sdk: anthropic.Anthropic, upstream_server: UpstreamServer
) -> None:
    """``GET /v1/models`` (with its query string) goes through the catch-all and back."""
    page = sdk.models.list(limit=2)
    assert [model.id for model in page.data] == ["claude-opus-4-5", "claude-sonnet-4-5"]
    seen = upstream_server.upstream.requests[-1]
    assert (seen.method, seen.path, seen.query_string) == ("GET", "/v1/models", "limit=2")


async def test_unknown_paths_get_the_providers_answer_and_body(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """A POST to a path the proxy does not know is streamed upstream; the 404 comes back as is."""
    payload = b'{"requests": []}'
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages/batches", data=payload,
                             headers={"x-api-key": TEST_API_KEY}) as resp:
            status, body = resp.status, await resp.json()
            assert "x-compact-tokens-before" not in resp.headers
    assert status == 404
    assert body["error"]["type"] == "not_found_error"
    seen = upstream_server.upstream.requests[-1]
    assert (seen.path, seen.raw_length) == ("/v1/messages/batches", len(payload))
    assert body["request_id"] == seen.request_id


def test_provider_errors_come_back_with_status_headers_and_body(
    sdk: anthropic.Anthropic, upstream_server: UpstreamServer
) -> None:
    """A 429 with ``retry-after`` and rate-limit headers reaches the SDK unchanged."""
    upstream_server.upstream.push(Reply.api_error(
        429, "rate_limit_error", "Number of request tokens has exceeded your rate limit",
        headers={"retry-after": "7", "anthropic-ratelimit-tokens-remaining": "0"},
    ))
    with pytest.raises(anthropic.RateLimitError) as caught:
        sdk.messages.create(model=MODEL, max_tokens=16, messages=small_messages())
    error = caught.value
    assert error.status_code == 429
    assert error.response.headers["retry-after"] == "7"
    assert error.response.headers["anthropic-ratelimit-tokens-remaining"] == "0"
    assert error.response.headers["anthropic-ratelimit-requests-limit"] == "4000"
    seen = upstream_server.upstream.message_requests[0]
    assert error.request_id == seen.request_id
    assert error.body == {
        "type": "error", "request_id": seen.request_id,
        "error": {"type": "rate_limit_error",
                  "message": "Number of request tokens has exceeded your rate limit"},
    }


async def test_a_lone_surrogate_is_replaced_so_the_provider_accepts_the_session(
    proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Any
) -> None:
    """Half an emoji in a tool's output (``\\ud83d`` alone) makes the provider refuse the whole
    body ("no low surrogate in string"), for good: the agent resends it every turn. The proxy
    replaces it by U+FFFD, leaves signed thinking as it is, and says so in its log."""
    from tests.conftest import read_log

    messages = [
        {"role": "user", "content": user_text("list the files")},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "ls first", "signature": "sig-1"},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "caf\ud83d.txt 😀 ok"}]},
    ]
    data = json.dumps({"model": MODEL, "max_tokens": 64, "messages": messages}).encode()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", data=data, headers={
                "x-api-key": TEST_API_KEY, "content-type": "application/json"}) as response:
            assert response.status == 200, await response.text()
    forwarded = upstream_server.upstream.message_requests[-1].body
    assert forwarded["messages"][2]["content"][0]["content"] == "caf\ufffd.txt 😀 ok"
    assert forwarded["messages"][1] == messages[1]
    lines = [line for line in read_log(proxy_log)
             if line.get("event") == "lone_surrogates_replaced"]
    assert lines and lines[-1]["replaced"] == 1
