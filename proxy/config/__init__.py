"""The typed configuration: YAML parsed once, at startup, into nested frozen pydantic dataclasses.

Each section declares its keys as annotated fields (type, limits, default, description); any
problem, in a file or a section built in Python, is one :class:`ConfigError` naming the dotted
key, which the CLI prints on one line before exiting 2 (SPEC §2). ``docs/configuration.md`` and
``config.example.yaml`` are generated from the fields: ``python -m tools.config_docs --write``.

The modules: ``_base`` (value types, the section decorator), ``_sections``, ``_operations``
and ``_policies`` (the sections), ``prices`` (the price table), ``_root`` (:class:`Config` and
:func:`load_config`), ``_errors`` (pydantic's errors in words).
"""

from proxy.config._errors import ConfigError
from proxy.config._operations import AdminConfig, AdminListenConfig, AuditConfig, LoggingConfig
from proxy.config._policies import PoliciesConfig, RoleOverride, SourceAccessConfig
from proxy.config._root import CONFIG_ENV_VAR, Config, load_config
from proxy.config._sections import (
    SEPARATE_SUMMARY_MODEL,
    CompactionConfig,
    EventLoopName,
    LimitsConfig,
    ListenConfig,
    S3SourcesConfig,
    SessionConfig,
    SourcesConfig,
    StoreConfig,
    SummaryConfig,
    UpstreamConfig,
)
from proxy.config.prices import DEFAULT_PRICES, ModelPrice

__all__ = [
    "AdminConfig", "AdminListenConfig", "AuditConfig", "CompactionConfig", "Config", "ConfigError",
    "CONFIG_ENV_VAR", "DEFAULT_PRICES", "EventLoopName", "LimitsConfig", "ListenConfig",
    "LoggingConfig", "ModelPrice", "PoliciesConfig", "RoleOverride", "SEPARATE_SUMMARY_MODEL",
    "SessionConfig", "S3SourcesConfig", "SourceAccessConfig", "SourcesConfig", "StoreConfig",
    "SummaryConfig", "UpstreamConfig", "load_config",
]
