"""Typed keys for what the application and each request carry (no string keys, no globals).

The app keys are set once by :func:`proxy.app.create_app` (or its cleanup contexts) and read
by the handlers. The per-request key, ``RECORD``, lives with its record in :mod:`proxy.http.audit`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

import aiohttp
from aiohttp import web

from compactor import CachingCounter, ProtocolMemo
from policies import RolePolicies
from proxy.config import Config
from proxy.http.compute import ComputeThreads
from proxy.metrics import ProxyMetrics
from proxy.state.accounting import Accounting
from proxy.state.audit_log import RequestLog
from proxy.state.calibration import Calibration
from proxy.state.checkpoints import SessionCheckpoints
from proxy.state.ledger_buffer import BufferedLedger
from proxy.state.prepare import Preparations
from proxy.state.resolvers import ResolverPool
from proxy.state.store import StateStore, SummaryCache
from proxy.state.store_health import StoreHealth
from proxy.state.summarizer import ProviderSummarizer
from proxy.state.transcripts import TranscriptRecorder

if TYPE_CHECKING:
    from proxy.http.durable import DurableBlocks
    from proxy.http.recent import RecentBodies
    from proxy.http.spans import DecodedSpans, EncodedViews
    from proxy.http.tenants import TenantScope

__all__ = [
    "ACCOUNTING",
    "AUDIT_LOG",
    "BACKGROUND",
    "CALIBRATION",
    "CHECKPOINTS",
    "CONFIG",
    "COMPUTE",
    "COUNTER",
    "DECODED_SPANS",
    "DURABLE_BLOCKS",
    "ENCODED_VIEWS",
    "METRICS",
    "PROTOCOL_MEMO",
    "RECENT_BODIES",
    "RESOLVERS",
    "ROLE_POLICIES",
    "STORE",
    "STORE_HEALTH",
    "PREPARATIONS",
    "SUMMARIES",
    "SUMMARIZER",
    "TENANTS",
    "UPSTREAM",
    "USAGE_LEDGER",
]

#: The validated configuration the app was built from.
CONFIG: Final = web.AppKey("config", Config)
#: The per-session durable state (reads cached briefly; the admin API writes through it).
# A Protocol is not a concrete class, so the type lives in the annotation only.
STORE: Final[web.AppKey[StateStore]] = web.AppKey("store")
#: The store's availability (``/healthz``) and the rate-limited log of its outages.
STORE_HEALTH: Final = web.AppKey("store_health", StoreHealth)
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
#: Summaries made ahead of each session lane's next crossing (absent: ``summary.prepare_at``
#: null or L4 off).
PREPARATIONS: Final = web.AppKey("preparations", Preparations)
#: The app's Prometheus metrics (own registry).
METRICS: Final = web.AppKey("metrics", ProxyMetrics)
#: ``session.scope``: whose sessions are separate (every per-session key carries the tenant).
# Typed in the annotation only: proxy.http.tenants imports the error types, which import the
# audit record, which imports these keys.
TENANTS: Final[web.AppKey[TenantScope]] = web.AppKey("tenants")
#: The store's usage ledger (billed tokens per session and model).
USAGE_LEDGER: Final = web.AppKey("usage_ledger", BufferedLedger)
#: The store's audit log (one entry per request, one per change of a durable state).
AUDIT_LOG: Final[web.AppKey[RequestLog]] = web.AppKey("audit_log")
#: Turns an answered request into a ledger entry (remembers each lane's previous size).
ACCOUNTING: Final = web.AppKey("accounting", Accounting)
#: What the provider's own counts taught: correction factors and context windows.
CALIBRATION: Final = web.AppKey("calibration", Calibration)
#: Work that runs after a response (audit entries: futures and tasks), held until it ends;
#: the app waits for it at shutdown (:mod:`proxy.background`).
BACKGROUND: Final[web.AppKey[set[asyncio.Future[None]]]] = web.AppKey("background")
#: The L4 summary client; absent when ``summary.enabled`` is false.
SUMMARIZER: Final = web.AppKey("summarizer", ProviderSummarizer)
#: The durable block last rendered for each recent session (:mod:`proxy.http.durable`).
DURABLE_BLOCKS: Final[web.AppKey[DurableBlocks]] = web.AppKey("durable_blocks")
#: Decoded messages by the hash of their bytes (:mod:`proxy.http.spans`).
DECODED_SPANS: Final[web.AppKey[DecodedSpans]] = web.AppKey("decoded_spans")
#: The encoded messages of recent checkpoints' views (:mod:`proxy.http.spans`).
ENCODED_VIEWS: Final[web.AppKey[EncodedViews]] = web.AppKey("encoded_views")
#: The last body of recent conversations (:mod:`proxy.http.spans`).
RECENT_BODIES: Final[web.AppKey[RecentBodies]] = web.AppKey("recent_bodies")
#: The threads that parse and compact large bodies off the event loop (``handlers``).
COMPUTE: Final = web.AppKey("compute", ComputeThreads)
#: Walks of the tool protocol of recent histories: a warm request checks its new part only.
PROTOCOL_MEMO: Final = web.AppKey("protocol_memo", ProtocolMemo)
#: The proxy's own transcripts (``sources.record_transcripts``); absent when off.
TRANSCRIPTS: Final = web.AppKey("transcripts", TranscriptRecorder)
