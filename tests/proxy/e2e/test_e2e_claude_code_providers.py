"""The real Claude Code CLI in Bedrock mode and in Vertex mode through the proxy (issue #36).

``CLAUDE_CODE_USE_BEDROCK=1`` with ``CLAUDE_CODE_SKIP_BEDROCK_AUTH=1`` (resp. the Vertex
variables) makes the CLI send its requests in the provider's own format to the proxy, with no
credential: the proxy compacts them (L1 and L4 inside one long turn), signs every request it
sends (SigV4 over the exact bytes and path) or gives it its access token, the summary calls
included, and the strict fake provider verifies each one. The stream reaches the CLI intact
(Bedrock's event-stream frames, which it requires as such).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.fake_upstream import is_summarizer_request
from proxy.fake_upstream.credentials import (
    TEST_AWS_ACCESS_KEY,
    TEST_VERTEX_TOKEN,
)
from proxy.fake_upstream.replies import TokenRule
from tests.conftest import LoopThread, ProxyFactory, UpstreamServer, read_log
from tests.proxy.e2e.test_e2e_claude_code import CLAUDE, STEPS, ToolLoop
from tests.proxy.provider_setup import provider_upstream, use_test_credentials

pytestmark = [pytest.mark.slow, pytest.mark.claude_code,
              pytest.mark.skipif(CLAUDE is None, reason="the Claude Code CLI is not installed "
                                 "(bash .ci/run installs it under .ci/node)")]

REGION = "us-east-1"
VERTEX_REGION = "us-east5"
PROJECT = "compact-proxy-e2e"


@pytest.fixture(params=["bedrock", "vertex"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def upstream_server(servers: LoopThread, provider: str) -> Iterator[UpstreamServer]:
    """The strict fake provider speaking ``provider``."""
    yield from provider_upstream(servers, provider)


@pytest.fixture(autouse=True)
def _proxy_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The proxy's own credentials (the fake's test key pair and token), nothing else."""
    use_test_credentials(monkeypatch, tmp_path, "E2E_VERTEX_TOKEN")


def _client_env(provider: str, proxy_url: str) -> dict[str, str]:
    if provider == "bedrock":
        return {"CLAUDE_CODE_USE_BEDROCK": "1", "ANTHROPIC_BEDROCK_BASE_URL": proxy_url,
                "CLAUDE_CODE_SKIP_BEDROCK_AUTH": "1", "AWS_REGION": REGION}
    return {"CLAUDE_CODE_USE_VERTEX": "1", "ANTHROPIC_VERTEX_BASE_URL": proxy_url,
            "CLAUDE_CODE_SKIP_VERTEX_AUTH": "1", "ANTHROPIC_VERTEX_PROJECT_ID": PROJECT,
            "CLOUD_ML_REGION": VERTEX_REGION}


def _is_message(provider: str, path: str) -> bool:
    if provider == "bedrock":
        return path.startswith("/model/") and path.endswith(("/invoke",
                                                             "/invoke-with-response-stream"))
    return path.endswith((":rawPredict", ":streamRawPredict")) and "/count-tokens:" not in path


def test_claude_code_runs_a_compacted_tool_loop_on_the_provider(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path,
        tmp_path: Path, provider: str) -> None:
    loop = ToolLoop()
    upstream = upstream_server.upstream
    upstream.script = loop
    upstream.token_rule = TokenRule(1.3, 0.1)  # the provider counts its own way
    settings: dict[str, Any] = {"provider": provider}
    if provider == "bedrock":
        settings["aws_region"] = REGION
    else:
        settings["vertex_token_env"] = "E2E_VERTEX_TOKEN"
    proxy = proxy_factory({"upstream": settings, "compaction": {
        "soft_threshold_tokens": 60_000, "hard_limit_tokens": 150_000, "calibration": True,
        "max_tool_result_tokens": 2_000, "keep_recent_messages": 12, "summary_keep_recent": 2}})
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           **_client_env(provider, proxy.base_url),
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    assert CLAUDE is not None
    done = subprocess.run(
        [CLAUDE, "-p", "Run the steps.", "--allowedTools", "Bash", "--max-turns", "40",
         "--output-format", "json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    outcome = json.loads(done.stdout)
    assert outcome.get("terminal_reason") == "completed", outcome
    assert loop.steps == STEPS

    recorded = upstream.requests
    messages = [r for r in recorded if _is_message(provider, r.path)]
    own = [r for r in messages if not is_summarizer_request(r.body)]
    calls = [r for r in messages if is_summarizer_request(r.body)]
    assert len(own) == STEPS + 1
    sessions = {r.headers.get("x-claude-code-session-id") for r in own}
    assert len(sessions) == 1 and None not in sessions
    log = [line for line in read_log(proxy_log) if line.get("session_id") in sessions]
    # Every request the provider got was verified and accepted (the fake refuses a wrong
    # signature or token with 403/401, any broken rule with 400), the summary calls too.
    assert all(line.get("status") == 200 for line in log
               if line.get("event") == "request_completed"), log
    assert not [line for line in log if line.get("event") == "summary_failed"]
    assert calls, "no L4 summary call"
    for request in messages:
        assert "model" not in request.body
        if provider == "bedrock":
            assert request.body["anthropic_version"] == "bedrock-2023-05-31"
            assert request.headers["authorization"].startswith(
                f"AWS4-HMAC-SHA256 Credential={TEST_AWS_ACCESS_KEY}/")
        else:
            assert request.body["anthropic_version"] == "vertex-2023-10-16"
            assert request.headers["authorization"] == f"Bearer {TEST_VERTEX_TOKEN}"
    lines = [line for line in log if line.get("event") == "request_completed"
             and line.get("route") == "messages"]
    assert len(lines) == STEPS + 1 and {line["status"] for line in lines} == {200}
    assert {"L1", "L4"} <= {layer for line in lines for layer in line["layers"]}
    # Calibrated from the usage inside the provider's stream.
    assert any(line.get("estimate_error") is not None for line in lines)
