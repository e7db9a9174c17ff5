"""The Redis store's lane (proxy.store.redis.lane) against a real ``redis-server``: what
redis-py's client guarantees holds on it too — a bound on every call, a retry on a connection
the server closed, no stale reply after a timeout or a cancel, the server's errors as
redis-py's — and the store's per-request scripts go by it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.store import RecordFetch, RedisStateStore, StoreUnavailable
from proxy.store.redis.lane import Lane
from tests.proxy.store.helpers import unique_prefix
from tests.redis_server import free_port

# Keeps the server busy (it runs one script at a time) for ARGV[1] microseconds.
_BUSY_LUA = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat
  local now = redis.call('TIME')
until now[1] * 1000000 + now[2] - start > tonumber(ARGV[1])
return 1
"""


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def lane_of(url: str, timeout_s: float = 5.0) -> Lane:
    return Lane(aioredis.Redis.from_url(url, socket_timeout=timeout_s).connection_pool)


async def busy(raw: aioredis.Redis, seconds: float) -> None:
    await raw.eval(_BUSY_LUA, 0, int(seconds * 1_000_000))


async def test_a_call_returns_the_reply_and_keeps_its_connection(
        redis_url: str, raw: aioredis.Redis) -> None:
    key = f"{unique_prefix()}k"
    lane = lane_of(redis_url)
    try:
        assert await lane.call("SET", key, "v1") in (b"OK", "OK", True)
        assert await lane.call("GET", key) == b"v1"
        assert lane.idle == 1  # one connection, reused
        assert lane.timeout_s == 5.0  # the client's socket timeout bounds each call
    finally:
        await lane.close()
        await raw.delete(key)


async def test_a_connection_the_server_closed_is_retried_once_on_a_new_one(
        redis_url: str, raw: aioredis.Redis) -> None:
    lane = lane_of(redis_url)
    try:
        name = f"lane-{unique_prefix()}"
        await lane.call("CLIENT", "SETNAME", name)
        assert await raw.client_kill_filter(_id=await _client_id(raw, name)) == 1
        assert await lane.call("PING") in (b"PONG", "PONG", True)
    finally:
        await lane.close()


async def test_a_timeout_is_redis_pys_and_leaves_no_stale_reply(
        redis_url: str, raw: aioredis.Redis) -> None:
    """The server busy past the bound: redis-py's TimeoutError, not retried; the next call
    gets its own reply, not the late one of the call that timed out."""
    key = f"{unique_prefix()}k"
    await raw.set(key, "late")
    lane = lane_of(redis_url, timeout_s=0.2)
    try:
        assert await lane.call("ECHO", "warm") == b"warm"  # (its connection made)
        blocker = asyncio.create_task(busy(raw, 0.6))
        await asyncio.sleep(0.05)
        with pytest.raises(RedisTimeoutError):
            await lane.call("GET", key)
        await blocker
        assert await lane.call("ECHO", "mine") == b"mine"
    finally:
        await lane.close()
        await raw.delete(key)


async def test_a_new_connections_handshake_is_bounded_too(
        redis_url: str, raw: aioredis.Redis) -> None:
    """The connection has no socket timeout of its own: its handshake (HELLO) with a busy
    server is bounded by the lane, as the client's socket timeout bounds it."""
    lane = lane_of(redis_url, timeout_s=0.2)
    try:
        blocker = asyncio.create_task(busy(raw, 0.6))
        await asyncio.sleep(0.05)
        with pytest.raises(RedisTimeoutError):
            await lane.call("ECHO", "first")
        await blocker
        assert await lane.call("ECHO", "then") == b"then"
    finally:
        await lane.close()


async def test_a_cancelled_call_leaves_no_stale_reply(
        redis_url: str, raw: aioredis.Redis) -> None:
    """A request cancelled while its command waits (the client hung up): the connection goes
    back closed, and the next call's reply is its own."""
    lane = lane_of(redis_url)
    try:
        blocker = asyncio.create_task(busy(raw, 0.4))
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(lane.call("ECHO", "stale"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await blocker
        assert await lane.call("ECHO", "fresh") == b"fresh"
    finally:
        await lane.close()


async def test_the_servers_errors_are_redis_pys(redis_url: str) -> None:
    lane = lane_of(redis_url)
    try:
        with pytest.raises(NoScriptError):
            await lane.call("EVALSHA", "0" * 40, 0)
    finally:
        await lane.close()


async def test_an_unreachable_server_is_a_connection_error() -> None:
    lane = lane_of(f"redis://127.0.0.1:{free_port()}/0", timeout_s=1)
    try:
        with pytest.raises(RedisConnectionError):
            await lane.call("PING")
    finally:
        await lane.close()


async def test_a_closed_lane_closes_its_connections_and_refuses_calls(
        redis_url: str, raw: aioredis.Redis) -> None:
    lane = lane_of(redis_url)
    name = f"lane-{unique_prefix()}"
    await lane.call("CLIENT", "SETNAME", name)
    await lane.close()
    await asyncio.sleep(0.05)
    assert name not in {client.get("name") for client in await raw.client_list()}
    with pytest.raises(RuntimeError, match="closed"):
        await lane.call("PING")


async def test_the_stores_per_request_scripts_go_by_its_lane(
        redis_url: str, raw: aioredis.Redis) -> None:
    """The versions read and the record save run on the lane's one connection, never on the
    client's pool (the server's own list of connections, by their last command); a server
    busy past the store's timeout is an outage there, as on the client."""
    name = f"lane-{unique_prefix().strip(':')}"
    store = await RedisStateStore(f"{redis_url}?client_name={name}", key_prefix=unique_prefix(),
                                  timeout_s=0.3).open()
    try:
        fetch = RecordFetch("calibration:")
        # (a server that does not hold a script yet gets it loaded through the client)
        assert await store.put_versioned_record("s", "calibration:m", b"x") == 1
        assert (await store.session_versions("s", fetch)).records == {"calibration:m": 1}
        assert await store.available()  # a PING, the pool's last command
        for number in range(2, 5):
            assert await store.put_versioned_record("s", "calibration:m", b"x") == number
            assert (await store.session_versions("s", fetch)).records == {"calibration:m": number}
        mine = sorted(client["cmd"] for client in await raw.client_list()
                      if client.get("name") == name)
        assert mine == ["evalsha", "ping"]  # the lane's connection; the pool's
        blocker = asyncio.create_task(busy(raw, 0.8))
        await asyncio.sleep(0.05)
        with pytest.raises(StoreUnavailable):
            await store.session_versions("s", fetch)
        await blocker
    finally:
        await store.close()


async def _client_id(raw: aioredis.Redis, name: str) -> str:
    for client in await raw.client_list():
        if client.get("name") == name:
            return str(client["id"])
    raise AssertionError(f"no client named {name}")
