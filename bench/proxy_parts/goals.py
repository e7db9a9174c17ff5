"""The goals of issues #4 and #13, judged from one run's results."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from bench.harness.stats import fmt_kb, safe_ratio
from bench.proxy_parts.latency import RELAY_UVLOOP, LatencyCell, cell_cpu
from bench.proxy_parts.run import BenchResults


@dataclass(frozen=True)
class Goal:
    """One goal of the issue: what it asks, what was measured, and whether it holds."""

    name: str
    measured: str
    met: bool
    issue: int = 4
    judged: bool = True

    @property
    def verdict(self) -> str:
        """``[    met]``, ``[NOT met]`` or ``[    n/a]`` (not measured in this run)."""
        if not self.judged:
            return "[    n/a]"
        return "[    met]" if self.met else "[NOT met]"


#: Cold first request: the proxy may be this much slower than the baseline and still count as
#: "no slower" (the noise of a few requests on a shared machine).
COLD_TOLERANCE: Final = 1.05


def warm_flatness(results: BenchResults, target: str = "proxy") -> float:
    """``target``'s own p50 at the largest warm history over its own p50 at the smallest."""
    if len(results.warm) < 2:
        return math.nan
    return safe_ratio(results.warm[-1].own_p50(target), results.warm[0].own_p50(target))


def added_p50(cell: LatencyCell, target: str = "proxy", over: str = "direct") -> float:
    """What ``target`` adds to a request's latency over ``over`` (own p50 minus own p50: the
    provider's own handling, which depends on the body it was sent, is out of both)."""
    return cell.own_p50(target) - cell.own_p50(over)


def warm_added_flatness(results: BenchResults) -> float:
    """What the proxy adds over the bare relay at the largest warm history, over what it adds
    at the smallest: the proxy's own work, flat when a warm request costs what is new in it
    (the relay's own time grows with the bytes every hop must move, see the report)."""
    if len(results.warm) < 2:
        return math.nan
    return safe_ratio(added_p50(results.warm[-1], over="relay"),
                  added_p50(results.warm[0], over="relay"))


def issue13_goals(results: BenchResults) -> list[Goal]:
    """The goals of issue #13, each from this run's numbers."""
    goals: list[Goal] = []
    small = next((c for c in results.latency if "under" in c.label and not c.stream), None)
    cpu_proxy, cpu_relay = cell_cpu(small, "proxy"), cell_cpu(small, "relay")
    cpu_ratio = safe_ratio(cpu_proxy, cpu_relay)
    t = results.throughput
    c16 = safe_ratio(t.cpu_ms.get("proxy", {}).get("proxy", math.nan),
                 t.cpu_ms.get("relay", {}).get("relay", math.nan))
    same_loop = safe_ratio(cpu_proxy, cell_cpu(small, RELAY_UVLOOP))
    goals.append(Goal(
        f"CPU per {fmt_kb(results.sizes.small_bytes)} request, nothing to compact, <= 1.5x the "
        "bare relay's", f"{cpu_ratio:.2f}x ({cpu_proxy:.2f} vs {cpu_relay:.2f} ms, sequential; "
        f"at concurrency {t.concurrency}: {c16:.2f}x; over the relay on uvloop, the proxy's "
        f"loop: {same_loop:.2f}x)",
        cpu_ratio <= 1.5 and small is not None and not small.failures, 13))
    warm_failures = sum(c.failures for c in results.warm)
    if results.warm:
        first, last = results.warm[0], results.warm[-1]
        small_label, huge_label = (first.label.split(" history")[0],
                                   last.label.split(" history")[0])
        flat = warm_added_flatness(results)
        goals.append(Goal(
            f"warm: what the proxy adds over the bare relay flat between {small_label} and "
            f"{huge_label} (<= 1.2)",
            f"{flat:.2f} ({added_p50(first, over='relay'):.2f} -> "
            f"{added_p50(last, over='relay'):.2f} ms; added over direct "
            f"{added_p50(first):.2f} -> {added_p50(last):.2f} ms, the relay's "
            f"{added_p50(first, 'relay'):.2f} -> {added_p50(last, 'relay'):.2f} ms)",
            flat <= 1.2 and not warm_failures, 13))
        middle = results.warm[len(results.warm) // 2]
        goals.append(Goal(
            f"warm: added p50 <= 2 ms at {middle.label.split(' history')[0]} (own p50 minus "
            "the direct request's)",
            f"{added_p50(middle):.2f} ms (the bare relay adds {added_p50(middle, 'relay'):.2f};"
            f" the proxy {added_p50(middle, over='relay'):.2f} over the relay)",
            added_p50(middle) <= 2.0 and not middle.failures, 13))
    goals.append(Goal(
        f"throughput at concurrency {t.concurrency} >= 80% of the bare relay's",
        f"{t.proxy_vs_relay:.0%} ({t.proxy_rps:.0f} vs {t.rps.get('relay', math.nan):.0f} rps)",
        t.proxy_vs_relay >= 0.80 and not t.failures, 13))
    cold = results.cold
    if cold is not None and "baseline" in cold.own:
        ratio = safe_ratio(cold.own_p50("proxy"), cold.own_p50("baseline"))
        goals.append(Goal(
            f"cold first request of a {fmt_kb(results.sizes.cold_bytes)} history no slower than "
            f"{results.baseline} (own p50, <= {COLD_TOLERANCE:.2f}x for noise)",
            f"{ratio:.2f}x ({cold.own_p50('proxy'):.1f} vs {cold.own_p50('baseline'):.1f} ms; "
            f"latency p50 {cold.proxy.p50:.1f} vs {cold.others['baseline'].p50:.1f} ms)",
            ratio <= COLD_TOLERANCE and not cold.failures, 13))
    else:
        measured = (f"proxy own p50 {cold.own_p50('proxy'):.1f} ms; no baseline"
                    if cold is not None else "not measured")
        goals.append(Goal(f"cold first request of a {fmt_kb(results.sizes.cold_bytes)} history "
                          "no slower than a baseline",
                          f"{measured} (run with --baseline REF)", False, 13, judged=False))
    return goals


def _cells(results: BenchResults, large: bool) -> list[LatencyCell]:
    marker = "history" if large else "under"
    return [c for c in results.latency if marker in c.label]


def evaluate_goals(results: BenchResults) -> list[Goal]:
    """The goals of issue #4, then those of issue #13, against the measured numbers.

    The session goals are judged on the first session mode run (sticky in a default run).
    """
    goals: list[Goal] = []
    small = _cells(results, large=False)
    large = _cells(results, large=True)

    def cells_text(cells: list[LatencyCell], attr: str) -> str:
        return " / ".join(f"{'stream' if c.stream else 'json'} {getattr(c, attr):.2f} ms"
                          for c in cells)

    goals.append(Goal("50 KB added p50 <= 2 ms", cells_text(small, "added_p50"),
                      all(c.added_p50 <= 2.0 and not c.failures for c in small)))
    goals.append(Goal("50 KB added p99 <= 10 ms", cells_text(small, "added_p99"),
                      all(c.added_p99 <= 10.0 and not c.failures for c in small)))
    totals = " / ".join(f"{c.proxy.p50:.2f}" for c in large)
    goals.append(Goal("800 KB warm added p50 <= 20 ms",
                      f"{cells_text(large, 'added_p50')} (proxy total p50 {totals} ms)",
                      all(c.added_p50 <= 20.0 and not c.failures for c in large)))
    t = results.throughput
    goals.append(Goal(f"throughput at concurrency {t.concurrency} >= 60% of direct",
                      f"{t.ratio:.0%} ({t.proxy_rps:.0f} vs {t.direct_rps:.0f} rps)",
                      t.ratio >= 0.60 and not t.failures))
    s = results.streams
    goals.append(Goal(f"{s.streams} streams: proxy peak RSS <= 250 MB",
                      f"VmHWM {s.peak_rss_mb:.0f} MB (sampled VmRSS peak "
                      f"{s.sampled_peak_rss_mb:.0f} MB, idle {s.idle_rss_mb:.0f} MB)",
                      s.peak_rss_mb <= 250.0 and not s.failures))
    # Judged on the proxy's own numbers, not proxy minus direct: the direct burst is a separate
    # burst, and at p99 its client-side scheduling noise can exceed the proxy's.
    goals.append(Goal(f"{s.streams} streams: first event relayed within 5 ms (p99 via proxy)",
                      f"p50 {s.first_event_proxy.p50:.2f} ms, p99 {s.first_event_proxy.p99:.2f} ms"
                      f" (direct p50 {s.first_event_direct.p50:.2f}, "
                      f"p99 {s.first_event_direct.p99:.2f} ms)",
                      s.first_event_proxy.p99 <= 5.0 and not s.failures))
    if results.sessions:
        r = results.sessions[0]
        mode = "sticky" if r.sticky else "recompute"
        goals.append(Goal(f"{r.turns}-turn session ({mode}) >= 90% cacheable",
                          f"{r.cacheable_share:.1%}", r.cacheable_share >= 0.90))
        goals.append(Goal(f"{r.turns}-turn session ({mode}): summary calls <= crossings",
                          f"{r.summary_calls} summary calls, {r.crossings} crossings",
                          r.summary_calls <= r.crossings))
        goals.append(Goal(f"{r.turns}-turn session ({mode}): warm compaction time flat "
                          f"(max/min bucket p50 <= 1.5)", f"{r.flatness:.2f}",
                          r.flatness <= 1.5))
        goals.append(Goal(f"{r.turns}-turn session ({mode}): every forwarded view accepted",
                          f"{r.client_failures} non-200 at the client, {r.upstream_failures} "
                          f"at the provider", r.client_failures == 0 and r.upstream_failures == 0))
    return goals + issue13_goals(results)
