"""End to end: every log line is JSON and none carries a credential or message text, and
neither does the audit log in the store.

The workload goes through every path that logs (pass-through, streaming, compaction with an
L4 summary and a failed one, durable context from the admin API, each kind of rejection,
upstream failures, other routes) with the test API key and a marker in every prompt; then the
whole session log so far (this test's and every earlier e2e test's of this xdist worker; every
line of the run is checked by ``tests/log_tap.py``) is scanned, and so is every row of the
audit log (SQLite: its tables; Redis: every value under its keys).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.config import Config
from proxy.fake_upstream import Fault, Reply
from proxy.store import store_for
from tests.conftest import (
    PROMPT_MARKER,
    TEST_API_KEY,
    ProxyFactory,
    UpstreamServer,
    read_log,
    user_text,
)
from tests.proxy.e2e.helpers import SUMMARY_POLICY, admin_put, read_turns

MODEL = "claude-sonnet-4-5"
ADMIN_TOKEN = "admin-hygiene-token-9c1e5b2d7f3a8e4c"


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


def sqlite_audit_rows(path: str) -> list[str]:
    """Every row of the SQLite store's audit tables, as text."""
    conn = sqlite3.connect(path)
    try:
        return [json.dumps(row) for table in ("audit_request", "audit_session", "audit_change")
                for row in conn.execute(f"SELECT * FROM {table}")]  # noqa: S608 - our names
    finally:
        conn.close()


def forget_audit_log(url: str, prefix: str) -> None:
    """Delete the audit keys earlier tests left on the shared server."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        for key in list(client.scan_iter(match=f"{prefix}{{*}}:audit:*", count=500)):
            client.delete(key)
    finally:
        client.close()


def redis_audit_values(url: str, prefix: str) -> list[str]:
    """Every key and value the Redis store keeps for its audit log, as text."""
    import redis

    from tests.proxy.e2e.helpers import redis_values

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}{{*}}:audit:*", count=500))
        return [part.decode("utf-8", "replace") for key in keys
                for part in (key, *redis_values(client, key))]
    finally:
        client.close()


#: The workload's /v1/messages and count_tokens requests: each leaves one audit entry.
AUDITED_REQUESTS = 8


def audited_requests(config: Config) -> int:
    """How many request entries the proxy's store holds, over every session."""

    async def count() -> int:
        store = await store_for(config).open()
        try:
            summaries, _ = await store.sessions(limit=1000)
            return sum(summary.requests for summary in summaries)
        finally:
            await store.close()

    return asyncio.run(count())


def wait_for_audit_entries(config: Config, count: int) -> None:
    """Until the store holds ``count`` entries (they are written just after the responses)."""
    deadline = time.monotonic() + 10
    while audited_requests(config) < count:
        assert time.monotonic() < deadline, audited_requests(config)
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_no_log_line_holds_the_api_key_the_admin_token_or_prompt_text(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path,
    backend: str, request: pytest.FixtureRequest,
) -> None:
    """Scan the session's whole proxy log after the workload: zero hits, every line JSON;
    then every audit row in the store: entries for the workload, none holds the marker or a
    credential."""
    store: dict[str, Any] = {}
    prefix = "compact-proxy:"  # the proxy's (the default): earlier tests' entries go too
    if backend == "redis":
        redis_url: str = request.getfixturevalue("redis_url")
        store = {"store": {"backend": "redis", "url": redis_url}}
        forget_audit_log(redis_url, prefix)
    proxy = proxy_factory({"compaction": {**SUMMARY_POLICY, "hard_limit_tokens": 90_000},
                           **store}, admin_token=ADMIN_TOKEN)
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

    wait_for_audit_entries(proxy.config, AUDITED_REQUESTS)
    assert audited_requests(proxy.config) == AUDITED_REQUESTS
    rows = (sqlite_audit_rows(proxy.config.store.path) if backend == "sqlite"
            else redis_audit_values(redis_url, prefix))
    audit = "\n".join(rows)
    assert "MessageViewLimitExceeded" in audit and "ToolProtocolError" in audit
    assert "admin-api" in audit  # the admin PUT's change
    for secret in (PROMPT_MARKER, "line of code", "secret fact", TEST_API_KEY[:20],
                   ADMIN_TOKEN):
        assert secret not in audit
