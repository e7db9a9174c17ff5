"""The fake provider as Bedrock and as Vertex: the real SDK clients (AnthropicBedrock signs
with botocore and reads event-stream frames with botocore's decoder; AnthropicVertex) and raw
requests for what the SDKs never send."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer
from yarl import URL

from proxy.fake_upstream import FakeUpstream, start_fake_upstream
from proxy.fake_upstream.credentials import (
    TEST_AWS_ACCESS_KEY,
    TEST_AWS_SECRET_KEY,
    TEST_VERTEX_TOKEN,
)
from proxy.providers.eventstream import chunk_frame, exception_frame

MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
ARN = ("arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
       "us.anthropic.claude-sonnet-4-5-20250929-v1:0")
HELLO = [{"role": "user", "content": "hello"}]
# The Python SDK's clients send the API version as ``anthropic_version``; the providers'
# documented values are these (Claude Code sends them).
ON_BEDROCK: dict[str, Any] = {"extra_body": {"anthropic_version": "bedrock-2023-05-31"}}
ON_VERTEX: dict[str, Any] = {"extra_body": {"anthropic_version": "vertex-2023-10-16"}}
BODY: dict[str, Any] = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 50,
                        "messages": HELLO}


async def _serve(provider: str, **kwargs: Any) -> tuple[FakeUpstream, Any, str]:
    upstream = FakeUpstream(provider=provider, **kwargs)
    runner, url = await start_fake_upstream(upstream)
    return upstream, runner, url


@pytest.fixture
async def bedrock() -> AsyncIterator[tuple[FakeUpstream, str]]:
    upstream, runner, url = await _serve("bedrock")
    try:
        yield upstream, url
    finally:
        await runner.cleanup()


@pytest.fixture
async def vertex() -> AsyncIterator[tuple[FakeUpstream, str]]:
    upstream, runner, url = await _serve("vertex")
    try:
        yield upstream, url
    finally:
        await runner.cleanup()


def _bedrock_sdk(url: str, secret: str = TEST_AWS_SECRET_KEY) -> anthropic.AsyncAnthropicBedrock:
    return anthropic.AsyncAnthropicBedrock(
        base_url=url, aws_access_key=TEST_AWS_ACCESS_KEY, aws_secret_key=secret,
        aws_region="us-east-1", max_retries=0)


def signed(url: str, raw: bytes, method: str = "POST",
           secret: str = TEST_AWS_SECRET_KEY) -> dict[str, str]:
    """SigV4 headers for ``raw`` sent to ``url`` (botocore's own signer)."""
    request = AWSRequest(method=method, url=url, data=raw,
                         headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(TEST_AWS_ACCESS_KEY, secret), "bedrock", "us-east-1").add_auth(request)
    return dict(request.headers.items())


async def _post(url: str, raw: bytes, headers: dict[str, str]) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            URL(url, encoded=True), data=raw, headers=headers) as response:
        return response.status, response.headers, await response.read()


def test_event_stream_frames_decode_with_botocore() -> None:
    frames = chunk_frame({"type": "message_stop"}) + exception_frame("throttlingException", "x")
    buffer = EventStreamBuffer()
    buffer.add_data(frames)
    first, second = list(buffer)
    assert first.headers[":event-type"] == "chunk"
    assert json.loads(base64.b64decode(json.loads(first.payload)["bytes"])) == {
        "type": "message_stop"}
    assert second.headers[":message-type"] == "exception"
    assert json.loads(second.payload) == {"message": "x"}


async def test_bedrock_sdk_invoke_and_stream(bedrock: tuple[FakeUpstream, str]) -> None:
    upstream, url = bedrock
    client = _bedrock_sdk(url)
    try:
        message = await client.messages.create(model=MODEL, max_tokens=50, messages=HELLO,
                                                 **ON_BEDROCK)
        assert message.content[0].type == "text"
        async with client.messages.stream(model=MODEL, max_tokens=50, messages=HELLO,
                                          **ON_BEDROCK) as stream:
            final = await stream.get_final_message()
        assert final.usage.input_tokens > 0
        assert final.stop_reason == "end_turn"
    finally:
        await client.close()
    assert [r.path.rsplit("/", 1)[1] for r in upstream.requests] == [
        "invoke", "invoke-with-response-stream"]
    assert upstream.counts["messages"] == 2


async def test_bedrock_refuses_a_wrong_signature(bedrock: tuple[FakeUpstream, str]) -> None:
    _, url = bedrock
    client = _bedrock_sdk(url, secret="not-the-secret")
    try:
        with pytest.raises(anthropic.PermissionDeniedError, match="signature we calculated"):
            await client.messages.create(model=MODEL, max_tokens=50, messages=HELLO,
                                                 **ON_BEDROCK)
    finally:
        await client.close()


async def test_bedrock_signature_covers_the_bytes_and_path(
        bedrock: tuple[FakeUpstream, str]) -> None:
    _, url = bedrock
    raw = json.dumps(BODY).encode()
    target = f"{url}/model/{MODEL}/invoke"
    status, _, _ = await _post(target, raw, signed(target, raw))
    assert status == 200
    # Other bytes than those signed:
    status, headers, answer = await _post(target, raw + b" ", signed(target, raw))
    assert status == 403 and "signature we calculated" in json.loads(answer)["message"]
    assert headers["x-amzn-ErrorType"].startswith("InvalidSignatureException")
    # Signed for ":" but sent as "%3A" (what a re-encoding proxy does):
    encoded = f"{url}/model/{MODEL.replace(':', '%3A')}/invoke"
    status, _, _ = await _post(encoded, raw, signed(target, raw))
    assert status == 403
    # An ARN with its "/" as %2F, signed as sent:
    arn = f"{url}/model/{ARN.replace('/', '%2F')}/invoke"
    status, _, _ = await _post(arn, raw, signed(arn, raw))
    assert status == 200
    # Twice encoded: not a model identifier.
    twice = f"{url}/model/{ARN.replace('/', '%252F')}/invoke"
    status, _, answer = await _post(twice, raw, signed(twice, raw))
    assert status == 400 and "model identifier is invalid" in json.loads(answer)["message"]


@pytest.mark.parametrize(("change", "wanted"), [
    ({"model": MODEL}, "extraneous key [model]"),
    ({"stream": True}, "extraneous key [stream]"),
    ({"anthropic_version": "2023-06-01"}, "anthropic_version"),
    ({"anthropic_beta": ["oauth-2025-04-20"]}, "invalid beta flag"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "first message"),
])
async def test_bedrock_body_rules(bedrock: tuple[FakeUpstream, str], change: dict[str, Any],
                                  wanted: str) -> None:
    _, url = bedrock
    raw = json.dumps({**BODY, **change}).encode()
    target = f"{url}/model/{MODEL}/invoke"
    status, headers, answer = await _post(target, raw, signed(target, raw))
    assert status == 400
    assert headers["x-amzn-ErrorType"].startswith("ValidationException")
    assert wanted in json.loads(answer)["message"]


async def test_bedrock_too_long_has_no_numbers() -> None:
    upstream, runner, url = await _serve("bedrock", context_window=10)
    try:
        raw = json.dumps({**BODY, "messages": [{"role": "user", "content": "x" * 400}]}).encode()
        target = f"{url}/model/{MODEL}/invoke-with-response-stream"
        status, headers, answer = await _post(target, raw, signed(target, raw))
    finally:
        await runner.cleanup()
    assert status == 400
    assert json.loads(answer) == {"message": "Input is too long for requested model."}
    assert headers["x-amzn-ErrorType"].startswith("ValidationException")


async def test_bedrock_inference_profiles_and_count_tokens(
        bedrock: tuple[FakeUpstream, str]) -> None:
    _, url = bedrock
    async with aiohttp.ClientSession() as session:
        target = f"{url}/inference-profiles?maxResults=1000&typeEquals=SYSTEM_DEFINED"
        async with session.get(target, headers=signed(target, b"", "GET")) as response:
            assert response.status == 200
            assert (await response.json())["inferenceProfileSummaries"]
    blob = base64.b64encode(json.dumps(BODY).encode()).decode()
    raw = json.dumps({"input": {"invokeModel": {"body": blob}}}).encode()
    target = f"{url}/model/{MODEL}/count-tokens"
    status, _, answer = await _post(target, raw, signed(target, raw))
    assert status == 200 and json.loads(answer)["inputTokens"] > 0


async def test_vertex_sdk_and_rules(vertex: tuple[FakeUpstream, str]) -> None:
    upstream, url = vertex
    client = anthropic.AsyncAnthropicVertex(
        base_url=url, region="us-east5", project_id="proj", access_token=TEST_VERTEX_TOKEN,
        max_retries=0)
    try:
        message = await client.messages.create(
            model="claude-sonnet-4-5@20250929", max_tokens=50, messages=HELLO, **ON_VERTEX)
        assert message.content[0].type == "text"
        async with client.messages.stream(model="claude-sonnet-4-5@20250929", max_tokens=50,
                                          messages=HELLO, **ON_VERTEX) as stream:
            assert (await stream.get_final_message()).stop_reason == "end_turn"
    finally:
        await client.close()
    assert upstream.requests[-1].path.endswith(
        "/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict")
    bad = anthropic.AsyncAnthropicVertex(
        base_url=url, region="us-east5", project_id="proj", access_token="wrong",
        max_retries=0)
    try:
        with pytest.raises(anthropic.AuthenticationError):
            await bad.messages.create(model="claude-sonnet-4-5@20250929", max_tokens=50,
                                      messages=HELLO, **ON_VERTEX)
    finally:
        await bad.close()


async def test_vertex_too_long_is_413_without_numbers() -> None:
    upstream, runner, url = await _serve("vertex", context_window=10)
    try:
        raw = json.dumps({"anthropic_version": "vertex-2023-10-16", "max_tokens": 5,
                          "messages": [{"role": "user", "content": "x" * 400}]}).encode()
        status, _, answer = await _post(
            f"{url}/projects/p/locations/us-east5/publishers/anthropic/models/"
            "claude-sonnet-4-5@20250929:rawPredict", raw,
            {"Authorization": f"Bearer {TEST_VERTEX_TOKEN}", "Content-Type": "application/json"})
    finally:
        await runner.cleanup()
    assert status == 413
    assert json.loads(answer)["error"]["message"] == "Prompt is too long"
