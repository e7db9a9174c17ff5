"""End to end: every log line is JSON and none carries a credential or message text.

The workload goes through every path that logs (pass-through, streaming, compaction with an
L4 summary and a failed one, durable context from the admin API, each kind of rejection,
upstream failures, other routes) with the test API key and a marker in every prompt; then the
whole session log so far (this test's and every earlier e2e test's) is scanned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.fake_upstream import Fault, Reply
from tests.conftest import (
    PROMPT_MARKER,
    TEST_API_KEY,
    ProxyFactory,
    UpstreamServer,
    read_log,
    user_text,
)
from tests.proxy.test_e2e_compaction import SUMMARY_POLICY, admin_put, read_turns

MODEL = "claude-sonnet-4-5"
ADMIN_TOKEN = "admin-hygiene-token-9c1e5b2d"


def run_workload(client: anthropic.Anthropic, upstream_server: UpstreamServer) -> None:
    """Send one request down every path that writes log lines."""
    small: list[Any] = [{"role": "user", "content": user_text("hello")}]
    client.messages.create(model=MODEL, max_tokens=16, messages=small)
    with client.messages.stream(model=MODEL, max_tokens=16,
                                messages=small) as stream:
        stream.get_final_message()
    long_history = read_turns(12)
    client.messages.create(model=MODEL, max_tokens=16, messages=long_history,
                           extra_headers={"x-compact-session-id": "hygiene"})
    client.messages.count_tokens(model=MODEL, messages=long_history)
    upstream_server.upstream.push(Reply.api_error(500, "api_error", "boom"))
    client.messages.create(model=MODEL, max_tokens=16,
                           messages=read_turns(13))
    upstream_server.upstream.push(Reply.text("cut", fault=Fault("cut_after_events",
                                                                after_events=2)))
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model=MODEL, max_tokens=16,
                                    messages=small) as stream:
            stream.get_final_message()
    bad_protocol = [*small, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_x", "name": "Read", "input": {"file_path": "/a"}}]},
        {"role": "user", "content": user_text("no result")}]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=16,
                               messages=bad_protocol)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=16,
                               messages=[{"role": "user", "content": user_text("q" * 400_000)}])
    client.models.list()


def test_no_log_line_holds_the_api_key_the_admin_token_or_prompt_text(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path
) -> None:
    """Scan the session's whole proxy log after the workload: zero hits, every line JSON."""
    proxy = proxy_factory({"compaction": {**SUMMARY_POLICY, "hard_limit_tokens": 90_000}},
                          admin_token=ADMIN_TOKEN)
    admin_put(proxy, "hygiene", {
        "facts": [{"fact_id": "f1", "content": f"{PROMPT_MARKER} secret fact",
                   "source_pointer": "transcript:hygiene:1",
                   "last_confirmed_at": "2025-03-01T12:30:00Z"}],
        "pending_items": [], "retrieval_evidence": [],
    })
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        run_workload(client, upstream_server)
    text = proxy_log.read_text(encoding="utf-8")
    lines: list[dict[str, Any]] = read_log(proxy_log)  # raises if any line is not JSON
    events = {line["event"] for line in lines}
    assert {"request_completed", "request_blocked", "summary_failed", "summary_ready",
            "upstream_stream_failed"} <= events
    assert TEST_API_KEY not in text
    assert TEST_API_KEY[:20] not in text
    assert ADMIN_TOKEN not in text
    assert PROMPT_MARKER not in text
    assert "line of code" not in text
    for line in lines:
        assert json.dumps(line)  # plain JSON values only
