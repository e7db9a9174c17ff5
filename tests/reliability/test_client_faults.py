"""Client faults: a client that hangs up mid-stream cancels the provider's request, and 500 of
them leak no task, connection or file descriptor (measured in this process, which runs the
proxy and the fake provider on the background loop)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from proxy.fake_upstream import RecordedRequest, Reply
from tests.conftest import (
    TEST_API_KEY,
    LoopThread,
    RunningProxy,
    UpstreamServer,
    read_log,
    user_text,
)

MODEL = "claude-sonnet-4-5"
DISCONNECTS = 500
CONCURRENCY = 25
HEADERS = {"x-api-key": TEST_API_KEY, "content-type": "application/json"}
BODY = json.dumps({"model": MODEL, "max_tokens": 16, "stream": True,
                   "messages": [{"role": "user", "content": user_text("hang up on me")}]})


def slow_stream(body: dict[str, Any], meta: RecordedRequest) -> Reply:
    """A long answer whose events come 50 ms apart: the client always leaves mid-stream."""
    return Reply.text("word " * 40, event_delay_s=0.05)


def open_fds() -> int:
    """File descriptors this process holds."""
    return len(os.listdir("/proc/self/fd"))


async def _count_tasks() -> int:
    return len(asyncio.all_tasks())


def server_tasks(servers: LoopThread) -> int:
    """Tasks alive on the loop that serves the proxy and the fake provider."""
    return servers.run(_count_tasks())


async def hang_up_after_first_event(http: aiohttp.ClientSession, proxy: RunningProxy) -> bytes:
    """Start a stream, read its first chunk, then drop the connection."""
    resp = await http.post(f"{proxy.base_url}/v1/messages", data=BODY, headers=HEADERS)
    try:
        assert resp.status == 200
        return await resp.content.readany()
    finally:
        resp.close()  # closes the connection rather than returning it to the pool


async def hang_up_many(proxy: RunningProxy, count: int) -> None:
    """``count`` hang-ups, ``CONCURRENCY`` at a time, each on its own connection."""
    connector = aiohttp.TCPConnector(limit=CONCURRENCY, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one() -> None:
            async with sem:
                first = await hang_up_after_first_event(http, proxy)
                assert first.startswith(b"event: message_start")

        await asyncio.gather(*(one() for _ in range(count)))


def settle(upstream_server: UpstreamServer, servers: LoopThread, cancelled: int,
           fds: int, tasks: int, timeout_s: float = 15.0) -> tuple[int, int]:
    """Wait until the provider saw ``cancelled`` hang-ups and fds/tasks are back to the
    baseline (or the timeout passes); the fd and task counts at the end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now_fds, now_tasks = open_fds(), server_tasks(servers)
        if (upstream_server.upstream.cancelled >= cancelled and now_fds <= fds
                and now_tasks <= tasks):
            break
        time.sleep(0.05)
    return open_fds(), server_tasks(servers)


async def test_client_hang_up_cancels_the_provider_request(
    proxy: RunningProxy, upstream_server: UpstreamServer, proxy_log: Path
) -> None:
    """One hang-up mid-stream: the provider sees the cancel; the record says client_gone."""
    upstream = upstream_server.upstream
    upstream.script = slow_stream
    await hang_up_many(proxy, 1)
    for _ in range(200):
        if upstream.cancelled:
            break
        await asyncio.sleep(0.02)
    assert upstream.cancelled == 1
    assert upstream.events_sent < 40  # it stopped long before the end of the answer
    await asyncio.sleep(0.05)
    completed = [line for line in read_log(proxy_log) if line["event"] == "request_completed"
                 and line.get("route") == "messages"]
    assert completed[-1]["outcome"] == "client_gone"
    assert completed[-1]["upstream_status"] == 200


def test_500_hang_ups_leak_no_task_connection_or_file_descriptor(
    proxy: RunningProxy, upstream_server: UpstreamServer, servers: LoopThread
) -> None:
    """After a warm-up, 500 mid-stream hang-ups: every one cancelled upstream, and the open
    fds and live tasks come back to their baseline; the proxy still serves."""
    upstream = upstream_server.upstream
    upstream.script = slow_stream
    asyncio.run(hang_up_many(proxy, 2 * CONCURRENCY))  # pools, executors, caches warm
    settle(upstream_server, servers, 2 * CONCURRENCY, 1 << 20, 1 << 20)
    fds_before, tasks_before = open_fds(), server_tasks(servers)
    cancelled_before = upstream.cancelled
    started = time.monotonic()
    asyncio.run(hang_up_many(proxy, DISCONNECTS))
    took = time.monotonic() - started
    fds_after, tasks_after = settle(upstream_server, servers, cancelled_before + DISCONNECTS,
                                    fds_before, tasks_before)
    print(f"\n{DISCONNECTS} hang-ups in {took:.1f}s: fds {fds_before} -> {fds_after}, "
          f"server tasks {tasks_before} -> {tasks_after}, "
          f"provider saw {upstream.cancelled - cancelled_before} cancels")
    assert upstream.cancelled - cancelled_before == DISCONNECTS
    assert fds_after <= fds_before
    assert tasks_after <= tasks_before

    async def still_serves() -> str:
        upstream.script = lambda body, meta: Reply.text("fine")
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{proxy.base_url}/v1/messages", data=BODY,
                                 headers=HEADERS) as resp:
                return await resp.text()

    assert asyncio.run(still_serves()).endswith('data: {"type":"message_stop"}\n\n')
