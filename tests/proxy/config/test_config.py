"""Tests for proxy.config: YAML parsing, defaults, validation errors, derived policies."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import (
    DEFAULT_READ_TOOLS,
    CompactionPolicy,
    ReadToolSpec,
    RoleRule,
    SourceAccessPolicy,
)
from policies._compaction import THRESHOLD_NAMES, Thresholds
from proxy.config import (
    DEFAULT_PRICES,
    CompactionConfig,
    Config,
    ConfigError,
    ListenConfig,
    ModelPrice,
    RoleOverride,
    StoreConfig,
    UpstreamConfig,
    load_config,
)

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "config.example.yaml"
UPSTREAM = {"upstream": {"base_url": "https://api.anthropic.com"}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


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


# ------------------------------------------------------------------------------ errors


ERRORS: list[tuple[str, str, str]] = [
    # unknown keys, at every level, with a suggestion
    ("compacton: {}", "compacton", "unknown key (did you mean 'compaction'?)"),
    ("compaction: {soft_treshold_tokens: 1}", "compaction.soft_treshold_tokens",
     "did you mean 'soft_threshold_tokens'?"),
    ("listen: {zzz: 1}", "listen.zzz",
     "unknown key (known keys: host, port, workers, drain_timeout_s, event_loop, "
     "header_timeout_s, body_timeout_s, max_connections)"),
    ("compaction: {1: 2}", "compaction.1", "unknown key"),
    ("policies: {rols: {}}", "policies.rols", "did you mean 'roles'?"),
    ("policies: {roles: {main: {keep_recent: 3}}}", "policies.roles.main.keep_recent",
     "did you mean 'keep_recent_messages'?"),
    ("policies: {roles: {subagents: {}}}", "policies.roles.subagents",
     "unknown role (did you mean 'subagent'?)"),
    ("policies: {rules: [{role: main, hedaer: x}]}", "policies.rules[0].hedaer",
     "did you mean 'header'?"),
    ("policies: {read_tools: [{name: R, path_field: p, ranges: [a]}]}",
     "policies.read_tools[0].ranges", "did you mean 'range_fields'?"),
    ("policies: {source_access: {allow_cross: true}}", "policies.source_access.allow_cross",
     "did you mean 'allow_cross_session'?"),
    # wrong types: bool is not an int, a string is not a number
    ("listen: {port: true}", "listen.port", "must be an integer, got true (a boolean)"),
    ("compaction: {hard_limit_tokens: '120000'}", "compaction.hard_limit_tokens",
     "must be an integer, got '120000' (a string)"),
    ("compaction: {keep_recent_messages: 2.5}", "compaction.keep_recent_messages",
     "must be an integer, got 2.5"),
    ("upstream: {connect_timeout_s: true}", "upstream.connect_timeout_s",
     "must be a number of seconds, got true"),
    ("summary: {enabled: 'yes please'}", "summary.enabled", "must be true or false"),
    ("summary: {model: ''}", "summary.model", "must not be empty"),
    ("listen: {host: [a]}", "listen.host", "must be a string, got a list"),
    ("listen: 8787", "listen", "must be a mapping, got 8787"),
    ("policies: []", "policies", "must be a mapping, got a list"),
    ("policies: {roles: {main: 3}}", "policies.roles.main", "must be a mapping"),
    # out of range
    ("listen: {port: 70000}", "listen.port", "must be between 0 and 65535, got 70000"),
    ("listen: {port: -1}", "listen.port", "must be between 0 and 65535, got -1"),
    ("limits: {max_body_bytes: 0}", "limits.max_body_bytes", "must be at least 1, got 0"),
    ("upstream: {read_timeout_s: 0}", "upstream.read_timeout_s", "must be a positive number"),
    ("upstream: {connect_timeout_s: -5}", "upstream.connect_timeout_s", "positive number"),
    ("upstream: {read_timeout_s: .inf}", "upstream.read_timeout_s", "positive number"),
    ("compaction: {max_tool_result_tokens: 0}", "compaction.max_tool_result_tokens",
     "must be at least 1"),
    ("compaction: {summary_keep_recent: -1}", "compaction.summary_keep_recent",
     "must be at least 0, got -1"),
    ("summary: {max_tokens: 0}", "summary.max_tokens", "must be at least 1"),
    ("summary: {timeout_s: 0}", "summary.timeout_s", "positive number"),
    ("summary: {max_retries: -1}", "summary.max_retries", "must be at least 0"),
    ("summary: {mode: forked}", "summary.mode", "must be one of fork, separate"),
    ("summary: {context_window_tokens: 2000}", "summary.context_window_tokens",
     "must leave room for max_tokens (2048)"),
    ("policies: {roles: {subagent: {max_tool_result_tokens: 0}}}",
     "policies.roles.subagent.max_tool_result_tokens", "must be at least 1"),
    # soft below hard, also for role overrides
    ("compaction: {soft_threshold_tokens: 90000, hard_limit_tokens: 80000}",
     "compaction.soft_threshold_tokens",
     "must be below compaction.hard_limit_tokens (90000 >= 80000)"),
    ("compaction: {soft_threshold_tokens: 5000, hard_limit_tokens: 5000}",
     "compaction.soft_threshold_tokens", "(5000 >= 5000)"),
    ("policies: {roles: {subagent: {soft_threshold_tokens: 130000}}}",
     "policies.roles.subagent.soft_threshold_tokens",
     "must be below compaction.hard_limit_tokens (130000 >= 120000)"),
    ("policies: {roles: {main: {hard_limit_tokens: 50000}}}",
     "policies.roles.main.hard_limit_tokens",
     "must be above compaction.soft_threshold_tokens (50000 <= 80000)"),
    ("policies: {roles: {summary_recovery: {soft_threshold_tokens: 9, hard_limit_tokens: 9}}}",
     "policies.roles.summary_recovery.soft_threshold_tokens",
     "must be below policies.roles.summary_recovery.hard_limit_tokens (9 >= 9)"),
    # URLs and enums
    ("upstream: {base_url: 'ftp://example.com'}", "upstream.base_url",
     "must be a http:// or https:// URL"),
    ("upstream: {base_url: api.anthropic.com}", "upstream.base_url", "URL"),
    ("compaction: {token_counter: words}", "compaction.token_counter",
     "must be one of tiktoken, chars4, got 'words'"),
    ("listen: {event_loop: trio}", "listen.event_loop",
     "must be one of uvloop, asyncio, got 'trio'"),
    ("store: {backend: postgres}", "store.backend", "must be one of sqlite, redis"),
    ("logging: {format: xml}", "logging.format", "must be one of json, console"),
    ("logging: {level: verbose}", "logging.level", "must be one of debug, info, warning, error"),
    ("store: {backend: redis}", "store.url", "required when store.backend is redis"),
    ("store: {backend: redis, url: 'http://x'}", "store.url", "redis://"),
    ("session: {header: 'bad header'}", "session.header", "must be an HTTP header name"),
    ("admin: {token_env: 1BAD}", "admin.token_env", "must be an environment variable name"),
    ("summary: {api_key_env: 'MY-KEY'}", "summary.api_key_env", "environment variable name"),
    # policies: roles, rules, read tools, source access
    ("policies: {roles: {main: {token_counter: chars4}}}", "policies.roles.main.token_counter",
     "is global"),
    ("summary: {enabled: false}\npolicies: {roles: {main: {summary_enabled: true}}}",
     "policies.roles.main.summary_enabled", "cannot be true while summary.enabled is false"),
    ("policies: {rules: {role: main}}", "policies.rules", "must be a list of rules, got a mapping"),
    ("policies: {rules: [{header: x-a}]}", "policies.rules[0].role", "required"),
    ("policies: {rules: [{role: boss, header: x-a}]}", "policies.rules[0].role",
     "must be one of main, subagent, summary_recovery"),
    ("policies: {rules: [{role: main, header: x-a}, {role: main}]}", "policies.rules[1]",
     "at least one condition"),
    ("policies: {rules: [{role: subagent, model_pattern: '[a-'}]}",
     "policies.rules[0].model_pattern", "is not a valid regular expression"),
    ("policies: {rules: [{role: subagent, header: x-a, header_pattern: '(x'}]}",
     "policies.rules[0].header_pattern", "is not a valid regular expression"),
    ("policies: {rules: [{role: subagent, header_pattern: 'x'}]}", "policies.rules[0]",
     "header_pattern needs header"),
    ("policies: {read_tools: [{name: Read}]}", "policies.read_tools[0].path_field", "required"),
    ("policies: {read_tools: [{name: Read, path_field: p, range_fields: offset}]}",
     "policies.read_tools[0].range_fields", "must be a list"),
    ("policies: {read_tools: [{name: Read, path_field: p, range_fields: [1]}]}",
     "policies.read_tools[0].range_fields", "item 0 must be a string"),
    ("policies: {read_tools: [Read]}", "policies.read_tools[0]", "must be a mapping"),
    ("policies: {source_access: {allow_cross_session: 1}}",
     "policies.source_access.allow_cross_session", "must be true or false"),
    ("policies: {source_access: {shared_sessions: ['a/b']}}",
     "policies.source_access.shared_sessions", "not a valid session id"),
    ("policies: {source_access: {shared_sessions: team}}",
     "policies.source_access.shared_sessions", "must be a list"),
    # the document as a whole
    ("- a\n- b", "", "the top level must be a mapping of sections, got a list"),
    ("just a string", "", "the top level must be a mapping"),
]


@pytest.mark.parametrize(("snippet", "key", "fragment"), ERRORS)
def test_invalid_config_names_key_and_problem(
    tmp_path: Path, snippet: str, key: str, fragment: str
) -> None:
    """Each invalid value raises one ConfigError naming the dotted key and the problem."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, snippet), require_upstream=False)
    error = info.value
    assert error.key == key
    assert fragment in error.problem
    assert "\n" not in str(error)
    prefix = f"config error: {key}: " if key else "config error: "
    assert str(error) == prefix + error.problem


def test_error_string_is_the_documented_one_line() -> None:
    """str(ConfigError) reads `config error: <key>: <problem>` exactly."""
    with pytest.raises(ConfigError) as info:
        Config.from_mapping(
            {**UPSTREAM, "compaction": {"soft_threshold_tokens": 90000, "hard_limit_tokens": 80000}}
        )
    assert str(info.value) == (
        "config error: compaction.soft_threshold_tokens: must be below "
        "compaction.hard_limit_tokens (90000 >= 80000)"
    )
    assert isinstance(info.value, Exception)


def test_missing_base_url_is_an_error_when_upstream_is_required(tmp_path: Path) -> None:
    """Without upstream.base_url, load_config fails by default (serve, check-config)."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "listen: {port: 9000}\n"))
    assert info.value.key == "upstream.base_url"
    assert "required" in info.value.problem


def test_missing_base_url_is_allowed_for_the_demo(tmp_path: Path) -> None:
    """require_upstream=False accepts a config without upstream.base_url."""
    config = load_config(write(tmp_path, "listen: {port: 9000}\n"), require_upstream=False)
    assert config.upstream.base_url is None
    assert config.listen.port == 9000


def test_yaml_syntax_error_reports_the_line(tmp_path: Path) -> None:
    """A YAML syntax error names the file and the line, on one line."""
    path = write(tmp_path, "listen:\n  host: 127.0.0.1\n  port: [8787\nupstream: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == ""
    assert info.value.line is not None and info.value.line >= 3
    assert f"{path} line {info.value.line}: invalid YAML" in str(info.value)
    assert "\n" not in str(info.value)


def test_duplicate_keys_are_refused_with_their_line(tmp_path: Path) -> None:
    """A key given twice in one mapping is an error rather than a silent override."""
    path = write(tmp_path, "listen:\n  port: 1\n  port: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, require_upstream=False)
    assert "duplicate key 'port'" in info.value.problem
    assert info.value.line == 3


def test_yaml_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    """A YAML merge (<<) overridden by an explicit key is not reported as a duplicate."""
    text = "listen:\n  <<: {port: 1, host: 0.0.0.0}\n  port: 2\nsession: {scope: none}\n"
    config = load_config(write(tmp_path, text), require_upstream=False)
    assert (config.listen.host, config.listen.port) == ("0.0.0.0", 2)


@pytest.mark.parametrize("kind", ["missing", "directory", "not-utf8"])
def test_unreadable_file_is_a_config_error(tmp_path: Path, kind: str) -> None:
    """A missing file, a directory or a non-UTF-8 file is a one-line ConfigError naming it."""
    path = tmp_path / "config.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-utf8":
        path.write_bytes(b"listen: {host: \xff\xfe}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in info.value.problem
    assert info.value.problem.startswith("cannot read")


# ------------------------------------------------------------------------------ config path


def test_env_var_names_the_config_when_no_path_is_given(tmp_path: Path) -> None:
    """With path None, COMPACT_PROXY_CONFIG names the file."""
    path = write(tmp_path, "upstream: {base_url: 'http://127.0.0.1:9'}\nlisten: {port: 1234}\n")
    config = load_config(None, environ={"COMPACT_PROXY_CONFIG": str(path)})
    assert config.listen.port == 1234


def test_explicit_path_wins_over_env_var(tmp_path: Path) -> None:
    """An explicit path is used even when COMPACT_PROXY_CONFIG is set."""
    path = write(tmp_path, "upstream: {base_url: 'http://127.0.0.1:9'}\nlisten: {port: 1234}\n")
    config = load_config(path, environ={"COMPACT_PROXY_CONFIG": str(tmp_path / "nope.yaml")})
    assert config.listen.port == 1234


@pytest.mark.parametrize("environ", [{}, {"COMPACT_PROXY_CONFIG": ""}])
def test_no_path_and_no_env_var_is_an_error(environ: dict[str, str]) -> None:
    """Without a path and without COMPACT_PROXY_CONFIG, load_config says how to give one."""
    with pytest.raises(ConfigError) as info:
        load_config(None, environ=environ)
    assert "--config" in info.value.problem and "COMPACT_PROXY_CONFIG" in info.value.problem


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


# ------------------------------------------------------------------------------ the example


def test_example_config_loads_with_the_default_values() -> None:
    """config.example.yaml is valid and equals the defaults plus the Anthropic base URL."""
    config = load_config(EXAMPLE)
    assert config == Config.from_mapping(UPSTREAM)
    assert config.upstream == UpstreamConfig(base_url="https://api.anthropic.com")


def test_example_config_documents_every_key() -> None:
    """Every field of every section appears in the example, right after a comment."""
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    for section, values in Config().as_dict().items():
        if section == "policies":
            continue
        assert set(data[section]) == set(values), section
    for index, line in enumerate(lines):
        if re.match(r"^  [a-z_]+:", line):
            previous = lines[index - 1].strip()
            assert previous.startswith("#"), f"key without a comment: {line.strip()}"


def test_example_policies_block_is_valid() -> None:
    """The commented `policies:` example, uncommented, is a valid policies section."""
    text = EXAMPLE.read_text(encoding="utf-8")
    block = text[text.index("# policies:\n") :]
    uncommented = "\n".join(line[2:] for line in block.splitlines())
    data: dict[str, Any] = yaml.safe_load(uncommented)
    config = Config.from_mapping({**UPSTREAM, **data})
    roles = config.role_policies()
    assert roles.policy_for("subagent").soft_threshold_tokens == 40_000
    assert len(roles.rules) == 3
    assert roles.select({"x-compact-role": "summary-recovery"}, None)[0] == "summary_recovery"
    assert [tool.name for tool in config.policies.read_tools] == [
        "Read",
        "str_replace_based_edit_tool",
    ]
    assert config.source_access().shared_sessions == ("team-notes",)


# ------------------------------------------------------------------------------ prices

OPUS_4_5 = ModelPrice(input=5, cache_write=6.25, cache_read=0.5, output=25)


def test_default_prices_are_the_built_in_table() -> None:
    """Without a prices section every built-in family has its list price."""
    config = Config.from_mapping(UPSTREAM)
    assert dict(config.prices) == dict(DEFAULT_PRICES)
    assert set(config.prices) == {
        "claude-opus-5-5", "claude-opus-5", "claude-opus-4-8", "claude-opus-4-7",
        "claude-opus-4-6", "claude-opus-4-5", "claude-opus-4-1", "claude-opus-4",
        "claude-sonnet-4-6", "claude-sonnet-4-5", "claude-sonnet-4", "claude-3-7-sonnet",
        "claude-haiku-4-5", "claude-3-5-haiku",
    }
    assert config.prices["claude-opus-4-5"] == OPUS_4_5
    assert config.prices["claude-opus-4"] == ModelPrice(input=15, cache_write=18.75,
                                                        cache_read=1.5, output=75)
    assert config.prices["claude-sonnet-4-5"] == ModelPrice(input=3, cache_write=3.75,
                                                            cache_read=0.3, output=15)
    assert config.prices["claude-3-5-haiku"] == ModelPrice(input=0.8, cache_write=1.0,
                                                           cache_read=0.08, output=4)
    for price in config.prices.values():  # 5-minute cache writes cost 1.25 x input
        assert price.cache_write == pytest.approx(price.input * 1.25)
    assert Config.from_mapping({**UPSTREAM, "prices": None}).prices == config.prices


def test_price_is_the_longest_family_that_prefixes_the_model() -> None:
    """claude-opus-4-5-… is Opus 4.5, claude-opus-4-2025… Opus 4; no family: no price."""
    config = Config.from_mapping(UPSTREAM)
    assert config.price_for("claude-opus-4-5-20251101") == OPUS_4_5
    assert config.price_for("claude-opus-4-5") == OPUS_4_5
    assert config.price_for("claude-opus-4-1-20250805") == config.prices["claude-opus-4-1"]
    assert config.price_for("claude-opus-4-20250514") == config.prices["claude-opus-4"]
    assert config.price_for("claude-sonnet-4-5-20250929") == config.prices["claude-sonnet-4-5"]
    assert config.price_for("claude-haiku-4-5") == config.prices["claude-haiku-4-5"]
    # Claude Code's default model (2.1: claude-opus-4-8) and its neighbours are priced.
    for model in ("claude-opus-4-8", "claude-opus-4-7", "claude-opus-4-6", "claude-opus-5"):
        assert config.price_for(model) == OPUS_4_5
    assert config.price_for("claude-sonnet-4-6") == config.prices["claude-sonnet-4-5"]
    assert config.price_for("claude-opus-5-5") == ModelPrice(input=4, cache_write=5,
                                                             cache_read=0.2, output=20)
    for unknown in ("gpt-5", "claude-opus", "claude-2.1", ""):
        assert config.price_for(unknown) is None


def test_user_prices_replace_their_family_and_add_new_ones(tmp_path: Path) -> None:
    """A listed family replaces the built-in entry, a new one is added, the rest are kept."""
    config = load_config(write(tmp_path, """\
        upstream: {base_url: 'https://api.anthropic.com'}
        prices:
          claude-opus-4-5: {input: 4, cache_write: 5, cache_read: 0.4, output: 20}
          claude-opus-4-5-fast: {input: 0, cache_write: 0, cache_read: 0, output: 1}
          my-model: {input: 1.5, cache_write: 2, cache_read: 0.1, output: 6}
        """))
    assert config.prices["claude-opus-4-5"] == ModelPrice(input=4, cache_write=5,
                                                          cache_read=0.4, output=20)
    assert config.prices["claude-sonnet-4"] == DEFAULT_PRICES["claude-sonnet-4"]
    assert len(config.prices) == len(DEFAULT_PRICES) + 2
    assert config.price_for("my-model-v2") == ModelPrice(input=1.5, cache_write=2,
                                                         cache_read=0.1, output=6)
    assert config.price_for("claude-opus-4-5-fast-20260101") == ModelPrice(
        input=0, cache_write=0, cache_read=0, output=1)
    assert config.price_for("claude-opus-4-5-20251101").input == 4  # type: ignore[union-attr]
    # A model that only begins with a family is another model: unpriced, never mispriced.
    assert config.price_for("claude-opus-4-5-fast-1") is None
    assert config.price_for("claude-opus-4-9") is None
    assert config.price_for("claude-opus-4-20250514") == DEFAULT_PRICES["claude-opus-4"]
    with pytest.raises(TypeError):
        config.prices["x"] = OPUS_4_5  # type: ignore[index]
    data = config.as_dict()
    assert data["prices"]["my-model"] == {"input": 1.5, "cache_write": 2.0, "cache_read": 0.1,
                                          "output": 6.0}
    assert Config.from_mapping(yaml.safe_load(yaml.safe_dump(data))).prices == config.prices


@pytest.mark.parametrize(
    ("snippet", "key", "fragment"),
    [
        ("prices: {claude-opus-4-5: {input: -1, cache_write: 1, cache_read: 1, output: 1}}",
         "prices.claude-opus-4-5.input", "must be >= 0 (USD per million tokens), got -1"),
        ("prices: {m: {input: 1, cache_write: 1, cache_read: 1, output: -0.5}}",
         "prices.m.output", "must be >= 0"),
        ("prices: {m: {input: '3', cache_write: 1, cache_read: 1, output: 1}}",
         "prices.m.input", "must be a number (USD per million tokens), got '3' (a string)"),
        ("prices: {m: {input: true, cache_write: 1, cache_read: 1, output: 1}}",
         "prices.m.input", "must be a number"),
        ("prices: {m: {input: .nan, cache_write: 1, cache_read: 1, output: 1}}",
         "prices.m.input", "must be a finite number"),
        ("prices: {m: {input: 1, cache_read: 1, output: 1}}", "prices.m.cache_write",
         "required"),
        ("prices: {m: {input: 1, cache_write: 1, cache_read: 1, output: 1, cache_wrte: 1}}",
         "prices.m.cache_wrte", "unknown key (did you mean 'cache_write'?)"),
        ("prices: {m: 3}", "prices.m", "must be a mapping"),
        ("prices: [a]", "prices", "must be a mapping, got a list"),
        ("prices: {1: {input: 1, cache_write: 1, cache_read: 1, output: 1}}", "prices",
         "keys must be non-empty strings, got 1"),
    ],
)
def test_bad_prices_are_one_line_errors_naming_the_key(
    tmp_path: Path, snippet: str, key: str, fragment: str
) -> None:
    """A bad price is one ConfigError naming prices.<family>.<kind>."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, snippet), require_upstream=False)
    assert (info.value.key, "\n" in str(info.value)) == (key, False)
    assert fragment in info.value.problem
    assert str(info.value).startswith(f"config error: {key}: ")


def test_example_config_lists_the_built_in_prices() -> None:
    """config.example.yaml's prices section is exactly the built-in table."""
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert Config.from_mapping({**UPSTREAM, "prices": data["prices"]}).prices == DEFAULT_PRICES
    assert set(data["prices"]) == set(DEFAULT_PRICES)
