"""Which session a request belongs to (SPEC section 4, "Session resolution").

First that applies:

1. the configured header (default ``x-compact-session-id``);
2. ``X-Claude-Code-Session-Id``;
3. ``metadata.user_id``: the ``session_id`` inside it when it is a JSON object string, else the
   string itself;
4. ``conv-`` + a stable hash of the conversation's first message and ``system``.

A candidate that is empty, longer than :data:`MAX_SESSION_ID_CHARS` or holds control
characters is skipped (it could not be echoed in ``x-compact-session-id``), and the next rule
applies.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["CLAUDE_CODE_SESSION_HEADER", "MAX_SESSION_ID_CHARS", "resolve_session_id"]

CLAUDE_CODE_SESSION_HEADER: Final = "x-claude-code-session-id"
MAX_SESSION_ID_CHARS: Final = 512


def _usable(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_SESSION_ID_CHARS:
        return None
    # Printable ASCII only: the id goes back out in a response header.
    if not all(" " <= ch <= "~" for ch in value):
        return None
    return value


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
    return _usable(user_id)


def _derived(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    # Canonical JSON: the same conversation gives the same id whatever the key order.
    canonical = json.dumps(
        {"first_message": first, "system": body.get("system")},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return f"conv-{digest[:32]}"


def resolve_session_id(headers: Mapping[str, str], body: Mapping[str, Any],
                       configured_header: str) -> str:
    """The session id of a request.

    Args:
        headers: the request headers (a case-insensitive mapping, e.g. aiohttp's).
        body: the parsed JSON body.
        configured_header: ``session.header`` from the config.
    """
    for name in (configured_header, CLAUDE_CODE_SESSION_HEADER):
        found = _usable(headers.get(name))
        if found is not None:
            return found
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        found = _from_user_id(metadata.get("user_id"))
        if found is not None:
            return found
    return _derived(body)
