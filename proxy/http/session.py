"""Which session a request belongs to (SPEC section 4, "Session resolution").

First that applies: the configured header (``session.header``; an invalid value is a 400),
``X-Claude-Code-Session-Id``, ``metadata.user_id`` (its ``session_id``, its legacy
``_session_<uuid>``, else itself; an invalid candidate is skipped), else ``conv-`` + a hash
of the first message, ``system`` and the tenant. Every id follows
:func:`compactor.check_session_id`'s rule.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from compactor import SESSION_ID_RULE, is_session_id, session_id_problem
from proxy.http.errors import RequestRejected

__all__ = ["CLAUDE_CODE_SESSION_HEADER", "resolve_session_id"]

CLAUDE_CODE_SESSION_HEADER: Final = "x-claude-code-session-id"
# Claude Code's older user id (reference section 2.3): too long for a session id itself.
_LEGACY_USER_ID: Final = re.compile(
    r"user_[0-9a-f]{64}_account_(?:[0-9a-f-]{36})?_session_([0-9a-f-]{36})")


def _usable(value: object) -> str | None:
    return value if isinstance(value, str) and is_session_id(value) else None


def _from_user_id(user_id: object) -> str | None:
    if not isinstance(user_id, str):
        return None
    text = user_id.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            inner = _usable(parsed.get("session_id"))
            if inner is not None:
                return inner
    legacy = _LEGACY_USER_ID.fullmatch(text)
    if legacy is not None:
        return _usable(legacy.group(1))
    return _usable(user_id)


def _derived(body: Mapping[str, Any], tenant: str) -> str:
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    # Canonical JSON; tenant "none" adds nothing (ids stay as they were before tenants).
    seen: dict[str, Any] = {"first_message": first, "system": body.get("system")}
    if tenant != "none":
        seen["tenant"] = tenant
    canonical = json.dumps(seen, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return f"conv-{digest[:32]}"


def resolve_session_id(headers: Mapping[str, str], body: Mapping[str, Any],
                       configured_header: str, tenant: str = "none") -> str:
    """The session id of a request (``headers`` case-insensitive, ``body`` parsed).

    Raises:
        RequestRejected: 400: ``configured_header`` holds an invalid session id.
    """
    chosen = headers.get(configured_header)
    if chosen is not None:
        problem = session_id_problem(chosen)
        if problem is not None:
            raise RequestRejected(
                400, "invalid_request_error",
                f"{configured_header}: not a valid session id ({problem}); "
                f"a session id is {SESSION_ID_RULE}",
                reason="invalid_session_id",
            )
        return chosen
    found = _usable(headers.get(CLAUDE_CODE_SESSION_HEADER))
    if found is not None:
        return found
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        found = _from_user_id(metadata.get("user_id"))
        if found is not None:
            return found
    return _derived(body, tenant)
