"""What kind of refusal a refused request is (``blocked`` by a limit, ``invalid``: the client's
mistake, or a routine admin ``http_error``), and a broken tool protocol in the provider's words.
"""

from __future__ import annotations

from typing import Final

import compactor

__all__ = ["LIMIT_REASONS", "ROUTINE_REASONS", "tool_protocol_message"]

#: The reasons of refusals by a limit (outcome ``blocked``).
LIMIT_REASONS: Final = frozenset({
    "MessageViewLimitExceeded", "body_too_large", "too_many_objects", "tenant_concurrency",
    "body_timeout", "admin_locked_out"})
#: The reasons of the admin API's routine answers (outcome ``http_error``, no extra line).
ROUTINE_REASONS: Final = frozenset({
    "not_found", "no_state", "admin_disabled", "stale_version", "if_match_required",
    "method_not_allowed"})

_MISSING: Final = (
    "messages.{n}: `tool_use` ids were found without `tool_result` blocks immediately after: "
    "{id}. Each `tool_use` block must have a corresponding `tool_result` block in the next "
    "message.")
_UNEXPECTED: Final = (
    "messages.{n}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each "
    "`tool_result` block must have a corresponding `tool_use` block in the previous message.")
_NOT_FIRST: Final = (
    "messages.{n}: Did not find tool_result block(s) at the beginning of this message. "
    "Messages following tool_use blocks must begin with a matching number of tool_result "
    "blocks ({id}).")
_ANSWERED_TWICE: Final = (
    "messages.{n}: each `tool_use` id must be answered by exactly one `tool_result` block; "
    "found a second `tool_result` for {id}.")
_USED_TWICE: Final = "messages.{n}: `tool_use` ids must be unique: {id}"


def tool_protocol_message(exc: compactor.ToolProtocolError) -> str:
    """The provider's own sentence for the rule ``exc`` breaks, naming the message and id."""
    detail = exc.detail
    if exc.kind == "missing" or (exc.kind == "not_adjacent" and "no tool_result" in detail):
        template = _MISSING
    elif exc.kind == "duplicate":
        template = _USED_TWICE if "used more than once" in detail else _ANSWERED_TWICE
    elif exc.kind == "out_of_order" and "must come first" in detail:
        template = _NOT_FIRST
    else:  # unknown, a result before its use or away from it
        template = _UNEXPECTED
    return template.format(n=exc.message_index, id=exc.tool_use_id)
