"""Tests for compact-proxy check-config, --version and python -m proxy.cli, run as a process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config import load_config
from tests.proxy.cli.helpers import (
    BAD_KEY_LINE,
    EXAMPLE,
    REPO,
    bad_config,
    clean_env,
    free_port,
    run,
    shown_values,
)
from tests.redis_server import RedisServer, RedisServerUnavailable
from tests.servers import started

pytestmark = pytest.mark.slow


def test_check_config_prints_one_ok_line(tmp_path: Path) -> None:
    """check-config on config.example.yaml exits 0 with one OK line: where it listens, the
    upstream, the store and main's thresholds, and the flag that prints every value."""
    result = run(["check-config", "--config", str(EXAMPLE)], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout.splitlines() == [
        "OK: listen http://127.0.0.1:8787, upstream https://api.anthropic.com, store sqlite "
        "./compact-proxy-state/state.db, main soft 80,000 / hard 120,000 tokens "
        "(--show prints every value)"]


def test_check_config_show_prints_effective_values_then_ok(tmp_path: Path) -> None:
    """check-config --show prints the effective values as YAML, then the OK line."""
    result = run(["check-config", "--config", str(EXAMPLE), "--show"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert shown_values(result.stdout) == load_config(EXAMPLE).as_dict()
    assert result.stdout.splitlines()[-1].endswith("hard 120,000 tokens")


def test_check_config_ok_line_masks_a_redis_password(tmp_path: Path) -> None:
    """The OK line names the Redis store by its URL with the password as ***; the store is
    reached with it (a real Redis that requires it)."""
    with started(RedisServer(extra_args=("--requirepass", "hunter2-pw")),
                 RedisServerUnavailable) as server:
        path = tmp_path / "c.yaml"
        url = f"redis://:hunter2-pw@127.0.0.1:{server.port}/0"
        path.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\n"
                        f"store: {{backend: redis, url: '{url}'}}\n"
                        "compaction: {soft_threshold_tokens: 60000, hard_limit_tokens: 90000}\n")
        result = run(["check-config", "--config", str(path)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "OK: listen http://127.0.0.1:8787, upstream http://127.0.0.1:9, store redis "
        f"redis://:***@127.0.0.1:{server.port}/0, main soft 60,000 / hard 90,000 tokens "
        "(--show prints every value)"]


def test_check_config_fails_on_a_store_serve_could_not_open(tmp_path: Path) -> None:
    """A Redis URL nobody answers, a SQLite path under a read-only folder: exit 2, one line
    on stderr naming the key, no OK line."""
    port = free_port()
    redis = tmp_path / "redis.yaml"
    redis.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\n"
                     f"store: {{backend: redis, url: 'redis://:pw@127.0.0.1:{port}/0'}}\n")
    result = run(["check-config", "--config", str(redis)], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith("config error: store.url: cannot open the state store: ")
    assert f"127.0.0.1:{port}" in line and ":pw@" not in line
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    sqlite = tmp_path / "sqlite.yaml"
    sqlite.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\n"
                      f"store: {{path: '{locked}/state/state.db'}}\n")
    result = run(["check-config", "--config", str(sqlite)], tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip() == (f"config error: store.path: cannot open the state "
                                         f"store: {locked} is not writable")
    assert not (locked / "state").exists()  # check-config never creates the store


def test_check_config_prints_dataclass_values_not_raw_yaml(tmp_path: Path) -> None:
    """Defaults the file leaves out and normalized values appear in the output."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstream: {base_url: 'http://127.0.0.1:9', connect_timeout_s: 3}\n"
        "session: {header: X-Sess}\n",
        encoding="utf-8",
    )
    result = run(["check-config", "--config", str(path), "--show"], tmp_path)
    assert result.returncode == 0, result.stderr
    printed = shown_values(result.stdout)
    assert printed["upstream"]["connect_timeout_s"] == 3.0
    assert printed["session"]["header"] == "x-sess"
    assert printed["compaction"]["hard_limit_tokens"] == 120_000
    assert printed["policies"]["roles"]["summary_recovery"]["summary_enabled"] is False


def test_check_config_bad_key_exits_2_with_exactly_one_line(tmp_path: Path) -> None:
    """A misspelt key: exit 2, one stderr line naming the key, nothing on stdout."""
    result = run(["check-config", "--config", str(bad_config(tmp_path))], tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [BAD_KEY_LINE]


def test_check_config_reads_the_path_from_the_env_var(tmp_path: Path) -> None:
    """Without --config, COMPACT_PROXY_CONFIG names the file."""
    path = tmp_path / "c.yaml"
    path.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\nlisten: {port: 4321}\n")
    result = run(["check-config"], tmp_path, COMPACT_PROXY_CONFIG=str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK: listen http://127.0.0.1:4321, ")


def test_check_config_without_any_config_exits_2(tmp_path: Path) -> None:
    """Neither --config nor COMPACT_PROXY_CONFIG: one line saying how to give one, exit 2."""
    result = run(["check-config"], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "COMPACT_PROXY_CONFIG" in lines[0]


def test_check_config_shows_secrets_only_by_env_var_name(tmp_path: Path) -> None:
    """The admin token and summary key values never appear; their variable names do."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstream: {base_url: 'http://127.0.0.1:9'}\nsummary: {api_key_env: SUMMARY_KEY}\n"
    )
    result = run(
        ["check-config", "--config", str(path), "--show"],
        tmp_path,
        COMPACT_PROXY_ADMIN_TOKEN="admin-s3cret-0123456789abcdef0123456789",
        SUMMARY_KEY="sk-s3cret",
    )
    assert result.returncode == 0, result.stderr
    assert "s3cret" not in result.stdout
    assert "COMPACT_PROXY_ADMIN_TOKEN" in result.stdout and "SUMMARY_KEY" in result.stdout


SHORT_TOKEN_LINE = (
    "config error: admin.token_env: the environment variable COMPACT_PROXY_ADMIN_TOKEN holds a "
    "token of 1 characters; at least 32 are required (admin.min_token_length), e.g. "
    "`openssl rand -hex 32`"
)


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_short_admin_token_is_a_config_error(tmp_path: Path, command: str) -> None:
    """``COMPACT_PROXY_ADMIN_TOKEN=x``: one line naming the variable and the minimum, exit 2,
    nothing served; 32 characters are accepted."""
    path = tmp_path / "c.yaml"
    path.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\nlisten: {port: 0}\n"
                    f"store: {{path: '{tmp_path / 'state.db'}'}}\n")
    result = run([command, "--config", str(path)], tmp_path, timeout=30,
                 COMPACT_PROXY_ADMIN_TOKEN="x")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [SHORT_TOKEN_LINE]
    assert not (tmp_path / "state.db").exists()
    ok = run(["check-config", "--config", str(path)], tmp_path,
             COMPACT_PROXY_ADMIN_TOKEN="k" * 32)
    assert ok.returncode == 0, ok.stderr


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    """``compact-proxy --version``: the installed package's version, which is pyproject's."""
    import importlib.metadata
    import tomllib

    result = run(["--version"], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]["version"]
    assert declared == importlib.metadata.version("compact-proxy")
    assert result.stdout == f"compact-proxy {declared}\n"


def test_python_dash_m_runs_the_cli(tmp_path: Path) -> None:
    """`python -m proxy.cli` exits with main()'s code."""
    ok = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(EXAMPLE)],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60,
    )
    bad = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(bad_config(tmp_path))],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60,
    )
    assert (ok.returncode, bad.returncode) == (0, 2)
