"""The Redis store's key layout, and how values are written into keys and members.

Every key is ``<prefix>{<tag>}:<suffix>``: Redis Cluster hashes only the text in the braces, so
every key of one session lives in one slot and one script can change them together; what
belongs to no session has a tag per group. The full table: docs/operations.md, "Redis keys".
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import cast

from .._rows import session_key_of
from ..base import CorruptStateError

__all__ = ["RedisKeys", "as_bytes", "as_score", "as_text", "listed", "pair_member", "pair_of"]


def as_bytes(value: bytes | str | None) -> bytes | None:
    # The client is built with decode_responses=False, so replies are bytes; the str branch
    # only satisfies redis-py's types (which allow both).
    return value.encode("utf-8") if isinstance(value, str) else value


def as_text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def pair_member(first: str, second: str) -> str:
    """An index member (and key suffix) naming two strings: ``["first","second"]`` — a usage
    row's ``[session key, model]``, an audit session's ``[tenant, session id]``."""
    return json.dumps([first, second], ensure_ascii=False, separators=(",", ":"))


def pair_of(member: bytes | str, where: str) -> tuple[str, str]:
    """The two strings back from a :func:`pair_member` member of the index ``where``."""
    try:
        pair = json.loads(member)
    except ValueError:
        pair = None
    if (not isinstance(pair, list) or len(pair) != 2
            or not all(isinstance(part, str) for part in pair)):
        raise CorruptStateError(where, "an index member is not a pair of strings")
    return pair[0], pair[1]


def listed(reply: object) -> list[bytes | str]:
    """A list reply of members (redis-py types every reply as a union of shapes)."""
    return list(cast("list[bytes | str]", reply))


def as_score(when: datetime) -> str:
    """A time as a sorted-set score: Unix seconds, exact to the microsecond as text."""
    return repr(when.timestamp())


class RedisKeys:
    """Every key of the store, by what it holds (see the module's docstring)."""

    def __init__(self, key_prefix: str) -> None:
        self.key_prefix = key_prefix
        # The global indexes: every usage row; the audit log's sessions by last_seen, its
        # refused entries by time, and the sessions with state changes by their newest.
        self.usage_index_key = self._key("usage", "usage:rows")
        self.audit_sessions_key = self._key("audit", "audit:sessions")
        self.audit_blocked_key = self._key("audit", "audit:blocked")
        self.audit_changed_key = self._key("audit", "audit:changed")
        # The summary cache: its text hash, its age index, its sequence counter.
        self._summary_keys = [self._key("summary", f"summary:{name}")
                              for name in ("text", "order", "seq")]

    def _key(self, tag: str, suffix: str) -> str:
        """``<prefix>{<tag>}:<suffix>``: every key with the same tag is in one hash slot."""
        return f"{self.key_prefix}{{{tag}}}:{suffix}"

    def state_key(self, session_id: str) -> str:
        return self._key(session_id, "state")

    def record_key(self, session_id: str) -> str:
        return self._key(session_id, "record")

    def lock_key(self, name: str) -> str:
        """The lease ``name`` (in the slot of a session named ``name``)."""
        return self._key(name, "lock")

    def usage_key(self, session_key: str, model: str) -> str:
        """The usage row of ``(session_key, model)`` (the model as a JSON string)."""
        return self._key(session_key, "usage:" + json.dumps(model, ensure_ascii=False))

    def audit_keys(self, tenant: str, session_id: str) -> list[str]:
        """The keys of one session's audit log, as the scripts take them: its entries and its
        totals (in the slot of the session's state)."""
        tag = session_key_of(tenant, session_id)
        return [self._key(tag, "audit:requests"), self._key(tag, "audit:totals")]

    def change_key(self, tenant: str, session_id: str) -> str:
        """The key of one session's state changes (in the session's slot)."""
        return self._key(session_key_of(tenant, session_id), "audit:changes")
