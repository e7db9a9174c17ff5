"""End to end: ``session.scope`` keeps two callers naming one session or opener apart."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import aiohttp
import anthropic
import pytest
from multidict import CIMultiDict

from proxy.fake_upstream import Reply
from proxy.http.tenants import TenantScope, scoped_key
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, user_text
from tests.proxy.e2e.helpers import (
    CREDENTIAL_SCOPE,
    FACT_A,
    KEY_A,
    KEY_B,
    MODEL,
    SECRET_ENV,
    SESSION,
    SUMMARY_POLICY,
    TENANT_SECRET,
    fact_state,
    forwarded,
    read_turns,
    sdk_tenant,
    send,
    summary_calls,
    tenants,
    write_state,
)

#: Only in the summary the provider wrote for tenant A.
SUMMARY_A = "SUMMARY-WRITTEN-FOR-TENANT-A-91fd"


def marked_summary() -> Reply:
    """A structured summary carrying :data:`SUMMARY_A` (the next summary call's answer)."""
    return Reply.text("\n\n".join(f"## {heading}\n{SUMMARY_A} {heading.lower()}" for heading in
                                  ("Goal", "Decisions", "Failed approaches",
                                   "State of the work", "Next step")))


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


def test_one_key_is_one_tenant_however_it_is_sent() -> None:
    """``x-api-key: K`` and ``Authorization: Bearer K`` are the same caller; ``tenant-id``
    given the bare key prints that tenant."""
    scope = TenantScope("credential", b"secret")
    as_key = scope.tenant_of(CIMultiDict({"x-api-key": KEY_A}))
    as_bearer = scope.tenant_of(CIMultiDict({"Authorization": f"Bearer {KEY_A}"}))
    assert as_key == as_bearer == scope.credential_tenant(KEY_A) == sdk_tenant(scope, KEY_A)
    assert scope.credential_tenant(KEY_B) != as_key
