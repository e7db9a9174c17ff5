"""The Redis store on a real three-master Redis Cluster (started once per test session, see
``tests/proxy/conftest.py``): every key of a session lives in one hash slot, on one node, and
sessions whose slots fall on each of the three masters work, with the global indexes listing
them all. The rest of the contract runs on the cluster in test_store_contract_*.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from proxy.accounting.usage import UsageEntry
from proxy.audit.log import LayerSaving, RequestEntry, StateChange
from proxy.store import RedisStateStore
from tests.proxy.store.helpers import make_state, unique_prefix
from tests.redis_server import RedisClusterServers

NOW = datetime.now(UTC).replace(microsecond=0)
TENANT = "t0123456789abcdef"


@pytest.fixture
async def store(redis_cluster_url: str) -> AsyncIterator[RedisStateStore]:
    """A cluster store under a fresh key prefix."""
    opened = await RedisStateStore(redis_cluster_url, mode="cluster",
                                   key_prefix=unique_prefix(), audit_linger_s=0.01).open()
    yield opened
    await opened.close()


@pytest.fixture
async def nodes(redis_cluster: RedisClusterServers) -> AsyncIterator[list[aioredis.Redis]]:
    """A plain (non-cluster) client on each node, to see where keys physically are."""
    clients = [aioredis.Redis.from_url(node.url) for node in redis_cluster.nodes]
    yield clients
    for client in clients:
        await client.aclose()


def request_entry(session_id: str, index: int, *, blocked: bool = False) -> RequestEntry:
    return RequestEntry(
        at=NOW - timedelta(minutes=10) + timedelta(seconds=index), request_id=f"r-{index}",
        session_id=session_id, tenant=TENANT, route="messages", role="main",
        model="claude-sonnet-4-5", tokens_before=1000, tokens_after=400,
        layers=(LayerSaving("L1", 600),), outcome="blocked" if blocked else "forwarded",
        reason="MessageViewLimitExceeded" if blocked else None,
        hard_limit=800 if blocked else None, status=400 if blocked else 200,
        upstream_status=None if blocked else 200, usage_input=None, usage_cache_read=None,
        usage_cache_write=None, usage_output=None, duration_ms=3.0)


async def write_everything(store: RedisStateStore, session_id: str) -> None:
    """One of each thing the store keeps for a session (tenant ``TENANT``)."""
    key = f"{TENANT}/{session_id}"
    await store.put_state(key, make_state("a"), None)
    await store.put_record(key, "checkpoint:main", b"\x00bytes")
    await store.put_versioned_record(key, "checkpoint:sub", b"more")
    await store.add_usage(key, "claude-sonnet-4-5", UsageEntry(requests=1, output_tokens=5))
    await store.add_request(request_entry(session_id, 1))
    await store.add_request(request_entry(session_id, 2, blocked=True))
    await store.add_state_change(StateChange(
        at=NOW, session_id=session_id, tenant=TENANT, actor="admin-api", action="put",
        version=1, detail=("fact f1 added",)))
    assert await store.acquire_lock(key, "token", 60_000)


async def keys_by_node(nodes: list[aioredis.Redis], pattern: str) -> list[set[bytes]]:
    return [{key async for key in node.scan_iter(match=pattern, count=1000)} for node in nodes]


async def test_every_key_of_a_session_is_in_one_slot_on_one_node(
    store: RedisStateStore, nodes: list[aioredis.Redis],
) -> None:
    """State, records, record versions, usage row, audit entries, totals and changes, and a
    lock named by the session key: all hash-tagged with the session key, all in its slot,
    all on the one node serving it (the server's CLUSTER KEYSLOT agrees)."""
    session_id = f"sess-{uuid.uuid4().hex[:6]}"
    await write_everything(store, session_id)
    tag = f"{{{TENANT}/{session_id}}}"
    found = await keys_by_node(nodes, f"{store.key_prefix}{tag}*")
    holding = [keys for keys in found if keys]
    assert len(holding) == 1, "a session's keys are on more than one node"
    keys = holding[0]
    suffixes = {key.decode().removeprefix(store.key_prefix + tag) for key in keys}
    assert suffixes == {":state", ":record", ":record-versions",
                        ':usage:"claude-sonnet-4-5"', ":audit:requests", ":audit:totals",
                        ":audit:changes", ":lock"}
    slot = key_slot(f"{TENANT}/{session_id}".encode())
    for key in keys:
        assert await nodes[0].execute_command("CLUSTER", "KEYSLOT", key) == slot
    assert store.state_key(f"{TENANT}/{session_id}").encode() in keys
    assert store.audit_keys(TENANT, session_id)[0].encode() in keys


async def test_sessions_on_each_master_work_and_the_indexes_list_them_all(
    store: RedisStateStore, nodes: list[aioredis.Redis],
) -> None:
    """Three sessions chosen so their slots fall on the three masters: each is written and
    read back in full, its keys are on its own master, and the global indexes (usage rows,
    audit sessions, blocked entries, changed sessions) list all three."""
    slots = await nodes[0].execute_command("CLUSTER", "SLOTS")
    owner = {}  # port -> (first slot, last slot)
    for first, last, primary, *_ in slots:
        owner[int(primary[1])] = (int(first), int(last))
    ports = [int(node.connection_pool.connection_kwargs["port"]) for node in nodes]
    chosen: dict[int, str] = {}
    for index in range(10_000):
        session_id = f"sess-{uuid.uuid4().hex[:4]}-{index}"
        slot = key_slot(f"{TENANT}/{session_id}".encode())
        port = next(p for p, (first, last) in owner.items() if first <= slot <= last)
        chosen.setdefault(port, session_id)
        if len(chosen) == 3:
            break
    assert sorted(chosen) == sorted(ports)

    for session_id in chosen.values():
        await write_everything(store, session_id)
    for port, session_id in chosen.items():
        key = f"{TENANT}/{session_id}"
        stored = await store.get_state(key)
        assert stored is not None and stored.state == make_state("a")
        assert await store.get_record(key, "checkpoint:main") == b"\x00bytes"
        assert await store.get_versioned_record(key, "checkpoint:sub") == (1, b"more")
        requests, total = await store.session_requests(TENANT, session_id)
        assert total == 2 and [r.request_id for r in requests] == ["r-2", "r-1"]
        assert [c.action for c in await store.state_changes(TENANT, session_id)] == ["put"]
        here = nodes[ports.index(port)]
        assert await here.exists(store.state_key(key), store.audit_keys(TENANT, session_id)[0],
                                 store.usage_key(key, "claude-sonnet-4-5")) == 3

    rows = await store.usage_rows()
    assert sorted(row.session_key for row in rows) == sorted(
        f"{TENANT}/{s}" for s in chosen.values())
    summaries, total = await store.sessions(tenant=TENANT)
    assert total == 3 and {s.session_id for s in summaries} == set(chosen.values())
    assert all(s.requests == 2 and s.blocked == 1 for s in summaries)
    blocked = await store.blocked_since(NOW - timedelta(hours=1))
    assert sorted(e.session_id for e in blocked) == sorted(chosen.values())
    assert await store.trim(NOW) == 0
    assert (await store.sessions(tenant=TENANT))[1] == 3
