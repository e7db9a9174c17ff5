"""What a hostile caller costs the proxy: memory kept for refused bodies, and event-loop lag.

    python -m bench.hostile [--bodies 100] [--concurrency 4] [--cache-mib 64]
                            [--baseline REF] [--quick]

Two parts, each against ``compact-proxy serve`` in a child process and the stamped fake
provider (issue #31):

- **memory**: eight accepted 3 MB agent sessions first (the steady state), then
  ``--bodies`` bodies, each one user message of ``--blocks`` tiny text blocks
  (250k: 8 MB, over ``limits.max_json_objects``; 150k: 4.5 MB, decoded, then refused at the
  hard limit), a new session id and a made-up key each, sent ``--concurrency`` at a time.
  Prints the proxy's RSS fresh, in the steady state, its peak while the hostile bodies are
  sent, and after them, with ``limits.decoded_cache_bytes`` at ``--cache-mib``.
- **loop lag**: ``/healthz`` asked every 10 ms while eight cold 9 MB agent sessions, one
  29 MB one and one body of 150k tiny blocks are compacted concurrently; prints its latency
  percentiles.

With ``--baseline REF`` the same runs for a git ref (its own worktree) in the same run, and
both are printed side by side. Not a timed test: ``tests/bench/test_hostile_smoke.py`` runs
it at a tiny size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import aiohttp

from bench.harness.client import client_session
from bench.harness.config import BENCH_API_KEY, ROOT, Thresholds
from bench.harness.processes import baseline_worktree, proxy_process, upstream_process
from bench.harness.stats import percentile, read_proc_status
from bench.harness.workloads import history_of_size, request_body

MODEL: Final = "claude-sonnet-4-5"
#: A view over this many tokens is refused by the proxy (the hostile bodies all are).
THRESHOLDS: Final = Thresholds(soft_threshold_tokens=40_000, hard_limit_tokens=100_000,
                               max_tool_result_tokens=2_000, keep_recent_messages=8,
                               summary_keep_recent=4)


@dataclass(frozen=True)
class Size:
    """How much hostile work each part sends."""

    bodies: int
    blocks: int
    concurrency: int
    lag_bodies: int
    warm_sessions: int  # accepted sessions served before the hostile bodies
    warm_bytes: int  # the size of each
    lag_blocks: int  # bytes of each cold agent session
    lag_big_blocks: int  # bytes of the big one


FULL: Final = Size(bodies=100, blocks=150_000, concurrency=4, lag_bodies=8, warm_sessions=8,
                   warm_bytes=3_000_000, lag_blocks=9_000_000, lag_big_blocks=29_000_000)
TINY: Final = Size(bodies=4, blocks=2_000, concurrency=2, lag_bodies=2, warm_sessions=1,
                   warm_bytes=60_000, lag_blocks=60_000, lag_big_blocks=120_000)


def tiny_blocks_body(blocks: int, salt: str) -> bytes:
    """One user message of ``blocks`` two-character text blocks (each body's own texts)."""
    block = '{"type":"text","text":"%s"}'
    texts = ",".join(block % f"{salt[i % len(salt)]}{i % 10}" for i in range(blocks))
    return (f'{{"model":"{MODEL}","max_tokens":64,"messages":'
            f'[{{"role":"user","content":[{texts}]}}]}}').encode()


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid``, in bytes."""
    return read_proc_status(pid).get("VmRSS", 0) * 1024


async def _send(client: aiohttp.ClientSession, url: str, body: bytes,
                key: str | None = None) -> int:
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01",
               "x-api-key": key or f"sk-made-up-{uuid.uuid4().hex}",
               "x-compact-session-id": f"hostile-{uuid.uuid4().hex}"}
    async with client.post(f"{url}/v1/messages", data=body, headers=headers,
                           timeout=aiohttp.ClientTimeout(total=600)) as response:
        await response.read()
        return response.status


@dataclass(frozen=True)
class Memory:
    """The proxy's RSS (MB) around the hostile bodies, and the statuses they got."""

    fresh_mb: float
    before_mb: float
    peak_mb: float
    after_mb: float
    statuses: dict[int, int]
    blocks: int


async def measure_memory(client: aiohttp.ClientSession, url: str, pid: int,
                         size: Size) -> Memory:
    """Serve some callers' real sessions first (the steady state), then send the hostile
    bodies; sample RSS every 20 ms meanwhile."""
    fresh = rss_bytes(pid)
    for seed in range(size.warm_sessions):  # accepted: compacted, forwarded, answered 200
        body = request_body(history_of_size(size.warm_bytes, seed=100 + seed), stream=False)
        status = await _send(client, url, body, key=BENCH_API_KEY)
        if status != 200:
            raise RuntimeError(f"a warm-up session got {status}")
    await asyncio.sleep(1.0)
    before = rss_bytes(pid)
    peak = before
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    statuses: dict[int, int] = {}
    queue = list(range(size.bodies))

    async def worker() -> None:
        while queue:
            index = queue.pop()
            status = await _send(client, url, tiny_blocks_body(size.blocks, uuid.uuid4().hex))
            statuses[status] = statuses.get(status, 0) + 1
            del index

    await asyncio.gather(*(worker() for _ in range(size.concurrency)))
    await asyncio.sleep(1.0)  # what is freed after the last answer
    done.set()
    await sampler
    mb = 1024 * 1024
    return Memory(fresh / mb, before / mb, peak / mb, rss_bytes(pid) / mb, statuses, size.blocks)


@dataclass(frozen=True)
class Lag:
    """``/healthz`` latency (ms) while the cold bodies were compacted."""

    p50_ms: float
    p99_ms: float
    max_ms: float
    samples: int
    busy_s: float


async def measure_lag(client: aiohttp.ClientSession, url: str, size: Size) -> Lag:
    """Ask ``/healthz`` every 10 ms while the cold bodies are sent at once."""
    bodies = [request_body(history_of_size(size.lag_blocks, seed=seed), stream=False)
              for seed in range(size.lag_bodies)]
    bodies.append(request_body(history_of_size(size.lag_big_blocks, seed=99), stream=False))
    bodies.append(tiny_blocks_body(size.blocks, uuid.uuid4().hex))
    latencies: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        async with aiohttp.ClientSession() as own:  # a connection of its own
            while not done.is_set():
                started = time.perf_counter()
                async with own.get(f"{url}/healthz") as response:
                    await response.read()
                latencies.append((time.perf_counter() - started) * 1000)
                await asyncio.sleep(0.01)

    prober = asyncio.create_task(probe())
    await asyncio.sleep(0.2)
    started = time.perf_counter()
    await asyncio.gather(*(_send(client, url, body) for body in bodies))
    busy = time.perf_counter() - started
    done.set()
    await prober
    return Lag(percentile(latencies, 50), percentile(latencies, 99), max(latencies),
               len(latencies), busy)


async def run_one(workdir: Path, name: str, source: Path, size: Size,
                  cache_mib: int) -> tuple[Memory, Lag]:
    """Both parts against one proxy built from ``source``."""
    async with client_session() as client, upstream_process(client, workdir) as upstream:
        overrides = {"limits": {"decoded_cache_bytes": cache_mib * 1024 * 1024}}
        async with proxy_process(client, workdir, name, upstream.url, THRESHOLDS, sticky=True,
                                 source=source, overrides=overrides) as proxy:
            assert proxy.process is not None
            memory = await measure_memory(client, proxy.url, proxy.process.pid, size)
        async with proxy_process(client, workdir, f"{name}-lag", upstream.url, THRESHOLDS,
                                 sticky=True, source=source, overrides=overrides) as proxy:
            lag = await measure_lag(client, proxy.url, size)
    return memory, lag


def render(rows: Sequence[tuple[str, Memory, Lag]], cache_mib: int) -> str:
    """The results side by side."""
    lines = [f"hostile bodies with limits.decoded_cache_bytes = {cache_mib} MiB"
             f" ({rows[0][1].blocks} blocks each)" if rows else "",
             f"{'build':<22}{'RSS fresh':>10}{'steady':>9}{'peak':>9}{'after':>9}  statuses",
             ]
    for name, memory, _ in rows:
        lines.append(f"{name:<22}{memory.fresh_mb:>8.0f}MB{memory.before_mb:>7.0f}MB"
                     f"{memory.peak_mb:>7.0f}MB{memory.after_mb:>7.0f}MB  "
                     f"{json.dumps(memory.statuses)}")
    lines.append("")
    lines.append(f"{'build':<22}{'/healthz p50':>13}{'p99':>9}{'max':>9}{'samples':>9}"
                 f"{'bodies took':>13}")
    for name, _, lag in rows:
        lines.append(f"{name:<22}{lag.p50_ms:>11.1f}ms{lag.p99_ms:>7.1f}ms{lag.max_ms:>7.1f}ms"
                     f"{lag.samples:>9}{lag.busy_s:>12.1f}s")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> str:
    size = TINY if args.tiny else FULL
    size = replace(size, bodies=args.bodies or size.bodies, blocks=args.blocks or size.blocks,
                   concurrency=args.concurrency or size.concurrency)
    rows: list[tuple[str, Memory, Lag]] = []
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        workdir = Path(tmp)
        memory, lag = await run_one(workdir, "proxy", ROOT, size, args.cache_mib)
        rows.append(("this tree", memory, lag))
        if args.baseline:
            with baseline_worktree(args.baseline, workdir / "baseline") as source:
                memory, lag = await run_one(workdir, "baseline", source, size, args.cache_mib)
            rows.append((f"baseline {args.baseline}", memory, lag))
    return render(rows, args.cache_mib)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=None)
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--baseline", default=None, help="a git ref to run side by side")
    parser.add_argument("--tiny", action="store_true", help="seconds in all (the smoke test)")
    args = parser.parse_args(argv)
    print(asyncio.run(main_async(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
