"""The upstream read timeout (``upstream.read_timeout_s``, aiohttp's ``sock_read``) counts only
the provider's silence: not the time a client takes to upload a body the proxy streams on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp

from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer

READ_TIMEOUT_S = 0.5


async def _slowly(chunks: list[bytes], pause_s: float) -> AsyncIterator[bytes]:
    for chunk in chunks:
        await asyncio.sleep(pause_s)
        yield chunk


async def test_a_body_uploaded_for_longer_than_the_read_timeout_is_not_a_silent_provider(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
) -> None:
    proxy = proxy_factory({"upstream": {"read_timeout_s": READ_TIMEOUT_S}})
    payload = json.dumps({"requests": [{"custom_id": str(n)} for n in range(50)]}).encode()
    cut = len(payload) // 5
    chunks = [payload[i:i + cut] for i in range(0, len(payload), cut)]
    headers = {"x-api-key": TEST_API_KEY, "content-type": "application/json"}
    started = asyncio.get_running_loop().time()
    async with aiohttp.ClientSession() as http, http.post(
            f"{proxy.base_url}/v1/messages/batches", headers=headers,
            data=_slowly(chunks, READ_TIMEOUT_S * 0.6)) as resp:
        answer = await resp.json()
    took = asyncio.get_running_loop().time() - started
    assert took > 2 * READ_TIMEOUT_S  # the upload itself outlasted the timeout
    assert resp.status == 404, answer  # the provider's own answer, relayed: not a 504
    assert answer["error"]["type"] == "not_found_error"
    record = upstream_server.upstream.requests[-1]
    assert record.path == "/v1/messages/batches"
    assert record.body == json.loads(payload)
