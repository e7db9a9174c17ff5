"""The assistant turn in progress, whose opening message no layer may remove.

With extended thinking on, the provider requires the assistant turn in progress — the one
before the last set of ``tool_use`` / ``tool_result`` blocks — to *start* with a thinking block
(reference section 5.4: "a final `assistant` message must start with a thinking block").
Without interleaved thinking the model thinks only once per turn, at its start, so a long tool
loop (``claude -p`` runs whole tasks as one) is one turn whose opening message holds the only
thinking block. Removing that message, or cutting the history inside the turn so that it
starts at a later ``tool_use``, gets the provider's 400.

A turn starts after a user message that is no ``tool_result`` answer (a person, or an
injected text); role-``system`` messages are transparent. The turn is *in progress* when the
request ends with a user message carrying ``tool_result`` blocks. Its opener is the first
assistant message of the turn; when that message starts with a thinking block, it and the
user message answering it are protected: every layer keeps them as they are.

The rule is structural, not tied to the request's ``thinking`` setting: keeping an opener the
provider would not have required costs a few tokens; dropping one it does require costs the
request.

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

from ._blocks import CLIENT_RESULT, DROPPABLE_ROLES, THINKING, Message, blocks_of

__all__: list[str] = []


def has_tool_result(message: Message) -> bool:
    """True for a user message answering tool calls."""
    return message.get("role") == "user" and any(
        b.get("type") == CLIENT_RESULT for b in blocks_of(message))


def _conversational(messages: list[Message], start: int, stop: int, step: int) -> list[int]:
    return [i for i in range(start, stop, step) if messages[i].get("role") in DROPPABLE_ROLES]


def protected_opening(messages: list[Message]) -> tuple[int, int] | None:
    """``(opener, answer)``: the indices of the turn in progress's opening assistant message
    and of the user message answering it, when that opener starts with thinking; else None."""
    backwards = _conversational(messages, len(messages) - 1, -1, -1)
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
        if not blocks or blocks[0].get("type") not in THINKING or answer is None:
            return None
        if not has_tool_result(messages[answer]):
            return None
        return index, answer
    return None


def protected_indices(messages: list[Message]) -> frozenset[int]:
    """The indices every layer must keep as they are (see the module docstring)."""
    opening = protected_opening(messages)
    return frozenset(opening) if opening is not None else frozenset()


def removable_in_turn(messages: list[Message], ids: set[str]) -> set[str]:
    """``ids`` (calls a layer wants to remove with their results) without those whose removal
    would leave a tool answer inside the turn in progress holding other blocks only (a text
    appended to the results, as Claude Code does): a user message with no ``tool_result`` left
    would end the turn there, and its opener would no longer be the turn's first message."""
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
