"""Instructions per request, counted by valgrind: the bare relay, the proxy, a git ref's proxy.

    python -m bench.instructions [--requests 300] [--size 50000] [--baseline REF] [--audit]

CPU time on a shared machine moves by 5-10% from one run to the next, more than most
changes to the hot path save; bytecode steps (``bench.steps``) are exact but miss what runs
in C (msgspec, xxhash, SQLite, aiohttp's parsers) and weigh every step alike. Here each
process runs under ``valgrind --tool=callgrind`` with its counting off; after ``WARMUP``
requests it is turned on (``callgrind_control -i on``) for ``--requests`` requests of the CPU
cell (the same ``--size`` request under the threshold, ``bench/proxy.py``'s config) and the
count dumped: every user-space instruction of the process, its threads included, per
request. Two runs give the same figures within a few tenths of a percent — with the audit log
off (the default here): its batches are written by the clock
(``proxy.store.audit_batches.AUDIT_LINGER_S``), and under valgrind's slowness a batch
holds far fewer requests than at full speed, so with ``--audit`` its commits weigh more than
they do in production and move from run to run.

What it cannot see: the kernel (system calls, the loopback), and the caches — a proxy whose
footprint evicts aiohttp's code runs the same instructions slower. A change is judged here
first, then confirmed in CPU time (``bench.features --block``, ``bench/proxy.py``). Needs
valgrind (``apt-get install valgrind``). Not a timed test; ``tests/bench/
test_instructions_smoke.py`` checks its structure when valgrind is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.harness.client import client_session, send
from bench.harness.config import ROOT, SESSION_THRESHOLDS, write_proxy_config
from bench.harness.processes import (
    ManagedProcess,
    baseline_worktree,
    free_port,
    upstream_process,
    wait_until_up,
)
from bench.harness.workloads import history_of_size, request_body, request_headers

#: Requests per process before the count starts (connections, caches, the session).
WARMUP: Final = 30
#: How long a process under valgrind may take to answer /healthz (seconds).
STARTUP_TIMEOUT_S: Final = 300.0
#: Left to each process to finish a request's tail before the count is dumped (seconds).
SETTLE_S: Final = 1.0


@dataclass(frozen=True)
class Instructions:
    """Instructions per request of each process, in the order measured (``relay`` first)."""

    body_bytes: int
    requests: int
    per_request: dict[str, float]

    def ratio(self, name: str) -> float:
        """A process's instructions per request over the relay's."""
        return self.per_request[name] / self.per_request["relay"]


@asynccontextmanager
async def _counted(work: Path, name: str, argv: list[str],
                   source: Path) -> AsyncIterator[tuple[ManagedProcess, Path]]:
    """``argv`` under callgrind, counting off; the process and its dump files' stem."""
    out = work / f"callgrind.{name}"
    process = ManagedProcess(name, ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                    f"--callgrind-out-file={out}.%p", *argv],
                             work / f"{name}.log", source=source)
    process.start()
    try:
        yield process, out
    finally:
        process.stop()


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=60)


def _dumped_total(out: Path, pid: int) -> int:
    """The ``totals:`` of the process's first dump (``<out>.<pid>.1``)."""
    for line in Path(f"{out}.{pid}.1").read_text(encoding="utf-8").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}.{pid}.1")


async def measure(size: int, requests: int, *, baseline: str | None = None,
                  audit: bool = False) -> Instructions:
    """Count each process's instructions over ``requests`` requests of ``size`` bytes."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="compact-proxy-instructions-") as tmp, \
            (baseline_worktree(baseline, Path(tmp) / "baseline") if baseline is not None
             else nullcontext()) as baseline_source:
        work = Path(tmp)
        async with client_session() as client, AsyncExitStack() as stack:
            upstream = await stack.enter_async_context(upstream_process(client, work))
            port = free_port()
            targets = [("relay", [sys.executable, "-m", "bench.proxy", "--null-relay",
                                  str(port), upstream.url], ROOT, port)]
            port = free_port()  # the same relay on uvloop, the proxy's default loop
            targets.append(("relay on uvloop", [sys.executable, "-m", "bench.proxy",
                                                "--null-relay", str(port), upstream.url,
                                                "--relay-loop", "uvloop"], ROOT, port))
            sources = [("proxy", ROOT)]
            if baseline_source is not None:
                sources.append((f"baseline {baseline}", baseline_source))
            for name, source in sources:
                port = free_port()
                config = write_proxy_config(work / name.replace(" ", "-"), upstream.url,
                                            SESSION_THRESHOLDS, sticky=True, port=port,
                                            audit=audit)
                targets.append((name, [sys.executable, "-m", "proxy.cli", "serve", "--config",
                                       str(config)], source, port))
            body = request_body(history_of_size(size), stream=False)
            headers = request_headers("bench-instructions")
            # Every process starts and warms up at once (counting is off until it is turned
            # on, and each process counts only its own instructions); then one at a time.
            running = [await stack.enter_async_context(_counted(work, f"p{index}", argv, source))
                       for index, (_, argv, source, _) in enumerate(targets)]
            urls = [f"http://127.0.0.1:{port}" for *_, port in targets]

            async def warm(process: ManagedProcess, url: str) -> None:
                await wait_until_up(client, process, f"{url}/healthz",
                                    timeout_s=STARTUP_TIMEOUT_S)
                for _ in range(WARMUP):
                    await send(client, url, body, headers, stream=False)

            await asyncio.gather(*(warm(process, url)
                                   for (process, _), url in zip(running, urls, strict=True)))
            counts: dict[str, float] = {}
            for (name, *_), (process, out), url in zip(targets, running, urls, strict=True):
                await asyncio.sleep(SETTLE_S)
                _control("-i", "on", str(process.pid))
                for _ in range(requests):
                    sample = await send(client, url, body, headers, stream=False)
                    if sample.status != 200:
                        raise RuntimeError(f"{name}: HTTP {sample.status}")
                await asyncio.sleep(SETTLE_S)
                _control("-d", str(process.pid))
                await asyncio.sleep(SETTLE_S)
                counts[name] = _dumped_total(out, process.pid) / requests
    return Instructions(len(body), requests, counts)


def format_instructions(found: Instructions, audit: bool) -> str:
    """The table: a row per process, instructions per request, ratio to the relay."""
    lines = [f"Instructions per request (valgrind), {found.body_bytes / 1000:.0f} KB under the "
             f"threshold, {found.requests} requests per process, audit log "
             f"{'on' if audit else 'off'}",
             f"   {'process':<26}{'instructions':>14}{'x relay':>10}"]
    for name, count in found.per_request.items():
        lines.append(f"   {name:<26}{count:>14,.0f}{found.ratio(name):>10.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--size", type=int, default=50_000, help="history size in bytes")
    parser.add_argument("--baseline", metavar="REF",
                        help="also the proxy of this git ref (a temporary worktree)")
    parser.add_argument("--audit", action="store_true",
                        help="the audit log on (its clock-driven batches move the count)")
    args = parser.parse_args(argv)
    found = asyncio.run(measure(args.size, args.requests, baseline=args.baseline,
                                audit=args.audit))
    print(format_instructions(found, args.audit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
