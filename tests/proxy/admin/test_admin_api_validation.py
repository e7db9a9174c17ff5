"""The admin API on a real server: validation errors naming the field, log hygiene, mounting."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from compactor import SESSION_ID_RULE
from proxy.admin.api import MAX_ADMIN_BODY_BYTES
from tests.conftest import ProxyFactory, log_lines_for
from tests.proxy.admin.helpers import (
    AUTH,
    SECRET_FACT,
    STATE_PATH,
    TOKEN,
    Admin,
    assert_error,
    captured_logs,
    state_body,
    with_auth,
)

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
