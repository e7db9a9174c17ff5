"""Session resolution follows SPEC section 4's order, and derived ids are stable."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from compactor import SESSION_ID_RULE
from proxy.http.errors import RequestRejected
from proxy.http.session import resolve_session_id

HEADER = "x-compact-session-id"
BODY: dict[str, Any] = {"model": "m", "system": "sys",
                        "messages": [{"role": "user", "content": "first"}]}


UUID_A = "0f8fad5b-d9cb-469f-a165-70867728950e"
UUID_B = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def with_user_id(user_id: object) -> dict[str, Any]:
    """BODY with ``metadata.user_id``."""
    return {**BODY, "metadata": {"user_id": user_id}}


@pytest.mark.parametrize(("headers", "body", "expected"), [
    ({"X-Compact-Session-Id": "configured", "X-Claude-Code-Session-Id": "cc"},
     with_user_id("meta"), "configured"),
    ({"X-Claude-Code-Session-Id": "cc"}, with_user_id("meta"), "cc"),
    ({}, with_user_id(json.dumps({"device_id": "d", "session_id": "inner"})), "inner"),
    ({}, with_user_id("user_abc_account__session_123"), "user_abc_account__session_123"),
    # Claude Code's older form is 159 characters: its session uuid is the session.
    ({}, with_user_id(f"user_{'ab' * 32}_account_{UUID_A}_session_{UUID_B}"), UUID_B),
    ({}, with_user_id(f"user_{'ab' * 32}_account__session_{UUID_B}"), UUID_B),
    ({"X-Claude-Code-Session-Id": "not valid"}, with_user_id("meta"), "meta"),
    ({}, with_user_id(json.dumps({"device_id": "d", "session_id": "a:b"})), "conv-"),
])
def test_first_applicable_rule_names_the_session(
    headers: dict[str, str], body: dict[str, Any], expected: str
) -> None:
    """Configured header, then Claude Code's header, then metadata.user_id (inner session_id);
    a candidate that is not a valid session id is skipped (``conv-`` stands for the derived
    id)."""
    found = resolve_session_id(CIMultiDict(headers), body, HEADER)
    assert found.startswith("conv-") if expected == "conv-" else found == expected


def test_a_custom_configured_header_is_honoured() -> None:
    """``session.header`` may name any header; it wins over Claude Code's."""
    headers = CIMultiDict({"X-Tenant-Session": "tenant-1", "X-Claude-Code-Session-Id": "cc"})
    assert resolve_session_id(headers, BODY, "x-tenant-session") == "tenant-1"


def test_derived_id_is_stable_and_depends_on_first_message_and_system() -> None:
    """Without any id, ``conv-`` + a hash of the first message and system: same input, same id."""
    later = {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": "x"}]}
    reordered = {"messages": BODY["messages"], "system": "sys", "model": "other"}
    first = resolve_session_id(CIMultiDict(), BODY, HEADER)
    assert first.startswith("conv-")
    assert resolve_session_id(CIMultiDict(), later, HEADER) == first
    assert resolve_session_id(CIMultiDict(), reordered, HEADER) == first
    other_system = {**BODY, "system": "different"}
    assert resolve_session_id(CIMultiDict(), other_system, HEADER) != first


@pytest.mark.parametrize("bad", ["line\nbreak", "x" * 129, "", "team alpha", "a:b", "..",
                                 json.dumps({"device_id": "d"})])
def test_invalid_candidates_fall_through_to_the_next_rule(bad: str) -> None:
    """A ``metadata.user_id`` or ``X-Claude-Code-Session-Id`` that is not a valid session id
    is skipped."""
    assert resolve_session_id(CIMultiDict(), with_user_id(bad), HEADER).startswith("conv-")
    headers = CIMultiDict({"X-Claude-Code-Session-Id": bad})
    assert resolve_session_id(headers, with_user_id("meta"), HEADER) == "meta"


@pytest.mark.parametrize("bad", ["team alpha", "a:b", "", "  ", "x" * 129, "été"])
def test_an_invalid_configured_header_is_a_400_naming_header_and_rule(bad: str) -> None:
    """The configured header is the client's deliberate choice: an invalid value is refused,
    never silently replaced by the next rule's id."""
    headers = CIMultiDict({"X-Tenant-Session": bad, "X-Claude-Code-Session-Id": "cc"})
    with pytest.raises(RequestRejected) as info:
        resolve_session_id(headers, with_user_id("meta"), "x-tenant-session")
    rejected = info.value
    assert (rejected.status, rejected.error_type) == (400, "invalid_request_error")
    assert rejected.reason == "invalid_session_id"
    assert rejected.message.startswith("x-tenant-session: not a valid session id")
    assert SESSION_ID_RULE in rejected.message
