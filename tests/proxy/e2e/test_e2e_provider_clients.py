"""End to end: the SDK's Bedrock and Vertex clients and credentials, re-signed or forwarded."""

from __future__ import annotations

import base64
import json
from typing import Any

import aiohttp
import anthropic
import pytest
from yarl import URL

from proxy.fake_upstream.credentials import (
    TEST_AWS_ACCESS_KEY,
    TEST_BEDROCK_API_KEY,
    TEST_VERTEX_TOKEN,
)
from tests.conftest import ProxyFactory, UpstreamServer, read_log
from tests.proxy.e2e.helpers import read_turns
from tests.proxy.e2e.provider_helpers import (  # noqa: F401  (the fixtures)
    L1_POLICY,
    MODEL,
    VERTEX_MODEL,
    _completed,
    _config,
    _credentials,
    _post,
    provider_fixture,
    provider_upstream_server,
)

ON_BEDROCK: dict[str, Any] = {"extra_body": {"anthropic_version": "bedrock-2023-05-31"}}
ON_VERTEX: dict[str, Any] = {"extra_body": {"anthropic_version": "vertex-2023-10-16"}}


def test_the_sdks_bedrock_client_signed_for_the_proxy_is_re_signed(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str,
        proxy_log: Any) -> None:
    """``AnthropicBedrock`` signs with a key the provider does not know, for the proxy's host:
    the proxy drops that signature and signs with its own; the event stream reaches the SDK
    intact and its usage is read by the proxy (the log line's estimate error)."""
    if provider != "bedrock":
        pytest.skip("Bedrock's client")
    proxy = proxy_factory(_config(provider, L1_POLICY))
    seen = len(read_log(proxy_log))
    client = anthropic.AnthropicBedrock(
        base_url=proxy.base_url, aws_access_key="AKIACLIENTONLY000001",
        aws_secret_key="client-secret", aws_region="us-east-1", max_retries=0)
    try:
        message = client.messages.create(model=MODEL, max_tokens=50, messages=read_turns(4),
                                         **ON_BEDROCK)
        with client.messages.stream(model=MODEL, max_tokens=50, messages=read_turns(4),
                                    **ON_BEDROCK) as stream:
            final = stream.get_final_message()
    finally:
        client.close()
    assert message.usage.input_tokens > 0 and final.usage.input_tokens > 0
    assert all(r.headers["authorization"].startswith(
        f"AWS4-HMAC-SHA256 Credential={TEST_AWS_ACCESS_KEY}/")
        for r in upstream_server.upstream.requests)
    answered = _completed(proxy_log, seen, count=2)
    assert [line["status"] for line in answered] == [200, 200]
    assert all(line.get("estimate_error") is not None for line in answered), answered


def test_a_clients_bedrock_api_key_is_forwarded(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    if provider != "bedrock":
        pytest.skip("Bedrock API keys")
    proxy = proxy_factory(_config(provider, L1_POLICY))
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key="unused", max_retries=0)
    try:
        raw = client.post(f"/model/{MODEL}/invoke", cast_to=anthropic.types.Message, body={
            "anthropic_version": "bedrock-2023-05-31", "max_tokens": 20,
            "messages": [{"role": "user", "content": "hi"}]},
            options={"headers": {"Authorization": f"Bearer {TEST_BEDROCK_API_KEY}",
                                 "X-Api-Key": anthropic.omit}})
    finally:
        client.close()
    assert raw.content
    (sent,) = upstream_server.upstream.requests
    assert sent.headers["authorization"] == f"Bearer {TEST_BEDROCK_API_KEY}"
    assert "x-amz-date" not in sent.headers


def test_the_sdks_vertex_client_with_its_own_token(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """``AnthropicVertex`` with its own access token: forwarded as it is; SSE relayed."""
    if provider != "vertex":
        pytest.skip("Vertex's client")
    proxy = proxy_factory(_config(provider, L1_POLICY))
    client = anthropic.AnthropicVertex(
        base_url=proxy.base_url, region="us-east5", project_id="proj",
        access_token=TEST_VERTEX_TOKEN, max_retries=0)
    try:
        with client.messages.stream(model=VERTEX_MODEL, max_tokens=50, messages=read_turns(6),
                                    **ON_VERTEX) as stream:
            final = stream.get_final_message()
    finally:
        client.close()
    assert final.stop_reason == "end_turn"
    (sent,) = upstream_server.upstream.requests
    assert sent.headers["authorization"] == f"Bearer {TEST_VERTEX_TOKEN}"
    assert len(json.dumps(sent.body)) < len(json.dumps(read_turns(6))) / 2  # L1 applied


def test_vertex_with_application_default_credentials(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No token variable: google-auth's application-default credentials (a service account
    whose token endpoint is the fake's) give the proxy its token, fetched once and reused."""
    if provider != "vertex":
        pytest.skip("Google credentials")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    account = tmp_path / "service-account.json"
    account.write_text(json.dumps({
        "type": "service_account", "project_id": "proj", "private_key_id": "k1",
        "private_key": pem, "client_email": "proxy@proj.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": f"{upstream_server.base_url}/token"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(account))
    proxy = proxy_factory({"upstream": {"provider": "vertex"}, "compaction": L1_POLICY})
    for _ in range(2):
        status, _, raw = _post(provider, proxy.base_url, {"max_tokens": 20, "messages": [
            {"role": "user", "content": "hi"}]}, stream=True)
        assert status == 200, raw
    assert upstream_server.upstream.counts["token"] == 1
    sent = [r for r in upstream_server.upstream.requests if r.path.endswith("Predict")]
    assert [r.headers["authorization"] for r in sent] == [f"Bearer {TEST_VERTEX_TOKEN}"] * 2


def test_scope_credential_takes_no_tenant_from_a_sigv4_signature(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SigV4 access key id is not secret (and the proxy re-signs): scope ``credential``
    refuses it in the provider's error shape; a Bedrock API key is a credential."""
    if provider != "bedrock":
        pytest.skip("SigV4")
    monkeypatch.setenv("E2E_TENANT_SECRET", "tenant-secret-for-providers")
    proxy = proxy_factory({**_config(provider, L1_POLICY), "session": {
        "scope": "credential", "secret_env": "E2E_TENANT_SECRET"}})
    client = anthropic.AnthropicBedrock(
        base_url=proxy.base_url, aws_access_key=TEST_AWS_ACCESS_KEY,
        aws_secret_key="anything", aws_region="us-east-1", max_retries=0)
    try:
        with pytest.raises(anthropic.AuthenticationError, match="SigV4") as refused:
            client.messages.create(model=MODEL, max_tokens=20, messages=read_turns(1),
                                   **ON_BEDROCK)
    finally:
        client.close()
    assert refused.value.response.headers["x-amzn-ErrorType"] == "UnrecognizedClientException"
    assert upstream_server.upstream.requests == []


def test_bedrock_count_tokens_and_inference_profiles_are_signed_and_forwarded(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    if provider != "bedrock":
        pytest.skip("Bedrock's routes")
    import asyncio

    proxy = proxy_factory(_config(provider, L1_POLICY))
    inner = base64.b64encode(json.dumps({"anthropic_version": "bedrock-2023-05-31",
                                         "max_tokens": 5, "messages": [
                                             {"role": "user", "content": "hi"}]}).encode())
    counted = {"input": {"invokeModel": {"body": inner.decode()}}}

    async def go() -> tuple[int, int]:
        async with aiohttp.ClientSession() as http:
            async with http.post(URL(f"{proxy.base_url}/model/{MODEL}/count-tokens",
                                     encoded=True), json=counted) as response:
                count = response.status
                assert (await response.json())["inputTokens"] > 0
            async with http.get(f"{proxy.base_url}/inference-profiles?maxResults=10") as listed:
                return count, listed.status

    assert asyncio.run(go()) == (200, 200)
    assert [r.headers["authorization"][:16] for r in upstream_server.upstream.requests] == [
        "AWS4-HMAC-SHA256"] * 2
