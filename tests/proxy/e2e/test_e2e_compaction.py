"""End to end: compaction, durable context and L4 summaries as the provider receives them."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.fake_upstream import Reply, cache_control_count, is_summarizer_request
from tests.conftest import (
    PROMPT_MARKER,
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    error_of,
    first_text,
    load_corpus_body,
    log_lines_for,
    user_text,
)

MODEL = "claude-sonnet-4-5"
CCTRACE = "cctrace__phase0-investigation__132b2f66-ee5f-46f6-8904-32d9dc4d36c3.json"
LOW_THRESHOLDS = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
                  "max_tool_result_tokens": 200, "keep_recent_messages": 4,
                  "summary_keep_recent": 4}


def read_turns(count: int, result_chars: int = 3000, tag: str = "") -> list[Any]:
    """A first user message, then ``count`` Read calls with large results, then a question;
    with ``tag``, every text is the tag's own (no summary of another conversation fits)."""
    task = f"fix the parser {tag}" if tag else "fix the parser"
    folder, module = (f"/src/{tag}", f"{tag} module") if tag else ("/src", "module")
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_text(task)}]
    for index in range(count):
        tool_id = f"toolu_{index:04d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading file {index}."},
            {"type": "tool_use", "id": tool_id, "name": "Read",
             "input": {"file_path": f"{folder}/mod{index}.py"}},
        ]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id,
             "content": f"# {module} {index}\n" + "line of code\n" * (result_chars // 13)},
        ]})
    messages.append({"role": "assistant", "content": "I have read everything."})
    messages.append({"role": "user", "content": user_text("now what?")})
    return messages


def forwarded(upstream_server: UpstreamServer) -> list[dict[str, Any]]:
    """The bodies of the /v1/messages calls the provider got that were not summary calls."""
    return [r.body for r in upstream_server.upstream.message_requests
            if not is_summarizer_request(r.body)]


def summary_calls(upstream_server: UpstreamServer) -> list[Any]:
    """The recorded summary calls (the summarizer marker in ``system`` or the last user turn)."""
    return [r for r in upstream_server.upstream.message_requests
            if is_summarizer_request(r.body)]


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


def admin_put(proxy: RunningProxy, session_id: str, state: dict[str, Any]) -> Any:
    """PUT a durable state through the admin API over HTTP (a fresh state: no If-Match)."""

    async def put() -> Any:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"{proxy.base_url}/admin/sessions/{session_id}/state",
                                json=state,
                                headers={"Authorization": f"Bearer {proxy.admin_token}"}) as resp:
                assert resp.status in (200, 201), await resp.text()
                return await resp.json()

    return asyncio.run(put())


def durable_setup(proxy: RunningProxy, session_id: str) -> dict[str, str]:
    """A transcript and an artifact for ``session_id``; returns their sha256 digests."""
    line = json.dumps({"sequence": 1, "session_id": session_id, "event_id": "ev-1",
                       "type": "user", "text": "deploy on fridays"})
    (proxy.transcript_root / f"{session_id}.jsonl").write_text(line + "\n", encoding="utf-8")
    artifact_dir = proxy.artifact_root / session_id
    artifact_dir.mkdir()
    report = b"all tests passed\n"
    (artifact_dir / "report.txt").write_bytes(report)
    return {"transcript": hashlib.sha256(line.encode()).hexdigest(),
            "artifact": hashlib.sha256(report).hexdigest()}


def test_durable_block_is_appended_last_to_system_with_verified_statuses(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """After an admin PUT the state is the last system block; each item shows its verified
    status; the block is byte-identical on the next request (prompt cache)."""
    proxy = proxy_factory(admin_token="admin-e2e-token-5b2d4e6f8a0c1e3b5d7f")
    digests = durable_setup(proxy, "sess-d")
    admin_put(proxy, "sess-d", {
        "facts": [{"fact_id": "f1", "content": f"{PROMPT_MARKER} deploys happen on fridays",
                   "source_pointer": "transcript:sess-d:1",
                   "last_confirmed_at": "2025-03-01T12:30:00Z"}],
        "pending_items": [{"item_id": "p1", "description": "publish the report",
                           "source_pointer": f"artifact:sess-d:report.txt:{digests['artifact']}",
                           "last_confirmed_at": "2025-03-01T12:31:00Z"}],
        "retrieval_evidence": [{"memory_id": "m1", "source_id": "transcript:sess-other:1",
                                "source_type": "transcript", "source_title": "elsewhere",
                                "captured_at": "2025-03-01T12:32:00Z", "score": 0.75,
                                "source_rank": 1, "conflict_key": None}],
    })
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    request: dict[str, Any] = {"model": MODEL, "max_tokens": 32, "system": "You are helpful.",
               "messages": [{"role": "user", "content": user_text("when do we deploy?")}],
               "extra_headers": {"x-compact-session-id": "sess-d"}}
    with client:
        client.messages.create(**request)
        client.messages.create(**request)
    first, second = forwarded(upstream_server)
    assert first["system"][0] == {"type": "text", "text": "You are helpful."}
    block = first["system"][-1]
    assert len(first["system"]) == 2 and block["type"] == "text"
    text = block["text"]
    fact_line = next(line for line in text.splitlines() if "fact_id=" in line)
    assert f"source_status=available evidence_sha256={digests['transcript']}" in fact_line
    item_line = next(line for line in text.splitlines() if "item_id=" in line)
    assert f"source_status=available evidence_sha256={digests['artifact']}" in item_line
    evidence_line = next(line for line in text.splitlines() if "memory_id=" in line)
    assert "source_status=denied evidence_unavailable=true" in evidence_line
    assert "conflict=none" in evidence_line
    assert "deploy on fridays" not in text  # source text is never injected
    assert second["system"] == first["system"]
    assert first["messages"] == request["messages"]


def test_each_request_shows_its_sources_as_they_are_then(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Pointers are re-verified on every request, and the block follows: an artifact
    removed between two requests is missing in the second; a transcript line rewritten is
    corrupt for the pointers into it; both put back, the block is the first one again, byte
    for byte."""
    proxy = proxy_factory(admin_token="admin-e2e-token-5b2d4e6f8a0c1e3b5d7f")
    digests = durable_setup(proxy, "sess-r")
    admin_put(proxy, "sess-r", {
        "facts": [{"fact_id": f"f{n}", "content": f"fact {n}",
                   "source_pointer": "transcript:sess-r:1",
                   "last_confirmed_at": "2025-03-01T12:30:00Z"} for n in range(3)],
        "pending_items": [{"item_id": "p1", "description": "publish the report",
                           "source_pointer": f"artifact:sess-r:report.txt:{digests['artifact']}",
                           "last_confirmed_at": "2025-03-01T12:31:00Z"}],
    })
    transcript = proxy.transcript_root / "sess-r.jsonl"
    artifact = proxy.artifact_root / "sess-r" / "report.txt"
    kept_transcript, kept_artifact = transcript.read_bytes(), artifact.read_bytes()
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    request: dict[str, Any] = {"model": MODEL, "max_tokens": 32, "system": "You are helpful.",
               "messages": [{"role": "user", "content": user_text("what is left?")}],
               "extra_headers": {"x-compact-session-id": "sess-r"}}

    def statuses(body: dict[str, Any]) -> list[str]:
        return [line.split("source_status=")[1].split()[0]
                for line in body["system"][-1]["text"].splitlines() if "source_status=" in line]

    with client:
        client.messages.create(**request)
        artifact.unlink()
        client.messages.create(**request)
        transcript.write_text(json.dumps({"sequence": 1, "session_id": "sess-r"}) + "\n",
                              encoding="utf-8")  # no event_id: not a transcript event
        client.messages.create(**request)
        transcript.write_bytes(kept_transcript)
        artifact.write_bytes(kept_artifact)
        client.messages.create(**request)
    first, second, third, fourth = forwarded(upstream_server)
    assert statuses(first) == ["available"] * 4
    assert statuses(second) == ["available"] * 3 + ["missing"]
    assert statuses(third) == ["corrupt"] * 3 + ["missing"]
    assert fourth["system"] == first["system"]


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


SUMMARY_POLICY = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
                  "max_tool_result_tokens": 2000, "keep_recent_messages": 40,
                  "summary_keep_recent": 4}


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


@pytest.mark.parametrize("mode", ["separate", "fork"])
def test_durable_state_never_enters_a_summary_or_a_summary_merge(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, mode: str
) -> None:
    """Across several L4 crossings (each merging the previous summary with newly aged-out
    messages), no summary call carries the durable facts in what it summarises, while every
    forwarded request does. A separate call never carries them at all; a forked one has them
    only in ``system``, exactly as the request it forks was forwarded."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY, "summary": {"mode": mode}},
                          admin_token="admin-e2e-token-merge-9c1d3f5a7b9e2c4d")
    marker = "DURABLE-FACT-ONLY-IN-SYSTEM-41b7"
    admin_put(proxy, "merge-1", {"facts": [{
        "fact_id": "f1", "content": f"{marker}: the release branch is frozen",
        "source_pointer": "transcript:merge-1:1", "last_confirmed_at": "2026-01-01T00:00:00Z"}]})
    history: list[Any] = [{"role": "user", "content": user_text("fix the parser")}]
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        for index in range(40):
            tool_id = f"toolu_m{index:03d}"
            history += [
                {"role": "assistant", "content": [
                    {"type": "text", "text": f"Reading file {index}."},
                    {"type": "tool_use", "id": tool_id, "name": "Read",
                     "input": {"file_path": f"/src/mod{index}.py"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id,
                                              "content": f"# module {index}\n" + "code\n" * 120}]},
            ]
            client.messages.create(model=MODEL, max_tokens=16, messages=history,
                                   extra_headers={"x-compact-session-id": "merge-1"})
    calls = summary_calls(upstream_server)
    assert len(calls) >= 2  # at least one merge of a previous summary with new messages
    assert any("compact-proxy-summary" in json.dumps(c.body["messages"]) for c in calls[1:])
    assert all(marker not in json.dumps(c.body["messages"]) for c in calls)
    sent = forwarded(upstream_server)
    assert sent and all(marker in json.dumps(body["system"]) for body in sent)
    if mode == "separate":
        assert all(marker not in json.dumps(c.body) for c in calls)
    else:
        assert all(c.body["system"] == sent[0]["system"] for c in calls)


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
