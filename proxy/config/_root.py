"""The whole configuration: the sections together, the checks across them, what is derived
from them once at load time (the role policies, the source-access policy), and reading it from
a file (strict YAML: no duplicate keys)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import field
from typing import Any

import yaml
from pydantic import Field, TypeAdapter, ValidationError

from policies._compaction import THRESHOLD_NAMES, CompactionPolicy
from policies._roles import ROLE_NAMES, Role, RolePolicies
from policies._source_access import SourceAccessPolicy
from proxy.config._base import Section, is_loopback, section
from proxy.config._errors import ConfigError, config_error, shown, soft_not_below_hard
from proxy.config._operations import AdminConfig, AuditConfig, LoggingConfig
from proxy.config._policies import PoliciesConfig
from proxy.config._sections import (
    CompactionConfig,
    LimitsConfig,
    ListenConfig,
    SessionConfig,
    SourcesConfig,
    StoreConfig,
    SummaryConfig,
    UpstreamConfig,
)
from proxy.config.prices import DEFAULT_PRICES, ModelPrice, Prices, price_for


@section("")
class Config(Section):
    """The whole validated configuration (:func:`load_config`, :meth:`from_mapping`); the role
    and source-access policies are derived once, here, for the request path to look up."""

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
    prices: Prices = Field(default_factory=lambda: DEFAULT_PRICES, description=(
        "What the provider charges, for `compact-proxy report`: model family -> USD per million "
        "tokens; a model is priced by its family or a snapshot of it (claude-opus-4-5-20251101), "
        "else its cost is n/a. Listed families replace or add to the built-in list prices."))
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    _role_policies: RolePolicies = field(init=False, repr=False, compare=False)
    _source_access: SourceAccessPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.session.scope is None and not is_loopback(self.listen.host):
            raise ConfigError("session.scope", (
                f"must be set when listen.host is not a loopback address ({self.listen.host!r}): "
                "credential, header:<name> or none"))
        admin_listen = self.admin.listen
        if admin_listen is not None and admin_listen.port and admin_listen.port == self.listen.port:
            raise ConfigError("admin.listen.port", (
                f"must differ from listen.port ({admin_listen.port}): the admin listener is a "
                "port of its own"))
        roles = RolePolicies({role: _role_policy(self, role) for role in ROLE_NAMES},
                             rules=self.policies.rules)
        object.__setattr__(self, "_role_policies", roles)
        access = self.policies.source_access  # (validated as SourceAccessPolicy validates it)
        policy = SourceAccessPolicy(access.allow_cross_session, access.shared_sessions)
        object.__setattr__(self, "_source_access", policy)

    @classmethod
    def from_mapping(cls, data: object, *, require_upstream: bool = True) -> Config:
        """Validate already-parsed YAML (a mapping of sections); raises :class:`ConfigError`
        for the first problem found."""
        data = {} if data is None else data
        if not isinstance(data, Mapping):
            raise ConfigError("", f"the top level must be a mapping of sections, got {shown(data)}")
        try:
            config = _VALIDATOR.validate_python(data)
        except ValidationError as exc:
            raise config_error(exc, cls, "") from None
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
        """The price of ``model`` (:func:`proxy.config.prices.price_for`)."""
        return price_for(self.prices, model)

    def admin_token(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The token in the variable ``admin.token_env`` names; ``None`` (admin API off) when
        unset or empty. A token too short or padded with whitespace is a :class:`ConfigError`
        naming the variable, never the token."""
        token = environ.get(self.admin.token_env) or None
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

    def summary_api_key(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The API key for summary calls from ``summary.api_key_env``; ``None`` when that is not
        configured or the variable is unset or empty."""
        if self.summary.api_key_env is None:
            return None
        return environ.get(self.summary.api_key_env) or None

    def as_dict(self) -> dict[str, Any]:
        """The effective values as plain data that loads back to the same config (what
        ``check-config --show`` prints, masked): secrets only by their variables' names, but a
        URL's password; ``policies.roles`` with every role's effective thresholds."""
        out: dict[str, Any] = plain(self)
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
            "rules": [plain(rule, omit_none=True) for rule in roles.rules],
            "read_tools": [plain(tool, omit_none=True) for tool in self.policies.read_tools],
            "source_access": plain(self.policies.source_access),
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
    # A summary_recovery request must never set off another summary call: L4 starts off.
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
            user_text_budget_tokens=compaction.user_text_budget_tokens,
            artifact_trail_budget_tokens=compaction.artifact_trail_budget_tokens,
        )
    except ValidationError as exc:
        # Each value is valid on its own; soft < hard may fail across compaction and role.
        error = exc.errors()[0]
        if error["type"] != "soft_not_below_hard":
            raise config_error(exc, CompactionPolicy, prefix) from None
        ctx = error["ctx"]

        def key(name: str) -> str:
            return f"{prefix if name in own else 'compaction'}.{name}"

        raise soft_not_below_hard(ctx, key(ctx["soft_field"]), key(ctx["hard_field"]),
                                  blame_soft=ctx["soft_field"] in own) from None


def plain(value: Any, *, omit_none: bool = False) -> Any:
    """A section (or a value in one) as plain YAML-safe data: lists for tuples, dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            spec.name: plain(item, omit_none=omit_none)
            for spec in dataclasses.fields(value)
            if spec.init
            for item in (getattr(value, spec.name),)
            if not (omit_none and item is None)
        }
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    return value


#: The environment variable naming the config file when no path is given.
CONFIG_ENV_VAR = "COMPACT_PROXY_CONFIG"


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


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_config(
    path: str | os.PathLike[str] | None,
    *,
    require_upstream: bool = True,
    environ: Mapping[str, str] = os.environ,
) -> Config:
    """Read and validate the YAML file at ``path``, else at ``environ[COMPACT_PROXY_CONFIG]``;
    ``require_upstream=False`` allows no ``upstream.base_url`` (the demo). Raises
    :class:`ConfigError` for no path, an unreadable file, bad YAML (with its line), a bad value."""
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
