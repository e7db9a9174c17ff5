"""What the request path works with: one frozen :class:`Services`, built once by
:func:`build_services` and handed to the handlers and middlewares when they are made. Each
collaborator keeps its own arithmetic; the request path only calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from aiohttp import web

import compactor
from policies import RolePolicies
from proxy.accounting.entries import Accounting
from proxy.accounting.ledger_buffer import BufferedLedger
from proxy.admin.throttle import AuthThrottle
from proxy.calibration.local import Calibration
from proxy.calibration.shared import SharedCalibration
from proxy.config import Config, ConfigError
from proxy.http.admin_gate import AdminGate
from proxy.http.background import Background
from proxy.http.compute import ComputeThreads
from proxy.http.durable import DurableBlocks
from proxy.http.fixed_part import FixedPartWarnings
from proxy.http.limits import TenantLimiter
from proxy.http.plan import RequestScope
from proxy.http.recent import RecentBodies
from proxy.http.spans import DecodedSpans, EncodedViews
from proxy.http.tenants import TenantScope
from proxy.http.upstream import Upstream
from proxy.http.upstream_headers import ForwardPolicy
from proxy.providers import Provider, make_provider, provider_of
from proxy.sources.resolvers import ResolverPool
from proxy.sources.transcripts import TranscriptRecorder
from proxy.store import CachedStateReads, StoreBackend
from proxy.store.checkpoints import SessionCheckpoints
from proxy.store.health import StoreHealth
from proxy.summary.prepare import Preparations
from proxy.telemetry.masking import mask_url
from proxy.telemetry.metrics import ProxyMetrics

if TYPE_CHECKING:
    from proxy.summary.summarizer import ProviderSummarizer

__all__ = ["Services", "build_services"]

#: Counts cached across requests (distinct blocks, least recently used evicted).
COUNTER_CACHE_ENTRIES: Final = 200_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Services:
    """The app's collaborators, each made once (absent ones ``None``: off in the config)."""

    config: Config
    provider: Provider
    upstream: Upstream
    forward_policy: ForwardPolicy
    tenants: TenantScope
    tenant_limiter: TenantLimiter
    admin_gate: AdminGate
    auth_throttle: AuthThrottle
    fixed_part: FixedPartWarnings
    metrics: ProxyMetrics
    counter: compactor.CachingCounter
    protocol_memo: compactor.ProtocolMemo
    decoded_spans: DecodedSpans
    recent_bodies: RecentBodies
    encoded_views: EncodedViews
    compute: ComputeThreads
    role_policies: RolePolicies
    resolvers: ResolverPool
    durable_blocks: DurableBlocks
    store: CachedStateReads  # reads cached briefly; the admin API writes through it
    backend: StoreBackend
    store_health: StoreHealth
    checkpoints: SessionCheckpoints
    usage_ledger: BufferedLedger
    calibration: Calibration
    accounting: Accounting
    background: Background
    preparations: Preparations | None
    summarizer: ProviderSummarizer | None
    transcripts: TranscriptRecorder | None
    shared_scope: RequestScope  # a small body's: the shared counts and walks

    def provider_of(self, request: web.Request) -> Provider | None:
        """The provider whose own path (Bedrock's, Vertex's) ``request`` came on, else None."""
        if self.provider.name == "anthropic":
            return None
        return provider_of(request, self.provider)


def _token_counter(config: Config) -> compactor.CachingCounter:
    try:
        base = (compactor.Chars4Counter() if config.compaction.token_counter == "chars4"
                else compactor.TiktokenCounter())
    except RuntimeError as exc:
        raise ConfigError("compaction.token_counter", str(exc)) from None
    return compactor.CachingCounter(base, max_entries=COUNTER_CACHE_ENTRIES)


def build_services(config: Config, backend: StoreBackend) -> Services:
    """Every collaborator of the request path, from a validated config and its store
    (ConfigError for a setting that cannot work here)."""
    base_url = config.upstream.require_base_url()
    provider = make_provider(config)
    metrics = ProxyMetrics()
    # Shared through the store when other processes serve from it, else this process's own.
    ttl = config.compaction.learnt_window_ttl_s
    calibration = (SharedCalibration(backend, window_ttl_s=ttl) if backend.shared
                   else Calibration(window_ttl_s=ttl))
    # The calibration another process wrote comes with the versions: one round trip.
    store = (CachedStateReads(backend, listeners=[calibration.refresh], fetch=calibration.wanted)
             if isinstance(calibration, SharedCalibration) else CachedStateReads(backend))
    health = StoreHealth(backend, on_unavailable=config.store.on_unavailable)
    ledger = BufferedLedger(backend, unavailable=health.note_unavailable)
    summary = config.summary
    summarizer = None
    if summary.enabled:
        from proxy.summary.summarizer import ProviderSummarizer

        summarizer = ProviderSummarizer(summary, base_url, config.summary_api_key(),
                                        provider=provider)
    sources = config.sources
    admin = config.admin
    # Half for spans by their bytes, half for the last body of each conversation.
    decoded_half = config.limits.decoded_cache_bytes // 2
    counter, memo = _token_counter(config), compactor.ProtocolMemo()
    return Services(
        config=config,
        provider=provider,
        upstream=Upstream(config.upstream, mask_url(base_url)),
        forward_policy=ForwardPolicy.from_config(config),
        tenants=TenantScope.from_config(config.session),
        tenant_limiter=TenantLimiter(config.limits.max_concurrent_per_tenant),
        admin_gate=AdminGate(separate=admin.listen is not None),
        auth_throttle=AuthThrottle(admin.failed_auth_limit, admin.lockout_s,
                                   admin.max_lockout_s),
        fixed_part=FixedPartWarnings(),
        metrics=metrics,
        counter=counter,
        protocol_memo=memo,
        decoded_spans=DecodedSpans(decoded_half),
        recent_bodies=RecentBodies(max_bytes=decoded_half),
        encoded_views=EncodedViews(),
        compute=ComputeThreads(),
        role_policies=config.role_policies(),
        resolvers=ResolverPool(sources.transcript_root, sources.artifact_root,
                               config.source_access(), s3=sources.s3_settings()),
        durable_blocks=DurableBlocks(),
        store=store,
        backend=backend,
        store_health=health,
        checkpoints=SessionCheckpoints(backend),
        usage_ledger=ledger,
        calibration=calibration,
        accounting=Accounting(),
        background=Background(health),
        preparations=(Preparations(
            backend, metrics, summary.max_tokens, ledger, prepare_at=summary.prepare_at,
            # Every try of a call has ended by then, unless its process died.
            lifetime_s=summary.timeout_s * (summary.max_retries + 1))
            if summary.enabled and summary.prepare_at is not None else None),
        summarizer=summarizer,
        transcripts=(TranscriptRecorder(sources.transcript_root, sources.transcript_max_bytes)
                     if sources.record_transcripts else None),
        shared_scope=RequestScope(counter, memo),
    )
