"""End to end: L4 summaries from the provider, cached, failed, and seen by count_tokens."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream import Reply
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, error_of, log_lines_for
from tests.proxy.e2e.helpers import MODEL, SUMMARY_POLICY, forwarded, read_turns, summary_calls


def test_l4_summary_comes_from_the_provider_once_then_from_the_cache(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """``summary.mode: separate``: L4 calls the provider (marker in system, transcript as the
    user message, Haiku, the caller's key) once; the same history again is summarised from
    the cache."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY, "summary": {"mode": "separate"}})
    messages = read_turns(12)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        first = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                         messages=messages)
        second = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                          messages=messages)
    assert "L4" in first.headers["x-compact-layers"].split(",")
    assert first.headers["x-compact-layers"] == second.headers["x-compact-layers"]
    calls = summary_calls(upstream_server)
    assert len(calls) == 1
    call = calls[0]
    assert call.body["model"] == "claude-haiku-4-5"
    assert call.headers["authorization"] == f"Bearer {TEST_API_KEY}"
    assert json.loads(call.body["messages"][0]["content"])  # a JSON transcript
    system = call.body["system"]
    for heading in ("Goal", "Decisions", "Failed approaches", "State of the work", "Next step"):
        assert heading in system
    sent_first, sent_second = forwarded(upstream_server)
    assert sent_first["messages"] == sent_second["messages"]
    assert sent_first["messages"][0] == messages[0]
    assert len(sent_first["messages"]) < len(messages)


def test_failed_summary_keeps_the_history_and_the_request_still_succeeds(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any
) -> None:
    """A 500 on the summary call: no L4, the history is kept, the answer still comes back and
    ``summary_failed`` names only the error class."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY})
    upstream_server.upstream.push(Reply.api_error(500, "api_error", "Internal server error"))
    messages = read_turns(12)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                       messages=messages)
    assert raw.http_response.status_code == 200
    assert "L4" not in raw.headers["x-compact-layers"].split(",")
    assert len(summary_calls(upstream_server)) == 1
    sent = forwarded(upstream_server)[0]
    assert sent["messages"][0] == messages[0]
    assert sent["messages"][-1] == messages[-1]
    lines = log_lines_for(proxy_log, raw.headers["x-compact-request-id"])
    failed = [line for line in lines if line["event"] == "summary_failed"]
    assert len(failed) == 1
    assert failed[0]["error_class"] == "InternalServerError"
    assert failed[0]["mode"] == "fork"
    assert set(failed[0]) <= {"timestamp", "level", "event", "request_id", "session_id", "tenant",
                              "error_class", "mode", "summary_model", "pieces", "usage_input",
                              "usage_cache_read", "usage_cache_write", "usage_output"}


def test_failed_summary_over_the_hard_limit_is_blocked(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """When only L4 could have brought the view under the hard limit and it failed: 400."""
    proxy = proxy_factory({"compaction": {**SUMMARY_POLICY, "hard_limit_tokens": 6000}})
    upstream_server.upstream.push(Reply.api_error(500, "api_error", "Internal server error"))
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client, pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=64,
                               messages=read_turns(12))
    compaction = error_of(caught.value)["compaction"]
    assert compaction["error"] == "MessageViewLimitExceeded"
    # L4 ran and changed nothing: among what ran (saved 0), not among the view's layers.
    assert compaction["saved"][-1] == {"layer": "L4", "saved": 0}
    assert "L4" not in compaction["layers"]
    assert forwarded(upstream_server) == []


def test_count_tokens_counts_the_view_the_next_message_sends_without_calling_a_model(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """``count_tokens`` never triggers a summary; once one is cached it forwards exactly the
    messages ``/v1/messages`` forwards."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY})
    messages = read_turns(12)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        uncached = client.messages.count_tokens(model=MODEL,
                                                messages=messages)
        assert summary_calls(upstream_server) == []
        client.messages.create(model=MODEL, max_tokens=64,
                               messages=messages)
        cached = client.messages.with_raw_response.count_tokens(
            model=MODEL, messages=messages)
    assert len(summary_calls(upstream_server)) == 1
    assert "L4" in cached.headers["x-compact-layers"].split(",")
    counted = [r.body for r in upstream_server.upstream.requests
               if r.path == "/v1/messages/count_tokens"]
    assert len(counted) == 2
    assert counted[1]["messages"] == forwarded(upstream_server)[0]["messages"]
    assert cached.parse().input_tokens < uncached.input_tokens
