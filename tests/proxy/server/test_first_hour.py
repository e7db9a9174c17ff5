"""What a new user and an operator read in the first hour (issue #35): the request log line
says what happened and why, ``HEAD /`` is the proxy's own, the fixed part of a request is
named when it is near or over a threshold, and layers and outcomes mean one thing."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import anthropic

from tests.conftest import (
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    log_lines_for,
    read_log,
)
from tests.proxy.e2e.helpers import read_turns
from tests.proxy.e2e.test_e2e_audit import wait_for_requests

MODEL = "claude-sonnet-4-5"
HEADERS = {"x-api-key": TEST_API_KEY, "content-type": "application/json",
           "anthropic-version": "2023-06-01"}


def _completed(proxy_log: Path, request_id: str) -> dict[str, Any]:
    """The request's ``request_completed`` line (written just after the response's end)."""
    for _ in range(100):
        lines = [line for line in log_lines_for(proxy_log, request_id)
                 if line["event"] == "request_completed"]
        if lines:
            break
        time.sleep(0.02)
    assert len(lines) == 1
    return lines[0]


async def _send(proxy: RunningProxy, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as http:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body)
        async with http.request(method, f"{proxy.base_url}{path}", data=data,
                                headers=headers or HEADERS) as resp:
            return resp.status, dict(resp.headers), await resp.read()


# -- say what is going on -------------------------------------------------------------------


async def test_head_root_is_answered_by_the_proxy_not_counted_as_an_upstream_error(
        proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path) -> None:
    """Claude Code sends ``HEAD /`` at each launch: 200 here, never forwarded."""
    status, headers, _ = await _send(proxy, "HEAD", "/", headers={})
    assert status == 200
    assert not [r for r in upstream_server.upstream.requests if r.path == "/"]
    line = _completed(proxy_log, headers["x-compact-request-id"])
    assert line["outcome"] == "ok" and line["route"] == "root"


async def test_a_passthrough_line_names_its_path(
        proxy: RunningProxy, proxy_log: Path) -> None:
    status, headers, _ = await _send(proxy, "GET", "/v1/models?limit=2")
    assert status == 200
    line = _completed(proxy_log, headers["x-compact-request-id"])
    assert line["route"] == "passthrough" and line["path"] == "/v1/models"


async def test_request_completed_has_no_null_and_says_why_it_compacted(
        proxy_factory: ProxyFactory, proxy_log: Path) -> None:
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 3_000,
                                          "hard_limit_tokens": 100_000,
                                          "max_tool_result_tokens": 200}})
    body = {"model": MODEL, "max_tokens": 32, "messages": read_turns(4)}
    status, headers, _ = await _send(proxy, "POST", "/v1/messages", body)
    assert status == 200
    line = _completed(proxy_log, headers["x-compact-request-id"])
    assert None not in line.values()
    assert "L1" in line["layers"]
    before = line["tokens_before"]
    assert line["compacted_because"] == f"{before:,} ≥ soft 3,000"
    # A request below the threshold: no compaction fields at all, no nulls.
    small = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    status, headers, _ = await _send(proxy, "POST", "/v1/messages", small)
    line = _completed(proxy_log, headers["x-compact-request-id"])
    assert None not in line.values() and "compacted_because" not in line
    assert "usage_input" in line and "upstream_status" in line


def test_sdk_request_line_keeps_its_usage(sdk: anthropic.Anthropic, proxy_log: Path) -> None:
    answer = sdk.messages.with_raw_response.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    line = _completed(proxy_log, answer.headers["x-compact-request-id"])
    assert line["usage_output"] >= 0 and line["status"] == 200
    assert not [k for k, v in line.items() if v is None]
    assert read_log(proxy_log)


TOOLS = [{"name": f"tool_{n}", "description": "x" * 4_000,
          "input_schema": {"type": "object"}} for n in range(4)]  # ~4,000 tokens (chars4)


async def test_a_fixed_part_near_the_soft_threshold_is_warned_about_once_per_session(
        proxy_factory: ProxyFactory, proxy_log: Path) -> None:
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 6_000,
                                          "hard_limit_tokens": 50_000}})
    body = {"model": MODEL, "max_tokens": 8, "tools": TOOLS,
            "messages": [{"role": "user", "content": "hi"}]}
    ids = []
    for session in ("s-fixed-1", "s-fixed-1", "s-fixed-2"):
        status, headers, _ = await _send(proxy, "POST", "/v1/messages", body,
                                         {**HEADERS, "x-compact-session-id": session})
        assert status == 200
        ids.append(headers["x-compact-request-id"])
    warned = [line for line in read_log(proxy_log) if line["event"] == "fixed_part_large"
              and line.get("request_id") in ids]
    assert [line["session_id"] for line in warned] == ["s-fixed-1", "s-fixed-2"]
    first = warned[0]
    assert first["level"] == "warning" and first["soft_threshold"] == 6_000
    assert 4_000 <= first["fixed_tokens"] < 4_200
    assert first["detail"].startswith(f"system + tools are {first['fixed_tokens']:,} tokens")
    # Below half the soft threshold: no warning.
    quiet = proxy_factory({"compaction": {"soft_threshold_tokens": 20_000,
                                          "hard_limit_tokens": 50_000}})
    status, headers, _ = await _send(quiet, "POST", "/v1/messages", body)
    assert not [line for line in log_lines_for(proxy_log, headers["x-compact-request-id"])
                if line["event"] == "fixed_part_large"]


async def test_the_hard_limit_refusal_names_the_fixed_part_and_the_messages(
        proxy_factory: ProxyFactory, proxy_log: Path) -> None:
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 3_000,
                                          "hard_limit_tokens": 5_000}})
    body = {"model": MODEL, "max_tokens": 8, "tools": TOOLS,
            "messages": [{"role": "user", "content": "y" * 8_000}]}
    status, headers, raw = await _send(proxy, "POST", "/v1/messages", body)
    assert status == 400
    error = json.loads(raw)["error"]
    assert error["message"].startswith("prompt is too long: ")  # the provider's own pattern
    compaction = error["compaction"]
    fixed, messages = compaction["fixed_tokens"], compaction["messages_tokens"]
    assert 4_000 <= fixed < 4_200 and 1_900 <= messages <= 2_100
    assert fixed + messages == compaction["tokens_after"]
    assert compaction["detail"] == (f"after compaction: system + tools {fixed:,} tokens, "
                                    f"messages {messages:,} tokens; hard limit 5,000")
    blocked = [line for line in log_lines_for(proxy_log, headers["x-compact-request-id"])
               if line["event"] == "request_blocked"]
    assert (blocked[0]["fixed_tokens"], blocked[0]["messages_tokens"]) == (fixed, messages)


# -- one meaning of layers and outcomes ------------------------------------------------------

ADMIN = "first-hour-admin-token-5c1e9a7b3d"


def _metric(proxy: RunningProxy, route: str, outcome: str) -> float:
    text = urllib.request.urlopen(f"{proxy.base_url}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("compact_proxy_requests_total{") and f'route="{route}"' in line \
                and f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_client_mistakes_are_invalid_and_limit_refusals_blocked(
        proxy_factory: ProxyFactory, proxy_log: Path) -> None:
    """Bad JSON, ``"content": 5``, a broken tool protocol and a wrong admin token: outcome
    ``invalid`` and ``request_invalid`` (with the tool protocol's kind and id); over the hard
    limit: ``blocked`` and ``request_blocked``. In the log, the metric and the audit record."""
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 1_000,
                                          "hard_limit_tokens": 2_000},
                           "summary": {"enabled": False}}, admin_token=ADMIN)
    session = {**HEADERS, "x-compact-session-id": "s-outcomes"}
    bad_protocol = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_lost", "name": "Read", "input": {}}]},
        {"role": "user", "content": "no result"}]
    sent = [
        (b'{"model": "m", "messages": [', "invalid", "bad_json"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": 5}]},
         "invalid", "invalid_messages"),
        ({"model": MODEL, "max_tokens": 8, "messages": bad_protocol},
         "invalid", "ToolProtocolError"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "w" * 12_000}]},
         "blocked", "MessageViewLimitExceeded"),
    ]
    ids = []
    for body, outcome, reason in sent:
        status, headers, raw = asyncio.run(_send(proxy, "POST", "/v1/messages", body, session))
        assert status == 400, raw
        request_id = headers["x-compact-request-id"]
        ids.append(request_id)
        lines = log_lines_for(proxy_log, request_id)
        events = {line["event"] for line in lines}
        expected = "request_invalid" if outcome == "invalid" else "request_blocked"
        other = "request_blocked" if outcome == "invalid" else "request_invalid"
        assert expected in events and other not in events, (reason, events)
        refusal = next(line for line in lines if line["event"] == expected)
        assert refusal["reason"] == reason if reason != "bad_json" else refusal["reason"]
        assert _completed(proxy_log, request_id)["outcome"] == outcome
        if reason == "ToolProtocolError":
            assert (refusal["kind"], refusal["tool_use_id"]) == ("missing", "toolu_lost")
            # The provider's own wording of the rule, naming the message and the id.
            assert json.loads(raw)["error"]["message"] == (
                "messages.1: `tool_use` ids were found without `tool_result` blocks "
                "immediately after: toolu_lost. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message.")
        if reason == "MessageViewLimitExceeded":
            # A refused view claims only the layers that changed it, not every layer that ran.
            assert headers["x-compact-layers"] == ""
            assert json.loads(raw)["error"]["compaction"]["layers"] == []
    status, headers, _ = asyncio.run(_send(proxy, "GET", "/admin/sessions",
                                           headers={"Authorization": "Bearer wrong"}))
    assert status == 401
    assert _completed(proxy_log, headers["x-compact-request-id"])["outcome"] == "invalid"
    assert _metric(proxy, "messages", "invalid") == 3
    assert _metric(proxy, "messages", "blocked") == 1
    entries = wait_for_requests(proxy, "s-outcomes", 3)  # bad JSON has no session
    assert [(e["outcome"], e["reason"], e["blocked"]) for e in entries] == [
        ("blocked", "MessageViewLimitExceeded", True),
        ("invalid", "ToolProtocolError", False),
        ("invalid", "invalid_messages", False)]


def test_a_routine_admin_answer_is_not_a_refusal(
        proxy_factory: ProxyFactory, proxy_log: Path) -> None:
    proxy = proxy_factory(admin_token=ADMIN)
    status, headers, _ = asyncio.run(_send(proxy, "GET", "/admin/sessions/nosuch/state",
                                           headers={"Authorization": f"Bearer {ADMIN}"}))
    assert status == 404
    lines = log_lines_for(proxy_log, headers["x-compact-request-id"])
    assert not {"request_blocked", "request_invalid"} & {line["event"] for line in lines}
    assert _completed(proxy_log, headers["x-compact-request-id"])["outcome"] == "http_error"


def test_sticky_reuse_is_shown_as_such_in_the_log_and_the_audit_record(
        proxy_factory: ProxyFactory, proxy_log: Path) -> None:
    """The second request reuses the first one's compacted prefix: its savings name
    ``sticky`` with what the prefix saved, and together they add up to before − after."""
    proxy = proxy_factory({"compaction": {"soft_threshold_tokens": 3_000,
                                          "hard_limit_tokens": 100_000,
                                          "max_tool_result_tokens": 200,
                                          "keep_recent_messages": 4}},
                          admin_token=ADMIN)
    session = {**HEADERS, "x-compact-session-id": "s-sticky"}
    history = read_turns(6)
    first = {"model": MODEL, "max_tokens": 8, "messages": history}
    status, headers, _ = asyncio.run(_send(proxy, "POST", "/v1/messages", first, session))
    assert status == 200 and "L1" in headers["x-compact-layers"]
    second = {"model": MODEL, "max_tokens": 8, "messages": [
        *history, {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "and now?"}]}
    status, headers, _ = asyncio.run(_send(proxy, "POST", "/v1/messages", second, session))
    assert status == 200
    line = _completed(proxy_log, headers["x-compact-request-id"])
    assert line["compacted_because"].endswith("sticky prefix reused")
    assert any(item.startswith("sticky=") for item in line["saved"])
    entry = wait_for_requests(proxy, "s-sticky", 2)[0]
    sticky = [s for s in entry["layers"] if s["layer"] == "sticky"]
    assert sticky and sticky[0]["saved"] > 0
    assert sum(s["saved"] for s in entry["layers"]) == (
        entry["tokens_before"] - entry["tokens_after"])


# -- operator tools ---------------------------------------------------------------------------


def test_a_listed_session_of_any_tenant_is_addressed_by_its_id_and_tenant(
        proxy_factory: ProxyFactory) -> None:
    """Team mode: ``/admin/sessions`` lists a tenant's session with its ``requests_path``;
    ``/admin/sessions/{sid}/…?tenant=`` reaches it (requests, state), the same as
    ``/admin/tenants/{tenant}/sessions/{sid}/…``; without the tenant it is tenant none's."""
    proxy = proxy_factory({"session": {"scope": "header:x-team-user"}}, admin_token=ADMIN)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    status, _, _ = asyncio.run(_send(proxy, "POST", "/v1/messages", body, {
        **HEADERS, "x-team-user": "alice", "x-compact-session-id": "s-team"}))
    assert status == 200
    deadline = time.monotonic() + 10
    while True:
        status, _, raw = asyncio.run(_send(proxy, "GET", "/admin/sessions", headers=auth))
        listed = json.loads(raw)["sessions"]
        if listed or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (session,) = listed
    tenant = session["tenant"]
    assert tenant.startswith("h")
    assert session["requests_path"] == f"/admin/sessions/s-team/requests?tenant={tenant}"
    status, _, raw = asyncio.run(_send(proxy, "GET", session["requests_path"], headers=auth))
    answer = json.loads(raw)
    assert (status, answer["tenant"], answer["total"]) == (200, tenant, 1)
    status, _, raw = asyncio.run(_send(proxy, "GET", "/admin/sessions/s-team/requests",
                                       headers=auth))
    assert json.loads(raw)["total"] == 0  # tenant none's s-team: another session
    state = {"facts": [{"fact_id": "f1", "content": "use pytest",
                        "source_pointer": "transcript:a#1",
                        "last_confirmed_at": "2026-01-01T00:00:00Z"}]}
    status, _, _ = asyncio.run(_send(proxy, "PUT", f"/admin/sessions/s-team/state?tenant={tenant}",
                                     state, {**auth, "content-type": "application/json"}))
    assert status == 201
    status, _, raw = asyncio.run(_send(proxy, "GET",
                                       f"/admin/tenants/{tenant}/sessions/s-team/state",
                                       headers=auth))
    assert status == 200 and json.loads(raw)["facts"][0]["fact_id"] == "f1"
    status, _, _ = asyncio.run(_send(proxy, "GET", "/admin/sessions/s-team/state", headers=auth))
    assert status == 404
    status, _, raw = asyncio.run(_send(
        proxy, "GET", f"/admin/tenants/{tenant}/sessions/s-team/state?tenant=none", headers=auth))
    assert status == 400 and "tenant" in json.loads(raw)["error"]["message"]
