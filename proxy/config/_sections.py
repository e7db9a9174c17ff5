"""The sections of the request path, in SPEC §3 order: where the proxy listens, its limits, the
provider, compaction, the summary call, the store, the sources and the sessions.

The five compaction thresholds are declared once, in :class:`policies._compaction.Thresholds`:
:class:`CompactionConfig` extends it and :class:`RoleOverride` makes each of them optional.
"""

from __future__ import annotations

import importlib.util
from dataclasses import field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic import Strict, model_validator

from policies._compaction import Ratio, Text, Thresholds, invalid
from policies._roles import HeaderName
from proxy.config._base import (
    Bool,
    EnvName,
    HttpUrl,
    NonNegative,
    Port,
    Positive,
    RedisUrl,
    Scope,
    Seconds,
    Section,
    doc,
    section,
)
from proxy.config._errors import ConfigError
from proxy.sources.s3_roots import S3Settings, is_s3_url, parse_s3_root

#: The event loops a serving process can run on (:mod:`proxy.server.event_loop`).
EventLoopName = Literal["uvloop", "asyncio"]


@section("listen")
class ListenConfig(Section):
    """Where the proxy listens, in how many processes, how long it waits for callers that hold
    connections, and how it stops."""

    host: Annotated[Text, doc(
        "Address to bind: 127.0.0.1 is loopback only, 0.0.0.0 listens on every interface."
    )] = "127.0.0.1"
    port: Annotated[Port, doc(
        "TCP port (0: any free port). Agents use ANTHROPIC_BASE_URL=http://<host>:<port>."
    )] = 8787
    workers: Annotated[int, Strict(), Ge(1), Le(256), doc(
        "Processes serving the port together (SO_REUSEPORT, Linux and BSD), sharing the store. "
        "With more than one, `serve` supervises them: a worker that dies is restarted, and "
        "SIGTERM / SIGINT stops them all. `serve --workers N` overrides it."
    )] = 1
    drain_timeout_s: Annotated[Seconds, doc(
        "On SIGTERM / SIGINT, how long the requests and streams in flight may take to finish "
        "after the proxy stops accepting; what is left then is cancelled."
    )] = 60.0
    event_loop: Annotated[EventLoopName, doc(
        "The event loop each serving process runs on: uvloop (libuv's, in C) or asyncio (the "
        "standard library's, where uvloop is not supported); the startup log line's "
        "event_loop field says which one runs."
    )] = "uvloop"
    header_timeout_s: Annotated[Seconds, doc(
        "How long a request's headers may take to arrive whole, from the connection's opening "
        "or from its previous answer; also how long an idle keep-alive connection stays open. "
        "A slower connection is closed (proxy.http.connections)."
    )] = 30.0
    body_timeout_s: Annotated[Seconds, doc(
        "How long a request body may take to arrive whole after its headers; past it, 408 "
        "invalid_request_error and the connection is closed."
    )] = 120.0
    max_connections: Annotated[Positive, doc(
        "Client connections open at once, per serving process; one more gets an immediate 503 "
        "overloaded_error (retry-after: 1) and is closed. Lowered at startup to half the "
        "open-files limit (the soft limit is raised to the hard one)."
    )] = 4096


@section("limits")
class LimitsConfig(Section):
    """Request limits, per tenant and in all, and the memory kept across requests."""

    max_body_bytes: Annotated[Positive, doc(
        "Largest request body accepted, in bytes; a larger one gets 413 request_too_large."
    )] = 32 * 1024 * 1024
    max_json_objects: Annotated[Positive, doc(
        "JSON objects a request body may hold (real agent bodies: about 3.5 per KB); more get "
        "413 request_too_large."
    )] = 200_000
    max_concurrent_per_tenant: Annotated[Positive, doc(
        "Requests of one tenant (session.scope) in flight at once, per serving process; the "
        "next gets 429 rate_limit_error with retry-after: 1, before its body is read. Forwarded "
        "routes only (not /healthz, /metrics, /admin; proxy.http.limits)."
    )] = 256
    decoded_cache_bytes: Annotated[NonNegative, doc(
        "Bytes of memory for messages kept decoded across requests (over-estimated from their "
        "JSON; half by message, half for each conversation's last body), so a warm request decodes "
        "only what is new; only requests the provider accepted add to it. 0: none kept."
    )] = 256 * 1024 * 1024


@section("upstream")
class UpstreamConfig(Section):
    """The real provider."""

    base_url: Annotated[HttpUrl | None, doc(
        "The provider's base URL, e.g. https://api.anthropic.com. Required by `serve` and "
        "`check-config` (only the demo runs without it).",
        example="https://api.anthropic.com")] = None
    connect_timeout_s: Annotated[Seconds, doc(
        "Time allowed to open the connection to the provider; exceeding it answers 504 "
        "api_error."
    )] = 10.0
    read_timeout_s: Annotated[Seconds, doc(
        "How long to wait for the provider's answer or its next bytes (a stream can pause while "
        "the model thinks); then 504, or an error event mid-stream, at most 1 s late (a quarter of "
        "it if shorter). Time on a slow client or a body still uploading does not count."
    )] = 600.0
    max_connections: Annotated[Positive, doc(
        "Connections to the provider open at once; each streamed answer holds one."
    )] = 1000
    pool_wait_s: Annotated[Seconds, doc(
        "How long a request may take to get a connection to the provider: a free one when all "
        "max_connections are busy, or a new one opened (the TCP connect is also bounded by "
        "connect_timeout_s). Past it, 529 overloaded_error with retry-after: 1."
    )] = 5.0

    provider: Annotated[Literal["anthropic", "bedrock", "vertex"], doc(
        "Which API the provider speaks: anthropic (the Messages API), bedrock (Amazon Bedrock, "
        "signed with SigV4; docs/bedrock.md) or vertex (Google Vertex AI, a Google access token; "
        "docs/vertex.md), base_url as those pages show. Clients may then also use that provider's "
        "own paths.")
    ] = "anthropic"
    aws_region: Annotated[Text | None, doc(
        "bedrock: the AWS region SigV4 signs for (the requests do not carry it). Unset: "
        "AWS_REGION or AWS_DEFAULT_REGION, else the profile's region.",
        example="us-east-1")] = None
    aws_profile: Annotated[Text | None, doc(
        "bedrock: the AWS profile whose credentials sign. Unset: the default credential "
        "chain (environment, shared files, container or instance role). A client's own "
        "Bedrock API key (Authorization: Bearer) is forwarded instead of signing.",
        example="bedrock")] = None
    vertex_token_env: Annotated[EnvName | None, doc(
        "vertex: an environment variable holding the access token to send (tests, "
        "air-gapped setups). Unset: Google application-default credentials (google-auth). A "
        "client's own Authorization header is forwarded instead.",
        example="VERTEX_ACCESS_TOKEN")] = None
    vertex_project: Annotated[Text | None, doc(
        "vertex: the project of summary calls made on their own (summary.mode separate); "
        "a call forked from a request goes to that request's project and location.",
        example="my-project")] = None
    vertex_region: Annotated[Text | None, doc(
        "vertex: the location of summary calls made on their own (summary.mode separate).",
        example="us-east5")] = None

    def require_base_url(self) -> str:
        """``base_url``, which serving needs: the one check that it is set (a ConfigError)."""
        if self.base_url is None:
            raise ConfigError("upstream.base_url",
                              "required (the provider, e.g. https://api.anthropic.com)")
        return self.base_url


@section("compaction")
class CompactionConfig(Thresholds, Section):
    """The compaction thresholds every role starts from (``policies.roles`` changes them per
    role). Thresholds count the whole prompt: messages, system, tools and the durable block,
    as the provider would count it."""

    token_counter: Annotated[Literal["tiktoken", "chars4"], doc(
        "How tokens are counted: tiktoken (a local BPE tokenizer, no network) or chars4 (4 "
        "characters per token, cheapest). Global: no role changes it."
    )] = "tiktoken"
    sticky: Annotated[Bool, doc(
        "Once a session's view was compacted, later requests that extend the same history "
        "reuse the identical compacted prefix (so the provider's prompt cache keeps hitting and "
        "L4 runs once per crossing, not per request) until the soft threshold is crossed again."
    )] = True
    compact_to_ratio: Annotated[Ratio, doc(
        "Sticky mode: a compaction, once started, goes on until the view is below "
        "soft_threshold_tokens × compact_to_ratio, so the next crossing is far away."
    )] = 0.7
    user_text_budget_tokens: Annotated[NonNegative | None, doc(
        "What a person typed (user text, not a tool result or harness injection) in a span L3 "
        "drops or L4 summarises is kept verbatim next to the summary (or where L3 cut), newest "
        "first, up to this many tokens. null: a tenth of soft_threshold_tokens; 0: none.", 8000
    )] = None
    artifact_trail_budget_tokens: Annotated[NonNegative | None, doc(
        "The files read, written or edited and commands run (with exit status where shown) by a "
        "dropped or summarised span's tool calls, kept exactly with the summary, deduplicated, "
        "newest last, up to this many tokens (oldest go first; a command alone over it keeps its "
        "first line's start). null: a twentieth of soft_threshold_tokens; 0: none.", 4000
    )] = None
    calibration: Annotated[Bool, doc(
        "Scale the proxy's token count by a factor learnt per session and model from the "
        "provider's usage (new sessions start from their tenant's). A refusal 'prompt is too long: "
        "N tokens > M maximum' is not shown: the request is compacted below M and retried once, M "
        "kept as the tenant's window for the model (learnt_window_ttl_s)."
    )] = True
    learnt_window_ttl_s: Annotated[Seconds, doc(
        "How long a context window learnt from 'prompt is too long' clamps that tenant's "
        "thresholds for the model (forgotten sooner when the provider accepts a larger view)."
    )] = 600.0


#: The model of a ``separate`` summary call when ``summary.model`` is not set (SPEC §3).
SEPARATE_SUMMARY_MODEL = "claude-haiku-4-5"
#: The share of ``summary.context_window_tokens`` one summary call may fill (counts are
#: estimates: the rest is a margin).
SUMMARY_WINDOW_SHARE = 0.9


@section("summary")
class SummaryConfig(Section):
    """The L4 summarizer: how the summary call is made through the anthropic SDK, and its
    limits."""

    enabled: Annotated[Bool, doc("L4 on or off: false, it never runs, for any role.")] = True
    mode: Annotated[Literal["fork", "separate"], doc(
        "fork: the summary call is the client's own request (its headers, query, system, tools and "
        "model; the conversation up to the kept turns, then a user turn asking for the summary; no "
        "thinking, not streamed), so client-only credentials work and the prompt hits the "
        "provider's cache. separate: the proxy's own request, its own system prompt, the old "
        "messages as a JSON transcript."
    )] = "fork"
    model: Annotated[Text | None, doc(
        "Model of the summary call; null: the client's model (fork), claude-haiku-4-5 "
        "(separate)."
    )] = None
    max_tokens: Annotated[Positive, doc("max_tokens of the summary call.")] = 2048
    timeout_s: Annotated[Seconds, doc(
        "How long one summary call may take; also how long a request waits for the same "
        "summary another request is already asking for."
    )] = 60.0
    api_key_env: Annotated[EnvName | None, doc(
        "Mode separate: the environment variable holding an API key for summary calls, spent only "
        "for a caller whose own credential the provider accepted (a 2xx to its request, else one "
        "GET /v1/models with it). null: the caller's own credentials, as in mode fork."
    )] = None
    max_retries: Annotated[NonNegative, doc("Retries of a failed summary call.")] = 2
    context_window_tokens: Annotated[Positive, doc(
        "Context window of the summary model. A call whose prompt would not fit in 90% of it "
        "less max_tokens is made in pieces: parts of the conversation summarised one by one, "
        "then one call merging those summaries."
    )] = 200_000
    prepare_at: Annotated[float | None, Strict(), Gt(0), Lt(1), doc(
        "Zero-wait compaction: once a session's view (as the provider counts it) reaches this "
        "fraction of soft_threshold_tokens, the summary the next crossing needs is made in the "
        "background (one call per session and span, across replicas). null: made at the crossing."
    )] = 0.8

    @model_validator(mode="after")
    def _window_holds_an_answer(self) -> SummaryConfig:
        if self.prompt_budget < 1:
            raise invalid("context_window_tokens", (
                f"must leave room for max_tokens ({self.max_tokens}) and a "
                f"{round((1 - SUMMARY_WINDOW_SHARE) * 100)}% margin, got "
                f"{self.context_window_tokens}"))
        return self

    @property
    def prompt_budget(self) -> int:
        """The tokens one summary call's prompt may have: the window, less the margin and
        room for ``max_tokens``."""
        return int(self.context_window_tokens * SUMMARY_WINDOW_SHARE) - self.max_tokens

    def call_model(self, client_model: str | None) -> str:
        """The model of a summary call: ``model``, else the client's (``fork``), else
        :data:`SEPARATE_SUMMARY_MODEL`."""
        if self.model is not None:
            return self.model
        if self.mode == "fork" and client_model:
            return client_model
        return SEPARATE_SUMMARY_MODEL


@section("store")
class StoreConfig(Section):
    """Where per-session state (durable context, cached summaries, the audit log) lives."""

    backend: Annotated[Literal["sqlite", "redis"], doc(
        "sqlite (an embedded file) or redis (shared by several proxy processes or replicas)."
    )] = "sqlite"
    path: Annotated[Text, doc(
        "The SQLite database file (backend sqlite), created 0600 with its -wal and -shm."
    )] = "./compact-proxy-state/state.db"
    url: Annotated[RedisUrl | None, doc(
        "The Redis URL; required when backend is redis, else unused.",
        example="redis://127.0.0.1:6379/0")] = None
    redis_mode: Annotated[Literal["standalone", "cluster", "sentinel"], doc(
        "What url names: standalone (one server), cluster (any node of a Redis Cluster; "
        "database 0) or sentinel (the Sentinels, redis://host:26379,host:26379/0, with the "
        "primary's credentials). Every key of a session is in one hash slot."
    )] = "standalone"
    sentinel_service: Annotated[Text | None, doc(
        "The name the Sentinels monitor the primary under; required when redis_mode is "
        "sentinel."
    )] = None
    on_unavailable: Annotated[Literal["reject", "forward"], doc(
        "While the store cannot be reached: reject (503 api_error; forwarding would drop the facts "
        "pinned for the session) or forward (without the durable block and sticky compaction). "
        "Either way store_unavailable is logged at most once a second and /healthz answers 503."
    )] = "reject"

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StoreConfig:
        if self.backend == "redis" and self.url is None:
            raise invalid("url", "required when store.backend is redis")
        if self.backend == "redis" and self.redis_mode == "sentinel" and not self.sentinel_service:
            raise invalid("sentinel_service", "required when store.redis_mode is sentinel")
        if self.redis_mode != "standalone" and (self.url or "").startswith("unix:"):
            raise invalid("url", f"a unix:// socket cannot be store.redis_mode {self.redis_mode}")
        return self


@section("sources.s3")
class S3SourcesConfig(Section):
    """The object store of ``s3://`` roots (unused for paths). Credentials come from the
    standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or
    files."""

    endpoint_url: Annotated[HttpUrl | None, doc(
        "An S3-compatible service's URL (path-style requests); null: AWS S3.",
        example="http://minio.internal:9000")] = None
    region: Annotated[Text | None, doc(
        "The signing region; null: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1."
    )] = None


@section("sources")
class SourcesConfig(Section):
    """Where source pointers resolve. A root is a path or an ``s3://<bucket>/<prefix>`` URL
    (replicas on several hosts share no disk; needs the s3 extra: pip install
    'compact-proxy[s3]'); the two may differ in kind (e.g. local transcripts, artifacts in a
    bucket). With session.scope on, each tenant's sources are in ``<root>/<tenant>/``."""

    transcript_root: Annotated[Text, doc(
        "Where transcript pointers resolve: <transcript_root>/<session_id>.jsonl.",
        example="s3://team-sources/transcripts")] = "./compact-proxy-state/transcripts"
    artifact_root: Annotated[Text, doc(
        "Where artifact pointers resolve: <artifact_root>/<session_id>/<filename>.",
        example="s3://team-sources/artifacts")] = "./compact-proxy-state/artifacts"
    record_transcripts: Annotated[Bool, doc(
        "Append each session's messages, once, after the response, to "
        "<transcript_root>[/<tenant>]/<session_id>.jsonl in the format pointers are checked "
        "against (sequence from 1, session_id, event_id, role, content), so transcript:<sid>:<n> "
        "resolves. Needs a local transcript_root."
    )] = False
    transcript_max_bytes: Annotated[Positive, doc(
        "A transcript the proxy records stops growing at this size (the messages that would "
        "pass it are not written; one transcript_full warning)."
    )] = 64 * 1024 * 1024
    s3: S3SourcesConfig = field(default_factory=S3SourcesConfig)

    @model_validator(mode="after")
    def _roots_valid(self) -> SourcesConfig:
        if self.record_transcripts and is_s3_url(self.transcript_root):
            raise invalid("record_transcripts", "needs a local transcript_root (a path, not "
                                                "s3://)")
        roots = {"transcript_root": self.transcript_root, "artifact_root": self.artifact_root}
        for name, root in roots.items():
            if is_s3_url(root):
                try:
                    parse_s3_root(root)
                except ValueError as exc:
                    raise invalid(name, f"is not a valid s3:// root: {exc}") from None
        remote = [name for name, root in roots.items() if is_s3_url(root)]
        if remote and importlib.util.find_spec("aiobotocore") is None:
            raise invalid(remote[0], "s3:// roots need the s3 extra (aiobotocore): "
                                     "pip install 'compact-proxy[s3]'")
        return self

    def s3_settings(self) -> S3Settings:
        """The object store's endpoint and region, for the resolvers."""
        return S3Settings(endpoint_url=self.s3.endpoint_url, region=self.s3.region)


@section("session")
class SessionConfig(Section):
    """How requests are told apart: which session, and whose."""

    header: Annotated[HeaderName, doc(
        "The request header naming the session, checked before X-Claude-Code-Session-Id, "
        "metadata.user_id and the derived conv-... id; a value not a session id (1-128 characters: "
        "runs of A-Z a-z 0-9 _ - joined by single dots) gets 400 invalid_request_error."
    )] = "x-compact-session-id"
    scope: Annotated[Scope | None, doc(
        "Whose sessions are separate: credential (an HMAC-SHA256 of the caller's x-api-key, else "
        "its Authorization, keyed by secret_env; never stored or logged; one that rotates, as "
        "Claude Code's OAuth tokens do, starts a new tenant), header:<name> (set by an "
        "authenticating front proxy, e.g. header:x-forwarded-user; missing: 401) or none (one "
        "tenant). Unset: none on a loopback listen.host, else `serve` refuses to start."
    )] = None
    secret_env: Annotated[EnvName, doc(
        "The environment variable holding the HMAC secret of scope credential (required "
        "then; for header:<name> it keys the hash if set)."
    )] = "COMPACT_PROXY_SESSION_SECRET"

    @property
    def effective_scope(self) -> str:
        """``scope``, or ``none`` when it is unset."""
        return self.scope or "none"
