"""End to end: Bedrock's event stream: exception frames relayed, an early end closed in kind."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.eventstream import EventStreamBuffer

from proxy.fake_upstream import Fault, Reply
from tests.conftest import LoopThread, ProxyFactory, UpstreamServer, read_log
from tests.proxy.e2e.provider_helpers import (  # noqa: F401  (the fixtures)
    L1_POLICY,
    MODEL,
    _completed,
    _config,
    _credentials,
    _post,
    provider_fixture,
    provider_upstream_server,
)


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
