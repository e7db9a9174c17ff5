"""What only the Redis state store does, against a real ``redis-server``: the key layout and
prefixes, corrupt values, connection failures and URL redaction, and the proxy serving from
it end to end. The StateStore contract it shares with SQLite is in test_store_contract_*.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
import redis.asyncio as aioredis

from proxy.accounting.usage import UsageEntry
from proxy.cli.commands import main as cli_main
from proxy.config import Config, ConfigError
from proxy.server.app import start_proxy
from proxy.sources.migrate import migrate_redis_layout
from proxy.store import CorruptStateError, RedisStateStore, StoreError
from proxy.store.redis import redacted_url
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, user_text
from tests.proxy.store.helpers import make_state, unique_prefix
from tests.redis_server import free_port


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStateStore]:
    """An opened store under a fresh key prefix, closed after the test."""
    opened = await RedisStateStore(redis_url, key_prefix=unique_prefix(),
                                   audit_linger_s=0.01).open()
    yield opened
    await opened.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain redis-py client on the same server, to look at and tamper with keys."""
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


# --- the server -------------------------------------------------------------------------


async def test_state_is_stored_as_a_hash_of_version_json_and_timestamp(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """The state key holds version, the canonical JSON of to_dict() and an ISO updated_at."""
    written = await store.put_state("s1", make_state("a", facts=2), None)
    fields = await raw.hgetall(f"{store.key_prefix}{{s1}}:state")
    assert set(fields) == {b"version", b"state", b"updated_at"}
    assert fields[b"version"] == b"1"
    assert json.loads(fields[b"state"]) == make_state("a", facts=2).to_dict()
    updated_at = fields[b"updated_at"]
    assert isinstance(updated_at, bytes)
    assert datetime.fromisoformat(updated_at.decode()) == written.updated_at


async def test_key_prefixes_separate_deployments(redis_url: str) -> None:
    """Two stores with different prefixes on one server share nothing."""
    a = await RedisStateStore(redis_url, key_prefix=unique_prefix()).open()
    b = await RedisStateStore(redis_url, key_prefix=unique_prefix()).open()
    try:
        await a.put_state("s1", make_state("a"), None)
        await a.put_summary("k", "text")
        assert await b.get_state("s1") is None
        assert await b.get_summary("k") is None
        assert (await b.put_state("s1", make_state("b"), None)).version == 1
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
        await raw.hset(f"{store.key_prefix}{{bad}}:state", name, value)
    with pytest.raises(CorruptStateError) as info:
        await store.get_state("bad")
    assert info.value.session_id == "bad"
    assert detail in info.value.detail


async def test_state_key_of_another_type_is_corrupt(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """A plain string under the state key is reported as corrupt by get and put alike."""
    await raw.set(f"{store.key_prefix}{{bad}}:state", "hello")
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
    await raw.hset(f"{store.key_prefix}{{bad}}:state",
                   mapping={"version": "x", "state": "{}", "updated_at": "now"})
    with pytest.raises(CorruptStateError, match="version"):
        await store.put_state("bad", make_state(), 1)
    assert await raw.hget(f"{store.key_prefix}{{bad}}:state", "version") == b"x"
    assert await store.delete_state("bad") is True
    assert (await store.put_state("bad", make_state(), None)).version == 1


async def test_hash_without_a_version_is_never_overwritten(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """A create over a state hash lacking its version fails as corrupt and keeps the hash."""
    await raw.hset(f"{store.key_prefix}{{bad}}:state", "state", "{}")
    with pytest.raises(CorruptStateError):
        await store.put_state("bad", make_state(), None)
    assert await raw.hgetall(f"{store.key_prefix}{{bad}}:state") == {b"state": b"{}"}


async def test_usage_rows_are_hashes_of_counters_indexed_by_a_set(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """A usage row is a hash of every counter plus last_seen under {<session>}:usage:"<model>"
    (in the session's slot), and the pair is a member of {usage}:usage:rows."""
    await store.add_usage("t0123/sess:1", "claude-opus-4-5", UsageEntry(requests=2,
                                                                        output_tokens=7))
    member = '["t0123/sess:1","claude-opus-4-5"]'
    assert await raw.smembers(f"{store.key_prefix}{{usage}}:usage:rows") == {member.encode()}
    fields = await raw.hgetall(f'{store.key_prefix}{{t0123/sess:1}}:usage:"claude-opus-4-5"')
    assert set(fields) == {name.encode() for name in UsageEntry.field_names()} | {b"last_seen"}
    assert (fields[b"requests"], fields[b"output_tokens"], fields[b"input_tokens"]) == (
        b"2", b"7", b"0")
    seen = fields[b"last_seen"]
    assert isinstance(seen, bytes) and datetime.fromisoformat(seen.decode()).tzinfo is not None


async def test_corrupt_usage_rows_raise_instead_of_returning_garbage(
    store: RedisStateStore, raw: aioredis.Redis
) -> None:
    """A counter that is not an integer, a bad last_seen, a key of another type or a bad index
    member is a CorruptStateError; a row whose hash is gone is left out."""
    await store.add_usage("s1", "m", UsageEntry(requests=1))
    row = store.usage_key("s1", "m")
    await raw.hset(row, "requests", "lots")
    with pytest.raises(CorruptStateError, match="requests is not an integer"):
        await store.usage_rows()
    with pytest.raises(CorruptStateError, match="not an integer"):
        await store.add_usage("s1", "m", UsageEntry(requests=1))
    await raw.hset(row, mapping={"requests": "1", "last_seen": "yesterday"})
    with pytest.raises(CorruptStateError, match="last_seen"):
        await store.usage_rows()
    await raw.delete(row)
    assert await store.usage_rows() == []
    await raw.set(row, "x")
    with pytest.raises(CorruptStateError, match="not a hash"):
        await store.add_usage("s1", "m", UsageEntry(requests=1))
    await raw.sadd(store.usage_index_key, "not json")
    with pytest.raises(CorruptStateError, match="usage index"):
        await store.usage_rows()


async def test_a_versions_read_survives_a_server_that_forgot_its_scripts(
        store: RedisStateStore, raw: aioredis.Redis) -> None:
    """The versions read calls EVALSHA itself (every request makes it); a server restarted
    since, which no longer has the script (NOSCRIPT), gets it loaded and the read made."""
    from proxy.store import RecordFetch

    await store.put_versioned_record("s", "calibration:m", b"taught")
    fetch = RecordFetch("calibration:")
    assert (await store.session_versions("s", fetch)).fetched == {"calibration:m": (1, b"taught")}
    await raw.script_flush()
    assert (await store.session_versions("s", fetch)).fetched == {"calibration:m": (1, b"taught")}


async def test_unreachable_server_raises_a_clean_store_error() -> None:
    """Opening a store on a port nobody listens on: StoreError naming the address, no secret."""
    port = free_port()
    with pytest.raises(StoreError) as info:
        await RedisStateStore(f"redis://admin:s3cret-pw@127.0.0.1:{port}/0",
                              timeout_s=2).open()
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "cannot connect" in message
    assert "s3cret-pw" not in message
    assert "Traceback" not in message and "\n" not in message


async def test_rejected_password_is_not_in_the_error(redis_url: str) -> None:
    """A server refusing the URL's credentials gives a StoreError without the password."""
    url = redis_url.replace("redis://", "redis://nobody:wr0ng-pw@")
    with pytest.raises(StoreError) as info:
        await RedisStateStore(url, key_prefix=unique_prefix()).open()
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


# --- the proxy on Redis -----------------------------------------------------------------


def test_proxy_on_redis_injects_state_put_through_the_admin_api(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, redis_url: str,
) -> None:
    """With store.backend redis, an admin PUT lands in Redis and the next /v1/messages is
    forwarded with the durable block last in ``system``; no SQLite file is created."""
    session_id = f"redis-e2e-{uuid.uuid4().hex[:8]}"
    token = "admin-redis-e2e-token-9c1e3a5b7d2f4e6c"
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
        check = await RedisStateStore(redis_url).open()
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


# --- the key layout before hash tags ----------------------------------------------------


async def test_migration_moves_old_layout_states_keeping_their_versions(
    store: RedisStateStore, raw: aioredis.Redis,
) -> None:
    """Old ``<prefix>state:<session>`` hashes move to ``<prefix>{<session>}:state`` with their
    version and time; a session already written under the new key keeps both (reported);
    running it again moves nothing more."""
    old = {"version": "7", "state": json.dumps(make_state("old").to_dict()),
           "updated_at": "2025-03-01T12:30:00+00:00"}
    for session_key in ("sess-1", "t0123456789abcdef/sess:2", "taken"):
        await raw.hset(f"{store.key_prefix}state:{session_key}", mapping=old)
    await store.put_state("taken", make_state("new"), None)

    done = await migrate_redis_layout(store)
    assert (done.moved, done.kept) == (2, ("taken",))
    for session_key in ("sess-1", "t0123456789abcdef/sess:2"):
        stored = await store.get_state(session_key)
        assert stored is not None and stored.version == 7
        assert stored.state == make_state("old")
        assert stored.updated_at.isoformat() == "2025-03-01T12:30:00+00:00"
        assert not await raw.exists(f"{store.key_prefix}state:{session_key}")
    taken = await store.get_state("taken")
    assert taken is not None and taken.version == 1 and taken.state == make_state("new")
    assert await raw.exists(f"{store.key_prefix}state:taken")
    again = await migrate_redis_layout(store)
    assert (again.moved, again.kept) == (0, ("taken",))


def test_migrate_redis_keys_command(redis_url: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``compact-proxy migrate-redis-keys`` moves the default prefix's old states and says
    how many; on a SQLite store it refuses with exit code 2."""
    import redis

    session_key = f"cli-migrated-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    try:
        client.hset(f"compact-proxy:state:{session_key}", mapping={
            "version": "3", "state": json.dumps(make_state("cli").to_dict()),
            "updated_at": "2025-03-01T12:30:00+00:00"})
        config = tmp_path / "config.yaml"
        config.write_text(f"upstream:\n  base_url: http://127.0.0.1:9\n"
                          f"store:\n  backend: redis\n  url: {redis_url}\n", encoding="utf-8")
        assert cli_main(["migrate-redis-keys", "--config", str(config)]) == 0
        assert "moved 1 durable state(s)" in capsys.readouterr().out
        assert client.hget(f"compact-proxy:{{{session_key}}}:state", "version") == b"3"
        sqlite_config = tmp_path / "sqlite.yaml"
        sqlite_config.write_text("upstream:\n  base_url: http://127.0.0.1:9\n"
                                 "store:\n  backend: sqlite\n", encoding="utf-8")
        assert cli_main(["migrate-redis-keys", "--config", str(sqlite_config)]) == 2
        assert "not redis" in capsys.readouterr().err
    finally:
        client.delete(f"compact-proxy:{{{session_key}}}:state")
        client.close()
