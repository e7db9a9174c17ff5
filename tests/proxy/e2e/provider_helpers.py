"""Shared by the Bedrock and Vertex end-to-end tests (issue #36): the provider fixtures (each
test runs against both), the proxy's config for a provider, and raw requests in its format.

The real SDK's Bedrock and Vertex clients, sending no credential (as Claude Code with
``CLAUDE_CODE_SKIP_*_AUTH``), talk to the proxy; the proxy compacts, signs (SigV4 over the exact
bytes and path) or adds its token, and the strict fake provider verifies every request. A test
file imports the three fixtures below to use them.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.eventstream import EventStreamBuffer
from yarl import URL

from tests.conftest import LoopThread, UpstreamServer, read_log
from tests.proxy.provider_setup import provider_upstream, use_test_credentials

MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
L1_POLICY = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
             "max_tool_result_tokens": 200, "keep_recent_messages": 4}


@pytest.fixture(name="provider", params=["bedrock", "vertex"])
def provider_fixture(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(name="upstream_server")
def provider_upstream_server(servers: LoopThread, provider: str) -> Iterator[UpstreamServer]:
    """The fake provider speaking ``provider`` (overrides the conftest's first-party one)."""
    yield from provider_upstream(servers, provider)


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The proxy's own credentials (the fake's test key pair and token), nothing else."""
    use_test_credentials(monkeypatch, tmp_path, "TEST_VERTEX_TOKEN")


def _config(provider: str, compaction: dict[str, Any],
            summary: dict[str, Any] | None = None) -> dict[str, Any]:
    upstream: dict[str, Any] = {"provider": provider}
    if provider == "bedrock":
        upstream["aws_region"] = "us-east-1"
    else:
        upstream["vertex_token_env"] = "TEST_VERTEX_TOKEN"
    return {"upstream": upstream, "compaction": compaction, **(
        {"summary": summary} if summary else {})}


def _post(provider: str, base_url: str, body: dict[str, Any], *,
          stream: bool, model: str | None = None) -> tuple[int, Any, bytes]:
    """One raw request in the provider's format, no credential (Claude Code skip-auth)."""
    import asyncio

    if provider == "bedrock":
        action = "invoke-with-response-stream" if stream else "invoke"
        path = f"/model/{(model or MODEL).replace('/', '%2F')}/{action}"
        sent = {**body, "anthropic_version": "bedrock-2023-05-31"}
    else:
        action = "streamRawPredict" if stream else "rawPredict"
        path = (f"/projects/proj/locations/us-east5/publishers/anthropic/models/"
                f"{model or VERTEX_MODEL}:{action}")
        sent = {**body, "anthropic_version": "vertex-2023-10-16", **(
            {"stream": True} if stream else {})}

    async def go() -> tuple[int, Any, bytes]:
        async with aiohttp.ClientSession() as http, http.post(
                URL(base_url + path, encoded=True), json=sent,
                headers={"x-compact-session-id": "prov-1"}) as response:
            return response.status, response.headers, await response.read()

    return asyncio.run(go())


def _completed(proxy_log: Any, seen: int, count: int = 1) -> Any:
    """The next ``count`` ``request_completed`` lines after the first ``seen`` lines (the
    line is written once the answer went out: waited for)."""
    deadline = time.monotonic() + 5
    while True:
        lines = [line for line in read_log(proxy_log)[seen:]
                 if line.get("event") == "request_completed"]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines[0] if count == 1 else lines[:count]
        time.sleep(0.02)


def _events(provider: str, raw: bytes) -> list[dict[str, Any]]:
    """The Anthropic events of a streamed answer (event-stream frames, or SSE)."""
    if provider == "bedrock":
        buffer = EventStreamBuffer()
        buffer.add_data(raw)
        return [json.loads(base64.b64decode(json.loads(m.payload)["bytes"])) for m in buffer
                if m.headers[":message-type"] == "event"]
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ")]
