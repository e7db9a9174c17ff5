"""forward(before_end=...): the hook runs with the answer's usage known and before the client
can see the answer complete — a JSON body's last chunk and a stream's end wait for it — so
what the answer teaches (the shared calibration) is saved before the client's next request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from proxy.config import Config
from proxy.fake_upstream import FakeUpstream
from proxy.fake_upstream.server import start_fake_upstream
from proxy.http.audit import RequestRecord
from proxy.http.forward import forward
from proxy.http.services import build_services
from proxy.store import store_for
from tests.conftest import TEST_API_KEY

HOLD_S = 0.5


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[tuple[str, list[Any]]]:
    """A fake provider, and a server at ``/v1/messages`` that forwards to it with a
    ``before_end`` that notes the usage it sees, then holds the end for :data:`HOLD_S`."""
    upstream_runner, upstream_url = await start_fake_upstream(FakeUpstream())
    seen: list[Any] = []
    config = Config.from_mapping({"upstream": {"base_url": upstream_url},
                                  "store": {"path": str(tmp_path / "state.db")}})
    services = build_services(config, store_for(config))  # (the store is never opened)

    async def handler(request: web.Request) -> web.StreamResponse:
        record = RequestRecord(request_id="r", route="messages")

        async def before_end() -> None:
            seen.append(record.usage)
            await asyncio.sleep(HOLD_S)
            seen.append("released")

        headers = CIMultiDict({"x-api-key": TEST_API_KEY, "anthropic-version": "2023-06-01",
                               "content-type": "application/json"})
        return await forward(services, request, record, body=await request.read(), headers=headers,
                             before_end=before_end)

    app = web.Application()
    app.router.add_post("/v1/messages", handler)
    app.cleanup_ctx.append(services.upstream.running)  # the upstream session, as the proxy's
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}", seen
    finally:
        await runner.cleanup()
        await upstream_runner.cleanup()


async def _post(url: str, stream: bool) -> tuple[float, float, bytes]:
    """A request through the relay: when its headers came, when its answer ended (seconds
    from the start) and the answer."""
    body = {"model": "claude-sonnet-4-5", "max_tokens": 32, "stream": stream,
            "messages": [{"role": "user", "content": "hello there"}]}
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http:
        started = loop.time()
        async with http.post(f"{url}/v1/messages", json=body) as resp:
            headers_after = loop.time() - started
            assert resp.status == 200
            answer = await resp.read()
        return headers_after, loop.time() - started, answer


@pytest.mark.parametrize("stream", [False, True])
async def test_the_client_sees_the_answer_end_only_after_before_end(
        relay: tuple[str, list[Any]], stream: bool) -> None:
    url, seen = relay
    _, took, answer = await _post(url, stream)
    assert seen[0] is not None and seen[0].prompt_tokens > 0  # usage known when called
    assert seen[1] == "released"
    assert took >= HOLD_S  # the end waited for the hook
    assert (b"message_stop" in answer) if stream else answer.rstrip().endswith(b"}")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_json_answer_s_headers_go_out_with_its_body_a_stream_s_at_once(
        relay: tuple[str, list[Any]], stream: bool) -> None:
    """A JSON answer's status line and headers are sent with its body, in one send (here
    its only chunk waits for before_end, so the headers do too); an event stream's are sent
    at once, before any event, as a client waiting on them expects."""
    headers_after, _, _ = await _post(relay[0], stream)
    if stream:
        assert headers_after < HOLD_S
    else:
        assert headers_after >= HOLD_S
