"""Python steps per request: bytecode instructions the bare relay and the proxy execute.

    python -m bench.steps [--requests 40] [--size 50000] [--grow] [--stream] [--top 40]
                          [--loop uvloop|asyncio]

A count, not a timing: the same code and requests give (nearly) the same figures on a busy
machine or a quiet one, so a change of a few percent shows, where CPU times on this 2-core box
swing by more than that from run to run. One run starts the fake provider, the bare relay
(``bench/proxy.py --null-relay``) and one ``serve`` process (``bench/proxy.py``'s config:
sticky, tiktoken, the audit log on), each with a tracer that counts every bytecode instruction
its event-loop thread executes (``sys.settrace`` with ``f_trace_opcodes``) while it is on. Each
process is warmed untimed, then ``--requests`` requests of ``--size`` bytes are sent one at a
time with the tracer on: the same request every time (``bench/proxy.py``'s CPU cell), or with
``--grow`` a history grown by one small exchange per request (a warm agent session); with
``--stream`` streamed, as Claude Code sends every request. Both processes run on the event
loop ``--loop`` (default uvloop, the proxy's default): asyncio's own loop runs its iterations in
Python steps, uvloop's in C. It prints the steps per request of each process, by package, and
the proxy's busiest functions.

Steps are not all alike: a step of a list comprehension over slotted objects (specialised by
the interpreter) costs a fraction of a call's, and work in C (the JSON decoder, hashing,
sockets) is not a step at all (``valgrind --tool=callgrind`` counts machine instructions for
that). Compare a change's steps with its CPU time before calling it a saving. Not a timed
test; ``tests/bench/test_steps_smoke.py`` checks its structure at a tiny size.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
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
from bench.harness.stats import signalled_json
from bench.harness.workloads import history_of_size, request_body, request_headers, tiny_exchange
from proxy.config import EventLoopName

#: Untimed requests per process before the count starts (connections, caches, the session).
WARMUP: Final = 20
#: How long a process is left to finish a request's tail before the tracer is turned on or off.
SETTLE_S: Final = 1.5
_ROOT: Final = str(Path(__file__).resolve().parent.parent)


def _traced(serve: Any, out: str) -> None:
    """Run ``serve()`` with a bytecode counter: SIGUSR2 turns it on (from zero), SIGUSR1 off
    and writes the counts to ``out`` (JSON ``[[file, function, steps], ...]``)."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    # A generated method (a dataclass's __init__: file "<string>") is named by its class.
    labels: dict[CodeType, str] = {}

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            code = frame.f_code
            if code.co_filename == "<string>" and code not in labels:
                owner = frame.f_locals.get("self")
                labels[code] = (f"{type(owner).__name__}.{code.co_name}" if owner is not None
                                else code.co_name)
        elif event == "opcode":
            code = frame.f_code
            counts[code.co_filename, labels.get(code) or code.co_name] += 1
        return tracer

    def on(signum: int, frame: FrameType | None) -> None:
        counts.clear()
        sys.settrace(tracer)
        threading.settrace(tracer)
        while frame is not None:  # the frames running now (the event loop) count too
            frame.f_trace = tracer
            frame.f_trace_opcodes = True
            frame = frame.f_back

    def off(signum: int, frame: FrameType | None) -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]  # (None turns it off)
        rows = [[path, name, steps] for (path, name), steps in counts.items()]
        Path(out).write_text(json.dumps(rows), encoding="utf-8")

    signal.signal(signal.SIGUSR2, on)
    signal.signal(signal.SIGUSR1, off)
    serve()


def _package(path: str) -> str:
    """``proxy``, ``aiohttp``, ``asyncio``...: the package (or stdlib module) of a file."""
    path = path.replace("\\", "/")
    for marker in ("/site-packages/", _ROOT + "/", "/lib/python3"):
        if marker in path:
            rest = path.split(marker, 1)[1]
            if marker == "/lib/python3":
                rest = rest.split("/", 1)[1] if "/" in rest else rest
            return rest.split("/", 1)[0].removesuffix(".py")
    return path


def _function(path: str, name: str) -> str:
    path = path.replace("\\", "/")
    for marker in ("/site-packages/", _ROOT + "/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3":
                path = path.split("/", 1)[-1]
            break
    return f"{path}:{name}"


@dataclass(frozen=True)
class Steps:
    """One process's bytecode instructions per request, by package and by function."""

    requests: int
    total: float
    packages: dict[str, float]
    functions: dict[str, float]


async def _count(client: Any, service: Service, out: Path, bodies: Sequence[bytes],
                 session: str, *, stream: bool = False) -> Steps:
    pid = service.process.pid
    assert pid is not None
    headers = request_headers(session)
    for body in bodies[:WARMUP]:
        await send(client, service.url, body, headers, stream=stream)
    await asyncio.sleep(SETTLE_S)
    os.kill(pid, signal.SIGUSR2)
    await asyncio.sleep(0.2)
    timed = bodies[WARMUP:]
    for body in timed:
        sample = await send(client, service.url, body, headers, stream=stream)
        if sample.status != 200:
            raise RuntimeError(f"{session}: HTTP {sample.status}")
    await asyncio.sleep(SETTLE_S)
    rows = await signalled_json(pid, out)
    packages: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for path, name, steps in rows:
        packages[_package(path)] += steps
        functions[_function(path, name)] += steps
    count = len(timed)
    return Steps(count, sum(packages.values()) / count,
                 {k: v / count for k, v in packages.most_common()},
                 {k: v / count for k, v in functions.most_common()})


def _bodies(size: int, requests: int, grow: bool, stream: bool = False) -> list[bytes]:
    history = history_of_size(size)
    bodies = []
    for _ in range(WARMUP + requests):
        if grow:
            history.extend(tiny_exchange(len(history)))
        bodies.append(request_body(history, stream=stream) if grow or not bodies else bodies[0])
    return bodies


async def measure(size: int, requests: int, *, grow: bool = False,
                  loop: EventLoopName = "uvloop", stream: bool = False) -> dict[str, Steps]:
    """Count the relay's and the proxy's steps per request (see the module), both on the
    event loop ``loop`` (asyncio's runs its iterations and callbacks in Python steps, uvloop's
    in C: only the same loop on both sides compares the proxy's own steps)."""
    bodies = _bodies(size, requests, grow, stream)
    results = {}
    with tempfile.TemporaryDirectory(prefix="compact-proxy-steps-") as tmp:
        work = Path(tmp)
        async with client_session() as client, upstream_process(client, work) as upstream:
            for name in ("relay", "proxy"):
                port = free_port()
                out = work / f"{name}.json"
                if name == "relay":
                    args = ["--serve-relay", str(port), upstream.url, str(out), loop]
                else:
                    config = write_proxy_config(work / "proxy", upstream.url,
                                                SESSION_THRESHOLDS, sticky=True, port=port,
                                                overrides={"listen": {"event_loop": loop}})
                    args = ["--serve", str(config), str(out)]
                process = ManagedProcess(f"steps-{name}", [sys.executable, "-m", "bench.steps",
                                                           *args], work / f"{name}.log")
                process.start()
                try:
                    url = f"http://127.0.0.1:{port}"
                    await wait_until_up(client, process, f"{url}/healthz")
                    results[name] = await _count(client, Service(url, process), out, bodies,
                                                 f"bench-steps-{name}", stream=stream)
                finally:
                    process.stop()
    return results


def format_steps(results: dict[str, Steps], size: int, grow: bool, top: int,
                 loop: str = "uvloop", stream: bool = False) -> str:
    """The table: steps per request of each process and their ratio, the packages, and the
    proxy's busiest functions."""
    relay, proxy = results["relay"], results["proxy"]
    kind = "grown by one exchange per request" if grow else "the same request every time"
    lines = [f"Python steps (bytecode instructions) per request, {size / 1000:.0f} KB history, "
             f"{kind}{', streamed' if stream else ''} ({proxy.requests} requests, both on "
             f"{loop})",
             f"   bare relay {relay.total:>9,.0f}",
             f"   proxy      {proxy.total:>9,.0f}   ({proxy.total / relay.total:.2f}x the relay)",
             f"   {'package':<28}{'relay':>9}{'proxy':>9}"]
    for package in sorted(set(relay.packages) | set(proxy.packages),
                          key=lambda p: -max(proxy.packages.get(p, 0.0),
                                             relay.packages.get(p, 0.0)))[:16]:
        lines.append(f"   {package:<28}{relay.packages.get(package, 0.0):>9,.0f}"
                     f"{proxy.packages.get(package, 0.0):>9,.0f}")
    lines.append("   the proxy's busiest functions")
    for function, steps in list(proxy.functions.items())[:top]:
        lines.append(f"   {steps:>9,.0f}  {function}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print; ``--serve`` / ``--serve-relay`` are the traced processes (internal)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--size", type=int, default=50_000, help="history size in bytes")
    parser.add_argument("--grow", action="store_true",
                        help="grow the history by one exchange per request")
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument("--stream", action="store_true",
                        help="streamed requests (as Claude Code sends every one)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the event loop of both processes (default: the proxy's default)")
    parser.add_argument("--serve", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-relay", nargs=4, metavar=("PORT", "UPSTREAM", "OUT", "LOOP"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        from proxy.cli.commands import main as cli_main

        _traced(lambda: cli_main(["serve", "--config", args.serve[0]]), args.serve[1])
        return 0
    if args.serve_relay is not None:
        from bench.harness.relay import serve_null_relay

        port, upstream, out, loop = args.serve_relay
        _traced(lambda: serve_null_relay(int(port), upstream, loop), out)
        return 0
    results = asyncio.run(measure(args.size, args.requests, grow=args.grow, loop=args.loop,
                                  stream=args.stream))
    print(format_steps(results, args.size, args.grow, args.top, args.loop, args.stream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
