"""Shared by the end-to-end tests: request builders, what the fake provider recorded, and the
two callers (API keys, scope secret, durable state in a tenant's store key) of the tenant tests.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

import aiohttp
import anthropic
from multidict import CIMultiDict

from compactor import DurableContextState
from proxy.fake_upstream import is_summarizer_request
from proxy.http.tenants import TenantScope
from proxy.store import RedisStateStore, SQLiteStateStore
from tests.conftest import TEST_API_KEY, RunningProxy, UpstreamServer, user_text

MODEL = "claude-sonnet-4-5"
LOW_THRESHOLDS = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
                  "max_tool_result_tokens": 200, "keep_recent_messages": 4,
                  "summary_keep_recent": 4}
SUMMARY_POLICY = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
                  "max_tool_result_tokens": 2000, "keep_recent_messages": 40,
                  "summary_keep_recent": 4}


def read_turns(count: int, result_chars: int = 3000, tag: str = "") -> list[Any]:
    """A first user message, then ``count`` Read calls with large results, then a question;
    with ``tag``, every text is the tag's own (no summary of another conversation fits)."""
    task = f"fix the parser {tag}" if tag else "fix the parser"
    folder, module = (f"/src/{tag}", f"{tag} module") if tag else ("/src", "module")
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_text(task)}]
    for index in range(count):
        tool_id = f"toolu_{index:04d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading file {index}."},
            {"type": "tool_use", "id": tool_id, "name": "Read",
             "input": {"file_path": f"{folder}/mod{index}.py"}},
        ]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id,
             "content": f"# {module} {index}\n" + "line of code\n" * (result_chars // 13)},
        ]})
    messages.append({"role": "assistant", "content": "I have read everything."})
    messages.append({"role": "user", "content": user_text("now what?")})
    return messages


def forwarded(upstream_server: UpstreamServer) -> list[dict[str, Any]]:
    """The bodies of the /v1/messages calls the provider got that were not summary calls."""
    return [r.body for r in upstream_server.upstream.message_requests
            if not is_summarizer_request(r.body)]


def summary_calls(upstream_server: UpstreamServer) -> list[Any]:
    """The recorded summary calls (the summarizer marker in ``system`` or the last user turn)."""
    return [r for r in upstream_server.upstream.message_requests
            if is_summarizer_request(r.body)]


def admin_put(proxy: RunningProxy, session_id: str, state: dict[str, Any]) -> Any:
    """PUT a durable state through the admin API over HTTP (a fresh state: no If-Match)."""

    async def put() -> Any:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"{proxy.base_url}/admin/sessions/{session_id}/state",
                                json=state,
                                headers={"Authorization": f"Bearer {proxy.admin_token}"}) as resp:
                assert resp.status in (200, 201), await resp.text()
                return await resp.json()

    return asyncio.run(put())


# -- two callers ------------------------------------------------------------------------


SECRET_ENV = "COMPACT_PROXY_SESSION_SECRET"
#: The HMAC secret of scope ``credential`` in these tests (never stored or logged either).
TENANT_SECRET = "tenant-hmac-secret-e2e-3f9d61ab07c2"
#: Two callers' API keys.
KEY_A = "sk-ant-api03-tenant-a-key-aa11bb22cc33dd44"
KEY_B = "sk-ant-api03-tenant-b-key-ee55ff6677889900"
SESSION = "shared-session-1"
#: Only in tenant A's durable state.
FACT_A = "DURABLE-FACT-OF-TENANT-A-6c2e"
CREDENTIAL_SCOPE = {"session": {"scope": "credential", "secret_env": SECRET_ENV},
                    "compaction": SUMMARY_POLICY}


def fact_state(marker: str, session_id: str) -> DurableContextState:
    """A durable state with one fact carrying ``marker``."""
    return DurableContextState.from_dict({
        "facts": [{"fact_id": "f1", "content": f"{marker}: the release branch is frozen",
                   "source_pointer": f"transcript:{session_id}:1",
                   "last_confirmed_at": "2026-01-01T00:00:00Z"}],
        "pending_items": [], "retrieval_evidence": []})


def write_state(proxy: RunningProxy, key: str, state: DurableContextState) -> None:
    """Put ``state`` under the store key ``key`` of the proxy's own store (SQLite file or
    Redis), from outside the proxy, as an operator's tool would."""
    store_config = proxy.config.store

    async def put() -> None:
        store: SQLiteStateStore | RedisStateStore
        if store_config.backend == "redis":
            assert store_config.url is not None
            store = RedisStateStore(store_config.url)
        else:
            store = SQLiteStateStore(store_config.path)
        await store.open()
        try:
            await store.put_state(key, state, None)
        finally:
            await store.close()

    asyncio.run(put())


def tenants(proxy: RunningProxy) -> TenantScope:
    """The proxy's scope, computed in-process from its config and this environment."""
    return TenantScope.from_config(proxy.config.session, os.environ)


def sdk_tenant(scope: TenantScope, api_key: str) -> str:
    """The tenant of the real SDK's requests with ``api_key``: computed from the very
    credential headers the SDK sends (this SDK sends ``Authorization: Bearer <key>``)."""
    client = anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key=api_key, max_retries=0)
    with client:
        return scope.tenant_of(CIMultiDict(client.auth_headers))


def send(proxy: RunningProxy | str, messages: list[Any], *, api_key: str = TEST_API_KEY,
         headers: Mapping[str, str] | None = None, system: str | None = None) -> Any:
    """One ``/v1/messages`` call through the real SDK (to a proxy or a base URL); the raw
    response."""
    base_url = proxy if isinstance(proxy, str) else proxy.base_url
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
    extra: dict[str, Any] = {"extra_headers": dict(headers or {})}
    if system is not None:
        extra["system"] = system
    with client:
        return client.messages.with_raw_response.create(model=MODEL, max_tokens=32,
                                                        messages=messages, **extra)


def redis_values(client: Any, key: bytes) -> list[bytes]:
    """Every value stored under ``key``, read plainly by its type."""
    kind = client.type(key).decode()
    if kind == "string":
        return [client.get(key) or b""]
    if kind == "hash":
        return [part for pair in client.hgetall(key).items() for part in pair]
    if kind == "list":
        return list(client.lrange(key, 0, -1))
    if kind == "set":
        return list(client.smembers(key))
    if kind == "zset":
        return list(client.zrange(key, 0, -1))
    if kind == "stream":
        return [json.dumps([[i.decode(), {k.decode(): v.decode() for k, v in f.items()}]
                            for i, f in client.xrange(key)]).encode()]
    return []
