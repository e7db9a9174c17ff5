"""Smoke test of ``bench/proxy.py``: every part runs at a tiny size against real processes
(the stamped fake provider and ``proxy.cli.commands serve``) and reports well-formed numbers.

Nothing here asserts a timing: the numbers must be present, finite and consistent with each
other, and the views the proxy forwarded must have been accepted by the strict provider.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
from pathlib import Path

import pytest

import bench.proxy as bench
from bench.proxy_parts import latency
from compactor import validate_tool_protocol
from proxy.fake_upstream import check_messages_request

pytestmark = pytest.mark.slow

# The default text reply streams as message_start, ping, content_block_start, 1-3 deltas,
# content_block_stop, message_delta, message_stop.
MIN_EVENTS_PER_STREAM = 7


@pytest.fixture(scope="module")
def results() -> bench.BenchResults:
    """One whole benchmark run at the tiny size (both session modes; LiteLLM is never
    needed, and not looked for)."""
    return asyncio.run(bench.run_benchmark(bench.TINY, bench.TINY_THRESHOLDS, litellm=False))


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


def test_every_target_has_its_own_time_and_every_hop_its_cpu_per_request(
    results: bench.BenchResults,
) -> None:
    """The provider reported its time on every answer (JSON and stream), so every target of
    every cell has an own time below its latency; every hop process has a CPU figure."""
    cells = [*results.latency, *results.warm, results.cold]
    for cell in cells:
        assert cell is not None
        assert set(cell.own) == set(cell.targets)
        for target in cell.targets:
            latency = cell.latency(target)
            assert latency is not None
            assert finite_dist(cell.own[target], latency.n)
            assert cell.own[target].p50 <= latency.p50
        assert set(cell.cpu_ms) == set(cell.targets) - {"direct"}
        assert all(math.isfinite(ms) and ms >= 0 for ms in cell.cpu_ms.values())
        assert cell.body_bytes > 0


def test_warm_part_has_three_growing_sizes_and_a_flatness(results: bench.BenchResults) -> None:
    """Small, large (part 1's json cell) and huge, in order of size; a finite flatness."""
    sizes = [cell.body_bytes for cell in results.warm]
    assert len(sizes) == 3 and sizes == sorted(sizes)
    assert results.warm[1] is results.latency[2]
    assert sizes[0] >= bench.TINY.small_bytes and sizes[2] >= bench.TINY.huge_bytes
    assert all(finite_dist(cell.own["proxy"], bench.TINY.latency_requests)
               for cell in results.warm)
    assert math.isfinite(bench.warm_flatness(results))
    assert all(math.isfinite(bench.added_p50(cell, target, over))
               for cell in results.warm
               for target, over in (("proxy", "direct"), ("relay", "direct"), ("proxy", "relay")))
    # Above the threshold, the warm cells are forwarded compacted.
    assert results.warm[2].layers


def test_machine_meter_covers_every_part_with_shares_of_the_machine(
    results: bench.BenchResults,
) -> None:
    """One entry per measured part; busy and others' shares are fractions, others <= busy."""
    assert [name for name, _, _ in results.machine] == [
        "1 latency", "2 warm sizes", "3 cold", "4 throughput", "6 streams", "7 session"]
    for _, busy, others in results.machine:
        assert 0.0 <= others <= busy <= 1.0 + 1e-9


def test_cold_cell_compacts_every_request_from_scratch(results: bench.BenchResults) -> None:
    """Every timed request of the cold cell is a new session, compacted (no baseline here)."""
    cold = results.cold
    assert cold is not None and cold.failures == 0
    assert cold.proxy.n == bench.TINY.cold_requests
    assert cold.layers and "baseline" not in cold.others


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
    assert set(t.rps) == {"proxy", "direct", "relay", bench.RELAY_UVLOOP}
    assert all(rate > 0 for rate in t.rps.values())
    assert t.ratio == pytest.approx(t.proxy_rps / t.direct_rps)
    assert t.relay_ratio == pytest.approx(t.rps["relay"] / t.direct_rps)
    assert t.cpu_ms["proxy"].keys() == {"client", "proxy", "provider"}
    assert t.cpu_ms["direct"].keys() == {"client", "provider"}
    assert t.cpu_ms["relay"].keys() == {"client", "relay", "provider"}
    assert t.cpu_ms[bench.RELAY_UVLOOP].keys() == {"client", bench.RELAY_UVLOOP, "provider"}
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
    for heading in ("1. Latency and own time", "2. Warm history at three sizes", "3. Cold",
                    "4. Throughput", "5. CPU per request", "6. ", "7. ", "Goals (issue #4)",
                    "Goals (issue #13)", "LiteLLM: not measured"):
        assert heading in report
    part5 = report.split("5. CPU per request")[1].split("6. ")[0]
    assert "streamed, nothing to do" in part5 and "bare relay, " in part5
    # the relay on the proxy's loop too, and the proxy's CPU over it
    assert "bare relay on uvloop, " in part5 and "bare relay on uvloop, 20 KB streamed" in part5
    same_loop = re.search(r"over the bare relay on uvloop: ([\d.]+)x sequential, ([\d.]+)x at "
                          r"c\d+, ([\d.]+)x streamed", part5)
    assert same_loop is not None and all(float(x) > 0 for x in same_loop.groups())
    goals = bench.evaluate_goals(results)
    assert [g.issue for g in goals] == [4] * 10 + [13] * 5
    for goal in goals:
        assert goal.verdict in ("[    met]", "[NOT met]", "[    n/a]")
        assert f"{goal.verdict} {goal.name}: {goal.measured}" in report
    # Without --baseline the cold goal is not judged, and says how to judge it.
    cold_goal = goals[-1]
    assert not cold_goal.judged and "--baseline" in cold_goal.measured


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


def test_a_warm_cell_spreads_its_requests_over_sessions_of_a_bounded_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More timed requests than a session may serve: every one is timed, the history stays near
    its nominal size (one block's growth), and the proxy's CPU per request is still read."""
    monkeypatch.setattr(latency, "WARM_BLOCK", 2)
    messages = bench.history_of_size(bench.TINY.large_bytes)

    async def run() -> bench.LatencyCell:
        async with bench.client_session() as client:
            async with bench.upstream_process(client, tmp_path) as upstream, \
                    bench.proxy_process(client, tmp_path, "proxy-blocks", upstream.url,
                                        bench.TINY_THRESHOLDS, sticky=True) as proxy:
                targets = bench.Targets(proxy.url, upstream.url,
                                        pids=(("proxy", bench._pid(proxy)),))
                return await bench._growing_cell(client, targets, messages, 5, stream=False,
                                                 label="blocks", session_id="bench-blocks")

    cell = asyncio.run(run())
    assert cell.failures == 0
    assert finite_dist(cell.proxy, 5) and finite_dist(cell.own["proxy"], 5)
    nominal = len(bench.request_body(messages, stream=False))
    grown = len(bench.request_body([*messages, *bench.tiny_exchange(0)], stream=False)) - nominal
    # Each session: 3 warm-ups and at most 2 timed requests, one exchange each.
    assert nominal < cell.body_bytes <= nominal + 5 * grown + 100
    assert set(cell.cpu_ms) == {"proxy"} and cell.cpu_ms["proxy"] > 0


def test_litellm_missing_is_a_note_not_an_error(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``$LITELLM_BIN`` naming nothing, LiteLLM is not found and the hop says how to
    install it; no process is started."""
    monkeypatch.setenv(bench.LITELLM_ENV, str(tmp_path / "no-such-litellm"))
    assert bench.find_litellm() is None

    async def run() -> bench.ExtraHop:
        async with bench.client_session() as client:
            async with bench.litellm_process(client, tmp_path, "http://127.0.0.1:9") as hop:
                return hop

    hop = asyncio.run(run())
    assert hop.service is None
    assert hop.note.startswith("LiteLLM: not installed") and "pip install" in hop.note


def test_litellm_config_points_the_anthropic_provider_at_the_fake_one(tmp_path: Path) -> None:
    """The model goes to the ``anthropic`` provider with the fake provider as ``api_base``."""
    import yaml

    config = yaml.safe_load(bench.write_litellm_config(tmp_path, "http://127.0.0.1:1234")
                            .read_text(encoding="utf-8"))
    params = config["model_list"][0]["litellm_params"]
    assert config["model_list"][0]["model_name"] == bench.MODEL
    assert params["model"] == f"anthropic/{bench.MODEL}"
    assert params["api_base"] == "http://127.0.0.1:1234"


def test_baseline_worktree_is_made_and_removed(tmp_path: Path) -> None:
    """``--baseline``'s worktree holds the ref's files and is gone (from disk and from
    ``git worktree list``) afterwards."""
    path = tmp_path / "baseline-src"
    with bench.baseline_worktree("HEAD", path) as source:
        assert (source / "bench" / "proxy.py").is_file()
    assert not path.exists()
    listed = subprocess.run(["git", "-C", str(bench._ROOT), "worktree", "list"],
                            capture_output=True, text=True, check=True).stdout
    assert str(path) not in listed
    with pytest.raises(bench.BenchError, match="worktree add failed"):
        with bench.baseline_worktree("no-such-ref-0123", tmp_path / "bad"):
            pass


def test_provider_time_is_read_from_the_header_or_the_last_field() -> None:
    """The header wins (also LiteLLM's ``llm_provider-`` copy); else the last field of the
    body (a stream's last event has the whole time); else nothing."""
    header = {bench.PROVIDER_MS_HEADER: "1.5"}
    assert bench._provider_ms(header, b'{"bench_provider_ms": 9}') == 1.5
    assert bench._provider_ms({"llm_provider-x-bench-provider-ms": "2.25"}, b"") == 2.25
    stream = b'data: {"bench_provider_ms":0.5}\n\ndata: {"bench_provider_ms":0.75}\n\n'
    assert bench._provider_ms({}, stream) == 0.75
    assert bench._provider_ms({}, b"{}") is None


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
