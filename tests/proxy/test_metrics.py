"""Tests for proxy.metrics: each recording method counts under the labels it is given."""

from __future__ import annotations

from compactor import LayerOutcome
from proxy.http.audit import Outcome
from proxy.metrics import ProxyMetrics
from proxy.state.usage import ProviderUsage


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
