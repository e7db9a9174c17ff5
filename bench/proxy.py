"""Proxy benchmark: what compact-proxy costs a request, measured through the real processes.

    python bench/proxy.py [--no-sticky] [--quick] [--baseline REF] [--no-litellm]
    python bench/proxy.py --audit [--quick]

The strict fake provider (``bench/stamped_upstream.py``: ``proxy.fake_upstream`` plus a send
stamp on every SSE event and the time it spent on every request), the proxy (``python -m
proxy.cli serve``), a bare aiohttp relay (``--null-relay``) and, when installed, LiteLLM's proxy
run as separate processes on free loopback ports, with their state in a temporary directory and
``token_counter: tiktoken``. A raw aiohttp client (no SDK) measures, in one run:

1. latency and *own time* (client latency minus the provider's reported time for the same
   request: what the hop costs, whatever it sends upstream), p50/p99, targets interleaved, for
   a 50 KB request under the soft threshold and an 800 KB history above it, WARM (the session
   compacted it once; every timed request is the same history grown by one exchange), each as
   JSON and as a stream; with the CPU milliseconds each hop process spent per request;
2. warm JSON histories of 50 KB, 800 KB and 2.6 MB: own time of relay and proxy, and the
   proxy's flatness (own p50 at 2.6 MB / at 50 KB);
3. the cold (first) request of a 1 MB history, a new session every time (with ``--baseline
   REF``: that commit's proxy, run from a temporary ``git worktree``, side by side);
4. requests per second at concurrency 16 against every hop, and where the CPU went;
5. CPU per request: bare relay, compact-proxy with nothing to compact, compact-proxy warm
   with compaction (and LiteLLM, the baseline), with the ratio to the relay;
6. a fresh proxy process under 200 concurrent streams: peak RSS (``/proc/<pid>/status``
   VmHWM, and VmRSS sampled) and the relay latency of the provider's events (provider's send
   stamp → client's receive time, via the proxy and direct);
7. a simulated 300-turn agent session resent in full each turn, once with sticky compaction
   and once recomputing every time (side by side): the share of forwarded input tokens the
   provider could serve from its prompt cache, summary calls, soft-threshold crossings, the
   proxy's added time per request by history size, and whether every forwarded view passed
   the provider's strict rules (the fake provider runs in this process for this part, so it
   can read every forwarded view).

It ends with each goal of issues #4 and #13 and ``met`` / ``NOT met`` (``n/a``: not measured
in this run, e.g. the cold goal without ``--baseline``).

``--audit`` runs one other part instead: the audit log's cost (issue #12). Two proxies, one
with ``audit.enabled: true`` and one with ``false``, and the provider directly, interleaved in
one run: the added p50 / p99 of each for the 50 KB request and the warm 800 KB history (JSON
and stream), their ratio (on / off), and the throughput of both at concurrency 16.

Everything is bounded: loopback only, fixed request counts, a per-request timeout and a
whole-run deadline; the child processes are stopped and the temporary directory and worktree
removed on every exit path (normal end, error, Ctrl-C, SIGTERM). LiteLLM is never required:
without it the report says how to install it.
"""

# ruff: noqa: E402, F401 - sys.path is set before the imports; the names are re-exported.
from __future__ import annotations

import sys
from pathlib import Path

_BENCH_DIR = Path(__file__).resolve().parent
_ROOT = _BENCH_DIR.parent
if __name__ == "__main__":
    # Run as a script, this file's directory comes first on sys.path, and this very module
    # (bench/proxy.py) would shadow the ``proxy`` package it measures.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
    sys.path.insert(0, str(_ROOT))

import argparse
import asyncio
import signal
from collections.abc import Sequence
from typing import Final

import aiohttp

# The shared harness (``bench/harness/``) and this benchmark's parts (``bench/proxy_parts/``),
# re-exported: scripts written against ``bench.proxy`` keep importing from here.
from bench.harness.client import (
    _PROVIDER_HEADER_PREFIXES,
    _PROVIDER_MS_RE,
    _STAMP_RE,
    Sample,
    client_session,
    provider_ms_of,
    send,
)
from bench.harness.config import (
    ADMIN_TOKEN_ENV,
    BENCH_API_KEY,
    FULL,
    LITELLM_ENV,
    LITELLM_INSTALL,
    LITELLM_STARTUP_TIMEOUT_S,
    LITELLM_VENV,
    MODEL,
    QUICK,
    REQUEST_TIMEOUT_S,
    ROOT,
    SESSION_HEADER,
    SESSION_SEED,
    SESSION_THRESHOLDS,
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    TINY,
    TINY_THRESHOLDS,
    BenchError,
    Sizes,
    Thresholds,
    write_litellm_config,
    write_proxy_config,
)
from bench.harness.processes import (
    ExtraHop,
    ManagedProcess,
    Service,
    baseline_worktree,
    code_state,
    describe_ref,
    find_litellm,
    free_port,
    litellm_process,
    proxy_process,
    upstream_process,
    wait_for_workers,
    wait_until_up,
)
from bench.harness.relay import (
    _RELAY_DROPPED,
    _RELAY_SESSION,
    null_relay_app,
    relay_process,
    serve_null_relay,
)
from bench.harness.stats import (
    CLOCK_TICKS,
    Dist,
    _schedstat_ns,
    _stat_cpu_s,
    children,
    fmt_kb,
    fmt_ms,
    fmt_times,
    machine_ticks,
    percentile,
    process_cpu_ns,
    process_cpu_s,
    read_proc_status,
    safe_ratio,
    signalled_json,
    tree_cpu_s,
)
from bench.harness.workloads import (
    _FILES,
    _MODULES,
    _THOUGHTS,
    SYSTEM,
    TOOLS,
    AgentSession,
    _grep_output,
    _pytest_log,
    _source,
    _system_prompt,
    _tools,
    history_of_size,
    request_body,
    request_headers,
    tiny_exchange,
)
from bench.proxy_parts.audit import (
    AuditResults,
    count_audit_entries,
    format_audit_report,
    run_audit_benchmark,
)
from bench.proxy_parts.goals import (
    COLD_TOLERANCE,
    Goal,
    _cells,
    added_p50,
    evaluate_goals,
    issue13_goals,
    warm_added_flatness,
    warm_flatness,
)
from bench.proxy_parts.latency import (
    COLD_SEED,
    CPU_SETTLE_S,
    RELAY_UVLOOP,
    WARM_BLOCK,
    LatencyCell,
    Targets,
    _cell,
    _cold_cell,
    _finish,
    _fixed_cell,
    _growing_cell,
    _header_int,
    _round,
    _Tally,
    _timed,
    cell_cpu,
    measure_cold,
    measure_latency,
    measure_warm_sizes,
)
from bench.proxy_parts.report import (
    _TARGET_NAMES,
    BUSY_LOAD,
    BUSY_OTHERS,
    _format_sessions,
    _latency_header,
    _latency_rows,
    _name,
    format_report,
)
from bench.proxy_parts.run import BenchResults, MachineMeter, _pid, _progress, run_benchmark
from bench.proxy_parts.session import (
    PARSE_FLOOR_EVERY,
    Bucket,
    SessionReport,
    SessionUpstream,
    TurnRow,
    _buckets,
    _capped_tokens,
    _drive_session,
    _ViewRecord,
    run_session,
)
from bench.proxy_parts.streams import RSS_SAMPLE_S, StreamReport, _burst, measure_streams
from bench.proxy_parts.throughput import Throughput, _closed_loop, measure_throughput
from bench.stamped_upstream import (
    CONTEXT_WINDOW,
    DELAY_HEADER,
    PROVIDER_MS_FIELD,
    PROVIDER_MS_HEADER,
    STAMP_FIELD,
)
from compactor import CachingCounter, TiktokenCounter
from compactor._fingerprint import strip_cache_control
from proxy.config import EventLoopName
from proxy.fake_upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    default_script,
    is_summarizer_request,
    start_fake_upstream,
)
from proxy.server.allocator import tune_allocator
from proxy.server.app import READ_BUFSIZE
from proxy.server.event_loop import loop_factory

_headers = request_headers
_wait_until_up = wait_until_up
_provider_ms = provider_ms_of
_kb = fmt_kb
_CLOCK_TICKS = CLOCK_TICKS
_machine_ticks = machine_ticks
_ms = fmt_ms
_ratio = safe_ratio
_times = fmt_times
_cpu = cell_cpu

__all__ = [
    "COLD_TOLERANCE",
    "FULL",
    "LITELLM_ENV",
    "QUICK",
    "TINY",
    "AgentSession",
    "AuditResults",
    "BenchError",
    "BenchResults",
    "Dist",
    "ExtraHop",
    "Goal",
    "LatencyCell",
    "ManagedProcess",
    "SessionReport",
    "Sizes",
    "StreamReport",
    "Targets",
    "Thresholds",
    "Throughput",
    "added_p50",
    "baseline_worktree",
    "evaluate_goals",
    "find_litellm",
    "format_audit_report",
    "format_report",
    "history_of_size",
    "issue13_goals",
    "litellm_process",
    "main",
    "process_cpu_ns",
    "run_audit_benchmark",
    "run_benchmark",
    "warm_added_flatness",
    "warm_flatness",
    "write_litellm_config",
]

RUN_DEADLINE_S: Final = 1200.0


# -- entry point ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the report; exit code 0 (1 when it could not run)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--no-sticky", action="store_true",
                        help="run with compaction.sticky: false (the session part only in "
                             "that mode)")
    parser.add_argument("--null-relay", nargs=2, metavar=("PORT", "UPSTREAM_URL"),
                        help=argparse.SUPPRESS)  # internal: serve the reference relay
    parser.add_argument("--relay-loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help=argparse.SUPPRESS)  # internal: the reference relay's event loop
    parser.add_argument("--quick", action="store_true",
                        help=f"fewer requests ({QUICK.latency_requests} per latency cell, "
                             f"{QUICK.session_turns} session turns)")
    parser.add_argument("--baseline", metavar="REF",
                        help="also run the proxy of this git ref (a temporary git worktree) in "
                             "the cold cell and the CPU cells, e.g. beabb44")
    parser.add_argument("--no-litellm", action="store_true",
                        help="do not look for LiteLLM (default: measured when installed, see "
                             "bench/README.md)")
    parser.add_argument("--audit", action="store_true",
                        help="only the audit log's cost: added latency and throughput with "
                             "audit.enabled true against false, in one run")
    args = parser.parse_args(argv)
    if args.null_relay is not None:
        serve_null_relay(int(args.null_relay[0]), args.null_relay[1], args.relay_loop)
        return 0
    sizes = QUICK if args.quick else FULL
    sticky = not args.no_sticky
    modes = (False,) if args.no_sticky else (True, False)
    # SIGTERM ends the run like Ctrl-C: every context manager stops its process on the way out.
    # SIGINT is set too, as a shell starting us in the background would have it ignored.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    async def bounded() -> str:
        if args.audit:
            audit = await asyncio.wait_for(run_audit_benchmark(sizes), RUN_DEADLINE_S)
            return format_audit_report(audit)
        return format_report(await asyncio.wait_for(
            run_benchmark(sizes, SESSION_THRESHOLDS, sticky=sticky, session_modes=modes,
                          litellm=not args.no_litellm, baseline=args.baseline),
            RUN_DEADLINE_S))

    try:
        report = asyncio.run(bounded())
    except KeyboardInterrupt:
        print("interrupted; child processes stopped", file=sys.stderr)
        return 130
    except (TimeoutError, BenchError, aiohttp.ClientError, OSError) as exc:
        print(f"benchmark failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        ManagedProcess.stop_all()
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
