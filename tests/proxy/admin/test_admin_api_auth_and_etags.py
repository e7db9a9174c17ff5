"""The admin API on a real server: enabled or not, the bearer token, the ETag/If-Match flow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from proxy.admin.api import setup_admin
from tests.proxy.admin.helpers import (
    AUTH,
    SECRET_FACT,
    STATE_PATH,
    TOKEN,
    Admin,
    _state,
    assert_error,
    state_body,
    with_auth,
)

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
