"""End to end: SSE streams are relayed event by event, failures end them with an error event."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.fake_upstream import Fault, Reply
from tests.conftest import TEST_API_KEY, RunningProxy, UpstreamServer, user_text

MODEL = "claude-sonnet-4-5"
MESSAGES: list[Any] = [{"role": "user", "content": user_text("stream please")}]
# message_start, ping, content_block_start, 3 text deltas, content_block_stop,
# message_delta, message_stop.
EVENTS_PER_TEXT_REPLY = 9


def slow_reply(delay_s: float = 0.15) -> Reply:
    """A one-text-block answer whose SSE events are sent ``delay_s`` apart."""
    return Reply.text("one two three four five six", event_delay_s=delay_s)


def test_stream_reaches_the_sync_client_event_by_event(
    sdk: anthropic.Anthropic, upstream_server: UpstreamServer
) -> None:
    """The first event arrives while the provider has not yet sent the last one."""
    upstream = upstream_server.upstream
    upstream.push(slow_reply())
    sent_when_first_seen = None
    text = ""
    with sdk.messages.stream(model=MODEL, max_tokens=64, messages=MESSAGES) as stream:
        for event in stream:
            if sent_when_first_seen is None:
                sent_when_first_seen = upstream.events_sent
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
    assert text == "one two three four five six"
    assert upstream.events_sent == EVENTS_PER_TEXT_REPLY
    assert sent_when_first_seen is not None and sent_when_first_seen < EVENTS_PER_TEXT_REPLY


async def test_stream_reaches_the_async_client_event_by_event(
    async_sdk: anthropic.AsyncAnthropic, upstream_server: UpstreamServer
) -> None:
    """The async SDK also sees the first event before the provider sends the last."""
    upstream = upstream_server.upstream
    upstream.push(slow_reply())
    seen: list[tuple[str, int]] = []
    stream = await async_sdk.messages.create(model=MODEL, max_tokens=64, messages=MESSAGES,
                                             stream=True)
    async for event in stream:
        seen.append((event.type, upstream.events_sent))
    assert [name for name, _ in seen][0] == "message_start"
    assert seen[-1][0] == "message_stop"
    assert seen[0][1] < EVENTS_PER_TEXT_REPLY


async def test_stream_headers_come_back_with_the_compaction_headers(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """A streamed answer keeps ``text/event-stream``, the provider's ids, and gets x-compact-*."""
    body = {"model": MODEL, "max_tokens": 16, "stream": True, "messages": MESSAGES}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", json=body,
                             headers={"x-api-key": TEST_API_KEY}) as resp:
            payload = await resp.text()
            headers = resp.headers
    assert headers["Content-Type"].startswith("text/event-stream")
    assert "Content-Length" not in headers
    assert headers["request-id"] == upstream_server.upstream.message_requests[0].request_id
    assert headers["x-compact-layers"] == ""
    assert payload.startswith("event: message_start\n")
    assert payload.endswith("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")


async def test_client_disconnect_mid_stream_cancels_the_upstream_request(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """Closing the client connection after one event makes the proxy drop the upstream stream."""
    upstream = upstream_server.upstream
    upstream.push(slow_reply(delay_s=0.3))
    body = {"model": MODEL, "max_tokens": 16, "stream": True, "messages": MESSAGES}
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{proxy.base_url}/v1/messages", json=body,
                               headers={"x-api-key": TEST_API_KEY})
        first = await resp.content.readuntil(b"\n\n")
        assert first.startswith(b"event: message_start")
        resp.close()  # drops the connection
    deadline = time.monotonic() + 5
    while upstream.cancelled == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert upstream.cancelled == 1
    assert upstream.events_sent < EVENTS_PER_TEXT_REPLY


async def test_upstream_dropping_mid_stream_ends_with_an_sse_error_event(
    proxy: RunningProxy, upstream_server: UpstreamServer
) -> None:
    """The provider vanishing mid-stream gives complete events, then ``event: error``, then EOF."""
    upstream_server.upstream.push(Reply.text("one two three", fault=Fault("cut_after_events",
                                                                          after_events=4)))
    body = {"model": MODEL, "max_tokens": 16, "stream": True, "messages": MESSAGES}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", json=body,
                             headers={"x-api-key": TEST_API_KEY}) as resp:
            assert resp.status == 200
            payload = (await resp.read()).decode()
    events = payload.split("\n\n")
    assert events[-1] == ""  # ends on an event boundary
    names = [event.splitlines()[0] for event in events[:-1]]
    assert names[:4] == ["event: message_start", "event: ping", "event: content_block_start",
                         "event: content_block_delta"]
    assert names[-1] == "event: error"
    error = json.loads(events[-2].splitlines()[1].removeprefix("data: "))
    assert error["type"] == "error"
    assert error["error"]["type"] == "api_error"


def test_sdk_raises_on_the_proxys_mid_stream_error_event(
    sdk: anthropic.Anthropic, upstream_server: UpstreamServer
) -> None:
    """The SDK turns the proxy's ``event: error`` into an ``APIStatusError``."""
    upstream_server.upstream.push(Reply.text("one two three", fault=Fault("cut_after_events",
                                                                          after_events=3)))
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk.messages.stream(model=MODEL, max_tokens=16, messages=MESSAGES) as stream:
            for _ in stream:
                pass
    assert "upstream provider stream failed" in str(caught.value)


def test_providers_own_error_event_is_relayed_unchanged(
    sdk: anthropic.Anthropic, upstream_server: UpstreamServer
) -> None:
    """An ``overloaded_error`` event from the provider reaches the SDK as the provider sent it."""
    upstream_server.upstream.push(Reply.text("hi", fault=Fault("error_event", after_events=2)))
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk.messages.stream(model=MODEL, max_tokens=16, messages=MESSAGES) as stream:
            for _ in stream:
                pass
    assert caught.value.body == {"type": "error",
                                 "error": {"type": "overloaded_error", "message": "Overloaded"}}
