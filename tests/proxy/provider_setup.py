"""What the Bedrock and Vertex end-to-end tests set up alike: the strict fake provider
speaking one provider's wire, and the proxy's own credentials (the fake's test key pair and
token, nothing from the machine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.fake_upstream import FakeUpstream, start_fake_upstream
from proxy.fake_upstream.credentials import (
    TEST_AWS_ACCESS_KEY,
    TEST_AWS_SECRET_KEY,
    TEST_VERTEX_TOKEN,
)
from tests.conftest import LoopThread, UpstreamServer


def provider_upstream(servers: LoopThread, provider: str) -> Iterator[UpstreamServer]:
    """The fake provider speaking ``provider``, for a fixture to ``yield from``."""
    upstream = FakeUpstream(provider=provider)
    runner, url = servers.run(start_fake_upstream(upstream))
    try:
        yield UpstreamServer(upstream, url, int(url.rsplit(":", 1)[1]))
    finally:
        servers.run(runner.cleanup())


def use_test_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                         token_env: str) -> None:
    """The proxy's credentials: the test AWS key pair (no profile, file or instance role)
    and the test Vertex token in ``token_env``."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_AWS_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_AWS_SECRET_KEY)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv(token_env, TEST_VERTEX_TOKEN)
