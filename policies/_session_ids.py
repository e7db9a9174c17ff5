"""The one rule for session ids (docs/how-it-works.md, "Sessions"): an id is a field of a
source pointer, a file and a directory name, and a response header.

It lives in ``policies`` (stdlib only), which never imports ``compactor``: ``compactor``
re-exports it (``compactor.check_session_id``, ...), the config uses it from here, so a bad
config is reported without importing the engine.
"""

from __future__ import annotations

import re
import string
from typing import Final

__all__ = ["MAX_SESSION_ID_CHARS", "SESSION_ID_PATTERN", "SESSION_ID_RULE", "check_session_id",
           "is_session_id", "session_id_problem"]

#: The longest session id, in characters (each is one ASCII byte).
MAX_SESSION_ID_CHARS: Final = 128
#: The grammar of a session id (use ``fullmatch``; the length is checked separately).
SESSION_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*", re.ASCII)
#: The rule in words, as error messages state it.
SESSION_ID_RULE: Final = (
    f"1-{MAX_SESSION_ID_CHARS} characters: runs of A-Z a-z 0-9 _ - joined by single dots"
)

_RUN_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_-")


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
    """``value`` when it is a valid session id; else ``ValueError("<field>: <why>; a session id
    is <the rule>")``."""
    problem = session_id_problem(value)
    if problem is None and isinstance(value, str):
        return value
    raise ValueError(f"{field}: {problem}; a session id is {SESSION_ID_RULE}")
