"""Prometheus metrics of one app, in the app's own registry (no process-global collectors).

Names:

- ``compact_proxy_requests_total{route, outcome}`` — every request, by how it ended;
- ``compact_proxy_layers_applied_total{layer}`` — how often each compaction layer ran;
- ``compact_proxy_tokens_saved_total{layer}`` — tokens each layer removed from forwarded views;
- ``compact_proxy_upstream_latency_seconds{route}`` — time until the provider's response
  headers arrived (streamed bodies continue after that).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

import compactor

__all__ = ["CONTENT_TYPE", "ProxyMetrics"]

#: The ``Content-Type`` of :meth:`ProxyMetrics.render`.
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Upstream latency spans a cached tiny answer (tens of ms) to a long generation (minutes).
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 600.0)


class ProxyMetrics:
    """The collectors of one proxy app, registered in :attr:`registry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "compact_proxy_requests", "Requests served, by route and outcome.",
            ("route", "outcome"), registry=self.registry,
        )
        self.layers = Counter(
            "compact_proxy_layers_applied", "Compaction layers that ran on a forwarded view.",
            ("layer",), registry=self.registry,
        )
        self.tokens_saved = Counter(
            "compact_proxy_tokens_saved", "Tokens removed from forwarded views, by layer.",
            ("layer",), registry=self.registry,
        )
        self.upstream_latency = Histogram(
            "compact_proxy_upstream_latency_seconds",
            "Seconds until the provider's response headers arrived.",
            ("route",), buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

    def count_request(self, route: str, outcome: str) -> None:
        """Count one finished request."""
        self.requests.labels(route=route, outcome=outcome).inc()

    def observe_compaction(self, outcomes: Iterable[compactor.LayerOutcome]) -> None:
        """Count the layers that ran and the tokens each saved."""
        for outcome in outcomes:
            self.layers.labels(layer=outcome.layer).inc()
            if outcome.saved > 0:
                self.tokens_saved.labels(layer=outcome.layer).inc(outcome.saved)

    def observe_upstream(self, route: str, seconds: float) -> None:
        """Record the time the provider took to answer with headers."""
        self.upstream_latency.labels(route=route).observe(seconds)

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)

