"""The admin API on a real server: the per-tenant state routes."""

from __future__ import annotations

import sqlite3

import pytest

from tests.proxy.admin.helpers import (
    AUTH,
    STATE_PATH,
    Admin,
    _state,
    assert_error,
    captured_logs,
    state_body,
    with_auth,
)

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
