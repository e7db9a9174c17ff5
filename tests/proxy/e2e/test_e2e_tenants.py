"""End to end: ``session.scope`` keeps each caller's sessions to itself.

A real proxy on loopback in front of the strict fake provider, driven by the real SDK. Two
callers naming the same session id (or sending the same opener without one) never see each
other's durable facts, sticky checkpoints or cached L4 summaries; ``serve`` refuses a shared
address without an explicit scope. Durable state is written to a tenant's store key
(``scoped_key(tenant, sid)``) through the proxy's own store file, before the first request
(so the proxy's read cache cannot hide it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
import yaml
from multidict import CIMultiDict

from compactor import DurableContextState
from proxy.fake_upstream import Reply
from proxy.http.tenants import TenantScope, scoped_key
from proxy.store import RedisStateStore, SQLiteStateStore
from tests.conftest import TEST_API_KEY, ProxyFactory, RunningProxy, UpstreamServer, user_text
from tests.proxy.e2e.test_e2e_compaction import SUMMARY_POLICY, forwarded, read_turns, summary_calls

MODEL = "claude-sonnet-4-5"
SECRET_ENV = "COMPACT_PROXY_SESSION_SECRET"
#: The HMAC secret of scope ``credential`` in these tests (never stored or logged either).
TENANT_SECRET = "tenant-hmac-secret-e2e-3f9d61ab07c2"
#: Two callers' API keys.
KEY_A = "sk-ant-api03-tenant-a-key-aa11bb22cc33dd44"
KEY_B = "sk-ant-api03-tenant-b-key-ee55ff6677889900"
#: What must never be found in a store file, a Redis value or a log line.
CREDENTIALS = (KEY_A, KEY_B, TEST_API_KEY, TENANT_SECRET)
SESSION = "shared-session-1"
#: Only in tenant A's durable state.
FACT_A = "DURABLE-FACT-OF-TENANT-A-6c2e"
#: Only in the summary the provider wrote for tenant A.
SUMMARY_A = "SUMMARY-WRITTEN-FOR-TENANT-A-91fd"
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


def marked_summary() -> Reply:
    """A structured summary carrying :data:`SUMMARY_A` (the next summary call's answer)."""
    return Reply.text("\n\n".join(f"## {heading}\n{SUMMARY_A} {heading.lower()}" for heading in
                                  ("Goal", "Decisions", "Failed approaches",
                                   "State of the work", "Next step")))


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


def store_keys(db_path: str) -> dict[str, list[str]]:
    """Every key of the SQLite store's three tables (read-only)."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return {
            "state": [r[0] for r in conn.execute("SELECT session_id FROM session_state")],
            "record": [r[0] for r in conn.execute("SELECT session_id FROM session_record")],
            "summary": [r[0] for r in conn.execute("SELECT key FROM summary_cache")],
        }
    finally:
        conn.close()


def assert_isolated(upstream_server: UpstreamServer, first: Any, second: Any,
                    credentials: tuple[str, str]) -> None:
    """The shared checks of the two scoped tests: A's request saw its own fact and summary; B's
    identical history made its own summary call and carries neither of A's."""
    layers_a = first.headers["x-compact-layers"].split(",")
    layers_b = second.headers["x-compact-layers"].split(",")
    assert "L4" in layers_a and "L4" in layers_b
    assert first.headers["x-compact-session-id"] == SESSION
    assert second.headers["x-compact-session-id"] == SESSION
    calls = summary_calls(upstream_server)
    assert len(calls) == 2, "the second tenant's identical history must be summarised anew"
    assert [c.api_key for c in calls] == list(credentials)
    sent_a, sent_b = forwarded(upstream_server)
    assert FACT_A in json.dumps(sent_a.get("system"))
    assert SUMMARY_A in json.dumps(sent_a["messages"])
    assert FACT_A not in json.dumps(sent_b)
    assert SUMMARY_A not in json.dumps(sent_b)
    assert sent_b["messages"][0] == sent_a["messages"][0]
    assert len(sent_b["messages"]) == len(sent_a["messages"])


def test_two_api_keys_naming_one_session_never_share_facts_checkpoints_or_summaries(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scope ``credential``: A's durable fact, A's sticky checkpoint and A's cached summary
    never reach B's forwarded request, though B names the same session and sends the same
    history; A itself still gets all three back (the cache and checkpoint work within a
    tenant); every store key carries a tenant."""
    monkeypatch.setenv(SECRET_ENV, TENANT_SECRET)
    proxy = proxy_factory(CREDENTIAL_SCOPE)
    scope = tenants(proxy)
    tenant_a, tenant_b = sdk_tenant(scope, KEY_A), sdk_tenant(scope, KEY_B)
    assert tenant_a != tenant_b
    write_state(proxy, scoped_key(tenant_a, SESSION), fact_state(FACT_A, SESSION))
    history = read_turns(12)
    upstream_server.upstream.push(marked_summary())  # A's summary call gets the marked one
    header = {"x-compact-session-id": SESSION}
    first = send(proxy, history, api_key=KEY_A, headers=header)
    second = send(proxy, history, api_key=KEY_B, headers=header)
    assert_isolated(upstream_server, first, second, (KEY_A, KEY_B))

    again = send(proxy, history, api_key=KEY_A, headers=header)
    assert len(summary_calls(upstream_server)) == 2  # A's own cache / checkpoint answered
    sent_a, _, sent_again = forwarded(upstream_server)
    assert sent_again["messages"] == sent_a["messages"]
    assert FACT_A in json.dumps(sent_again["system"])
    assert again.headers["x-compact-layers"] == first.headers["x-compact-layers"]

    keys = store_keys(proxy.config.store.path)
    assert keys["state"] == [scoped_key(tenant_a, SESSION)]
    assert keys["record"] and keys["summary"]
    for key in keys["record"] + keys["summary"]:
        assert key.startswith((f"{tenant_a}/", f"{tenant_b}/")), f"{key!r} has no tenant"
    assert {k.split("/", 1)[0] for k in keys["record"]} == {tenant_a, tenant_b}
    assert {k.split("/", 1)[0] for k in keys["summary"]} == {tenant_a, tenant_b}


def test_front_proxy_header_scope_separates_users_and_refuses_a_request_without_it(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scope ``header:x-forwarded-user``: alice and bob share one API key and one session id,
    and are still kept apart; a request without the header is a 401 ``authentication_error``
    in the Anthropic error shape, and nothing is forwarded."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    proxy = proxy_factory({"session": {"scope": "header:X-Forwarded-User"},
                           "compaction": SUMMARY_POLICY})
    assert proxy.config.session.scope == "header:x-forwarded-user"
    scope = tenants(proxy)
    alice, bob = scope.header_tenant("alice"), scope.header_tenant("bob")
    write_state(proxy, scoped_key(alice, SESSION), fact_state(FACT_A, SESSION))
    history = read_turns(12)
    upstream_server.upstream.push(marked_summary())
    first = send(proxy, history, headers={"x-compact-session-id": SESSION,
                                          "x-forwarded-user": "alice"})
    second = send(proxy, history, headers={"x-compact-session-id": SESSION,
                                           "x-forwarded-user": "bob"})
    assert_isolated(upstream_server, first, second, (TEST_API_KEY, TEST_API_KEY))
    keys = store_keys(proxy.config.store.path)
    for key in keys["record"] + keys["summary"]:
        assert key.startswith((f"{alice}/", f"{bob}/")), f"{key!r} has no tenant"

    seen = len(upstream_server.upstream.requests)
    for headers in ({"x-compact-session-id": SESSION}, {"x-forwarded-user": ""}):
        client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY,
                                     max_retries=0)
        with client, pytest.raises(anthropic.AuthenticationError) as caught:
            client.messages.create(model=MODEL, max_tokens=16, messages=history,
                                   extra_headers=headers)
        assert caught.value.status_code == 401
        body = caught.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert body["error"]["type"] == "authentication_error"
        # It says how Claude Code sends the header (which it would otherwise retry quietly).
        assert body["error"]["message"] == (
            "the x-forwarded-user header is required (session.scope header:x-forwarded-user); "
            "Claude Code sends it with ANTHROPIC_CUSTOM_HEADERS=\"x-forwarded-user: <name>\"")
    assert len(upstream_server.upstream.requests) == seen


async def test_scope_credential_without_any_credential_is_a_401_never_forwarded(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``x-api-key`` and no ``Authorization``: 401 ``authentication_error``, not forwarded
    (there is no tenant to keep its session under)."""
    monkeypatch.setenv(SECRET_ENV, TENANT_SECRET)
    proxy = proxy_factory(CREDENTIAL_SCOPE)
    body = {"model": MODEL, "max_tokens": 8,
            "messages": [{"role": "user", "content": user_text("hi")}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/v1/messages", json=body,
                             headers={"anthropic-version": "2023-06-01"}) as resp:
            assert resp.status == 401
            answer = await resp.json()
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "authentication_error"
    assert upstream_server.upstream.requests == []


@pytest.mark.parametrize("scope", ["credential", "none"])
def test_the_same_opener_from_two_keys_is_two_sessions_unless_scope_is_none(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
    monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    """No session headers, the same first message and ``system``: the derived ``conv-`` ids
    of two API keys differ under ``credential`` (each stable for its key) and are one id under
    ``none``, as before tenants."""
    monkeypatch.setenv(SECRET_ENV, TENANT_SECRET)
    proxy = proxy_factory({"session": {"scope": scope, "secret_env": SECRET_ENV}})
    opener = [{"role": "user", "content": user_text("the same first message")}]
    ids = [send(proxy, opener, api_key=key, system="You are helpful.")
           .headers["x-compact-session-id"] for key in (KEY_A, KEY_B, KEY_A)]
    assert all(sid.startswith("conv-") for sid in ids)
    assert ids[0] == ids[2]
    if scope == "credential":
        assert ids[0] != ids[1]
    else:
        assert ids[0] == ids[1]
    assert len(forwarded(upstream_server)) == 3


# -- serve ------------------------------------------------------------------------------


def serve_env(**extra: str) -> dict[str, str]:
    """The environment of a ``serve`` subprocess: no config, key or secret from the shell."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("COMPACT_PROXY_CONFIG", SECRET_ENV) and not k.startswith("ANTHROPIC_")}
    env.update(extra)
    return env


def serve_config(tmp_path: Path, upstream_url: str, host: str,
                 session: Mapping[str, Any] | None = None) -> Path:
    """A ``serve`` config on ``host`` port 0 (JSON logs), state under ``tmp_path``."""
    state = tmp_path / "state"
    mapping: dict[str, Any] = {
        "listen": {"host": host, "port": 0},
        "upstream": {"base_url": upstream_url},
        "store": {"path": str(state / "state.db")},
        "sources": {"transcript_root": str(state / "t"), "artifact_root": str(state / "a")},
        "summary": {"enabled": False},
        "logging": {"format": "json", "level": "info"},
    }
    if session is not None:
        mapping["session"] = dict(session)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    return path


def run_serve(config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m proxy.cli serve``, expected to exit by itself."""
    return subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)],
                          env=serve_env(**env), capture_output=True, text=True, timeout=60,
                          cwd=config.parent)


def test_serve_on_a_shared_address_without_a_scope_exits_2_with_one_line(
    tmp_path: Path, upstream_server: UpstreamServer
) -> None:
    """``0.0.0.0`` without ``session.scope``: exit 2, one line on stderr naming the key,
    nothing served (no state directory either)."""
    result = run_serve(serve_config(tmp_path, upstream_server.base_url, "0.0.0.0"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("config error: session.scope:")
    assert "0.0.0.0" in lines[0]
    assert not (tmp_path / "state").exists()


@pytest.mark.slow
def test_serve_with_scope_credential_and_no_secret_exits_2_naming_secret_env(
    tmp_path: Path, upstream_server: UpstreamServer
) -> None:
    """``scope: credential`` with its secret variable unset (and then empty): exit 2, one line
    naming ``session.secret_env`` and the variable."""
    config = serve_config(tmp_path, upstream_server.base_url, "0.0.0.0",
                          {"scope": "credential", "secret_env": SECRET_ENV})
    for env in ({}, {SECRET_ENV: ""}):
        result = run_serve(config, **env)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("config error: session.secret_env:")
        assert SECRET_ENV in lines[0]


@pytest.mark.slow
def test_serve_on_loopback_without_a_scope_starts_with_scope_none(
    tmp_path: Path, upstream_server: UpstreamServer
) -> None:
    """``127.0.0.1`` port 0 without ``session.scope``: it starts (``proxy_started``), answers
    ``/healthz``, serves a request as tenant ``none`` and exits 0 on SIGTERM."""
    config = serve_config(tmp_path, upstream_server.base_url, "127.0.0.1")
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)],
        env=serve_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path)
    lines: list[str] = []
    started = threading.Event()
    port: list[int] = []

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "proxy_started":
                port.append(int(event["port"]))
                started.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert started.wait(30), f"serve did not start: {lines[-5:]} rc={process.poll()}"
        base_url = f"http://127.0.0.1:{port[0]}"
        with urllib.request.urlopen(f"{base_url}/healthz", timeout=5) as resp:
            assert json.loads(resp.read()) == {"status": "ok", "store": "ok"}
        raw = send(base_url, [{"role": "user", "content": user_text("hello")}])
        assert raw.http_response.status_code == 200
        request_id = raw.headers["x-compact-request-id"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        reader.join(timeout=10)
    assert process.returncode == 0, lines[-5:]
    events = [json.loads(line) for line in lines if line.startswith("{")]
    completed = [e for e in events
                 if e.get("event") == "request_completed" and e.get("request_id") == request_id]
    assert len(completed) == 1 and completed[0]["tenant"] == "none"
    assert all(TEST_API_KEY not in line for line in lines)


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


def test_one_key_is_one_tenant_however_it_is_sent() -> None:
    """``x-api-key: K`` and ``Authorization: Bearer K`` are the same caller; ``tenant-id``
    given the bare key prints that tenant."""
    scope = TenantScope("credential", b"secret")
    as_key = scope.tenant_of(CIMultiDict({"x-api-key": KEY_A}))
    as_bearer = scope.tenant_of(CIMultiDict({"Authorization": f"Bearer {KEY_A}"}))
    assert as_key == as_bearer == scope.credential_tenant(KEY_A) == sdk_tenant(scope, KEY_A)
    assert scope.credential_tenant(KEY_B) != as_key
