"""The integrity of durable state through the real admin API, on a real SQLite file and a real
``redis-server`` (issue #31, item 6): a session's versions are never reused (a state deleted and
created again continues the numbering, so a stale ``If-Match`` gets 409, never an overwrite),
and a state write and its change record are one transaction (when the record cannot be kept,
nothing is written)."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import redis

from tests.conftest import ProxyFactory, RunningProxy
from tests.proxy.admin.test_console_http import UI, Browserless

TOKEN = "integrity-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BACKENDS = ["sqlite", "redis"]


def body(content: str) -> dict[str, Any]:
    """An admin PUT body of one fact."""
    return {"facts": [{"fact_id": "f1", "content": content,
                       "source_pointer": "transcript:integrity:1",
                       "last_confirmed_at": "2025-03-01T12:00:00Z"}],
            "pending_items": [], "retrieval_evidence": []}


@dataclass
class Admin:
    """The admin API of one running proxy, on one store backend, for one fresh session."""

    proxy: RunningProxy
    backend: str
    http: aiohttp.ClientSession
    sid: str
    redis_url: str | None = None

    @property
    def url(self) -> str:
        return f"{self.proxy.base_url}/admin/sessions/{self.sid}/state"

    async def call(self, method: str, *, if_match: int | None = None,
                   content: str | None = None) -> tuple[int, Any, str | None]:
        """One call on the session's state: (status, JSON body or None, ETag)."""
        headers = dict(AUTH)
        if if_match is not None:
            headers["If-Match"] = f'"{if_match}"'
        async with self.http.request(method, self.url, headers=headers,
                                     json=None if content is None else body(content)) as resp:
            raw = await resp.read()
            return resp.status, (await resp.json()) if raw else None, resp.headers.get("ETag")

    async def changes(self) -> list[dict[str, Any]]:
        """The session's recorded changes, newest first."""
        url = f"{self.proxy.base_url}/admin/sessions/{self.sid}/changes"
        async with self.http.get(url, headers=AUTH) as resp:
            assert resp.status == 200
            return list((await resp.json())["changes"])


@pytest.fixture(params=BACKENDS)
async def admin(request: pytest.FixtureRequest,
                proxy_factory: ProxyFactory) -> AsyncIterator[Admin]:
    """The admin API of a proxy on each store backend, and a session nobody used yet."""
    redis_url = None
    overrides: dict[str, Any] = {}
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_url")
        overrides = {"store": {"backend": "redis", "url": redis_url}}
    proxy = proxy_factory(overrides, admin_token=TOKEN)
    async with aiohttp.ClientSession() as http:
        yield Admin(proxy, request.param, http, f"integrity-{uuid.uuid4().hex[:12]}", redis_url)


# --- versions are never reused ------------------------------------------------------------


async def test_a_stale_if_match_cannot_overwrite_a_state_created_again(admin: Admin) -> None:
    """A writer holding ETag "1" of a state since deleted and created again gets 409 (not a
    silent overwrite): the new state continues the numbering at 2, and is kept."""
    status, _, etag = await admin.call("PUT", content="first")
    assert (status, etag) == (201, '"1"')
    status, _, _ = await admin.call("DELETE")
    assert status == 204
    status, created, etag = await admin.call("PUT", content="created again")
    assert status == 201
    assert (created["version"], etag) == (2, '"2"')
    status, answer, etag = await admin.call("PUT", if_match=1, content="stale writer")
    assert status == 409, answer
    assert answer["error"]["type"] == "conflict_error"
    assert etag == '"2"'
    status, current, _ = await admin.call("GET")
    assert status == 200
    assert (current["version"], current["facts"][0]["content"]) == (2, "created again")


async def test_a_stale_if_match_cannot_delete_a_state_created_again(admin: Admin) -> None:
    """DELETE with the If-Match of a state since deleted and created again: 409, kept."""
    await admin.call("PUT", content="first")
    await admin.call("PUT", if_match=1, content="second")
    assert (await admin.call("DELETE", if_match=2))[0] == 204
    status, created, _ = await admin.call("PUT", content="third")
    assert (status, created["version"]) == (201, 3)
    status, _, _ = await admin.call("DELETE", if_match=1)
    assert status == 409
    assert (await admin.call("GET"))[1]["version"] == 3


async def test_every_version_of_a_session_is_recorded_once(admin: Admin) -> None:
    """Puts, deletes and puts again: the changes name versions 1, 2, (delete), 3, each once."""
    await admin.call("PUT", content="one")
    await admin.call("PUT", if_match=1, content="two")
    await admin.call("DELETE")
    await admin.call("PUT", content="three")
    changes = await admin.changes()
    assert [(c["action"], c["version"]) for c in reversed(changes)] == [
        ("put", 1), ("put", 2), ("delete", None), ("put", 3)]


# --- a write and its change record are one transaction ----------------------------------


@contextlib.contextmanager
def refusing_changes(admin: Admin) -> Iterator[None]:
    """Make the store refuse to keep this session's change records, from outside the proxy:
    SQLite, a trigger aborting every insert into the changes table; Redis, a string where the
    session's changes sorted set goes (every ZADD to it fails; the changes recorded so far
    are put back after). The state itself stays writable."""
    if admin.backend == "sqlite":
        conn = sqlite3.connect(admin.proxy.config.store.path, isolation_level=None)
        conn.execute("CREATE TRIGGER refuse_changes BEFORE INSERT ON audit_change"
                     " BEGIN SELECT RAISE(ABORT, 'change records refused'); END")
        try:
            yield
        finally:
            conn.execute("DROP TRIGGER refuse_changes")
            conn.close()
        return
    assert admin.redis_url is not None
    client = redis.Redis.from_url(admin.redis_url)
    key = f"compact-proxy:{{{admin.sid}}}:audit:changes"
    aside = f"{key}:aside"
    kept = bool(client.exists(key))
    if kept:  # the changes recorded so far wait aside
        client.rename(key, aside)
    client.set(key, "not a sorted set")
    try:
        yield
    finally:
        client.delete(key)
        if kept:
            client.rename(aside, key)
        client.close()


async def test_a_put_whose_change_cannot_be_recorded_writes_nothing(admin: Admin) -> None:
    """The change record fails: the PUT fails (500) and no state was written; with the
    record possible again, the same PUT creates version 1 and its record."""
    with refusing_changes(admin):
        status, answer, _ = await admin.call("PUT", content="unrecorded")
        assert status == 500, answer
        assert answer["error"]["type"] == "api_error"
        assert (await admin.call("GET"))[0] == 404
    status, created, _ = await admin.call("PUT", content="recorded")
    assert (status, created["version"]) == (201, 1)
    assert [(c["action"], c["version"]) for c in await admin.changes()] == [("put", 1)]


async def test_a_replace_whose_change_cannot_be_recorded_keeps_the_old_state(
        admin: Admin) -> None:
    """A replacing PUT and a DELETE whose change records fail leave the state as it was."""
    assert (await admin.call("PUT", content="kept"))[0] == 201
    with refusing_changes(admin):
        status, _, _ = await admin.call("PUT", if_match=1, content="unrecorded")
        assert status == 500
        status, _, _ = await admin.call("DELETE", if_match=1)
        assert status == 500
    status, current, _ = await admin.call("GET")
    assert status == 200
    assert (current["version"], current["facts"][0]["content"]) == (1, "kept")
    assert [(c["action"], c["version"]) for c in await admin.changes()] == [("put", 1)]
    status, _, _ = await admin.call("PUT", if_match=1, content="recorded")
    assert status == 200
    assert [(c["action"], c["version"]) for c in await admin.changes()] == [
        ("put", 2), ("put", 1)]


async def test_a_console_edit_whose_change_cannot_be_recorded_writes_nothing(
        admin: Admin) -> None:
    """The console's edit form with the change records refused: the edit fails (500), the
    state is as it was; with them possible again, the edit is saved with its record."""
    console = Browserless(admin.proxy.base_url)
    try:
        assert (await console.login(TOKEN))[0] == 303
        session = f"{UI}/tenants/none/sessions/{admin.sid}"
        fact = {"fact_id": "f1", "content": "kept", "version": "",
                "source_pointer": f"transcript:{admin.sid}:1",
                "last_confirmed_at": "2026-12-01T09:00:00+00:00"}
        _, csrf = await console.page_csrf(session)
        with refusing_changes(admin):
            status, _, _ = await console.request("POST", f"{session}/fact/add",
                                                 data={**fact, "csrf": csrf})
            assert status == 500
            assert (await admin.call("GET"))[0] == 404
        status, _, _ = await console.request("POST", f"{session}/fact/add",
                                             data={**fact, "csrf": csrf})
        assert status == 303
    finally:
        await console.close()
    assert [(c["actor"], c["version"]) for c in await admin.changes()] == [("console", 1)]
