"""The Redis state store, against a real ``redis-server``: versioned CAS writes, races between
tasks and between processes, the key layout, corrupt values, the compaction caches, connection
failures, and the proxy serving from it end to end."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import aiohttp
import anthropic
import pytest
import redis.asyncio as aioredis

from compactor import DurableContextState
from proxy.app import start_proxy
from proxy.config import Config, ConfigError
from proxy.store import (
    CorruptStateError,
    RedisStateStore,
    StateStore,
    StoreError,
    VersionConflict,
)
from proxy.store.redis import redacted_url
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, user_text
from tests.proxy.test_store_sqlite import make_state
from tests.redis_server import free_port


def unique_prefix() -> str:
    """A key prefix no other test uses, so tests sharing the server never see each other."""
    return f"test-{uuid.uuid4().hex}:"


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStateStore]:
    """An opened store under a fresh key prefix, closed after the test."""
    opened = await RedisStateStore.open(redis_url, key_prefix=unique_prefix())
    yield opened
    await opened.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain redis-py client on the same server, to look at and tamper with keys."""
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


# --- basic CAS semantics ----------------------------------------------------------------


async def test_store_implements_the_state_store_protocol(store: RedisStateStore) -> None:
    """The Redis backend is usable wherever a StateStore is expected."""
    assert isinstance(store, StateStore)


async def test_first_put_creates_version_one_that_get_returns(store: RedisStateStore) -> None:
    """Creating a state yields version 1, and get returns the same state and version."""
    assert await store.get_state("s1") is None
    written = await store.put_state("s1", make_state(), expected_version=None)
    assert (written.session_id, written.version) == ("s1", 1)
    assert written.updated_at.tzinfo is not None
    read = await store.get_state("s1")
    assert read is not None
    assert (read.version, read.state, read.updated_at) == (1, make_state(), written.updated_at)


async def test_put_with_current_version_replaces_and_increments(store: RedisStateStore) -> None:
    """A write naming the current version replaces the state with version + 1."""
    await store.put_state("s1", make_state("a"), None)
    second = await store.put_state("s1", make_state("b", facts=3), expected_version=1)
    third = await store.put_state("s1", DurableContextState(), expected_version=2)
    assert (second.version, third.version) == (2, 3)
    read = await store.get_state("s1")
    assert read is not None and read.version == 3 and read.state.is_empty


async def test_create_conflicts_when_a_state_exists(store: RedisStateStore) -> None:
    """expected_version=None on an existing state raises VersionConflict and keeps it."""
    await store.put_state("s1", make_state("a"), None)
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state("b"), None)
    assert (info.value.expected_version, info.value.current_version) == (None, 1)
    read = await store.get_state("s1")
    assert read is not None and read.state == make_state("a")


async def test_stale_version_conflicts_and_keeps_state(store: RedisStateStore) -> None:
    """A write naming an old version raises VersionConflict carrying the current version."""
    await store.put_state("s1", make_state("a"), None)
    await store.put_state("s1", make_state("b"), 1)
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state("c"), 1)
    assert (info.value.session_id, info.value.current_version) == ("s1", 2)
    read = await store.get_state("s1")
    assert read is not None and (read.version, read.state) == (2, make_state("b"))


async def test_update_of_a_missing_state_conflicts(store: RedisStateStore) -> None:
    """Naming a version when no state exists is a conflict with current_version None."""
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state(), 3)
    assert info.value.current_version is None
    assert await store.get_state("s1") is None


async def test_negative_expected_version_never_matches_a_missing_state(
    store: RedisStateStore,
) -> None:
    """Only expected_version=None creates; any number on a missing state is a conflict."""
    for expected in (-1, 0):
        with pytest.raises(VersionConflict):
            await store.put_state("s1", make_state(), expected)
    assert await store.get_state("s1") is None


async def test_delete_reports_whether_a_state_existed(store: RedisStateStore) -> None:
    """delete_state removes the state, returns True, and False once nothing is left."""
    await store.put_state("s1", make_state(), None)
    assert await store.delete_state("s1") is True
    assert await store.get_state("s1") is None
    assert await store.delete_state("s1") is False


async def test_delete_with_stale_version_keeps_state(store: RedisStateStore) -> None:
    """delete_state with a wrong expected version raises and deletes nothing."""
    await store.put_state("s1", make_state(), None)
    await store.put_state("s1", make_state("b"), 1)
    with pytest.raises(VersionConflict) as info:
        await store.delete_state("s1", expected_version=1)
    assert info.value.current_version == 2
    assert await store.get_state("s1") is not None
    assert await store.delete_state("s1", expected_version=2) is True
    assert await store.get_state("s1") is None


async def test_recreated_state_starts_again_at_version_one(store: RedisStateStore) -> None:
    """After a delete, a new state is version 1 and get returns the new content."""
    await store.put_state("s1", make_state("old"), None)
    assert (await store.get_state("s1")) is not None  # warm the decode cache
    await store.delete_state("s1")
    await store.put_state("s1", make_state("new"), None)
    read = await store.get_state("s1")
    assert read is not None and (read.version, read.state) == (1, make_state("new"))


async def test_sessions_are_independent(store: RedisStateStore) -> None:
    """Writes to one session neither change nor conflict with another."""
    await store.put_state("s1", make_state("a"), None)
    await store.put_state("s2", make_state("b"), None)
    await store.put_state("s1", make_state("c"), 1)
    s2 = await store.get_state("s2")
    assert s2 is not None and (s2.version, s2.state) == (1, make_state("b"))


async def test_session_ids_with_separators_do_not_collide(store: RedisStateStore) -> None:
    """Ids containing ':' or looking like other key kinds map to distinct keys."""
    ids = ["a", "a:b", "record:a", "summary:text", "ü/ñ 🙂"]
    for index, sid in enumerate(ids):
        await store.put_state(sid, make_state(f"t{index}"), None)
        await store.put_record(sid, "kind", sid.encode())
    for index, sid in enumerate(ids):
        read = await store.get_state(sid)
        assert read is not None and (read.version, read.state) == (1, make_state(f"t{index}"))
        assert await store.get_record(sid, "kind") == sid.encode()


# --- the server -------------------------------------------------------------------------


async def test_state_is_stored_as_a_hash_of_version_json_and_timestamp(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """The state key holds version, the canonical JSON of to_dict() and an ISO updated_at."""
    written = await store.put_state("s1", make_state("a", facts=2), None)
    fields = await raw.hgetall(f"{store.key_prefix}state:s1")
    assert set(fields) == {b"version", b"state", b"updated_at"}
    assert fields[b"version"] == b"1"
    assert json.loads(fields[b"state"]) == make_state("a", facts=2).to_dict()
    updated_at = fields[b"updated_at"]
    assert isinstance(updated_at, bytes)
    assert datetime.fromisoformat(updated_at.decode()) == written.updated_at


async def test_state_persists_across_store_instances(redis_url: str) -> None:
    """A state written, then read by a new store on the same server and prefix, is identical."""
    prefix = unique_prefix()
    first = await RedisStateStore.open(redis_url, key_prefix=prefix)
    await first.put_state("s1", make_state("a", facts=5), None)
    await first.put_state("s1", make_state("b", facts=2), 1)
    await first.close()
    second = await RedisStateStore.open(redis_url, key_prefix=prefix)
    try:
        read = await second.get_state("s1")
        assert read is not None and (read.version, read.state) == (2, make_state("b", facts=2))
    finally:
        await second.close()


async def test_key_prefixes_separate_deployments(redis_url: str) -> None:
    """Two stores with different prefixes on one server share nothing."""
    a = await RedisStateStore.open(redis_url, key_prefix=unique_prefix())
    b = await RedisStateStore.open(redis_url, key_prefix=unique_prefix())
    try:
        await a.put_state("s1", make_state("a"), None)
        await a.put_summary("k", "text")
        assert await b.get_state("s1") is None
        assert await b.get_summary("k") is None
        assert (await b.put_state("s1", make_state("b"), None)).version == 1
    finally:
        await a.close()
        await b.close()


async def test_two_instances_see_each_others_writes(redis_url: str) -> None:
    """A second store's write is visible to the first, even after the first cached it."""
    prefix = unique_prefix()
    a = await RedisStateStore.open(redis_url, key_prefix=prefix)
    b = await RedisStateStore.open(redis_url, key_prefix=prefix)
    try:
        await a.put_state("s1", make_state("a"), None)
        assert (await a.get_state("s1")) is not None
        await b.put_state("s1", make_state("b"), 1)
        read = await a.get_state("s1")
        assert read is not None and (read.version, read.state) == (2, make_state("b"))
        with pytest.raises(VersionConflict):
            await a.put_state("s1", make_state("c"), 1)
        await b.delete_state("s1")
        assert await a.get_state("s1") is None
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"version": "1", "state": "{not json", "updated_at": "2025-01-01T00:00:00+00:00"},
         "not JSON"),
        ({"version": "1", "state": "[1, 2]", "updated_at": "2025-01-01T00:00:00+00:00"},
         "not a JSON object"),
        ({"version": "1", "state": b"\xff\xfe", "updated_at": "2025-01-01T00:00:00+00:00"},
         "not JSON"),
        ({"version": "1", "state": '{"facts": [{"fact_id": "f"}]}',
          "updated_at": "2025-01-01T00:00:00+00:00"}, "facts[0].content: missing"),
        ({"version": "one", "state": "{}", "updated_at": "2025-01-01T00:00:00+00:00"},
         "version is not an integer"),
        ({"version": "0", "state": "{}", "updated_at": "2025-01-01T00:00:00+00:00"},
         "version is not an integer"),
        ({"version": "1", "state": "{}"}, "'updated_at' is missing"),
        ({"state": "{}", "updated_at": "2025-01-01T00:00:00+00:00"}, "'version' is missing"),
        ({"version": "1", "state": "{}", "updated_at": "yesterday"}, "not an ISO timestamp"),
        ({"version": "1", "state": "{}", "updated_at": "2025-01-01T00:00:00"}, "no timezone"),
    ],
)
async def test_corrupt_hash_raises_instead_of_returning_garbage(
    store: RedisStateStore, raw: aioredis.Redis, fields: dict[str, str | bytes], detail: str
) -> None:
    """A state hash that does not decode into a valid state raises CorruptStateError naming why."""
    for name, value in fields.items():
        await raw.hset(f"{store.key_prefix}state:bad", name, value)
    with pytest.raises(CorruptStateError) as info:
        await store.get_state("bad")
    assert info.value.session_id == "bad"
    assert detail in info.value.detail


async def test_state_key_of_another_type_is_corrupt(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """A plain string under the state key is reported as corrupt by get and put alike."""
    await raw.set(f"{store.key_prefix}state:bad", "hello")
    with pytest.raises(CorruptStateError, match="not a hash"):
        await store.get_state("bad")
    with pytest.raises(CorruptStateError, match="not a hash"):
        await store.put_state("bad", make_state(), None)
    with pytest.raises(CorruptStateError):
        await store.delete_state("bad", expected_version=1)


async def test_corrupt_version_blocks_writes_but_delete_clears_it(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """A write on a hash with a non-integer version fails; an unconditional delete removes it."""
    await raw.hset(f"{store.key_prefix}state:bad",
                   mapping={"version": "x", "state": "{}", "updated_at": "now"})
    with pytest.raises(CorruptStateError, match="version"):
        await store.put_state("bad", make_state(), 1)
    assert await raw.hget(f"{store.key_prefix}state:bad", "version") == b"x"
    assert await store.delete_state("bad") is True
    assert (await store.put_state("bad", make_state(), None)).version == 1


async def test_hash_without_a_version_is_never_overwritten(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """A create over a state hash lacking its version fails as corrupt and keeps the hash."""
    await raw.hset(f"{store.key_prefix}state:bad", "state", "{}")
    with pytest.raises(CorruptStateError):
        await store.put_state("bad", make_state(), None)
    assert await raw.hgetall(f"{store.key_prefix}state:bad") == {b"state": b"{}"}


async def test_closed_store_refuses_calls(redis_url: str) -> None:
    """Every call after close raises StoreError; close itself is idempotent."""
    closed = await RedisStateStore.open(redis_url, key_prefix=unique_prefix())
    await closed.close()
    await closed.close()
    with pytest.raises(StoreError, match="closed"):
        await closed.get_state("s1")
    with pytest.raises(StoreError, match="closed"):
        await closed.put_summary("k", "v")


async def test_unreachable_server_raises_a_clean_store_error() -> None:
    """Opening a store on a port nobody listens on: StoreError naming the address, no secret."""
    port = free_port()
    with pytest.raises(StoreError) as info:
        await RedisStateStore.open(f"redis://admin:s3cret-pw@127.0.0.1:{port}/0", timeout_s=2)
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "cannot connect" in message
    assert "s3cret-pw" not in message
    assert "Traceback" not in message and "\n" not in message


async def test_rejected_password_is_not_in_the_error(redis_url: str) -> None:
    """A server refusing the URL's credentials gives a StoreError without the password."""
    url = redis_url.replace("redis://", "redis://nobody:wr0ng-pw@")
    with pytest.raises(StoreError) as info:
        await RedisStateStore.open(url, key_prefix=unique_prefix())
    assert "wr0ng-pw" not in str(info.value)
    assert "nobody:***@127.0.0.1" in str(info.value)


def test_redacted_url_hides_only_the_password() -> None:
    """Passwords become ***; URLs without one are unchanged."""
    assert redacted_url("redis://u:p%40ss@h:6380/2") == "redis://u:***@h:6380/2"
    assert redacted_url("rediss://:tok@h/0?ssl_cert_reqs=none") == "rediss://:***@h/0?ssl_cert_reqs=none"
    assert redacted_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redacted_url("unix:///run/redis.sock?db=1") == "unix:///run/redis.sock?db=1"


def test_invalid_construction_arguments_are_refused() -> None:
    """A non-Redis scheme, an empty prefix or a zero bound raise ValueError naming it."""
    with pytest.raises(ValueError, match="invalid redis url http://h/"):
        RedisStateStore("http://h/")
    with pytest.raises(ValueError, match="key_prefix"):
        RedisStateStore("redis://h/", key_prefix="")
    with pytest.raises(ValueError, match="max_summaries"):
        RedisStateStore("redis://h/", max_summaries=0)


# --- races ------------------------------------------------------------------------------


async def test_racing_tasks_get_exactly_one_winner(store: RedisStateStore) -> None:
    """20 tasks writing from the same version: one succeeds, 19 get VersionConflict."""
    await store.put_state("s1", make_state("base"), None)

    async def attempt(i: int) -> int | VersionConflict:
        try:
            return (await store.put_state("s1", make_state(f"t{i}"), 1)).version
        except VersionConflict as exc:
            return exc

    results = await asyncio.gather(*(attempt(i) for i in range(20)))
    winners = [r for r in results if isinstance(r, int)]
    losers = [r for r in results if isinstance(r, VersionConflict)]
    assert winners == [2]
    assert len(losers) == 19 and all(c.current_version == 2 for c in losers)
    read = await store.get_state("s1")
    assert read is not None and read.version == 2
    assert read.state in {make_state(f"t{i}") for i in range(20)}


async def test_racing_creations_get_exactly_one_winner(store: RedisStateStore) -> None:
    """20 tasks creating the same session: exactly one creates version 1."""
    results = await asyncio.gather(
        *(store.put_state("s1", make_state(f"t{i}"), None) for i in range(20)),
        return_exceptions=True,
    )
    assert sum(1 for r in results if not isinstance(r, BaseException)) == 1
    assert sum(1 for r in results if isinstance(r, VersionConflict)) == 19


def _race_in_process(url: str, prefix: str, attempts: int, barrier: Any, results: Any) -> None:
    """Child process body: race to create, then keep trying read-then-CAS writes."""

    async def run() -> tuple[list[int], int]:
        store = await RedisStateStore.open(url, key_prefix=prefix)
        won: list[int] = []
        conflicts = 0
        try:
            barrier.wait()
            for i in range(attempts):
                current = await store.get_state("shared") if i else None
                expected = None if current is None else current.version
                try:
                    stored = await store.put_state("shared", make_state(f"p{i}"), expected)
                    won.append(stored.version)
                except VersionConflict:
                    conflicts += 1
        finally:
            await store.close()
        return won, conflicts

    results.put(asyncio.run(run()))


async def test_racing_processes_get_one_winner_per_version(redis_url: str) -> None:
    """4 processes with their own stores on one server: each version is won exactly once."""
    prefix = unique_prefix()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race_in_process, args=(redis_url, prefix, 30, barrier, queue))
             for _ in range(4)]
    for proc in procs:
        proc.start()
    loop = asyncio.get_running_loop()
    outcomes = [await loop.run_in_executor(None, queue.get, True, 60) for _ in procs]
    for proc in procs:
        await loop.run_in_executor(None, proc.join, 30)
        assert proc.exitcode == 0
    won = sorted(v for versions, _ in outcomes for v in versions)
    # Every process first tries to create: exactly one of those four attempts wins.
    assert sum(1 for versions, _ in outcomes if versions[:1] == [1]) == 1
    assert won == list(range(1, len(won) + 1))
    assert sum(len(v) + c for v, c in outcomes) == 4 * 30
    check = await RedisStateStore.open(redis_url, key_prefix=prefix)
    try:
        final = await check.get_state("shared")
        assert final is not None and final.version == len(won)
    finally:
        await check.close()


# --- caches -----------------------------------------------------------------------------


async def test_summary_round_trips_and_misses_are_none(store: RedisStateStore) -> None:
    """A stored summary comes back by key (unicode intact); an unknown key gives None."""
    await store.put_summary("sha256:abc", "the user asked for a refactor — ünïcode 🙂")
    assert await store.get_summary("sha256:abc") == "the user asked for a refactor — ünïcode 🙂"
    assert await store.get_summary("sha256:other") is None


async def test_summary_cache_keeps_only_the_newest_entries(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """Beyond max_summaries entries the oldest are evicted, the newest kept, nothing leaks."""
    small = await RedisStateStore.open(redis_url, max_summaries=5, key_prefix=unique_prefix())
    try:
        for i in range(12):
            await small.put_summary(f"k{i}", f"summary {i}")
        kept = [i for i in range(12) if await small.get_summary(f"k{i}") is not None]
        assert kept == [7, 8, 9, 10, 11]
        assert await raw.hlen(f"{small.key_prefix}summary:text") == 5
        assert await raw.zcard(f"{small.key_prefix}summary:order") == 5
    finally:
        await small.close()


async def test_summary_put_of_a_cached_key_keeps_the_first_text_and_age(
    redis_url: str,
) -> None:
    """Content-addressed: a second put neither replaces the text nor makes the key younger."""
    small = await RedisStateStore.open(redis_url, max_summaries=2, key_prefix=unique_prefix())
    try:
        await small.put_summary("k", "first")
        await small.put_summary("k2", "other")
        await small.put_summary("k", "second")
        assert await small.get_summary("k") == "first"
        await small.put_summary("k3", "newest")
        assert await small.get_summary("k") is None
        assert [await small.get_summary(k) for k in ("k2", "k3")] == ["other", "newest"]
    finally:
        await small.close()


async def test_concurrent_summary_puts_stay_within_the_bound(
    redis_url: str, raw: aioredis.Redis
) -> None:
    """50 concurrent puts of distinct keys leave exactly max_summaries entries."""
    small = await RedisStateStore.open(redis_url, max_summaries=10, key_prefix=unique_prefix())
    try:
        await asyncio.gather(*(small.put_summary(f"k{i}", f"s{i}") for i in range(50)))
        assert await raw.hlen(f"{small.key_prefix}summary:text") == 10
        assert await raw.zcard(f"{small.key_prefix}summary:order") == 10
    finally:
        await small.close()


async def test_records_round_trip_per_session_and_kind(store: RedisStateStore) -> None:
    """Records are opaque bytes keyed by (session, kind); a put replaces the old bytes."""
    await store.put_record("s1", "l4-spans", b"\x00\x01binary\xff")
    await store.put_record("s1", "other", b"x")
    await store.put_record("s2", "l4-spans", b"y")
    await store.put_record("s1", "l4-spans", b"replaced\x00")
    assert await store.get_record("s1", "l4-spans") == b"replaced\x00"
    assert await store.get_record("s1", "other") == b"x"
    assert await store.get_record("s2", "l4-spans") == b"y"
    assert await store.get_record("s3", "l4-spans") is None
    assert await store.get_record("s1", "missing-kind") is None


async def test_caches_survive_a_state_delete(store: RedisStateStore) -> None:
    """Deleting the durable state leaves the session's compaction records alone."""
    await store.put_state("s1", make_state(), None)
    await store.put_record("s1", "l4-spans", b"data")
    await store.delete_state("s1")
    assert await store.get_record("s1", "l4-spans") == b"data"


# --- the proxy on Redis -----------------------------------------------------------------


def test_proxy_on_redis_injects_state_put_through_the_admin_api(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, redis_url: str,
) -> None:
    """With store.backend redis, an admin PUT lands in Redis and the next /v1/messages is
    forwarded with the durable block last in ``system``; no SQLite file is created."""
    session_id = f"redis-e2e-{uuid.uuid4().hex[:8]}"
    token = "admin-redis-e2e-token-9c1e"
    proxy = proxy_factory({"store": {"backend": "redis", "url": redis_url}}, admin_token=token)
    fact = {"fact_id": "f-redis", "content": "the cache lives in redis",
            "source_pointer": f"transcript:{session_id}:1",
            "last_confirmed_at": "2025-03-01T12:30:00Z"}

    async def admin_put() -> tuple[int, str, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.put(f"{proxy.base_url}/admin/sessions/{session_id}/state",
                     json={"facts": [fact], "pending_items": [], "retrieval_evidence": []},
                     headers={"Authorization": f"Bearer {token}"}) as resp,
        ):
            return resp.status, resp.headers.get("ETag", ""), await resp.json()

    status, etag, body = asyncio.run(admin_put())
    assert status in (200, 201), body
    assert etag == '"1"' and body["version"] == 1

    async def read_back() -> Any:
        check = await RedisStateStore.open(redis_url)
        try:
            return await check.get_state(session_id)
        finally:
            await check.close()

    stored = asyncio.run(read_back())
    assert stored is not None and stored.version == 1
    assert [f.fact_id for f in stored.state.facts] == ["f-redis"]

    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=32, system="Be brief.",
                               messages=[{"role": "user", "content": user_text("where?")}],
                               extra_headers={"x-compact-session-id": session_id})
    sent = upstream_server.upstream.message_requests[-1].body
    assert sent["system"][0] == {"type": "text", "text": "Be brief."}
    block = sent["system"][-1]
    assert len(sent["system"]) == 2 and block["type"] == "text"
    assert block["text"].startswith("<durable_context>")
    fact_line = next(line for line in block["text"].splitlines() if "fact_id=" in line)
    assert 'fact_id="f-redis"' in fact_line and "the cache lives in redis" in fact_line
    assert not (proxy.state_dir / "state.db").exists()


async def test_proxy_start_fails_cleanly_when_redis_is_unreachable(
    upstream_server: UpstreamServer,
) -> None:
    """An unreachable store.url stops start_proxy with a one-line ConfigError, no password."""
    port = free_port()
    config = Config.from_mapping({
        "listen": {"host": "127.0.0.1", "port": 0},
        "upstream": {"base_url": upstream_server.base_url},
        "store": {"backend": "redis", "url": f"redis://:pa55word@127.0.0.1:{port}/0"},
    })
    with pytest.raises(ConfigError) as info:
        await start_proxy(config)
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "connect" in message
    assert info.value.key == "store.url"
    assert "pa55word" not in message and "\n" not in message
