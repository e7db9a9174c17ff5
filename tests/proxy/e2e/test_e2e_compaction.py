"""End to end: compacted requests as the provider receives them: shape, markers, sticky prefix."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream import cache_control_count
from tests.conftest import (
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    first_text,
    load_corpus_body,
    user_text,
)
from tests.proxy.e2e.helpers import LOW_THRESHOLDS, MODEL, forwarded, read_turns

CCTRACE = "cctrace__phase0-investigation__132b2f66-ee5f-46f6-8904-32d9dc4d36c3.json"


def test_corpus_conversation_is_compacted_and_accepted_by_the_provider(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """The cctrace session with a low soft threshold is compacted, headers say how, upstream
    accepts it, and the first user message is kept verbatim."""
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 20000,
                                          "hard_limit_tokens": 60000}})
    body = load_corpus_body(CCTRACE)
    body["model"] = MODEL  # the recorded model id is deprecated in this SDK
    body["messages"][-1]["content"].append({"type": "text", "text": user_text("continue")})
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        raw = client.messages.with_raw_response.create(**body)
        message = raw.parse()
    assert first_text(message)
    before = int(raw.headers["x-compact-tokens-before"])
    after = int(raw.headers["x-compact-tokens-after"])
    assert after < 20000 < before
    layers = raw.headers["x-compact-layers"].split(",")
    assert layers and set(layers) <= {"L1", "L2", "L3", "L4"}
    sent = forwarded(upstream_server)
    assert len(sent) == 1
    assert len(sent[0]["messages"]) < len(body["messages"])
    assert sent[0]["messages"][0] == body["messages"][0]
    assert sent[0]["tools"] == body["tools"]
    assert raw.headers["x-compact-session-id"].startswith("conv-")


def claude_code_body() -> dict[str, Any]:
    """What Claude Code sends: billing block first in system, cached tools and system, a
    mid-conversation ``system`` message, ``context_management``, JSON ``metadata.user_id``."""
    messages = read_turns(10)
    messages.insert(5, {"role": "system", "content": user_text("The user prefers tabs.")})
    messages[-1] = {"role": "user", "content": [
        {"type": "text", "text": user_text("now what?"), "cache_control": {"type": "ephemeral"}},
    ]}
    return {
        "model": MODEL,
        "max_tokens": 256,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0.76.abc; "
                                     "cc_entrypoint=cli; cch=00aa;"},
            {"type": "text", "text": "You are Claude Code.",
             "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [{"name": "Read", "description": "Read a file",
                   "input_schema": {"type": "object",
                                    "properties": {"file_path": {"type": "string"}}},
                   "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": json.dumps({"device_id": "d1", "account_uuid": "",
                                            "session_id": "meta-session"})},
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "messages": messages,
    }


def test_claude_code_shaped_request_is_compacted_and_accepted(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """``?beta=true``, the session header, a system-role message, context_management and three
    cache markers: compacted, every non-message part intact, and the strict provider accepts it."""
    proxy = proxy_factory({"compaction": {**LOW_THRESHOLDS, "soft_threshold_tokens": 800,
                                          "max_tool_result_tokens": 100},
                           "summary": {"enabled": False}})
    body = claude_code_body()
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        raw = client.beta.messages.with_raw_response.create(
            **body, betas=["context-management-2025-06-27"],
            extra_headers={"X-Claude-Code-Session-Id": "cc-session-1"},
            extra_query={"beta": "true"},  # what Claude Code sends
        )
    assert raw.http_response.status_code == 200
    assert raw.headers["x-compact-session-id"] == "cc-session-1"
    assert raw.headers["x-compact-layers"] == "L1,L3"
    recorded = upstream_server.upstream.message_requests[-1]
    assert recorded.query_string == "beta=true"
    assert recorded.headers["anthropic-beta"] == "context-management-2025-06-27"
    assert recorded.headers["x-claude-code-session-id"] == "cc-session-1"
    sent = recorded.body
    assert sent["system"] == body["system"]
    assert sent["tools"] == body["tools"]
    assert sent["context_management"] == body["context_management"]
    assert sent["metadata"] == body["metadata"]
    assert sent["messages"][0] == body["messages"][0]
    assert sent["messages"][-1] == body["messages"][-1]
    assert len(sent["messages"]) < len(body["messages"])
    assert [m for m in sent["messages"] if m["role"] == "system"] == [body["messages"][5]]
    assert cache_control_count(sent) == 3


def thinking_history() -> list[Any]:
    """A long tool loop whose assistant turns start with signed thinking blocks."""
    messages = read_turns(8)
    for message in messages:
        if message["role"] == "assistant" and isinstance(message["content"], list):
            message["content"].insert(0, {"type": "thinking", "thinking": "Let me look.",
                                          "signature": "EqQBCkYIBxgC"})
    return messages


@pytest.mark.parametrize("client_binding", [None, {"prefix_mismatch_behavior": "error"}])
def test_thinking_binding_opt_out_is_added_only_when_the_proxy_changed_the_prefix(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
    client_binding: dict[str, str] | None,
) -> None:
    """Compaction under thinking adds ``drop_block`` and the beta value (existing ones kept),
    unless the client chose a binding behaviour itself."""
    proxy = proxy_factory({"compaction": {**LOW_THRESHOLDS, "keep_recent_messages": 6},
                           "summary": {"enabled": False}})
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    if client_binding is not None:
        thinking["block_binding"] = client_binding
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=2048, thinking=thinking,
            messages=thinking_history(),
            extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
        )
    assert raw.headers["x-compact-layers"] != ""
    recorded = upstream_server.upstream.message_requests[-1]
    if client_binding is None:
        assert recorded.body["thinking"] == {
            "type": "enabled", "budget_tokens": 1024,
            "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
        assert recorded.headers["anthropic-beta"] == (
            "interleaved-thinking-2025-05-14,thinking-binding-controls-2026-08-01")
    else:
        assert recorded.body["thinking"] == thinking
        assert recorded.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


def test_no_binding_opt_out_when_nothing_was_rewritten(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """Under the threshold and without durable state, a thinking request is sent as is."""
    messages = thinking_history()[:3]  # user, assistant (thinking + tool_use), tool_result
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        client.messages.create(model=MODEL, max_tokens=2048,
                               thinking={"type": "enabled", "budget_tokens": 1024},
                               messages=messages)
    recorded = upstream_server.upstream.message_requests[-1]
    assert recorded.body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert "anthropic-beta" not in recorded.headers


def test_sticky_compaction_reuses_the_compacted_prefix_across_requests_and_restarts(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """A history that only grows gets the byte-identical compacted prefix plus its new turns,
    also from a new proxy process on the same store."""
    proxy = proxy_factory({"compaction": LOW_THRESHOLDS, "summary": {"enabled": False}})
    history = read_turns(10)
    grown = [*history, {"role": "assistant", "content": "Done reading."},
             {"role": "user", "content": user_text("and then?")}]
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        client.messages.create(model=MODEL, max_tokens=16, messages=history,
                               extra_headers={"x-compact-session-id": "sticky-1"})
        client.messages.create(model=MODEL, max_tokens=16, messages=grown,
                               extra_headers={"x-compact-session-id": "sticky-1"})
    restarted = proxy_factory({"compaction": LOW_THRESHOLDS, "summary": {"enabled": False},
                               "store": {"path": proxy.config.store.path}})
    client = anthropic.Anthropic(base_url=restarted.base_url, api_key=TEST_API_KEY,
                                 max_retries=0)
    with client:
        client.messages.create(model=MODEL, max_tokens=16, messages=grown,
                               extra_headers={"x-compact-session-id": "sticky-1"})
    first, second, third = (body["messages"] for body in forwarded(upstream_server))
    assert len(first) < len(history)
    assert second[: len(first)] == first
    assert second[len(first):] == grown[len(history):]
    assert third == second


def test_parallel_conversations_in_one_session_keep_their_own_sticky_prefix(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Two subagents sharing their parent's session id, interleaved, each get their own
    compacted prefix reused (neither evicts the other's checkpoint)."""
    proxy = proxy_factory({"compaction": LOW_THRESHOLDS, "summary": {"enabled": False}})

    def conversation(task: str) -> tuple[list[Any], list[Any]]:
        history = read_turns(10)
        history[0] = {"role": "user", "content": user_text(task)}
        grown = [*history, {"role": "assistant", "content": "Done reading."},
                 {"role": "user", "content": user_text("and then?")}]
        return history, grown

    first_a, grown_a = conversation("subagent A: map the parser")
    first_b, grown_b = conversation("subagent B: map the lexer")
    headers = {"x-compact-session-id": "parent-1", "x-claude-code-agent-id": "agent"}
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        for messages in (first_a, first_b, grown_a, grown_b):
            client.messages.create(model=MODEL, max_tokens=16, messages=messages,
                                   extra_headers=headers)
    sent_a1, sent_b1, sent_a2, sent_b2 = (body["messages"] for body in forwarded(upstream_server))
    assert len(sent_a1) < len(first_a) and len(sent_b1) < len(first_b)
    assert sent_a2[: len(sent_a1)] == sent_a1 and sent_a2[len(sent_a1):] == grown_a[len(first_a):]
    assert sent_b2[: len(sent_b1)] == sent_b1 and sent_b2[len(sent_b1):] == grown_b[len(first_b):]


def test_a_retried_request_is_forwarded_byte_identical_with_every_cache_marker(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """The SDKs retry on 429, 529 and timeouts: the retry repeats a request the session
    already compacted. It goes out exactly as the first attempt did, its three markers (first
    message, last tool_result, last message) where the client put them."""
    proxy = proxy_factory({"compaction": LOW_THRESHOLDS})
    messages = read_turns(12)
    messages[0] = {"role": "user", "content": [
        {"type": "text", "text": user_text("fix the parser"),
         "cache_control": {"type": "ephemeral"}}]}
    messages[-2:] = [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_last", "name": "Read", "input": {"file_path": "/x.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_last", "content": "x = 1\n" * 900,
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": user_text("go on"), "cache_control": {"type": "ephemeral"}}]}]
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0,
                                 default_headers={"x-compact-session-id": "retry-session"})
    with client:
        first = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                         messages=messages)
        retry = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                         messages=messages)
    assert first.headers["x-compact-layers"] and retry.headers["x-compact-layers"]
    sent = upstream_server.upstream.message_requests[-2:]
    assert json.dumps(sent[0].body) == json.dumps(sent[1].body)
    assert sent[0].raw_length == sent[1].raw_length
    assert cache_control_count(sent[1].body) == 3


def test_a_marker_moved_every_turn_is_forwarded_where_the_client_put_it(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Claude Code's loop: each turn adds a call with a large result and moves its
    ``cache_control`` marker to the newest user message. Across a crossing and many reuses of
    the compacted prefix (whose new results L1 cuts), every forwarded body carries the
    client's markers only — the provider refuses a fifth — and is accepted."""
    proxy = proxy_factory({"compaction": LOW_THRESHOLDS, "summary": {"enabled": False}})
    history = read_turns(6)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        for turn in range(10):
            tool_id = f"toolu_next_{turn:02d}"
            history = [*history,
                       {"role": "assistant", "content": [
                           {"type": "tool_use", "id": tool_id, "name": "Read",
                            "input": {"file_path": f"/src/next{turn}.py"}}]},
                       {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": tool_id,
                            "content": "line of code\n" * 300}]}]
            sent = json.loads(json.dumps(history))
            sent[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
            answer = client.messages.create(
                model=MODEL, max_tokens=16, messages=sent,
                system=[{"type": "text", "text": "You are a coding agent.",
                         "cache_control": {"type": "ephemeral"}}],
                extra_headers={"x-compact-session-id": "moving-marker"})
            assert answer.content
    bodies = forwarded(upstream_server)
    assert len(bodies) == 10
    assert all(cache_control_count(body) == 2 for body in bodies)
    assert all("cache_control" in json.dumps(body["messages"][-1]) for body in bodies)
    assert len(bodies[-1]["messages"]) < len(history)  # compacted, the prefix reused
