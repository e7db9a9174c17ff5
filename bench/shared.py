"""What sharing the store costs a request: CPU per request of each way to run the proxy.

    python -m bench.shared [--requests 300] [--rounds 5] [--size 50000] [--baseline REF]

One run starts the stamped fake provider, the bare relay, a ``redis-server`` on a free
loopback port and, for the code in this tree (and for git ref ``REF`` with ``--baseline``):

- ``sqlite``: one process on its own SQLite file (nothing shared: no store call a request);
- ``sqlite workers``: ``listen.workers: 2`` on one file (the versions read and the
  calibration save of every request; CPU of the supervisor and its workers);
- ``redis``: one process on the Redis server;
- ``redis round robin``: two processes on it, the session's requests alternating between
  them (each request finds the calibration the other one wrote).

The same request of ``--size`` bytes under the threshold goes to each setup in turn, one
request at a time, ``--requests`` per round; the order of the setups rotates each round. It
prints each setup's CPU per request over the relay's: the median over the rounds, and their
range (one round disturbed by the machine moves the median little). Each setup has a
session and a Redis database of its own. Not a timed test;
``tests/bench/test_shared_smoke.py`` checks its structure at a tiny size.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp

from bench.harness.client import client_session, send
from bench.harness.config import ROOT, SESSION_THRESHOLDS
from bench.harness.processes import (
    Service,
    baseline_worktree,
    proxy_process,
    upstream_process,
    wait_for_workers,
)
from bench.harness.relay import relay_process
from bench.harness.stats import tree_cpu_s
from bench.harness.workloads import history_of_size, request_body, request_headers
from tests.redis_server import RedisServer

#: Each setup: its name and the processes it runs (each a config change), whose requests
#: alternate.
SETUPS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("sqlite", ("sqlite",)),
    ("sqlite workers", ("workers",)),
    ("redis", ("redis",)),
    ("redis round robin", ("redis", "redis")),
)
#: The worker processes of the ``sqlite workers`` setup.
WORKERS: Final = 2
#: Requests to each setup before the count starts (connections, caches, the session).
WARMUP: Final = 20
#: Left to every process to finish a request's tail before its CPU is read (seconds).
SETTLE_S: Final = 0.5


@dataclass(frozen=True)
class SharedCosts:
    """Each setup's CPU per request over the relay's, per round (``ratios``), and the
    relay's own CPU per request (ms, median of the rounds)."""

    body_bytes: int
    requests: int
    relay_ms: float
    ratios: Mapping[str, Sequence[float]]

    def median(self, name: str) -> float:
        """The setup's median ratio over the rounds."""
        return statistics.median(self.ratios[name])


def _change(kind: str, redis_url: str) -> dict[str, Any]:
    if kind == "workers":
        return {"listen": {"workers": WORKERS}}
    if kind == "redis":
        return {"store": {"backend": "redis", "url": redis_url}}
    return {}


async def measure(size: int, requests: int, rounds: int,
                  baseline: str | None = None) -> SharedCosts:
    """Run every setup (and the baseline's) and time them in rotated rounds (the module)."""
    with tempfile.TemporaryDirectory(prefix="compact-proxy-shared-") as tmp, \
            (baseline_worktree(baseline, Path(tmp) / "baseline") if baseline is not None
             else nullcontext()) as baseline_source:
        work = Path(tmp)
        redis = RedisServer()
        redis.start()
        try:
            async with client_session() as client, AsyncExitStack() as stack:
                upstream = await stack.enter_async_context(upstream_process(client, work))
                setups: dict[str, list[Service]] = {"relay": [await stack.enter_async_context(
                    relay_process(client, work, upstream.url))]}
                sources = [("", ROOT)] + ([("baseline ", baseline_source)]
                                           if baseline_source is not None else [])
                for prefix, source in sources:
                    for name, kinds in SETUPS:
                        label = prefix + name
                        # A Redis database of its own for each setup (16 by default).
                        url = f"{redis.url.rsplit('/', 1)[0]}/{len(setups)}"
                        setups[label] = [await stack.enter_async_context(proxy_process(
                            client, work, f"{label}-{index}".replace(" ", "-"), upstream.url,
                            SESSION_THRESHOLDS, sticky=True, overrides=_change(kind, url),
                            source=source)) for index, kind in enumerate(kinds)]
                        for service, kind in zip(setups[label], kinds, strict=True):
                            if kind == "workers" and service.process is not None:
                                # (every worker's CPU counted from the first round on)
                                await wait_for_workers(service.process, WORKERS, label)
                return await _rounds(client, setups, size, requests, rounds)
        finally:
            redis.stop()


async def _rounds(client: aiohttp.ClientSession, setups: dict[str, list[Service]], size: int,
                  requests: int, rounds: int) -> SharedCosts:
    body = request_body(history_of_size(size), stream=False)
    sent = dict.fromkeys(setups, 0)

    async def one(name: str) -> None:
        processes = setups[name]
        service = processes[sent[name] % len(processes)]
        sent[name] += 1
        session = "bench-shared-" + name.replace(" ", "-")
        sample = await send(client, service.url, body, request_headers(session), stream=False)
        if sample.status != 200:
            raise RuntimeError(f"{name}: HTTP {sample.status}")

    def cpu_s(name: str) -> float:
        return sum(tree_cpu_s(service.process.pid) for service in setups[name]
                   if service.process is not None)

    for name in setups:
        for _ in range(WARMUP):
            await one(name)
    names = list(setups)
    ratios: dict[str, list[float]] = {name: [] for name in names if name != "relay"}
    relay: list[float] = []
    for index in range(rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        await asyncio.sleep(SETTLE_S)
        before = {name: cpu_s(name) for name in names}
        for _ in range(requests):
            for name in order:
                await one(name)
        await asyncio.sleep(SETTLE_S)
        ms = {name: (cpu_s(name) - before[name]) * 1000 / requests for name in names}
        relay.append(ms["relay"])
        for name in ratios:
            ratios[name].append(ms[name] / ms["relay"])
    return SharedCosts(len(body), requests, statistics.median(relay), ratios)


def format_costs(costs: SharedCosts) -> str:
    """The table: each setup's median ratio and the range of its rounds."""
    rounds = len(next(iter(costs.ratios.values())))
    lines = [f"CPU per request over the bare relay's, {costs.body_bytes / 1000:.0f} KB under "
             f"the threshold ({rounds} rounds of {costs.requests}, the order rotating; the "
             f"relay {costs.relay_ms:.3f} ms)",
             f"   {'setup':<32}{'median':>8}{'rounds':>16}"]
    for name, ratios in costs.ratios.items():
        lines.append(f"   {name:<32}{costs.median(name):>7.2f}x"
                     f"{min(ratios):>9.2f}-{max(ratios):.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=50_000, help="history size in bytes")
    parser.add_argument("--baseline", metavar="REF", help="also the proxy of this git ref")
    args = parser.parse_args(argv)
    print(format_costs(asyncio.run(measure(args.size, args.requests, args.rounds,
                                           args.baseline))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
