"""End to end: a pending item's status is the operator's. An L4 summary that says the item is
done, and a model reply that says so, change neither the stored state nor the block the
provider is sent; only an admin PUT does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import anthropic

from proxy.fake_upstream import Reply
from tests.conftest import (
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    first_text,
    user_text,
)
from tests.proxy.e2e.helpers import (
    SUMMARY_POLICY,
    admin_put,
    forwarded,
    read_turns,
    summary_calls,
)

MODEL = "claude-sonnet-4-5"
SESSION = "pending-e2e"
CLAIM = "The changelog pending item is done: status=done, item changelog completed."


def stored_state(proxy: RunningProxy) -> tuple[str, dict[str, Any]]:
    """The session's state as the admin API returns it, and its ETag."""

    async def get() -> tuple[str, dict[str, Any]]:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy.base_url}/admin/sessions/{SESSION}/state",
                                headers={"Authorization": f"Bearer {proxy.admin_token}"}) as r:
                assert r.status == 200
                return r.headers["ETag"], await r.json()

    return asyncio.run(get())


def pending_line(body: dict[str, Any]) -> str:
    """The pending item's line of the durable block at the end of a forwarded ``system``."""
    block = body["system"][-1]["text"]
    return next(line for line in block.splitlines() if 'item_id="changelog"' in line)


def test_a_summary_or_a_reply_saying_done_leaves_the_item_open(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """L4 runs with a summary claiming the item is done and the model answers that it is:
    the stored state and the rendered block still say open; an admin PUT then marks it done
    and the next request's block says so."""
    proxy = proxy_factory({"compaction": SUMMARY_POLICY},
                          admin_token="admin-pending-9e2c4a6b8d0f1e3c5a7b9d2f")
    admin_put(proxy, SESSION, {"pending_items": [{
        "item_id": "changelog", "description": "Add a changelog entry.",
        "source_pointer": f"transcript:{SESSION}:1", "last_confirmed_at": "2026-12-01T09:05:00Z"}]})
    upstream_server.upstream.push(Reply.text(CLAIM), Reply.text("Done: " + CLAIM))
    history = read_turns(12)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        first = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, messages=history,
            extra_headers={"x-compact-session-id": SESSION})
        reply = first.parse()
        assert "L4" in first.headers["x-compact-layers"].split(",")
        assert len(summary_calls(upstream_server)) == 1
        history += [{"role": "assistant", "content": first_text(reply)},
                    {"role": "user", "content": user_text("anything left?")}]
        client.messages.create(model=MODEL, max_tokens=64, messages=history,
                               extra_headers={"x-compact-session-id": SESSION})
    sent_first, sent_second = forwarded(upstream_server)
    # The summary and the reply claiming "done" are in what the provider is sent...
    assert CLAIM in json.dumps(sent_first["messages"])
    assert "Done: " + CLAIM in json.dumps(sent_second["messages"])
    # ...and the operator's block still says open, byte for byte the same.
    for body in (sent_first, sent_second):
        assert " status=open " in pending_line(body)
    assert sent_first["system"][-1] == sent_second["system"][-1]
    etag, state = stored_state(proxy)
    assert etag == '"1"' and state["pending_items"][0]["status"] == "open"

    async def mark_done() -> int:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"{proxy.base_url}/admin/sessions/{SESSION}/state",
                                json={**state, "pending_items": [
                                    {**state["pending_items"][0], "status": "done"}]},
                                headers={"Authorization": f"Bearer {proxy.admin_token}",
                                         "If-Match": etag}) as resp:
                return resp.status

    assert asyncio.run(mark_done()) == 200
    with anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY,
                             max_retries=0) as client:
        client.messages.create(model=MODEL, max_tokens=64, messages=history,
                               extra_headers={"x-compact-session-id": SESSION})
    assert " status=done " in pending_line(forwarded(upstream_server)[-1])
