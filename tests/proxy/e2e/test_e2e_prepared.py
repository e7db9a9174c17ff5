"""End to end: zero-wait compaction (``summary.prepare_at``, issue #33).

The strict provider takes a second to write a summary. A session nearing its threshold gets
its summary made in the background; the request that crosses the threshold uses it and waits
for no summary call; the crossing is logged and counted with how it was served.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anthropic

from proxy.fake_upstream import SummaryTiming
from proxy.http.keys import SERVICES
from tests.conftest import (
    TEST_API_KEY,
    LoopThread,
    ProxyFactory,
    UpstreamServer,
    log_lines_for,
    read_log,
)
from tests.proxy.e2e.helpers import summary_calls
from tests.proxy.e2e.test_e2e_summary_fork import metrics_text

MODEL = "claude-sonnet-4-5"
POLICY = {"soft_threshold_tokens": 4000, "hard_limit_tokens": 60000,
          "max_tool_result_tokens": 2000, "keep_recent_messages": 200, "summary_keep_recent": 4}
WRITING_S = 1.0


def _turn(messages: list[Any], index: int, chars: int = 600) -> list[Any]:
    tool_id = f"toolu_{index:04d}"
    return [*messages,
            {"role": "assistant", "content": [
                {"type": "text", "text": f"Reading file {index}."},
                {"type": "tool_use", "id": tool_id, "name": "Read",
                 "input": {"file_path": f"/src/mod{index}.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": tool_id,
                 "content": f"# module {index}\n" + "line of code\n" * (chars // 13)}]}]


def _session(proxy_url: str, upstream_server: UpstreamServer, session: str,
             ) -> list[tuple[Any, float]]:
    """Turns until the first crossing; each (raw response, seconds it took)."""
    client = anthropic.Anthropic(base_url=proxy_url, api_key=TEST_API_KEY, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "fix the parser"}]
    sent: list[tuple[Any, float]] = []
    with client:
        for index in range(60):
            messages = _turn(messages, index)
            started = time.monotonic()
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=256, messages=messages,
                extra_headers={"x-compact-session-id": session})
            sent.append((raw, time.monotonic() - started))
            if "L4" in raw.headers["x-compact-layers"].split(","):
                return sent
            time.sleep(0.15)  # the agent's own time between requests
    raise AssertionError("the session never crossed its threshold")


def completed_line(proxy_log: Any, raw: Any) -> dict[str, Any]:
    """The ``request_completed`` line of the request answered by ``raw`` (written just after
    its answer)."""
    deadline = time.monotonic() + 5
    while True:
        lines = [x for x in log_lines_for(proxy_log, raw.headers["x-compact-request-id"])
                 if x.get("event") == "request_completed"]
        if lines or time.monotonic() > deadline:
            (line,) = lines
            return line
        time.sleep(0.02)


def test_the_crossing_uses_the_summary_prepared_ahead_and_waits_for_none(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any
) -> None:
    upstream_server.upstream.summary_timing = SummaryTiming(first_token_s=WRITING_S)
    proxy = proxy_factory({"compaction": POLICY, "summary": {"prepare_at": 0.5, "max_tokens": 300}})
    sent = _session(proxy.base_url, upstream_server, "zero-wait-1")
    crossing, took = sent[-1]
    assert len(summary_calls(upstream_server)) == 1  # made ahead, not again at the crossing
    line = completed_line(proxy_log, crossing)
    assert line["summary_served"] == "prepared"
    assert line["summary_wait_ms"] < 100
    assert took < WRITING_S / 2
    text = asyncio.run(metrics_text(proxy))
    assert 'compact_proxy_crossings_total{served="prepared"} 1.0' in text
    assert 'compact_proxy_prepared_summaries_total{outcome="used"} 1.0' in text
    assert 'compact_proxy_prepared_summary_tokens_total{outcome="used"}' in text


def test_without_preparation_the_crossing_waits_for_the_summary_call(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any
) -> None:
    upstream_server.upstream.summary_timing = SummaryTiming(first_token_s=WRITING_S)
    proxy = proxy_factory({"compaction": POLICY,
                           "summary": {"prepare_at": None, "max_tokens": 300}})
    crossing, took = _session(proxy.base_url, upstream_server, "zero-wait-2")[-1]
    line = completed_line(proxy_log, crossing)
    assert line["summary_served"] == "inline"
    assert line["summary_wait_ms"] >= WRITING_S * 1000
    assert took >= WRITING_S


def test_count_tokens_never_starts_a_preparation(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    proxy = proxy_factory({"compaction": POLICY, "summary": {"prepare_at": 0.5, "max_tokens": 300}})
    messages: list[Any] = [{"role": "user", "content": "fix the parser"}]
    for index in range(12):
        messages = _turn(messages, index)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        counted = client.messages.count_tokens(model=MODEL, messages=messages,
                                               extra_headers={"x-compact-session-id": "ct"})
    assert counted.input_tokens >= 0.5 * POLICY["soft_threshold_tokens"]
    time.sleep(0.3)
    assert summary_calls(upstream_server) == []


def test_a_summary_call_refused_as_too_long_teaches_the_window_and_is_made_in_pieces(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any
) -> None:
    """A provider whose window is 6,000 tokens and a 30k-token span: the summary call is
    refused (``prompt is too long``); the proxy learns the window and summarises the span in
    pieces that fit, so L4 (not L3's cut) serves the crossing and the provider accepts it."""
    upstream_server.upstream.context_window = 6_000
    proxy = proxy_factory({"compaction": {**POLICY, "soft_threshold_tokens": 20_000},
                           "summary": {"prepare_at": None, "max_tokens": 300}})
    messages: list[Any] = [{"role": "user", "content": "fix the parser"}]
    for index in range(40):
        messages = _turn(messages, index, chars=3_000)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=256, messages=messages,
            extra_headers={"x-compact-session-id": "small-window"})
    assert raw.http_response.status_code == 200
    assert "L4" in raw.headers["x-compact-layers"].split(",")
    calls = summary_calls(upstream_server)
    assert len(calls) >= 3  # the refused one, then pieces and their merge
    ready = [x for x in log_lines_for(proxy_log, raw.headers["x-compact-request-id"])
             if x.get("event") == "summary_ready"]
    assert ready and ready[-1]["pieces"] >= 2


def test_a_stale_preparation_is_replaced_and_counted_unused(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any
) -> None:
    """Prepared early (0.3 of the threshold), the summary's verbatim tail grows until the
    view would no longer land below the target with it: a newer one replaces it, the old one
    is counted unused, and the crossing is served by the newer one."""
    proxy = proxy_factory({"compaction": POLICY,
                           "summary": {"prepare_at": 0.3, "max_tokens": 300}})
    crossing, _ = _session(proxy.base_url, upstream_server, "stale-1")[-1]
    assert completed_line(proxy_log, crossing)["summary_served"] == "prepared"
    text = asyncio.run(metrics_text(proxy))
    assert 'compact_proxy_prepared_summaries_total{outcome="unused"}' in text
    assert 'compact_proxy_prepared_summaries_total{outcome="used"} 1.0' in text
    replaced = [x for x in read_log(proxy_log) if x.get("event") == "prepared_summary_replaced"
                and x.get("session_id") == "stale-1"]
    assert replaced


async def _lose_the_running_calls(app: Any) -> None:
    """What a process that died leaves: its preparation's call gone, with no end recorded
    (no bill, no summary cached) and its record still ``running``."""
    services = app[SERVICES]
    for task in list(services.background.tasks):
        task.cancel()
    assert services.summarizer is not None
    await services.summarizer.flights.close()


def test_a_preparation_whose_call_was_lost_is_asked_for_again_after_its_lifetime(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Any,
    servers: LoopThread,
) -> None:
    """A ``running`` preparation whose call ended without a trace (the process that made it
    died) is trusted for ``summary.timeout_s`` per try only: past it, the next request asks
    for the same span again in the background, so the crossing still waits for no summary
    call (before: the record stayed ``running`` for ever and the crossing made the call)."""
    upstream_server.upstream.summary_timing = SummaryTiming(first_token_s=WRITING_S)
    lifetime_s = 1.5
    proxy = proxy_factory({"compaction": POLICY, "summary": {
        "prepare_at": 0.5, "max_tokens": 300, "timeout_s": lifetime_s}})
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "fix the parser"}]
    lost = False
    crossing = None
    with client:
        for index in range(60):
            messages = _turn(messages, index)
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=256, messages=messages,
                extra_headers={"x-compact-session-id": "lost-1"})
            if "L4" in raw.headers["x-compact-layers"].split(","):
                crossing = raw
                break
            if not lost and summary_calls(upstream_server):
                servers.run(_lose_the_running_calls(proxy.app))
                lost = True
                time.sleep(lifetime_s + 0.1)
            time.sleep(0.15)
    assert lost and crossing is not None
    line = completed_line(proxy_log, crossing)
    assert line["summary_served"] == "prepared"
    assert line["summary_wait_ms"] < WRITING_S * 1000 / 2
    assert len(summary_calls(upstream_server)) == 2  # the lost one, and the one asked again
    restarted = [x for x in read_log(proxy_log) if x.get("event") == "summary_prepare_restarted"
                 and x.get("session_id") == "lost-1"]
    assert len(restarted) == 1
    text = asyncio.run(metrics_text(proxy))
    assert 'compact_proxy_prepared_summaries_total{outcome="restarted"} 1.0' in text
