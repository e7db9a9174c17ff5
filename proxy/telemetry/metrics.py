"""Prometheus metrics of one app, in the app's own registry (names: docs/operations.md).

With several workers each keeps its values under ``PROMETHEUS_MULTIPROC_DIR`` and
``/metrics`` renders their sum. In one process, what requests record is held in plain dicts
and applied when the registry is read (or :data:`MAX_HELD` wait): prometheus_client takes a
lock on every call.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable
from functools import partial
from typing import Final, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

import compactor
from proxy.accounting.usage import ProviderUsage

__all__ = ["CONTENT_TYPE", "MULTIPROCESS_ENV", "ProxyMetrics"]

#: prometheus_client's multi-process directory (a worker sets it before it makes its metrics).
MULTIPROCESS_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
#: The ``Content-Type`` of :meth:`ProxyMetrics.render`.
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Upstream latency spans a cached tiny answer (tens of ms) to a long generation (minutes).
# Signed relative error of the calibrated estimate: tight around 0 once calibrated.
_ERROR_BUCKETS = (-0.5, -0.2, -0.1, -0.05, -0.03, -0.01, 0.0, 0.01, 0.03, 0.05, 0.1, 0.2, 0.5)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 600.0)


_Metric = TypeVar("_Metric", Counter, Histogram)

#: Observations held before they are applied without a read (bounds the memory of a proxy
#: nobody scrapes).
MAX_HELD: Final = 4096
#: The ``kind`` labels of ``compact_proxy_provider_tokens_total``: a usage's field of each.
_USAGE_KINDS: Final = tuple((kind, operator.attrgetter(kind))
                            for kind in ("input", "cache_read", "cache_write", "output"))


class _Children(Generic[_Metric]):
    """The children of a labelled metric, each kept once made (``labels()`` validates and
    locks on every call; the label sets are few and fixed)."""

    __slots__ = ("_made", "_metric")

    def __init__(self, metric: _Metric) -> None:
        self._metric: _Metric = metric
        self._made: dict[tuple[str, ...], _Metric] = {}

    def __call__(self, *values: str) -> _Metric:
        """The child of ``values``, in the order of the metric's label names."""
        child = self._made.get(values)
        if child is None:
            child = self._made[values] = self._metric.labels(*values)
        return child


class _AppliedOnRead(CollectorRegistry):
    """A registry that applies what is held before every read."""

    def __init__(self, apply: Callable[[], None]) -> None:
        super().__init__(auto_describe=True)
        self._apply = apply

    def collect(self) -> Iterable[Metric]:
        self._apply()
        return super().collect()


class ProxyMetrics:
    """The collectors of one proxy app, registered in :attr:`registry`."""

    def __init__(self) -> None:
        #: Where every worker's values are (multi-process mode), or ``None``.
        self.multiprocess_dir = os.environ.get(MULTIPROCESS_ENV) or None
        # What requests recorded, not yet applied (see the module).
        self._request_counts: dict[tuple[str, str], int] = {}
        self._usages: list[ProviderUsage] = []  # clients' requests
        self._summary_usages: list[ProviderUsage] = []
        self._latencies: list[tuple[str, float]] = []
        self._errors: list[float] = []
        self._at_once = self.multiprocess_dir is not None
        self.registry: CollectorRegistry = (
            CollectorRegistry(auto_describe=True) if self._at_once
            else _AppliedOnRead(self.apply_pending))
        counter = partial(Counter, registry=self.registry)
        histogram = partial(Histogram, registry=self.registry)
        self.requests = counter("compact_proxy_requests", "Requests served, by route and outcome.",
                                ("route", "outcome"))
        self.layers = counter("compact_proxy_layers_applied",
                              "Compaction layers that ran on a forwarded view.", ("layer",))
        self.tokens_saved = counter("compact_proxy_tokens_saved",
                                    "Tokens removed from forwarded views, by layer.", ("layer",))
        self.upstream_latency = histogram(
            "compact_proxy_upstream_latency_seconds",
            "Seconds until the provider's response headers arrived.", ("route",),
            buckets=_LATENCY_BUCKETS)
        self.provider_tokens = counter(
            "compact_proxy_provider_tokens", "Tokens the provider billed for clients' requests.",
            ("kind",))
        self.summary_calls = counter(
            "compact_proxy_summary_calls", "L4 summaries asked for, by how they were obtained.",
            ("outcome",))
        self.summary_tokens = counter(
            "compact_proxy_summary_tokens", "Tokens the provider billed for summary calls.",
            ("kind",))
        self.estimate_error = histogram(
            "compact_proxy_estimate_error_ratio",
            "(calibrated estimate - provider's count) / provider's count, per forwarded view.",
            buckets=_ERROR_BUCKETS)
        self.recompacted = counter(
            "compact_proxy_requests_recompacted",
            "Requests refused by the provider as too long, compacted again and retried.")
        self.compaction_thrash = counter(
            "compact_proxy_compaction_thrash",
            "Compactions of a session that crossed the soft threshold again within a few "
            "requests of its last one (compacted deeper).")
        self.crossings = counter(
            "compact_proxy_crossings",
            "Requests that crossed the soft threshold, by how the summary was served "
            "(prepared, inline, none).", ("served",))
        self.summary_wait = histogram(
            "compact_proxy_summary_wait_seconds",
            "Seconds a crossing request waited for summaries before it was forwarded.",
            buckets=_LATENCY_BUCKETS)
        self.prepared = counter(
            "compact_proxy_prepared_summaries",
            "Summaries made ahead (summary.prepare_at): started, used, unused (replaced "
            "before a crossing used them), restarted (asked for again: the call outlived "
            "its lease without ending).", ("outcome",))
        self.prepared_tokens = counter(
            "compact_proxy_prepared_summary_tokens",
            "Tokens billed for summaries made ahead, by whether a crossing used them.",
            ("outcome",))
        self._requests = _Children(self.requests)
        self._layers = _Children(self.layers)
        self._tokens_saved = _Children(self.tokens_saved)
        self._upstream_latency = _Children(self.upstream_latency)
        self._provider_tokens = _Children(self.provider_tokens)
        self._summary_calls = _Children(self.summary_calls)
        self._summary_tokens = _Children(self.summary_tokens)

    def count_request(self, route: str, outcome: str) -> None:
        """Count one finished request."""
        key = (route, outcome)  # (an Outcome and its value are one key, as one label)
        counts = self._request_counts
        counts[key] = counts.get(key, 0) + 1
        if self._at_once:
            self.apply_pending()

    def observe_compaction(self, outcomes: Iterable[compactor.LayerOutcome]) -> None:
        """Count the layers that ran and the tokens each saved."""
        for outcome in outcomes:
            self._layers(outcome.layer).inc()
            if outcome.saved > 0:
                self._tokens_saved(outcome.layer).inc(outcome.saved)

    def observe_upstream(self, route: str, seconds: float) -> None:
        """Record the time the provider took to answer with headers."""
        self._latencies.append((route, seconds))
        if self._at_once or len(self._latencies) >= MAX_HELD:
            self.apply_pending()

    def observe_provider_usage(self, usage: ProviderUsage, *, summary: bool = False) -> None:
        """Count the tokens of one provider answer (a client's request, or a summary call)."""
        held = self._summary_usages if summary else self._usages
        held.append(usage)
        if self._at_once or len(held) >= MAX_HELD:
            self.apply_pending()

    def apply_pending(self) -> None:
        """Apply what requests recorded since the last time to the collectors."""
        requests, self._request_counts = self._request_counts, {}
        for (route, outcome), count in requests.items():
            self._requests(route, outcome).inc(count)
        for children, usages in ((self._provider_tokens, self._usages),
                                 (self._summary_tokens, self._summary_usages)):
            for kind, tokens in _USAGE_KINDS:
                total = sum(map(tokens, usages))
                if total:
                    children(kind).inc(total)
            usages.clear()
        latencies, self._latencies = self._latencies, []
        for route, seconds in latencies:
            self._upstream_latency(route).observe(seconds)
        errors, self._errors = self._errors, []
        for ratio in errors:
            self.estimate_error.observe(ratio)

    def observe_crossing(self, served: str, wait_s: float) -> None:
        """Count one crossing by how its summary was served, and the time it waited."""
        self.crossings.labels(served).inc()
        self.summary_wait.observe(wait_s)

    def count_prepared(self, outcome: str, tokens: int) -> None:
        """Count one preparation (``started``, ``used``, ``unused``, ``restarted``), with its
        tokens."""
        self.prepared.labels(outcome).inc()
        if tokens and outcome not in ("started", "restarted"):
            self.prepared_tokens.labels(outcome).inc(tokens)

    def count_summary(self, outcome: str) -> None:
        """Count one summary asked for: ``ok``, ``failed``, ``empty``, ``cached``, ``joined``."""
        self._summary_calls(outcome).inc()

    def observe_estimate_error(self, ratio: float) -> None:
        """Record one signed relative error of the calibrated estimate."""
        self._errors.append(ratio)
        if self._at_once or len(self._errors) >= MAX_HELD:
            self.apply_pending()

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format; in multi-process mode the
        sum over every worker's values."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)

