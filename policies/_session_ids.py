"""The one rule for session ids.

A session id is one or more runs of ``A-Z a-z 0-9 _ -`` joined by single dots, at most 128
characters: ``demo-session``, ``a.b``, a UUID, ``conv-<hex>``. Never ``.``, ``..``, a leading
or trailing dot, two dots in a row, a space, ``:``, ``/``, ``\\`` or anything outside ASCII.
The rule is the source-pointer grammar's: an id is a field of ``transcript:<id>:<n>``, a file
name (``<transcript_root>/<id>.jsonl``) and a directory (``<artifact_root>/<id>/``), and it
goes back out in the ``x-compact-session-id`` response header, so every session that can be
served can also be given durable state whose pointers resolve.

Why it lives here, in ``policies``: the source-access policy checks ids, and ``policies``
never imports ``compactor`` (the authorizer is duck-typed for the same reason), while
``compactor`` may import this stdlib-only module. ``compactor`` re-exports it as its public
API (``compactor.check_session_id``, ...); the proxy uses it through ``compactor``, the
config through this module (so a bad config is reported without importing the engine).
The import graph stays acyclic: proxy -> compactor -> policies, proxy -> policies.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "MAX_SESSION_ID_CHARS",
    "SESSION_ID_PATTERN",
    "SESSION_ID_RULE",
    "check_session_id",
    "is_session_id",
    "session_id_problem",
]

#: The longest session id, in characters (each is one ASCII byte).
MAX_SESSION_ID_CHARS: Final = 128
#: The grammar of a session id (use ``fullmatch``; the length is checked separately).
SESSION_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*", re.ASCII)
#: The rule in words, as error messages state it.
SESSION_ID_RULE: Final = (
    f"1-{MAX_SESSION_ID_CHARS} characters: runs of A-Z a-z 0-9 _ - joined by single dots"
)

_RUN_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
)


def session_id_problem(value: object) -> str | None:
    """Why ``value`` is not a session id (a short phrase), or None when it is one."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "is empty"
    if len(value) > MAX_SESSION_ID_CHARS:
        return f"is {len(value)} characters, more than {MAX_SESSION_ID_CHARS}"
    if SESSION_ID_PATTERN.fullmatch(value):
        return None
    for ch in value:
        if ch != "." and ch not in _RUN_CHARS:
            shown = repr(ch) if ch.isprintable() else f"U+{ord(ch):04X}"
            return f"contains {shown}"
    if value.startswith("."):
        return "starts with a dot"
    if value.endswith("."):
        return "ends with a dot"
    return "has two dots in a row"


def is_session_id(value: object) -> bool:
    """True when ``value`` is a valid session id."""
    return session_id_problem(value) is None


def check_session_id(value: object, field: str = "session_id") -> str:
    """``value`` when it is a valid session id.

    Args:
        value: the candidate.
        field: what to call it in the error message (``shared_sessions[0]``, ...).

    Raises:
        ValueError: ``"<field>: <why>; a session id is <the rule>"``.
    """
    problem = session_id_problem(value)
    if problem is None and isinstance(value, str):
        return value
    raise ValueError(f"{field}: {problem}; a session id is {SESSION_ID_RULE}")
