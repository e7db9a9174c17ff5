"""Smoke test of ``bench/proxy.py``: every part runs at a tiny size against real processes
(the stamped fake provider and ``proxy.cli serve``) and reports well-formed numbers.

Nothing here asserts a timing: the numbers must be present, finite and consistent with each
other, and the views the proxy forwarded must have been accepted by the strict provider.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

import bench.proxy as bench
from compactor import validate_tool_protocol
from proxy.fake_upstream import check_messages_request

# The default text reply streams as message_start, ping, content_block_start, 1-3 deltas,
# content_block_stop, message_delta, message_stop.
MIN_EVENTS_PER_STREAM = 7


@pytest.fixture(scope="module")
def results() -> bench.BenchResults:
    """One whole benchmark run at the tiny size (both session modes)."""
    return asyncio.run(bench.run_benchmark(bench.TINY, bench.TINY_THRESHOLDS))


def finite_dist(dist: bench.Dist, n: int) -> bool:
    """``dist`` holds ``n`` finite, ordered, non-negative values."""
    values = (dist.p50, dist.p99, dist.mean, dist.max)
    return (dist.n == n and all(math.isfinite(v) and v >= 0 for v in values)
            and dist.p50 <= dist.p99 <= dist.max)


def test_latency_part_measures_every_cell_through_the_proxy_and_direct(
    results: bench.BenchResults,
) -> None:
    """Four cells (small/large x json/stream), n samples per target (proxy, direct, relay)."""
    cells = results.latency
    assert [c.stream for c in cells] == [False, True, False, True]
    for cell in cells:
        assert finite_dist(cell.direct, bench.TINY.latency_requests)
        assert finite_dist(cell.proxy, bench.TINY.latency_requests)
        assert cell.relay is not None and finite_dist(cell.relay, bench.TINY.latency_requests)
        assert cell.failures == 0
        assert cell.added_p50 == pytest.approx(cell.proxy.p50 - cell.direct.p50)


def test_large_cells_are_compacted_and_small_cells_are_not(results: bench.BenchResults) -> None:
    """The history above the threshold is forwarded compacted; the small request untouched."""
    small, large = results.latency[:2], results.latency[2:]
    for cell in small:
        assert cell.layers == ""
        assert cell.tokens_before == cell.tokens_after
        assert cell.tokens_before is not None
        assert cell.tokens_before < bench.TINY_THRESHOLDS.soft_threshold_tokens
    for cell in large:
        assert cell.layers
        assert cell.tokens_before is not None and cell.tokens_after is not None
        assert cell.tokens_after < bench.TINY_THRESHOLDS.soft_threshold_tokens < cell.tokens_before


def test_throughput_part_reports_both_rates_and_cpu_per_request(
    results: bench.BenchResults,
) -> None:
    """Positive rates for every target, the ratios, and CPU time per request per process."""
    t = results.throughput
    assert t.failures == 0
    assert set(t.rps) == {"proxy", "direct", "relay"}
    assert all(rate > 0 for rate in t.rps.values())
    assert t.ratio == pytest.approx(t.proxy_rps / t.direct_rps)
    assert t.relay_ratio == pytest.approx(t.rps["relay"] / t.direct_rps)
    assert t.cpu_ms["proxy"].keys() == {"client", "proxy", "provider"}
    assert t.cpu_ms["direct"].keys() == {"client", "provider"}
    assert t.cpu_ms["relay"].keys() == {"client", "relay", "provider"}
    assert all(math.isfinite(ms) and ms >= 0
               for processes in t.cpu_ms.values() for ms in processes.values())


def test_stream_part_reports_memory_and_a_relay_latency_per_stream(
    results: bench.BenchResults,
) -> None:
    """Every stream arrived stamped; RSS figures are positive and the peak is not below idle."""
    s = results.streams
    assert s.failures == 0
    assert s.streams == bench.TINY.streams
    assert 1 <= s.max_open <= s.streams
    assert 0 < s.idle_rss_mb <= s.peak_rss_mb
    assert s.idle_rss_mb <= s.sampled_peak_rss_mb <= s.peak_rss_mb
    for dist in (s.first_event_proxy, s.first_event_direct, s.ttfe_proxy, s.ttfe_direct):
        assert dist.n == s.streams
    assert s.all_events_proxy.n >= MIN_EVENTS_PER_STREAM * s.streams
    assert s.all_events_direct.n == s.all_events_proxy.n
    assert s.steady_proxy.n <= s.all_events_proxy.n
    assert s.steady_direct.n <= s.all_events_direct.n


def test_session_part_runs_both_modes_and_every_forwarded_view_is_accepted(
    results: bench.BenchResults,
) -> None:
    """Sticky and recompute sessions: one accepted view per turn, token sums consistent."""
    assert [s.sticky for s in results.sessions] == [True, False]
    for s in results.sessions:
        assert s.turns == bench.TINY.session_turns
        assert s.client_failures == 0 and s.upstream_failures == 0
        assert s.forwarded_views == s.turns
        assert 0 < s.cacheable_tokens < s.forwarded_tokens < s.raw_tokens
        assert 0.0 < s.cacheable_share < 1.0
        assert s.crossings >= 1 and s.summary_calls >= 1
        assert 0 <= s.recompactions < s.turns
        assert set(s.layer_counts) <= {"L1", "L2", "L3", "L4"}


def test_session_buckets_cover_every_turn_in_order(results: bench.BenchResults) -> None:
    """The added-time buckets tile turns 1..N, each with one sample per accepted turn."""
    for s in results.sessions:
        expected_first = 1
        for bucket in s.buckets:
            assert bucket.first == expected_first
            assert bucket.added.n == bucket.last - bucket.first + 1
            assert bucket.body_mb > 0
            expected_first = bucket.last + 1
        assert expected_first == s.turns + 1
        assert len(s.rows) == s.turns


def test_report_prints_every_part_and_a_verdict_for_every_goal(
    results: bench.BenchResults,
) -> None:
    """The report holds the four parts and one met / NOT met line per goal."""
    report = bench.format_report(results)
    for heading in ("1. Added latency", "2. Throughput", "3. ", "4. ", "Goals (issue #4)"):
        assert heading in report
    goals = bench.evaluate_goals(results)
    assert len(goals) == 10
    for goal in goals:
        verdict = "[    met]" if goal.met else "[NOT met]"
        assert f"{verdict} {goal.name}: {goal.measured}" in report


def test_agent_session_is_deterministic_and_valid_for_the_provider() -> None:
    """The same seed gives the same session, and its request passes the provider's rules."""
    first, second = bench.AgentSession(seed=3), bench.AgentSession(seed=3)
    exchanges = [first.next_exchange() for _ in range(40)]
    assert exchanges == [second.next_exchange() for _ in range(40)]
    messages = [first.first_message(), *(m for pair in exchanges for m in pair)]
    validate_tool_protocol(messages)
    body = json.loads(bench.request_body(messages, stream=True))
    check_messages_request(body)
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in messages[-1]["content"][-1]


def test_history_of_size_reaches_the_requested_body_size() -> None:
    """A history built for N bytes gives a request body of at least N bytes, not far above."""
    history = bench.history_of_size(50_000)
    size = len(bench.request_body(history, stream=False))
    longest = max(len(json.dumps(m)) for m in history[-2:])
    assert 50_000 <= size <= 50_000 + 2 * longest + 100


def test_percentile_interpolates_between_ranks() -> None:
    """p50 of 1..4 is 2.5, p0 and p100 are the extremes, and no values give NaN."""
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert bench.percentile([1.0, 2.0, 3.0], 0) == 1.0
    assert bench.percentile([1.0, 2.0, 3.0], 100) == 3.0
    assert math.isnan(bench.percentile([], 50))


async def test_child_processes_are_stopped_when_a_run_fails(tmp_path: Path) -> None:
    """An error inside a running stack stops the provider and the proxy processes."""
    started: list[bench.ManagedProcess] = []
    with pytest.raises(RuntimeError, match="boom"):
        async with bench.client_session() as client:
            async with bench.upstream_process(client, tmp_path) as upstream:
                async with bench.proxy_process(client, tmp_path, "proxy-fail", upstream.url,
                                               bench.TINY_THRESHOLDS, sticky=True) as proxy:
                    assert upstream.process is not None and proxy.process is not None
                    started = [upstream.process, proxy.process]
                    assert all(p.running for p in started)
                    raise RuntimeError("boom")
    assert len(started) == 2
    assert not any(p.running for p in started)
    assert not set(started) & set(bench.ManagedProcess.live())


def test_audit_part_compares_audit_on_and_off_in_one_run() -> None:
    """``--audit`` at the tiny size: every cell timed through both proxies and directly,
    throughput for both, entries written by the audit-on proxy only, a report with the
    ratio."""
    audit = asyncio.run(bench.run_audit_benchmark(bench.TINY, bench.TINY_THRESHOLDS))
    assert len(audit.latency) == 4
    for cell in audit.latency:
        assert finite_dist(cell.proxy, bench.TINY.latency_requests)
        assert cell.relay is not None and finite_dist(cell.relay, bench.TINY.latency_requests)
        assert cell.failures == 0
    assert audit.throughput.failures == 0 and audit.throughput.rps["relay"] > 0
    # Every timed and warm-up request of the latency cells at least, one entry each.
    assert audit.entries >= 4 * bench.TINY.latency_requests
    report = bench.format_audit_report(audit)
    assert "on/off p50" in report and "audit off" in report
