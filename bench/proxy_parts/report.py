"""The report of one ``bench/proxy.py`` run: tables side by side, then the goals."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from bench.harness.config import Thresholds
from bench.harness.stats import Dist, fmt_kb, fmt_ms, fmt_times, safe_ratio
from bench.proxy_parts.goals import added_p50, evaluate_goals, warm_added_flatness, warm_flatness
from bench.proxy_parts.latency import RELAY_UVLOOP, WARM_BLOCK, LatencyCell, cell_cpu
from bench.proxy_parts.run import BenchResults
from bench.proxy_parts.session import PARSE_FLOOR_EVERY, SessionReport

BUSY_LOAD: Final = 0.8  # a 1-minute load average above this before the run: say so
BUSY_OTHERS: Final = 0.10  # others' share of the machine during a part above this: say so




_TARGET_NAMES: Final = {"direct": "direct (no hop)", "relay": "relay (bare aiohttp)",
                        "proxy": "compact-proxy", "litellm": "LiteLLM proxy",
                        "baseline": "compact-proxy baseline"}


def _name(target: str) -> str:
    return _TARGET_NAMES.get(target, target)








def _latency_rows(add: Callable[[str], object], cell: LatencyCell) -> None:
    view = ""
    if cell.tokens_before is not None:
        view = (f"; proxy view {cell.tokens_before} -> {cell.tokens_after} tok "
                f"{cell.layers or '(none)'}")
    add(f"   {cell.label} ({cell.body_bytes / 1e6:.2f} MB body; errors {cell.failures}{view})")
    for target in cell.targets:
        latency = cell.latency(target)
        if latency is None:
            continue
        own = cell.own.get(target, Dist.of([]))
        added = math.nan if target == "direct" else latency.p50 - cell.direct.p50
        add(f"     {_name(target):<26}{fmt_ms(latency.p50):>9}{fmt_ms(latency.p99):>9}"
            f"{fmt_ms(own.p50):>10}{fmt_ms(own.p99):>9}{fmt_ms(added):>11}"
            f"{fmt_ms(cell_cpu(cell, target)):>11}")


def _latency_header(add: Callable[[str], object]) -> None:
    add(f"     {'target':<26}{'p50':>9}{'p99':>9}{'own p50':>10}{'own p99':>9}{'added p50':>11}"
        f"{'CPU ms/req':>11}")


def format_report(results: BenchResults) -> str:
    """The human-readable report of one run, goals last."""
    sizes, th = results.sizes, results.thresholds
    out: list[str] = []
    add = out.append
    before, after = results.load_average
    add(f"compact-proxy proxy benchmark — {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, token_counter tiktoken, parts 1-6 with sticky "
        f"{'on' if results.sticky else 'off'}, {results.seconds:.0f} s, load average "
        f"{before:.2f} before / {after:.2f} after")
    if before > BUSY_LOAD:
        add(f"WARNING: the machine was busy before the run (load {before:.2f}): other work "
            "competes for the CPUs and inflates every time below")
    add(f"thresholds: soft {th.soft_threshold_tokens}, hard {th.hard_limit_tokens}, "
        f"max_tool_result {th.max_tool_result_tokens}, keep_recent {th.keep_recent_messages}, "
        f"summary_keep_recent {th.summary_keep_recent}; provider and hops are separate "
        f"processes on 127.0.0.1 (client, hops and provider share the CPUs)")
    for note in results.notes:
        add(note)
    if results.machine:
        add("machine busy during each part (all CPUs; in brackets the share used by processes "
            "not of this run):")
        add("   " + ", ".join(f"{name} {busy:.0%} ({others:.0%})"
                              for name, busy, others in results.machine))
        worst = max(results.machine, key=lambda part: part[2])
        if worst[2] > BUSY_OTHERS:
            add(f"WARNING: other work took {worst[2]:.0%} of the machine during part {worst[0]}: "
                "its figures are inflated; compare ratios within a part, or run again")
    add("")
    add(f"1. Latency and own time, ms ({sizes.latency_requests} requests per target per cell, "
        "targets interleaved, the order rotating)")
    add("   p50/p99 = request start -> last byte at the client; own = that minus the time the "
        "provider reported")
    add("   for the same request (its handler, first byte read -> last byte written): what the "
        "hop, the client")
    add("   and loopback cost, whatever the hop sent upstream. added = p50 - direct p50. "
        "CPU ms/req = the hop")
    add("   process's CPU time over the cell / requests (/proc; thread schedstat, ns).")
    _latency_header(add)
    for cell in results.latency:
        _latency_rows(add, cell)
    add("   relay = bench/proxy.py --null-relay: read, forward, relay chunks; no parse, no "
        "store, no log (the floor).")
    add("   warm = the session compacted this history once (untimed); each timed request is the "
        "same history")
    add(f"   grown by one small exchange, same session id (a new session every {WARM_BLOCK} "
        "requests). Direct, the provider parses the whole history, via")
    add("   the proxy only the compacted view: there 'added' is negative and own time is the "
        "honest figure.")
    add("")
    if results.warm:
        add(f"2. Warm history at three sizes, json ({sizes.latency_requests} requests each; the "
            "session compacted once, untimed; every")
        add("   timed request = the same history grown by one small exchange, same session id; "
            f"a new session every {WARM_BLOCK})")
        add(f"   {'history':<10}{'body MB':>8}{'direct own p50':>16}{'relay own p50':>15}"
            f"{'p99':>8}{'proxy own p50':>15}{'p99':>8}{'proxy-relay':>13}{'proxy CPU':>11}"
            "  proxy view")
        for cell in results.warm:
            relay, proxy = cell.own.get("relay", Dist.of([])), cell.own.get("proxy", Dist.of([]))
            view = (f"{cell.tokens_before} -> {cell.tokens_after} tok {cell.layers or '(none)'}"
                    if cell.tokens_before is not None else "")
            add(f"   {cell.label.split(' history')[0]:<10}{cell.body_bytes / 1e6:>8.2f}"
                f"{fmt_ms(cell.own_p50('direct')):>16}{fmt_ms(relay.p50):>15}{fmt_ms(relay.p99):>8}"
                f"{fmt_ms(proxy.p50):>15}{fmt_ms(proxy.p99):>8}{fmt_ms(proxy.p50 - relay.p50):>13}"
                f"{fmt_ms(cell_cpu(cell, 'proxy')):>11}  {view}")
        add(f"   own p50 at {fmt_kb(sizes.huge_bytes)} / own p50 at {fmt_kb(sizes.small_bytes)}: "
            f"proxy {warm_flatness(results):.2f}, relay {warm_flatness(results, 'relay'):.2f} "
            "(the bytes every hop moves);")
        add("   added over direct (own p50 minus the direct request's): "
            + ", ".join(f"{c.label.split(' history')[0]} proxy {fmt_ms(added_p50(c))} relay "
                        f"{fmt_ms(added_p50(c, 'relay'))}" for c in results.warm))
        add(f"   what the proxy adds over the relay, {fmt_kb(sizes.huge_bytes)} / "
            f"{fmt_kb(sizes.small_bytes)}: {warm_added_flatness(results):.2f}")
        add("")
    if results.cold is not None:
        cell = results.cold
        add(f"3. Cold: the first request of a session, {fmt_kb(sizes.cold_bytes)} history, json "
            f"({sizes.cold_requests} requests per target, each")
        add("   a new session id: the proxy compacts from scratch, its summary call to the "
            "provider included in own time)")
        _latency_header(add)
        _latency_rows(add, cell)
        if "baseline" in cell.own:
            add(f"   proxy / baseline own p50: "
                f"{safe_ratio(cell.own_p50('proxy'), cell.own_p50('baseline')):.2f}")
        add("")
    t = results.throughput
    add(f"4. Throughput, {fmt_kb(sizes.small_bytes)} json requests, concurrency {t.concurrency}, "
        f"{t.requests} requests per target (two rounds, order reversed)")
    add("   " + "   ".join(f"{target} {rps:.0f} rps" for target, rps in t.rps.items())
        + f"   errors {t.failures}")
    add(f"   proxy / relay {t.proxy_vs_relay:.1%}, proxy / direct {t.ratio:.1%}")
    for target, processes in t.cpu_ms.items():
        parts = " + ".join(f"{who} {ms:.2f}" for who, ms in processes.items())
        add(f"   CPU ms per request, {target:<8}: {parts} = {sum(processes.values()):.2f}")
    add(f"   (client, hop and provider share the {os.cpu_count()} CPUs)")
    add("")
    add("5. CPU per request of the hop process (ms; sequential requests of part 1, "
        f"interleaved; and at concurrency {t.concurrency}, part 4)")
    kb = fmt_kb(sizes.small_bytes)
    small = next((c for c in results.latency if "under" in c.label and not c.stream), None)
    large = next((c for c in results.latency if "history" in c.label and not c.stream), None)
    streamed = next((c for c in results.latency if "under" in c.label and c.stream), None)
    rows = [(f"bare relay, {kb}", small, "relay", "relay"),
            (f"bare relay on uvloop, {kb}", small, RELAY_UVLOOP, RELAY_UVLOOP),
            (f"compact-proxy, {kb}, nothing to compact", small, "proxy", "proxy"),
            (f"compact-proxy, {fmt_kb(sizes.large_bytes)} warm, compacted", large, "proxy", None),
            (f"bare relay, {fmt_kb(sizes.large_bytes)} warm (reference)", large, "relay", None)]
    if small is not None and "litellm" in small.cpu_ms:
        rows.append((f"LiteLLM proxy, {kb}", small, "litellm", "litellm"))
    if small is not None and "baseline" in small.cpu_ms:
        rows.append((f"baseline compact-proxy, {kb}", small, "baseline", None))
        rows.append((f"baseline compact-proxy, {fmt_kb(sizes.large_bytes)} warm", large,
                     "baseline", None))
    add(f"   {'hop, request':<44}{'sequential':>11}{'x relay':>9}"
        f"{f'at c{t.concurrency}':>9}{'x relay':>9}")
    relay_seq = cell_cpu(small, "relay")
    relay_c16 = t.cpu_ms.get("relay", {}).get("relay", math.nan)
    for label, cell, target, tput in rows:
        seq = cell_cpu(cell, target)
        c16 = t.cpu_ms.get(tput, {}).get(tput, math.nan) if tput else math.nan
        add(f"   {label:<44}{fmt_ms(seq):>11}{fmt_times(safe_ratio(seq, relay_seq)):>9}"
            f"{fmt_ms(c16):>9}"
            f"{fmt_times(safe_ratio(c16, relay_c16)):>9}")
    # Streamed (every request of Claude Code is): against the bare relay's streamed requests.
    relay_streamed = cell_cpu(streamed, "relay")
    streamed_rows = [(f"bare relay, {kb} streamed", "relay"),
                     (f"bare relay on uvloop, {kb} streamed", RELAY_UVLOOP),
                     (f"compact-proxy, {kb} streamed, nothing to do", "proxy")]
    if streamed is not None and "baseline" in streamed.cpu_ms:
        streamed_rows.append((f"baseline compact-proxy, {kb} streamed", "baseline"))
    for label, target in streamed_rows:
        seq = cell_cpu(streamed, target)
        add(f"   {label:<44}{fmt_ms(seq):>11}{fmt_times(safe_ratio(seq, relay_streamed)):>9}")
    add(f"   (x relay: over the bare relay's CPU per {kb} request, same column; a streamed "
        "request over the relay's streamed one)")
    same_loop = (safe_ratio(cell_cpu(small, "proxy"), cell_cpu(small, RELAY_UVLOOP)),
                 safe_ratio(t.cpu_ms.get("proxy", {}).get("proxy", math.nan),
                        t.cpu_ms.get(RELAY_UVLOOP, {}).get(RELAY_UVLOOP, math.nan)),
                 safe_ratio(cell_cpu(streamed, "proxy"), cell_cpu(streamed, RELAY_UVLOOP)))
    add("   compact-proxy (on uvloop, listen.event_loop's default) over the bare relay on "
        f"uvloop: {fmt_times(same_loop[0])}x sequential, {fmt_times(same_loop[1])}x at "
        f"c{t.concurrency}, {fmt_times(same_loop[2])}x streamed")
    add("")
    s = results.streams
    add(f"6. {s.streams} concurrent streams through a fresh proxy process "
        f"({sizes.small_bytes // 1000} KB requests, {sizes.stream_event_delay_ms:g} ms between "
        f"events, opened over {sizes.stream_ramp_s:g} s; {s.max_open} open at once)")
    add(f"   proxy RSS: idle {s.idle_rss_mb:.0f} MB, peak VmHWM {s.peak_rss_mb:.0f} MB, "
        f"peak sampled VmRSS {s.sampled_peak_rss_mb:.0f} MB")
    add("   relay latency = client receive time - the provider's send stamp of the same event")
    add("   (the fake provider stamps every SSE event as it writes it; wall clock, same host)")
    add(f"   {'':<30} {'p50':>7} {'p99':>7} {'max':>7}      n")
    for label, dist in (("first event, via proxy", s.first_event_proxy),
                        ("first event, direct", s.first_event_direct),
                        ("every event, via proxy", s.all_events_proxy),
                        ("every event, direct", s.all_events_direct),
                        ("after all were open, via proxy", s.steady_proxy),
                        ("after all were open, direct", s.steady_direct),
                        ("time to first byte, via proxy", s.ttfe_proxy),
                        ("time to first byte, direct", s.ttfe_direct)):
        add(f"   {label:<30} {fmt_ms(dist.p50)} {fmt_ms(dist.p99)} {fmt_ms(dist.max)} {dist.n:>6}")
    add(f"   first event, proxy - direct: p50 {s.first_event_added_p50:.2f} ms, "
        f"p99 {s.first_event_added_p99:.2f} ms; errors {s.failures}")
    add("")
    if results.sessions:
        add(_format_sessions(results.sessions, th))
    goals = evaluate_goals(results)
    for issue in sorted({g.issue for g in goals}):
        add(f"Goals (issue #{issue})")
        for goal in (g for g in goals if g.issue == issue):
            add(f"   {goal.verdict} {goal.name}: {goal.measured}")
    return "\n".join(out)


def _format_sessions(sessions: Sequence[SessionReport], th: Thresholds) -> str:
    out: list[str] = []
    add = out.append
    turns = sessions[0].turns
    add(f"7. {turns}-turn agent session, resent in full every turn (reads, edits, test logs, "
        f"greps; the same files read again and again)")
    add("   cacheable = common prefix of consecutive forwarded views (tools, system, whole "
        "messages; cache_control ignored),")
    add("   in tiktoken tokens of the forwarded view, summed / forwarded input tokens summed")
    width = 30
    names = ["sticky" if s.sticky else "recompute" for s in sessions]
    add(f"   {'':<40}" + "".join(f"{n:>{width}}" for n in names))

    def row(label: str, values: Iterable[str]) -> None:
        add(f"   {label:<40}" + "".join(f"{v:>{width}}" for v in values))

    row("cacheable share of forwarded input", (f"{s.cacheable_share:.1%}" for s in sessions))
    row("forwarded input tokens (sum)", (f"{s.forwarded_tokens:,}" for s in sessions))
    row("client input tokens (sum)", (f"{s.raw_tokens:,}" for s in sessions))
    row("summary calls", (str(s.summary_calls) for s in sessions))
    row(f"soft threshold crossings ({th.soft_threshold_tokens})",
        (str(s.crossings) for s in sessions))
    row("recompactions (view not an extension)", (str(s.recompactions) for s in sessions))
    row("layers in x-compact-layers (turns)",
        (" ".join(f"{k}:{v}" for k, v in s.layer_counts.items()) or "-" for s in sessions))
    row("non-200 (client / provider)",
        (f"{s.client_failures} / {s.upstream_failures}" for s in sessions))
    row("forwarded views", (str(s.forwarded_views) for s in sessions))
    row("wall time", (f"{s.seconds:.1f} s" for s in sessions))
    add("   proxy added time per request, ms (client latency - time the provider spent in its "
        "handlers, summary calls included)")
    add(f"   {'turns':<12}{'body MB':>9}{'json.loads':>12}" + "".join(
        f"{n + ' p50':>14}{'max':>9}" for n in names) + "   (* = warm: after the first crossing)")
    for index, bucket in enumerate(sessions[0].buckets):
        cells = ""
        for s in sessions:
            b = s.buckets[index]
            cells += f"{b.added.p50:>14.2f}{b.added.max:>9.1f}"
        warm = "*" if bucket.warm else " "
        parse = "-" if math.isnan(bucket.parse_p50_ms) else f"{bucket.parse_p50_ms:.2f}"
        add(f"   {bucket.first:>4}-{bucket.last:<6}{warm}{bucket.body_mb:>8.2f}{parse:>12}{cells}")
    add("   json.loads = p50 time this process needs to parse the same bodies (every "
        f"{PARSE_FLOOR_EVERY}th turn): the part of the proxy's work that must grow with history")
    row("warm flatness (max/min bucket p50)", (f"{s.flatness:.2f}" for s in sessions))
    add("")
    return "\n".join(out)


