"""The thinking rules that depend on ``thinking`` and on a message's place in the request.

*On* means ``thinking.type`` is ``enabled`` or ``adaptive``; *off* means ``thinking`` is absent,
null or ``{"type": "disabled"}``; any other value is unknown and neither rule that depends on it
applies (forward compatibility). (That every assistant message holding thinking starts with it
and none ends with it is a block rule, :mod:`.blocks`.) The rest, on messages as sent (never
merged), role ``system`` messages skipped:

* *tool loop* (thinking on): a tool loop is in progress when the final message is a ``user``
  message holding at least one ``tool_result``. The turn in progress begins after the last
  ``user`` message holding no ``tool_result`` (the first ``user`` message if there is no other);
  its opener is the first ``assistant`` message after that point, and the opener's
  ``content[0]`` must be ``thinking`` or ``redacted_thinking`` (a string content counts as
  ``text``). Later assistant messages of the same loop are not bound.
* *disabled prefill* (thinking off): a final ``assistant`` message may hold no thinking at all.
* *cannot be modified*: in the latest ``assistant`` message, a block carrying the fake's own
  signature format (:mod:`..signatures`) must verify; any other signature is opaque and accepted.
* ``clear_thinking_20251015`` in ``context_management.edits`` needs thinking on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..signatures import block_intact
from .blocks import _block_type
from .texts import (
    CLEAR_THINKING_EDIT,
    CLIENT_RESULT_TYPE,
    MSG_CLEAR_THINKING,
    MSG_THINKING_DISABLED_FINAL,
    MSG_THINKING_MODIFIED,
    MSG_TOOL_LOOP_THINKING,
    THINKING_OFF_TYPES,
    THINKING_ON_TYPES,
    THINKING_TYPES,
    ThinkingMode,
    _fail,
)


def thinking_mode(body: Mapping[str, Any]) -> ThinkingMode:
    """``on`` (``enabled`` / ``adaptive``), ``off`` (absent, null, ``disabled``) or ``unknown``."""
    thinking = body.get("thinking")
    if thinking is None:
        return "off"
    kind = thinking.get("type") if isinstance(thinking, Mapping) else None
    if kind in THINKING_ON_TYPES:
        return "on"
    if kind in THINKING_OFF_TYPES:
        return "off"
    return "unknown"


def _check_context_management(body: Mapping[str, Any], mode: ThinkingMode) -> None:
    management = body.get("context_management")
    edits = management.get("edits") if isinstance(management, Mapping) else None
    if mode != "off" or not isinstance(edits, list):
        return
    if any(isinstance(edit, Mapping) and edit.get("type") == CLEAR_THINKING_EDIT
           for edit in edits):
        raise _fail(MSG_CLEAR_THINKING)



# -- thinking rules that depend on the message's place in the request ----------------------


def _role_of(message: object) -> str | None:
    role = message.get("role") if isinstance(message, Mapping) else None
    return role if isinstance(role, str) else None


def _last_index(roles: Sequence[str | None], wanted: Sequence[str]) -> int | None:
    for n in range(len(roles) - 1, -1, -1):
        if roles[n] in wanted:
            return n
    return None


def _holds_result(message: object) -> bool:
    content = message.get("content") if isinstance(message, Mapping) else None
    return isinstance(content, list) and any(
        isinstance(block, Mapping) and block.get("type") == CLIENT_RESULT_TYPE
        for block in content
    )


def _tool_loop_opener(messages: Sequence[object], roles: Sequence[str | None]) -> int | None:
    """The index of the assistant message that opens the turn in progress, when the request is
    in the middle of a tool loop (its final non-system message is a user message holding a
    ``tool_result``); ``None`` otherwise. See the module docstring."""
    turns = [n for n, role in enumerate(roles) if role in ("user", "assistant")]
    if not turns or roles[turns[-1]] != "user" or not _holds_result(messages[turns[-1]]):
        return None
    users = [n for n in turns if roles[n] == "user"]
    real_turns = [n for n in users if not _holds_result(messages[n])]
    start = real_turns[-1] if real_turns else users[0]
    return next((n for n in turns if n > start and roles[n] == "assistant"), None)


def _check_opener(n: int, content: object) -> None:
    if isinstance(content, str):
        found = "text"
    elif isinstance(content, list) and content:
        found = _block_type(n, 0, content[0])
    else:
        return
    if found not in THINKING_TYPES:
        raise _fail(MSG_TOOL_LOOP_THINKING.format(n=n, found=found))


def _check_no_thinking(n: int, blocks: Sequence[object]) -> None:
    for m, block in enumerate(blocks):
        if isinstance(block, Mapping) and block.get("type") in THINKING_TYPES:
            raise _fail(MSG_THINKING_DISABLED_FINAL.format(n=n, m=m))


def _check_unmodified(n: int, blocks: Sequence[object]) -> None:
    for m, block in enumerate(blocks):
        assert isinstance(block, Mapping)
        if block.get("type") in THINKING_TYPES and not block_intact(block):
            raise _fail(MSG_THINKING_MODIFIED.format(n=n, m=m))
