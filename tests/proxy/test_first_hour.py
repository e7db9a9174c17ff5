"""What a new user and an operator read in the first hour (issue #35): the request log line
says what happened and why, ``HEAD /`` is the proxy's own, the fixed part of a request is
named when it is near or over a threshold, and layers and outcomes mean one thing."""

from __future__ import annotations

import json
import time
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
from tests.proxy.test_e2e_compaction import read_turns

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
