"""Secrets in the configuration never reach the screen or the logs: ``check-config`` (run as
the real command) masks the password of every URL (``store.url``'s Redis password, a proxy's
credentials in ``upstream.base_url``, an object store's in ``sources.s3.endpoint_url``) and
any key-like query parameter, keeping what the operator needs to check (scheme, host, port,
user, database); a config error about such a URL does not echo the password; and a proxy's
log lines blank those passwords wherever they would appear."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import structlog

from proxy.config import Config, load_config
from proxy.telemetry.logs import configure_logging, reset_logging
from proxy.telemetry.masking import config_secrets, mask_config, mask_url
from tests.proxy.cli.helpers import run, shown_values

SECRETS = ("r3dis-pa55word", "pr0xy-pa55word", "k3y-in-query", "m1n10-pa55word")


def secret_config(tmp_path: Path) -> Path:
    """A config holding every kind of secret a URL may carry."""
    path = tmp_path / "secrets.yaml"
    path.write_text(
        "upstream:\n"
        "  base_url: 'https://proxyuser:pr0xy-pa55word@gateway.example.com/v1"
        "?api_key=k3y-in-query&region=eu'\n"
        "store:\n"
        "  backend: redis\n"
        "  url: 'redis://cache-user:r3dis-pa55word@redis.internal:6380/2'\n"
        "sources:\n"
        "  transcript_root: 's3://bucket/transcripts'\n"
        "  artifact_root: 's3://bucket/artifacts'\n"
        "  s3: {endpoint_url: 'http://minio:m1n10-pa55word@minio.internal:9000'}\n",
        encoding="utf-8")
    return path


def test_check_config_masks_every_password_and_key_in_urls(tmp_path: Path) -> None:
    """The real command prints no secret — on its OK line, with ``--show``, nor when the
    store it probes cannot be reached — and the masked values still name the scheme, user,
    host, port, path and the query parameters that are not secrets."""
    # The Redis of this config cannot be reached: check-config says so (exit 2), masked.
    down = run(["check-config", "--config", str(secret_config(tmp_path))], tmp_path)
    assert down.returncode == 2, down.stderr
    assert "redis://cache-user:***@redis.internal:6380/2" in down.stderr
    # A store that opens (the same URLs, the Redis one unused): the OK line, and --show.
    sqlite = tmp_path / "sqlite.yaml"
    sqlite.write_text(secret_config(tmp_path).read_text(encoding="utf-8").replace(
        "  backend: redis\n", f"  backend: sqlite\n  path: '{tmp_path / 'state.db'}'\n"),
        encoding="utf-8")
    result = run(["check-config", "--config", str(sqlite), "--show"], tmp_path)
    assert result.returncode == 0, result.stderr
    ok = run(["check-config", "--config", str(sqlite)], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK: listen http://127.0.0.1:8787, upstream https://proxyuser:***@"
                                "gateway.example.com/v1?api_key=***&region=eu, store sqlite ")
    for secret in SECRETS:
        assert secret not in (result.stdout + result.stderr + ok.stdout + ok.stderr
                              + down.stdout + down.stderr)
    printed = shown_values(result.stdout)
    assert printed["store"]["url"] == "redis://cache-user:***@redis.internal:6380/2"
    assert printed["upstream"]["base_url"] == (
        "https://proxyuser:***@gateway.example.com/v1?api_key=***&region=eu")
    assert printed["sources"]["s3"]["endpoint_url"] == "http://minio:***@minio.internal:9000"
    assert printed["store"]["backend"] == "sqlite"  # everything else as configured


@pytest.mark.parametrize("url", [
    "rediss//:r3dis-pa55word@redis.internal:6379/0",  # the scheme mistyped
    "http://:r3dis-pa55word@redis.internal:6379/0",  # another scheme
    "redis://:r3dis-pa55word@[redis.internal:6379/0",  # not a URL at all
])
def test_a_config_error_about_a_url_does_not_echo_its_password(tmp_path: Path,
                                                                 url: str) -> None:
    """A bad store.url holding a password: exit 2, one line naming the key, no password."""
    path = tmp_path / "bad.yaml"
    path.write_text("upstream: {base_url: 'https://api.anthropic.com'}\n"
                    f"store: {{backend: redis, url: '{url}'}}\n", encoding="utf-8")
    result = run(["check-config", "--config", str(path)], tmp_path)
    assert result.returncode == 2
    assert "store.url" in result.stderr
    assert "r3dis-pa55word" not in result.stderr + result.stdout


@pytest.mark.parametrize(("url", "masked"), [
    ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
    ("redis://user:pw@h1:26379,h2:26379/0", "redis://user:***@h1:26379,h2:26379/0"),
    ("redis://user@h:6379/0", "redis://user@h:6379/0"),  # no password: nothing to hide
    ("https://h/p?access_token=t&X-Amz-Signature=s&page=2",
     "https://h/p?access_token=***&X-Amz-Signature=***&page=2"),
    ("https://u:p%40ss@h/", "https://u:***@h/"),
    ("https://u:pa/ss@h/x", "https://u:***@h/x"),  # a raw / in the password
    ("rediss//:pw@h:6379", "rediss//:***@h:6379"),  # a mistyped scheme
    ("ops@example.com", "ops@example.com"),
    ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ("./compact-proxy-state/state.db", "./compact-proxy-state/state.db"),
])
def test_mask_url(url: str, masked: str) -> None:
    """Passwords and key-like query values masked; everything else kept as written."""
    assert mask_url(url) == masked


def test_mask_config_masks_secret_named_keys_but_not_env_names_or_counters() -> None:
    """A string under a secret-like key is masked; the names of environment variables
    (``*_env``) and a key that merely contains a word (``token_counter``) are not."""
    data = {"a": {"password": "x", "api_key": "y", "token": "z", "token_env": "ADMIN_TOKEN",
                  "token_counter": "tiktoken", "port": 1, "urls": ["redis://:p@h"]}}
    assert mask_config(data) == {"a": {
        "password": "***", "api_key": "***", "token": "***", "token_env": "ADMIN_TOKEN",
        "token_counter": "tiktoken", "port": 1, "urls": ["redis://:***@h"]}}


def test_log_lines_blank_the_passwords_of_the_configured_urls(tmp_path: Path) -> None:
    """Logging set up as the proxy sets it up (``config_secrets``): a line whose field holds
    the store URL, or the bare password (as a driver's message might), shows neither."""
    config: Config = load_config(secret_config(tmp_path))
    stream = io.StringIO()
    configure_logging(config.logging, stream=stream, secrets=config_secrets(config))
    try:
        structlog.get_logger().error("admin_store_failed", detail=f"cannot reach "
                                     f"{config.store.url}", error="r3dis-pa55word rejected")
        structlog.get_logger().info("proxy_started", upstream_host=config.upstream.base_url)
    finally:
        reset_logging()
    text = stream.getvalue()
    assert [json.loads(line)["event"] for line in text.splitlines()] == [
        "admin_store_failed", "proxy_started"]
    for secret in SECRETS[:3]:
        assert secret not in text


def test_a_log_line_holding_any_url_with_a_password_is_blanked(tmp_path: Path) -> None:
    """Even a URL the configuration does not name (a driver's message quoting a replica's
    address): its value is blanked; a URL without a password is kept."""
    config: Config = load_config(secret_config(tmp_path))
    stream = io.StringIO()
    configure_logging(config.logging, stream=stream)
    try:
        structlog.get_logger().error("admin_store_failed",
                                     detail="failover to redis://:an0ther-pa55@10.0.0.7:6379")
        structlog.get_logger().error("admin_store_failed", detail="redis://10.0.0.7:6379/0")
    finally:
        reset_logging()
    details = [json.loads(line)["detail"] for line in stream.getvalue().splitlines()]
    assert details == ["[redacted]", "redis://10.0.0.7:6379/0"]
