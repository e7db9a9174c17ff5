"""``bench/proxy.py --audit``: the audit log's cost, ``audit.enabled`` true against
false in one run."""

from __future__ import annotations

import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness.client import client_session
from bench.harness.config import SESSION_THRESHOLDS, Sizes, Thresholds
from bench.harness.processes import proxy_process, upstream_process
from bench.harness.stats import fmt_ms
from bench.proxy_parts.latency import LatencyCell, Targets, measure_latency
from bench.proxy_parts.run import _pid, _progress
from bench.proxy_parts.throughput import Throughput, measure_throughput


@dataclass(frozen=True)
class AuditResults:
    """The audit part: latency cells and throughput, audit on against audit off.

    In each :class:`LatencyCell` and in the :class:`Throughput`, ``proxy`` is the proxy with
    ``audit.enabled: true`` and ``relay`` the one with ``false`` (the same requests,
    interleaved with the provider directly).
    """

    sizes: Sizes
    latency: tuple[LatencyCell, ...]
    throughput: Throughput
    entries: int
    seconds: float

    def ratio(self, cell: LatencyCell) -> float:
        """Added p50 with the audit log on / off (NaN when off added nothing measurable)."""
        off = cell.relay_added_p50
        return cell.added_p50 / off if off > 0 else math.nan


async def count_audit_entries(store_path: Path) -> int:
    """How many request entries a proxy's SQLite store holds (read after the run)."""
    from proxy.store import SQLiteStateStore

    store = await SQLiteStateStore(store_path).open()
    try:
        summaries, _ = await store.sessions(limit=1000)
        return sum(summary.requests for summary in summaries)
    finally:
        await store.close()


async def run_audit_benchmark(sizes: Sizes, thresholds: Thresholds = SESSION_THRESHOLDS, *,
                              workdir: Path | None = None) -> AuditResults:
    """The audit log's cost: two proxies (audit on, audit off) and the provider directly,
    interleaved, in one run (the child processes are stopped on return)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="compact-proxy-bench-") as tmp:
        root = workdir if workdir is not None else Path(tmp)
        async with client_session() as client:
            async with upstream_process(client, root) as upstream, \
                    proxy_process(client, root, "proxy-audit-on", upstream.url, thresholds,
                                  sticky=True, audit=True) as on, \
                    proxy_process(client, root, "proxy-audit-off", upstream.url, thresholds,
                                  sticky=True, audit=False) as off:
                # The "relay" slot holds the audit-off proxy: the same interleaving as part 1.
                targets = Targets(on.url, upstream.url, off.url)
                _progress("audit: added latency, on / off")
                latency = await measure_latency(client, targets, sizes)
                _progress("audit: throughput, on / off")
                throughput = await measure_throughput(
                    client, targets, {"proxy": _pid(on), "relay": _pid(off),
                                      "provider": _pid(upstream)}, sizes)
        entries = await count_audit_entries(root / "proxy-audit-on" / "state.db")
    return AuditResults(sizes, tuple(latency), throughput, entries,
                        time.perf_counter() - started)


def format_audit_report(results: AuditResults) -> str:
    """The audit part's report: added latency on and off, their ratio, throughput."""
    sizes, t = results.sizes, results.throughput
    out = [f"compact-proxy audit log cost — {os.cpu_count()} CPUs, Python "
           f"{platform.python_version()}, {results.seconds:.0f} s; two proxies (audit.enabled "
           f"true / false) and the provider directly, interleaved, {sizes.latency_requests} "
           "requests each per cell", ""]
    add = out.append
    add(f"   {'cell':<36}{'direct p50':>11}{'on +p50':>9}{'+p99':>8}{'off +p50':>10}{'+p99':>8}"
        f"{'on/off p50':>12}  errors")
    for c in results.latency:
        add(f"   {c.label:<36}{fmt_ms(c.direct.p50):>11}{fmt_ms(c.added_p50):>9}"
            f"{fmt_ms(c.added_p99):>8}"
            f"{fmt_ms(c.relay_added_p50):>10}{fmt_ms(c.relay_added_p99):>8}"
            f"{results.ratio(c):>12.2f}  {c.failures:>6}")
    on_rps, off_rps = t.rps["proxy"], t.rps.get("relay", math.nan)
    add("")
    add(f"   throughput, {sizes.small_bytes // 1000} KB json, concurrency {t.concurrency}: "
        f"direct {t.direct_rps:.0f} rps, audit on {on_rps:.0f} rps, audit off {off_rps:.0f} rps "
        f"(on/off {on_rps / off_rps:.1%}); errors {t.failures}")
    for target, label in (("proxy", "audit on "), ("relay", "audit off")):
        processes = t.cpu_ms[target]
        add(f"   CPU ms per request, {label}: proxy "
            f"{processes.get('proxy', processes.get('relay', math.nan)):.2f}")
    add(f"   entries the audit-on proxy wrote: {results.entries} (one per request; "
        "written after each response, so the latency above never waits for them)")
    return "\n".join(out)


