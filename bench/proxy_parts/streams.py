"""Part 6 of ``bench/proxy.py``: a fresh proxy under many concurrent streams:
peak RSS and the relay latency of the provider's events."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import aiohttp

from bench.harness.client import Sample, send
from bench.harness.config import Sizes
from bench.harness.processes import Service
from bench.harness.stats import Dist, read_proc_status
from bench.harness.workloads import history_of_size, request_body, request_headers
from bench.proxy_parts.latency import Targets, _round
from bench.stamped_upstream import DELAY_HEADER

RSS_SAMPLE_S: Final = 0.005


@dataclass(frozen=True)
class StreamReport:
    """Part 3: one burst of concurrent streams through a fresh proxy, and one direct.

    Attributes:
        streams: streams per burst.
        max_open: most streams open at the client at one moment (via the proxy).
        idle_rss_mb: the proxy's VmRSS before the burst.
        peak_rss_mb: its VmHWM after the burst (peak resident memory since it started).
        sampled_peak_rss_mb: the highest VmRSS sampled every few ms during the burst.
        first_event_proxy / first_event_direct: provider's send stamp of the first event
            (``message_start``) to the client receiving it.
        all_events_proxy / all_events_direct: the same for every event of every stream.
        steady_proxy / steady_direct: the events sent after every stream of the burst had
            its first event: the relay alone, no new request arriving meanwhile.
        ttfe_proxy / ttfe_direct: request start to the first body chunk.
        failures: non-200 answers and streams without stamps.
    """

    streams: int
    max_open: int
    idle_rss_mb: float
    peak_rss_mb: float
    sampled_peak_rss_mb: float
    first_event_proxy: Dist
    first_event_direct: Dist
    all_events_proxy: Dist
    all_events_direct: Dist
    steady_proxy: Dist
    steady_direct: Dist
    ttfe_proxy: Dist
    ttfe_direct: Dist
    failures: int

    @property
    def first_event_added_p50(self) -> float:
        """Relay latency of the first event the proxy adds, at the median."""
        return self.first_event_proxy.p50 - self.first_event_direct.p50

    @property
    def first_event_added_p99(self) -> float:
        """Relay latency of the first event the proxy adds, at the 99th percentile."""
        return self.first_event_proxy.p99 - self.first_event_direct.p99


async def _burst(client: aiohttp.ClientSession, base_url: str, body: bytes, sizes: Sizes,
                 tag: str) -> tuple[list[Sample], int]:
    """``sizes.streams`` streams opened over ``sizes.stream_ramp_s``; returns the samples and
    the most streams open at once."""
    open_now = 0
    max_open = 0
    extra = {DELAY_HEADER: f"{sizes.stream_event_delay_ms:g}"}

    async def one(number: int) -> Sample:
        nonlocal open_now, max_open
        await asyncio.sleep(sizes.stream_ramp_s * number / max(1, sizes.streams))
        open_now += 1
        max_open = max(max_open, open_now)
        try:
            headers = request_headers(f"bench-stream-{tag}-{number}", extra)
            return await send(client, base_url, body, headers, stream=True)
        finally:
            open_now -= 1

    samples = await asyncio.gather(*(one(n) for n in range(sizes.streams)))
    return list(samples), max_open


async def measure_streams(client: aiohttp.ClientSession, proxy: Service, upstream_url: str,
                          sizes: Sizes) -> StreamReport:
    """Part 3 against a proxy process that has served nothing else yet."""
    assert proxy.process is not None
    pid = proxy.process.pid
    body = request_body(history_of_size(sizes.small_bytes), stream=True)
    for index in range(3):
        await _round(client, Targets(proxy.url, upstream_url), body, f"bench-stream-warm-{index}",
                     True, index)
    idle = read_proc_status(pid).get("VmRSS", 0)
    direct, _ = await _burst(client, upstream_url, body, sizes, "direct")
    sampled_peak = idle
    done = asyncio.Event()

    async def sample_rss() -> None:
        nonlocal sampled_peak
        while not done.is_set():
            sampled_peak = max(sampled_peak, read_proc_status(pid).get("VmRSS", 0))
            await asyncio.sleep(RSS_SAMPLE_S)

    sampler = asyncio.create_task(sample_rss())
    try:
        via, max_open = await _burst(client, proxy.url, body, sizes, "proxy")
    finally:
        done.set()
        await sampler
    hwm = read_proc_status(pid).get("VmHWM", 0)

    def firsts(samples: Iterable[Sample]) -> list[float]:
        return [s.relay_ms[0] for s in samples if s.relay_ms]

    def every(samples: Iterable[Sample]) -> list[float]:
        return [ms for s in samples for ms in s.relay_ms]

    def steady(samples: list[Sample]) -> list[float]:
        opened = max((s.events[0][1] for s in samples if s.events), default=0)
        return [(received - sent) / 1e6 for s in samples for sent, received in s.events
                if sent > opened]

    failures = sum(1 for s in [*via, *direct] if s.status != 200 or not s.relay_ms)
    return StreamReport(
        sizes.streams, max_open, idle / 1024, hwm / 1024, sampled_peak / 1024,
        Dist.of(firsts(via)), Dist.of(firsts(direct)), Dist.of(every(via)), Dist.of(every(direct)),
        Dist.of(steady(via)), Dist.of(steady(direct)),
        Dist.of([s.first_ms for s in via if s.first_ms is not None]),
        Dist.of([s.first_ms for s in direct if s.first_ms is not None]), failures,
    )


