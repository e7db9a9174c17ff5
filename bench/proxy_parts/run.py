"""The whole ``bench/proxy.py`` run: every hop started, each part measured in turn,
the machine's other load metered per part."""

from __future__ import annotations

import gc
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.harness.client import client_session
from bench.harness.config import SESSION_THRESHOLDS, BenchError, Sizes, Thresholds
from bench.harness.processes import (
    ManagedProcess,
    Service,
    baseline_worktree,
    code_state,
    describe_ref,
    litellm_process,
    proxy_process,
    upstream_process,
)
from bench.harness.relay import relay_process
from bench.harness.stats import CLOCK_TICKS, fmt_kb, machine_ticks
from bench.proxy_parts.latency import (
    RELAY_UVLOOP,
    LatencyCell,
    Targets,
    measure_cold,
    measure_latency,
    measure_warm_sizes,
)
from bench.proxy_parts.session import SessionReport, run_session
from bench.proxy_parts.streams import StreamReport, measure_streams
from bench.proxy_parts.throughput import Throughput, measure_throughput
from compactor import CachingCounter, TiktokenCounter


@dataclass(frozen=True)
class BenchResults:
    """Everything one run measured (``load_average``: the 1-minute load before and after)."""

    sizes: Sizes
    thresholds: Thresholds
    sticky: bool
    latency: tuple[LatencyCell, ...]
    throughput: Throughput
    streams: StreamReport
    sessions: tuple[SessionReport, ...]
    seconds: float
    load_average: tuple[float, float] = (math.nan, math.nan)
    warm: tuple[LatencyCell, ...] = ()
    cold: LatencyCell | None = None
    notes: tuple[str, ...] = ()
    baseline: str | None = None
    machine: tuple[tuple[str, float, float], ...] = ()



class MachineMeter:
    """How busy the whole machine was during each part, and how much of that was not the
    benchmark: ``/proc/stat`` against the CPU time of this process and of every process it
    started. On a shared machine, the neighbours' share says how far to trust a part.

    It also keeps this process's own garbage collector out of a part: a collection first,
    then none until the part ends. The client is the clock: a full collection of its own
    (148 ms once, in the streams part) showed as the proxy relaying events that late.
    """

    def __init__(self) -> None:
        self.parts: list[tuple[str, float, float]] = []  # name, busy share, others' share
        self._open: tuple[str, tuple[int, int], float, dict[ManagedProcess, float]] | None = None

    @staticmethod
    def _own_cpu_ns() -> float:
        times = os.times()
        return (times.user + times.system) * 1e9

    def part(self, name: str) -> None:
        """Close the running part (if any) and start measuring ``name``."""
        self.close()
        gc.collect()
        gc.disable()
        self._open = (name, machine_ticks(), self._own_cpu_ns(),
                      {p: p.cpu_ns() for p in ManagedProcess.started if p.running})

    def close(self) -> None:
        """Close the running part."""
        gc.enable()
        if self._open is None:
            return
        name, (busy0, total0), own0, before = self._open
        self._open = None
        busy1, total1 = machine_ticks()
        if total1 <= total0:
            return
        ours = self._own_cpu_ns() - own0
        for process in ManagedProcess.started:
            now = process.cpu_ns()
            if not math.isnan(now):
                ours += now - before.get(process, 0.0)
        # /proc/stat counts USER_HZ ticks of every core.
        total_s, busy_s = (total1 - total0) / CLOCK_TICKS, (busy1 - busy0) / CLOCK_TICKS
        self.parts.append((name, busy_s / total_s, max(0.0, busy_s - ours / 1e9) / total_s))


def _progress(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def run_benchmark(sizes: Sizes, thresholds: Thresholds = SESSION_THRESHOLDS, *,
                        sticky: bool = True, session_modes: Sequence[bool] = (True, False),
                        workdir: Path | None = None, litellm: bool = True,
                        baseline: str | None = None) -> BenchResults:
    """Run every part and return the numbers (the child processes are stopped on return).

    Args:
        sizes: how much work each part does.
        thresholds: the proxies' ``compaction`` thresholds.
        sticky: ``compaction.sticky`` of the proxies of parts 1–6.
        session_modes: the ``sticky`` values to run the agent session with, in order.
        workdir: where configs, stores and logs go (default: a temporary directory, removed).
        litellm: look for LiteLLM (:func:`find_litellm`) and measure it when found.
        baseline: a git ref whose proxy (from a temporary worktree) is timed next to this one
            in the cold cell and the CPU cells.
    """
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    notes: list[str] = [code_state()]
    meter = MachineMeter()
    with tempfile.TemporaryDirectory(prefix="compact-proxy-bench-") as tmp:
        root = workdir if workdir is not None else Path(tmp)
        async with client_session() as client:
            async with upstream_process(client, root) as upstream:
                async with AsyncExitStack() as hops:
                    relay = await hops.enter_async_context(
                        relay_process(client, root, upstream.url))
                    proxy = await hops.enter_async_context(proxy_process(
                        client, root, "proxy-main", upstream.url, thresholds, sticky=sticky))
                    # The same relay on the proxy's default loop: the floor on that loop.
                    relay_uvloop = await hops.enter_async_context(
                        relay_process(client, root, upstream.url, "uvloop"))
                    extra: list[tuple[str, Service]] = [(RELAY_UVLOOP, relay_uvloop)]
                    if baseline is not None:
                        _progress(f"baseline: git worktree of {baseline}")
                        source = hops.enter_context(baseline_worktree(
                            baseline, Path(tmp) / "baseline-src"))
                        extra.append(("baseline", await hops.enter_async_context(proxy_process(
                            client, root, "proxy-baseline", upstream.url, thresholds,
                            sticky=sticky, source=source))))
                        notes.append(f"baseline: {describe_ref(baseline)} (git worktree, its "
                                     "proxy.cli.commands serve with the same config)")
                    if litellm:
                        _progress("LiteLLM: looking for it")
                        hop = await hops.enter_async_context(
                            litellm_process(client, root, upstream.url))
                        notes.append(hop.note)
                        _progress(hop.note)
                        if hop.service is not None:
                            extra.append(("litellm", hop.service))
                    else:
                        notes.append("LiteLLM: not measured in this run")
                    pids = {"proxy": _pid(proxy), "relay": _pid(relay),
                            **{name: _pid(service) for name, service in extra}}
                    targets = Targets(proxy.url, upstream.url, relay.url,
                                      tuple((name, service.url) for name, service in extra),
                                      tuple(pids.items()))
                    _progress("part 1: latency")
                    meter.part("1 latency")
                    latency = await measure_latency(client, targets, sizes)
                    _progress("part 2: warm histories at three sizes")
                    meter.part("2 warm sizes")
                    warm = await measure_warm_sizes(client, targets, sizes, latency[2])
                    _progress(f"part 3: cold {fmt_kb(sizes.cold_bytes)} history")
                    meter.part("3 cold")
                    cold = await measure_cold(client, targets, sizes)
                    _progress("part 4: throughput")
                    meter.part("4 throughput")
                    throughput = await measure_throughput(
                        client, targets.only("litellm", RELAY_UVLOOP),
                        {**pids, "provider": _pid(upstream)}, sizes)
                    meter.close()
                async with proxy_process(client, root, "proxy-streams", upstream.url, thresholds,
                                         sticky=sticky) as fresh:
                    _progress(f"part 6: {sizes.streams} concurrent streams")
                    meter.part("6 streams")
                    streams = await measure_streams(client, fresh, upstream.url, sizes)
                    meter.close()
            counter = CachingCounter(TiktokenCounter())
            sessions = []
            meter.part("7 session")
            for mode in session_modes:
                _progress(f"part 7: {sizes.session_turns}-turn session, "
                          f"{'sticky' if mode else 'recompute'}")
                sessions.append(await run_session(client, root, thresholds, sizes.session_turns,
                                                  sticky=mode, counter=counter))
            meter.close()
    return BenchResults(sizes, thresholds, sticky, tuple(latency), throughput, streams,
                        tuple(sessions), time.perf_counter() - started,
                        (load_before, os.getloadavg()[0]), tuple(warm), cold, tuple(notes),
                        baseline, tuple(meter.parts))


def _pid(service: Service) -> int:
    if service.process is None:
        raise BenchError(f"{service.url} is not a child process")
    return service.process.pid


# -- --audit: the audit log's cost (issue #12) ---------------------------------------------------
