"""The Redis store in ``sentinel`` mode against real processes: a primary, its replica and a
Sentinel (``redis-server --sentinel``) watching them. The store finds the primary through the
Sentinel, and after a failover it writes to the new primary (the old one's refusals are
``StoreUnavailable`` meanwhile, never another error); the URL's forms and mistakes."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from proxy.config import Config, ConfigError
from proxy.store import RedisStateStore, StoreUnavailable, store_for
from proxy.store.redis.client import sentinels
from tests.proxy.store.helpers import make_state, unique_prefix
from tests.redis_server import RedisSentinel, RedisServer


async def wait_for(condition_name: str, check: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check() if callable(check) else check
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {condition_name}")


async def role(server: RedisServer) -> str:
    """``INFO replication``'s role of ``server``, on a connection of its own (a role change
    closes the clients' connections)."""
    client = aioredis.Redis.from_url(server.url)
    try:
        return str((await client.info("replication"))["role"])
    except aioredis.ConnectionError:
        return "unknown"
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_sentinel_mode_finds_the_primary_and_follows_a_failover() -> None:
    """Writes go to the primary the Sentinel names; after SENTINEL FAILOVER the store's
    next successful write lands on the promoted replica, with the earlier state kept."""
    with RedisServer() as primary, \
            RedisServer(extra_args=("--replicaof", "127.0.0.1", str(primary.port))) as replica:
        old = aioredis.Redis.from_url(primary.url)
        new = aioredis.Redis.from_url(replica.url)

        async def linked() -> bool:
            info = await new.info("replication")
            return bool(info.get("master_link_status") == "up")

        try:
            await wait_for("the replica's link", linked)
            with RedisSentinel(primary.port, replicas=(replica.port,)) as sentinel:
                store = await RedisStateStore(sentinel.url, mode="sentinel",
                                              sentinel_service=sentinel.service,
                                              key_prefix=unique_prefix()).open()
                try:
                    assert (await store.put_state("s1", make_state("a"), None)).version == 1
                    # (the lane's per-request scripts: its Sentinel-managed connections)
                    assert await store.put_versioned_record("s1", "calibration:m", b"a") == 1
                    assert await old.exists(store.state_key("s1")) == 1
                    await old.execute_command("WAIT", 1, 5000)
                    # Until the Sentinel has checked the replica it has nothing to promote.
                    await wait_for("the failover to start", lambda: "OK" in sentinel.command(
                        "sentinel", "failover", sentinel.service), timeout_s=30)
                    await wait_for("the promotion", lambda: sentinel.primary()
                                   == ("127.0.0.1", replica.port))
                    # Until the old primary is told to follow, it still takes writes (which
                    # the resync then drops: Redis' own failover window, not the store's).
                    # The Sentinel tells it on its next round (10 s); tell it now instead.
                    demote = aioredis.Redis.from_url(primary.url)
                    try:
                        await demote.execute_command("REPLICAOF", "127.0.0.1", replica.port)
                    finally:
                        await demote.aclose()

                    async def demoted() -> bool:
                        return await role(primary) == "slave"

                    await wait_for("the demotion", demoted)
                    written = None
                    deadline = time.monotonic() + 20
                    while written is None and time.monotonic() < deadline:
                        try:
                            written = await store.put_state("s1", make_state("b"), 1)
                        except StoreUnavailable:
                            await asyncio.sleep(0.2)
                    assert written is not None and written.version == 2
                    # The lane's connection was to the old primary: it follows too.
                    saved = None
                    deadline = time.monotonic() + 20
                    while saved is None and time.monotonic() < deadline:
                        try:
                            saved = await store.put_versioned_record("s1", "calibration:m",
                                                                     b"b")
                        except StoreUnavailable:
                            await asyncio.sleep(0.2)
                    assert saved == 2
                    versions = await store.session_versions("s1")
                    assert versions.records == {"calibration:m": 2} and versions.state == 2
                    # The promotion closed the replica's client connections: a new one.
                    promoted = aioredis.Redis.from_url(replica.url)
                    try:
                        assert await promoted.hget(store.state_key("s1"), "version") == b"2"
                    finally:
                        await promoted.aclose()
                    stored = await store.get_state("s1")
                    assert stored is not None and stored.state == make_state("b")
                finally:
                    await store.close()
        finally:
            await old.aclose()
            await new.aclose()


def test_sentinel_urls_name_every_sentinel_and_the_primary_s_options() -> None:
    """Hosts with and without ports (26379 by default), IPv6, the database and the
    primary's credentials; a query, a bad port or another scheme is refused."""
    addresses, options = sentinels("redis://u:p%40ss@s1:26380,s2,[::1]:26381/3")
    assert addresses == [("s1", 26380), ("s2", 26379), ("::1", 26381)]
    assert options == {"ssl": False, "db": 3, "username": "u", "password": "p@ss"}
    assert sentinels("rediss://s1")[1] == {"ssl": True}
    for url, problem in [("redis://s1/0?x=1", "no options"), ("redis://s1:x/0", "is not host"),
                         ("unix:///tmp/s.sock", "redis://"), ("redis://s1/db", "not a number")]:
        with pytest.raises(ValueError, match=problem):
            sentinels(url)
    with pytest.raises(ValueError, match="service name"):
        RedisStateStore("redis://s1:26379/0", mode="sentinel")
    with pytest.raises(ValueError, match="mode must be one of"):
        RedisStateStore("redis://h/0", mode="replicated")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cluster mode"):
        RedisStateStore("unix:///tmp/r.sock", mode="cluster")


def test_store_config_chooses_the_mode_and_checks_what_it_needs() -> None:
    """store.redis_mode and store.sentinel_service reach the store; sentinel without its
    service, or a unix socket for a cluster, is a ConfigError naming the key; the outage
    policy is reject unless forward is asked for."""
    def config(**store: object) -> Config:
        return Config.from_mapping({"upstream": {"base_url": "http://127.0.0.1:9"},
                                    "store": {"backend": "redis", **store}})

    built = store_for(config(url="redis://s1,s2:26380/0", redis_mode="sentinel",
                             sentinel_service="main"))
    assert isinstance(built, RedisStateStore) and built.mode == "sentinel"
    assert config(url="redis://h/0").store.on_unavailable == "reject"
    assert config(url="redis://h/0", on_unavailable="forward").store.on_unavailable == "forward"
    cases = [({"url": "redis://s1/0", "redis_mode": "sentinel"}, "store.sentinel_service"),
             ({"url": "unix:///tmp/r.sock", "redis_mode": "cluster"}, "store.url"),
             ({"url": "redis://h/0", "redis_mode": "replicated"}, "store.redis_mode"),
             ({"url": "redis://h/0", "on_unavailable": "retry"}, "store.on_unavailable")]
    for store, key in cases:
        with pytest.raises(ConfigError) as info:
            config(**store)
        assert info.value.key == key
