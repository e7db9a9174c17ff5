"""The fake provider takes time to write a summary call, as a real model does; other calls
are answered at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import anthropic
import pytest

from proxy.fake_upstream import SUMMARIZER_MARKER, FakeUpstream, SummaryTiming
from tests.redis_server import free_port

_SUMMARY_SYSTEM = f"{SUMMARIZER_MARKER}: summarize the messages."
_SPAN = '[{"role":"user","content":"hello"},{"role":"assistant","content":"hi"}]'


async def _timed(client: anthropic.AsyncAnthropic, **kwargs: object) -> tuple[float, int]:
    started = time.monotonic()
    message = await client.messages.create(model="claude-sonnet-4-5", **kwargs)  # type: ignore[call-overload]
    return time.monotonic() - started, message.usage.output_tokens


async def test_a_summary_call_takes_first_token_plus_per_token_time(
        upstream: FakeUpstream, client: anthropic.AsyncAnthropic) -> None:
    upstream.summary_timing = SummaryTiming(first_token_s=0.2, token_s=0.002)
    took, written = await _timed(client, max_tokens=4096, system=_SUMMARY_SYSTEM,
                                 messages=[{"role": "user", "content": _SPAN}])
    assert took >= 0.2 + 0.002 * written - 0.01
    plain, _ = await _timed(client, max_tokens=4096,
                            messages=[{"role": "user", "content": "hello"}])
    assert plain < 0.15  # only summary calls take time


async def test_writes_max_tokens_takes_the_whole_budget(
        upstream: FakeUpstream, client: anthropic.AsyncAnthropic) -> None:
    upstream.summary_timing = SummaryTiming(token_s=0.001, writes_max_tokens=True)
    took, _ = await _timed(client, max_tokens=400, system=_SUMMARY_SYSTEM,
                           messages=[{"role": "user", "content": _SPAN}])
    assert took >= 0.39


def test_negative_times_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        SummaryTiming(first_token_s=-1)


def test_fake_upstream_command_takes_the_summary_timing_flags() -> None:
    """``compact-proxy fake-upstream --summary-first-token-ms`` makes summary calls slow."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "fake-upstream", "--port", str(port),
         "--summary-first-token-ms", "300", "--summary-token-ms", "1"],
        env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "listening" in proc.stdout.readline()
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="k",
                                     max_retries=0)
        started = time.monotonic()
        client.messages.create(model="claude-sonnet-4-5", max_tokens=100,
                               system=_SUMMARY_SYSTEM,
                               messages=[{"role": "user", "content": _SPAN}])
        assert time.monotonic() - started >= 0.3
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
