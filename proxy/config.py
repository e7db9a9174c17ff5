"""The typed configuration: YAML parsed once, at startup, into nested frozen pydantic dataclasses.

Each section declares its keys as annotated fields (type, limits, default); unknown keys are
refused. A section built directly in Python is held to the same rules as one read from YAML.
Any problem is one :class:`ConfigError` naming the dotted key (``compaction.soft_threshold_tokens``)
and the problem, made from pydantic's first error and its location; the CLI prints it on one
line and exits 2 before anything starts (SPEC §2).

The five compaction thresholds are declared once, in :class:`policies._compaction.Thresholds`:
:class:`CompactionConfig` extends it, :class:`RoleOverride` makes each of them optional, and
the per-role :class:`~policies.CompactionPolicy` built from both is one too.

Keys and defaults follow SPEC §3. Extensions: ``limits.max_body_bytes``,
``upstream``-independent ``summary.api_key_env`` / ``summary.max_retries``, the
``policies`` section (per-role overrides, role rules, file-read tools, source access), the
``prices`` section (USD per million tokens by model family, for ``compact-proxy report``) and
the ``audit`` section (the bounds of the audit log).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import ipaddress
import math
import os
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import (
    Annotated,
    Any,
    ClassVar,
    Final,
    Literal,
    TypeVar,
    Union,
    dataclass_transform,
    get_args,
    get_origin,
)
from urllib.parse import urlsplit

import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import (
    AfterValidator,
    BeforeValidator,
    PlainValidator,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import ErrorDetails

from policies._compaction import (
    DEFAULT_READ_TOOLS,
    STRICT,
    THRESHOLD_NAMES,
    CompactionPolicy,
    Ratio,
    ReadToolSpec,
    Text,
    Thresholds,
    invalid,
)
from policies._roles import DEFAULT_ROLE_RULES, ROLE_NAMES, HeaderName, Role, RolePolicies, RoleRule
from policies._session_ids import SESSION_ID_RULE, session_id_problem
from policies._source_access import SourceAccessPolicy
from proxy.masking import mask_url
from proxy.state.s3_roots import S3Settings, is_s3_url, parse_s3_root

__all__ = [
    "AdminConfig",
    "AdminListenConfig",
    "AuditConfig",
    "CompactionConfig",
    "Config",
    "ConfigError",
    "CONFIG_ENV_VAR",
    "DEFAULT_PRICES",
    "EventLoopName",
    "LimitsConfig",
    "ListenConfig",
    "LoggingConfig",
    "ModelPrice",
    "PoliciesConfig",
    "RoleOverride",
    "SEPARATE_SUMMARY_MODEL",
    "SessionConfig",
    "S3SourcesConfig",
    "SourceAccessConfig",
    "SourcesConfig",
    "StoreConfig",
    "SummaryConfig",
    "UpstreamConfig",
    "load_config",
]

CONFIG_ENV_VAR = "COMPACT_PROXY_CONFIG"


class ConfigError(Exception):
    """A configuration problem: which key, and what is wrong with it.

    Attributes:
        key: the dotted key (``compaction.soft_threshold_tokens``, ``policies.rules[0].role``);
            empty for problems with the file as a whole (unreadable, YAML syntax).
        problem: what is wrong, in a few words, with the offending value where useful.
        line: the 1-based line in the YAML file, when known (syntax errors).

    ``str()`` is always a single line: ``config error: <key>: <problem>``.
    """

    def __init__(self, key: str, problem: str, *, line: int | None = None) -> None:
        super().__init__(key, problem)
        self.key = key
        # Keep the one-line promise even for multi-line messages from PyYAML or the OS.
        self.problem = " ".join(problem.split())
        self.line = line

    def __str__(self) -> str:
        if self.key:
            return f"config error: {self.key}: {self.problem}"
        return f"config error: {self.problem}"


def _shown(value: object) -> str:
    """How a bad value appears in an error: YAML spelling plus its type, never a long text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'} (a boolean)"
    if isinstance(value, (int, float)):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return f"{text!r} (a string)"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return f"a {type(value).__name__}"


# --------------------------------------------------------------------------------------
# Value types: the limits pydantic checks itself, plus the checks it has no words for.

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Bool = Annotated[bool, Strict()]
Positive = Annotated[int, Strict(), Ge(1)]
NonNegative = Annotated[int, Strict(), Ge(0)]
Port = Annotated[int, Strict(), Ge(0), Le(65535)]
#: The most worker processes ``listen.workers`` may ask for.
MAX_WORKERS: Final = 256


def _seconds(value: object, info: ValidationInfo) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(info.field_name, f"must be a number of seconds, got {_shown(value)}")
    if not math.isfinite(value) or value <= 0:
        raise invalid(info.field_name, f"must be a positive number of seconds, got {value}")
    return float(value)


def _env_name(value: str, info: ValidationInfo) -> str:
    if _ENV_NAME.fullmatch(value) is None:
        raise invalid(info.field_name, f"must be an environment variable name, got {value!r}")
    return value


def _url(*schemes: str) -> Callable[[str, ValidationInfo], str]:
    def check(value: str, info: ValidationInfo) -> str:
        try:
            parts = urlsplit(value)
        except ValueError as exc:  # (the URL is shown without its password)
            raise invalid(info.field_name,
                          f"is not a valid URL ({exc}): {mask_url(value)!r}") from None
        if parts.scheme not in schemes or not (parts.netloc or parts.scheme == "unix"):
            wanted = " or ".join(f"{scheme}://" for scheme in schemes)
            raise invalid(info.field_name, f"must be a {wanted} URL, got {mask_url(value)!r}")
        return value

    return check


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _session_id(value: str, info: ValidationInfo) -> str:
    # The one rule for session ids (the same as compactor.check_session_id's).
    problem = session_id_problem(value)
    if problem is not None:
        raise invalid(info.field_name, f"is not a valid session id ({problem}; a session id "
                                       f"is {SESSION_ID_RULE}): {value!r}")
    return value


Seconds = Annotated[float, PlainValidator(_seconds)]
EnvName = Annotated[Text, AfterValidator(_env_name)]
HttpUrl = Annotated[Text, AfterValidator(_url("http", "https"))]
RedisUrl = Annotated[Text, AfterValidator(_url("redis", "rediss", "unix"))]
SessionId = Annotated[Text, AfterValidator(_session_id)]


def _scope(value: str, info: ValidationInfo) -> str:
    if value in ("none", "credential"):
        return value
    kind, _, name = value.partition(":")
    if kind == "header" and re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
        return f"header:{name.lower()}"
    raise invalid(info.field_name, f"must be credential, header:<name> or none, got {value!r}")


#: Whose sessions are separate (``session.scope``).
Scope = Annotated[Text, AfterValidator(_scope)]


# --------------------------------------------------------------------------------------
# The sections, in SPEC §3 order.

_C = TypeVar("_C")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def _section(key: str) -> Callable[[type[_C]], type[_C]]:
    """Make ``cls`` a frozen pydantic dataclass at dotted position ``key``.

    Built directly in Python (``ListenConfig(port=1)``, ``dataclasses.replace``), a section
    raises :class:`ConfigError` like a loaded one; nested sections are validated by their
    parent's validator, which does not go through ``__init__``.
    """

    def decorate(cls: type[_C]) -> type[_C]:
        model: Any = pydantic_dataclass(cls, frozen=True, config=STRICT)
        validate = model.__init__

        @functools.wraps(validate)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                validate(self, *args, **kwargs)
            except ValidationError as exc:
                raise _config_error(exc, model, key) from None

        model.__init__ = __init__
        return model  # type: ignore[no-any-return]

    return decorate


class _Section:
    """Base of the sections: a section given as null (``listen:`` alone) has its defaults."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {} if data is None else data


#: The event loops a serving process can run on (:mod:`proxy.event_loop`).
EventLoopName = Literal["uvloop", "asyncio"]


@_section("listen")
class ListenConfig(_Section):
    """Where the proxy listens. ``port`` 0 picks a free port.

    ``workers`` processes serve the port together (``SO_REUSEPORT``), supervised by the one
    ``compact-proxy serve`` started (:mod:`proxy.workers`); 1 serves in that process itself.
    On SIGTERM / SIGINT a process stops accepting and lets the requests and streams in
    flight finish for up to ``drain_timeout_s``, then cancels what is left. ``event_loop``
    is what runs each serving process's event loop (:mod:`proxy.event_loop`).

    Against callers that hold connections (:mod:`proxy.http.connections`): a request's
    headers must arrive whole within ``header_timeout_s`` of the connection's opening or of its
    previous answer (also how long an idle keep-alive connection stays open), its body within
    ``body_timeout_s`` of its headers (else 408); above ``max_connections`` open connections
    (per process) a new one gets a 503 at once and is closed.
    """

    host: Text = "127.0.0.1"
    port: Port = 8787
    workers: Annotated[int, Strict(), Ge(1), Le(MAX_WORKERS)] = 1
    drain_timeout_s: Seconds = 60.0
    event_loop: EventLoopName = "uvloop"
    header_timeout_s: Seconds = 30.0
    body_timeout_s: Seconds = 120.0
    max_connections: Positive = 4096


@_section("limits")
class LimitsConfig(_Section):
    """Request limits; a body larger than ``max_body_bytes``, or holding more than
    ``max_json_objects`` JSON objects, gets 413 ``request_too_large``.

    A tenant with ``max_concurrent_per_tenant`` requests in flight (per process) gets 429
    ``rate_limit_error`` with ``retry-after`` for the next one, before its body is read
    (:mod:`proxy.http.limits`)."""

    max_body_bytes: Positive = 32 * 1024 * 1024
    #: JSON objects a body may hold (real agent bodies: ~3.5 per KB, so ~110k at 32 MB).
    max_json_objects: Positive = 200_000
    max_concurrent_per_tenant: Positive = 256
    #: Bytes of memory the decoded messages kept across requests may occupy, over-estimated
    #: from their JSON (a warm request decodes only what is new in it); 0 decodes every
    #: message of every request. Only requests the provider accepted leave anything here.
    decoded_cache_bytes: NonNegative = 256 * 1024 * 1024


@_section("upstream")
class UpstreamConfig(_Section):
    """The real provider. ``base_url`` is required by ``serve`` (``None`` only for the demo)."""

    base_url: HttpUrl | None = None
    connect_timeout_s: Seconds = 10.0
    read_timeout_s: Seconds = 600.0
    #: Connections to the provider open at once (each streaming answer holds one).
    max_connections: Positive = 1000
    #: Seconds a request may take to get a connection (a free one of ``max_connections``, or
    #: a new one opened): past it, 529 ``overloaded_error`` with ``retry-after``.
    pool_wait_s: Seconds = 5.0

    def require_base_url(self) -> str:
        """``base_url``, which serving needs; the one check that it is set.

        Raises:
            ConfigError: ``upstream.base_url`` is not set.
        """
        if self.base_url is None:
            raise ConfigError(
                "upstream.base_url", "required (the provider, e.g. https://api.anthropic.com)"
            )
        return self.base_url


@_section("compaction")
class CompactionConfig(Thresholds, _Section):
    """The compaction thresholds every role starts from (SPEC §3 ``compaction``): the five of
    :class:`~policies._compaction.Thresholds` (soft below hard), and these."""

    token_counter: Literal["tiktoken", "chars4"] = "tiktoken"
    sticky: Bool = True
    compact_to_ratio: Ratio = 0.7
    #: Compare thresholds with the counted tokens times the factor learnt from the
    #: provider's own counts (``usage``) per session and model (proxy.state.calibration).
    calibration: Bool = True
    #: How long a context window learnt from ``prompt is too long`` (per tenant and model)
    #: clamps the thresholds before it is forgotten.
    learnt_window_ttl_s: Seconds = 600.0


#: The model of a ``separate`` summary call when ``summary.model`` is not set (SPEC §3).
SEPARATE_SUMMARY_MODEL = "claude-haiku-4-5"
#: The share of ``summary.context_window_tokens`` one summary call may fill (counts are
#: estimates: the rest is a margin).
SUMMARY_WINDOW_SHARE = 0.9


@_section("summary")
class SummaryConfig(_Section):
    """The L4 summarizer: how the summary call is made through the anthropic SDK, and its limits.

    ``mode`` ``fork`` makes the call the client's own request (its headers, query, ``system``,
    ``tools`` and model, the conversation as the messages, the summary asked for in a last
    user turn), so credentials that only serve the client's own requests work and the prompt
    is read from the provider's cache; ``separate`` sends the span as a JSON transcript under
    the proxy's own system prompt. ``model`` ``None`` is the client's model (``fork``) or
    :data:`SEPARATE_SUMMARY_MODEL` (``separate``). ``api_key_env`` names the environment
    variable holding the key for ``separate`` calls (the key itself is never part of the
    config); ``None`` uses the caller's own credentials. A call larger than
    ``context_window_tokens`` (less ``max_tokens`` and a margin) is made in pieces.
    """

    enabled: Bool = True
    mode: Literal["fork", "separate"] = "fork"
    model: Text | None = None
    max_tokens: Positive = 2048
    timeout_s: Seconds = 60.0
    api_key_env: EnvName | None = None
    max_retries: NonNegative = 2
    context_window_tokens: Positive = 200_000

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


@_section("store")
class StoreConfig(_Section):
    """Where per-session state lives: embedded SQLite at ``path``, or Redis at ``url``.

    ``redis_mode`` says what ``url`` names: one server (``standalone``), any node of a Redis
    Cluster (``cluster``), or the Sentinels (``redis://host:port,host:port/db``) that know the
    primary of ``sentinel_service`` (``sentinel``). ``on_unavailable`` says what a request
    does while the store cannot be reached: ``reject`` (503 ``api_error``) or ``forward``
    (without its durable context and sticky compaction).
    """

    backend: Literal["sqlite", "redis"] = "sqlite"
    path: Text = "./compact-proxy-state/state.db"
    url: RedisUrl | None = None
    redis_mode: Literal["standalone", "cluster", "sentinel"] = "standalone"
    sentinel_service: Text | None = None
    on_unavailable: Literal["reject", "forward"] = "reject"

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StoreConfig:
        if self.backend == "redis" and self.url is None:
            raise invalid("url", "required when store.backend is redis")
        if self.backend == "redis" and self.redis_mode == "sentinel" and not self.sentinel_service:
            raise invalid("sentinel_service", "required when store.redis_mode is sentinel")
        if self.redis_mode != "standalone" and (self.url or "").startswith("unix:"):
            raise invalid("url", f"a unix:// socket cannot be store.redis_mode {self.redis_mode}")
        return self


@_section("sources.s3")
class S3SourcesConfig(_Section):
    """``sources.s3``: the object store of ``s3://`` roots. ``endpoint_url`` names an
    S3-compatible service (unset: AWS); ``region`` the signing region (unset: the AWS
    variables or files). Credentials come from the standard AWS variables and files."""

    endpoint_url: HttpUrl | None = None
    region: Text | None = None


@_section("sources")
class SourcesConfig(_Section):
    """The roots the source-pointer resolver reads transcripts and artifacts from: each a path
    or an ``s3://<bucket>/<prefix>`` URL (replicas on several hosts share no disk; the two may
    differ, e.g. local transcripts and artifacts in a bucket) reached as ``s3`` says, which
    needs the ``s3`` extra (aiobotocore)."""

    transcript_root: Text = "./compact-proxy-state/transcripts"
    artifact_root: Text = "./compact-proxy-state/artifacts"
    s3: S3SourcesConfig = field(default_factory=S3SourcesConfig)

    @model_validator(mode="after")
    def _roots_valid(self) -> SourcesConfig:
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


@_section("session")
class SessionConfig(_Section):
    """How requests are told apart.

    ``header`` names the session first (SPEC §4; stored lower-case). ``scope`` says whose
    sessions are separate: ``credential`` (a keyed hash of the caller's ``x-api-key`` or
    ``Authorization``, under the secret in the variable named by ``secret_env``),
    ``header:<name>`` (the value of a header an authenticating front proxy sets) or ``none``
    (one tenant). Unset, it is ``none`` while ``listen.host`` is a loopback address and an
    error otherwise, so a shared gateway is never shared by accident.
    """

    header: HeaderName = "x-compact-session-id"
    scope: Scope | None = None
    secret_env: EnvName = "COMPACT_PROXY_SESSION_SECRET"

    @property
    def effective_scope(self) -> str:
        """``scope``, or ``none`` when it is unset."""
        return self.scope or "none"


#: The shortest admin token accepted (``admin.min_token_length``'s default): 32 characters
#: hold 128 bits even as hex (``openssl rand -hex 16``), beyond any online guessing.
MIN_ADMIN_TOKEN_LENGTH: Final = 32


@_section("admin.listen")
class AdminListenConfig(_Section):
    """``admin.listen``: an address of its own for ``/admin`` and the console (``port`` 0
    picks a free one); the main listener then answers them 404."""

    port: Port
    host: Text = "127.0.0.1"


@_section("admin")
class AdminConfig(_Section):
    """The admin API and console: the token, by the name of the environment variable that
    holds it (``min_token_length`` characters at least); ``failed_auth_limit`` wrong tokens
    from one client address lock it out for ``lockout_s``, doubled at each lockout in a row
    up to ``max_lockout_s``; ``cookie_secure`` marks the console's cookies ``Secure`` (TLS
    ends in front of the proxy); ``listen`` serves them on an address of their own."""

    token_env: EnvName = "COMPACT_PROXY_ADMIN_TOKEN"
    min_token_length: Annotated[int, Strict(), Ge(16)] = MIN_ADMIN_TOKEN_LENGTH
    failed_auth_limit: Positive = 5
    lockout_s: Seconds = 1.0
    max_lockout_s: Seconds = 300.0
    cookie_secure: Bool = False
    listen: AdminListenConfig | None = None

    @model_validator(mode="after")
    def _lockouts_in_order(self) -> AdminConfig:
        if self.max_lockout_s < self.lockout_s:
            raise invalid("max_lockout_s", f"must be at least admin.lockout_s "
                                           f"({self.max_lockout_s:g} < {self.lockout_s:g})")
        return self


@_section("audit")
class AuditConfig(_Section):
    """The audit log the store keeps: one record per ``/v1/messages`` and ``count_tokens``
    request (figures, ids and names; never message text) and one per change of a durable
    state, written after the response. A session keeps at most ``max_requests_per_session``
    records, and none older than ``retention_days``."""

    enabled: Bool = True
    max_requests_per_session: Positive = 1000
    retention_days: Positive = 14


@_section("logging")
class LoggingConfig(_Section):
    """structlog output: ``json`` (one object per line) or ``console``, and the level."""

    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


def _each_optional(base: type[Any]) -> type[Any]:
    """A frozen dataclass with every field of the pydantic dataclass ``base``, each optional
    (default ``None``) and otherwise held to the same limits."""
    specs = [
        (name, Union[info.rebuild_annotation(), None], field(default=None))  # noqa: UP007
        for name, info in base.__pydantic_fields__.items()
    ]
    return dataclasses.make_dataclass(f"Optional{base.__name__}", specs, frozen=True)


@_section("policies.roles")
class RoleOverride(_each_optional(Thresholds), _Section):  # type: ignore[misc]
    """``policies.roles.<role>``: the thresholds one role changes, and ``summary_enabled``.

    ``None`` means "inherit": the thresholds from the ``compaction`` section, ``summary_enabled``
    from ``summary.enabled`` (``false`` for ``summary_recovery``). ``token_counter`` is global.
    """

    summary_enabled: Bool | None = None

    #: Keys that belong elsewhere, and where.
    MISPLACED: ClassVar[Mapping[str, str]] = {
        "token_counter": "is global; set compaction.token_counter instead",
    }


@_section("policies.source_access")
class SourceAccessConfig(_Section):
    """``policies.source_access``: whether a session may resolve another session's pointers."""

    allow_cross_session: Bool = False
    shared_sessions: tuple[SessionId, ...] = ()


def _usd_per_million(value: object, info: ValidationInfo) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(info.field_name, f"must be a number (USD per million tokens), got "
                                       f"{_shown(value)}")
    if not math.isfinite(value):
        raise invalid(info.field_name, f"must be a finite number, got {value}")
    if value < 0:
        raise invalid(info.field_name, f"must be >= 0 (USD per million tokens), got {value}")
    return float(value)


#: A price: a finite number >= 0 of US dollars per million tokens.
UsdPerMillion = Annotated[float, PlainValidator(_usd_per_million)]


@_section("prices")
class ModelPrice(_Section):
    """``prices.<family>``: what one model family costs, in USD per million tokens.

    Every key is required: an entry replaces the built-in one of its family as a whole.

    Attributes:
        input: plain input tokens.
        cache_write: prompt-cache writes (5-minute cache: 1.25 x input at Anthropic).
        cache_read: prompt-cache reads.
        output: output tokens.
    """

    input: UsdPerMillion
    cache_write: UsdPerMillion
    cache_read: UsdPerMillion
    output: UsdPerMillion


def _price(input: float, cache_write: float, cache_read: float, output: float) -> ModelPrice:
    return ModelPrice(input=input, cache_write=cache_write, cache_read=cache_read, output=output)


#: What may follow a model family in a model name of that family: a snapshot date, ``-latest``
#: or a provider's version tag (``@20251101``, ``-v1:0``).
_SNAPSHOT_SUFFIX: Final = re.compile(r"(-\d{8}|-latest|@\d{8}|-v\d+(:\d+)?)+")

#: The built-in price table (Anthropic's list prices, USD per million tokens): model family
#: (a prefix of model names) -> its price. Edit here when prices change; a deployment
#: overrides or extends it with the ``prices`` section.
DEFAULT_PRICES: Mapping[str, ModelPrice] = types.MappingProxyType({
    "claude-opus-4-5": _price(5, 6.25, 0.50, 25),
    "claude-opus-4-1": _price(15, 18.75, 1.50, 75),
    "claude-opus-4": _price(15, 18.75, 1.50, 75),
    "claude-sonnet-4-5": _price(3, 3.75, 0.30, 15),
    "claude-sonnet-4": _price(3, 3.75, 0.30, 15),
    "claude-3-7-sonnet": _price(3, 3.75, 0.30, 15),
    "claude-haiku-4-5": _price(1, 1.25, 0.10, 5),
    "claude-3-5-haiku": _price(0.80, 1.00, 0.08, 4),
})


def _over_default_prices(data: Any) -> Any:
    # The user's families replace or extend the built-in ones; null means the defaults.
    if data is None:
        return dict(DEFAULT_PRICES)
    if isinstance(data, Mapping):
        return {**DEFAULT_PRICES, **data}
    return data


#: The ``prices`` section: the built-in table with the user's entries merged over it.
Prices = Annotated[Mapping[Text, ModelPrice], BeforeValidator(_over_default_prices)]


def _drop_nulls(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {key: value for key, value in data.items() if value is not None}
    return data


# A key given as null (`rules:`, `range_fields:` with nothing after) has its default.
_NULLS_ARE_DEFAULTS = BeforeValidator(_drop_nulls)


@_section("policies")
class PoliciesConfig(_Section):
    """The ``policies`` section, with defaults filled in.

    Attributes:
        roles: role -> its overrides; a role not listed inherits everything.
        rules: the role rules (:data:`policies._roles.DEFAULT_ROLE_RULES` unless given).
        read_tools: the tools L2 counts as file reads (``DEFAULT_READ_TOOLS`` unless given).
        source_access: the source-access settings.
    """

    roles: Mapping[Role, RoleOverride] = field(default_factory=dict)
    rules: tuple[Annotated[RoleRule, _NULLS_ARE_DEFAULTS], ...] = DEFAULT_ROLE_RULES
    read_tools: tuple[Annotated[ReadToolSpec, _NULLS_ARE_DEFAULTS], ...] = DEFAULT_READ_TOOLS
    source_access: SourceAccessConfig = field(default_factory=SourceAccessConfig)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        return _drop_nulls(data)

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", types.MappingProxyType(dict(self.roles)))


@_section("")
class Config(_Section):
    """The whole validated configuration; build it with :func:`load_config` or
    :meth:`from_mapping`.

    The role policies and the source-access policy are derived once, here, so the request
    path only looks them up (:meth:`role_policies`, :meth:`source_access`).
    """

    listen: ListenConfig = field(default_factory=ListenConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    summary: SummaryConfig = field(default_factory=SummaryConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    sources: SourcesConfig = field(default_factory=SourcesConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    prices: Prices = field(default_factory=lambda: DEFAULT_PRICES)
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    _role_policies: RolePolicies = field(init=False, repr=False, compare=False)
    _source_access: SourceAccessPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prices", types.MappingProxyType(dict(self.prices)))
        if self.session.scope is None and not _is_loopback(self.listen.host):
            raise ConfigError("session.scope", (
                f"must be set when listen.host is not a loopback address ({self.listen.host!r}): "
                "credential, header:<name> or none"))
        admin_listen = self.admin.listen
        if admin_listen is not None and admin_listen.port and admin_listen.port == self.listen.port:
            raise ConfigError("admin.listen.port", (
                f"must differ from listen.port ({admin_listen.port}): the admin listener is a "
                "port of its own"))
        roles = RolePolicies(
            {role: _role_policy(self, role) for role in ROLE_NAMES}, rules=self.policies.rules
        )
        object.__setattr__(self, "_role_policies", roles)
        access = self.policies.source_access
        try:
            policy = SourceAccessPolicy(
                allow_cross_session=access.allow_cross_session,
                shared_sessions=access.shared_sessions,
            )
        except ValueError as exc:
            raise ConfigError("policies.source_access", str(exc)) from None
        object.__setattr__(self, "_source_access", policy)

    @classmethod
    def from_mapping(cls, data: object, *, require_upstream: bool = True) -> Config:
        """Validate already-parsed YAML (a mapping of sections) into a :class:`Config`.

        Raises:
            ConfigError: the first problem found, naming its dotted key.
        """
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                "", f"the top level must be a mapping of sections, got {_shown(data)}"
            )
        try:
            config = _VALIDATOR.validate_python(data)
        except ValidationError as exc:
            raise _config_error(exc, cls, "") from None
        if require_upstream:
            config.upstream.require_base_url()
        return config

    def role_policies(self) -> RolePolicies:
        """The per-role compaction policies and role rules, built once at load time."""
        return self._role_policies

    def source_access(self) -> SourceAccessPolicy:
        """The source-access policy, built once at load time."""
        return self._source_access

    def price_for(self, model: str) -> ModelPrice | None:
        """The price of ``model``: that of the family it is, or a dated or ``-latest``
        snapshot of (``claude-opus-4-5-20251101`` -> ``claude-opus-4-5``); ``None`` when it
        is none of them. A newer model (``claude-opus-4-6``) is never priced as an older
        family it only begins with (``claude-opus-4``): it shows as unpriced instead."""
        for family in sorted(self.prices, key=len, reverse=True):
            if model == family or (model.startswith(family)
                                   and _SNAPSHOT_SUFFIX.fullmatch(model[len(family):])):
                return self.prices[family]
        return None

    def admin_token(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The admin token from the variable named by ``admin.token_env``; ``None`` (admin API
        off) when it is unset or empty.

        Raises:
            ConfigError: the token is shorter than ``admin.min_token_length`` or padded with
                whitespace (named by its variable, never shown).
        """
        env = os.environ if environ is None else environ
        token = env.get(self.admin.token_env) or None
        if token is None:
            return None
        name, shortest = self.admin.token_env, self.admin.min_token_length
        if token != token.strip():
            raise ConfigError("admin.token_env", (
                f"the environment variable {name} has leading or trailing whitespace, which "
                "no Authorization header can carry"))
        if len(token) < shortest:
            raise ConfigError("admin.token_env", (
                f"the environment variable {name} holds a token of {len(token)} characters; "
                f"at least {shortest} are required (admin.min_token_length), e.g. "
                "`openssl rand -hex 32`"))
        return token

    def summary_api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The API key for summary calls from ``summary.api_key_env``; ``None`` when that is not
        configured or the variable is unset or empty."""
        if self.summary.api_key_env is None:
            return None
        env = os.environ if environ is None else environ
        return env.get(self.summary.api_key_env) or None

    def as_dict(self) -> dict[str, Any]:
        """The effective values as plain YAML-safe data (what ``check-config`` prints, masked
        by :func:`proxy.masking.mask_config`).

        Secrets appear only as the names of their environment variables, but for a URL's own
        password, kept as written here. ``policies.roles`` shows every role's effective
        thresholds; feeding the result back to :meth:`from_mapping` gives the same effective
        configuration.
        """
        out: dict[str, Any] = _plain(self)
        roles = self._role_policies
        out["policies"] = {
            "roles": {
                role: {
                    **{name: getattr(policy, name) for name in THRESHOLD_NAMES},
                    "summary_enabled": policy.summary_enabled,
                }
                for role in ROLE_NAMES
                for policy in (roles.policy_for(role),)
            },
            "rules": [_plain(rule, omit_none=True) for rule in roles.rules],
            "read_tools": [_plain(tool, omit_none=True) for tool in self.policies.read_tools],
            "source_access": _plain(self.policies.source_access),
        }
        return out


_VALIDATOR: TypeAdapter[Config] = TypeAdapter(Config)


def _role_policy(config: Config, role: Role) -> CompactionPolicy:
    """The role's CompactionPolicy: the compaction section, then the role's overrides."""
    compaction, summary = config.compaction, config.summary
    override = config.policies.roles.get(role)
    own = {} if override is None else {
        name: value for name in THRESHOLD_NAMES
        if (value := getattr(override, name)) is not None
    }
    # A summary_recovery request must never set off another summary call, so that role
    # starts with L4 off. The other roles follow summary.enabled.
    summary_enabled = summary.enabled and role != "summary_recovery"
    prefix = f"policies.roles.{role}"
    if override is not None and override.summary_enabled is not None:
        if override.summary_enabled and not summary.enabled:
            raise ConfigError(
                f"{prefix}.summary_enabled", "cannot be true while summary.enabled is false"
            )
        summary_enabled = override.summary_enabled
    try:
        return CompactionPolicy(
            **{name: getattr(compaction, name) for name in THRESHOLD_NAMES} | own,
            read_tools=config.policies.read_tools, summary_enabled=summary_enabled,
            compact_to_ratio=compaction.compact_to_ratio,
        )
    except ValidationError as exc:
        # Each value is valid on its own; soft < hard may fail across compaction and role.
        error = exc.errors()[0]
        if error["type"] != "soft_not_below_hard":
            raise _config_error(exc, CompactionPolicy, prefix) from None
        ctx = error["ctx"]

        def key(name: str) -> str:
            return f"{prefix if name in own else 'compaction'}.{name}"

        raise _soft_not_below_hard(ctx, key(ctx["soft_field"]), key(ctx["hard_field"]),
                               blame_soft=ctx["soft_field"] in own) from None


def _soft_not_below_hard(ctx: Mapping[str, Any], soft_key: str, hard_key: str,
                     blame_soft: bool) -> ConfigError:
    soft, hard = ctx["soft"], ctx["hard"]
    if blame_soft:
        return ConfigError(soft_key, f"must be below {hard_key} ({soft} >= {hard})")
    return ConfigError(hard_key, f"must be above {soft_key} ({hard} <= {soft})")


# --------------------------------------------------------------------------------------
# Pydantic's errors as ConfigErrors.

_UNKNOWN_KEY = frozenset({"unexpected_keyword_argument", "extra_forbidden", "invalid_key"})
_WANTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "dataclass_type": "a mapping",
    "dataclass_args_type": "a mapping",
    "dict_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
}
_BOUNDS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def _config_error(exc: ValidationError, root: type[Any], prefix: str) -> ConfigError:
    """The ConfigError for pydantic's first error (an unknown key first: it explains the rest)
    in validating ``root`` at dotted position ``prefix``."""
    errors = exc.errors(include_url=False)
    error = next((e for e in errors if e["type"] in _UNKNOWN_KEY), errors[0])
    loc, problem = _problem(error, root)
    if error["type"] == "soft_not_below_hard":
        ctx = error["ctx"]
        soft, hard = (_dotted(prefix, (*loc, ctx[name])) for name in ("soft_field", "hard_field"))
        return _soft_not_below_hard(ctx, soft, hard, blame_soft=True)
    return ConfigError(_dotted(prefix, loc), problem)


def _dotted(prefix: str, loc: tuple[str | int, ...]) -> str:
    key = prefix
    for part in loc:
        key = f"{key}[{part}]" if isinstance(part, int) else f"{key}.{part}" if key else part
    return key


def _problem(error: ErrorDetails, root: type[Any]) -> tuple[tuple[str | int, ...], str]:
    """The location the error belongs to and its problem in words."""
    loc, kind, value = tuple(error["loc"]), error["type"], error["input"]
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if loc and loc[-1] == "[key]":  # a mapping's key: a role name, or a price's family
        roles = get_args(_at(root, loc[:-2], key=True)[0])
        if roles:
            return (*loc[:-2], str(loc[-2])), _unknown(str(loc[-2]), roles, "role", "roles are")
        return loc[:-2], f"keys must be non-empty strings, got {_shown(loc[-2])}"
    if kind in _UNKNOWN_KEY:
        name = str(loc[-1])
        owner, _ = _at(root, loc[:-1])
        misplaced = getattr(owner, "MISPLACED", {}).get(name)
        known = tuple(spec.name for spec in dataclasses.fields(owner) if spec.init
                      ) if dataclasses.is_dataclass(owner) else ()
        return (*loc[:-1], name), misplaced or _unknown(name, known, "key", "known keys:")
    annotation, meta = _at(root, loc)
    item = ""
    if loc and isinstance(loc[-1], int) and not dataclasses.is_dataclass(annotation):
        item, loc = f"item {loc[-1]} ", loc[:-1]  # an element of a list of values
    if kind in _WANTED:
        wanted = _WANTED[kind]
        items = get_args(annotation)[:1]
        if wanted == "a list" and items and dataclasses.is_dataclass(_bare(items[0])[0]):
            wanted = f"a list of {str(loc[-1]).replace('_', ' ')}"  # a list of rules
        problem = f"must be {wanted}, got {_shown(value)}"
    elif kind == "missing":
        problem = "required"
    elif kind == "literal_error":
        choices = get_args(annotation) or (ctx.get("expected", ""),)
        problem = f"must be one of {', '.join(map(str, choices))}, got {_shown(value)}"
    elif kind in _BOUNDS:
        problem = f"must be {_range(meta)}, got {value}"
    elif kind == "invalid":  # policies.invalid: the message starts with the field's name
        name = ctx["field"]
        if name and name not in loc:  # a check of a whole section, about one of its keys
            loc = (*loc, name)
        problem = ctx["message"].removeprefix(f"{name} ") if name else ctx["message"]
    else:
        problem = error["msg"]
    return loc, item + problem


def _unknown(name: str, known: tuple[str, ...], what: str, listed: str) -> str:
    """``unknown key (did you mean 'x'?)``: the known name it begins, else difflib's guess,
    else the ``listed`` known names."""
    prefixed = [key for key in known if name and key.startswith(name)]
    close = prefixed if len(prefixed) == 1 else difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"{listed} {', '.join(known)}"
    return f"unknown {what} ({hint})"


def _range(meta: list[Any]) -> str:
    """The limits in ``meta`` in words: ``at least 1``, ``between 0 and 65535``."""
    low = next((m for m in meta if isinstance(m, (Ge, Gt))), None)
    high = next((m for m in meta if isinstance(m, (Le, Lt))), None)
    if isinstance(low, Ge) and isinstance(high, Le):
        return f"between {low.ge} and {high.le}"
    words = [
        f"at least {low.ge}" if isinstance(low, Ge) else f"above {low.gt}" if low else "",
        f"at most {high.le}" if isinstance(high, Le) else f"below {high.lt}" if high else "",
    ]
    return " and ".join(word for word in words if word)


def _at(root: type[Any], loc: tuple[str | int, ...], *, key: bool = False
        ) -> tuple[Any, list[Any]]:
    """The type at ``loc`` below ``root`` (a mapping's key type with ``key``), without its
    ``Optional`` and ``Annotated`` wrappers, and the limits those carried."""
    annotation: Any = root
    meta: list[Any] = []
    for part in loc:
        annotation, _ = _bare(annotation)
        fields = getattr(annotation, "__pydantic_fields__", {})
        if isinstance(part, str) and part in fields:
            annotation = fields[part].rebuild_annotation()
        elif get_origin(annotation) is tuple:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (dict, Mapping):
            annotation = get_args(annotation)[1]
        else:
            return None, []
    annotation, meta = _bare(annotation)
    if key and get_origin(annotation) in (dict, Mapping):
        annotation, meta = _bare(get_args(annotation)[0])
    return annotation, meta


def _bare(annotation: Any) -> tuple[Any, list[Any]]:
    meta: list[Any] = []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            meta.extend(annotation.__metadata__)
            annotation = annotation.__origin__
        elif origin in (Union, types.UnionType):
            args = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(args) != 1:
                return annotation, meta
            annotation = args[0]
        else:
            return annotation, meta


def _plain(value: Any, *, omit_none: bool = False) -> Any:
    """A section (or a value in one) as plain YAML-safe data: lists for tuples, dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            spec.name: _plain(item, omit_none=omit_none)
            for spec in dataclasses.fields(value)
            if spec.init
            for item in (getattr(value, spec.name),)
            if not (omit_none and item is None)
        }
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


# --------------------------------------------------------------------------------------
# Reading the file.

class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys in a mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key; construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def load_config(
    path: str | os.PathLike[str] | None,
    *,
    require_upstream: bool = True,
    environ: Mapping[str, str] = os.environ,
) -> Config:
    """Read and validate a YAML config file.

    Args:
        path: the file; ``None`` falls back to the ``COMPACT_PROXY_CONFIG`` variable.
        require_upstream: ``False`` allows a config without ``upstream.base_url`` (the demo).
        environ: where ``COMPACT_PROXY_CONFIG`` is looked up.

    Raises:
        ConfigError: no path at all, an unreadable file, bad YAML (with its line), or any
            invalid value (naming its key).
    """
    if path is None:
        path = environ.get(CONFIG_ENV_VAR) or None
    if path is None or not os.fspath(path):
        raise ConfigError("", f"no config file given: pass --config PATH or set {CONFIG_ENV_VAR}")
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError("", f"cannot read {name}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"cannot read {name}: not UTF-8 text") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        where = f"{name} line {line}" if line is not None else name
        raise ConfigError(
            "", f"{where}: invalid YAML: {exc.problem or exc.context or exc}", line=line
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{name}: invalid YAML: {exc}") from None
    return Config.from_mapping(data, require_upstream=require_upstream)
