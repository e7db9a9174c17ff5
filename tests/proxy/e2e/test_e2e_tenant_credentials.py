"""End to end: after two tenants' traffic no credential is in the SQLite files, Redis or logs."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest

from proxy.http.tenants import scoped_key
from tests.conftest import TEST_API_KEY, ProxyFactory, RunningProxy, UpstreamServer, user_text
from tests.proxy.e2e.helpers import (
    CREDENTIAL_SCOPE,
    FACT_A,
    KEY_A,
    KEY_B,
    MODEL,
    SECRET_ENV,
    SESSION,
    TENANT_SECRET,
    fact_state,
    read_turns,
    redis_values,
    sdk_tenant,
    summary_calls,
    tenants,
    write_state,
)

#: What must never be found in a store file, a Redis value or a log line.
CREDENTIALS = (KEY_A, KEY_B, TEST_API_KEY, TENANT_SECRET)


# -- hygiene: no credential in the store ------------------------------------------------


def tenant_workload(proxy: RunningProxy, upstream_server: UpstreamServer) -> tuple[str, str]:
    """Both keys through every path that writes the store (durable state read, an L4
    summary, a sticky checkpoint, count_tokens, streaming, a derived id) plus a refused
    request; returns the two tenants."""
    scope = tenants(proxy)
    tenant_a, tenant_b = sdk_tenant(scope, KEY_A), sdk_tenant(scope, KEY_B)
    for tenant in (tenant_a, tenant_b):
        write_state(proxy, scoped_key(tenant, SESSION), fact_state(FACT_A, SESSION))
    history = read_turns(12)
    header = {"x-compact-session-id": SESSION}
    for key in (KEY_A, KEY_B):
        client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
        with client:
            client.messages.create(model=MODEL, max_tokens=16, messages=history,
                                   extra_headers=header)
            grown = [*history, {"role": "assistant", "content": "Done."},
                     {"role": "user", "content": user_text("and then?")}]
            client.messages.create(model=MODEL, max_tokens=16, messages=grown,
                                   extra_headers=header)
            client.messages.count_tokens(model=MODEL, messages=grown, extra_headers=header)
            with client.messages.stream(model=MODEL, max_tokens=16,
                                        messages=read_turns(13)) as stream:
                stream.get_final_message()
            # The same key as x-api-key instead of a bearer token.
            client.messages.create(model=MODEL, max_tokens=16, messages=read_turns(11),
                                   extra_headers={"x-api-key": key, "authorization": ""})
    assert len(summary_calls(upstream_server)) >= 4
    return tenant_a, tenant_b


def assert_no_credential(blob: bytes, where: str) -> None:
    """None of :data:`CREDENTIALS` (nor a bearer form of one) is in ``blob``."""
    for secret in CREDENTIALS:
        for form in (secret, f"Bearer {secret}"):
            assert form.encode() not in blob, f"{where} holds {secret[:12]}..."


def test_no_credential_in_the_sqlite_files_after_tenant_traffic(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
    monkeypatch: pytest.MonkeyPatch, proxy_log: Path
) -> None:
    """After both keys' traffic, the bytes of ``state.db``, ``-wal`` and ``-shm`` hold no API
    key and not the HMAC secret (while they do hold the tenants' keys and state: the scan
    reads the data); nor does any log line."""
    monkeypatch.setenv(SECRET_ENV, TENANT_SECRET)
    proxy = proxy_factory(CREDENTIAL_SCOPE)
    tenant_a, tenant_b = tenant_workload(proxy, upstream_server)
    db = Path(proxy.config.store.path)
    files = [p for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"))
             if p.exists()]
    assert db in files
    everything = b""
    for path in files:
        data = path.read_bytes()
        assert_no_credential(data, path.name)
        everything += data
    assert tenant_a.encode() in everything and tenant_b.encode() in everything
    assert FACT_A.encode() in everything
    assert_no_credential(proxy_log.read_bytes(), "the proxy log")


def test_no_credential_in_any_redis_key_after_tenant_traffic(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
    monkeypatch: pytest.MonkeyPatch, redis_url: str, proxy_log: Path
) -> None:
    """``store.backend: redis``, the same traffic: ``SCAN`` every key of the server, ``DUMP``
    each (with RDB compression off, so the dump is plain) and read its values by type: no API
    key and no HMAC secret in any key name, dump or value; the tenants' keys are there."""
    import redis

    monkeypatch.setenv(SECRET_ENV, TENANT_SECRET)
    proxy = proxy_factory({**CREDENTIAL_SCOPE, "store": {"backend": "redis", "url": redis_url}})
    tenant_a, tenant_b = tenant_workload(proxy, upstream_server)
    client = redis.Redis.from_url(redis_url)
    try:
        compression = str(client.config_get("rdbcompression")["rdbcompression"])
        client.config_set("rdbcompression", "no")
        try:
            keys = list(client.scan_iter(count=500))
            dumps = {key: client.dump(key) or b"" for key in keys}
        finally:
            client.config_set("rdbcompression", compression)
        values = {key: redis_values(client, key) for key in keys}
    finally:
        client.close()
    assert keys
    for key in keys:
        assert_no_credential(key, f"key name {key!r}")
        assert_no_credential(dumps[key], f"DUMP of {key!r}")
        for value in values[key]:
            assert_no_credential(value, f"a value of {key!r}")
    for tenant in (tenant_a, tenant_b):
        assert any(tenant.encode() in key for key in keys), f"no key of tenant {tenant}"
    state_key = b"{" + scoped_key(tenant_a, SESSION).encode() + b"}:state"
    state_keys = [key for key in keys if key.endswith(state_key)]
    assert state_keys and all(FACT_A.encode() in dumps[key] for key in state_keys)
    assert_no_credential(proxy_log.read_bytes(), "the proxy log")
