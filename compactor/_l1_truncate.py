"""L1 — truncate the text of tool results over ``max_tool_result_tokens`` to a head and a
(larger: logs end with what matters) tail, with a marker. Other parts of a result are never
cut, and the same block always truncates to the same bytes (the prompt cache keeps hitting).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from policies import CompactionPolicy

from ._blocks import CLIENT_RESULT, Message
from ._protocol import Interaction
from ._view import View

HEAD_SHARE = 0.4  # the rest of the budget goes to the tail
MIN_PART_CHARS = 200
_CUT_SEARCH = 200  # look this far for a line break to cut at


def _marker(removed_chars: int, original_chars: int) -> str:
    return (f"\n\n[... compact-proxy truncated {removed_chars:,} of {original_chars:,} characters "
            f"of this tool result ...]\n\n")


# L1's own output: never cut again (a second pass must change nothing).
_OWN_MARKER = re.compile(r"\n\n\[\.\.\. compact-proxy truncated [\d,]+ of [\d,]+ characters "
                         r"of this tool result \.\.\.\]\n\n")


def _cut_text(text: str, budget_chars: int) -> str:
    """``text`` cut to about ``budget_chars`` on line breaks; itself when within the
    budget, cut already, or when cutting would not make it shorter."""
    if len(text) <= budget_chars or _OWN_MARKER.search(text):
        return text
    head_len = max(MIN_PART_CHARS // 2, int(budget_chars * HEAD_SHARE))
    tail_len = max(MIN_PART_CHARS // 2, budget_chars - head_len)
    newline = text.rfind("\n", head_len - _CUT_SEARCH, head_len)
    if newline > 0:
        head_len = newline + 1
    tail_start = len(text) - tail_len
    newline = text.find("\n", tail_start, tail_start + _CUT_SEARCH)
    if newline != -1:
        tail_start = newline + 1
    if tail_start <= head_len:
        return text
    cut = text[:head_len] + _marker(tail_start - head_len, len(text)) + text[tail_start:]
    return cut if len(cut) < len(text) else text


def _text_parts(content: object) -> list[tuple[int | None, str]]:
    """(position, text) of the cuttable text in a tool_result's content; None = the string."""
    if isinstance(content, str):
        return [(None, content)]
    if not isinstance(content, list):
        return []
    return [(position, block["text"]) for position, block in enumerate(content)
            if isinstance(block, dict) and block.get("type") == "text"
            and isinstance(block.get("text"), str)]


def _truncate_result(block: dict[str, Any], view: View, max_tokens: int) -> dict[str, Any] | None:
    """A truncated copy of ``block``, or None when it is within the budget."""
    parts = _text_parts(block.get("content"))
    total_chars = sum(len(text) for _, text in parts)
    # A token is at least one character: a small result needs no counting.
    if total_chars <= max_tokens:
        return None
    counter = view.counter
    text_tokens = sum(counter.count_text(t) for _, t in parts)
    if text_tokens <= max_tokens:
        return None
    # Each part a share in proportion to its size; shrink again while a dense text is over.
    ratio = max_tokens / text_tokens
    for _attempt in range(4):
        new_parts = {pos: _cut_text(text, max(MIN_PART_CHARS, int(len(text) * ratio * 0.97)))
                     for pos, text in parts}
        new_tokens = sum(counter.count_text(t) for t in new_parts.values())
        if new_tokens <= max_tokens:
            break
        ratio *= max_tokens / new_tokens * 0.9
    if all(new_parts[pos] is text for pos, text in parts):
        return None  # nothing could be shortened: the block stays as it is
    content = block.get("content")
    if isinstance(content, str):
        return {**block, "content": new_parts[None]}
    assert isinstance(content, list)
    new_content = list(content)
    for position, text in new_parts.items():
        assert position is not None
        if text != content[position]["text"]:
            new_content[position] = {**content[position], "text": text}
    return {**block, "content": new_content}


def truncate_tool_results(view: View, interactions: Mapping[str, Interaction],
                          policy: CompactionPolicy) -> tuple[View, int]:
    """L1: the view with every tool result over ``policy.max_tool_result_tokens`` truncated,
    and how many were cut."""
    max_tool_result_tokens = policy.max_tool_result_tokens
    changed = 0
    out: list[Message] = []
    for message in view.messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            out.append(message)
            continue
        new_content: list[Any] | None = None
        for position, block in enumerate(content):
            if block.get("type") != CLIENT_RESULT:
                continue
            truncated = _truncate_result(block, view, max_tool_result_tokens)
            if truncated is not None:
                if new_content is None:
                    new_content = list(content)
                new_content[position] = truncated
                changed += 1
        out.append(message if new_content is None else {**message, "content": new_content})
    return (view.derive(out) if changed else view), changed
