"""The assistant turn in progress, whose opening message no layer may remove.

With extended thinking the provider requires the turn in progress (the request ends with
``tool_result`` answers) to start with its thinking block, and without interleaved thinking only
the turn's first assistant message has one. So when that opener starts with thinking, it and the
user message answering it are protected, whatever the request's ``thinking`` setting (keeping an
opener costs a few tokens; dropping a required one costs the request). A turn starts after a user
message that is no tool answer; role-``system`` messages are transparent.
"""

from __future__ import annotations

from ._blocks import CLIENT_RESULT, DROPPABLE_ROLES, THINKING, Message, blocks_of


def has_tool_result(message: Message) -> bool:
    """True for a user message answering tool calls."""
    return message.get("role") == "user" and any(
        b.get("type") == CLIENT_RESULT for b in blocks_of(message))


def protected_opening(messages: list[Message]) -> tuple[int, int] | None:
    """``(opener, answer)``: the indices of the turn in progress's opening assistant message
    and of the user message answering it, when that opener starts with thinking; else None."""
    backwards = [i for i in range(len(messages) - 1, -1, -1)
                 if messages[i].get("role") in DROPPABLE_ROLES]
    if not backwards or not has_tool_result(messages[backwards[0]]):
        return None
    # Walk back to the last user message that is no tool answer: the turn starts after it.
    turn = backwards
    for position, index in enumerate(backwards):
        message = messages[index]
        if message.get("role") == "user" and not has_tool_result(message):
            turn = backwards[:position]
            break
    forwards = turn[::-1]
    for position, index in enumerate(forwards):
        if messages[index].get("role") != "assistant":
            continue
        blocks = blocks_of(messages[index])
        answer = forwards[position + 1] if position + 1 < len(forwards) else None
        if (not blocks or blocks[0].get("type") not in THINKING or answer is None
                or not has_tool_result(messages[answer])):
            return None
        return index, answer
    return None


def protected_indices(messages: list[Message]) -> frozenset[int]:
    """The indices every layer must keep as they are (see the module docstring)."""
    opening = protected_opening(messages)
    return frozenset(opening) if opening is not None else frozenset()


def removable_in_turn(messages: list[Message], ids: set[str]) -> set[str]:
    """``ids`` (calls a layer would remove with their results) without those whose removal
    would leave a tool answer inside the turn in progress with only other blocks (a text
    Claude Code appended): that message would end the turn there, before its opener."""
    opening = protected_opening(messages)
    if opening is None:
        return ids
    kept = set(ids)
    for message in messages[opening[0] + 1:]:
        if message.get("role") != "user":
            continue
        blocks = blocks_of(message)
        answered = {b.get("tool_use_id") for b in blocks if b.get("type") == CLIENT_RESULT}
        if answered and answered <= kept and len(blocks) > len(answered):
            kept -= {i for i in answered if isinstance(i, str)}
    return kept
