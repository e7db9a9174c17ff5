"""End to end (issue #34): a session that crosses the soft threshold again right after a
compaction is logged (``compaction_thrash``) and counted in the metrics, through the real
proxy, the real SDK and the strict fake provider."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import anthropic

from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, read_log

MODEL = "claude-sonnet-4-5"
# Each turn adds about 1,500 tokens, over a third of the soft threshold: a compaction to the
# usual 70 % is crossed again by the next turn or the one after.
POLICY = {"soft_threshold_tokens": 4_000, "hard_limit_tokens": 40_000,
          "max_tool_result_tokens": 1_500, "keep_recent_messages": 6,
          "summary_keep_recent": 4, "token_counter": "chars4", "calibration": False}


def test_a_thrashing_session_is_logged_counted_and_summarised_less_often(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path) -> None:
    """Twelve requests of one huge tool result each: the re-crossings are logged and counted,
    and compacted by the cheap layers, deeper, with no summary paid for each of them."""
    proxy = proxy_factory({"compaction": POLICY})
    upstream = upstream_server.upstream
    logged = len(read_log(proxy_log))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Watch the build logs."}]
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0,
                                 default_headers={"x-compact-session-id": "thrash-1"})
    with client:
        for n in range(12):
            messages += [
                {"role": "assistant", "content": [
                    {"type": "text", "text": f"Reading log {n}."},
                    {"type": "tool_use", "id": f"toolu_{n:04d}", "name": "Bash",
                     "input": {"command": f"tail build{n}.log"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{n:04d}",
                     "content": "log line of the build\n" * 2_000}]}]
            client.messages.create(model=MODEL, max_tokens=16, messages=messages)
    lines = [line for line in read_log(proxy_log)[logged:]
             if line.get("event") == "compaction_thrash"]
    assert len(lines) >= 3
    assert all(line["session_id"] == "thrash-1" and line["tokens_after"] < 4_000
               for line in lines)
    with urllib.request.urlopen(f"{proxy.base_url}/metrics") as response:  # noqa: S310
        metrics = response.read().decode()
    assert f"compact_proxy_compaction_thrash_total {float(len(lines))}" in metrics
    summaries = [r for r in upstream.message_requests
                 if "compact-proxy-summarizer" in str(r.body)]
    assert len(summaries) <= 12 - len(lines)
