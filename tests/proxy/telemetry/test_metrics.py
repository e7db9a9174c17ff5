"""Tests for proxy.telemetry.metrics: each recording method counts under the labels it is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compactor import LayerOutcome
from proxy.accounting.usage import ProviderUsage
from proxy.http.audit import Outcome
from proxy.telemetry.metrics import MAX_HELD, MULTIPROCESS_ENV, ProxyMetrics


def test_every_sample_is_counted_under_its_own_labels() -> None:
    """A label set counted again adds to the same sample (an Outcome and its value are one
    label); a label set never counted, or counted 0, has no sample."""
    metrics = ProxyMetrics()
    metrics.count_request("messages", Outcome.FORWARDED)
    metrics.count_request("messages", "forwarded")
    metrics.count_request("healthz", Outcome.OK)
    metrics.observe_compaction([LayerOutcome("L1", 100, 60, 40, 2, True),
                                LayerOutcome("L2", 60, 60, 0, 0, True)])
    metrics.observe_compaction([LayerOutcome("L1", 50, 40, 10, 1, True)])
    metrics.observe_upstream("messages", 0.02)
    metrics.observe_upstream("messages", 0.2)
    metrics.observe_provider_usage(ProviderUsage(input=1, cache_read=2, output=4))
    metrics.observe_provider_usage(ProviderUsage(input=5))
    metrics.observe_provider_usage(ProviderUsage(input=7, cache_write=3), summary=True)
    metrics.count_summary("ok")
    metrics.count_summary("cached")
    metrics.count_summary("ok")

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("compact_proxy_requests_total", route="messages", outcome="forwarded") == 2
    assert sample("compact_proxy_requests_total", route="healthz", outcome="ok") == 1
    assert sample("compact_proxy_layers_applied_total", layer="L1") == 2
    assert sample("compact_proxy_layers_applied_total", layer="L2") == 1
    assert sample("compact_proxy_tokens_saved_total", layer="L1") == 50
    assert sample("compact_proxy_tokens_saved_total", layer="L2") is None
    assert sample("compact_proxy_upstream_latency_seconds_count", route="messages") == 2
    assert sample("compact_proxy_upstream_latency_seconds_bucket", route="messages",
                  le="0.025") == 1
    assert [sample("compact_proxy_provider_tokens_total", kind=kind)
            for kind in ("input", "cache_read", "cache_write", "output")] == [6, 2, None, 4]
    assert [sample("compact_proxy_summary_tokens_total", kind=kind)
            for kind in ("input", "cache_read", "cache_write", "output")] == [7, None, 3, None]
    assert sample("compact_proxy_summary_calls_total", outcome="ok") == 2
    assert sample("compact_proxy_summary_calls_total", outcome="cached") == 1


def _own(metric: Any, suffix: str, **labels: str) -> float | None:
    """A sample as the collector itself holds it (not through the registry, whose read
    applies what is held first)."""
    for family in metric.collect():
        for found in family.samples:
            if found.name.endswith(suffix) and found.labels == labels:
                return float(found.value)
    return None


def test_what_requests_record_is_applied_when_the_registry_is_read() -> None:
    """In one process, requests' counts, latencies, tokens and errors wait in plain dicts:
    the collectors have not seen them, a read of the registry applies them all first."""
    metrics = ProxyMetrics()
    metrics.count_request("messages", Outcome.FORWARDED)
    metrics.observe_upstream("messages", 0.02)
    metrics.observe_provider_usage(ProviderUsage(input=3))
    metrics.observe_estimate_error(0.01)
    assert _own(metrics.requests, "_total", route="messages", outcome="forwarded") is None
    assert _own(metrics.estimate_error, "_count") == 0
    rendered = metrics.render().decode()
    assert 'compact_proxy_requests_total{outcome="forwarded",route="messages"} 1.0' in rendered
    assert _own(metrics.upstream_latency, "_count", route="messages") == 1
    assert _own(metrics.provider_tokens, "_total", kind="input") == 3
    assert _own(metrics.estimate_error, "_count") == 1
    metrics.count_request("messages", "forwarded")
    assert metrics.registry.get_sample_value(
        "compact_proxy_requests_total", {"route": "messages", "outcome": "forwarded"}) == 2


def test_observations_nobody_reads_are_applied_every_max_held() -> None:
    metrics = ProxyMetrics()
    for _ in range(MAX_HELD + 1):
        metrics.observe_upstream("messages", 0.02)
    assert _own(metrics.upstream_latency, "_count", route="messages") == MAX_HELD
    for _ in range(MAX_HELD + 1):
        metrics.observe_estimate_error(0.0)
    assert _own(metrics.estimate_error, "_count") == MAX_HELD


def test_with_several_processes_every_record_is_applied_at_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another worker's /metrics reads the shared files, never this process's dicts."""
    monkeypatch.setenv(MULTIPROCESS_ENV, str(tmp_path))
    metrics = ProxyMetrics()
    metrics.count_request("messages", "forwarded")
    metrics.observe_upstream("messages", 0.02)
    metrics.observe_provider_usage(ProviderUsage(output=4), summary=True)
    metrics.observe_estimate_error(0.01)
    assert _own(metrics.requests, "_total", route="messages", outcome="forwarded") == 1
    assert _own(metrics.upstream_latency, "_count", route="messages") == 1
    assert _own(metrics.summary_tokens, "_total", kind="output") == 4
    assert _own(metrics.estimate_error, "_count") == 1
