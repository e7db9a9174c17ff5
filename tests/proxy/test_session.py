"""Session resolution follows SPEC section 4's order, and derived ids are stable."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.session import resolve_session_id

HEADER = "x-compact-session-id"
BODY: dict[str, Any] = {"model": "m", "system": "sys",
                        "messages": [{"role": "user", "content": "first"}]}


def with_user_id(user_id: object) -> dict[str, Any]:
    """BODY with ``metadata.user_id``."""
    return {**BODY, "metadata": {"user_id": user_id}}


@pytest.mark.parametrize(("headers", "body", "expected"), [
    ({"X-Compact-Session-Id": "configured", "X-Claude-Code-Session-Id": "cc"},
     with_user_id("meta"), "configured"),
    ({"X-Claude-Code-Session-Id": "cc"}, with_user_id("meta"), "cc"),
    ({}, with_user_id(json.dumps({"device_id": "d", "session_id": "inner"})), "inner"),
    ({}, with_user_id(json.dumps({"device_id": "d"})), json.dumps({"device_id": "d"})),
    ({}, with_user_id("user_abc_account__session_123"), "user_abc_account__session_123"),
    ({"X-Compact-Session-Id": "  "}, with_user_id("meta"), "meta"),
])
def test_first_applicable_rule_names_the_session(
    headers: dict[str, str], body: dict[str, Any], expected: str
) -> None:
    """Configured header, then Claude Code's header, then metadata.user_id (inner session_id)."""
    assert resolve_session_id(CIMultiDict(headers), body, HEADER) == expected


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


@pytest.mark.parametrize("bad", ["line\nbreak", "x" * 600, ""])
def test_unusable_candidates_fall_through_to_the_next_rule(bad: str) -> None:
    """A candidate with control characters, too long or empty is skipped."""
    assert resolve_session_id(CIMultiDict(), with_user_id(bad), HEADER).startswith("conv-")
