"""End to end: what the provider's own answers teach the proxy.

The strict fake counts input tokens with its own rule (``token_ratio`` × characters / 4 per
block of its canonical prompt, with per-block noise), different from both of the proxy's
counters, reports them in ``usage`` and refuses a prompt over its window with the exact
``prompt is too long: N tokens > M maximum``. Through the real proxy and the real SDK:

- calibration: after the first answer, the proxy's estimate of every view it forwards is
  within 3% of the provider's count, so a hard limit equal to the provider's window keeps
  every view inside it;
- transparent recovery: a view the provider refuses as too long is compacted again and
  retried once, the client never sees the first refusal; a second refusal is relayed;
- usage: the provider's figures reach the log line, the metrics and the usage ledger.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream import Reply
from proxy.fake_upstream.replies import TokenRule
from proxy.store import SQLiteStateStore
from tests.conftest import (
    TEST_API_KEY,
    ProxyFactory,
    UpstreamServer,
    read_log,
    user_text,
)

MODEL = "claude-sonnet-4-5"
WORDS = ("parser", "token", "offset", "buffer", "render", "schema", "cursor", "lexer",
         "frame", "socket", "router", "vector", "thread", "column", "record", "digest")


def source_file(index: int, lines: int) -> str:
    """Code-like text whose content varies from file to file (so block noise varies)."""
    out = [f"# module {index}"]
    for n in range(lines):
        a, b = WORDS[(index * 7 + n) % len(WORDS)], WORDS[(index + n * 3) % len(WORDS)]
        out.append(f"def {a}_{n}({b}: int) -> int:\n    return {b} * {n + index} + len('{a}')")
    return "\n".join(out)


def agent_session(turns: int, lines: int = 40) -> list[list[dict[str, Any]]]:
    """The successive ``messages`` of an agent that reads one file per turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_text("fix the parser")}]
    requests = [list(messages)]
    for index in range(turns):
        tool_id = f"toolu_{index:04d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading module {index}."},
            {"type": "tool_use", "id": tool_id, "name": "Read",
             "input": {"file_path": f"/src/mod{index}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id,
             "content": source_file(index, lines)}]})
        requests.append(list(messages))
    return requests


#: An agent's request carries its system prompt and tool definitions too (Claude Code's are
#: about 15 k tokens); these are a few thousand.
SYSTEM = [{"type": "text", "text": "You are a coding agent. " + " ".join(
    f"Rule {n}: keep the {WORDS[n % len(WORDS)]} module's tests green and explain each change."
    for n in range(60))}]
TOOLS = [{"name": name, "description": f"{name} a file or run a command. " * 12,
          "input_schema": {"type": "object", "properties": {
              "file_path": {"type": "string", "description": "absolute path"},
              "command": {"type": "string", "description": "a shell command"}}}}
         for name in ("Read", "Write", "Edit", "Bash", "Grep", "Glob")]


def provider_count(message: anthropic.types.Message) -> int:
    usage = message.usage
    return (usage.input_tokens + (usage.cache_creation_input_tokens or 0)
            + (usage.cache_read_input_tokens or 0))


def completed_lines(proxy_log: Path, at_least: int = 0) -> list[dict[str, Any]]:
    """The ``request_completed`` lines of /v1/messages so far; waits (a little) for
    ``at_least`` of them: a line is written just after its response went out."""
    deadline = time.monotonic() + 5
    while True:
        lines = [line for line in read_log(proxy_log)
                 if line.get("event") == "request_completed" and line.get("route") == "messages"]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def test_calibrated_estimates_track_the_providers_count_and_the_window_holds(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
        proxy_log: Path) -> None:
    """Provider counting 1.3× characters / 4 with ±10% per-block noise; the proxy counts with
    tiktoken; hard limit = the provider's window. After the first answer every calibrated
    estimate is within 3% of the provider's count, and the provider refuses nothing."""
    upstream = upstream_server.upstream
    upstream.token_rule = TokenRule(1.3, 0.1)
    upstream.context_window = 24_000
    proxy = proxy_factory({"compaction": {"token_counter": "tiktoken", "calibration": True,
                                          "soft_threshold_tokens": 18_000,
                                          "hard_limit_tokens": 24_000,
                                          "max_tool_result_tokens": 4_000,
                                          "keep_recent_messages": 8},
                           "summary": {"enabled": False}})
    errors: list[float] = []
    logged = len(completed_lines(proxy_log))
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        session = agent_session(60)
        for messages in session:
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=32, system=SYSTEM, tools=TOOLS, messages=messages)
            message = raw.parse()
            estimate = int(raw.headers["x-compact-tokens-after"])
            errors.append((estimate - provider_count(message)) / provider_count(message))
    print("estimate errors:", [round(e, 4) for e in errors])
    assert max(abs(e) for e in errors[1:]) <= 0.03, [round(e, 4) for e in errors]
    assert abs(errors[0]) > 0.05  # positive control: uncalibrated, tiktoken is far off
    # One provider call per request: nothing was refused as too long (and retried).
    assert len(upstream.message_requests) == len(session)
    lines = completed_lines(proxy_log, logged + len(session))[-len(session):]
    assert all(line["provider_input_tokens"] > 0 for line in lines)
    assert [round(line["estimate_error"] / 100, 4) for line in lines] == [
        round(e, 4) for e in errors]


RECOVERY_POLICY = {"soft_threshold_tokens": 40_000, "hard_limit_tokens": 60_000,
                   "max_tool_result_tokens": 4_000, "keep_recent_messages": 6}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_view_over_the_providers_window_is_recompacted_and_retried_once(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path,
        stream: bool) -> None:
    """Under the proxy's limits but over the provider's window: the provider refuses, the
    client never sees it; the proxy compacts below the window at the ratio the refusal
    showed, the retry is answered 200: exactly two upstream calls. The next request of the
    session fits the learnt window at once: one call."""
    upstream = upstream_server.upstream
    upstream.context_window = 12_000
    proxy = proxy_factory({"compaction": {**RECOVERY_POLICY, "calibration": True},
                           "summary": {"enabled": False}})
    session = agent_session(30)
    logged_before = len(read_log(proxy_log))
    logged_completed = len(completed_lines(proxy_log))
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        if stream:
            with client.messages.stream(model=MODEL, max_tokens=32,
                                        messages=session[-2]) as events:
                answer = events.get_final_message()
        else:
            answer = client.messages.create(model=MODEL, max_tokens=32, messages=session[-2])
        assert answer.content[0].type == "text"
        calls = upstream.message_requests
        assert len(calls) == 2
        first, retried = calls
        assert len(retried.body["messages"]) < len(first.body["messages"])
        assert provider_count(answer) <= upstream.context_window
        client.messages.create(model=MODEL, max_tokens=32, messages=session[-1])
        assert len(upstream.message_requests) == 3
    recompacted = [line for line in read_log(proxy_log)[logged_before:]
                   if line.get("event") == "request_recompacted"]
    assert len(recompacted) == 1
    line = recompacted[0]
    assert line["provider_maximum"] == 12_000 and line["provider_tokens"] > 12_000
    assert line["tokens_after"] < 12_000 < line["tokens_before"] + 1
    completed = completed_lines(proxy_log, logged_completed + 2)[-2]
    assert completed["upstream_status"] == 200 and completed["outcome"] == "forwarded"


def test_a_second_refusal_is_relayed_as_it_is(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer) -> None:
    """The retry happens once: when the provider refuses the recompacted view too, that
    refusal reaches the client as the provider sent it (after exactly two calls)."""
    upstream = upstream_server.upstream
    upstream.context_window = 12_000  # refuses the first view itself
    second = "prompt is too long: 12100 tokens > 12000 maximum"
    upstream.push(Reply(status=400, error={"type": "error", "error": {
        "type": "invalid_request_error", "message": second}}))  # answers the retry
    proxy = proxy_factory({"compaction": RECOVERY_POLICY, "summary": {"enabled": False}})
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client, pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=32, messages=agent_session(30)[-1])
    assert refused.value.body["error"]["message"] == second
    assert refused.value.response.headers["request-id"].startswith("req_")
    assert len(upstream.message_requests) == 2


def test_other_provider_errors_are_relayed_untouched_without_a_retry(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer) -> None:
    """Any other 400 is relayed byte for byte after one call."""
    upstream = upstream_server.upstream
    upstream.push(Reply(status=400, error={"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages: something else is wrong"}}))
    proxy = proxy_factory({"compaction": RECOVERY_POLICY, "summary": {"enabled": False}})
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client, pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=32, messages=agent_session(3)[-1])
    assert refused.value.body["error"]["message"] == "messages: something else is wrong"
    assert refused.value.response.headers["request-id"].startswith("req_")
    assert len(upstream.message_requests) == 1


async def _usage_rows(path: Path) -> list[Any]:
    store = SQLiteStateStore(path)
    try:
        return await store.usage_rows()
    finally:
        await store.close()


def test_the_providers_usage_reaches_the_log_the_metrics_and_the_ledger(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path) -> None:
    """JSON and streamed answers: request_completed carries the provider's figures, the
    metrics count them by kind, the ledger sums them per session and model."""
    proxy = proxy_factory({"summary": {"enabled": False}})
    session = agent_session(4)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0,
                                 default_headers={"x-compact-session-id": "usage-1"})
    answers = []
    logged = len(completed_lines(proxy_log))
    with client:
        answers.append(client.messages.create(model=MODEL, max_tokens=32, messages=session[-2]))
        with client.messages.stream(model=MODEL, max_tokens=32, messages=session[-1]) as events:
            answers.append(events.get_final_message())
    lines = completed_lines(proxy_log, logged + 2)[-2:]
    for line, answer in zip(lines, answers, strict=True):
        assert line["provider_input_tokens"] == provider_count(answer)
        assert line["usage_input"] == answer.usage.input_tokens
        assert line["usage_cache_read"] == (answer.usage.cache_read_input_tokens or 0)
        assert line["usage_output"] == answer.usage.output_tokens
        assert isinstance(line["estimate_error"], float)
    with urllib.request.urlopen(f"{proxy.base_url}/metrics") as response:  # noqa: S310
        text = response.read().decode()
    total_input = sum(a.usage.input_tokens for a in answers)
    assert f'compact_proxy_provider_tokens_total{{kind="input"}} {float(total_input)}' in text
    assert "compact_proxy_estimate_error_ratio_count 2.0" in text
    deadline = time.monotonic() + 5
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = asyncio.run(_usage_rows(proxy.state_dir / "state.db"))
        if rows and rows[0].entry.requests == 2:
            break
        time.sleep(0.05)
    assert [(r.session_key, r.model) for r in rows] == [("usage-1", MODEL)]
    entry = rows[0].entry
    assert entry.requests == 2
    assert entry.input_tokens == total_input
    assert entry.output_tokens == sum(a.usage.output_tokens for a in answers)
    assert entry.tokens_sent == sum(provider_count(a) for a in answers)
    assert entry.tokens_without_proxy >= entry.tokens_sent
