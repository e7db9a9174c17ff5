"""Tests for proxy.config: derived values (role policies, rules, admin and summary keys, audit)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from policies import CompactionPolicy, ReadToolSpec, SourceAccessPolicy
from proxy.config import Config, ConfigError
from tests.proxy.config.helpers import UPSTREAM

# ------------------------------------------------------------------------------ derived values


def test_role_policies_are_built_once_and_inherit_compaction() -> None:
    """role_policies() returns one prebuilt object whose roles inherit the compaction section."""
    config = Config.from_mapping(
        {**UPSTREAM, "compaction": {"soft_threshold_tokens": 1000, "hard_limit_tokens": 2000}}
    )
    roles = config.role_policies()
    assert roles is config.role_policies()
    main = roles.policy_for("main")
    assert main == CompactionPolicy(soft_threshold_tokens=1000, hard_limit_tokens=2000)
    assert roles.policy_for("subagent") == main
    assert roles.policy_for("summary_recovery") == dataclasses.replace(main, summary_enabled=False)


def test_summary_disabled_turns_l4_off_for_every_role() -> None:
    """summary.enabled false makes every role's policy summary_enabled False."""
    config = Config.from_mapping({**UPSTREAM, "summary": {"enabled": False}})
    assert all(
        not config.role_policies().policy_for(role).summary_enabled
        for role in ("main", "subagent", "summary_recovery")
    )


def test_role_overrides_apply_to_their_role_only() -> None:
    """policies.roles.<role> keys override the compaction section for that role alone."""
    config = Config.from_mapping(
        {
            **UPSTREAM,
            "policies": {
                "roles": {
                    "subagent": {
                        "soft_threshold_tokens": 40_000,
                        "keep_recent_messages": 2,
                        "summary_enabled": False,
                    },
                    "summary_recovery": {"summary_enabled": True},
                }
            },
        }
    )
    roles = config.role_policies()
    sub = roles.policy_for("subagent")
    assert (sub.soft_threshold_tokens, sub.hard_limit_tokens, sub.keep_recent_messages) == (
        40_000,
        120_000,
        2,
    )
    assert sub.summary_enabled is False
    assert roles.policy_for("main") == CompactionPolicy()
    assert roles.policy_for("summary_recovery").summary_enabled is True
    assert roles.select({"X-Claude-Code-Agent-Id": "a"}, None) == ("subagent", sub)


def test_rules_and_read_tools_replace_the_defaults() -> None:
    """Given rules and read_tools replace the defaults and reach every role's policy."""
    config = Config.from_mapping(
        {
            **UPSTREAM,
            "policies": {
                "rules": [{"role": "subagent", "model_pattern": "claude-haiku-.*"}],
                "read_tools": [{"name": "cat", "path_field": "file", "command": "show"}],
            },
        }
    )
    roles = config.role_policies()
    assert roles.select({"x-claude-code-agent-id": "a"}, "claude-opus-4-5")[0] == "main"
    assert roles.select({}, "claude-haiku-4-5")[0] == "subagent"
    expected = (ReadToolSpec("cat", "file", (), "show"),)
    assert all(roles.policy_for(r).read_tools == expected for r in ("main", "subagent"))


def test_empty_rules_list_means_no_rules() -> None:
    """`rules: []` removes the default subagent rule."""
    config = Config.from_mapping({**UPSTREAM, "policies": {"rules": []}})
    assert config.role_policies().select({"x-claude-code-agent-id": "a"}, None)[0] == "main"


def test_source_access_policy_reflects_the_config() -> None:
    """source_access() is the SourceAccessPolicy built from policies.source_access."""
    default = Config.from_mapping(UPSTREAM).source_access()
    assert default == SourceAccessPolicy()
    config = Config.from_mapping(
        {**UPSTREAM, "policies": {"source_access": {"shared_sessions": ["team-notes"]}}}
    )
    assert config.source_access() == SourceAccessPolicy(shared_sessions=("team-notes",))
    assert config.source_access() is config.source_access()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"COMPACT_PROXY_ADMIN_TOKEN": ""}, None),
        ({"COMPACT_PROXY_ADMIN_TOKEN": "t0k" * 11}, "t0k" * 11),
    ],
)
def test_admin_token_comes_from_the_named_env_var(
    environ: dict[str, str], expected: str | None
) -> None:
    """admin_token() reads admin.token_env; unset or empty means the admin API is off."""
    assert Config.from_mapping(UPSTREAM).admin_token(environ) == expected


def test_admin_token_env_name_is_configurable() -> None:
    """admin.token_env chooses which variable holds the token."""
    config = Config.from_mapping({**UPSTREAM, "admin": {"token_env": "MY_TOKEN"}})
    token = "abc" * 11
    assert config.admin_token({"MY_TOKEN": token, "COMPACT_PROXY_ADMIN_TOKEN": "x"}) == token


@pytest.mark.parametrize(("mapping", "token", "problem"), [
    ({}, "x", "holds a token of 1 characters; at least 32 are required"),
    ({}, "k" * 31, "holds a token of 31 characters; at least 32 are required"),
    ({"min_token_length": 40}, "k" * 39, "of 39 characters; at least 40 are required"),
    ({}, " " + "k" * 40, "has leading or trailing whitespace"),
])
def test_a_short_or_padded_admin_token_is_a_config_error(
    mapping: dict[str, Any], token: str, problem: str
) -> None:
    """admin_token() refuses a token below admin.min_token_length, naming the variable and
    the minimum but never the token."""
    config = Config.from_mapping({**UPSTREAM, "admin": mapping})
    with pytest.raises(ConfigError) as caught:
        config.admin_token({"COMPACT_PROXY_ADMIN_TOKEN": token})
    assert caught.value.key == "admin.token_env"
    assert "COMPACT_PROXY_ADMIN_TOKEN" in str(caught.value) and problem in str(caught.value)
    assert len(token) == 1 or token.strip() not in str(caught.value)
    assert config.admin_token({"COMPACT_PROXY_ADMIN_TOKEN": "k" * 40}) == "k" * 40


@pytest.mark.parametrize(("admin", "key", "problem"), [
    ({"min_token_length": 8}, "admin.min_token_length", "at least 16"),
    ({"lockout_s": 10, "max_lockout_s": 5}, "admin.max_lockout_s", "must be at least"),
    ({"listen": {"port": 8787}}, "admin.listen.port", "must differ from listen.port"),
    ({"listen": {}}, "admin.listen.port", "required"),
])
def test_admin_settings_are_checked(admin: dict[str, Any], key: str, problem: str) -> None:
    """The admin section's limits, named by key."""
    with pytest.raises(ConfigError) as caught:
        Config.from_mapping({**UPSTREAM, "admin": admin})
    assert caught.value.key == key and problem in caught.value.problem


def test_summary_api_key_comes_from_the_named_env_var() -> None:
    """summary_api_key() reads summary.api_key_env, None when not configured or empty."""
    assert Config.from_mapping(UPSTREAM).summary_api_key({"ANTHROPIC_API_KEY": "k"}) is None
    config = Config.from_mapping({**UPSTREAM, "summary": {"api_key_env": "SUMMARY_KEY"}})
    assert config.summary_api_key({"SUMMARY_KEY": "sk-1"}) == "sk-1"
    assert config.summary_api_key({"SUMMARY_KEY": ""}) is None


def test_audit_section_defaults_limits_and_store_bounds() -> None:
    """audit: on, 1000 requests per session, 14 days; bounds below 1 are refused naming the
    key; store_for hands the bounds to either backend."""
    from proxy.store import RedisStateStore, SQLiteStateStore, store_for

    audit = Config.from_mapping(UPSTREAM).audit
    assert (audit.enabled, audit.max_requests_per_session, audit.retention_days) == (
        True, 1000, 14)
    for key in ("max_requests_per_session", "retention_days"):
        with pytest.raises(ConfigError) as info:
            Config.from_mapping({**UPSTREAM, "audit": {key: 0}})
        assert info.value.key == f"audit.{key}"
    with pytest.raises(ConfigError) as info:
        Config.from_mapping({**UPSTREAM, "audit": {"enabled": "yes"}})
    assert info.value.key == "audit.enabled"
    bounds = {"max_requests_per_session": 7, "retention_days": 3}
    for store in ({}, {"backend": "redis", "url": "redis://127.0.0.1:6379/0"}):
        backend = store_for(Config.from_mapping({**UPSTREAM, "store": store, "audit": bounds}))
        assert isinstance(backend, SQLiteStateStore | RedisStateStore)
        assert (backend.max_requests_per_session, backend.retention_days) == (7, 3)


def test_as_dict_round_trips_and_holds_no_secret() -> None:
    """as_dict() is plain data that loads back to the same effective config, with no secret."""
    config = Config.from_mapping(
        {
            **UPSTREAM,
            "summary": {"api_key_env": "SUMMARY_KEY"},
            "policies": {
                "roles": {"subagent": {"keep_recent_messages": 2}},
                "rules": [{"role": "subagent", "header": "x-a", "header_pattern": "y.*"}],
            },
        }
    )
    data = config.as_dict()
    text = yaml.safe_dump(data)
    again = Config.from_mapping(yaml.safe_load(text))
    assert again.as_dict() == data
    assert again.role_policies().policy_for("subagent") == config.role_policies().policy_for(
        "subagent"
    )
    assert data["summary"]["api_key_env"] == "SUMMARY_KEY"
    assert data["admin"]["token_env"] == "COMPACT_PROXY_ADMIN_TOKEN"
