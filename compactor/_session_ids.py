"""The one rule for session ids, as the compactor's public API.

A session id is one or more runs of ``A-Z a-z 0-9 _ -`` joined by single dots, at most
:data:`MAX_SESSION_ID_CHARS` (128) characters. The definition lives in
``policies._session_ids``, a stdlib-only module, because ``policies`` (the source-access
policy checks ids too) must never import ``compactor``; this module only re-exports it, so
pointers, the resolver, the proxy and library users all use the very same rule.

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

from policies._session_ids import (
    MAX_SESSION_ID_CHARS,
    SESSION_ID_PATTERN,
    SESSION_ID_RULE,
    check_session_id,
    is_session_id,
    session_id_problem,
)

__all__ = [
    "MAX_SESSION_ID_CHARS",
    "SESSION_ID_PATTERN",
    "SESSION_ID_RULE",
    "check_session_id",
    "is_session_id",
    "session_id_problem",
]
