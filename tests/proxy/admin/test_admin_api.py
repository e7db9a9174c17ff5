"""The admin API on a real aiohttp server on 127.0.0.1, backed by a real SQLite store:
auth, the ETag/If-Match flow, validation errors naming the field, and log hygiene."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from compactor import SESSION_ID_RULE, DurableContextState
from proxy.admin.api import MAX_ADMIN_BODY_BYTES, setup_admin
from proxy.store import SQLiteStateStore
from tests.conftest import ProxyFactory, log_lines_for

TOKEN = "tok-7f3a9c1e5b2d4e6f8a0b1c3d5e7f9a2b"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET_FACT = "the deploy key lives in vault path kv/prod/deploy"
STATE_PATH = "/admin/sessions/sess-1/state"


def state_body(content: str = SECRET_FACT, *, fact_id: str = "f1") -> dict[str, Any]:
    """A valid PUT body with one item of each kind."""
    return {
        "facts": [{"fact_id": fact_id, "content": content,
                   "source_pointer": "transcript:sess-1:3",
                   "last_confirmed_at": "2025-03-01T12:30:00+00:00"}],
        "pending_items": [{"item_id": "p1", "description": "rotate the key",
                           "source_pointer": "transcript:sess-1:4",
                           "last_confirmed_at": "2025-03-01T12:31:00Z"}],
        "retrieval_evidence": [{"memory_id": "m1", "source_id": "transcript:sess-1:5",
                                "source_type": "transcript", "source_title": "turn 5",
                                "captured_at": "2025-03-01T12:32:00+00:00", "score": 0.5,
                                "source_rank": 1, "conflict_key": None}],
    }


def _state() -> DurableContextState:
    """The state that ``state_body()`` describes."""
    return DurableContextState.from_dict(state_body())


async def forwarder(request: web.Request) -> web.Response:
    """Stands in for the proxy's catch-all forwarder, registered after setup_admin."""
    return web.json_response({"forwarded": request.path}, status=299)


class Admin:
    """A running app with the admin API (or its absence) and a client talking to it."""

    def __init__(self, server: TestServer, client: aiohttp.ClientSession,
                 store: SQLiteStateStore) -> None:
        self.server = server
        self.client = client
        self.store = store

    def url(self, path: str) -> URL:
        """The absolute URL of ``path`` on the server, taken as already encoded."""
        return URL(str(self.server.make_url("/")).rstrip("/") + path, encoded=True)

    async def call(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                   body: Any = None, data: Any = None) -> tuple[int, Any, Any]:
        """Make one request; return (status, decoded JSON body or None, headers)."""
        kwargs: dict[str, Any] = {"headers": headers or {}}
        if body is not None:
            kwargs["json"] = body
        if data is not None:
            kwargs["data"] = data
        async with self.client.request(method, self.url(path), **kwargs) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None, resp.headers


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStateStore]:
    """A real SQLite store on a fresh file."""
    opened = await SQLiteStateStore(tmp_path / "admin" / "state.db").open()
    yield opened
    await opened.close()


@pytest.fixture
async def start(store: SQLiteStateStore) -> AsyncIterator[Any]:
    """Start an app with ``setup_admin(app, store, token)`` then a catch-all forwarder."""
    started: list[tuple[TestServer, aiohttp.ClientSession]] = []

    async def _start(token: str | None) -> Admin:
        app = web.Application()
        setup_admin(app, store, token)
        app.router.add_route("*", "/{tail:.*}", forwarder)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        client = aiohttp.ClientSession()
        started.append((server, client))
        return Admin(server, client, store)

    yield _start
    for server, client in started:
        await client.close()
        await server.close()


@pytest.fixture
async def admin(start: Any) -> Admin:
    """The admin API enabled with TOKEN."""
    result: Admin = await start(TOKEN)
    return result


def with_auth(**extra: str) -> dict[str, str]:
    """The admin Authorization header plus ``extra`` headers (underscores become dashes)."""
    headers = dict(AUTH)
    headers.update({key.replace("_", "-"): value for key, value in extra.items()})
    return headers


def assert_error(body: Any, error_type: str) -> str:
    """Check the Anthropic error shape and type; return the message."""
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    message = body["error"]["message"]
    assert isinstance(message, str) and message
    return message


# --- enabled or not ---------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, ""])
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", STATE_PATH), ("PUT", STATE_PATH), ("DELETE", STATE_PATH), ("GET", "/admin"),
     ("POST", "/admin/anything/else")],
)
async def test_admin_paths_are_404_when_no_token_is_configured(
    start: Any, token: str | None, method: str, path: str
) -> None:
    """Without a token every /admin path answers 404 and never reaches the forwarder."""
    admin: Admin = await start(token)
    status, body, _ = await admin.call(method, path, headers=AUTH, body=state_body())
    assert status == 404
    assert_error(body, "not_found_error")
    assert await admin.store.get_state("sess-1") is None


async def test_other_paths_still_reach_the_forwarder(admin: Admin) -> None:
    """Paths outside /admin fall through to the catch-all registered after setup_admin."""
    status, body, _ = await admin.call("GET", "/v1/models")
    assert (status, body) == (299, {"forwarded": "/v1/models"})


def test_token_with_surrounding_whitespace_is_refused(tmp_path: Path) -> None:
    """setup_admin rejects a token no Authorization header could carry."""
    with pytest.raises(ValueError, match="admin token"):
        setup_admin(web.Application(), None, " padded ")  # type: ignore[arg-type]


# --- authentication ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"X-Api-Key": TOKEN},
    ],
    ids=["missing", "empty", "scheme-only", "scheme-space", "no-scheme", "basic", "wrong",
         "longer", "prefix", "other-header"],
)
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_calls_without_the_right_bearer_token_get_the_same_401(
    admin: Admin, headers: dict[str, str], method: str
) -> None:
    """Missing, malformed, empty or wrong tokens all get one identical 401 and change nothing."""
    await admin.store.put_state("sess-1", _state(), None)
    status, body, resp_headers = await admin.call(method, STATE_PATH, headers=headers,
                                                  body=state_body("changed"))
    assert status == 401
    assert body == {"type": "error", "error": {
        "type": "authentication_error", "message": "invalid or missing admin bearer token"}}
    assert resp_headers["WWW-Authenticate"] == "Bearer"
    stored = await admin.store.get_state("sess-1")
    assert stored is not None and stored.version == 1


async def test_bearer_scheme_is_matched_case_insensitively(admin: Admin) -> None:
    """'bearer <token>' is accepted like 'Bearer <token>'."""
    status, body, _ = await admin.call("GET", STATE_PATH,
                                       headers={"Authorization": f"bearer {TOKEN}"})
    assert status == 404
    assert_error(body, "not_found_error")


async def test_unknown_admin_paths_need_the_token_then_are_404(admin: Admin) -> None:
    """Other /admin paths answer 401 without the token and 404 with it, never forwarded."""
    status, body, _ = await admin.call("GET", "/admin/sessions")
    assert status == 401
    status, body, _ = await admin.call("GET", "/admin/sessions", headers=AUTH)
    assert status == 404
    assert_error(body, "not_found_error")


async def test_other_methods_on_the_state_path_are_405(admin: Admin) -> None:
    """POST on the state path is 405 with an Allow header, not forwarded."""
    status, body, headers = await admin.call("POST", STATE_PATH, headers=AUTH,
                                             body=state_body())
    assert status == 405
    assert_error(body, "invalid_request_error")
    assert "PUT" in headers["Allow"]


# --- the ETag flow ----------------------------------------------------------------------


async def test_get_put_delete_flow_with_etags(admin: Admin) -> None:
    """Create (201, ETag 1), read, replace with If-Match (200, ETag 2), delete (204), gone."""
    status, body, _ = await admin.call("GET", STATE_PATH, headers=AUTH)
    assert status == 404
    assert_error(body, "not_found_error")

    status, body, headers = await admin.call("PUT", STATE_PATH, headers=AUTH,
                                             body=state_body())
    assert status == 201
    assert headers["ETag"] == '"1"'
    assert body == {"session_id": "sess-1", "version": 1, **_state().to_dict()}

    status, body, headers = await admin.call("GET", STATE_PATH, headers=AUTH)
    assert status == 200
    assert headers["ETag"] == '"1"'
    assert body["version"] == 1 and body["facts"][0]["content"] == SECRET_FACT
    assert body["pending_items"][0]["item_id"] == "p1"
    assert body["retrieval_evidence"][0]["score"] == 0.5

    status, body, headers = await admin.call("PUT", STATE_PATH, headers=with_auth(If_Match='"1"'),
                                             body=state_body("replaced fact"))
    assert status == 200
    assert headers["ETag"] == '"2"'
    assert body["version"] == 2 and body["facts"][0]["content"] == "replaced fact"

    status, body, _ = await admin.call("DELETE", STATE_PATH, headers=with_auth(If_Match='"2"'))
    assert (status, body) == (204, None)
    status, _, _ = await admin.call("GET", STATE_PATH, headers=AUTH)
    assert status == 404
    assert await admin.store.get_state("sess-1") is None


async def test_get_body_can_be_put_back_unchanged(admin: Admin) -> None:
    """A GET body, with its session_id and version, is accepted by PUT with that ETag."""
    await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body())
    _, body, headers = await admin.call("GET", STATE_PATH, headers=AUTH)
    status, new_body, _ = await admin.call("PUT", STATE_PATH,
                                           headers=with_auth(If_Match=headers["ETag"]), body=body)
    assert status == 200
    assert new_body == {**body, "version": 2}


async def test_put_of_existing_state_without_if_match_is_428(admin: Admin) -> None:
    """Replacing an existing state needs If-Match; without it: 428 and nothing changes."""
    await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body())
    status, body, headers = await admin.call("PUT", STATE_PATH, headers=AUTH,
                                             body=state_body("other"))
    assert status == 428
    assert "If-Match required" in assert_error(body, "invalid_request_error")
    assert headers["ETag"] == '"1"'
    stored = await admin.store.get_state("sess-1")
    assert stored is not None and stored.state == _state()


async def test_stale_if_match_is_409_and_state_is_unchanged(admin: Admin) -> None:
    """A PUT with an old ETag gets 409 conflict_error; the stored state stays as it was."""
    await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body("v1"))
    await admin.call("PUT", STATE_PATH, headers=with_auth(If_Match='"1"'), body=state_body("v2"))
    status, body, headers = await admin.call("PUT", STATE_PATH, headers=with_auth(If_Match='"1"'),
                                             body=state_body("lost update"))
    assert status == 409
    assert "current version is 2" in assert_error(body, "conflict_error")
    assert headers["ETag"] == '"2"'
    _, body, _ = await admin.call("GET", STATE_PATH, headers=AUTH)
    assert (body["version"], body["facts"][0]["content"]) == (2, "v2")


async def test_if_match_on_a_missing_state_is_409(admin: Admin) -> None:
    """Naming a version for a session that has no state is a stale precondition: 409."""
    status, body, _ = await admin.call("PUT", STATE_PATH, headers=with_auth(If_Match='"4"'),
                                       body=state_body())
    assert status == 409
    assert "no state exists" in assert_error(body, "conflict_error")
    assert await admin.store.get_state("sess-1") is None


@pytest.mark.parametrize("if_match", ["*", "1", 'W/"1"', '"1", "2"', '"0"', '"abc"', '""'])
async def test_malformed_or_wildcard_if_match_is_400(admin: Admin, if_match: str) -> None:
    """If-Match must be exactly one quoted version; '*' and anything else are refused."""
    await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body("v1"))
    status, body, _ = await admin.call("PUT", STATE_PATH, headers=with_auth(If_Match=if_match),
                                       body=state_body("v2"))
    assert status == 400
    assert "If-Match" in assert_error(body, "invalid_request_error")
    stored = await admin.store.get_state("sess-1")
    assert stored is not None and stored.version == 1


async def test_delete_with_stale_if_match_is_409_and_keeps_state(admin: Admin) -> None:
    """DELETE with an old ETag gets 409 and the state survives."""
    await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body())
    await admin.call("PUT", STATE_PATH, headers=with_auth(If_Match='"1"'), body=state_body())
    status, body, _ = await admin.call("DELETE", STATE_PATH, headers=with_auth(If_Match='"1"'))
    assert status == 409
    assert_error(body, "conflict_error")
    assert await admin.store.get_state("sess-1") is not None


async def test_delete_without_if_match_removes_and_missing_is_404(admin: Admin) -> None:
    """DELETE without If-Match deletes unconditionally; a second DELETE is 404."""
    await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body())
    status, _, _ = await admin.call("DELETE", STATE_PATH, headers=AUTH)
    assert status == 204
    status, body, _ = await admin.call("DELETE", STATE_PATH, headers=AUTH)
    assert status == 404
    assert_error(body, "not_found_error")


# --- validation -------------------------------------------------------------------------


def _mutated(path: tuple[str, int, str], value: Any) -> dict[str, Any]:
    body = state_body()
    body[path[0]][path[1]][path[2]] = value
    return body


def _duplicate_fact() -> dict[str, Any]:
    body = state_body()
    body["facts"].append(dict(body["facts"][0], content="another"))
    return body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_mutated(("facts", 0, "last_confirmed_at"), "2025-03-01T12:30:00"),
         "facts[0].last_confirmed_at"),
        (_mutated(("facts", 0, "fact_id"), ""), "facts[0].fact_id"),
        (_mutated(("pending_items", 0, "last_confirmed_at"), "yesterday"),
         "pending_items[0].last_confirmed_at"),
        (_mutated(("retrieval_evidence", 0, "score"), 1.5), "retrieval_evidence[0].score"),
        (_mutated(("retrieval_evidence", 0, "source_rank"), 0),
         "retrieval_evidence[0].source_rank"),
        (_duplicate_fact(), "facts[1].fact_id"),
        ({"facts": {"not": "a list"}}, "facts"),
        ({**state_body(), "notes": []}, "notes"),
        ({**state_body(), "session_id": "other-session"}, "session_id"),
        ({**state_body(), "version": 7}, "version"),
    ],
    ids=["naive-timestamp", "empty-id", "bad-timestamp", "score", "rank", "duplicate-id",
         "facts-not-list", "unknown-key", "session-mismatch", "version-without-if-match"],
)
async def test_invalid_state_is_400_naming_the_field(
    admin: Admin, body: dict[str, Any], field: str
) -> None:
    """An invalid body gets 400 invalid_request_error whose message starts with the field."""
    status, resp, _ = await admin.call("PUT", STATE_PATH, headers=AUTH, body=body)
    assert status == 400
    assert assert_error(resp, "invalid_request_error").startswith(field)
    assert await admin.store.get_state("sess-1") is None


async def test_version_in_body_must_match_if_match(admin: Admin) -> None:
    """A body version differing from If-Match is 400 and nothing is written."""
    await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body("v1"))
    status, body, _ = await admin.call("PUT", STATE_PATH, headers=with_auth(If_Match='"1"'),
                                       body={**state_body("v2"), "version": 3})
    assert status == 400
    assert assert_error(body, "invalid_request_error").startswith("version")
    stored = await admin.store.get_state("sess-1")
    assert stored is not None and stored.version == 1


@pytest.mark.parametrize(
    "data",
    [b"", b"{not json", b"[1, 2, 3]", b'"a string"', b"null", b'{"facts": NaN}',
     b"\xff\xfe{}", b'{"facts": [] } trailing'],
    ids=["empty", "not-json", "list", "string", "null", "nan", "not-utf8", "trailing"],
)
async def test_garbage_bodies_are_400_and_nothing_is_stored(admin: Admin, data: bytes) -> None:
    """Non-JSON, non-object or otherwise unparseable bodies get 400 and store nothing."""
    status, body, _ = await admin.call("PUT", STATE_PATH, headers=AUTH, data=data)
    assert status == 400
    assert assert_error(body, "invalid_request_error").startswith("body")
    assert await admin.store.get_state("sess-1") is None


async def test_body_over_one_mebibyte_is_413(admin: Admin) -> None:
    """A body just over 1 MiB is refused with 413 request_too_large; nothing is stored."""
    big = state_body("x" * MAX_ADMIN_BODY_BYTES)
    status, body, _ = await admin.call("PUT", STATE_PATH, headers=AUTH, body=big)
    assert status == 413
    assert_error(body, "request_too_large")
    assert await admin.store.get_state("sess-1") is None


async def test_chunked_body_over_one_mebibyte_is_413(admin: Admin) -> None:
    """The limit also holds when no Content-Length is sent (chunked upload)."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"facts": [{"fact_id": "f", "content": "'
        for _ in range(20):
            yield b"y" * 64 * 1024
        yield b'"}]}'

    status, body, _ = await admin.call("PUT", STATE_PATH, headers=AUTH, data=chunks())
    assert status == 413
    assert_error(body, "request_too_large")
    assert await admin.store.get_state("sess-1") is None


async def test_body_just_under_the_limit_is_accepted(admin: Admin) -> None:
    """A valid body close to 1 MiB is stored: the limit is not lower than documented."""
    body = state_body("z" * (MAX_ADMIN_BODY_BYTES - 2000))
    assert len(json.dumps(body).encode()) <= MAX_ADMIN_BODY_BYTES
    status, _, _ = await admin.call("PUT", STATE_PATH, headers=AUTH, body=body)
    assert status == 201


@pytest.mark.parametrize(
    "sid", ["..", ".", "%2E%2E", "a%20b", "a%2Fb", "x" * 129, "%C3%A9t%C3%A9", "semi;colon",
            "a:b", "a%3Ab", "a..b", ".hidden"],
    ids=["dotdot", "dot", "encoded-dotdot", "space", "slash", "too-long", "non-ascii",
         "semicolon", "colon", "encoded-colon", "double-dot", "leading-dot"],
)
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_invalid_session_ids_are_400(admin: Admin, sid: str, method: str) -> None:
    """Session ids outside the one rule (runs of [A-Za-z0-9_-] joined by single dots, at most
    128 characters) get 400 naming the rule, and store nothing."""
    status, body, _ = await admin.call(method, f"/admin/sessions/{sid}/state", headers=AUTH,
                                       body=state_body())
    assert status == 400
    message = assert_error(body, "invalid_request_error")
    assert message.startswith("session id: ") and SESSION_ID_RULE in message
    conn = sqlite3.connect(admin.store.path)
    assert conn.execute("SELECT COUNT(*) FROM session_state").fetchone()[0] == 0
    conn.close()


async def test_valid_unusual_session_id_is_accepted(admin: Admin) -> None:
    """Ids made of every allowed character class, at the longest length, work end to end."""
    sid = "conv-AZaz09_.-" + "x" * 114
    assert len(sid) == 128
    status, body, _ = await admin.call("PUT", f"/admin/sessions/{sid}/state", headers=AUTH,
                                       body=state_body())
    assert status == 201 and body["session_id"] == sid
    assert await admin.store.get_state(sid) is not None


async def test_corrupt_stored_row_is_a_500_without_details(admin: Admin) -> None:
    """A row that does not decode gives 500 api_error, not garbage and not a traceback."""
    conn = sqlite3.connect(admin.store.path)
    conn.execute("INSERT INTO session_state VALUES ('sess-1', 1, '{oops', '2025-01-01T00:00:00Z')")
    conn.commit()
    conn.close()
    status, body, _ = await admin.call("GET", STATE_PATH, headers=AUTH)
    assert status == 500
    message = assert_error(body, "api_error")
    assert str(admin.store.path) not in message


# --- logs -------------------------------------------------------------------------------


@contextlib.contextmanager
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """``structlog.testing.capture_logs`` at every level: a configuration another test left
    in this process (a warning-level filter) must not hide the lines looked for."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
                        cache_logger_on_first_use=False)
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(wrapper_class=before["wrapper_class"],
                            cache_logger_on_first_use=before["cache_logger_on_first_use"])


async def test_admin_logs_hold_counts_but_no_content_and_no_token(admin: Admin) -> None:
    """Write/delete log lines name session, version and counts; never the text or the token."""
    with captured_logs() as logs:
        await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body())
        await admin.call("PUT", STATE_PATH, headers=with_auth(If_Match='"1"'),
                         body=state_body(SECRET_FACT + " v2"))
        await admin.call("PUT", STATE_PATH, headers={"Authorization": "Bearer guess"},
                         body=state_body())
        await admin.call("DELETE", STATE_PATH, headers=AUTH)
    written = [entry for entry in logs if entry["event"] == "admin_state_written"]
    assert [(e["session_id"], e["version"], e["created"]) for e in written] == [
        ("sess-1", 1, True), ("sess-1", 2, False)]
    assert all((e["facts"], e["pending_items"], e["retrieval_evidence"]) == (1, 1, 1)
               for e in written)
    assert [e["session_id"] for e in logs if e["event"] == "admin_state_deleted"] == ["sess-1"]
    dumped = json.dumps(logs, default=str)
    for secret in (SECRET_FACT, "rotate the key", TOKEN, "guess"):
        assert secret not in dumped


# --- the sub-application's edges ----------------------------------------------------------


async def test_only_the_admin_prefix_is_claimed(admin: Admin) -> None:
    """The sub-app owns /admin and what decodes to a path under it, not /administrator."""
    status, body, _ = await admin.call("GET", "/administrator")
    assert (status, body) == (299, {"forwarded": "/administrator"})
    status, body, _ = await admin.call("GET", "/%61dmin/sessions/sess-1/state")
    assert status == 401
    assert_error(body, "authentication_error")
    status, body, _ = await admin.call("GET", "/admin/", headers=AUTH)
    assert status == 404
    assert_error(body, "not_found_error")


@pytest.mark.parametrize(
    ("data", "field"),
    [(b'{"retrieval_evidence": [{"score": 1e400}]}', "retrieval_evidence.0.score: number"),
     (b'{"facts": [], "pending_items": ' + b"9" * 5000 + b"}", "pending_items: number"),
     (b'{"facts": -Infinity}', "body is not valid JSON: -Infinity")],
    ids=["float-overflow", "huge-int", "minus-infinity"],
)
async def test_numbers_json_cannot_carry_are_400_naming_where(
    admin: Admin, data: bytes, field: str
) -> None:
    """The proxy's strict JSON parser: a number out of range is named by its path."""
    status, body, _ = await admin.call("PUT", STATE_PATH, headers=AUTH, data=data)
    assert status == 400
    assert assert_error(body, "invalid_request_error").startswith(field)
    assert await admin.store.get_state("sess-1") is None


# --- mounted in the proxy -----------------------------------------------------------------


async def _send(base_url: str, method: str, path: str, headers: dict[str, str],
                data: bytes | None = None) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, base_url + path, headers=headers, data=data) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None, resp.headers


async def test_refusals_under_the_proxy_pass_its_middlewares(
    proxy_factory: ProxyFactory, proxy_log: Any
) -> None:
    """Under the proxy an admin refusal carries the request id and leaves one
    ``request_invalid`` (a wrong token is the client's mistake) and one ``request_completed``
    (route ``admin``) line; the 401 and the 405 keep their headers."""
    proxy = proxy_factory(admin_token=TOKEN)
    status, body, headers = await _send(proxy.base_url, "GET", STATE_PATH,
                                        {"Authorization": "Bearer guess"})
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert headers["WWW-Authenticate"] == "Bearer"
    lines = [line for line in log_lines_for(proxy_log, headers["x-compact-request-id"])
             if line["event"] in ("request_invalid", "request_completed")]
    assert [(line["event"], line["status"]) for line in lines] == [
        ("request_invalid", 401), ("request_completed", 401)]
    assert lines[0]["reason"] == "admin_unauthorized"
    assert (lines[1]["route"], lines[1]["outcome"]) == ("admin", "invalid")
    status, _, headers = await _send(proxy.base_url, "PATCH", STATE_PATH, AUTH)
    assert status == 405 and "PUT" in headers["Allow"] and headers["x-compact-request-id"]


async def test_compressed_put_bodies_are_decoded_under_the_same_limit(
    proxy_factory: ProxyFactory
) -> None:
    """A gzip PUT body is decoded like a /v1/messages one; one inflating past 1 MiB is 413."""
    proxy = proxy_factory(admin_token=TOKEN)
    gzipped = with_auth(Content_Encoding="gzip", Content_Type="application/json")
    status, body, headers = await _send(proxy.base_url, "PUT", STATE_PATH, gzipped,
                                        gzip.compress(json.dumps(state_body()).encode()))
    assert (status, headers["ETag"]) == (201, '"1"')
    assert body["facts"][0]["content"] == SECRET_FACT
    bomb = gzip.compress(b'{"facts": "' + b"x" * (MAX_ADMIN_BODY_BYTES + 10) + b'"}')
    status, body, _ = await _send(proxy.base_url, "PUT", STATE_PATH,
                                  with_auth(Content_Encoding="gzip", If_Match='"1"'), bomb)
    assert status == 413
    assert_error(body, "request_too_large")
    status, body, _ = await _send(proxy.base_url, "GET", STATE_PATH, AUTH)
    assert (status, body["version"]) == (200, 1)


# --- tenants ----------------------------------------------------------------------------

TENANT = "t0123456789abcdef"
OTHER_TENANT = "hfedcba9876543210"
TENANT_PATH = f"/admin/tenants/{TENANT}/sessions/sess-1/state"


async def test_tenant_route_get_put_delete_flow(admin: Admin) -> None:
    """/admin/tenants/{tenant}/sessions/{sid}/state keys the store by scoped_key(tenant, sid),
    answers in today's shape plus "tenant", and never touches tenant none's session."""
    status, body, _ = await admin.call("GET", TENANT_PATH, headers=AUTH)
    assert status == 404
    assert_error(body, "not_found_error")

    status, body, headers = await admin.call("PUT", TENANT_PATH, headers=AUTH, body=state_body())
    assert status == 201
    assert headers["ETag"] == '"1"' and headers["Location"] == TENANT_PATH
    assert body == {"session_id": "sess-1", "tenant": TENANT, "version": 1,
                    **_state().to_dict()}
    assert (await admin.store.get_state(f"{TENANT}/sess-1")) is not None
    assert await admin.store.get_state("sess-1") is None
    status, _, _ = await admin.call("GET", STATE_PATH, headers=AUTH)
    assert status == 404

    status, body, headers = await admin.call("GET", TENANT_PATH, headers=AUTH)
    assert status == 200 and headers["ETag"] == '"1"'
    assert body["tenant"] == TENANT and body["session_id"] == "sess-1"

    status, body, headers = await admin.call("PUT", TENANT_PATH, headers=AUTH,
                                             body=state_body("other"))
    assert status == 428
    status, body, headers = await admin.call("PUT", TENANT_PATH,
                                             headers=with_auth(If_Match='"7"'),
                                             body=state_body("other"))
    assert status == 409 and headers["ETag"] == '"1"'
    status, body, headers = await admin.call("PUT", TENANT_PATH,
                                             headers=with_auth(If_Match='"1"'),
                                             body=state_body("replaced"))
    assert status == 200 and headers["ETag"] == '"2"'
    assert body["facts"][0]["content"] == "replaced"

    status, _, _ = await admin.call("DELETE", TENANT_PATH, headers=with_auth(If_Match='"1"'))
    assert status == 409
    status, body, _ = await admin.call("DELETE", TENANT_PATH, headers=with_auth(If_Match='"2"'))
    assert (status, body) == (204, None)
    status, _, _ = await admin.call("DELETE", TENANT_PATH, headers=AUTH)
    assert status == 404
    assert await admin.store.get_state(f"{TENANT}/sess-1") is None


async def test_same_session_id_under_two_tenants_holds_two_states(admin: Admin) -> None:
    """Each tenant's session is its own; tenant none is the legacy route."""
    other_path = f"/admin/tenants/{OTHER_TENANT}/sessions/sess-1/state"
    for path, content in ((TENANT_PATH, "mine"), (other_path, "theirs"), (STATE_PATH, "none")):
        status, _, _ = await admin.call("PUT", path, headers=AUTH, body=state_body(content))
        assert status == 201
    for path, content in ((TENANT_PATH, "mine"), (other_path, "theirs"), (STATE_PATH, "none")):
        _, body, _ = await admin.call("GET", path, headers=AUTH)
        assert body["facts"][0]["content"] == content


async def test_tenant_none_route_is_the_legacy_session(admin: Admin) -> None:
    """/admin/tenants/none/... and /admin/sessions/... name the same state."""
    await admin.call("PUT", STATE_PATH, headers=AUTH, body=state_body())
    status, body, headers = await admin.call(
        "GET", "/admin/tenants/none/sessions/sess-1/state", headers=AUTH)
    assert status == 200 and headers["ETag"] == '"1"'
    assert body == {"session_id": "sess-1", "tenant": "none", "version": 1,
                    **_state().to_dict()}


async def test_tenant_get_body_can_be_put_back_and_a_wrong_tenant_is_400(admin: Admin) -> None:
    """A GET body with its tenant goes back unchanged; a tenant field that does not match the
    URL's is 400 naming it, on either route, and nothing changes."""
    await admin.call("PUT", TENANT_PATH, headers=AUTH, body=state_body())
    _, body, headers = await admin.call("GET", TENANT_PATH, headers=AUTH)
    status, new_body, _ = await admin.call("PUT", TENANT_PATH,
                                           headers=with_auth(If_Match=headers["ETag"]), body=body)
    assert status == 200 and new_body == {**body, "version": 2}

    for path, wrong in ((TENANT_PATH, OTHER_TENANT), (TENANT_PATH, "none"),
                        (STATE_PATH, TENANT), (TENANT_PATH, 5)):
        status, err, _ = await admin.call("PUT", path, headers=with_auth(If_Match='"2"'),
                                          body={**state_body("x"), "tenant": wrong})
        assert status == 400
        assert assert_error(err, "invalid_request_error").startswith("tenant: ")
    stored = await admin.store.get_state(f"{TENANT}/sess-1")
    assert stored is not None and stored.version == 2
    assert await admin.store.get_state("sess-1") is None

    status, _, _ = await admin.call("PUT", STATE_PATH, headers=AUTH,
                                    body={**state_body(), "tenant": "none"})
    assert status == 201


@pytest.mark.parametrize(
    "tenant", ["T0123456789abcdef", "t0123456789ABCDEF", "t0123", "x0123456789abcdef",
               "sk-ant-api03-abcdef", "None", "t0123456789abcdef0"],
)
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_invalid_tenants_are_400_and_not_echoed(admin: Admin, tenant: str,
                                                       method: str) -> None:
    """A tenant in the URL that is not none, t<16 hex> or h<16 hex> is 400 naming the tenant
    (without repeating the value: it may be a credential pasted by mistake); nothing stored."""
    status, body, _ = await admin.call(method, f"/admin/tenants/{tenant}/sessions/s/state",
                                       headers=AUTH, body=state_body())
    assert status == 400
    message = assert_error(body, "invalid_request_error")
    assert message.startswith("tenant: ") and tenant not in message
    conn = sqlite3.connect(admin.store.path)
    assert conn.execute("SELECT COUNT(*) FROM session_state").fetchone()[0] == 0
    conn.close()


async def test_tenant_route_needs_the_token_and_checks_the_session_id(admin: Admin) -> None:
    """The bearer check comes first; the session id rule still applies under a tenant."""
    status, body, _ = await admin.call("GET", TENANT_PATH)
    assert status == 401
    assert_error(body, "authentication_error")
    status, body, _ = await admin.call("GET", f"/admin/tenants/{TENANT}/sessions/a..b/state",
                                       headers=AUTH)
    assert status == 400
    assert assert_error(body, "invalid_request_error").startswith("session id: ")


async def test_tenant_writes_are_logged_with_the_tenant(admin: Admin) -> None:
    """The admin log lines name the tenant and the client's session id."""
    with captured_logs() as logs:
        await admin.call("PUT", TENANT_PATH, headers=AUTH, body=state_body())
        await admin.call("DELETE", TENANT_PATH, headers=AUTH)
    events = {line["event"]: line for line in logs}
    assert events["admin_state_written"]["tenant"] == TENANT
    assert events["admin_state_written"]["session_id"] == "sess-1"
    assert events["admin_state_deleted"]["tenant"] == TENANT
