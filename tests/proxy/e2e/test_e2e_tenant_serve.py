"""End to end: ``serve`` and ``session.scope``: a shared address needs a scope, loopback not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import TEST_API_KEY, UpstreamServer, user_text
from tests.proxy.e2e.helpers import SECRET_ENV, send

# -- serve ------------------------------------------------------------------------------


def serve_env(**extra: str) -> dict[str, str]:
    """The environment of a ``serve`` subprocess: no config, key or secret from the shell."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("COMPACT_PROXY_CONFIG", SECRET_ENV) and not k.startswith("ANTHROPIC_")}
    env.update(extra)
    return env


def serve_config(tmp_path: Path, upstream_url: str, host: str,
                 session: Mapping[str, Any] | None = None) -> Path:
    """A ``serve`` config on ``host`` port 0 (JSON logs), state under ``tmp_path``."""
    state = tmp_path / "state"
    mapping: dict[str, Any] = {
        "listen": {"host": host, "port": 0},
        "upstream": {"base_url": upstream_url},
        "store": {"path": str(state / "state.db")},
        "sources": {"transcript_root": str(state / "t"), "artifact_root": str(state / "a")},
        "summary": {"enabled": False},
        "logging": {"format": "json", "level": "info"},
    }
    if session is not None:
        mapping["session"] = dict(session)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    return path


def run_serve(config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m proxy.cli serve``, expected to exit by itself."""
    return subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)],
                          env=serve_env(**env), capture_output=True, text=True, timeout=60,
                          cwd=config.parent)


def test_serve_on_a_shared_address_without_a_scope_exits_2_with_one_line(
    tmp_path: Path, upstream_server: UpstreamServer
) -> None:
    """``0.0.0.0`` without ``session.scope``: exit 2, one line on stderr naming the key,
    nothing served (no state directory either)."""
    result = run_serve(serve_config(tmp_path, upstream_server.base_url, "0.0.0.0"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("config error: session.scope:")
    assert "0.0.0.0" in lines[0]
    assert not (tmp_path / "state").exists()


@pytest.mark.slow
def test_serve_with_scope_credential_and_no_secret_exits_2_naming_secret_env(
    tmp_path: Path, upstream_server: UpstreamServer
) -> None:
    """``scope: credential`` with its secret variable unset (and then empty): exit 2, one line
    naming ``session.secret_env`` and the variable."""
    config = serve_config(tmp_path, upstream_server.base_url, "0.0.0.0",
                          {"scope": "credential", "secret_env": SECRET_ENV})
    for env in ({}, {SECRET_ENV: ""}):
        result = run_serve(config, **env)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("config error: session.secret_env:")
        assert SECRET_ENV in lines[0]


@pytest.mark.slow
def test_serve_on_loopback_without_a_scope_starts_with_scope_none(
    tmp_path: Path, upstream_server: UpstreamServer
) -> None:
    """``127.0.0.1`` port 0 without ``session.scope``: it starts (``proxy_started``), answers
    ``/healthz``, serves a request as tenant ``none`` and exits 0 on SIGTERM."""
    config = serve_config(tmp_path, upstream_server.base_url, "127.0.0.1")
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)],
        env=serve_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path)
    lines: list[str] = []
    started = threading.Event()
    port: list[int] = []

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "proxy_started":
                port.append(int(event["port"]))
                started.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert started.wait(30), f"serve did not start: {lines[-5:]} rc={process.poll()}"
        base_url = f"http://127.0.0.1:{port[0]}"
        with urllib.request.urlopen(f"{base_url}/healthz", timeout=5) as resp:
            assert json.loads(resp.read()) == {"status": "ok", "store": "ok"}
        raw = send(base_url, [{"role": "user", "content": user_text("hello")}])
        assert raw.http_response.status_code == 200
        request_id = raw.headers["x-compact-request-id"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        reader.join(timeout=10)
    assert process.returncode == 0, lines[-5:]
    events = [json.loads(line) for line in lines if line.startswith("{")]
    completed = [e for e in events
                 if e.get("event") == "request_completed" and e.get("request_id") == request_id]
    assert len(completed) == 1 and completed[0]["tenant"] == "none"
    assert all(TEST_API_KEY not in line for line in lines)
