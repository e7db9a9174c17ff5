"""Scaling on one machine: the throughput of ``serve --workers 2`` against ``--workers 1``.

    python -m bench.scale [--quick] [--concurrency 32] [--rounds 6] [--requests 400]
                          [--body-kb 50] [--cold] [--json PATH]

One run starts the stamped fake provider (``bench/stamped_upstream.py``) in its own process
and two proxies (``python -m proxy.cli serve``), one with ``--workers 1`` and one with
``--workers 2``, each on its own SQLite file, with ``token_counter: tiktoken`` and the audit log
on (the defaults a deployment runs). A raw aiohttp client then sends the same request (a
coding agent's history of ``--body-kb`` KB, under the soft threshold: the proxy parses,
counts, looks up the session, forwards and logs, but does not compact) in a closed loop of
``--concurrency`` concurrent requests, ``--requests`` per round to each target, the rounds
interleaved (the order alternates each round), so the load of the machine falls on every
target alike. The provider directly is measured the same way, as the ceiling of this machine
(client and provider share its cores with the proxy).

It prints requests per second of each target, the ratio ``workers 2 / workers 1`` measured in
this one run, the CPU milliseconds per request of each proxy (its processes together), and the
machine's core count and load. Not a timed test; ``tests/bench/test_scale_smoke.py`` checks
its structure at a tiny size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Final

import aiohttp
import yaml

from bench.harness.client import client_session, send
from bench.harness.config import SESSION_THRESHOLDS, BenchError, write_proxy_config
from bench.harness.processes import (
    ManagedProcess,
    Service,
    free_port,
    upstream_process,
    wait_for_workers,
    wait_until_up,
)
from bench.harness.stats import children, machine_ticks, process_cpu_s, tree_cpu_s
from bench.harness.workloads import history_of_size, request_body, request_headers

__all__ = ["QUICK", "TINY", "ScaleResults", "ScaleSizes", "format_report", "main", "run_scale"]

#: The targets, in the order of the first round.
TARGETS: Final = ("workers_1", "workers_2", "direct")
RUN_DEADLINE_S: Final = 900.0


@dataclass(frozen=True)
class ScaleSizes:
    """How much work one run does.

    Attributes:
        concurrency: concurrent requests of the closed loop.
        rounds: rounds; each sends ``requests`` to every target.
        requests: requests per round and target.
        body_bytes: the size of the request body.
        cold: every request in a session of its own, so a body above the soft threshold is
            compacted from scratch each time (no checkpoint to reuse): the proxy's CPU-heavy
            case. Otherwise each client loop keeps one session (warm, as an agent's).
    """

    concurrency: int = 32
    rounds: int = 6
    requests: int = 400
    body_bytes: int = 50_000
    cold: bool = False


QUICK: Final = ScaleSizes(rounds=4, requests=200)
#: For the smoke test: seconds in all.
TINY: Final = ScaleSizes(concurrency=4, rounds=2, requests=8, body_bytes=5_000)


@dataclass(frozen=True)
class ScaleResults:
    """One run's figures.

    Attributes:
        sizes: what was run.
        rps: requests per second of each target (``workers_1``, ``workers_2``, ``direct``),
            over all its rounds.
        round_rps: the same, round by round.
        failures: answers other than 200, by target.
        cpu_ms: CPU milliseconds per request of each proxy's processes (supervisor and
            workers together).
        shared_cpu_ms: by target, CPU milliseconds per request of the client (this process)
            and of the provider's process: the work that shares the machine's cores with the
            proxy.
        machine_busy: by target, the share of the whole machine's CPU time (every core, every
            process: ours and anyone else's) that was busy while it was measured; near 1.0
            the machine, not the proxy, set the rate.
        processes: how many processes served each proxy (the workers; 1 for ``workers_1``).
        layers: the compaction layers the proxy reported for the request (``x-compact-layers``;
            empty: it was under the soft threshold and forwarded as it came).
        cores: the machine's CPU count.
        load_before: the 1-minute load average before the run.
    """

    sizes: ScaleSizes
    rps: dict[str, float]
    round_rps: dict[str, list[float]]
    failures: dict[str, int]
    cpu_ms: dict[str, float]
    shared_cpu_ms: dict[str, dict[str, float]]
    machine_busy: dict[str, float]
    processes: dict[str, int]
    layers: str
    cores: int
    load_before: float

    @property
    def ratio(self) -> float:
        """Throughput of ``--workers 2`` over ``--workers 1``."""
        one = self.rps["workers_1"]
        return self.rps["workers_2"] / one if one else math.nan

    def as_json(self) -> dict[str, object]:
        """Every figure as plain JSON data."""
        return {**asdict(self), "ratio": self.ratio}


@asynccontextmanager
async def _proxy(client: aiohttp.ClientSession, workdir: Path, name: str, upstream_url: str,
                 workers: int) -> AsyncIterator[Service]:
    """``python -m proxy.cli serve --workers N`` as a child process, waited for /healthz."""
    port = free_port()
    path = write_proxy_config(workdir / name, upstream_url, SESSION_THRESHOLDS, sticky=True,
                              port=port)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["logging"]["level"] = "warning"  # one line per request would be the client's work
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    process = ManagedProcess(name, [sys.executable, "-m", "proxy.cli", "serve", "--config",
                                    str(path), "--workers", str(workers)],
                             workdir / f"{name}.log")
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_until_up(client, process, f"{url}/healthz")
        await wait_for_workers(process, workers, name)
        yield Service(url, process)
    finally:
        process.stop()


async def _closed_loop(client: aiohttp.ClientSession, url: str, body: bytes, total: int,
                       concurrency: int, tag: str, *, cold: bool = False) -> tuple[float, int]:
    """``total`` requests, ``concurrency`` at a time (one session per loop, or per request
    when ``cold``); (seconds, failures)."""
    remaining = total
    failures = 0
    run = os.urandom(4).hex()

    async def one_client(number: int) -> None:
        nonlocal remaining, failures
        headers = request_headers(f"bench-scale-{tag}-{number}")
        while remaining > 0:
            remaining -= 1
            if cold:
                headers = request_headers(f"bench-scale-{tag}-{run}-{remaining}")
            sample = await send(client, url, body, headers, stream=False)
            failures += sample.status != 200

    start = time.perf_counter()
    await asyncio.gather(*(one_client(n) for n in range(concurrency)))
    return time.perf_counter() - start, failures


async def run_scale(sizes: ScaleSizes = ScaleSizes(), *,
                    workdir: Path | None = None) -> ScaleResults:
    """Start the provider and both proxies, measure, stop them; the figures."""
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as scratch:
        root = workdir or Path(scratch)
        async with client_session() as client, AsyncExitStack() as stack:
            upstream = await stack.enter_async_context(upstream_process(client, root))
            one = await stack.enter_async_context(
                _proxy(client, root, "workers-1", upstream.url, 1))
            two = await stack.enter_async_context(
                _proxy(client, root, "workers-2", upstream.url, 2))
            urls = {"workers_1": one.url, "workers_2": two.url, "direct": upstream.url}
            pids = {"workers_1": one.process.pid if one.process else 0,
                    "workers_2": two.process.pid if two.process else 0}
            processes = {"workers_1": 1, "workers_2": len(children(pids["workers_2"]))}
            body = request_body(history_of_size(sizes.body_bytes), stream=False)
            probe = await send(client, one.url, body, request_headers("bench-scale-probe"),
                               stream=False)
            if probe.status != 200:
                raise BenchError(f"the request got HTTP {probe.status} through the proxy")
            for name, url in urls.items():  # warm connections, caches and sessions, untimed
                await _closed_loop(client, url, body, 2 * sizes.concurrency,
                                   sizes.concurrency, name)
            seconds = dict.fromkeys(TARGETS, 0.0)
            round_rps: dict[str, list[float]] = {name: [] for name in TARGETS}
            failures = dict.fromkeys(TARGETS, 0)
            cpu = dict.fromkeys(pids, 0.0)
            shared = {name: {"client": 0.0, "provider": 0.0} for name in TARGETS}
            ticks = {name: [0, 0] for name in TARGETS}
            provider_pid = upstream.process.pid if upstream.process else 0
            for number in range(sizes.rounds):
                order = TARGETS[:2] if number % 2 == 0 else TARGETS[1::-1]
                for name in (*order, "direct"):
                    before = tree_cpu_s(pids[name]) if name in pids else 0.0
                    others = (process_cpu_s(None), process_cpu_s(provider_pid))
                    machine = machine_ticks()
                    spent, failed = await _closed_loop(client, urls[name], body,
                                                       sizes.requests, sizes.concurrency, name,
                                                       cold=sizes.cold)
                    if name in pids:
                        cpu[name] += tree_cpu_s(pids[name]) - before
                    busy, total_ticks = machine_ticks()
                    ticks[name][0] += busy - machine[0]
                    ticks[name][1] += total_ticks - machine[1]
                    shared[name]["client"] += process_cpu_s(None) - others[0]
                    shared[name]["provider"] += process_cpu_s(provider_pid) - others[1]
                    seconds[name] += spent
                    failures[name] += failed
                    round_rps[name].append(sizes.requests / spent)
    total = sizes.rounds * sizes.requests
    return ScaleResults(
        sizes=sizes,
        rps={name: total / spent for name, spent in seconds.items()},
        round_rps=round_rps,
        failures=failures,
        cpu_ms={name: spent * 1000.0 / total for name, spent in cpu.items()},
        shared_cpu_ms={name: {who: spent * 1000.0 / total for who, spent in used.items()}
                       for name, used in shared.items()},
        machine_busy={name: busy / total if total else math.nan
                      for name, (busy, total) in ticks.items()},
        processes=processes,
        layers=probe.headers.get("x-compact-layers", ""),
        cores=os.cpu_count() or 0,
        load_before=load_before,
    )


def format_report(results: ScaleResults) -> str:
    """The figures as text."""
    s = results.sizes
    lines = [
        f"Scaling on one machine ({results.cores} cores, load {results.load_before:.2f} "
        f"before the run): {s.rounds} interleaved rounds x {s.requests} requests per target, "
        f"concurrency {s.concurrency}, a {s.body_bytes // 1000} KB request ("
        + (f"compacted: {results.layers}" if results.layers else "under the soft threshold")
        + (", a new session every request)" if s.cold else ", one session per client loop)"),
        "",
        f"{'target':<22}{'req/s':>9}{'per round':>32}{'failures':>9}"
        f"{'CPU ms/req: proxy':>19}{'client':>8}{'provider':>10}{'machine busy':>14}",
    ]
    labels = {"workers_1": "serve --workers 1", "workers_2": "serve --workers 2",
              "direct": "provider directly"}
    for name in TARGETS:
        rounds = " ".join(f"{value:.0f}" for value in results.round_rps[name])
        cpu = f"{results.cpu_ms[name]:.2f}" if name in results.cpu_ms else "-"
        shared = results.shared_cpu_ms[name]
        lines.append(f"{labels[name]:<22}{results.rps[name]:>9.1f}{rounds:>32}"
                     f"{results.failures[name]:>9}{cpu:>19}{shared['client']:>8.2f}"
                     f"{shared['provider']:>10.2f}{results.machine_busy[name]:>14.0%}")
    lines += ["", f"throughput ratio, --workers 2 / --workers 1: {results.ratio:.2f}x "
                  f"({results.processes['workers_2']} worker processes)"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its report; exit code 0 (1 when it could not run)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = ScaleSizes()
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--requests", type=int, default=defaults.requests,
                        help="requests per round and target")
    parser.add_argument("--body-kb", type=int, default=defaults.body_bytes // 1000)
    parser.add_argument("--cold", action="store_true",
                        help="a new session every request (compaction from scratch each time)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.rounds} rounds of {QUICK.requests} requests")
    parser.add_argument("--json", metavar="PATH", help="also write the figures there")
    args = parser.parse_args(argv)
    sizes = ScaleSizes(concurrency=args.concurrency, rounds=args.rounds, requests=args.requests,
                       body_bytes=args.body_kb * 1000, cold=args.cold)
    if args.quick:
        sizes = replace(sizes, rounds=QUICK.rounds, requests=QUICK.requests)
    # SIGTERM ends the run like Ctrl-C: every context manager stops its process on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        results = asyncio.run(asyncio.wait_for(run_scale(sizes), RUN_DEADLINE_S))
    except KeyboardInterrupt:
        print("interrupted; child processes stopped", file=sys.stderr)
        return 130
    except (TimeoutError, BenchError, aiohttp.ClientError, OSError) as exc:
        print(f"benchmark failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        ManagedProcess.stop_all()
    print(format_report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results.as_json(), indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
