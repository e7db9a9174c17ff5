"""Where a warm request's CPU goes inside the proxy: thread CPU per stage of the request path.

    python -m bench.stages [--requests 300] [--sizes 50000,800000,2600000] [--pace-ms 20]
                           [--same]

One run starts the fake provider and one ``serve`` process (sticky, tiktoken, the audit log on:
``bench/proxy.py``'s config) whose request-path stages are timed where they run: a wrapper
around each stage adds the thread CPU time (``time.thread_time_ns``) spent inside it. For each
history size a session is compacted once and warmed untimed, then ``--requests`` requests of
the same history grown by one small exchange each are sent one at a time, ``--pace-ms`` apart
(a gap lets the machine's caches go cold as between an agent's calls; 0: back to back); with
``--same``, the same request every time (``bench/proxy.py``'s CPU cell, nothing new in it). It
prints the proxy process's CPU per request (``/proc``) and each stage's share of it; what no
stage covers is aiohttp's server and client, routing, the middleware's log line and metrics,
and the event loop — the part a bare relay (``bench/proxy.py --null-relay``) pays too, plus
this proxy's bookkeeping around it.

Sequential requests only, so a stage's thread time is its own (no other request runs while
it awaits). The wrappers cost a few microseconds per stage; compare stages with each other
and runs with runs, not with ``bench/proxy.py``'s CPU figures. Not a timed test;
``tests/bench/test_bench_smoke.py`` checks its structure at a tiny size.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.harness.client import client_session, send
from bench.harness.config import SESSION_THRESHOLDS, write_proxy_config
from bench.harness.processes import (
    ManagedProcess,
    Service,
    free_port,
    upstream_process,
    wait_until_up,
)
from bench.harness.stats import process_cpu_s, signalled_json
from bench.harness.workloads import history_of_size, request_body, request_headers, tiny_exchange

#: The timed stages: (module, function) as the request path looks them up at call time.
STAGES: Final = (
    ("proxy.http.handlers", "read_body"),
    ("proxy.http.handlers", "parse_request"),
    ("proxy.http.handlers", "load_durable_context"),
    ("proxy.http.handlers", "plan_compaction"),
    ("proxy.http.handlers", "_compact"),
    ("proxy.store.checkpoints", "SessionCheckpoints.load"),
    ("proxy.http.spans", "RequestBody.facts"),
    ("compactor", "compact_context_async"),
    ("proxy.http.handlers", "_outgoing"),
    ("proxy.http.forward", "_send"),
    ("proxy.http.forward", "_relay"),
    ("proxy.http.handlers", "_learn"),
    ("proxy.http.audit", "_keep_in_audit_log"),
)
#: How long the proxy is left to finish a request's tail before its counts are reset or read.
SETTLE_S: Final = 0.2
#: Stages inside another (``_learn`` runs inside ``_relay``, before the answer ends): their
#: time is counted in both.
NESTED: Final = {"SessionCheckpoints.load": "_compact", "RequestBody.facts": "_compact",
                 "compact_context_async": "_compact", "_learn": "_relay"}


def _timed(function: Callable[..., Any], name: str, spent: dict[str, list[int]]) -> Any:
    entry = spent.setdefault(name, [0, 0])
    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time_ns()
            try:
                return await function(*args, **kwargs)
            finally:
                entry[0] += time.thread_time_ns() - started
                entry[1] += 1
        return timed_async

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            entry[0] += time.thread_time_ns() - started
            entry[1] += 1
    return timed


def serve_timed(config: str, out: str) -> None:
    """``serve --config config`` with every stage of :data:`STAGES` timed; SIGUSR1 writes the
    sums so far to ``out`` (JSON ``{stage: [ns, calls]}``), SIGUSR2 sets them to zero."""
    import importlib

    from proxy.cli.commands import main as cli_main

    spent: dict[str, list[int]] = {}
    for module_name, name in STAGES:
        owner: Any = importlib.import_module(module_name)
        *path, attribute = name.split(".")  # a function, or Class.method
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, attribute, _timed(getattr(owner, attribute), name, spent))

    def write(*_: object) -> None:
        Path(out).write_text(json.dumps(spent), encoding="utf-8")

    def reset(*_: object) -> None:
        for entry in spent.values():
            entry[0] = entry[1] = 0

    signal.signal(signal.SIGUSR1, write)
    signal.signal(signal.SIGUSR2, reset)
    cli_main(["serve", "--config", config])


@dataclass(frozen=True)
class SizeResult:
    """One history size: the proxy's CPU per request and each stage's (ms), and the calls."""

    body_bytes: int
    requests: int
    cpu_ms: float
    stages: dict[str, tuple[float, float]]  # stage -> (ms per request, calls per request)


async def measure(sizes: Sequence[int], requests: int, pace_s: float, *,
                  same: bool = False) -> list[SizeResult]:
    """Run the proxy with timed stages and measure each size (see the module)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="compact-proxy-stages-") as tmp:
        work = Path(tmp)
        async with client_session() as client, upstream_process(client, work) as upstream:
            port = free_port()
            config = write_proxy_config(work / "proxy", upstream.url, SESSION_THRESHOLDS,
                                        sticky=True, port=port)
            out = work / "stages.json"
            process = ManagedProcess("stages-proxy", [
                sys.executable, "-m", "bench.stages", "--serve", str(config), str(out)],
                work / "proxy.log")
            process.start()
            try:
                url = f"http://127.0.0.1:{port}"
                await wait_until_up(client, process, f"{url}/healthz")
                service = Service(url, process)
                for size in sizes:
                    results.append(await _one_size(client, service, size, requests, pace_s,
                                                   out, same))
            finally:
                process.stop()
    return results


async def _one_size(client: Any, service: Service, size: int, requests: int, pace_s: float,
                    out: Path, same: bool = False) -> SizeResult:
    pid = service.process.pid
    assert pid is not None
    history = history_of_size(size)
    headers = request_headers(f"stages-{size}")
    for _ in range(4):  # the crossing, then warm-ups, untimed
        history.extend(tiny_exchange(len(history)))
        await send(client, service.url, request_body(history, stream=False), headers,
                   stream=False)
    # The client has an answer before the proxy's relay has returned (and before the audit
    # entry is handed over): let the last untimed request finish before the counts start.
    await asyncio.sleep(SETTLE_S)
    os.kill(pid, signal.SIGUSR2)
    await asyncio.sleep(SETTLE_S)
    before = process_cpu_s(pid)
    body = b""
    for _ in range(requests):
        if not same or not body:
            history.extend(tiny_exchange(len(history)))
            body = request_body(history, stream=False)
        sample = await send(client, service.url, body, headers, stream=False)
        if sample.status != 200:
            raise RuntimeError(f"{size} bytes: HTTP {sample.status}")
        if pace_s:
            await asyncio.sleep(pace_s)
    await asyncio.sleep(SETTLE_S)  # (the same for the last timed request)
    cpu_ms = (process_cpu_s(pid) - before) * 1000 / requests
    spent = await signalled_json(pid, out)
    stages = {name: (ns / 1e6 / requests, calls / requests)
              for name, (ns, calls) in spent.items()}
    return SizeResult(len(body), requests, cpu_ms, stages)


def format_results(results: Sequence[SizeResult], pace_ms: float) -> str:
    """The table: one column per size, a row per stage (ms per request)."""
    lines = [f"Thread CPU per stage of a warm request, ms per request ({results[0].requests} "
             f"sequential requests per size, {pace_ms:g} ms apart)"]
    lines.append(f"   {'stage':<44}" + "".join(f"{r.body_bytes / 1e6:>11.2f} MB"
                                                 for r in results))
    lines.append(f"   {'proxy process (/proc)':<44}" + "".join(f"{r.cpu_ms:>14.3f}"
                                                               for r in results))
    covered = [sum(ms for name, (ms, _) in r.stages.items() if name not in NESTED)
               for r in results]
    for _, name in STAGES:
        label = f"  {name} (in {NESTED[name]})" if name in NESTED else name
        lines.append(f"   {label:<44}" + "".join(f"{r.stages.get(name, (0.0, 0.0))[0]:>14.3f}"
                                                 for r in results))
    lines.append(f"   {'no stage (see the doc)':<44}"
                 + "".join(f"{r.cpu_ms - c:>14.3f}" for r, c in zip(results, covered,
                                                                     strict=True)))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table; ``--serve CONFIG OUT`` is the timed proxy (internal)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--sizes", default="50000,800000,2600000",
                        help="history sizes in bytes, comma separated")
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--same", action="store_true",
                        help="the same request every time (nothing new in it)")
    parser.add_argument("--serve", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve_timed(*args.serve)
        return 0
    sizes = [int(size) for size in args.sizes.split(",")]
    results = asyncio.run(measure(sizes, args.requests, args.pace_ms / 1000, same=args.same))
    print(format_results(results, args.pace_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
