"""Typed keys for what the application and each request carry (no string keys, no globals).

The app keys are set once by :func:`proxy.app.create_app` (or its cleanup contexts) and read
by the handlers. The per-request key, ``RECORD``, lives with its record in :mod:`proxy.http.audit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import aiohttp
from aiohttp import web

from compactor import CachingCounter
from policies import RolePolicies
from proxy.config import Config
from proxy.metrics import ProxyMetrics
from proxy.state.checkpoints import SessionCheckpoints
from proxy.state.resolvers import ResolverPool
from proxy.state.store import StateStore, SummaryCache
from proxy.state.summarizer import ProviderSummarizer

if TYPE_CHECKING:
    from proxy.http.tenants import TenantScope

__all__ = [
    "CHECKPOINTS",
    "CONFIG",
    "COUNTER",
    "METRICS",
    "RESOLVERS",
    "ROLE_POLICIES",
    "STORE",
    "SUMMARIES",
    "SUMMARIZER",
    "TENANTS",
    "UPSTREAM",
]

#: The validated configuration the app was built from.
CONFIG: Final = web.AppKey("config", Config)
#: The per-session durable state (reads cached briefly; the admin API writes through it).
# A Protocol is not a concrete class, so the type lives in the annotation only.
STORE: Final[web.AppKey[StateStore]] = web.AppKey("store")
#: The store's summary cache (the store backend itself).
SUMMARIES: Final[web.AppKey[SummaryCache]] = web.AppKey("summaries")
#: The one upstream HTTP session (created in a cleanup context).
UPSTREAM: Final = web.AppKey("upstream_session", aiohttp.ClientSession)
#: The one token counter of the app, so counts are cached across requests.
COUNTER: Final = web.AppKey("token_counter", CachingCounter)
#: The per-role compaction policies and the rules that pick a role.
ROLE_POLICIES: Final = web.AppKey("role_policies", RolePolicies)
#: One source-pointer resolver per recent session (authorized by the source-access policy).
RESOLVERS: Final = web.AppKey("resolvers", ResolverPool)
#: Sticky-compaction checkpoints per session and role.
CHECKPOINTS: Final = web.AppKey("checkpoints", SessionCheckpoints)
#: The app's Prometheus metrics (own registry).
METRICS: Final = web.AppKey("metrics", ProxyMetrics)
#: ``session.scope``: whose sessions are separate (every per-session key carries the tenant).
# Typed in the annotation only: proxy.http.tenants imports the error types, which import the
# audit record, which imports these keys.
TENANTS: Final[web.AppKey[TenantScope]] = web.AppKey("tenants")
#: The L4 summary client; absent when ``summary.enabled`` is false.
SUMMARIZER: Final = web.AppKey("summarizer", ProviderSummarizer)
