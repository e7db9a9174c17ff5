"""Load: 200 concurrent streaming clients for 30 s against a proxy subprocess in front of a
fake-provider subprocess (loopback only). Zero errors, zero views the strict provider refused,
bounded memory; the figures (requests served, p99 added latency, peak RSS) are printed.

Added latency is the p99 of the full stream time through the proxy minus the p99 of the same
workload sent straight to the provider at the same concurrency (a short baseline run first).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import aiohttp
import pytest

from tests.conftest import load_corpus_body, user_text
from tests.reliability.conftest import LOAD_API_KEY, ProxyProcessFactory, ServiceProcess

pytestmark = pytest.mark.slow

CLIENTS: Final = 200
LOAD_S: Final = 30.0
BASELINE_S: Final = 4.0
EVENT_DELAY_S: Final = 0.02
MODEL: Final = "claude-sonnet-4-5"
#: A real conversation that L1/L3 compact under the thresholds below.
CORPUS: Final = "m-claude__18240050-3ee8-41cd-a89a-0a5c4b709607.json"
THRESHOLDS: Final = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 150000,
                     "max_tool_result_tokens": 300, "keep_recent_messages": 6}
MAX_PEAK_RSS: Final = 600 * 1024 * 1024
MAX_RSS_GROWTH: Final = 80 * 1024 * 1024


def bodies() -> list[bytes]:
    """The request mix: small streamed prompts, and a corpus conversation that compacts."""
    small = {"model": MODEL, "max_tokens": 32, "stream": True,
             "messages": [{"role": "user", "content": user_text("load probe")}]}
    corpus = load_corpus_body(CORPUS)
    corpus.update(model=MODEL, max_tokens=32, stream=True)
    return [json.dumps(small).encode()] * 3 + [json.dumps(corpus).encode()]


@dataclass
class LoadResult:
    """What one load run saw."""

    durations: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    compacted: int = 0

    def p(self, quantile: float) -> float:
        """A quantile of the stream durations, in seconds."""
        ordered = sorted(self.durations)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


async def run_load(base_url: str, seconds: float, payloads: list[bytes],
                   sample: Callable[[], None] | None = None) -> LoadResult:
    """``CLIENTS`` workers, each streaming requests back to back for ``seconds``."""
    result = LoadResult()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=CLIENTS + 10)
    timeout = aiohttp.ClientTimeout(total=30)

    async def worker(index: int) -> None:
        headers = {"x-api-key": LOAD_API_KEY, "content-type": "application/json",
                   "x-compact-session-id": f"load-{index}"}
        turn = index
        while time.monotonic() < deadline:
            payload = payloads[turn % len(payloads)]
            turn += 1
            started = time.monotonic()
            try:
                async with http.post(f"{base_url}/v1/messages", data=payload,
                                     headers=headers) as resp:
                    text = await resp.text()
                    layers = resp.headers.get("x-compact-layers", "")
                    status = resp.status
            except (TimeoutError, aiohttp.ClientError) as exc:
                result.errors.append(type(exc).__name__)
                continue
            if status != 200 or not text.endswith('data: {"type":"message_stop"}\n\n') \
                    or "event: error" in text:
                result.errors.append(f"{status}: {text[:200]}")
                continue
            result.durations.append(time.monotonic() - started)
            result.compacted += 1 if layers else 0

    async def sampler() -> None:
        while time.monotonic() < deadline:
            if sample is not None:
                sample()
            await asyncio.sleep(1.0)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(sampler(), *(worker(i) for i in range(CLIENTS)))
    return result


async def proxy_metrics(base_url: str) -> dict[str, float]:
    """``compact_proxy_requests_total`` of the messages route, by outcome."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base_url}/metrics") as resp:
            text = await resp.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("compact_proxy_requests_total{") and 'route="messages"' in line:
            found[line.split('outcome="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return found


def test_200_streaming_clients_for_30s_without_errors_and_with_bounded_memory(
    proxy_process: ProxyProcessFactory, upstream_process: Callable[..., ServiceProcess]
) -> None:
    """Every stream of the run completes with ``message_stop``; the provider refused no view;
    the proxy's RSS stays bounded and stops growing; figures are printed."""
    upstream = upstream_process(event_delay_s=EVENT_DELAY_S)
    proxy = proxy_process(upstream.base_url, {"compaction": THRESHOLDS})
    payloads = bodies()
    baseline = asyncio.run(run_load(upstream.base_url, BASELINE_S, [
        p for p in payloads if len(p) < 1000]))
    rss: list[int] = []

    def sample() -> None:
        rss.append(proxy.status("VmRSS"))

    loaded = asyncio.run(run_load(proxy.base_url, LOAD_S, payloads, sample))
    peak = proxy.status("VmHWM")
    counted = asyncio.run(proxy_metrics(proxy.base_url))
    added_p99 = loaded.p(0.99) - baseline.p(0.99)
    third = max(1, len(rss) // 3)
    growth = max(rss[-third:]) - max(rss[:third])
    print(f"\nload: {len(loaded.durations)} streams served in {LOAD_S:.0f}s by {CLIENTS} "
          f"clients ({len(loaded.durations) / LOAD_S:.0f}/s, {loaded.compacted} compacted), "
          f"{len(loaded.errors)} errors; p50 {loaded.p(0.5) * 1000:.0f} ms, "
          f"p99 {loaded.p(0.99) * 1000:.0f} ms vs direct p99 {baseline.p(0.99) * 1000:.0f} ms "
          f"-> p99 added {added_p99 * 1000:.0f} ms; proxy peak RSS {peak / 2**20:.1f} MiB, "
          f"RSS growth first->last third {growth / 2**20:.1f} MiB; metrics {counted}")
    assert loaded.errors == [], loaded.errors[:5]
    assert baseline.errors == []
    assert len(loaded.durations) > 5 * CLIENTS
    assert loaded.compacted > 0
    # Every request the proxy counted was forwarded whole: no refused view, no failure.
    assert counted == {"forwarded": float(len(loaded.durations))}
    assert peak < MAX_PEAK_RSS
    assert growth < MAX_RSS_GROWTH
    assert loaded.p(0.99) < 10.0
