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

    host: Text = doc("127.0.0.1", (
        "Address to bind: 127.0.0.1 is loopback only, 0.0.0.0 listens on every interface."))
    port: Port = doc(8787, (
        "TCP port (0: any free port). Agents use ANTHROPIC_BASE_URL=http://<host>:<port>."))
    workers: Annotated[int, Strict(), Ge(1), Le(256)] = doc(1, (
        "Processes serving the port together (SO_REUSEPORT, Linux and BSD), sharing the store. "
        "With more than one, `serve` supervises them: a worker that dies is restarted, and SIGTERM "
        "/ SIGINT stops them all. `serve --workers N` overrides it."))
    drain_timeout_s: Seconds = doc(60.0, (
        "On SIGTERM / SIGINT, how long the requests and streams in flight may take to finish after "
        "the proxy stops accepting; what is left then is cancelled."))
    event_loop: EventLoopName = doc("uvloop", (
        "The event loop of each serving process: uvloop (libuv's, in C) or asyncio (the standard "
        "library's, where uvloop is not supported); the startup log's event_loop field names it."))
    header_timeout_s: Seconds = doc(30.0, (
        "How long a request's headers may take to arrive whole, from the connection's opening or "
        "from its previous answer; also how long an idle keep-alive connection stays open. A "
        "slower connection is closed (proxy.http.connections)."))
    body_timeout_s: Seconds = doc(120.0, (
        "How long a request body may take to arrive whole after its headers; past it, 408 "
        "invalid_request_error and the connection is closed."))
    max_connections: Positive = doc(4096, (
        "Client connections open at once, per serving process; one more gets an immediate 503 "
        "overloaded_error (retry-after: 1) and is closed. Lowered at startup to half the "
        "open-files limit (the soft limit is raised to the hard one)."))


@section("limits")
class LimitsConfig(Section):
    """Request limits, per tenant and in all, and the memory kept across requests."""

    max_body_bytes: Positive = doc(32 * 1024 * 1024, (
        "Largest request body accepted, in bytes; a larger one gets 413 request_too_large."))
    max_json_objects: Positive = doc(200_000, (
        "JSON objects a request body may hold (real agent bodies: about 3.5 per KB); more get 413 "
        "request_too_large."))
    max_concurrent_per_tenant: Positive = doc(256, (
        "Requests of one tenant (session.scope) in flight at once, per serving process; the next "
        "gets 429 rate_limit_error with retry-after: 1, before its body is read. Forwarded routes "
        "only (not /healthz, /metrics, /admin; proxy.http.limits)."))
    decoded_cache_bytes: NonNegative = doc(256 * 1024 * 1024, (
        "Memory, in bytes, for messages kept decoded across requests (over-estimated from their "
        "JSON; half by message, half for each conversation's last body), so a warm request decodes "
        "only what is new; only requests the provider accepted add to it. 0: all decoded."))


@section("upstream")
class UpstreamConfig(Section):
    """The real provider."""

    base_url: HttpUrl | None = doc(None, (
        "The provider's base URL, e.g. https://api.anthropic.com. Required by `serve` and "
        "`check-config` (only the demo runs without it)."), example="https://api.anthropic.com")
    connect_timeout_s: Seconds = doc(10.0, (
        "Time allowed to open the connection to the provider; past it, 504 api_error."))
    read_timeout_s: Seconds = doc(600.0, (
        "How long to wait for the provider's answer or its next bytes (a stream can pause while "
        "the model thinks); then 504, or an error event mid-stream, at most 1 s late (a quarter of "
        "it if shorter). Time on a slow client or a body still uploading does not count."))
    max_connections: Positive = doc(1000, (
        "Connections to the provider open at once; each streamed answer holds one."))
    pool_wait_s: Seconds = doc(5.0, (
        "How long a request may take to get a connection to the provider: a free one when all "
        "max_connections are busy, or a new one opened (the TCP connect is also bounded by "
        "connect_timeout_s). Past it, 529 overloaded_error with retry-after: 1."))

    provider: Literal["anthropic", "bedrock", "vertex"] = doc("anthropic", (
        "Which API the provider speaks: anthropic (the Messages API), bedrock (Amazon Bedrock, "
        "SigV4; docs/bedrock.md) or vertex (Google Vertex AI, a Google access token; "
        "docs/vertex.md), base_url as those pages show. Clients may also use that provider's own "
        "paths."))
    aws_region: Text | None = doc(None, (
        "bedrock: the AWS region SigV4 signs for (the requests do not carry it). Unset: AWS_REGION "
        "or AWS_DEFAULT_REGION, else the profile's region."), example="us-east-1")
    aws_profile: Text | None = doc(None, (
        "bedrock: the AWS profile whose credentials sign. Unset: the default credential chain "
        "(environment, shared files, container or instance role). A client's own Bedrock API key "
        "(Authorization: Bearer) is forwarded instead of signing."), example="bedrock")
    vertex_token_env: EnvName | None = doc(None, (
        "vertex: an environment variable holding the access token to send (tests, air-gapped "
        "setups). Unset: Google application-default credentials (google-auth). A client's own "
        "Authorization header is forwarded instead."), example="VERTEX_ACCESS_TOKEN")
    vertex_project: Text | None = doc(None, (
        "vertex: the project of summary calls made on their own (summary.mode separate); a call "
        "forked from a request goes to that request's project and location."),
        example="my-project")
    vertex_region: Text | None = doc(None, (
        "vertex: the location of summary calls made on their own (summary.mode separate)."),
        example="us-east5")

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

    token_counter: Literal["tiktoken", "chars4"] = doc("tiktoken", (
        "How tokens are counted: tiktoken (a local BPE tokenizer, no network) or chars4 (4 "
        "characters per token, cheapest). Global: no role changes it."))
    sticky: Bool = doc(True, (
        "Once a session's view was compacted, later requests that extend the same history reuse "
        "the identical compacted prefix (so the provider's prompt cache keeps hitting and L4 runs "
        "once per crossing, not per request) until the soft threshold is crossed again."))
    compact_to_ratio: Ratio = doc(0.7, (
        "Sticky mode: a compaction, once started, goes on until the view is below "
        "soft_threshold_tokens × compact_to_ratio, so the next crossing is far away."))
    user_text_budget_tokens: NonNegative | None = doc(None, (
        "What a person typed (user text, not a tool result or harness injection) in a span L3 "
        "drops or L4 summarises is kept verbatim next to the summary (or where L3 cut), newest "
        "first, up to this many tokens. null: a tenth of soft_threshold_tokens; 0: none."),
        example=8000)
    artifact_trail_budget_tokens: NonNegative | None = doc(None, (
        "The files read, written or edited and commands run (with exit status where shown) by a "
        "dropped or summarised span's tool calls, kept exactly with the summary, deduplicated, "
        "newest last, up to this many tokens (oldest go first; a command alone over it keeps its "
        "first line's start). null: a twentieth of soft_threshold_tokens; 0: none."), example=4000)
    calibration: Bool = doc(True, (
        "Scale the proxy's token count by a factor learnt per session and model from the "
        "provider's usage (new sessions start from their tenant's). A refusal 'prompt is too long: "
        "N tokens > M maximum' is not shown: the request is compacted below M and retried once, M "
        "kept as the tenant's window for the model (learnt_window_ttl_s)."))
    learnt_window_ttl_s: Seconds = doc(600.0, (
        "How long a context window learnt from 'prompt is too long' clamps that tenant's "
        "thresholds for the model (forgotten sooner when the provider accepts a larger view)."))


#: The model of a ``separate`` summary call when ``summary.model`` is not set (SPEC §3).
SEPARATE_SUMMARY_MODEL = "claude-haiku-4-5"
#: The share of ``summary.context_window_tokens`` one summary call may fill (counts are
#: estimates: the rest is a margin).
SUMMARY_WINDOW_SHARE = 0.9


@section("summary")
class SummaryConfig(Section):
    """The L4 summarizer: how the summary call is made through the anthropic SDK, and its
    limits."""

    enabled: Bool = doc(True, "L4 on or off: false, it never runs, for any role.")
    mode: Literal["fork", "separate"] = doc("fork", (
        "fork: the summary call is the client's own request (its headers, query, system, tools and "
        "model; the conversation up to the kept turns, then a user turn asking for the summary; no "
        "thinking, not streamed), so client-only credentials work and the prompt hits the "
        "provider's cache. separate: the proxy's own request, its own system prompt, the old "
        "messages as a JSON transcript."))
    model: Text | None = doc(None, (
        "Model of the summary call; null: the client's (fork), claude-haiku-4-5 (separate)."))
    max_tokens: Positive = doc(2048, "max_tokens of the summary call.")
    timeout_s: Seconds = doc(60.0, (
        "How long one summary call may take; also how long a request waits for the same summary "
        "another request is already asking for."))
    api_key_env: EnvName | None = doc(None, (
        "Mode separate: the environment variable holding an API key for summary calls, spent only "
        "for a caller whose own credential the provider accepted (a 2xx to its request, else one "
        "GET /v1/models with it). null: the caller's own credentials, as in mode fork."))
    max_retries: NonNegative = doc(2, "Retries of a failed summary call.")
    context_window_tokens: Positive = doc(200_000, (
        "Context window of the summary model. A prompt that would not fit in 90% of it less "
        "max_tokens is summarised in pieces, one by one, then one call merges those summaries."))
    prepare_at: Annotated[float | None, Strict(), Gt(0), Lt(1)] = doc(0.8, (
        "Zero-wait compaction: once a session's view (as the provider counts it) reaches this "
        "fraction of soft_threshold_tokens, the next crossing's summary is made in the background "
        "(one call per session and span, across replicas). null: at the crossing."))

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

    backend: Literal["sqlite", "redis"] = doc("sqlite", (
        "sqlite (an embedded file) or redis (shared by several proxy processes or replicas)."))
    path: Text = doc("./compact-proxy-state/state.db", (
        "The SQLite database file (backend sqlite), created 0600 with its -wal and -shm."))
    url: RedisUrl | None = doc(
        None, "The Redis URL; required when backend is redis, else unused.",
        example="redis://127.0.0.1:6379/0")
    redis_mode: Literal["standalone", "cluster", "sentinel"] = doc("standalone", (
        "What url names: standalone (one server), cluster (any node of a Redis Cluster; database "
        "0) or sentinel (the Sentinels, redis://host:26379,host:26379/0, with the primary's "
        "credentials). Every key of a session is in one hash slot."))
    sentinel_service: Text | None = doc(None, (
        "The name the Sentinels monitor the primary under; required when redis_mode is sentinel."))
    on_unavailable: Literal["reject", "forward"] = doc("reject", (
        "While the store cannot be reached: reject (503 api_error; forwarding would drop the facts "
        "pinned for the session) or forward (without the durable block and sticky compaction). "
        "Either way store_unavailable is logged at most once a second and /healthz answers 503."))

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

    endpoint_url: HttpUrl | None = doc(
        None, "An S3-compatible service's URL (path-style requests); null: AWS S3.",
        example="http://minio.internal:9000")
    region: Text | None = doc(None, (
        "The signing region; null: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1."))


@section("sources")
class SourcesConfig(Section):
    """Where source pointers resolve. A root is a path or an ``s3://<bucket>/<prefix>`` URL
    (replicas on several hosts share no disk; needs the s3 extra: pip install
    'compact-proxy[s3]'); the two may differ in kind (e.g. local transcripts, artifacts in a
    bucket). With session.scope on, each tenant's sources are in ``<root>/<tenant>/``."""

    transcript_root: Text = doc(
        "./compact-proxy-state/transcripts",
        "Where transcript pointers resolve: <transcript_root>/<session_id>.jsonl.",
        example="s3://team-sources/transcripts")
    artifact_root: Text = doc(
        "./compact-proxy-state/artifacts",
        "Where artifact pointers resolve: <artifact_root>/<session_id>/<filename>.",
        example="s3://team-sources/artifacts")
    record_transcripts: Bool = doc(False, (
        "Append each session's messages, once, after the response, to "
        "<transcript_root>[/<tenant>]/<session_id>.jsonl in the format pointers are checked "
        "against (sequence from 1, session_id, event_id, role, content), so transcript:<sid>:<n> "
        "resolves. Needs a local transcript_root."))
    transcript_max_bytes: Positive = doc(64 * 1024 * 1024, (
        "A transcript the proxy records stops growing at this size (the messages that would pass "
        "it are not written; one transcript_full warning)."))
    s3: S3SourcesConfig = field(default_factory=S3SourcesConfig)

    @model_validator(mode="after")
    def _roots_valid(self) -> SourcesConfig:
        if self.record_transcripts and is_s3_url(self.transcript_root):
            raise invalid("record_transcripts", "needs a local transcript_root (a path, not "
                                                "s3://)")
        roots = {"transcript_root": self.transcript_root, "artifact_root": self.artifact_root}
        remote = [name for name, root in roots.items() if is_s3_url(root)]
        for name in remote:
            try:
                parse_s3_root(roots[name])
            except ValueError as exc:
                raise invalid(name, f"is not a valid s3:// root: {exc}") from None
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

    header: HeaderName = doc("x-compact-session-id", (
        "The request header naming the session, checked before X-Claude-Code-Session-Id, "
        "metadata.user_id and the derived conv-... id; a value not a session id (1-128 characters: "
        "runs of A-Z a-z 0-9 _ - joined by single dots) gets 400 invalid_request_error."))
    scope: Scope | None = doc(None, (
        "Whose sessions are separate: credential (an HMAC-SHA256 of the caller's x-api-key, else "
        "its Authorization, keyed by secret_env; never stored or logged; one that rotates, as "
        "Claude Code's OAuth tokens do, starts a new tenant), header:<name> (set by an "
        "authenticating front proxy, e.g. header:x-forwarded-user; missing: 401) or none (one "
        "tenant). Unset: none on a loopback listen.host, else `serve` refuses to start."))
    secret_env: EnvName = doc("COMPACT_PROXY_SESSION_SECRET", (
        "The environment variable holding the HMAC secret of scope credential (required then; for "
        "header:<name> it keys the hash if set)."))

    @property
    def effective_scope(self) -> str:
        """``scope``, or ``none`` when it is unset."""
        return self.scope or "none"
