"""Tests for proxy.config: validation errors, YAML problems and how the config path is found."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import Config, ConfigError, load_config
from tests.proxy.config.helpers import UPSTREAM, write

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
