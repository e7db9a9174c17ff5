"""The pass over ``messages``: each message's shape and content, its blocks (:mod:`.blocks`),
the thinking rules that depend on its place (:mod:`.thinking`), and the client tool pairing
between one message and the next.

Messages are checked in one pass in order, so the error reported is the one at the lowest
position, as the real API does. Before the pass, three positions are located (a cheap scan that
never raises; malformed messages are left to the pass): the final non-``system`` message, the
latest ``assistant`` message, and, with thinking on, the *opener* of the turn in progress
(:mod:`.thinking`). Two things are carried between messages:

* the set of every id-carrying block seen so far (``tool_use`` ids are unique per request);
* the ``tool_use`` ids of the previous non-system message, which the next non-system message must
  answer. Role ``system`` messages (2026 "mid-conversation system") are transparent for this
  adjacency: the message "right after" an assistant turn is the next one whose role is not
  ``system``. The real API merges consecutive same-role turns, but pairing is decided on the
  messages as sent, so merging never rescues a result that sits one message too late.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .blocks import _check_blocks, _check_plain_blocks
from .texts import (
    CLIENT_RESULT_TYPE,
    MAX_MESSAGES,
    MSG_DUPLICATE_RESULT,
    MSG_EMPTY_CONTENT,
    MSG_FIRST_USER,
    MSG_MISSING_RESULTS,
    MSG_RESULTS_NOT_FIRST,
    MSG_TEXT_WHITESPACE,
    MSG_UNEXPECTED_RESULT,
    ROLES,
    ThinkingMode,
    _fail,
)
from .thinking import (
    _check_no_thinking,
    _check_opener,
    _check_unmodified,
    _last_index,
    _role_of,
    _tool_loop_opener,
)

# -- messages -------------------------------------------------------------------------------


def _check_messages(body: Mapping[str, Any], mode: ThinkingMode) -> None:
    if "messages" not in body:
        raise _fail("messages: Field required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _fail("messages: Input should be a valid list")
    if not messages:
        raise _fail("messages: at least one message is required")
    if len(messages) > MAX_MESSAGES:
        raise _fail(
            f"messages: List should have at most {MAX_MESSAGES} items after validation, "
            f"not {len(messages)}"
        )

    last = len(messages) - 1
    roles = [_role_of(message) for message in messages]
    final = _last_index(roles, ("user", "assistant"))
    latest_assistant = _last_index(roles, ("assistant",))
    opener = _tool_loop_opener(messages, roles) if mode == "on" else None
    seen_ids: set[str] = set()
    # Tool-use ids of the previous non-system message, and where it sits.
    pending_uses: list[str] = []
    pending_index = -1
    first_non_system_seen = False

    for n, message in enumerate(messages):
        role, content = _message_shape(n, message)
        if n == 0 and role == "system":
            raise _fail('messages.0: a "system" message cannot be the first message')
        if role == "system":
            # Content rules apply; tool adjacency looks straight through it.
            _check_content_present(n, content, final_assistant=False)
            _check_plain_blocks(n, content, role)
            continue
        if not first_non_system_seen:
            first_non_system_seen = True
            if role != "user":
                raise _fail(MSG_FIRST_USER)

        _check_content_present(n, content, final_assistant=(n == last and role == "assistant"))
        blocks = content if isinstance(content, list) else []
        if n == final and role == "assistant" and mode == "off":
            _check_no_thinking(n, blocks)
        uses = _check_blocks(n, blocks, role, seen_ids)
        if n == latest_assistant:
            _check_unmodified(n, blocks)
        if n == opener:
            _check_opener(n, content)

        if pending_uses:
            answered = _results_of(blocks) if role == "user" else set()
            missing = [tool_id for tool_id in pending_uses if tool_id not in answered]
            if missing:
                raise _fail(MSG_MISSING_RESULTS.format(n=pending_index, ids=", ".join(missing)))
        if role == "user":
            _check_results(n, blocks, pending_uses)
        pending_uses = uses
        pending_index = n

    if pending_uses:
        raise _fail(MSG_MISSING_RESULTS.format(n=pending_index, ids=", ".join(pending_uses)))


def _message_shape(n: int, message: object) -> tuple[str, object]:
    if not isinstance(message, Mapping):
        raise _fail(f"messages.{n}: Input should be a valid dictionary")
    if "role" not in message:
        raise _fail(f"messages.{n}.role: Field required")
    role = message["role"]
    if role not in ROLES:
        raise _fail(f"messages.{n}.role: Input should be 'user', 'assistant' or 'system'")
    if "content" not in message:
        raise _fail(f"messages.{n}.content: Field required")
    content = message["content"]
    if not isinstance(content, (str, list)):
        raise _fail(f"messages.{n}.content: Input should be a valid string or list")
    return role, content


def _check_content_present(n: int, content: object, *, final_assistant: bool) -> None:
    if isinstance(content, str):
        if not content:
            if final_assistant:
                return
            raise _fail(MSG_EMPTY_CONTENT.format(n=n))
        if not content.strip():
            raise _fail(MSG_TEXT_WHITESPACE)
        return
    if isinstance(content, list) and not content and not final_assistant:
        raise _fail(MSG_EMPTY_CONTENT.format(n=n))



def _results_of(blocks: Sequence[object]) -> set[str]:
    return {
        block["tool_use_id"]
        for block in blocks
        if isinstance(block, Mapping)
        and block.get("type") == CLIENT_RESULT_TYPE
        and isinstance(block.get("tool_use_id"), str)
    }


def _check_results(n: int, blocks: Sequence[object], expected: Sequence[str]) -> None:
    """A user message's results: known ids, each once, all before any other block."""
    wanted = set(expected)
    answered: set[str] = set()
    other_seen = False
    for m, block in enumerate(blocks):
        assert isinstance(block, Mapping)
        if block.get("type") != CLIENT_RESULT_TYPE:
            other_seen = True
            continue
        tool_id = block["tool_use_id"]
        if tool_id not in wanted:
            raise _fail(MSG_UNEXPECTED_RESULT.format(n=n, m=m, ids=tool_id))
        if tool_id in answered:
            raise _fail(MSG_DUPLICATE_RESULT.format(n=n, m=m, ids=tool_id))
        if other_seen:
            raise _fail(MSG_RESULTS_NOT_FIRST.format(n=n, k=len(wanted)))
        answered.add(tool_id)
