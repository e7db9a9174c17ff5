"""End to end: L4's summary call as the strict provider receives it.

``summary.mode: fork`` (the default) makes the call the client's own request — its headers,
query string, ``system``, ``tools`` and model, the conversation as the messages — so a Claude
Code subscription login (served only for Claude Code's own requests) gets its summary, and the
provider reads the session's cached prefix. ``separate`` (the proxy's own prompt) is refused for
that login: the test that proves the fork works can fail. Larger than the model's window, a
summary is made in pieces and merged; however many requests race over the threshold, the
provider gets one summary call.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.fake_upstream import (
    ProviderRuleError,
    RecordedRequest,
    Reply,
    cache_control_count,
    default_script,
    is_summarizer_request,
)
from proxy.fake_upstream.replies import without_cache_markers
from proxy.fake_upstream.rules import check_claude_code_identity, check_oauth_beta
from proxy.summary.calls import SUMMARIZER_MARKER
from tests.conftest import (
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    log_lines_for,
)
from tests.proxy.e2e.helpers import SUMMARY_POLICY, read_turns, summary_calls

MODEL = "claude-sonnet-4-5"
OAUTH_TOKEN = "sk-ant-oat01-e2e-subscription-login-0123456789"
OAUTH_BETAS = "claude-code-20250219,oauth-2025-04-20"
CLAUDE_CODE = "You are Claude Code, Anthropic's official CLI for Claude."
CACHED = {"type": "ephemeral"}
SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cc_entrypoint=cli;"},
    {"type": "text", "text": CLAUDE_CODE, "cache_control": CACHED},
]
TOOLS = [{"name": "Read", "description": "Read a file", "cache_control": CACHED,
          "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}]
CLIENT_HEADERS = {"x-app": "cli", "User-Agent": "claude-cli/2.1.0 (external, cli)",
                  "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
                  "x-compact-session-id": "fork-session-1"}
# Added by the HTTP client itself on any request.
TRANSPORT_HEADERS = {"host", "connection", "content-length", "accept-encoding"}



def client_requests(upstream_server: UpstreamServer) -> list[RecordedRequest]:
    """The recorded /v1/messages requests that were the clients' own (not summary calls)."""
    return [r for r in upstream_server.upstream.message_requests
            if not is_summarizer_request(r.body)]


def summary_lines(proxy_log: Any, raw: Any, event: str) -> list[dict[str, Any]]:
    """The ``event`` lines the request answered by ``raw`` logged."""
    return [line for line in log_lines_for(proxy_log, raw.headers["x-compact-request-id"])
            if line.get("event") == event]


async def metrics_text(proxy: RunningProxy) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base_url}/metrics") as resp:
            return await resp.text()


def test_the_summary_call_is_the_clients_own_request_and_reads_its_cached_prefix(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any
) -> None:
    """Fork mode: the summary call has the forwarded request's headers, query string, system,
    tools, tool_choice, metadata and model, no thinking, the conversation as its message prefix
    and the marker in its last user turn, at most 4 breakpoints; its prompt shares the session's
    previous request's prefix, which the provider reports as cache reads."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY})
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    common: dict[str, Any] = {
        "model": MODEL, "max_tokens": 2048, "system": SYSTEM, "tools": TOOLS,
        "tool_choice": {"type": "auto"}, "metadata": {"user_id": "user-fork-1"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "extra_headers": CLIENT_HEADERS, "extra_query": {"beta": "true"}}
    history = read_turns(12)
    with client:
        small = client.messages.with_raw_response.create(messages=read_turns(2), **common)
        raw = client.messages.with_raw_response.create(messages=history, **common)
    assert "L4" not in small.headers["x-compact-layers"].split(",")
    assert "L4" in raw.headers["x-compact-layers"].split(",")

    (call,) = summary_calls(upstream_server)
    forwarded = client_requests(upstream_server)[-1]
    assert call.api_key == forwarded.api_key == TEST_API_KEY
    for name in ("anthropic-beta", "anthropic-version", "user-agent", "x-app"):
        assert call.headers[name] == forwarded.headers[name], name
    # The proxy's own session header stays with the proxy (issue #31).
    assert "x-compact-session-id" not in call.headers
    assert "x-compact-session-id" not in forwarded.headers
    # Nothing of the summariser's own SDK: the client's headers, no more and no fewer.
    assert set(call.headers) - set(forwarded.headers) <= TRANSPORT_HEADERS
    assert set(forwarded.headers) - set(call.headers) <= {"x-stainless-raw-response"}
    assert call.query_string == forwarded.query_string == "beta=true"
    for field in ("system", "tools", "tool_choice", "metadata", "model"):
        assert call.body[field] == forwarded.body[field], field
    assert "thinking" not in call.body and not call.body.get("stream")
    assert call.body["max_tokens"] == 2048
    *conversation, ask = call.body["messages"]
    assert len(conversation) > 2
    assert without_cache_markers(conversation) == without_cache_markers(history[:len(conversation)])
    assert conversation[-1]["content"][-1]["cache_control"] == CACHED
    assert ask["role"] == "user" and f"[{SUMMARIZER_MARKER}]" in ask["content"][0]["text"]
    assert cache_control_count(call.body) <= 4

    (ready,) = summary_lines(proxy_log, raw, "summary_ready")
    assert ready["mode"] == "fork" and ready["pieces"] == 0 and ready["summary_model"] == MODEL
    assert ready["usage_cache_read"] > 0
    text = asyncio.run(metrics_text(proxy))
    assert 'compact_proxy_summary_calls_total{outcome="ok"} 1.0' in text
    assert 'compact_proxy_summary_tokens_total{kind="cache_read"}' in text


def oauth_client(proxy: RunningProxy) -> anthropic.Anthropic:
    """A client logged in the way Claude Code is with a Pro/Max subscription."""
    return anthropic.Anthropic(base_url=proxy.base_url, api_key=None, auth_token=OAUTH_TOKEN,
                               max_retries=0, default_headers={"anthropic-beta": OAUTH_BETAS})


@pytest.mark.parametrize("mode", ["fork", "separate"])
def test_a_subscription_login_gets_its_summary_only_from_a_forked_call(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any,
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """``Bearer sk-ant-oat…`` with the OAuth beta and Claude Code's system: the forked summary
    call passes the provider's OAuth rules and L4 runs; the proxy's own call is refused (no
    OAuth beta) and the history is kept."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    proxy = proxy_factory({"compaction": SUMMARY_POLICY, "summary": {"mode": mode}})
    history = read_turns(12)
    with oauth_client(proxy) as client:
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, system=[{"type": "text", "text": CLAUDE_CODE}],
            messages=history)
    assert raw.http_response.status_code == 200
    (call,) = summary_calls(upstream_server)
    authorization = call.headers["authorization"]
    assert authorization == f"Bearer {OAUTH_TOKEN}"
    beta = call.headers.get("anthropic-beta", "")
    if mode == "fork":
        check_oauth_beta(authorization, beta)
        check_claude_code_identity(authorization, call.body)
        assert "L4" in raw.headers["x-compact-layers"].split(",")
        assert [line["mode"] for line in summary_lines(proxy_log, raw, "summary_ready")] == ["fork"]
    else:
        with pytest.raises(ProviderRuleError) as refused:
            check_oauth_beta(authorization, beta)
        assert refused.value.status == 401
        assert "L4" not in raw.headers["x-compact-layers"].split(",")
        (failed,) = summary_lines(proxy_log, raw, "summary_failed")
        assert failed["error_class"] == "AuthenticationError"
        assert client_requests(upstream_server)[-1].body["messages"] == history


@pytest.mark.parametrize("mode", ["fork", "separate"])
def test_a_span_larger_than_the_window_is_summarised_in_pieces_then_merged(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any, mode: str
) -> None:
    """With a 4,000-token summary window (the provider's too), the span goes out as N JSON
    transcripts that each fit, then one call merges their summaries; L4 applies."""
    upstream_server.upstream.context_window = 4000
    proxy = proxy_factory({"compaction": SUMMARY_POLICY, "summary": {
        "mode": mode, "max_tokens": 256, "context_window_tokens": 4000}})
    with anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY,
                             max_retries=0) as client:
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, system=[{"type": "text", "text": CLAUDE_CODE}],
            messages=read_turns(12))
    assert "L4" in raw.headers["x-compact-layers"].split(",")
    *pieces, merge = summary_calls(upstream_server)
    assert len(pieces) >= 2
    texts = [json.dumps(call.body["messages"]) for call in pieces]
    assert all("toolu_" in text for text in texts)  # each one a part of the transcript
    assert "Part 1 of" in json.dumps(merge.body["messages"])
    assert f"Part {len(pieces)} of {len(pieces)}" in json.dumps(merge.body["messages"])
    if mode == "fork":
        assert all(c.body["system"][0]["text"] == CLAUDE_CODE for c in [*pieces, merge])
    (ready,) = summary_lines(proxy_log, raw, "summary_ready")
    assert (ready["mode"], ready["pieces"]) == (mode, len(pieces))


def slow_summaries(seconds: float) -> Any:
    """A script whose summary calls take ``seconds`` to answer."""

    async def script(body: dict[str, Any], meta: RecordedRequest) -> Reply:
        if is_summarizer_request(body):
            await asyncio.sleep(seconds)
        return default_script(body, meta)

    return script


async def test_ten_concurrent_requests_over_the_threshold_make_one_summary_call(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Ten identical requests race while the one summary call takes a second: one call at the
    provider, nine requests join it, all ten get L4."""
    upstream_server.upstream.script = slow_summaries(1.0)
    proxy = proxy_factory({"compaction": SUMMARY_POLICY})
    history = read_turns(12)
    client = anthropic.AsyncAnthropic(base_url=proxy.base_url, api_key=TEST_API_KEY,
                                      max_retries=0)
    async with client:
        raws = await asyncio.gather(*(
            client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                     messages=history)
            for _ in range(10)))
    assert all("L4" in raw.headers["x-compact-layers"].split(",") for raw in raws)
    assert len(summary_calls(upstream_server)) == 1
    text = await metrics_text(proxy)
    assert 'compact_proxy_summary_calls_total{outcome="ok"} 1.0' in text
    assert 'compact_proxy_summary_calls_total{outcome="joined"} 9.0' in text


async def test_a_client_that_goes_away_does_not_cancel_the_summary_others_wait_for(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """The first request gives up while its summary call runs; the call goes on, a second
    request joins it and gets L4, and the provider saw one summary call."""
    upstream_server.upstream.script = slow_summaries(1.0)
    proxy = proxy_factory({"compaction": SUMMARY_POLICY})
    history = read_turns(12)
    impatient = anthropic.AsyncAnthropic(base_url=proxy.base_url, api_key=TEST_API_KEY,
                                         max_retries=0, timeout=0.3)
    client = anthropic.AsyncAnthropic(base_url=proxy.base_url, api_key=TEST_API_KEY,
                                      max_retries=0)
    async with impatient, client:
        with pytest.raises(anthropic.APITimeoutError):
            await impatient.messages.create(model=MODEL, max_tokens=64, messages=history)
        raw = await client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                             messages=history)
    assert "L4" in raw.headers["x-compact-layers"].split(",")
    assert len(summary_calls(upstream_server)) == 1
    text = await metrics_text(proxy)
    assert 'compact_proxy_summary_calls_total{outcome="joined"} 1.0' in text
