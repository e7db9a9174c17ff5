"""Which session a request belongs to (SPEC section 4, "Session resolution").

First that applies:

1. the configured header (default ``x-compact-session-id``);
2. ``X-Claude-Code-Session-Id``;
3. ``metadata.user_id``: the ``session_id`` inside it when it is a JSON object string, the
   ``<uuid>`` of Claude Code's older ``user_<hex>_account_<uuid>_session_<uuid>`` form, else the
   string itself;
4. ``conv-`` + a stable hash of the conversation's first message, ``system`` and the tenant.

Every id follows the one rule for session ids (:func:`compactor.check_session_id`: runs of
``A-Z a-z 0-9 _ -`` joined by single dots, at most 128 characters), so whatever session is
served can also be given durable state whose pointers resolve. A value of the configured
header that is not a valid id is refused (400 ``invalid_request_error`` naming the header and
the rule): the client chose that id, and serving another session instead would silently hide
its state. A candidate from ``X-Claude-Code-Session-Id`` or ``metadata.user_id`` that is not
a valid id is skipped, and the next rule applies. The derived ``conv-`` id is valid by
construction.
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
    # Canonical JSON: the same conversation gives the same id whatever the key order. Another
    # tenant's equal opener is another conversation (tenant "none" adds nothing: ids stay as
    # they were before tenants).
    seen: dict[str, Any] = {"first_message": first, "system": body.get("system")}
    if tenant != "none":
        seen["tenant"] = tenant
    canonical = json.dumps(seen, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return f"conv-{digest[:32]}"


def resolve_session_id(headers: Mapping[str, str], body: Mapping[str, Any],
                       configured_header: str, tenant: str = "none") -> str:
    """The session id of a request (the client's own; its tenant keys it in the store).

    Args:
        headers: the request headers (a case-insensitive mapping, e.g. aiohttp's).
        body: the parsed JSON body.
        configured_header: ``session.header`` from the config.
        tenant: the request's tenant (:mod:`proxy.http.tenants`); part of a derived id.

    Raises:
        RequestRejected: 400 ``invalid_request_error``: the configured header is present but
            its value is not a valid session id.
    """
    chosen = headers.get(configured_header)
    if chosen is not None:
        problem = session_id_problem(chosen)
        if problem is not None:
            # The value is the client's own; the message names the header and the rule only.
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
