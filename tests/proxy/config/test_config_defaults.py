"""Tests for proxy.config: the defaults, frozen values, sections built in Python."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from policies import DEFAULT_READ_TOOLS, CompactionPolicy, ReadToolSpec, RoleRule
from policies._compaction import THRESHOLD_NAMES, Thresholds
from proxy.config import (
    CompactionConfig,
    Config,
    ConfigError,
    ListenConfig,
    RoleOverride,
    StoreConfig,
    UpstreamConfig,
    load_config,
)
from tests.proxy.config.helpers import UPSTREAM, write

# ------------------------------------------------------------------------------ defaults


def test_defaults_are_the_spec_values() -> None:
    """A config naming only upstream.base_url has exactly the SPEC §3 defaults."""
    config = Config.from_mapping(UPSTREAM)
    assert (config.listen.host, config.listen.port) == ("127.0.0.1", 8787)
    assert config.limits.max_body_bytes == 32 * 1024 * 1024
    assert config.upstream.base_url == "https://api.anthropic.com"
    assert (config.upstream.connect_timeout_s, config.upstream.read_timeout_s) == (10, 600)
    c = config.compaction
    assert (
        c.soft_threshold_tokens,
        c.hard_limit_tokens,
        c.max_tool_result_tokens,
        c.keep_recent_messages,
        c.summary_keep_recent,
        c.token_counter,
    ) == (80_000, 120_000, 5_000, 6, 4, "tiktoken")
    s = config.summary
    assert (s.enabled, s.mode, s.model, s.max_tokens, s.timeout_s, s.api_key_env,
            s.max_retries, s.context_window_tokens) == (
        True,
        "fork",
        None,
        2048,
        60,
        None,
        2,
        200_000,
    )
    # Unset, the model is the client's in fork mode and the SPEC's Haiku in separate mode.
    assert s.call_model("claude-sonnet-4-5") == "claude-sonnet-4-5"
    separate = Config.from_mapping({**UPSTREAM, "summary": {"mode": "separate"}}).summary
    assert separate.call_model("claude-sonnet-4-5") == "claude-haiku-4-5"
    assert (config.store.backend, config.store.path, config.store.url) == (
        "sqlite",
        "./compact-proxy-state/state.db",
        None,
    )
    assert config.sources.transcript_root == "./compact-proxy-state/transcripts"
    assert config.sources.artifact_root == "./compact-proxy-state/artifacts"
    assert config.session.header == "x-compact-session-id"
    assert config.admin.token_env == "COMPACT_PROXY_ADMIN_TOKEN"
    assert (config.logging.format, config.logging.level) == ("json", "info")
    assert config.policies.read_tools == DEFAULT_READ_TOOLS
    assert config.policies.rules == (RoleRule("subagent", header="x-claude-code-agent-id"),)
    assert dict(config.policies.roles) == {}


def test_empty_sections_and_empty_file_mean_defaults(tmp_path: Path) -> None:
    """Null sections (`listen:` with nothing under it) and an empty file give the defaults."""
    assert load_config(write(tmp_path, "listen:\npolicies:\n"), require_upstream=False) == Config()
    assert load_config(write(tmp_path, ""), require_upstream=False) == Config()


def test_integers_are_accepted_for_seconds_and_stored_as_floats() -> None:
    """Timeouts accept ints and floats and are stored as float seconds."""
    config = Config.from_mapping(
        {
            "upstream": {
                "base_url": "http://127.0.0.1:1",
                "connect_timeout_s": 3,
                "read_timeout_s": 2.5,
            }
        }
    )
    assert config.upstream.connect_timeout_s == 3.0
    assert isinstance(config.upstream.connect_timeout_s, float)
    assert config.upstream.read_timeout_s == 2.5


def test_session_header_is_stored_lower_case() -> None:
    """session.header is case-insensitive, so it is stored lower-cased."""
    config = Config.from_mapping({**UPSTREAM, "session": {"header": "X-My-Session"}})
    assert config.session.header == "x-my-session"


def test_config_values_are_frozen() -> None:
    """No section of a loaded config can be changed."""
    config = Config.from_mapping(UPSTREAM)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.listen.port = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.compaction = CompactionConfig()  # type: ignore[misc]


def test_sections_built_in_python_are_validated_too() -> None:
    """Constructing a section directly runs the same checks as loading YAML."""
    with pytest.raises(ConfigError) as info:
        ListenConfig(port=70_000)
    assert info.value.key == "listen.port"
    with pytest.raises(ConfigError) as info:
        StoreConfig(backend="redis")
    assert info.value.key == "store.url"


def test_thresholds_are_declared_once_for_section_overrides_and_policies() -> None:
    """The compaction section and CompactionPolicy are Thresholds; a role override has each
    threshold, optional, under the same limits; soft < hard holds for a section built here."""
    assert issubclass(CompactionConfig, Thresholds) and issubclass(CompactionPolicy, Thresholds)
    names = [spec.name for spec in dataclasses.fields(RoleOverride)]
    assert names == [*THRESHOLD_NAMES, "summary_enabled"]
    assert RoleOverride() == RoleOverride(**dict.fromkeys(names))  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        RoleOverride(keep_recent_messages=-1)
    assert info.value.problem == "must be at least 0, got -1"
    with pytest.raises(ConfigError) as info:
        CompactionConfig(soft_threshold_tokens=9, hard_limit_tokens=9)
    assert str(info.value) == (
        "config error: compaction.soft_threshold_tokens: must be below "
        "compaction.hard_limit_tokens (9 >= 9)"
    )


def test_require_base_url_is_the_one_check_of_the_provider() -> None:
    """upstream.require_base_url() gives the URL, or the ConfigError serve reports."""
    assert UpstreamConfig(base_url="http://127.0.0.1:9").require_base_url() == "http://127.0.0.1:9"
    with pytest.raises(ConfigError) as info:
        Config().upstream.require_base_url()
    assert str(info.value) == (
        "config error: upstream.base_url: required (the provider, e.g. https://api.anthropic.com)"
    )


def test_null_keys_of_rules_and_read_tools_mean_their_defaults(tmp_path: Path) -> None:
    """`model_pattern:` or `range_fields:` with nothing after is the key left out."""
    text = (
        "policies:\n"
        "  rules: [{role: subagent, header: X-A, model_pattern: null}]\n"
        "  read_tools: [{name: cat, path_field: file, range_fields: null}]\n"
    )
    config = load_config(write(tmp_path, text), require_upstream=False)
    assert config.policies.rules == (RoleRule("subagent", header="x-a"),)
    assert config.policies.read_tools == (ReadToolSpec("cat", "file"),)


def test_replace_revalidates_and_rebuilds_role_policies() -> None:
    """dataclasses.replace on Config checks again and derives the role policies anew."""
    config = Config.from_mapping(UPSTREAM)
    changed = dataclasses.replace(
        config, compaction=CompactionConfig(soft_threshold_tokens=10, hard_limit_tokens=20)
    )
    assert changed.role_policies().policy_for("main").hard_limit_tokens == 20
    assert config.role_policies().policy_for("main").hard_limit_tokens == 120_000
