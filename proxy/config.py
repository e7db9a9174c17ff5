"""The typed configuration: YAML parsed once, at startup, into nested frozen dataclasses.

Every section is a frozen dataclass whose fields carry their own check (in the field
metadata); ``__post_init__`` runs the checks, so a section built directly in Python is held to
the same rules as one read from YAML. Any problem is one :class:`ConfigError` naming the
dotted key (``compaction.soft_threshold_tokens``) and the problem; the CLI prints it on one
line and exits 2 before anything starts (SPEC §2).

Keys and defaults follow SPEC §3. Extensions: ``limits.max_body_bytes``,
``upstream``-independent ``summary.api_key_env`` / ``summary.max_retries``, and the
``policies`` section (per-role overrides, role rules, file-read tools, source access).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

import yaml

from policies._compaction import DEFAULT_READ_TOOLS, CompactionPolicy, ReadToolSpec
from policies._roles import DEFAULT_ROLE_RULES, ROLE_NAMES, RolePolicies, RoleRule
from policies._session_ids import SESSION_ID_RULE, session_id_problem
from policies._source_access import SourceAccessPolicy

__all__ = [
    "AdminConfig",
    "CompactionConfig",
    "Config",
    "ConfigError",
    "CONFIG_ENV_VAR",
    "LimitsConfig",
    "ListenConfig",
    "LoggingConfig",
    "PoliciesConfig",
    "RoleOverride",
    "SessionConfig",
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


# --------------------------------------------------------------------------------------
# Value checks. Each takes the raw value and returns the normalized one or raises _Invalid;
# the caller knows the key and turns _Invalid into a ConfigError.

class _Invalid(Exception):
    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


_Check = Callable[[Any], Any]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


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


def _integer(minimum: int, maximum: int | None = None) -> _Check:
    def check(value: Any) -> int:
        # bool is an int subclass in Python; `port: true` is still a mistake.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"must be an integer, got {_shown(value)}")
        if maximum is not None and not minimum <= value <= maximum:
            raise _Invalid(f"must be between {minimum} and {maximum}, got {value}")
        if value < minimum:
            raise _Invalid(f"must be at least {minimum}, got {value}")
        return value

    return check


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid(f"must be a number of seconds, got {_shown(value)}")
    if not math.isfinite(value) or value <= 0:
        raise _Invalid(f"must be a positive number of seconds, got {value}")
    return float(value)


def _ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid(f"must be a number, got {_shown(value)}")
    if not math.isfinite(value) or not 0 < value <= 1:
        raise _Invalid(f"must be above 0 and at most 1, got {value}")
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"must be true or false, got {_shown(value)}")
    return value


def _string(pattern: re.Pattern[str] | None = None, what: str = "") -> _Check:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise _Invalid(f"must be a string, got {_shown(value)}")
        if not value.strip():
            raise _Invalid("must not be empty")
        if pattern is not None and pattern.fullmatch(value) is None:
            raise _Invalid(f"must be {what}, got {value!r}")
        return value

    return check


def _optional(check: _Check) -> _Check:
    def optional(value: Any) -> Any:
        return None if value is None else check(value)

    return optional


def _choice(*allowed: str) -> _Check:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise _Invalid(f"must be one of {', '.join(allowed)}, got {_shown(value)}")
        return value

    return check


def _url(*schemes: str) -> _Check:
    def check(value: Any) -> str:
        text: str = _string()(value)
        try:
            parts = urlsplit(text)
        except ValueError as exc:
            raise _Invalid(f"is not a valid URL ({exc}): {text!r}") from None
        if parts.scheme not in schemes or not (parts.netloc or parts.scheme == "unix"):
            raise _Invalid(f"must be a {' or '.join(s + '://' for s in schemes)} URL, got {text!r}")
        return text

    return check


def _header_name(value: Any) -> str:
    # Header names are case-insensitive; store the lower-case form once.
    text: str = _string(_HEADER_NAME, "an HTTP header name")(value)
    return text.lower()


def _regex(value: Any) -> str:
    text: str = _string()(value)
    try:
        re.compile(text)
    except re.error as exc:
        raise _Invalid(f"is not a valid regular expression ({exc}): {text!r}") from None
    return text


def _string_list(item: _Check) -> _Check:
    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            raise _Invalid(f"must be a list, got {_shown(value)}")
        out = []
        for index, element in enumerate(value):
            try:
                out.append(item(element))
            except _Invalid as exc:
                raise _Invalid(f"item {index} {exc.problem}") from None
        return tuple(out)

    return check


def _session_id(value: Any) -> str:
    text: str = _string()(value)
    # The one rule for session ids (the same as compactor.check_session_id's).
    problem = session_id_problem(text)
    if problem is not None:
        raise _Invalid(f"is not a valid session id ({problem}; a session id is "
                       f"{SESSION_ID_RULE}): {text!r}")
    return text


def _checked(key: str, check: _Check, value: Any) -> Any:
    try:
        return check(value)
    except _Invalid as exc:
        raise ConfigError(key, exc.problem) from None


_T = TypeVar("_T")


def _opt(default: _T, check: _Check) -> _T:
    """A dataclass field with a default and the check ``__post_init__`` runs on it."""
    return field(default=default, metadata={"check": check})


class _Section:
    """Base of the config sections: runs every field's check, then the cross-field checks.

    Subclasses are frozen dataclasses and set :attr:`KEY`, their dotted position.
    """

    KEY: ClassVar[str] = ""

    def _key(self) -> str:
        return self.KEY

    def __post_init__(self) -> None:
        for spec in fields(self):  # type: ignore[arg-type]
            check = spec.metadata.get("check")
            if check is not None:
                value = _checked(f"{self._key()}.{spec.name}", check, getattr(self, spec.name))
                object.__setattr__(self, spec.name, value)
        self._validate()

    def _validate(self) -> None:
        """Checks that span several fields; none by default."""


# --------------------------------------------------------------------------------------
# The sections, in SPEC §3 order.

@dataclass(frozen=True)
class ListenConfig(_Section):
    """Where the proxy listens. ``port`` 0 picks a free port."""

    KEY: ClassVar[str] = "listen"
    host: str = _opt("127.0.0.1", _string())
    port: int = _opt(8787, _integer(0, 65535))


@dataclass(frozen=True)
class LimitsConfig(_Section):
    """Request limits; a body larger than ``max_body_bytes`` gets 413 ``request_too_large``."""

    KEY: ClassVar[str] = "limits"
    max_body_bytes: int = _opt(32 * 1024 * 1024, _integer(1))


@dataclass(frozen=True)
class UpstreamConfig(_Section):
    """The real provider. ``base_url`` is required by ``serve`` (``None`` only for the demo)."""

    KEY: ClassVar[str] = "upstream"
    base_url: str | None = _opt(None, _optional(_url("http", "https")))
    connect_timeout_s: float = _opt(10.0, _seconds)
    read_timeout_s: float = _opt(600.0, _seconds)


_POLICY_KEYS: tuple[str, ...] = (
    "soft_threshold_tokens",
    "hard_limit_tokens",
    "max_tool_result_tokens",
    "keep_recent_messages",
    "summary_keep_recent",
)


def _check_soft_below_hard(
    soft: int, hard: int, soft_key: str, hard_key: str, blame_soft: bool
) -> None:
    if soft < hard:
        return
    if blame_soft:
        raise ConfigError(soft_key, f"must be below {hard_key} ({soft} >= {hard})")
    raise ConfigError(hard_key, f"must be above {soft_key} ({hard} <= {soft})")


@dataclass(frozen=True)
class CompactionConfig(_Section):
    """The compaction thresholds every role starts from (SPEC §3 ``compaction``)."""

    KEY: ClassVar[str] = "compaction"
    soft_threshold_tokens: int = _opt(80_000, _integer(1))
    hard_limit_tokens: int = _opt(120_000, _integer(1))
    max_tool_result_tokens: int = _opt(5_000, _integer(1))
    keep_recent_messages: int = _opt(6, _integer(0))
    summary_keep_recent: int = _opt(4, _integer(0))
    token_counter: str = _opt("tiktoken", _choice("tiktoken", "chars4"))
    sticky: bool = _opt(True, _boolean)
    compact_to_ratio: float = _opt(0.7, _ratio)

    def _validate(self) -> None:
        _check_soft_below_hard(
            self.soft_threshold_tokens,
            self.hard_limit_tokens,
            "compaction.soft_threshold_tokens",
            "compaction.hard_limit_tokens",
            blame_soft=True,
        )


@dataclass(frozen=True)
class SummaryConfig(_Section):
    """The L4 summarizer: model and limits of the summary call made through the anthropic SDK.

    ``api_key_env`` names the environment variable holding the key for summary calls (the
    key itself is never part of the config); ``None`` leaves the choice to the summarizer.
    """

    KEY: ClassVar[str] = "summary"
    enabled: bool = _opt(True, _boolean)
    model: str = _opt("claude-haiku-4-5", _string())
    max_tokens: int = _opt(2048, _integer(1))
    timeout_s: float = _opt(60.0, _seconds)
    api_key_env: str | None = _opt(
        None, _optional(_string(_ENV_NAME, "an environment variable name"))
    )
    max_retries: int = _opt(2, _integer(0))


@dataclass(frozen=True)
class StoreConfig(_Section):
    """Where per-session state lives: embedded SQLite at ``path``, or Redis at ``url``."""

    KEY: ClassVar[str] = "store"
    backend: str = _opt("sqlite", _choice("sqlite", "redis"))
    path: str = _opt("./compact-proxy-state/state.db", _string())
    url: str | None = _opt(None, _optional(_url("redis", "rediss", "unix")))

    def _validate(self) -> None:
        if self.backend == "redis" and self.url is None:
            raise ConfigError("store.url", "required when store.backend is redis")


@dataclass(frozen=True)
class SourcesConfig(_Section):
    """The roots the source-pointer resolver reads transcripts and artifacts from."""

    KEY: ClassVar[str] = "sources"
    transcript_root: str = _opt("./compact-proxy-state/transcripts", _string())
    artifact_root: str = _opt("./compact-proxy-state/artifacts", _string())


@dataclass(frozen=True)
class SessionConfig(_Section):
    """The request header that names the session first (SPEC §4); stored lower-case."""

    KEY: ClassVar[str] = "session"
    header: str = _opt("x-compact-session-id", _header_name)


@dataclass(frozen=True)
class AdminConfig(_Section):
    """The admin API's token, by the name of the environment variable that holds it."""

    KEY: ClassVar[str] = "admin"
    token_env: str = _opt(
        "COMPACT_PROXY_ADMIN_TOKEN", _string(_ENV_NAME, "an environment variable name")
    )


@dataclass(frozen=True)
class LoggingConfig(_Section):
    """structlog output: ``json`` (one object per line) or ``console``, and the level."""

    KEY: ClassVar[str] = "logging"
    format: str = _opt("json", _choice("json", "console"))
    level: str = _opt("info", _choice("debug", "info", "warning", "error"))


@dataclass(frozen=True)
class RoleOverride(_Section):
    """``policies.roles.<role>``: the compaction keys one role changes, and ``summary_enabled``.

    ``None`` means "inherit": the thresholds from the ``compaction`` section, ``summary_enabled``
    from ``summary.enabled`` (``false`` for ``summary_recovery``). ``token_counter`` is global.
    """

    role: str = _opt("main", _choice(*ROLE_NAMES))
    soft_threshold_tokens: int | None = _opt(None, _optional(_integer(1)))
    hard_limit_tokens: int | None = _opt(None, _optional(_integer(1)))
    max_tool_result_tokens: int | None = _opt(None, _optional(_integer(1)))
    keep_recent_messages: int | None = _opt(None, _optional(_integer(0)))
    summary_keep_recent: int | None = _opt(None, _optional(_integer(0)))
    summary_enabled: bool | None = _opt(None, _optional(_boolean))

    def _key(self) -> str:
        return f"policies.roles.{self.role}"


@dataclass(frozen=True)
class SourceAccessConfig(_Section):
    """``policies.source_access``: whether a session may resolve another session's pointers."""

    KEY: ClassVar[str] = "policies.source_access"
    allow_cross_session: bool = _opt(False, _boolean)
    shared_sessions: tuple[str, ...] = _opt((), _string_list(_session_id))


@dataclass(frozen=True)
class PoliciesConfig:
    """The ``policies`` section, with defaults filled in.

    Attributes:
        roles: role -> its overrides; a role not listed inherits everything.
        rules: the role rules (:data:`policies._roles.DEFAULT_ROLE_RULES` unless given).
        read_tools: the tools L2 counts as file reads (``DEFAULT_READ_TOOLS`` unless given).
        source_access: the source-access settings.
    """

    roles: Mapping[str, RoleOverride] = field(default_factory=dict)
    rules: tuple[RoleRule, ...] = DEFAULT_ROLE_RULES
    read_tools: tuple[ReadToolSpec, ...] = DEFAULT_READ_TOOLS
    source_access: SourceAccessConfig = field(default_factory=SourceAccessConfig)

    def __post_init__(self) -> None:
        for role, override in self.roles.items():
            if role not in ROLE_NAMES or not isinstance(override, RoleOverride):
                raise ConfigError(f"policies.roles.{role}", "unknown role")
            if override.role != role:
                raise ConfigError(
                    f"policies.roles.{role}", f"holds the overrides of {override.role!r}"
                )
        object.__setattr__(self, "roles", MappingProxyType(dict(self.roles)))
        object.__setattr__(self, "rules", tuple(self.rules))
        object.__setattr__(self, "read_tools", tuple(self.read_tools))


@dataclass(frozen=True)
class Config:
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
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    _role_policies: RolePolicies = field(init=False, repr=False, compare=False)
    _source_access: SourceAccessPolicy = field(init=False, repr=False, compare=False)

    SECTIONS: ClassVar[tuple[str, ...]] = (
        "listen",
        "limits",
        "upstream",
        "compaction",
        "summary",
        "store",
        "sources",
        "session",
        "admin",
        "logging",
        "policies",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_role_policies", _build_role_policies(self))
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
        top = _mapping(data, "", "the top level must be a mapping of sections")
        _reject_unknown(top, cls.SECTIONS, "")
        config = cls(
            listen=_section(ListenConfig, top.get("listen"), "listen"),
            limits=_section(LimitsConfig, top.get("limits"), "limits"),
            upstream=_section(UpstreamConfig, top.get("upstream"), "upstream"),
            compaction=_section(CompactionConfig, top.get("compaction"), "compaction"),
            summary=_section(SummaryConfig, top.get("summary"), "summary"),
            store=_section(StoreConfig, top.get("store"), "store"),
            sources=_section(SourcesConfig, top.get("sources"), "sources"),
            session=_section(SessionConfig, top.get("session"), "session"),
            admin=_section(AdminConfig, top.get("admin"), "admin"),
            logging=_section(LoggingConfig, top.get("logging"), "logging"),
            policies=_parse_policies(top.get("policies")),
        )
        if require_upstream and config.upstream.base_url is None:
            raise ConfigError(
                "upstream.base_url", "required (the provider, e.g. https://api.anthropic.com)"
            )
        return config

    def role_policies(self) -> RolePolicies:
        """The per-role compaction policies and role rules, built once at load time."""
        return self._role_policies

    def source_access(self) -> SourceAccessPolicy:
        """The source-access policy, built once at load time."""
        return self._source_access

    def admin_token(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The admin token from the variable named by ``admin.token_env``; ``None`` (admin API
        off) when it is unset or empty."""
        env = os.environ if environ is None else environ
        return env.get(self.admin.token_env) or None

    def summary_api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The API key for summary calls from ``summary.api_key_env``; ``None`` when that is not
        configured or the variable is unset or empty."""
        if self.summary.api_key_env is None:
            return None
        env = os.environ if environ is None else environ
        return env.get(self.summary.api_key_env) or None

    def as_dict(self) -> dict[str, Any]:
        """The effective values as plain YAML-safe data (what ``check-config`` prints).

        Secrets appear only as the names of their environment variables. ``policies.roles``
        shows every role's effective thresholds; feeding the result back to
        :meth:`from_mapping` gives the same effective configuration.
        """
        out: dict[str, Any] = {
            name: _section_dict(getattr(self, name)) for name in self.SECTIONS[:-1]
        }
        roles = self._role_policies
        out["policies"] = {
            "roles": {
                role: {
                    **{key: getattr(roles.policy_for(role), key) for key in _POLICY_KEYS},
                    "summary_enabled": roles.policy_for(role).summary_enabled,
                }
                for role in ROLE_NAMES
            },
            "rules": [
                {
                    key: getattr(rule, key)
                    for key in _RULE_KEYS
                    if getattr(rule, key) is not None
                }
                for rule in roles.rules
            ],
            "read_tools": [
                {
                    "name": tool.name,
                    "path_field": tool.path_field,
                    "range_fields": list(tool.range_fields),
                    **({"command": tool.command} if tool.command is not None else {}),
                }
                for tool in self.policies.read_tools
            ],
            "source_access": _section_dict(self.policies.source_access),
        }
        return out


# --------------------------------------------------------------------------------------
# Parsing helpers.

_RULE_KEYS: tuple[str, ...] = ("role", "header", "header_pattern", "model_pattern")
_READ_TOOL_KEYS: tuple[str, ...] = ("name", "path_field", "range_fields", "command")
_POLICIES_KEYS: tuple[str, ...] = ("roles", "rules", "read_tools", "source_access")

_S = TypeVar("_S", bound=_Section)


def _join(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _mapping(value: object, key: str, what: str = "") -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"{what or 'must be a mapping'}, got {_shown(value)}")
    return value


def _closest(name: str, known: tuple[str, ...]) -> str | None:
    """The known key a misspelt ``name`` most likely meant: a key it begins, else difflib's."""
    prefixed = [key for key in known if name and key.startswith(name)]
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(name, known, n=1)
    return close[0] if close else None


def _reject_unknown(data: Mapping[Any, Any], known: tuple[str, ...], prefix: str) -> None:
    for key in data:
        if isinstance(key, str) and key in known:
            continue
        close = _closest(str(key), known)
        hint = f"did you mean {close!r}?" if close else f"known keys: {', '.join(known)}"
        raise ConfigError(_join(prefix, key), f"unknown key ({hint})")


def _init_keys(cls: type[Any]) -> tuple[str, ...]:
    return tuple(spec.name for spec in fields(cls) if spec.init and not spec.name.startswith("_"))


def _section(cls: type[_S], raw: object, key: str, **fixed: Any) -> _S:
    data = _mapping({} if raw is None else raw, key)
    _reject_unknown(data, tuple(k for k in _init_keys(cls) if k not in fixed), key)
    return cls(**fixed, **data)


def _parse_policies(raw: object) -> PoliciesConfig:
    data = _mapping({} if raw is None else raw, "policies")
    _reject_unknown(data, _POLICIES_KEYS, "policies")
    roles: dict[str, RoleOverride] = {}
    roles_raw = _mapping({} if data.get("roles") is None else data["roles"], "policies.roles")
    for role, override in roles_raw.items():
        if role not in ROLE_NAMES:
            close = _closest(str(role), ROLE_NAMES)
            hint = f"did you mean {close!r}?" if close else f"roles are {', '.join(ROLE_NAMES)}"
            raise ConfigError(f"policies.roles.{role}", f"unknown role ({hint})")
        if isinstance(override, Mapping) and "token_counter" in override:
            raise ConfigError(
                f"policies.roles.{role}.token_counter",
                "is global; set compaction.token_counter instead",
            )
        roles[role] = _section(RoleOverride, override, f"policies.roles.{role}", role=role)
    rules = DEFAULT_ROLE_RULES if data.get("rules") is None else _parse_rules(data["rules"])
    read_tools = (
        DEFAULT_READ_TOOLS
        if data.get("read_tools") is None
        else _parse_read_tools(data["read_tools"])
    )
    source_access = _section(
        SourceAccessConfig, data.get("source_access"), "policies.source_access"
    )
    return PoliciesConfig(
        roles=roles, rules=rules, read_tools=read_tools, source_access=source_access
    )


def _items(raw: object, key: str, what: str) -> list[tuple[str, Mapping[Any, Any]]]:
    if not isinstance(raw, list):
        raise ConfigError(key, f"must be a list of {what}, got {_shown(raw)}")
    return [(f"{key}[{i}]", _mapping(item, f"{key}[{i}]")) for i, item in enumerate(raw)]


def _required(data: Mapping[Any, Any], name: str, key: str, check: _Check) -> Any:
    if data.get(name) is None:
        raise ConfigError(f"{key}.{name}", "required")
    return _checked(f"{key}.{name}", check, data[name])


def _parse_rules(raw: object) -> tuple[RoleRule, ...]:
    rules = []
    for key, data in _items(raw, "policies.rules", "rules"):
        _reject_unknown(data, _RULE_KEYS, key)
        role = _required(data, "role", key, _choice(*ROLE_NAMES))
        header = _checked(f"{key}.header", _optional(_header_name), data.get("header"))
        header_pattern, model_pattern = (
            _checked(f"{key}.{name}", _optional(_regex), data.get(name))
            for name in ("header_pattern", "model_pattern")
        )
        try:
            rules.append(RoleRule(role, header, header_pattern, model_pattern))
        except ValueError as exc:
            raise ConfigError(key, str(exc)) from None
    return tuple(rules)


def _parse_read_tools(raw: object) -> tuple[ReadToolSpec, ...]:
    tools = []
    for key, data in _items(raw, "policies.read_tools", "tools"):
        _reject_unknown(data, _READ_TOOL_KEYS, key)
        name = _required(data, "name", key, _string())
        path_field = _required(data, "path_field", key, _string())
        range_fields = _checked(
            f"{key}.range_fields", _string_list(_string()), data.get("range_fields") or []
        )
        command = _checked(f"{key}.command", _optional(_string()), data.get("command"))
        tools.append(ReadToolSpec(name, path_field, range_fields, command))
    return tuple(tools)


def _build_role_policies(config: Config) -> RolePolicies:
    """Each role's CompactionPolicy: the compaction section, then the role's overrides."""
    compaction, summary = config.compaction, config.summary
    policies: dict[str, CompactionPolicy] = {}
    for role in ROLE_NAMES:
        values = {key: getattr(compaction, key) for key in _POLICY_KEYS}
        # A summary_recovery request must never set off another summary call, so that role
        # starts with L4 off. The other roles follow summary.enabled.
        summary_enabled = summary.enabled and role != "summary_recovery"
        override = config.policies.roles.get(role)
        prefix = f"policies.roles.{role}"
        if override is not None:
            for key in _POLICY_KEYS:
                value = getattr(override, key)
                if value is not None:
                    values[key] = value
            if override.summary_enabled is not None:
                if override.summary_enabled and not summary.enabled:
                    raise ConfigError(
                        f"{prefix}.summary_enabled", "cannot be true while summary.enabled is false"
                    )
                summary_enabled = override.summary_enabled
            soft_own = override.soft_threshold_tokens is not None
            hard_own = override.hard_limit_tokens is not None
            _check_soft_below_hard(
                values["soft_threshold_tokens"],
                values["hard_limit_tokens"],
                f"{prefix if soft_own else 'compaction'}.soft_threshold_tokens",
                f"{prefix if hard_own else 'compaction'}.hard_limit_tokens",
                blame_soft=soft_own,
            )
        try:
            policies[role] = CompactionPolicy(
                **values, read_tools=config.policies.read_tools, summary_enabled=summary_enabled,
                compact_to_ratio=compaction.compact_to_ratio,
            )
        except ValueError as exc:
            raise ConfigError(prefix, str(exc)) from None
    return RolePolicies(policies, rules=config.policies.rules)


def _section_dict(section: object) -> dict[str, Any]:
    return {
        spec.name: list(value) if isinstance(value, tuple) else value
        for spec in fields(section)  # type: ignore[arg-type]
        if not spec.name.startswith("_")
        for value in (getattr(section, spec.name),)
    }


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
