"""End to end: Bedrock and Vertex behind the proxy (issue #36). The real SDK's Bedrock and
Vertex clients, sending no credential (as Claude Code with ``CLAUDE_CODE_SKIP_*_AUTH``), talk to
the proxy; the proxy compacts, signs (SigV4 over the exact bytes and path) or adds its token,
and the strict fake provider verifies every request."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from botocore.eventstream import EventStreamBuffer
from yarl import URL

from proxy.fake_upstream import (
    Fault,
    Reply,
    is_summarizer_request,
)
from proxy.fake_upstream.credentials import (
    TEST_AWS_ACCESS_KEY,
    TEST_BEDROCK_API_KEY,
    TEST_VERTEX_TOKEN,
)
from tests.conftest import LoopThread, ProxyFactory, UpstreamServer, read_log
from tests.proxy.e2e.test_e2e_compaction import SUMMARY_POLICY, read_turns
from tests.proxy.provider_setup import provider_upstream, use_test_credentials

MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
ARN = ("arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
       "us.anthropic.claude-sonnet-4-5-20250929-v1:0")
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
ON_BEDROCK: dict[str, Any] = {"extra_body": {"anthropic_version": "bedrock-2023-05-31"}}
ON_VERTEX: dict[str, Any] = {"extra_body": {"anthropic_version": "vertex-2023-10-16"}}
L1_POLICY = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
             "max_tool_result_tokens": 200, "keep_recent_messages": 4}


@pytest.fixture(params=["bedrock", "vertex"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def upstream_server(servers: LoopThread, provider: str) -> Iterator[UpstreamServer]:
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


def test_a_tool_loop_is_compacted_and_every_request_verified(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """L1 on the provider's own path: the body is compacted, the request authorised by the
    proxy (the fake recomputed the signature or checked the token), the stream relayed."""
    proxy = proxy_factory(_config(provider, L1_POLICY))
    messages = read_turns(6)
    status, headers, raw = _post(provider, proxy.base_url, {"max_tokens": 100,
                                                            "messages": messages}, stream=True)
    assert status == 200, raw[:300]
    assert "L1" in headers.get("x-compact-layers", "")
    events = _events(provider, raw)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    (sent,) = upstream_server.upstream.requests
    assert "model" not in sent.body
    assert len(json.dumps(sent.body)) < len(json.dumps(messages)) / 2
    if provider == "bedrock":
        assert sent.headers["authorization"].startswith(
            f"AWS4-HMAC-SHA256 Credential={TEST_AWS_ACCESS_KEY}/")
        assert sent.headers["content-type"] == "application/json"
    else:
        assert sent.headers["authorization"] == f"Bearer {TEST_VERTEX_TOKEN}"


def test_an_arn_model_id_goes_out_as_sent(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    if provider != "bedrock":
        pytest.skip("Bedrock's model ids")
    proxy = proxy_factory(_config(provider, L1_POLICY))
    status, _, raw = _post(provider, proxy.base_url, {"max_tokens": 50, "messages": [
        {"role": "user", "content": "hi"}]}, stream=False, model=ARN)
    assert status == 200, raw
    (sent,) = upstream_server.upstream.requests
    assert sent.path == f"/model/{ARN}/invoke"  # decoded once by the fake: %2F as sent


def test_l4_summary_goes_out_in_the_provider_format_and_auth(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """The client sent no credential: the fork summary call is signed (or tokened) by the
    proxy, in the provider's path and body."""
    proxy = proxy_factory(_config(provider, SUMMARY_POLICY))
    status, headers, raw = _post(provider, proxy.base_url, {
        "max_tokens": 100, "messages": read_turns(12)}, stream=True)
    assert status == 200, raw[:300]
    assert "L4" in headers.get("x-compact-layers", ""), headers.get("x-compact-layers")
    calls = [r for r in upstream_server.upstream.requests
             if isinstance(r.body, dict) and is_summarizer_request(r.body)]
    assert calls, [r.path for r in upstream_server.upstream.requests]
    for call in calls:
        assert "model" not in call.body
        if provider == "bedrock":
            assert call.path == f"/model/{MODEL}/invoke"
            assert call.body["anthropic_version"] == "bedrock-2023-05-31"
        else:
            assert call.path.endswith(f"/models/{VERTEX_MODEL}:rawPredict")


def test_the_providers_too_long_refusal_is_recovered_by_recompaction(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """The provider's window is below the proxy's thresholds; its refusal has no numbers: the
    proxy recompacts below an estimate and the client gets an answer."""
    upstream_server.upstream.context_window = 6000
    proxy = proxy_factory(_config(provider, {**L1_POLICY, "soft_threshold_tokens": 20000,
                                             "max_tool_result_tokens": 2000}))
    status, _, raw = _post(provider, proxy.base_url, {"max_tokens": 50,
                                                      "messages": read_turns(10)}, stream=True)
    assert status == 200, raw[:300]
    first, second = upstream_server.upstream.requests
    assert len(json.dumps(second.body)) < len(json.dumps(first.body))


def test_the_proxys_own_errors_have_the_providers_shape(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    proxy = proxy_factory(_config(provider, L1_POLICY))
    status, headers, raw = _post(provider, proxy.base_url, {"max_tokens": 50, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                      "content": "orphan"}]}]}, stream=False)
    assert status == 400
    body = json.loads(raw)
    if provider == "bedrock":
        assert headers["x-amzn-ErrorType"] == "ValidationException"
        assert set(body) == {"message"} and body["message"]
    else:
        assert body["type"] == "error"
    assert upstream_server.upstream.requests == []


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


def test_bedrock_exception_frames_are_relayed(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str,
        proxy_log: Any) -> None:
    """The provider's exception frame mid-stream reaches the client as sent, and the request
    is not counted as a success."""
    if provider != "bedrock":
        pytest.skip("Bedrock's event stream")
    upstream_server.upstream.push(Reply.text("partial answer here", fault=Fault(
        "error_event", after_events=3)))
    proxy = proxy_factory(_config(provider, L1_POLICY))
    seen = len(read_log(proxy_log))
    status, _, raw = _post(provider, proxy.base_url, {"max_tokens": 50, "messages": [
        {"role": "user", "content": "hi"}]}, stream=True)
    assert status == 200
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    frames = list(buffer)
    assert len(frames) == 4
    assert frames[-1].headers[":message-type"] == "exception"
    assert frames[-1].headers[":exception-type"] == "internalServerException"
    assert _completed(proxy_log, seen)["outcome"] == "upstream_error_event"


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


def test_bedrock_gets_the_binding_opt_out_beta_in_its_body(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """Compaction under thinking: on Bedrock the binding beta joins the body's
    ``anthropic_beta`` (its betas are there, not in a header); on Vertex the header."""
    from tests.proxy.e2e.test_e2e_compaction import thinking_history

    proxy = proxy_factory({**_config(provider, {**L1_POLICY, "keep_recent_messages": 6}),
                           "summary": {"enabled": False}})
    body: dict[str, Any] = {"max_tokens": 2048, "messages": thinking_history(),
                            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    if provider == "bedrock":
        body["anthropic_beta"] = ["interleaved-thinking-2025-05-14"]
    status, headers, raw = _post(provider, proxy.base_url, body, stream=False)
    assert status == 200, raw[:300]
    assert headers["x-compact-layers"]
    (sent,) = upstream_server.upstream.requests
    assert sent.body["thinking"]["block_binding"] == {"prefix_mismatch_behavior": "drop_block"}
    if provider == "bedrock":
        assert sent.body["anthropic_beta"] == ["interleaved-thinking-2025-05-14",
                                               "thinking-binding-controls-2026-08-01"]
        assert "anthropic-beta" not in sent.headers
    else:
        assert sent.headers["anthropic-beta"] == "thinking-binding-controls-2026-08-01"


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


def test_separate_summary_calls_use_the_configured_model_and_place(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str,
        proxy_log: Any) -> None:
    """``summary.mode: separate``: the call is the proxy's own, on ``summary.model`` in the
    provider's naming (and, on Vertex, ``vertex_project`` / ``vertex_region``)."""
    model = ("us.anthropic.claude-haiku-4-5-20251001-v1:0" if provider == "bedrock"
             else "claude-haiku-4-5@20251001")
    config = _config(provider, SUMMARY_POLICY, {"mode": "separate", "model": model})
    config["upstream"].update({"vertex_project": "summaries", "vertex_region": "europe-west1"}
                              if provider == "vertex" else {})
    proxy = proxy_factory(config)
    status, headers, raw = _post(provider, proxy.base_url, {
        "max_tokens": 100, "messages": read_turns(12)}, stream=True)
    assert status == 200, raw[:300]
    assert "L4" in headers.get("x-compact-layers", "")
    calls = [r for r in upstream_server.upstream.requests
             if isinstance(r.body, dict) and is_summarizer_request(r.body)]
    assert calls
    expected = (f"/model/{model}/invoke" if provider == "bedrock" else
                f"/projects/summaries/locations/europe-west1/publishers/anthropic/models/"
                f"{model}:rawPredict")
    assert {call.path for call in calls} == {expected}


def test_a_bedrock_stream_that_ends_early_gets_an_exception_frame(
        proxy_factory: ProxyFactory, servers: LoopThread, provider: str,
        proxy_log: Any) -> None:
    """The provider's event stream ends cleanly before ``message_stop``: the proxy ends it
    in the stream's own terms (an exception frame the client's decoder reads), never SSE."""
    if provider != "bedrock":
        pytest.skip("Bedrock's event stream")
    from aiohttp import web

    from proxy.providers.eventstream import CONTENT_TYPE, chunk_frame

    async def short(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        await response.prepare(request)
        await response.write(chunk_frame({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [],
            "model": MODEL, "usage": {"input_tokens": 5, "output_tokens": 1}}}))
        await response.write_eof()
        return response

    async def start() -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/{tail:.*}", short)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return runner, f"http://{host}:{port}"

    runner, url = servers.run(start())
    try:
        proxy = proxy_factory(_config(provider, L1_POLICY), upstream_url=url)
        seen = len(read_log(proxy_log))
        status, _, raw = _post(provider, proxy.base_url, {"max_tokens": 50, "messages": [
            {"role": "user", "content": "hi"}]}, stream=True)
    finally:
        servers.run(runner.cleanup())
    assert status == 200
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    first, last = list(buffer)
    assert first.headers[":event-type"] == "chunk"
    assert last.headers[":message-type"] == "exception"
    assert b"before message_stop" in last.payload
    assert _completed(proxy_log, seen)["outcome"] == "stream_failed"


def test_the_tenant_limit_holds_on_the_providers_own_paths(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, provider: str) -> None:
    """``limits.max_concurrent_per_tenant`` counts a request on a Bedrock or Vertex path as
    on ``/v1/messages``: with a limit of one, a request whose body is still coming holds the
    slot and the next one is answered 429 at once, before its body."""
    import asyncio

    proxy = proxy_factory({**_config(provider, L1_POLICY),
                           "limits": {"max_concurrent_per_tenant": 1}})
    path = (f"/model/{MODEL}/invoke" if provider == "bedrock" else
            f"/projects/proj/locations/us-east5/publishers/anthropic/models/{VERTEX_MODEL}"
            ":rawPredict")
    host, port = proxy.base_url.removeprefix("http://").split(":")
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            "content-length: 100000\r\n\r\n").encode()

    async def go() -> bytes:
        holder = await asyncio.open_connection(host, int(port))
        holder[1].write(head)  # its body never comes: it holds the tenant's one slot
        await holder[1].drain()
        await asyncio.sleep(0.3)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head)
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        finally:
            writer.close()
            holder[1].close()

    answer = asyncio.run(go())
    assert answer.startswith(b"HTTP/1.1 429 "), answer
    assert upstream_server.upstream.requests == []
