"""End to end: Bedrock and Vertex paths compacted, summarised, refused and limited by the proxy."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.fake_upstream import is_summarizer_request
from proxy.fake_upstream.credentials import TEST_AWS_ACCESS_KEY, TEST_VERTEX_TOKEN
from tests.conftest import ProxyFactory, UpstreamServer
from tests.proxy.e2e.helpers import SUMMARY_POLICY, read_turns
from tests.proxy.e2e.provider_helpers import (  # noqa: F401  (the fixtures)
    L1_POLICY,
    MODEL,
    VERTEX_MODEL,
    _config,
    _credentials,
    _events,
    _post,
    provider_fixture,
    provider_upstream_server,
)

ARN = ("arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
       "us.anthropic.claude-sonnet-4-5-20250929-v1:0")


def test_a_tool_loop_is_compacted_and_every_request_verified(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """L1 on the provider's own path: the body is compacted, the request authorised by the
    proxy (the fake recomputed the signature or checked the token), the stream relayed."""
    proxy = proxy_factory(_config(provider, L1_POLICY))
    messages = read_turns(6)
    status, headers, raw = _post(provider, proxy.base_url, {"max_tokens": 100,
                                                            "messages": messages}, stream=True)
    assert status == 200, raw[:300]
    assert "L1" in headers.get("x-compact-layers", "")
    events = _events(provider, raw)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    (sent,) = upstream_server.upstream.requests
    assert "model" not in sent.body
    assert len(json.dumps(sent.body)) < len(json.dumps(messages)) / 2
    if provider == "bedrock":
        assert sent.headers["authorization"].startswith(
            f"AWS4-HMAC-SHA256 Credential={TEST_AWS_ACCESS_KEY}/")
        assert sent.headers["content-type"] == "application/json"
    else:
        assert sent.headers["authorization"] == f"Bearer {TEST_VERTEX_TOKEN}"


def test_an_arn_model_id_goes_out_as_sent(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    if provider != "bedrock":
        pytest.skip("Bedrock's model ids")
    proxy = proxy_factory(_config(provider, L1_POLICY))
    status, _, raw = _post(provider, proxy.base_url, {"max_tokens": 50, "messages": [
        {"role": "user", "content": "hi"}]}, stream=False, model=ARN)
    assert status == 200, raw
    (sent,) = upstream_server.upstream.requests
    assert sent.path == f"/model/{ARN}/invoke"  # decoded once by the fake: %2F as sent


def test_l4_summary_goes_out_in_the_provider_format_and_auth(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """The client sent no credential: the fork summary call is signed (or tokened) by the
    proxy, in the provider's path and body."""
    proxy = proxy_factory(_config(provider, SUMMARY_POLICY))
    status, headers, raw = _post(provider, proxy.base_url, {
        "max_tokens": 100, "messages": read_turns(12)}, stream=True)
    assert status == 200, raw[:300]
    assert "L4" in headers.get("x-compact-layers", ""), headers.get("x-compact-layers")
    calls = [r for r in upstream_server.upstream.requests
             if isinstance(r.body, dict) and is_summarizer_request(r.body)]
    assert calls, [r.path for r in upstream_server.upstream.requests]
    for call in calls:
        assert "model" not in call.body
        if provider == "bedrock":
            assert call.path == f"/model/{MODEL}/invoke"
            assert call.body["anthropic_version"] == "bedrock-2023-05-31"
        else:
            assert call.path.endswith(f"/models/{VERTEX_MODEL}:rawPredict")


def test_the_providers_too_long_refusal_is_recovered_by_recompaction(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """The provider's window is below the proxy's thresholds; its refusal has no numbers: the
    proxy recompacts below an estimate and the client gets an answer."""
    upstream_server.upstream.context_window = 6000
    proxy = proxy_factory(_config(provider, {**L1_POLICY, "soft_threshold_tokens": 20000,
                                             "max_tool_result_tokens": 2000}))
    status, _, raw = _post(provider, proxy.base_url, {"max_tokens": 50,
                                                      "messages": read_turns(10)}, stream=True)
    assert status == 200, raw[:300]
    first, second = upstream_server.upstream.requests
    assert len(json.dumps(second.body)) < len(json.dumps(first.body))


def test_the_proxys_own_errors_have_the_providers_shape(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    proxy = proxy_factory(_config(provider, L1_POLICY))
    status, headers, raw = _post(provider, proxy.base_url, {"max_tokens": 50, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                      "content": "orphan"}]}]}, stream=False)
    assert status == 400
    body = json.loads(raw)
    if provider == "bedrock":
        assert headers["x-amzn-ErrorType"] == "ValidationException"
        assert set(body) == {"message"} and body["message"]
    else:
        assert body["type"] == "error"
    assert upstream_server.upstream.requests == []


def test_bedrock_gets_the_binding_opt_out_beta_in_its_body(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """Compaction under thinking: on Bedrock the binding beta joins the body's
    ``anthropic_beta`` (its betas are there, not in a header); on Vertex the header."""
    from tests.proxy.e2e.test_e2e_compaction import thinking_history

    proxy = proxy_factory({**_config(provider, {**L1_POLICY, "keep_recent_messages": 6}),
                           "summary": {"enabled": False}})
    body: dict[str, Any] = {"max_tokens": 2048, "messages": thinking_history(),
                            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    if provider == "bedrock":
        body["anthropic_beta"] = ["interleaved-thinking-2025-05-14"]
    status, headers, raw = _post(provider, proxy.base_url, body, stream=False)
    assert status == 200, raw[:300]
    assert headers["x-compact-layers"]
    (sent,) = upstream_server.upstream.requests
    assert sent.body["thinking"]["block_binding"] == {"prefix_mismatch_behavior": "drop_block"}
    if provider == "bedrock":
        assert sent.body["anthropic_beta"] == ["interleaved-thinking-2025-05-14",
                                               "thinking-binding-controls-2026-08-01"]
        assert "anthropic-beta" not in sent.headers
    else:
        assert sent.headers["anthropic-beta"] == "thinking-binding-controls-2026-08-01"


def test_separate_summary_calls_use_the_configured_model_and_place(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str,
        proxy_log: Any) -> None:
    """``summary.mode: separate``: the call is the proxy's own, on ``summary.model`` in the
    provider's naming (and, on Vertex, ``vertex_project`` / ``vertex_region``)."""
    model = ("us.anthropic.claude-haiku-4-5-20251001-v1:0" if provider == "bedrock"
             else "claude-haiku-4-5@20251001")
    config = _config(provider, SUMMARY_POLICY, {"mode": "separate", "model": model})
    config["upstream"].update({"vertex_project": "summaries", "vertex_region": "europe-west1"}
                              if provider == "vertex" else {})
    proxy = proxy_factory(config)
    status, headers, raw = _post(provider, proxy.base_url, {
        "max_tokens": 100, "messages": read_turns(12)}, stream=True)
    assert status == 200, raw[:300]
    assert "L4" in headers.get("x-compact-layers", "")
    calls = [r for r in upstream_server.upstream.requests
             if isinstance(r.body, dict) and is_summarizer_request(r.body)]
    assert calls
    expected = (f"/model/{model}/invoke" if provider == "bedrock" else
                f"/projects/summaries/locations/europe-west1/publishers/anthropic/models/"
                f"{model}:rawPredict")
    assert {call.path for call in calls} == {expected}


def test_the_tenant_limit_holds_on_the_providers_own_paths(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """``limits.max_concurrent_per_tenant`` counts a request on a Bedrock or Vertex path as
    on ``/v1/messages``: with a limit of one, a request whose body is still coming holds the
    slot and the next one is answered 429 at once, before its body."""
    import asyncio

    proxy = proxy_factory({**_config(provider, L1_POLICY),
                           "limits": {"max_concurrent_per_tenant": 1}})
    path = (f"/model/{MODEL}/invoke" if provider == "bedrock" else
            f"/projects/proj/locations/us-east5/publishers/anthropic/models/{VERTEX_MODEL}"
            ":rawPredict")
    host, port = proxy.base_url.removeprefix("http://").split(":")
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            "content-length: 100000\r\n\r\n").encode()

    async def go() -> bytes:
        holder = await asyncio.open_connection(host, int(port))
        holder[1].write(head)  # its body never comes: it holds the tenant's one slot
        await holder[1].drain()
        await asyncio.sleep(0.3)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head)
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        finally:
            writer.close()
            holder[1].close()

    answer = asyncio.run(go())
    assert answer.startswith(b"HTTP/1.1 429 "), answer
    assert upstream_server.upstream.requests == []
