"""Part 4 of ``bench/proxy.py``: requests per second at a fixed concurrency
against every hop, and the CPU each hop spent per request."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import aiohttp

from bench.harness.client import send
from bench.harness.config import Sizes
from bench.harness.stats import process_cpu_s
from bench.harness.workloads import history_of_size, request_body, request_headers
from bench.proxy_parts.latency import Targets


@dataclass(frozen=True)
class Throughput:
    """Requests per second at one concurrency for each target, and where the CPU went.

    Attributes:
        concurrency: concurrent client workers.
        requests: requests per target.
        rps: requests per second by target (``proxy``, ``direct``, ``relay``).
        cpu_ms: by target, CPU milliseconds (user + system) per request of each process
            involved (``client``, ``proxy`` or ``relay``, ``provider``). Client, hop and
            provider share the machine's cores, so a hop's own CPU per request bounds what it
            can keep of the direct throughput.
        failures: answers other than 200.
    """

    concurrency: int
    requests: int
    rps: dict[str, float]
    cpu_ms: dict[str, dict[str, float]]
    failures: int

    @property
    def direct_rps(self) -> float:
        """Requests per second straight to the provider."""
        return self.rps["direct"]

    @property
    def proxy_rps(self) -> float:
        """Requests per second through compact-proxy."""
        return self.rps["proxy"]

    @property
    def ratio(self) -> float:
        """Proxy throughput as a share of direct."""
        return self.proxy_rps / self.direct_rps if self.direct_rps else math.nan

    @property
    def proxy_vs_relay(self) -> float:
        """Proxy throughput as a share of the bare relay's (NaN when not measured)."""
        relay = self.rps.get("relay")
        return self.proxy_rps / relay if relay else math.nan

    @property
    def relay_ratio(self) -> float:
        """The bare relay's throughput as a share of direct (NaN when not measured)."""
        relay = self.rps.get("relay")
        return relay / self.direct_rps if relay is not None and self.direct_rps else math.nan


async def _closed_loop(client: aiohttp.ClientSession, base_url: str, body: bytes, total: int,
                       concurrency: int, tag: str) -> tuple[float, int]:
    """``total`` requests by ``concurrency`` workers; returns (seconds, failures)."""
    remaining = total
    failures = 0

    async def worker(number: int) -> None:
        nonlocal remaining, failures
        headers = request_headers(f"bench-tput-{tag}-{number}")
        while remaining > 0:
            remaining -= 1
            sample = await send(client, base_url, body, headers, stream=False)
            failures += sample.status != 200

    start = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    return time.perf_counter() - start, failures



async def measure_throughput(client: aiohttp.ClientSession, targets: Targets,
                             pids: dict[str, int], sizes: Sizes) -> Throughput:
    """Part 2: the small request at ``sizes.concurrency`` against every target, in two
    rounds with the order reversed, so drift hits all alike.

    ``pids`` maps ``proxy``, ``relay``, ``provider`` and any extra target (``litellm``) to
    their process ids.
    """
    body = request_body(history_of_size(sizes.small_bytes), stream=False)
    half = max(1, sizes.throughput_requests // 2)
    named = dict(targets.rotation(0))
    for name, url in named.items():
        await _closed_loop(client, url, body, sizes.concurrency, sizes.concurrency, f"warm-{name}")
    involved = {name: ("client", "provider") if name == "direct" else ("client", name, "provider")
                for name in named}
    processes: dict[str, int | None] = {"client": None, **pids}
    seconds = dict.fromkeys(named, 0.0)
    cpu = {(target, who): 0.0 for target in named for who in processes}
    failures = 0
    order = list(named)
    for rounds in (order, order[::-1]):
        for target in rounds:
            before = {who: process_cpu_s(pid) for who, pid in processes.items()}
            spent, failed = await _closed_loop(client, named[target], body, half,
                                               sizes.concurrency, target)
            for who, pid in processes.items():
                cpu[target, who] += process_cpu_s(pid) - before[who]
            seconds[target] += spent
            failures += failed
    total = 2 * half
    return Throughput(
        sizes.concurrency, total,
        {target: total / spent for target, spent in seconds.items()},
        {target: {who: cpu[target, who] * 1000.0 / total for who in involved[target]}
         for target in named},
        failures,
    )


# -- part 3: many streams: memory and relay -----------------------------------------------------
