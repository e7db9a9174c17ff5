"""Redis goes away under load, then comes back: a real proxy on loopback on a real
``redis-server`` (append-only file synced on every write), clients sending requests
continuously, the server SIGKILLed for 5 s and started again on its port and its data.

With ``store.on_unavailable: reject`` every answer is a 200 or an Anthropic-shaped 503, no
request is forwarded without its durable state, and a state pinned before the outage is
forwarded again after it; with ``forward`` every answer is a 200 (without the durable block
while Redis is down) and the outage is logged once a second, not once per request. Either
way the proxy recovers by itself, and ``/healthz`` answers 503 while Redis is down.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.conftest import (
    TEST_API_KEY,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    read_log,
    user_text,
)
from tests.redis_server import RedisServer, RedisServerUnavailable
from tests.servers import started

pytestmark = pytest.mark.slow

#: How long Redis stays down.
OUTAGE_S = 5.0
#: How long after Redis is back the proxy must serve again (probe every 0.5 s, a loaded box).
RECOVERY_S = 4.0
#: Concurrent clients.
CLIENTS = 4
ADMIN_TOKEN = "outage-admin-token-31d7c0a9e5b24f6a8c1d"
FACT = "the outage test pinned this fact before redis went away"


@dataclass(frozen=True)
class Answer:
    """One response: when it was asked (monotonic), its status and body."""

    at: float
    status: int
    body: bytes


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    """A persistent ``redis-server`` of this test alone (it is killed and started again)."""
    with started(RedisServer(persistent=True), RedisServerUnavailable) as server:
        yield server


def start(proxy_factory: ProxyFactory, redis: RedisServer, mode: str) -> RunningProxy:
    return proxy_factory({"store": {"backend": "redis", "url": redis.url,
                                    "on_unavailable": mode}}, admin_token=ADMIN_TOKEN)


async def pin_state(proxy: RunningProxy, session_id: str) -> None:
    fact = {"fact_id": "f-outage", "content": FACT,
            "source_pointer": f"transcript:{session_id}:1",
            "last_confirmed_at": "2025-03-01T12:30:00Z"}
    async with (
        aiohttp.ClientSession() as http,
        http.put(f"{proxy.base_url}/admin/sessions/{session_id}/state",
                 json={"facts": [fact], "pending_items": [], "retrieval_evidence": []},
                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as resp,
    ):
        assert resp.status in (200, 201), await resp.text()


async def client(proxy: RunningProxy, session_id: str, stop: asyncio.Event,
                 answers: list[Answer]) -> None:
    """Send requests one after another until ``stop``; a transport error fails the test."""
    body = {"model": "claude-sonnet-4-5", "max_tokens": 16,
            "messages": [{"role": "user", "content": user_text("still there?")}]}
    headers = {"x-api-key": TEST_API_KEY, "anthropic-version": "2023-06-01",
               "x-compact-session-id": session_id}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while not stop.is_set():
            at = time.monotonic()
            async with http.post(f"{proxy.base_url}/v1/messages", json=body,
                                 headers=headers) as resp:
                answers.append(Answer(at, resp.status, await resp.read()))
            await asyncio.sleep(0.01)


async def health_poller(proxy: RunningProxy, stop: asyncio.Event,
                        seen: list[tuple[float, int, Any]]) -> None:
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            at = time.monotonic()
            async with http.get(f"{proxy.base_url}/healthz") as resp:
                seen.append((at, resp.status, await resp.json()))
            await asyncio.sleep(0.1)


@dataclass
class Run:
    """What one outage run saw."""

    answers: list[Answer]
    health: list[tuple[float, int, Any]]
    killed_at: float
    restarting_at: float  # when the restart began (it may answer before it returns)
    restarted_at: float


async def admin_get(proxy: RunningProxy, session_id: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.base_url}/admin/sessions/{session_id}/state",
                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as resp,
    ):
        return resp.status, await resp.json()


async def outage_under_load(proxy: RunningProxy, redis: RedisServer, session_id: str) -> Run:
    """Load for 1 s, Redis down for :data:`OUTAGE_S`, then load until :data:`RECOVERY_S`
    after it is back plus 1 s. Halfway through the outage the admin API answers 503."""
    stop = asyncio.Event()
    answers: list[Answer] = []
    health: list[tuple[float, int, Any]] = []
    tasks = [asyncio.create_task(client(proxy, session_id, stop, answers))
             for _ in range(CLIENTS)]
    tasks.append(asyncio.create_task(health_poller(proxy, stop, health)))
    try:
        await asyncio.sleep(1.0)
        killed_at = time.monotonic()
        await asyncio.to_thread(redis.kill)
        await asyncio.sleep(OUTAGE_S / 2)
        status, error = await admin_get(proxy, session_id)
        assert status == 503 and error["error"]["type"] == "api_error"
        assert "session store is unavailable" in error["error"]["message"]
        await asyncio.sleep(OUTAGE_S / 2)
        restarting_at = time.monotonic()
        await asyncio.to_thread(redis.restart)
        restarted_at = time.monotonic()
        await asyncio.sleep(RECOVERY_S + 1.0)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return Run(answers, health, killed_at, restarting_at, restarted_at)


def durable_blocks(upstream: UpstreamServer) -> list[bool]:
    """For each request the provider got, in order: whether it carried the pinned fact."""
    return [FACT in json.dumps(request.body.get("system", ""))
            for request in upstream.upstream.message_requests]


def check_health(run: Run) -> None:
    """/healthz: ok before the outage, 503 "unavailable" during it, ok again at the end."""
    before = [status for at, status, _ in run.health if at < run.killed_at]
    during = [(status, body) for at, status, body in run.health
              if run.killed_at + 1.0 < at < run.restarting_at - 0.5]
    assert before and set(before) == {200}
    assert (503, {"status": "unavailable", "store": "unavailable"}) in during
    assert set(status for status, _ in during) == {503}
    assert run.health[-1][1:] == (200, {"status": "ok", "store": "ok"})


async def test_reject_answers_503_while_redis_is_down_and_recovers(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, redis: RedisServer,
) -> None:
    """on_unavailable reject: only 200s and 503 api_errors (no 500, nothing else); nothing
    forwarded that was not answered 200; 503s only while Redis is down; the state pinned
    before is forwarded after; /healthz follows."""
    proxy = start(proxy_factory, redis, "reject")
    session_id = f"outage-{uuid.uuid4().hex[:8]}"
    await pin_state(proxy, session_id)
    run = await outage_under_load(proxy, redis, session_id)

    statuses = [answer.status for answer in run.answers]
    assert set(statuses) == {200, 503}, sorted(set(statuses))
    for answer in run.answers:
        if answer.status == 503:
            error = json.loads(answer.body)
            assert error["type"] == "error" and error["error"]["type"] == "api_error"
            assert "session store is unavailable" in error["error"]["message"]
            # Asked while Redis was down (or just before: in flight when it went).
            assert run.killed_at - 1.0 <= answer.at < run.restarted_at + RECOVERY_S
    # Served again without restarting the proxy: the last second is all 200s.
    late = [a.status for a in run.answers if a.at > run.restarted_at + RECOVERY_S]
    assert late and set(late) == {200}
    # Each 200 was forwarded once, every 503 never; each forward had the pinned state.
    blocks = durable_blocks(upstream_server)
    assert len(blocks) == statuses.count(200)
    assert all(blocks)
    assert statuses.count(503) >= CLIENTS
    check_health(run)


async def test_forward_answers_200_throughout_without_the_durable_block(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, redis: RedisServer,
    proxy_log: Any,
) -> None:
    """on_unavailable forward: every answer a 200; the requests forwarded while Redis is
    down lack the durable block, the ones after have it again; store_unavailable is logged
    about once a second, far fewer times than there were requests; /healthz follows."""
    proxy = start(proxy_factory, redis, "forward")
    session_id = f"outage-{uuid.uuid4().hex[:8]}"
    await pin_state(proxy, session_id)
    logged_before = sum(1 for line in read_log(proxy_log)
                        if line.get("event") == "store_unavailable")
    run = await outage_under_load(proxy, redis, session_id)

    statuses = [answer.status for answer in run.answers]
    assert set(statuses) == {200}
    blocks = durable_blocks(upstream_server)
    assert len(blocks) == len(statuses)
    without = blocks.count(False)
    assert blocks[0] and blocks[-1] and without >= CLIENTS
    lines = [line for line in read_log(proxy_log)
             if line.get("event") == "store_unavailable"][logged_before:]
    assert 1 <= len(lines) <= OUTAGE_S + RECOVERY_S + 2
    assert sum(line["events"] for line in lines) <= without * 3  # counted, not per line
    assert len(lines) * 3 < without, (len(lines), without)
    assert {line["on_unavailable"] for line in lines} == {"forward"}
    check_health(run)
